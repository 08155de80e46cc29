"""When a new coordinator writes its closures out (tfps.recovery.closure_plan): no TF."""

import pytest

from tfps.recovery import closure_plan
from tfps.recovery import events as events_lib
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


def test_a_restart_that_takes_a_task_back_continues_the_life_before_it():
  records = _records((100, True), (130, False),   # Failover coordinator: 30 s,
                     (140, True), (160, False),   # restarted at 135 to take the ps back: +20 s.
                     (170, True), (175, False))   # A fault's restart: a new life.
  assert closure_plan.coordinator_lifetimes(records, continued=[135]) == [50, 5]
  assert closure_plan.coordinator_lifetimes(records) == [30, 20, 5]


def test_a_planned_restart_before_the_last_loop_ends_nothing():
  records = _records((100, True), (130, False), (140, True), (160, False))
  assert closure_plan.coordinator_lifetimes(records, continued=[120]) == [30, 20]


def _back(at):
  return events_lib.Event(kind="recovered", task="ps:1", task_change="back",
                          tasks_left_out=(), time=at)


def test_planned_restarts_are_those_taking_a_task_back():
  gone = events_lib.Event(kind="recovered", task="worker:1", task_change="gone",
                          tasks_left_out=("worker:1",), time=5)
  failure = events_lib.Event(kind="failure", task="chief:0", failure="ps_lost", time=6)
  assert closure_plan.planned_restarts([gone, failure, _back(7)]) == [7]


def test_a_coordinator_taking_a_task_back_writes_out_if_the_life_it_continues_has_long_to_go():
  history = _records((0, True), (300, False),      # 300 s, ended by a fault.
                     (310, True), (320, False))    # The failover coordinator: 10 s so far.
  assert closure_plan.plan(history, [_back(325)], COSTS) == 0.0  # 300 - 10 >= 32.
  # A failover coordinator itself rents, whatever the history.
  assert closure_plan.plan(history[:2], [], COSTS, replaced_soon=True) == 32.0


def test_a_coordinator_taking_a_task_back_rents_if_the_life_it_continues_is_near_its_end():
  history = _records((0, True), (60, False),       # 60 s, ended by a fault.
                     (70, True), (110, False))     # The failover coordinator: 40 s so far.
  assert closure_plan.plan(history, [_back(115)], COSTS) == 32.0  # 60 - 40 < 32.
  # Without the planned restart, the 40 s would be a life of its own (median 50 >= 32).
  assert closure_plan.plan(history, [], COSTS) == 0.0


def test_a_run_s_first_coordinator_rents_until_the_break_even():
  assert closure_plan.looped_seconds([], COSTS) == 32.0


def test_the_measured_costs_break_even_within_minutes():
  # 15 s traced and 4.9 s stored, at 0.91 of the written-out speed.
  assert 150 <= closure_plan.MEASURED.break_even_seconds <= 200
  assert 45 <= closure_plan.STORED.break_even_seconds <= 65


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


def test_no_coordinator_outlives_the_training_left():
  assert closure_plan.looped_seconds([300, 280, 290], COSTS, remaining=500) == 0.0
  # Near the end of training a write-out cannot repay itself, whatever the history.
  assert closure_plan.looped_seconds([300, 280, 290], COSTS, remaining=20) == 32.0


def test_training_left_from_the_target_and_the_latest_loops_speed():
  records = [progress_log.Progress(step=0, time=0.0, restored=True)] + [
      progress_log.Progress(step=100 * i, time=float(i)) for i in range(1, 31)]  # 100 steps/s.
  assert closure_plan.remaining_seconds(records, train_steps=5000) == pytest.approx(20.0)
  assert closure_plan.remaining_seconds(records, train_steps=None) is None
  assert closure_plan.remaining_seconds(records[:2], train_steps=5000) is None  # No loop yet.
  assert closure_plan.remaining_seconds(records, train_steps=1000) == 0.0
  history = [progress_log.Progress(step=0, time=0.0, restored=True),
             progress_log.Progress(step=1, time=300.0),              # Lived 300 s,
             progress_log.Progress(step=1, time=310.0, restored=True)] + [
      progress_log.Progress(step=1 + 100 * i, time=310.0 + i) for i in range(1, 301)]  # and 300 s.
  assert closure_plan.plan(history, [], COSTS) == 0.0
  assert closure_plan.plan(history, [], COSTS, train_steps=30_001 + 5_000) == 0.0  # 50 s left.
  assert closure_plan.plan(history, [], COSTS, train_steps=30_001 + 2_000) == 32.0  # 20 s left.


def _loops(start, seconds, *, speed=100):
  """A coordinator restored at `start` (and its step), then a loop a second for `seconds`."""
  step = int(start * speed)
  return [progress_log.Progress(step=step, time=float(start), restored=True)] + [
      progress_log.Progress(step=step + speed * i, time=float(start + i))
      for i in range(1, seconds + 1)]


