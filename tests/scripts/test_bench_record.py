"""scripts/bench_record.py appends a bench run's ratios, one row per size, to a record."""

import json
import os
import subprocess
import sys

from tests.support import paths

SCRIPT = os.path.join(paths.SCRIPTS_DIR, "bench_record.py")


def _size(eps_tfps, stock, single):
  return {"examples_per_sec": {"tfps": eps_tfps, "single_process": 200000},
          "ratio_vs_best_stock": stock, "ratio_vs_single_process": single}


# The fields `tfps bench` writes that the record reads (tfps/commands/bench.py).
RESULT = {"sizes": {"default": _size(131396, 1.85, 0.59), "dense": _size(20510, 2.4, None)},
          "closure_overhead_us": 2270.4, "machine": {"cpu": "x", "cores": 2},
          "load_average": {"before": 0.42, "after": 1.3}, "seconds": 103.2}


def _record(tmp_path, record):
  bench = tmp_path / "bench.out"
  bench.write_text("some log line\n" + json.dumps(RESULT) + "\n")
  return subprocess.run([sys.executable, SCRIPT, f"--from_json={bench}", f"--record={record}"],
                        capture_output=True, text=True, timeout=60)


def test_each_run_adds_a_row_per_size_under_one_header(tmp_path):
  record = tmp_path / "bench-record.md"
  for _ in range(2):
    done = _record(tmp_path, record)
    assert done.returncode == 0, done.stderr
  lines = record.read_text().splitlines()
  assert lines[0] == "# Throughput record" and sum(l.startswith("| date") for l in lines) == 1
  rows = [l for l in lines if l.startswith("| 2")]
  assert len(rows) == 4
  cells = [c.strip() for c in rows[0].strip("|").split("|")]
  assert cells[2:] == ["2", "default", "131,396", "1.85", "0.59", "2,270", "0.4", "103"]
  assert [c.strip() for c in rows[1].strip("|").split("|")][3:7] == [
      "dense", "20,510", "2.40", "n/a"]
  commit = cells[1].rstrip("+")
  assert len(commit) >= 7 and all(c in "0123456789abcdef" for c in commit)
  assert done.stdout.splitlines() == rows[2:]


def test_a_file_without_a_bench_line_is_one_line_and_no_row(tmp_path):
  bench, record = tmp_path / "bench.out", tmp_path / "bench-record.md"
  bench.write_text("tfps: error: something\n")
  done = subprocess.run([sys.executable, SCRIPT, f"--from_json={bench}", f"--record={record}"],
                        capture_output=True, text=True, timeout=60)
  assert done.returncode != 0 and done.stderr.strip().endswith(f"no JSON line in {bench}")
  assert not record.exists()
