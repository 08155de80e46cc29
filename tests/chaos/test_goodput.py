"""Goodput (tfps.chaos.goodput), from progress records (no cluster)."""

import dataclasses

import pytest

from tfps.chaos import goodput
from tfps.recovery import progress_log as progress_lib

from tests.support import fakes

P = progress_lib.Progress


def test_a_run_without_faults_has_goodput_one():
  records = [P(step=0, time=0.0, restored=True), *fakes.steady_progress(0.0, 0, 20)]
  measured = goodput.measure(records)
  assert measured.value == pytest.approx(1.0)
  assert measured.kept_steps == 2000 and measured.fault_free_steps_per_sec == 100.0


def test_loops_that_vary_without_a_fault_lose_nothing():
  # Two loops of three take 1.5 s: the median loop runs 100 steps/s, the run
  # 85.7. Its throughput is the fault-free speed, so it kept all its time.
  records = [P(step=0, time=0.0, restored=True)]
  for i in range(30):
    records.append(P(step=records[-1].step + 100,
                     time=records[-1].time + (1.0 if i % 3 == 0 else 1.5)))
  measured = goodput.measure(records)
  assert measured.fault_free_steps_per_sec == pytest.approx(2900 / 39.0)
  assert measured.value == pytest.approx(1.0)


def test_a_loop_a_fault_stalled_is_not_fault_free_speed():
  # 20 loops of 1 s and one a lost worker held for 5 s: the stall is lost time.
  records = [P(step=0, time=0.0, restored=True), *fakes.steady_progress(0.0, 0, 10),
             P(step=1100, time=15.0), *fakes.steady_progress(15.0, 1100, 10)]
  measured = goodput.measure(records)
  assert measured.fault_free_steps_per_sec == pytest.approx(100.0)
  assert measured.value == pytest.approx(2100 / 100 / 25.0)


def test_a_restart_costs_its_stall_and_the_steps_rolled_back():
  # 10 loops, then 20 s away; the new coordinator restores step 800 (200 lost).
  records = [P(step=0, time=0.0, restored=True), *fakes.steady_progress(0.0, 0, 10),
             P(step=800, time=30.0, restored=True), *fakes.steady_progress(30.0, 800, 12)]
  measured = goodput.measure(records)
  assert measured.kept_steps == 2000 and measured.wall_seconds == 42.0
  assert measured.value == pytest.approx(2000 / 100 / 42.0)
  assert measured.as_dict()["goodput"] == round(2000 / 100 / 42.0, 4)


def test_the_slow_looped_loops_of_a_fast_start_are_not_the_fault_free_speed():
  # Faults so frequent that each coordinator runs more looped loops (half
  # speed) than loops at full speed: the median of all would be the slow one.
  def start(time, step):
    looped = [P(step=step + 50 * (i + 1), time=time + i + 1, looped=True) for i in range(30)]
    return [P(step=step, time=time, restored=True), *looped,
            *fakes.steady_progress(time + 30, step + 1500, 10)]
  records = [*start(0.0, 0), *start(45.0, 2500)]
  measured = goodput.measure(records)
  assert measured.fault_free_steps_per_sec == 100.0
  assert measured.kept_steps == 5000 and measured.wall_seconds == 85.0
  assert measured.value == pytest.approx(5000 / 100 / 85.0)  # ~0.59: the slow loops cost.
  unmarked = [dataclasses.replace(r, looped=False) for r in records]
  # Unmarked, the slow loops would count as full speed (each coordinator's
  # 29 looped loops after its first and 10 at full speed).
  assert goodput.measure(unmarked).fault_free_steps_per_sec == pytest.approx(4900 / 78)


def test_a_run_only_looped_falls_back_to_all_its_loops():
  records = [P(step=0, time=0.0, restored=True),
             *[P(step=50 * (i + 1), time=i + 1.0, looped=True) for i in range(5)]]
  assert goodput.measure(records).fault_free_steps_per_sec == 50.0


def test_no_loop_no_goodput():
  assert goodput.measure([P(step=0, time=0.0, restored=True)]).value is None