def test_a_kept_write_out_is_repaid_by_the_run_not_by_the_coordinator_s_life():
  # Three coordinators that each lived 20 s, at 100 steps/s; 600 s of training left.
  history = _loops(0, 20) + _loops(30, 20) + _loops(60, 20)
  train_steps = history[-1].step + 600 * 100
  # By lives (the write-out dies with the coordinator): rent to the break-even.
  assert closure_plan.plan(history, [], COSTS, train_steps=train_steps) == 32.0
  # Kept (stored, and read back by the workers): the 600 s left repay it now.
  assert closure_plan.plan(history, [], COSTS, train_steps=train_steps, kept=True) == 0.0
  # Unless less is left than the break-even...
  assert closure_plan.plan(history, [], COSTS, train_steps=history[-1].step + 20 * 100,
                           kept=True) == 32.0
  # ...or the supervisor will soon replace this coordinator (its cluster goes with it).
  assert closure_plan.plan(history, [], COSTS, train_steps=train_steps, kept=True,
                           replaced_soon=True) == 32.0


def test_a_kept_write_out_waits_for_the_speed_when_the_training_left_is_not_known():
  # The run's first coordinator: no loop yet; or a run without a step target.
  assert closure_plan.plan([], [], COSTS, train_steps=10_000, kept=True) == \
      closure_plan.MEASURING_SECONDS
  assert closure_plan.plan(_loops(0, 20), [], COSTS, kept=True) == \
      closure_plan.MEASURING_SECONDS
  assert 0 < closure_plan.MEASURING_SECONDS < COSTS.break_even_seconds


def test_with_stored_traces_the_first_coordinator_and_any_stored_write_out_are_kept():
  steps = 10**6
  traced, stored, _ = closure_plan.plans([], [], trace_cache=True, train_steps=steps)
  assert traced == stored == closure_plan.MEASURING_SECONDS
  # Later: short lives, hours left. A stored write-out is kept: at once. One
  # traced here was not stored when it should have been: plan by lives.
  history = _loops(0, 20) + _loops(30, 20)
  traced, stored, cold = closure_plan.plans(history, [], trace_cache=True, train_steps=steps)
  assert stored == 0.0
  assert traced == closure_plan.MEASURED.break_even_seconds
  # Stored but new to the workers (a failover coordinator's): the first loop
  # trains looped, not waiting for every worker's optimization of it.
  assert cold == closure_plan.MEASURING_SECONDS
  # Without stored traces every write-out dies with its coordinator.
  assert closure_plan.plans([], [], trace_cache=False, train_steps=steps) == (
      closure_plan.MEASURED.break_even_seconds, closure_plan.STORED.break_even_seconds,
      closure_plan.COLD.break_even_seconds)


def test_a_traced_write_out_whose_failover_graph_is_built_after_it_costs_that_build_too():
  # Coordinators that lived 300 s each, at 100 steps/s, and 210 s of training left:
  # enough to repay the write-out alone, not the write-out and its failover graph.
  with_graph = closure_plan.MEASURED_WITH_FAILOVER_GRAPH
  assert with_graph.write_out_seconds > closure_plan.MEASURED.write_out_seconds
  assert with_graph.looped_speed == closure_plan.MEASURED.looped_speed
  assert closure_plan.MEASURED.break_even_seconds < 210 < with_graph.break_even_seconds
  history = _loops(0, 300) + _loops(310, 300)
  steps = history[-1].step + 210 * 100
  alone, _, _ = closure_plan.plans(history, [], trace_cache=True, train_steps=steps)
  assert alone == 0.0  # Written out at once.
  traced, _, _ = closure_plan.plans(history, [], trace_cache=True, train_steps=steps,
                                    failover_graph=True)
  assert traced == with_graph.break_even_seconds  # Looped: it would not repay both.


def test_a_cold_write_out_in_a_short_run_stays_looped():
  # A failover coordinator with less training left than its workers' optimization
  # of the written-out closure would repay: looped until the end.
  costs = closure_plan.COLD
  assert closure_plan.STORED.write_out_seconds < costs.write_out_seconds
  history = _loops(0, 20)  # 100 steps/s.
  left = int(0.5 * costs.break_even_seconds * 100)
  _, _, cold = closure_plan.plans(history, [], trace_cache=True,
                                  train_steps=history[-1].step + left)
  assert cold == costs.break_even_seconds


