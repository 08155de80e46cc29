"""Which ends are deaths, and what of a dead process's output is kept (no processes)."""

import pytest

from tfps.recovery import deaths


@pytest.mark.parametrize("code, serves, died", [
    (0, True, True), (143, True, True), (-9, True, True),  # A ps/worker/standby: any end.
    (0, False, False), (170, False, False), (1, False, False), (143, False, False),
    (-11, False, True), (-9, False, True), (3, False, True), (134, False, True),
])
def test_a_death_is_any_end_of_a_server_and_a_signal_or_foreign_code_of_the_rest(
    code, serves, died):
  assert deaths.is_death(code, serves=serves) is died


def test_the_event_names_the_signal_and_keeps_the_crash_report_above_a_long_dump():
  dump = [f"  File \"x.py\", line {i}" for i in range(100)]
  lines = ["starting", "Fatal Python error: Segmentation fault", *dump]
  event = deaths.Death("coordinator", 42, -11, tuple(lines), cause="").event()
  assert (event.kind, event.task, event.pid, event.signal, event.exit_code) == (
      "died", "coordinator", 42, "SIGSEGV", None)
  assert event.last_lines[0] == "Fatal Python error: Segmentation fault"
  assert event.last_lines[1:] == tuple(dump[-deaths.LAST_LINES:])
  assert event.detail == "coordinator (pid 42) killed by SIGSEGV"
  exited = deaths.Death("worker:1", 7, 171, ("port taken",), cause="before it answered").event()
  assert (exited.signal, exited.exit_code) == (None, 171)
  assert exited.detail == "worker:1 (pid 7) exited with code 171: before it answered"
