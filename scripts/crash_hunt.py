"""Crash hunt: runs tfps again and again and counts the crashes anywhere in their logs.

  python scripts/crash_hunt.py --local_runs=20 --chaos_runs=5 --work_dir=/tmp/crash-hunt

Runs `tfps local --train_steps=2000` `--local_runs` times, then `--chaos_runs`
seeded `tfps chaos` runs (seed 1, 2, ...), one after another, each in its own
model_dir under `--work_dir`. After each run it reads the run's stderr and
every text file in its model_dir (the task logs under `logs/`, the event
log) for lines that report a crash (`tfps.base.fatal_output`: a `Fatal
Python error`, a segmentation fault, an abort, a CHECK failure, an uncaught
traceback; a details file `errors.log` may hold tracebacks). It prints a line
per run to stderr and one JSON line to stdout: runs, runs that failed, the
crash lines found (with their files) and the deaths the runs' results
counted. Exit 0 only if every run ended 0 and no crash line was found.

Flags after `--` go to every run unchanged.
"""

import json
import os
import subprocess
import sys

from absl import app
from absl import flags
from absl import logging

from tfps.base import fatal_output
from tfps.cluster import processes

FLAGS = flags.FLAGS
flags.DEFINE_integer("local_runs", 20, "tfps local runs.")
flags.DEFINE_integer("chaos_runs", 5, "Seeded tfps chaos runs (seeds 1..N).")
flags.DEFINE_integer("train_steps", 2000, "Steps of each tfps local run.")
flags.DEFINE_integer("chaos_train_steps", 20000, "Steps of each tfps chaos run.")
flags.DEFINE_string("work_dir", None, "Where each run's model_dir and stderr go.")
flags.DEFINE_float("run_deadline", 1200.0, "Seconds after which a run is ended as failed.")
flags.mark_flag_as_required("work_dir")

_TEXT_SUFFIXES = (".log", ".stdout", ".stderr", ".jsonl", ".json", ".txt")


def crash_lines(run_dir: str) -> list[str]:
  """Every crash line in the text files under `run_dir`, as `path: line`."""
  found = []
  for directory, _, names in os.walk(run_dir):
    for name in sorted(names):
      if not name.endswith(_TEXT_SUFFIXES):
        continue
      path = os.path.join(directory, name)
      with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
      found += [f"{path}: {line}" for line in fatal_output.fatal_lines(
          text, tracebacks_expected=name == "errors.log")]
  return found


def _one_run(name: str, argv: list[str]) -> dict:
  run_dir = os.path.join(FLAGS.work_dir, name)
  os.makedirs(run_dir, exist_ok=True)
  model_dir = os.path.join(run_dir, "model")
  argv = [sys.executable, "-m", "tfps", *argv, f"--model_dir={model_dir}"]
  with open(os.path.join(run_dir, "result.json"), "w") as out, \
      open(os.path.join(run_dir, "run.stderr"), "w") as err:
    child = processes.spawn(argv, stdout=out, stderr=err)
    try:
      code = child.wait(timeout=FLAGS.run_deadline)
    except subprocess.TimeoutExpired:
      logging.error("%s still running after %.0fs: ending it", name, FLAGS.run_deadline)
      code = None
    finally:
      processes.stop_group(child, grace=30.0)
  try:
    with open(os.path.join(run_dir, "result.json"), encoding="utf-8") as f:
      deaths = json.loads(f.read().strip().splitlines()[-1]).get("deaths", {})
  except (OSError, ValueError, IndexError):
    deaths = {}
  found = crash_lines(run_dir)
  logging.info("%s: exit %s, %d crash line(s), deaths %s", name, code, len(found), deaths)
  return {"run": name, "exit_code": code, "crash_lines": found, "deaths": deaths}


def main(argv: list[str]) -> int:
  extra = argv[1:]
  runs = [_one_run(f"local-{i + 1}", ["local", f"--train_steps={FLAGS.train_steps}", *extra])
          for i in range(FLAGS.local_runs)]
  runs += [_one_run(f"chaos-{seed}", ["chaos", f"--seed={seed}", "--mode=train",
                                      f"--train_steps={FLAGS.chaos_train_steps}", *extra])
           for seed in range(1, FLAGS.chaos_runs + 1)]
  failed = [r["run"] for r in runs if r["exit_code"] != 0]
  crashes = [line for r in runs for line in r["crash_lines"]]
  summary = {"runs": len(runs), "runs_failed": failed, "crash_lines": len(crashes),
             "crashes": crashes, "deaths": {r["run"]: r["deaths"] for r in runs if r["deaths"]}}
  sys.stdout.write(json.dumps(summary) + "\n")
  return 0 if not failed and not crashes else 1


if __name__ == "__main__":
  app.run(main)
