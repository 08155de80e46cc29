"""Network partitions at the training level, on virtual hosts (real links going down).

One LocalCluster with `hosts="netns"` (1 ps, 2 workers, every task on its
own network namespace and address) is shared by the module. The first test
trains a supervised chief to completion on it; the rest share one chief
training without end (same model_dir, so it resumes from the first run),
cut one task's link each, check from the progress log (`progress.jsonl`) and
the event log how training came back, then heal the link. A cut link drops
packets (TCP hangs, nothing is refused), which is what these tests are about.

Every wait is bounded and names what it waited for. Skipped, with the
reason, where network namespaces cannot be made (not root, no iproute2).
"""

import json
import os

import pytest

from cluster import hosts
from cluster import local
from cluster import processes
from cluster import spec as spec_lib
from recovery import events as events_lib
from recovery import policy
from recovery import progress as progress_lib

pytestmark = pytest.mark.cluster

SMALL_CTR = "vocab_sizes=3000:2000:1000,embedding_dim=8,hidden=32:16,eval_examples=2048"
CHECKPOINT_INTERVAL = 200
# Short deadlines keep the module within its budget; the defaults are 60 s.
WORKER_TIMEOUT = 10
PS_TIMEOUT = 10
CHIEF = spec_lib.TaskId(spec_lib.JobType.CHIEF, 0)
PS_LOST = policy.FailureKind.PS_LOST.value
WORKER_GONE = policy.FailureKind.WORKER_GONE.value


