"""End to end through the command line: `tfps local` (the chief's own `tfps run`:
test_run.py).

Real processes, real clusters in a private network, every wait bounded. The
two `tfps local` runs (train, then resume with more steps) are shared by the
module: each costs a TensorFlow import per task (~7 s on 2 cores).

Bad input goes through the same binaries: each case must end with one
`tfps: error:` line and a permanent exit code (2 usage, 1 permanent), promptly,
with the coordinator started once (`tfps local` does not restart permanent
failures), or not at all: `tfps local` checks the chief's flags before it
starts anything.
"""

import dataclasses
import glob
import json
import os
import re
import subprocess
import textwrap
import time

import pytest

from tfps.cluster import processes
from tfps.recovery import standby

from tests.support import crash_check
from tests.support import procs
from tests.support import tfps_command

pytestmark = pytest.mark.cluster

# The default (embedded) ctr, trained briefly: ~30 s per `tfps local` run on 2
# idle cores, most of it TensorFlow imports.
TRAIN_STEPS, RESUMED_STEPS = 200, 300
LOCAL_FLAGS = ["--num_ps=1", "--num_workers=2", "--steps_per_loop=50",
               "--checkpoint_interval=100", "--seed=0"]

# A run that does not end within this is hung (a clean run takes ~30 s).
RUN_TIMEOUT = 240

# Measured through this command line (200 steps of batch 512, seed 0, 1 ps,
# 2 workers): AUC 0.7793, 0.7800, 0.7791, 0.7799 in four runs (asynchronous
# training varies a little); 0.601 after a single step. The dense features
# alone allow 0.74 and the hidden true model 0.845 (tfps/examples/ctr/experiment.py), so
# above 0.76 the model has learnt from the categorical embeddings as well.
MIN_AUC = 0.76

# Predicting the 35% click rate everywhere gives a log loss of 0.65.
MAX_LOSS = 0.60
_PROGRESS = re.compile(r"step (\d+)/(\d+) \|.*examples/s.*ETA")
_RESTORED = re.compile(r"restored (\S+) at step (\d+)")


# --- processes of a run ---------------------------------------------------------------

def _is_standby(pid: int) -> bool:
  """Whether `pid` is a warm standby coordinator (recovery.standby sets this)."""
  try:
    with open(f"/proc/{pid}/environ", "rb") as f:
      return any(v.startswith(standby.ENV_VAR.encode() + b"=") for v in f.read().split(b"\0"))
  except OSError:
    return False


def _pids_mentioning(text: str) -> set[int]:
  """Live processes whose command line contains `text` (e.g. a run's model_dir)."""
  return {int(p) for p in os.listdir("/proc")
          if p.isdigit() and int(p) != os.getpid() and text in procs.cmdline(p)
          and procs.alive(int(p))}


def _children_of(parents: set[int]) -> set[int]:
  """Live processes whose parent is one of `parents`."""
  return {int(p) for p in os.listdir("/proc")
          if p.isdigit() and procs.parent(p) in parents and procs.alive(int(p))}


def _processes_in(namespaces: set[int]) -> set[int]:
  return {int(p) for p in os.listdir("/proc") if p.isdigit() and procs.netns(p) in namespaces}


def _namespaces_now() -> set[int]:
  return {procs.netns(p) for p in os.listdir("/proc") if p.isdigit()} - {None}


def _listening_ports_anywhere(ignore: set[int] = frozenset()) -> set[int]:
  """TCP ports in LISTEN state in every network namespace that has a process.

  Args:
    ignore: namespaces not to look in: those of other clusters (which pick
      their ports independently, so may listen on one of a run's).
  """
  ports, seen = set(), set(ignore)
  for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    namespace = procs.netns(pid)
    if namespace is None or namespace in seen:
      continue
    seen.add(namespace)
    for table in ("tcp", "tcp6"):
      try:
        with open(f"/proc/{pid}/net/{table}") as f:
          rows = f.read().splitlines()[1:]
      except OSError:
        continue
      for row in rows:
        fields = row.split()
        if fields[3] == "0A":  # TCP_LISTEN
          ports.add(int(fields[1].rpartition(":")[2], 16))
  return ports


