"""Appends this commit's `tfps bench --quick` ratios to docs/bench-record.md.

  python scripts/bench_record.py                     # runs tfps bench --quick (~2-5 min)
  python scripts/bench_record.py --from_json=F.json  # a bench JSON line already made

One row per run: the date, the commit (`+` when the work tree has changes),
tfps's examples/s and its two ratios per model size (against the best stock
pattern and against one process, side by side within the run), the empty
closure's dispatch, the load average and the run's seconds. The ratios are
what to compare across rows: absolute numbers move with the host and its
load. A regression shows as a row whose ratios fall; it is a record for a
maintainer to read, not a test.
"""

import datetime
import json
import os
import subprocess
import sys

from absl import app
from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.join(REPO, "docs", "bench-record.md")
HEADER = """# Throughput record

One row per `python scripts/bench_record.py` (`tfps bench --quick`, on the host named). The
ratios are side by side within one run; compare them, not the absolute numbers, across rows.

| date | commit | host cores | size | tfps ex/s | x best stock | x one process | empty closure µs | load | seconds |
|---|---|---|---|---|---|---|---|---|---|
"""
_BENCH_SECONDS = 1800  # --quick takes ~2-5 min on 2 cores; a stuck run ends here.

_FROM_JSON = flags.DEFINE_string("from_json", None,
                                 "a file holding `tfps bench` JSON output (last line)")
_RECORD = flags.DEFINE_string("record", RECORD, "the record file to append to")


def rows(result: dict, *, commit: str, date: str) -> list[str]:
  """The record's rows for one bench result: one per model size."""
  cores = (result.get("machine") or {}).get("cores", "?")
  load = (result.get("load_average") or {}).get("before")
  out = []
  for size, figures in result["sizes"].items():
    eps = figures["examples_per_sec"].get("tfps")
    out.append("| " + " | ".join([
        date, commit, str(cores), size, _number(eps, ","),
        _number(figures.get("ratio_vs_best_stock"), ".2f"),
        _number(figures.get("ratio_vs_single_process"), ".2f"),
        _number(result.get("closure_overhead_us"), ",.0f"),
        _number(load, ".1f"), _number(result.get("seconds"), ".0f")]) + " |")
  return out


def _number(value, spec: str) -> str:
  return "n/a" if value is None else format(value, spec)


def append(path: str, new_rows: list[str]) -> None:
  """Adds `new_rows` to the record at `path`, writing its header first if it is new."""
  exists = os.path.exists(path)
  with open(path, "a", encoding="utf-8") as f:
    if not exists:
      f.write(HEADER)
    f.write("".join(row + "\n" for row in new_rows))


def commit_name() -> str:
  """The short commit, with `+` when the work tree differs from it."""
  head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], check=True,
                        capture_output=True, text=True, timeout=30).stdout.strip()
  dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                         check=True, capture_output=True, text=True, timeout=30).stdout.strip()
  return head + ("+" if dirty else "")


def last_json_line(text: str, what: str) -> dict:
  lines = [line for line in text.splitlines() if line.strip().startswith("{")]
  if not lines:
    raise SystemExit(f"bench_record: no JSON line in {what}")
  return json.loads(lines[-1])


def main(argv: list[str]) -> None:
  del argv
  if _FROM_JSON.value:
    with open(_FROM_JSON.value, encoding="utf-8") as f:
      result = last_json_line(f.read(), _FROM_JSON.value)
  else:
    done = subprocess.run([sys.executable, "-m", "tfps", "bench", "--quick"], cwd=REPO,
                          stdout=subprocess.PIPE, text=True, timeout=_BENCH_SECONDS,
                          check=False)
    if done.returncode != 0:
      raise SystemExit(f"bench_record: tfps bench --quick exited {done.returncode}")
    result = last_json_line(done.stdout, "the output of tfps bench --quick")
  new_rows = rows(result, commit=commit_name(), date=datetime.date.today().isoformat())
  append(_RECORD.value, new_rows)
  sys.stdout.write("".join(row + "\n" for row in new_rows))


if __name__ == "__main__":
  app.run(main)