@pytest.mark.parametrize("step_seconds, max_seconds, most, steps", [
    (None, 0.5, 50, 50),  # Not measured yet.
    (0.002, 0.5, 50, 50),  # Fast steps: full size, the bound costs nothing.
    (0.1, 0.5, 50, 5),
    (0.3, 0.5, 50, 1),
    (2.0, 0.5, 50, 1),  # Never less than one step.
    (0.1, 0.0, 50, 50),  # 0: no bound.
])
def test_a_closure_holds_as_many_steps_as_run_in_the_bound(step_seconds, max_seconds, most,
                                                           steps):
  assert closure_plan.closure_steps(step_seconds, max_seconds, most) == steps


def test_a_workers_step_time_is_the_loop_shared_by_the_workers_that_ran_it():
  # 200 steps in 4 closures on 2 workers, 2 s: each worker ran 100 steps in 2 s.
  assert closure_plan.worker_step_seconds(2.0, 200, 4, 2) == 0.02
  # One closure: one worker ran all of it.
  assert closure_plan.worker_step_seconds(2.0, 50, 1, 2) == 0.04
  assert closure_plan.worker_step_seconds(0.0, 200, 4, 2) is None
  assert closure_plan.worker_step_seconds(1.0, 0, 0, 2) is None


def test_a_new_coordinator_starts_from_the_runs_recent_speed():
  assert closure_plan.recent_step_seconds([], 2) is None
  records = [progress_log.Progress(step=0, time=0.0, restored=True),
             progress_log.Progress(step=100, time=10.0),
             progress_log.Progress(step=200, time=20.0),  # 10 steps/s on 2 workers...
             progress_log.Progress(step=300, time=30.0)]
  assert closure_plan.recent_step_seconds(records, 2) == pytest.approx(0.2)  # ...0.2 s each.


def test_a_loop_that_built_graphs_ahead_is_not_a_step_time():
  # A young run: its only timed loop also had the workers optimize failover graphs
  # (5 s). A coordinator started after it knows no step time (full-size closures,
  # the stored traces' size), rather than one that shrinks its closures.
  P = progress_log.Progress
  young = [P(step=0, time=0.0, restored=True), P(step=200, time=15.0),
           P(step=400, time=20.0, warming=True)]
  assert closure_plan.recent_step_seconds(young, 2) is None
  later = young + [P(step=600, time=21.0), P(step=800, time=22.0)]
  assert closure_plan.recent_step_seconds(later, 2) == pytest.approx(0.01)


def test_calibration_tells_a_closures_own_time_from_its_steps():
  # One step each: 0.08 s; four steps each: 0.20 s. So 0.04 s a step, 0.04 s a closure.
  step, overhead = closure_plan.calibrated(0.08, 4, 0.20)
  assert step == pytest.approx(0.04) and overhead == pytest.approx(0.04)
  # 0.5 s at most: (0.5 - 0.04) / 0.04 = 11 steps fit, 10 of the sizes (not 0.5 / 0.08 = 6).
  assert closure_plan.closure_steps(step, 0.5, 50, overhead) == 10
  # Noise (more steps measured no slower): no overhead claimed, the slower rate kept.
  assert closure_plan.calibrated(0.08, 4, 0.07) == (0.02, 0.0)
  # A loop's own measure leaves each closure's overhead out of the step.
  assert closure_plan.worker_step_seconds(1.0, 100, 10, 2, 0.02) == pytest.approx(0.018)


def test_fast_steps_keep_full_closures_even_measured_on_a_busy_host():
  # 50 steps of 11 ms and 0.1 s a closure: 0.65 s, within twice the bound: kept.
  assert closure_plan.closure_steps(0.011, 0.5, 50, 0.1) == 50
  # 50 steps of 54 ms: 2.7 s: shortened to the size that runs within the bound.
  assert closure_plan.closure_steps(0.054, 0.5, 50, 0.054) == 8


def test_a_restart_keeps_a_larger_full_size_whose_trace_is_stored_if_it_fits():
  # 0.02 s a step, 0.5 s a closure: 20 steps chosen; 50 (1.0 s) is stored and fits
  # within 1.5 x 2 x 0.5 s, so the restart rebuilds it instead of tracing 20.
  assert closure_plan.keep_stored_size(20, [50], 0.021, 0.5, most=50) == 50
  assert closure_plan.keep_stored_size(20, [25, 40], 0.021, 0.5, most=50) == 40


def test_a_stored_size_too_long_or_above_the_most_is_not_kept():
  assert closure_plan.keep_stored_size(20, [50], 0.031, 0.5, most=50) == 20  # 1.55 s > 1.5 s
  assert closure_plan.keep_stored_size(20, [50], 0.01, 0.5, most=40) == 20
  assert closure_plan.keep_stored_size(20, [10], 0.01, 0.5, most=50) == 20  # Never smaller.
  assert closure_plan.keep_stored_size(20, [50], None, 0.5, most=50) == 20  # No speed known.
  assert closure_plan.keep_stored_size(20, [50], 0.01, 0.0, most=50) == 20  # No bound.