@dataclasses.dataclass
class LocalRun:
  """What one `tfps local` run printed and which processes it had."""

  code: int
  stdout: str
  stderr: str
  seconds: float
  pids: dict[int, str]  # Every process that named model_dir, with its command line.
  parents: dict[int, int | None]  # The parent of each of `pids`.
  namespaces: set[int]  # Network namespaces its processes ran in (not ours).
  ports: set[int]       # From model_dir/cluster.json.
  seen_listening: set[int]  # Of `ports`, those seen listening while the run was live.
  # Namespaces that other processes (e.g. the session's shared clusters) had
  # before the run started: not the run's, so never searched for its ports.
  others: set[int]

  @property
  def result(self) -> dict:
    lines = self.stdout.splitlines()
    assert len(lines) == 1, f"stdout must be one JSON line, got {self.stdout!r}"
    return json.loads(lines[0])


def _run_local(model_dir: str, flags, *, timeout: float = RUN_TIMEOUT) -> LocalRun:
  """Runs `tfps local` to the end, noting every process that names `model_dir`.

  And their children: a coordinator names only its run spec file (in the
  chief's scratch directory).
  """
  env = dict(os.environ)
  env.pop("TF_CONFIG", None)
  os.makedirs(model_dir, exist_ok=True)
  out_path, err_path = model_dir + ".stdout", model_dir + ".stderr"
  own_namespace = procs.netns("self")
  others = _namespaces_now() - {own_namespace}
  start = time.monotonic()
  with open(out_path, "w") as out, open(err_path, "w") as err:
    process = subprocess.Popen(tfps_command.TFPS + ["local", f"--model_dir={model_dir}", *flags],
                               stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                               start_new_session=True)
  pids, parents, namespaces, listening = {}, {}, set(), set()
  try:
    while process.poll() is None:
      if time.monotonic() - start > timeout:
        raise TimeoutError(f"tfps local still running after {timeout}s; see {err_path}")
      # Every scan reads them again: a child caught between fork and exec
      # still shows its parent's command line and environment.
      named = _pids_mentioning(model_dir)
      for pid in named | _children_of(named | set(pids)):
        cmdline = procs.cmdline(pid)
        if cmdline:  # Not gone in between.
          pids[pid] = cmdline + (" [standby]" if _is_standby(pid) else "")
          parents[pid] = procs.parent(str(pid))
        namespaces.add(procs.netns(pid))
      listening |= _listening_ports_anywhere(others)
      time.sleep(0.2)
  finally:
    if process.poll() is None:
      processes.stop_group(process, grace=10)  # Its children die with it (pdeathsig).
  seconds = time.monotonic() - start
  with open(out_path) as out, open(err_path) as err:
    stdout, stderr = out.read(), err.read()
  with open(os.path.join(model_dir, "cluster.json")) as f:
    addresses = [a for hosts in json.load(f)["cluster"].values() for a in hosts]
  ports = {int(a.rpartition(":")[2]) for a in addresses}
  return LocalRun(code=process.returncode, stdout=stdout, stderr=stderr, seconds=seconds,
                  pids=pids, parents=parents, namespaces=namespaces - {own_namespace, None},
                  ports=ports, seen_listening=ports & listening, others=others)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("e2e") / "model")


@pytest.fixture(scope="module")
def first_run(model_dir):
  return _run_local(model_dir, LOCAL_FLAGS + [f"--train_steps={TRAIN_STEPS}"])


@pytest.fixture(scope="module")
def resumed_run(model_dir, first_run):
  assert first_run.code == 0, first_run.stderr[-3000:]
  # Closures of 10 steps: less to trace (the first run has the default); no warm
  # standby (nothing restarts this coordinator; the first run has one).
  return _run_local(model_dir, LOCAL_FLAGS + [f"--train_steps={RESUMED_STEPS}",
                                              "--steps_per_closure=10", "--nowarm_standby"])


