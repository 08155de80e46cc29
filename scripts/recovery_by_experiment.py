"""Recovery figures for each experiment shape, not only the built-in ctr.

  python scripts/recovery_by_experiment.py --work_dir=/tmp/by-experiment

Runs `tfps chaos` once per experiment shape with the same faults (by default
a worker SIGKILL in the first loop, at step 0, and one mid-run, each back
after 3 s), one run after another: the built-in `ctr`, and the user-shaped
experiments of `tests/support/experiments/user_experiments.py` (TensorFlow's
PS tutorial, Orbit's `SingleTaskTrainer`, and with `--shapes=files` the latter on one
epoch of TFRecord files, written once under `--work_dir`). Prints a table to stderr and one JSON line to stdout:
per shape, per fault, the seconds to recover, the longest stall and the stall
beyond a loop, and the run's goodput. Flags after `--` go to every run.
"""

import json
import os
import subprocess
import sys

from absl import app
from absl import flags
from absl import logging

from tfps.cluster import processes

FLAGS = flags.FLAGS
flags.DEFINE_string("work_dir", None, "Where each run's model_dir and logs go.")
flags.DEFINE_list("shapes", ["ctr", "tutorial", "single_task"], "Experiment shapes to run.")
flags.DEFINE_string("faults", None,
                    "tfps chaos --faults for every run (default: worker:0 killed at step 0, "
                    "in the first loop, and at the run's middle step, back after 3 s).")
flags.DEFINE_float("run_deadline", 1800.0, "Seconds after which a run is ended as failed.")
flags.mark_flag_as_required("work_dir")

_EXPERIMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                            "support", "experiments")
# Each shape's experiment and run: steps enough for a few hundred loops' worth of faults.
_SHAPES = {
    "ctr": ["--experiment=ctr", "--train_steps=4000", "--steps_per_loop=200"],
    "tutorial": ["--experiment=user_experiments:tutorial", "--train_steps=1000",
                 "--steps_per_loop=100", "--global_batch_size=32"],
    "single_task": ["--experiment=user_experiments:single_task", "--train_steps=1200",
                    "--experiment_params=examples=65536,repeat=1", "--steps_per_loop=100",
                    "--global_batch_size=256"],
    # One epoch of TFRecord files (positioned): tf.data does not know its length.
    "files": ["--experiment=user_experiments:files", "--train_steps=3000",
              "--experiment_params=examples=1048576,data_dir={work_dir}/records",
              "--steps_per_loop=100", "--global_batch_size=256"],
}


def _steps(argv: list[str]) -> int:
  return int(next(a for a in argv if a.startswith("--train_steps=")).split("=")[1])


def _one_run(shape: str, extra: list[str]) -> dict | None:
  run_dir = os.path.join(FLAGS.work_dir, shape)
  os.makedirs(run_dir, exist_ok=True)
  argv = [a.format(work_dir=FLAGS.work_dir) for a in _SHAPES[shape]]  # Files written once.
  faults = FLAGS.faults or f"worker:0@step0:kill+3,worker:0@step{_steps(argv) // 2}:kill+3"
  command = [sys.executable, "-m", "tfps", "chaos", "--mode=train", f"--faults={faults}",
             f"--model_dir={os.path.join(run_dir, 'model')}", *argv, *extra]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in (_EXPERIMENTS, os.environ.get("PYTHONPATH")) if p))
  logging.info("%s: %s", shape, " ".join(command[2:]))
  result_path = os.path.join(run_dir, "chaos.json")
  with open(result_path, "w") as out, open(os.path.join(run_dir, "chaos.log"), "w") as log:
    child = processes.spawn(command, stdout=out, stderr=log, env=env)
    try:
      child.wait(timeout=FLAGS.run_deadline)
    except subprocess.TimeoutExpired:
      logging.error("%s still running after %.0fs: ending it", shape, FLAGS.run_deadline)
    finally:
      processes.stop_group(child, grace=30.0)
  try:
    with open(result_path, encoding="utf-8") as f:
      return json.loads(f.read().strip().splitlines()[-1])
  except (OSError, ValueError, IndexError):
    logging.error("%s printed no result; see %s/chaos.log", shape, run_dir)
    return None


def main(argv: list[str]) -> int:
  rows = {}
  for shape in FLAGS.shapes:
    result = _one_run(shape, argv[1:])
    if result is None:
      rows[shape] = None
      continue
    rows[shape] = {
        "status": result["status"],
        "goodput": (result.get("goodput") or {}).get("goodput"),
        "faults": [{k: f[k] for k in ("target", "signal", "seconds_to_recover",
                                       "longest_stall_seconds", "stall_beyond_loop_seconds")}
                   for f in result.get("faults", [])]}
    for fault in rows[shape]["faults"]:
      sys.stderr.write(f"{shape:12s} {fault['target']} {fault['signal']:8s} recover "
                       f"{fault['seconds_to_recover']}s  longest stall "
                       f"{fault['longest_stall_seconds']}s  beyond a loop "
                       f"{fault['stall_beyond_loop_seconds']}s\n")
  sys.stdout.write(json.dumps(rows) + "\n")
  return 0 if all(r and r["status"] == "ok" for r in rows.values()) else 1


if __name__ == "__main__":
  app.run(main)
