"""First loops of new coordinators with and without stored traces, side by side.

  python scripts/stored_traces.py --work_dir=/tmp/stored-traces --rounds=2

Runs `tfps local --mode=train` again and again on one model_dir (default ctr,
2 ps, 2 workers), each run a new coordinator that restores the last one's
checkpoint and trains 3,000 steps more. After a first run that gives the
history a short life (so that the fast start is planned), each round runs,
in turn: the fast start with the stored traces, the fast start traced
(`--notrace_cache`), written out with the stored traces (`--nofast_start`)
and written out traced. Prints, for each, the seconds from the coordinator's
restore to the end of its first loop (`progress.jsonl`), every run's value.
A round's first stored write-out may find nothing stored yet and trace
(its line says "traced"); such a run counts as traced.

With `--layouts=2,1` the traces are stored on 2 ps (the first run, then one
written out) and every round runs on 1 ps, as coordinators after a ps
failover do: "stored" is then the 2-ps trace moved to 1 ps
(`fast_restart.trace_relocation`), "traced" traces on 1 ps.

  python scripts/stored_traces.py --work_dir=/tmp/moved-traces --rounds=2 --layouts=2,1
"""

import json
import os
import subprocess
import sys

from absl import app
from absl import flags

flags.DEFINE_string("work_dir", None, "Directory for the model_dir and the runs' logs.")
flags.DEFINE_integer("rounds", 2, "Rounds of the four variants.")
flags.DEFINE_integer("steps", 3000, "Steps each run trains.")
flags.DEFINE_integer("run_deadline", 600, "Seconds one run may take.")
flags.DEFINE_list("layouts", ["2"], "Number of ps the traces are stored on, then (if "
                  "given) the number the rounds run on.")
FLAGS = flags.FLAGS

VARIANTS = (("fast start", True, ()), ("fast start", False, ("--notrace_cache",)),
            ("written out", True, ("--nofast_start",)),
            ("written out", False, ("--nofast_start", "--notrace_cache")))


def first_loop(model_dir: str) -> float:
  """Seconds from the last coordinator's restore record to its first loop's."""
  with open(os.path.join(model_dir, "progress.jsonl"), encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  start = max(i for i, record in enumerate(records) if record.get("restored"))
  return records[start + 1]["time"] - records[start]["time"]


def run(model_dir: str, log_path: str, steps: int, extra: tuple[str, ...],
        closure: str = "fast", num_ps: int = 2) -> tuple[float, bool]:
  """One `tfps local` run to `steps`; (its first loop, whether it rebuilt `closure`)."""
  argv = [sys.executable, "-m", "tfps", "local", "--mode=train", f"--model_dir={model_dir}",
          f"--train_steps={steps}", f"--num_ps={num_ps}", *extra]
  with open(log_path, "w", encoding="utf-8") as log:
    subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                   check=True, timeout=FLAGS.run_deadline)
  with open(log_path, encoding="utf-8", errors="replace") as log:
    text = log.read()
  return first_loop(model_dir), f"{closure} closure rebuilt" in text


def main(argv):
  del argv
  if not FLAGS.work_dir:
    raise app.UsageError("--work_dir is required")
  model_dir = os.path.join(FLAGS.work_dir, "model")
  if os.path.exists(model_dir):
    raise app.UsageError(f"--work_dir ({FLAGS.work_dir}) already holds a model dir")
  os.makedirs(model_dir)
  stored_on, *rounds_on = [int(n) for n in FLAGS.layouts]
  rounds_on = rounds_on[0] if rounds_on else stored_on
  steps = FLAGS.steps
  run(model_dir, os.path.join(FLAGS.work_dir, "first.log"), steps, (), num_ps=stored_on)
  if rounds_on != stored_on:  # Every kind stored on the first layout, before the rounds.
    steps += FLAGS.steps
    run(model_dir, os.path.join(FLAGS.work_dir, "written-out.log"), steps, ("--nofast_start",),
        num_ps=stored_on)
  seconds: dict[tuple[str, bool], list[float]] = {}
  for round_index in range(FLAGS.rounds):
    for number, (kind, stored, extra) in enumerate(VARIANTS):
      steps += FLAGS.steps
      log_path = os.path.join(FLAGS.work_dir, f"round{round_index}-{number}.log")
      value, rebuilt = run(model_dir, log_path, steps, extra,
                           "fast" if kind == "fast start" else "full", num_ps=rounds_on)
      seconds.setdefault((kind, stored and rebuilt), []).append(value)
      print(f"round {round_index}: {kind}, {'stored' if stored and rebuilt else 'traced'}: "
            f"{value:.2f} s", flush=True)
  for (kind, stored), values in sorted(seconds.items()):
    print(f"{kind:12} {'stored' if stored else 'traced':6} "
          f"{min(values):.1f}-{max(values):.1f} s ({len(values)} runs): "
          + " ".join(f"{v:.2f}" for v in values))


if __name__ == "__main__":
  app.run(main)