def _check_finished(run: LocalRun, model_dir: str, train_steps: int) -> dict:
  assert run.code == 0, run.stderr[-3000:]
  result = run.result
  assert result["status"] == "finished"
  assert result["global_step"] >= train_steps
  assert result["examples_per_sec"] > 0
  assert set(result["eval"]) >= {"auc", "loss"}
  assert result["restarts"] == 0 and result.get("task_restarts", 0) == 0, result
  # Checkpoints are numbered with the step they hold; the last is the final step.
  assert result["checkpoint"] == os.path.join(model_dir, f"ckpt-{result['global_step']}")
  assert os.path.exists(result["checkpoint"] + ".index")
  # The input accounting of the whole run (every coordinator): each step one
  # batch of the ctr's files, none never trained, none twice.
  accounting = result["input"]
  assert accounting["positioned"] and accounting["consistent"], accounting
  assert accounting["kept"] == result["global_step"], accounting
  assert accounting["never_trained"] == accounting["trained_twice"] == 0, accounting
  return result


def test_local_trains_to_the_end_and_prints_one_json_line(first_run, model_dir):
  result = _check_finished(first_run, model_dir, TRAIN_STEPS)
  assert result["start_step"] == 0
  assert "restored" not in first_run.stderr


def test_local_reports_progress_on_stderr(first_run):
  progress = [(int(m[1]), int(m[2])) for m in _PROGRESS.finditer(first_run.stderr)]
  # One line per loop of 50 steps.
  assert len(progress) >= TRAIN_STEPS // 50, first_run.stderr[-3000:]
  steps = [step for step, _ in progress]
  assert steps == sorted(steps) and steps[-1] == first_run.result["global_step"]
  assert {target for _, target in progress} == {TRAIN_STEPS}


def _check_nothing_left(run: LocalRun, model_dir: str) -> None:
  assert run.pids, "saw no process of the run (the /proc scan found nothing)"
  left = {pid for pid in run.pids
          if procs.alive(pid) and procs.cmdline(pid)
          and run.pids[pid].startswith(procs.cmdline(pid))}
  assert not left, {pid: procs.cmdline(pid) for pid in left}
  assert not _pids_mentioning(model_dir)
  # The private network: no process is left in it (so the kernel frees it)...
  assert not _processes_in(run.namespaces)
  # ...and no port of the cluster listens in any namespace that still exists
  # (the same scan saw every one of them listening while the run was live).
  assert run.seen_listening == run.ports
  assert not run.ports & _listening_ports_anywhere(run.others)


def test_local_leaves_no_process_and_no_socket(first_run, model_dir):
  assert first_run.code == 0, first_run.stderr[-3000:]
  # The scan saw every task, the chief's supervisor and its coordinator live
  # (and the coordinator's warm standby, if it caught one).
  # A coordinator is `tfps run --nosupervise` (its role in TF_CONFIG).
  roles = sorted(
      ("chief+coordinator" if "--nosupervise" in c else re.search(r"--job_name=(\w+)", c)[1])
      + (" standby" if "[standby]" in c else "")
      for pid, c in first_run.pids.items()
      # A fork caught before its exec (and gone after) keeps its parent's command line.
      if first_run.pids.get(first_run.parents[pid]) != c
      and " run " in c and ("--job_name=" in c or "--nosupervise" in c))
  assert roles.count("chief+coordinator standby") <= 1, first_run.pids
  assert [r for r in roles if r != "chief+coordinator standby"] == [
      "chief", "chief+coordinator", "ps", "worker", "worker"], first_run.pids
  assert first_run.namespaces or "NOT ISOLATED" in first_run.stderr
  _check_nothing_left(first_run, model_dir)


# A second `tfps local` on the same model_dir: the chief's restore is the same
# code every fault test's restart runs, and tests/coordinator/test_run.py
# resumes at the saved step in detail; this is the command line's whole path.
@pytest.mark.soak
def test_local_resumes_from_the_checkpoint_with_more_steps(first_run, resumed_run, model_dir):
  first = first_run.result
  result = _check_finished(resumed_run, model_dir, RESUMED_STEPS)
  restored = _RESTORED.findall(resumed_run.stderr)
  assert restored == [(first["checkpoint"], str(first["global_step"]))], restored
  assert result["start_step"] == first["global_step"]
  progress = [int(m[1]) for m in _PROGRESS.finditer(resumed_run.stderr)]
  assert progress and progress[0] > first["global_step"]  # No step trained twice.
  _check_nothing_left(resumed_run, model_dir)


