"""Scratch directories that a later owner sweeps when theirs was killed (no TF)."""

import os
import subprocess
import sys

import pytest

from tfps.cluster import scratch


def test_names_of_dead_owners_are_stale_and_nothing_else():
  names = ["tfps-chief-11-abc", "tfps-chief-12-x_y", "tfps-chief-13-q",
           "tfps-chief-abc", "tfps-chief-12", "tfps-local-11-abc", "tfps-chief-model-11-a"]
  alive = {12}.__contains__
  assert scratch.stale(names, "tfps-chief-", alive) == ["tfps-chief-11-abc", "tfps-chief-13-q"]
  assert scratch.owner_pid("tfps-local-model-k2j4", "tfps-local-") is None  # An output dir.


def test_a_new_scratch_dir_sweeps_those_of_dead_owners_only(tmp_path):
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait(timeout=30)
  stale = tmp_path / f"tfps-test-{dead.pid}-abc"
  (stale / "logs").mkdir(parents=True)
  (stale / "logs" / "ps-0.log").write_text("left by a killed owner")
  live = tmp_path / f"tfps-test-{os.getpid()}-def"
  live.mkdir()
  other = tmp_path / f"tfps-other-{dead.pid}-abc"
  other.mkdir()
  with scratch.ScratchDir("tfps-test-", parent=str(tmp_path)) as path:
    assert os.path.basename(path).startswith(f"tfps-test-{os.getpid()}-")
    assert not stale.exists()
    assert live.exists() and other.exists()
  assert not os.path.exists(path)  # Its own: removed when it ends.


def test_a_prefix_must_end_with_a_dash(tmp_path):
  with pytest.raises(ValueError, match=r"prefix \('tfps'\) must end with '-'"):
    scratch.ScratchDir("tfps", parent=str(tmp_path))


# A process that leaves with os._exit, as a coordinator does: exit hooks
# (AutoGraph's removal of its files among them) never run.
_LEAVES_WITH_OS_EXIT = """
import os, sys, tempfile
from tfps.cluster import scratch
temp = scratch.use_for_temporary_files("tfps-test-")
with tempfile.NamedTemporaryFile(suffix=".py", delete=False) as f:
  print(f.name, flush=True)
if sys.argv[1] == "cleanup":
  temp.cleanup()
os._exit(0)
"""


def test_temporary_files_of_a_process_leaving_with_os_exit(tmp_path):
  env = {**os.environ, "TMPDIR": str(tmp_path)}
  run = lambda how: subprocess.run([sys.executable, "-c", _LEAVES_WITH_OS_EXIT, how], env=env,
                                   capture_output=True, text=True, timeout=60,
                                   check=True).stdout.strip()
  left = run("no-cleanup")  # As if killed: its file stays...
  assert os.path.dirname(os.path.dirname(left)) == str(tmp_path) and os.path.exists(left)
  cleaned = run("cleanup")  # ...until the next such process sweeps it; its own goes.
  assert not os.path.exists(left) and not os.path.exists(cleaned)
  assert os.listdir(tmp_path) == []
