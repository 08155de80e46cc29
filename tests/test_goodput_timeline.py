"""Goodput and the timeline picture, from progress records (no cluster)."""

import pytest

from tfps.recovery import goodput
from tfps.recovery import progress_log as progress_lib
from tfps.recovery import timeline

P = progress_lib.Progress


def _steady(start_time, start_step, loops, seconds_per_loop=1.0, steps_per_loop=100):
  return [P(step=start_step + steps_per_loop * (i + 1), time=start_time + seconds_per_loop * (i + 1))
          for i in range(loops)]


def test_a_run_without_faults_has_goodput_one():
  records = [P(step=0, time=0.0, restored=True), *_steady(0.0, 0, 20)]
  measured = goodput.measure(records)
  assert measured.value == pytest.approx(1.0)
  assert measured.kept_steps == 2000 and measured.fault_free_steps_per_sec == 100.0


def test_a_restart_costs_its_stall_and_the_steps_rolled_back():
  # 10 loops, then 20 s away; the new coordinator restores step 800 (200 lost).
  records = [P(step=0, time=0.0, restored=True), *_steady(0.0, 0, 10),
             P(step=800, time=30.0, restored=True), *_steady(30.0, 800, 12)]
  measured = goodput.measure(records)
  assert measured.kept_steps == 2000 and measured.wall_seconds == 42.0
  assert measured.value == pytest.approx(2000 / 100 / 42.0)
  assert measured.as_dict()["goodput"] == round(2000 / 100 / 42.0, 4)


def test_no_loop_no_goodput():
  assert goodput.measure([P(step=0, time=0.0, restored=True)]).value is None


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_the_timeline_is_drawn_from_the_records(tmp_path, suffix):
  records = [P(step=0, time=0.0, restored=True), *_steady(0.0, 0, 10),
             P(step=800, time=30.0, restored=True), *_steady(30.0, 800, 5)]
  path = timeline.plot(str(tmp_path / f"run.{suffix}"), records,
                       [timeline.Mark(10.5, "ps:0 SIGKILL")], "steps lost 200, goodput 0.6")
  with open(path, "rb") as f:
    head = f.read(512)
  assert head.startswith(b"\x89PNG") if suffix == "png" else b"<svg" in head
  if suffix == "svg":
    with open(path, encoding="utf-8") as f:
      text = f.read()
    assert "ps:0 SIGKILL" in text and "goodput 0.6" in text