def test_ctr_learns_through_the_command_line(first_run, model_dir):
  metrics = first_run.result["eval"]
  assert metrics["auc"] > MIN_AUC, metrics
  assert metrics["loss"] < MAX_LOSS, metrics
  # Orbit's summaries, for TensorBoard: training's and evaluation's.
  assert glob.glob(os.path.join(model_dir, "events.out.tfevents.*"))
  assert glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*"))


# --- bad input ---------------------------------------------------------------------------

def _local(args, *, command: str = "local", timeout: float = RUN_TIMEOUT,
           pythonpath: str | None = None) -> tfps_command.Finished:
  env = dict(os.environ)
  env.pop("TF_CONFIG", None)
  if pythonpath:
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
  start = time.monotonic()
  try:
    done = subprocess.run(tfps_command.TFPS + [command, *args], env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
  except subprocess.TimeoutExpired as e:  # run() killed it; its cluster dies with it.
    pytest.fail(f"tfps {command} {args} hung for {timeout}s:\n{(e.stderr or b'')[-3000:]!r}")
  crash_check.note(done.stderr, f"stderr of tfps {command}")
  return tfps_command.Finished(done.returncode, done.stdout, done.stderr, time.monotonic() - start)


# Loaded by every Python process of the run (PYTHONPATH): crashes the ps at
# its start, before it can answer, with a real SIGSEGV (and CPython's report).
_CRASHING_PS = textwrap.dedent("""
    import faulthandler, os, signal, sys
    if "--job_name=ps" in sys.argv:
      faulthandler.enable()
      print("ps: about to crash", file=sys.stderr, flush=True)
      os.kill(os.getpid(), signal.SIGSEGV)
""")


@pytest.mark.parametrize("command", ["local", "chaos"])
@pytest.mark.crash_output_expected("Fatal Python error: Segmentation fault")
def test_a_ps_that_dies_before_it_answers_is_a_death_and_ends_the_run_retryably(
    tmp_path, command):
  (tmp_path / "site").mkdir()
  (tmp_path / "site" / "sitecustomize.py").write_text(_CRASHING_PS)
  model_dir = tmp_path / "model"
  run = _local([f"--model_dir={model_dir}", "--num_ps=1", "--num_workers=1"], command=command,
               timeout=120, pythonpath=str(tmp_path / "site"))
  assert run.code == 170, run.stderr[-3000:]  # Retryable: a crash may not happen again.
  line = [l for l in run.stderr.splitlines() if l.startswith("tfps: error: ")][-1]
  assert line.startswith("tfps: error: ps:0 killed by SIGSEGV before it answered"), line
  [died] = [json.loads(l) for l in (model_dir / "events.jsonl").read_text().splitlines()]
  assert (died["kind"], died["task"], died["signal"]) == ("died", "ps:0", "SIGSEGV")
  assert "ps: about to crash" in died["last_lines"]
  assert any("Fatal Python error: Segmentation fault" in l for l in died["last_lines"])
  if command == "chaos":  # Its result JSON counts it.
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["status"] == "failed" and result["deaths"] == {"ps:0": 1}, result


def test_local_with_unwritable_model_dir_fails_before_starting(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  run = _local([f"--model_dir={blocker}/model", "--num_ps=1", "--num_workers=1"], timeout=60)
  assert run.code == 2, run.stderr
  assert tfps_command.error_line(run).startswith(f"--model_dir: cannot create '{blocker}/model'")
  assert "local cluster up" not in run.stderr  # Failed before starting anything.
  assert not _pids_mentioning(str(blocker))


# A bad chief flag is found by `tfps local`/`tfps chaos` themselves before
# they start anything (no TensorFlow, no cluster), with the chief's own line.
@pytest.mark.parametrize("command, flag, message", [
    ("local", "--train_steps=0", "train_steps (0) must be a positive integer"),
    ("local", "--experiment_params=vocab_sizes",
     "--experiment_params: 'vocab_sizes' must look like key=value"),
    ("local", "--experiment=no_such_experiment",
     "experiment 'no_such_experiment' is unknown (built-in: ctr; "
     "or give package.module:factory)"),
    ("chaos", "--steps_per_loop=0", "steps_per_loop (0) must be a positive integer"),
    ("local", "--worker_timeout=0", "worker_timeout (0.0) must be positive"),
    ("local", "--max_restarts=-1", "max_restarts (-1) must be >= 0"),
    ("local", "--min_workers=2", "min_workers (2) must be at most the cluster spec's 1 workers"),
    ("chaos", "--max_workers=0", "max_workers (0) must be an integer >= num_workers (1)"),
    ("local", "--train_epochs=2 --train_steps=100",
     "train_epochs (2) and train_steps (100): give one of the two"),
    ("local", "--input_shards=0", "input_shards (0) must be a positive integer"),
    ("local", "--experiment_params=colour=blue",
     "ctr: unknown setting(s) colour (known: data_dir, embedding_dim, eval_examples, "
     "examples_per_record, hidden, learning_rate, num_dense, records_per_file, "
     "train_examples, vocab_sizes)"),
    ("local", "--experiment=nosuch.module:factory",
     "experiment 'nosuch.module:factory': cannot import module 'nosuch.module' "
     "(ModuleNotFoundError: No module named 'nosuch')"),
], ids=["local_train_steps", "local_experiment_params", "local_unknown_experiment",
        "chaos_steps_per_loop", "local_worker_timeout", "local_max_restarts",
        "local_min_workers", "chaos_max_workers",
        "local_epochs_and_steps", "local_input_shards", "local_ctr_setting",
        "local_missing_module"])
def test_local_bad_chief_flag_fails_before_starting_anything(tmp_path, command, flag, message):
  model_dir = str(tmp_path / "model")
  run = _local([f"--model_dir={model_dir}", *flag.split(), "--num_ps=1", "--num_workers=1"],
               command=command, timeout=60)
  _check_nothing_started(run, model_dir, message)


def _check_nothing_started(run: tfps_command.Finished, model_dir: str, message: str) -> None:
  assert run.code == 2, run.stderr[-3000:]
  assert tfps_command.error_line(run) == message
  assert "local cluster up" not in run.stderr and "starting coordinator" not in run.stderr
  assert not os.path.exists(os.path.join(model_dir, "logs"))  # No task was started.
  assert not _pids_mentioning(model_dir)


# A user experiment that does not load: found by `tfps local` in a child
# process that imports it, before any task starts. (One whose factory returns
# the wrong thing needs a cluster to call it in: the coordinator's first
# start exits 2, not retried; test_chief_bad_input_is_one_line_and_permanent.)
_LOADING = {
    "e2e_broken.py": "import no_such_dependency_of_tfps_tests\n",
    "e2e_loading.py": "NOT_CALLABLE = 3\n\n\ndef factory(context):\n  return {}\n",
}


@pytest.mark.parametrize("experiment, message", [
    ("e2e_broken:factory", "experiment 'e2e_broken:factory': cannot import module 'e2e_broken' "
     "(ModuleNotFoundError: No module named 'no_such_dependency_of_tfps_tests')"),
    ("e2e_loading:no_such_factory", "experiment 'e2e_loading:no_such_factory': module "
     "'e2e_loading' has no attribute 'no_such_factory'"),
    ("e2e_loading:NOT_CALLABLE",
     "experiment 'e2e_loading:NOT_CALLABLE': 'NOT_CALLABLE' is a int, not callable"),
], ids=["module_does_not_import", "no_such_factory", "factory_not_callable"])
def test_local_experiment_that_does_not_load_fails_before_starting_anything(
    tmp_path, experiment, message):
  for name, text in _LOADING.items():
    (tmp_path / name).write_text(text)
  model_dir = str(tmp_path / "model")
  run = _local([f"--model_dir={model_dir}", f"--experiment={experiment}", "--num_ps=1",
                "--num_workers=1"], timeout=60, pythonpath=str(tmp_path))
  _check_nothing_started(run, model_dir, message)
