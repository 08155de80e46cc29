"""What counts as a crash in a log (`tfps.base.fatal_output`), and the suite's check of it."""

import pytest

from tfps.base import fatal_output

from tests.support import crash_check


@pytest.mark.parametrize("line", [
    "Fatal Python error: Segmentation fault",
    "Segmentation fault (core dumped)",
    "Aborted (core dumped)",
    "Aborted",
    "*** SIGABRT received at time=1764265399 on cpu 1 ***",
    "2026-11-27 12:00:00.1: F tensorflow/core/x.cc:1] Check failed: ok",
])
def test_crash_lines_are_found(line):
  assert fatal_output.fatal_lines(f"before\n{line}\nafter") == [line]


def test_a_traceback_is_reported_with_what_it_raised():
  text = ("Traceback (most recent call last):\n  File \"x.py\", line 3, in f\n"
          "    remote.fetch()\nValueError: no\nI1127 next log line")
  assert fatal_output.fatal_lines(text) == [
      "Traceback (most recent call last): ... ValueError: no"]
  assert fatal_output.fatal_lines("Traceback (most recent call last):\n  File") == [
      "Traceback (most recent call last): ... (cut off)"]
  assert fatal_output.fatal_lines(text, allowed=("ValueError: no",)) == []


@pytest.mark.parametrize("line", [
    "grpc: ABORTED from worker:1 (localhost:1234): connection reset",
    "tfps: error: lost the cluster during training: AbortedError: ...",
    "I1127 12:00:00.1 1 run.py:1] step 200/2000 | 1,234 steps/s",
    "  File \"x.py\", line 3, in <module>",
])
def test_ordinary_lines_are_not(line):
  assert fatal_output.fatal_lines(line) == []


def test_a_details_file_may_hold_tracebacks_and_an_expected_crash_may_be_allowed():
  text = "Traceback (most recent call last):\nFatal Python error: Aborted"
  assert fatal_output.fatal_lines(text, tracebacks_expected=True) == [
      "Fatal Python error: Aborted"]
  assert fatal_output.fatal_lines(text, allowed=("Fatal Python", "Traceback")) == []


# The lines this test writes itself, for the check under test (not the suite's).
@pytest.mark.crash_output_expected("Segmentation fault", "Fatal Python error: from an earlier")
def test_the_suites_check_reads_only_what_was_written_during_the_test(tmp_path):
  old = tmp_path / "worker-0.log"
  old.write_text("Fatal Python error: from an earlier test\n")
  before = crash_check.sizes(str(tmp_path))
  assert crash_check.fatal_since(str(tmp_path), before, ()) == []
  with old.open("a") as f:
    f.write("ok\nSegmentation fault\n")
  (tmp_path / "checkpoint.data-00000").write_bytes(b"Segmentation fault")  # Not text.
  crash_check.note(b"Traceback (most recent call last):\n", "stderr of tfps local")
  found = crash_check.fatal_since(str(tmp_path), before, ())
  assert found == [f"{old}: Segmentation fault",
                   "stderr of tfps local: Traceback (most recent call last): ... (cut off)"]
  assert crash_check.fatal_since(str(tmp_path), crash_check.sizes(str(tmp_path)), ()) == []