def _chief_flags(model_dir: str, train_steps: int) -> list[str]:
  return [f"--model_dir={model_dir}", f"--experiment_params={SMALL_CTR}", "--mode=train",
          f"--train_steps={train_steps}", "--steps_per_loop=50",
          f"--checkpoint_interval={CHECKPOINT_INTERVAL}", "--global_batch_size=128",
          f"--worker_timeout={WORKER_TIMEOUT}", f"--ps_timeout={PS_TIMEOUT}",
          # The coordinator gets this long to save after the supervisor's SIGTERM.
          "--grace_seconds=10"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
  if (reason := hosts.unavailable()) is not None:
    pytest.skip(f"virtual hosts unavailable: {reason}")
  config = local.LocalClusterConfig(num_ps=1, num_workers=2, hosts="netns",
                                    work_dir=str(tmp_path_factory.mktemp("partition")))
  with local.LocalCluster(config) as running:
    yield running


@pytest.fixture(scope="module")
def model_dir(cluster):
  path = os.path.join(cluster.work_dir, "model")
  os.makedirs(path, exist_ok=True)
  return path


class Run:
  """The shared supervised chief, and what it has written since it started."""

  def __init__(self, cluster: local.LocalCluster, model_dir: str):
    self.cluster = cluster
    self.model_dir = model_dir
    self.chief = cluster.add_chief(_chief_flags(model_dir, 10_000_000),
                                   stdout_path=os.path.join(model_dir, "chief.stdout"))
    self._log_offset = _size(self.chief.log_path)
    self._progress = progress_lib.ProgressLog(model_dir)
    self._progress.read_new()  # Only this chief's records count.
    self.records: list[progress_lib.Progress] = []

  def poll(self) -> None:
    self.records += self._progress.read_new()

  @property
  def step(self) -> int:
    self.poll()
    trained = [r.step for r in self.records if not r.restored]
    return trained[-1] if trained else 0

  def restores_after(self, index: int) -> list[progress_lib.Progress]:
    self.poll()
    return [r for r in self.records[index:] if r.restored]

  def wait_for(self, predicate, *, timeout: float, what: str) -> None:
    """Waits for `predicate`; fails at once if the chief itself exited."""
    def check():
      if not self.chief.alive:
        raise AssertionError(f"chief exited with {self.chief.returncode} while waiting for "
                             f"{what}; see {self.chief.log_path}")
      return predicate()
    processes.wait_until(check, timeout=timeout, what=what)

  def wait_for_step(self, step: int, timeout: float) -> None:
    self.wait_for(lambda: self.step > step, timeout=timeout, what=f"training past step {step}")

  def wait_for_restart_and_progress(self, since: int, timeout: float) -> progress_lib.Progress:
    """Waits for a coordinator restart after record `since`, then a loop past it."""
    self.wait_for(lambda: self.restores_after(since), timeout=timeout,
                  what="a coordinator restart (a 'restored' progress record)")
    restored = self.restores_after(since)[-1]
    self.wait_for(lambda: self.step > restored.step and not self.records[-1].restored,
                  timeout=timeout, what=f"training past the restored step {restored.step}")
    return restored

  def events_after(self, count: int) -> list[events_lib.Event]:
    return events_lib.EventLog(self.model_dir).read()[count:]

  def event_count(self) -> int:
    return len(events_lib.EventLog(self.model_dir).read())

  def log(self) -> str:
    with open(self.chief.log_path, "rb") as f:
      f.seek(self._log_offset)
      return f.read().decode("utf-8", errors="replace")


def _size(path: str) -> int:
  return os.path.getsize(path) if os.path.exists(path) else 0


def test_namespaced_cluster_trains_to_completion(cluster, model_dir):
  addresses = [cluster.spec.address(t) for t in cluster.spec.tasks()]
  assert all(a.startswith("10.213.0.") for a in addresses), addresses
  stdout = os.path.join(model_dir, "first.stdout")
  chief = cluster.add_chief(_chief_flags(model_dir, 200), stdout_path=stdout)
  chief.start()
  assert chief.wait(timeout=240) == 0, f"see {chief.log_path}"
  with open(stdout) as f:
    (line,) = [l for l in f if l.startswith("{")]
  result = json.loads(line)
  assert result["global_step"] >= 200 and result["status"] == "finished", result
  assert result["faults"] == 0 and result["restarts"] == 0


@pytest.fixture(scope="module")
def run(cluster, model_dir):
  training = Run(cluster, model_dir)
  training.chief.start()
  training.wait_for_step(0, timeout=180)
  yield training


@pytest.fixture(autouse=True)
def _healthy(request):
  """Fault tests start with every link up, every task answering, the chief training."""
  if "run" in request.fixturenames:
    training = request.getfixturevalue("run")
    training.cluster.wait_ready(timeout=60)
    training.wait_for_step(training.step, timeout=120)
  yield


def _cpu_seconds(pid: int) -> float:
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rpartition(")")[2].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_partitioned_worker_is_left_out_then_readmitted_when_healed(run):
  worker = run.cluster.worker(1)
  events, records = run.event_count(), len(run.records)
  run.cluster.partition(worker.task)
  try:
    run.wait_for(lambda: any(e.failure == WORKER_GONE and e.task == "worker:1"
                             for e in run.events_after(events)),
                 timeout=WORKER_TIMEOUT + 30, what="worker:1 to be declared gone")
    # Training goes on without it (a coordinator on the reduced cluster).
    run.wait_for_restart_and_progress(records, timeout=120)
    assert worker.alive  # Cut off, not dead.
  finally:
    run.cluster.heal(worker.task)
  records = len(run.records)
  run.wait_for(lambda: any(e.kind == "recovered" and "with worker:1" in e.detail
                           for e in run.events_after(events)),
               timeout=60, what="worker:1 to be taken back after the heal")
  run.wait_for_restart_and_progress(records, timeout=120)
  cpu = _cpu_seconds(worker.pid)
  run.wait_for_step(run.step + 1000, timeout=120)
  assert _cpu_seconds(worker.pid) - cpu > 0.5  # Re-admitted: it runs closures again.


def test_partitioned_ps_is_a_ps_loss_restored_from_the_last_checkpoint(run):
  ps = run.cluster.ps(0)
  events, records = run.event_count(), len(run.records)
  step = run.step
  run.cluster.partition(ps.task)
  try:
    run.wait_for(lambda: any(e.failure == PS_LOST for e in run.events_after(events)),
                 timeout=PS_TIMEOUT + 30, what="the supervisor to record the ps loss")
  finally:
    run.cluster.heal(ps.task)
  failure = next(e for e in run.events_after(events) if e.failure == PS_LOST)
  assert failure.detail.startswith("coordinator exited with code 170: lost the cluster: "
                                   "ps:0 (10.213.0.3:2222) did not answer for 10s "
                                   "(partitioned or hung"), failure.detail
  step = max(step, run.step)
  restored = run.wait_for_restart_and_progress(records, timeout=150)
  assert 0 <= step - restored.step <= CHECKPOINT_INTERVAL, (step, restored)
  assert ps.alive and ps.starts == 1  # The same server: never killed, only cut off.


def test_partitioned_chief_recovers_like_a_lost_chief(run):
  events, records = run.event_count(), len(run.records)
  step = run.step
  run.cluster.partition(CHIEF)
  try:
    run.wait_for(lambda: any(e.failure == PS_LOST and "this chief is cut off" in e.detail
                             for e in run.events_after(events)),
                 timeout=PS_TIMEOUT + 30, what="the coordinator to find itself cut off")
  finally:
    run.cluster.heal(CHIEF)
  step = max(step, run.step)
  restored = run.wait_for_restart_and_progress(records, timeout=150)
  assert 0 <= step - restored.step <= CHECKPOINT_INTERVAL, (step, restored)
  # No worker was blamed for the chief's own cut.
  assert not [e for e in run.events_after(events) if e.failure == WORKER_GONE]
