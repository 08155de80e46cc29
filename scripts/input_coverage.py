"""How often each example was trained on, after a run with and without faults.

Runs the `counting` experiment (tests/support/experiments/input_experiments.py: a finite dataset
of ids, each step adds 1 to a checkpointed `counts[id]` for every id of its
batch) for one epoch on a local cluster (1 ps, 2 workers, a supervised
chief), twice: without faults, and with a ps SIGKILL at a third of the epoch
and a chief SIGKILL at two thirds (each brought back at once, as an
orchestrator would). Faults are injected when the progress log shows the
step reached, not after a number of seconds. Then it reads the counts from
the final checkpoint and prints the table of the README's "What happens to
the input" section, with the run's own input accounting:

  python scripts/input_coverage.py [--examples=200000] [--work_dir=/tmp/coverage]

Exit 0 only if every example was trained on at least once in both runs.
"""

import json
import os
import signal
import sys
import tempfile
import time

from absl import app
from absl import flags
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests", "support", "experiments")
sys.path.insert(0, TESTS)

from tfps.cluster import local  # pylint: disable=wrong-import-position
from tfps.cluster import processes  # pylint: disable=wrong-import-position
from tfps.recovery import coverage  # pylint: disable=wrong-import-position
from tfps.recovery import progress_log as progress_lib  # pylint: disable=wrong-import-position

import input_experiments  # pylint: disable=wrong-import-position

flags.DEFINE_integer("examples", 200_000, "Examples in the epoch.")
flags.DEFINE_integer("batch_size", 128, "Examples per step.")
flags.DEFINE_string("work_dir", None, "Where the runs go (default: a new temp dir).")
flags.DEFINE_float("timeout", 600.0, "Seconds each wait may take.")
FLAGS = flags.FLAGS


def _chief_flags(model_dir: str) -> list[str]:
  return [f"--model_dir={model_dir}", "--experiment=input_experiments:counting",
          f"--experiment_params=examples={FLAGS.examples},work=256", "--mode=train",
          "--train_epochs=1", f"--global_batch_size={FLAGS.batch_size}",
          "--steps_per_loop=50", "--steps_per_closure=10", "--checkpoint_interval=200"]


def _records(model_dir: str) -> list[progress_lib.Progress]:
  return progress_lib.ProgressLog(model_dir).read_new()


def _step(model_dir: str) -> int:
  trained = [r.step for r in _records(model_dir) if not r.restored]
  return trained[-1] if trained else 0


def _epoch_steps(model_dir: str) -> int:
  lengths = next((r.shard_lengths for r in _records(model_dir) if r.shard_lengths), None)
  return sum(lengths) if lengths else 0


def _run(cluster: local.LocalCluster, model_dir: str, faults: bool) -> dict:
  os.makedirs(model_dir)
  chief = cluster.add_chief(_chief_flags(model_dir),
                            stdout_path=os.path.join(model_dir, "chief.stdout"))
  chief.start()
  injected = []
  if faults:
    processes.wait_until(lambda: _epoch_steps(model_dir), timeout=FLAGS.timeout,
                         what="the first coordinator to measure the input")
    epoch = _epoch_steps(model_dir)
    for fraction, target in ((1 / 3, cluster.ps(0)), (2 / 3, chief)):
      processes.wait_until(lambda: _step(model_dir) >= fraction * epoch or not chief.alive,
                           timeout=FLAGS.timeout, what=f"step {fraction * epoch:.0f}")
      if not chief.alive:
        break  # Finished before the fault: reported below.
      target.kill(signal.SIGKILL)
      target.wait(timeout=30)
      injected.append(f"{target.task} SIGKILL at step {_step(model_dir)}")
      target.start()
  code = chief.wait(timeout=FLAGS.timeout)
  cluster.tasks.pop(chief.task)
  if code != 0:
    raise RuntimeError(f"the chief exited {code}; see {chief.log_path}")
  with open(os.path.join(model_dir, "checkpoint")) as f:
    latest = os.path.join(model_dir, f.readline().split('"')[1])
  counts = input_experiments.counts_in(latest)
  records = progress_lib.ProgressLog(model_dir).read_new()
  return {"faults": injected, "counts": counts,
          "accounting": coverage.account(records).as_dict(FLAGS.batch_size)}


def _row(name: str, counts: np.ndarray) -> str:
  n = counts.size
  share = lambda mask: f"{100.0 * np.count_nonzero(mask) / n:.1f} %"
  return f"| {name} | {share(counts == 0)} | {share(counts == 1)} | {share(counts >= 2)} |"


def main(argv):
  del argv
  work_dir = FLAGS.work_dir or tempfile.mkdtemp(prefix="tfps-coverage-")
  os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))
  started = time.time()
  config = local.LocalClusterConfig(num_ps=1, num_workers=2, ready_timeout=180,
                                    work_dir=os.path.join(work_dir, "cluster"))
  with local.LocalCluster(config) as cluster:
    cluster.start()
    clean = _run(cluster, os.path.join(work_dir, "no-fault"), faults=False)
    faulty = _run(cluster, os.path.join(work_dir, "ps-and-chief-sigkill"), faults=True)
  print("| run | ids seen 0x | exactly 1x | 2x or more |")
  print("|---|---|---|---|")
  print(_row("no fault", clean["counts"]))
  print(_row(f"{' + '.join(faulty['faults']) or 'faults not injected'}", faulty["counts"]))
  print(json.dumps({"no_fault": clean["accounting"], "faults": faulty["accounting"],
                    "seconds": round(time.time() - started, 1)}))
  ok = all(r["counts"].min() >= 1 for r in (clean, faulty)) and len(faulty["faults"]) == 2
  return 0 if ok else 1


if __name__ == "__main__":
  app.run(main)
