"""scripts/goodput_breakdown.py splits a run's lost time into its parts (no TF)."""

import os
import subprocess
import sys

from tfps.recovery import events as events_lib
from tfps.recovery import progress_log

from tests.support import paths

SCRIPT = os.path.join(paths.SCRIPTS_DIR, "goodput_breakdown.py")


def test_each_second_lost_is_in_exactly_one_part(tmp_path):
  log = progress_log.ProgressLog(str(tmp_path))
  log.append(0, restored=True, now=0.0)
  log.append(100, now=2.0)     # First loop: 1 s of steps at 100 steps/s, 1 s lost.
  log.append(200, now=3.0)
  log.append(300, now=4.0)
  log.append(200, restored=True, now=10.0)  # 6 s between; 100 steps rolled back (1 s).
  log.append(300, now=12.0)    # First loop again: 1 s lost.
  log.append(400, now=14.0, looped=True)    # A fast-start loop: 1 s lost.
  log.append(500, now=15.0)
  log.append(600, now=16.0)
  out = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True,
                       check=True, timeout=60).stdout
  # 600 kept steps at 100 steps/s: 6 of 16 s; 10 s lost.
  assert "all: wall 16 s, lost 10 s (goodput 37.5%)" in out
  parts = {line[:24].strip(): float(line.split()[-3]) for line in out.splitlines()
           if line.startswith("  ")}
  assert parts == {"the run's start": 0, "between coordinators": 6, "first loops": 2,
                   "fast-start loops": 1, "rolled back": 1, "the rest": 0}


def test_the_run_s_start_is_what_was_lost_before_its_first_fault(tmp_path):
  log = progress_log.ProgressLog(str(tmp_path))
  log.append(0, restored=True, now=0.0)
  log.append(100, now=5.0)     # A first loop and a write-out: 4 s lost...
  log.append(200, now=6.0)
  log.append(300, now=7.0)     # ...before the fault at 7.5 s.
  log.append(300, restored=True, now=9.0)  # 2 s between coordinators.
  log.append(400, now=11.0)    # Its first loop: 1 s lost.
  log.append(500, now=12.0)
  events_lib.EventLog(str(tmp_path)).append(
      events_lib.Event(kind="died", task="ps:0", time=7.5))
  events_lib.EventLog(str(tmp_path)).append(
      events_lib.Event(kind="epoch", time=1.0))  # Not a fault.
  out = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True,
                       check=True, timeout=60).stdout
  assert "all: wall 12 s, lost 7 s" in out
  assert "first fault): wall 5 s, lost 3 s (goodput 40.0%)" in out  # From 7 s on.
  parts = {line[:24].strip(): float(line.split()[-3]) for line in out.splitlines()
           if line.startswith("  ")}
  assert parts == {"the run's start": 4, "between coordinators": 2, "first loops": 1,
                   "fast-start loops": 0, "rolled back": 0, "the rest": 0}
