"""Chaos soak: several seeded `tfps chaos` runs, one after another, added up.

  python scripts/chaos_soak.py --runs=6 --fault_count=9 --work_dir=/tmp/soak

Run i uses seed `--seed + i` and its own model_dir under `--work_dir`. Each
run's JSON line is kept in `<work_dir>/run-<seed>/chaos.json` and its stderr
in `chaos.log`; at the end a table goes to stderr and one JSON line to stdout:
runs, runs_finished, faults_injected, recoveries, steps_lost,
recovery_seconds, longest_stall_seconds and stall_beyond_loop_seconds
{p50, max} (see `chaos.tracker_lib.RecoveryTracker`), goodput {goodput, lowest_run,
seconds_per_fault: the rate the runs met} and the same per kind of fault
(`ps kill`, `chief term`, ...). A run that outlives `--run_deadline` is ended (its whole
process group) and counted as not finished. Exit 0 only if every run
finished. A run whose result is already in its folder is not run again, so
an interrupted soak continues where it stopped, in later sessions too: a run
cut off before its result starts again from an empty model_dir (delete a
run's folder to redo a finished one). Each run's folder names the code that
ran it (`code.txt`: the git commit, and whether tfps/ or scripts/ had
changes), since the runs of one soak may span commits.

Flags after `--` go to every `tfps chaos` run unchanged.
"""

import json
import os
import shutil
import subprocess
import sys

from absl import app
from absl import flags
from absl import logging

import tfps
from tfps.cluster import processes
from tfps.chaos import tracker as tracker_lib

FLAGS = flags.FLAGS
flags.DEFINE_integer("runs", 6, "Chaos runs.")
flags.DEFINE_integer("seed", 1, "Seed of the first run; run i uses seed + i.")
flags.DEFINE_integer("fault_count", 9, "Random faults per run (>= 3).")
flags.DEFINE_float("chaos_duration", None,
                   "Seconds of training each run spreads its faults over (default: none; the "
                   "faults are placed by training step across the run, on a host of any speed).")
flags.DEFINE_integer("train_steps", 60000, "Steps each run must reach (outlast the faults).")
flags.DEFINE_string("work_dir", None, "Where each run's model_dir and logs go.")
flags.DEFINE_float("run_deadline", 1200.0, "Seconds after which a run is ended as failed.")
flags.mark_flag_as_required("work_dir")


def _one_run(seed: int, extra: list[str]) -> dict | None:
  run_dir = os.path.join(FLAGS.work_dir, f"run-{seed}")
  os.makedirs(run_dir, exist_ok=True)
  model_dir = os.path.join(run_dir, "model")
  argv = [sys.executable, "-m", "tfps", "chaos", f"--seed={seed}",
          f"--fault_count={FLAGS.fault_count}", f"--train_steps={FLAGS.train_steps}",
          f"--model_dir={model_dir}", *extra]
  if FLAGS.chaos_duration is not None:
    argv.insert(5, f"--chaos_duration={FLAGS.chaos_duration}")
  result_path = os.path.join(run_dir, "chaos.json")
  done = _result(result_path)
  if done is not None:
    logging.info("run seed=%d: result already in %s", seed, result_path)
    return done
  if os.path.exists(model_dir):
    logging.info("run seed=%d: no result, starting again from an empty %s", seed, model_dir)
    shutil.rmtree(model_dir)
  with open(os.path.join(run_dir, "code.txt"), "w") as f:
    f.write(_code_version() + "\n")
  logging.info("run seed=%d: %s", seed, " ".join(argv[2:]))
  with open(result_path, "w") as out, open(os.path.join(run_dir, "chaos.log"), "w") as log:
    child = processes.spawn(argv, stdout=out, stderr=log)
    try:
      child.wait(timeout=FLAGS.run_deadline)
    except subprocess.TimeoutExpired:
      logging.error("run seed=%d still running after %.0fs: ending it", seed, FLAGS.run_deadline)
    finally:
      processes.stop_group(child, grace=30.0)
  result = _result(result_path)
  if result is None:
    logging.error("run seed=%d printed no result (exit %s); see %s/chaos.log",
                  seed, child.returncode, run_dir)
    return None
  logging.info("run seed=%d: %s, %d/%d faults recovered, steps lost %d", seed, result["status"],
               result["recoveries"], result["faults_injected"], result["steps_lost"])
  return result


def _code_version() -> str:
  """The git commit of the tfps being run, `+changes` if its tfps/ or scripts/ differ."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(tfps.__file__)))
  git = lambda *args: subprocess.run(["git", "-C", root, *args], capture_output=True,
                                     text=True, timeout=30, check=False)
  head = git("rev-parse", "--short", "HEAD")
  if head.returncode != 0:
    return f"unknown (no git repository at {root})"
  dirty = git("status", "--porcelain", "--untracked-files=no", "--", "tfps", "scripts").stdout
  return head.stdout.strip() + ("+changes" if dirty.strip() else "")


def _result(path: str) -> dict | None:
  """The JSON line a finished `tfps chaos` run left at `path`, if any."""
  try:
    with open(path) as f:
      lines = [l for l in f if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None
  except (OSError, ValueError):
    return None


def _table(summary: dict) -> str:
  rows = [f"{'fault':<14}{'count':>6}{'recovered':>10}{'p50 s':>8}{'max s':>8}"
          f"{'stall p50':>10}{'stall max':>10}{'beyond loop max':>16}{'lost max':>9}"]
  shown = lambda value, width: f"{value if value is not None else '-':>{width}}"
  for kind, row in summary["by_kind"].items():
    seconds, stall = row["recovery_seconds"], row["longest_stall_seconds"]
    beyond = row["stall_beyond_loop_seconds"]["max"]  # None for runs before it was reported.
    rows.append(f"{kind:<14}{row['faults']:>6}{row['recovered']:>10}"
                f"{shown(seconds['p50'], 8)}{shown(seconds['max'], 8)}"
                f"{shown(stall['p50'], 10)}{shown(stall['max'], 10)}{shown(beyond, 16)}"
                f"{row['steps_lost_max']:>9}")
  goodput, every = summary["goodput"]["goodput"], summary["goodput"]["seconds_per_fault"]
  rows.append(f"runs finished {summary['runs_finished']}/{summary['runs']}, faults recovered "
              f"{summary['recoveries']}/{summary['faults_injected']}, goodput "
              f"{'-' if goodput is None else f'{goodput:.1%}'}"
              f"{'' if every is None else f' at a fault per {every:.0f} s of wall time'}")
  return "\n".join(rows)


def main(argv):
  extra = argv[1:]
  results = [_one_run(FLAGS.seed + i, extra) for i in range(FLAGS.runs)]
  summary = tracker_lib.soak_summary(results)
  sys.stderr.write(_table(summary) + "\n")
  sys.stdout.write(json.dumps(summary) + "\n")
  return 0 if summary["runs_finished"] == summary["runs"] else 1


if __name__ == "__main__":
  app.run(main)
