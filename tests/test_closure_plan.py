"""When a new coordinator writes its closures out (tfps.coordinator.closure_plan): no TF."""

import pytest

from tfps.coordinator import closure_plan
from tfps.recovery import progress_log

COSTS = closure_plan.SwitchCosts(write_out_seconds=8.0, looped_speed=0.75)  # Break-even 32 s.


def _records(*rows):
  """(time, restored) pairs as progress records."""
  return [progress_log.Progress(step=i, time=t, restored=r) for i, (t, r) in enumerate(rows)]


def test_lifetimes_run_from_each_restore_to_its_last_loop():
  records = _records((100, True), (101, False), (130, False),  # 30 s
                     (140, True),                               # died before a loop: 0 s
                     (150, True), (151, False), (160, False))   # 10 s, still running
  assert closure_plan.coordinator_lifetimes(records) == [30, 0, 10]


def test_loops_before_any_restore_are_ignored():
  assert closure_plan.coordinator_lifetimes(_records((5, False), (9, True), (12, False))) == [3]
  assert closure_plan.coordinator_lifetimes([]) == []


def test_a_run_s_first_coordinator_rents_until_the_break_even():
  assert closure_plan.looped_seconds([], COSTS) == 32.0


def test_the_measured_costs_break_even_after_minutes():
  assert 200 <= closure_plan.MEASURED.break_even_seconds <= 250


def test_after_long_lived_coordinators_the_next_writes_out_at_once():
  assert COSTS.break_even_seconds == 32.0
  assert closure_plan.looped_seconds([300, 280, 20], COSTS) == 0.0  # Median 280.


def test_a_coordinator_without_a_task_to_take_back_rents_whatever_the_history():
  assert closure_plan.looped_seconds([300, 280, 290], COSTS, replaced_soon=True) == 32.0


def test_after_short_lived_ones_the_next_loops_until_the_break_even():
  assert closure_plan.looped_seconds([300, 20, 25, 18], COSTS) == 32.0  # Median 22.5.


def test_only_the_recent_coordinators_predict():
  old_and_short = [5.0] * 10
  assert closure_plan.looped_seconds(old_and_short + [400.0] * closure_plan.RECENT, COSTS) == 0.0
  assert closure_plan.looped_seconds([400.0] * 10 + old_and_short, COSTS) == 32.0


@pytest.mark.parametrize("fields", [{"write_out_seconds": -1}, {"looped_speed": 1.0},
                                    {"looped_speed": 0}])
def test_impossible_costs_are_refused_by_name(fields):
  with pytest.raises(ValueError, match=next(iter(fields))):
    closure_plan.SwitchCosts(**fields)
