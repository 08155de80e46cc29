"""The train closures and which one a loop uses (tfps.coordinator.closures), in one process.

A fake coordinator runs each scheduled closure at once and each worker's
warm-up at once; the cluster versions are in input/test_positioned.py.
"""

import threading

import pytest
import tensorflow as tf

from tfps.recovery import closure_plan
from tfps.coordinator import closures as closures_lib

from tests.support import fakes

pytestmark = pytest.mark.tf

FULL = 4


class _Counting:
  """A train step over positioned input: counts its steps and sums what it read."""

  def __init__(self):
    self.steps = tf.Variable(0, dtype=tf.int64)
    self.total = tf.Variable(0, dtype=tf.int64)

  def train_step(self, iterator):
    value = next(iterator)
    self.steps.assign_add(1)
    self.total.assign_add(value)
    return {"value": tf.cast(value, tf.float32)}


def _closures(counting, full_size=FULL, unroll=FULL, fast_unroll=2):
  return closures_lib.TrainClosures(counting.train_step, fakes.shard_iterator, full_size=full_size,
                                    unroll=unroll, what="Counting", fast_unroll=fast_unroll)


def _source(shard, start):
  return (tf.constant(shard, tf.int64), tf.constant(start, tf.int64))


def test_every_full_size_closure_runs_the_same_steps_on_the_same_input():
  # No loop; 1 written out + a loop of 3; a loop of 1 (no dearer than the fast start).
  for unroll, fast in ((FULL, "fast_closure"), (3, "fast_closure"), (1, "full_closure")):
    for written_out in (True, False):
      counting, coordinator = _Counting(), fakes.FakeCoordinator()
      closures = _closures(counting, unroll=unroll)  # Fast start: a loop of 2 steps.
      sums = closures.schedule(coordinator, FULL, written_out, _source(1, 2))
      # Shard 1 is 1, 3, 5, ...; from its batch 2 on: 5, 7, 9, 11.
      assert (int(counting.steps.numpy()), int(counting.total.numpy())) == (4, 32)
      assert float(sums["value"]) == 32.0
      assert coordinator.ran == ["full_closure" if written_out else fast]
      assert closures.has_fast_start == (fast == "fast_closure")


def test_a_closure_of_another_size_is_the_looped_one():
  counting, coordinator = _Counting(), fakes.FakeCoordinator()
  _closures(counting).schedule(coordinator, 3, True, _source(0, 0))
  assert coordinator.ran == ["other_closure"]
  assert (int(counting.steps.numpy()), int(counting.total.numpy())) == (3, 0 + 2 + 4)


def test_the_warm_up_calls_run_no_step():
  counting = _Counting()
  closures = _closures(counting)
  with tf.distribute.get_strategy().scope():
    for written_out in (True, False):
      for function, args in closures.warm_calls(written_out):
        function(*args)
  assert (int(counting.steps.numpy()), int(counting.total.numpy())) == (0, 0)
  assert len(closures.warm_calls(True)) == 2 and len(closures.warm_calls(False)) == 1


def test_a_fast_start_loop_traces_its_closure_for_other_sizes_before_it_runs():
  # A shard's tail mid-loop then traces nothing: a trace registers its functions
  # with every task, waiting for a paused worker.
  counting, coordinator = _Counting(), fakes.FakeCoordinator()
  warm = _warm(counting, coordinator, looped_seconds=60)
  closures = warm._closures  # pylint: disable=protected-access
  warm.before_loop(written_out=False)
  traced = closures.traced()
  with tf.distribute.get_strategy().scope():
    closures.schedule(coordinator, 3, False, _source(0, 0))
  assert coordinator.ran == ["other_closure"]
  assert closures.traced() == traced


def _warm(counting, coordinator, *, looped_seconds, costs=closure_plan.MEASURED):
  return closures_lib.WarmClosures(
      _closures(counting), tf.distribute.get_strategy(), coordinator,
      ready=threading.Event(), looped_seconds=looped_seconds, costs=costs)


def test_written_out_at_once_and_workers_warmed_once_before_the_first_loop():
  counting, coordinator = _Counting(), fakes.FakeCoordinator()
  warm = _warm(counting, coordinator, looped_seconds=0)
  assert warm.ready.is_set() and not warm.workers_kept_warm
  warm.before_loop(written_out=True)
  resources = warm._resources  # pylint: disable=protected-access
  warm.after_loop()
  warm.before_loop(written_out=True)
  assert warm.workers_kept_warm
  assert warm._resources is resources  # pylint: disable=protected-access
  assert len(resources) == 2  # One per worker.
  assert int(counting.steps.numpy()) == 0  # The warm-ups trained nothing.


def test_a_looped_start_writes_out_after_the_first_loop_past_its_time():
  counting, coordinator = _Counting(), fakes.FakeCoordinator()
  warm = _warm(counting, coordinator, looped_seconds=1e-9)  # Past after any loop.
  assert not warm.ready.is_set()
  warm.before_loop(written_out=False)
  fast_resources = warm._resources  # pylint: disable=protected-access
  assert len(fast_resources) == 2  # Warm for the fast start...
  assert not warm.workers_kept_warm  # ...nothing written out yet.
  warm.after_loop()
  assert warm.ready.is_set()
  warm.before_loop(written_out=True)
  assert warm.workers_kept_warm
  assert warm._resources is not fast_resources  # pylint: disable=protected-access
  assert int(counting.steps.numpy()) == 0  # No warm-up trained.


def test_a_looped_start_stays_looped_until_its_time():
  counting, coordinator = _Counting(), fakes.FakeCoordinator()
  warm = _warm(counting, coordinator, looped_seconds=3600)
  for _ in range(3):
    warm.before_loop(written_out=False)
    warm.after_loop()
  assert not warm.ready.is_set() and not warm.workers_kept_warm


def test_a_looped_start_does_not_write_out_when_the_training_left_cannot_repay_it(monkeypatch):
  clock = [1000.0]
  monkeypatch.setattr(closures_lib.time, "monotonic", lambda: clock[0])
  counting, coordinator = _Counting(), fakes.FakeCoordinator()
  warm = _warm(counting, coordinator, looped_seconds=10)
  warm.after_loop(step=0, steps_left=10_000)
  clock[0] += 20  # Past its time, at 100 steps/s.
  warm.after_loop(step=2_000, steps_left=100 * 60)  # A minute left: under the break-even.
  assert not warm.ready.is_set()
  clock[0] += 1
  warm.after_loop(step=2_100, steps_left=None)  # Not known: write out.
  assert warm.ready.is_set()
  warm = _warm(counting, coordinator, looped_seconds=10)
  warm.after_loop(step=0, steps_left=10**6)
  clock[0] += 20
  warm.after_loop(step=2_000, steps_left=10**6)  # Hours left.
  assert warm.ready.is_set()


def test_a_looped_start_with_a_target_decides_only_once_it_knows_the_speed(monkeypatch):
  clock = [1000.0]
  monkeypatch.setattr(closures_lib.time, "monotonic", lambda: clock[0])
  costs = closure_plan.SwitchCosts(write_out_seconds=8.0, looped_speed=0.75)  # 32 s.
  counting, coordinator = _Counting(), fakes.FakeCoordinator()
  warm = _warm(counting, coordinator, looped_seconds=1, costs=costs)
  clock[0] += 5  # A first loop longer than the looped time: no speed yet.
  warm.after_loop(step=0, steps_left=10**6)
  assert not warm.ready.is_set()
  clock[0] += 1
  warm.after_loop(step=100, steps_left=10_000)  # 100 steps/s: 100 s left, over 32 s.
  assert warm.ready.is_set()
  # The same training left under a dearer write-out (break-even 400 s) does not repay it.
  warm = _warm(counting, coordinator, looped_seconds=1,
               costs=closure_plan.SwitchCosts(write_out_seconds=100.0, looped_speed=0.75))
  warm.after_loop(step=0, steps_left=10_100)
  clock[0] += 1
  warm.after_loop(step=100, steps_left=10_000)
  assert not warm.ready.is_set()
  # Nothing left to train: nothing to write out for.
  warm = _warm(counting, coordinator, looped_seconds=1, costs=costs)
  clock[0] += 5
  warm.after_loop(step=0, steps_left=0)
  assert not warm.ready.is_set()


def test_a_loop_that_waited_for_failover_graphs_says_nothing_of_the_speed(monkeypatch):
  # 200 steps/s and 8,000 steps left: 40 s, under the break-even (167 s). A loop
  # that also waited 10 s for the workers' failover graphs runs at 20 steps/s:
  # taken as the speed, the training left looks like 410 s, worth a write-out.
  clock = [1000.0]
  monkeypatch.setattr(closures_lib.time, "monotonic", lambda: clock[0])
  counting, coordinator = _Counting(), fakes.FakeCoordinator()
  for warming in (True, False):
    warm = _warm(counting, coordinator, looped_seconds=1)
    clock[0] += 5
    warm.after_loop(step=0, steps_left=8_400)  # The first loop.
    clock[0] += 10
    warm.after_loop(step=200, steps_left=8_200, warming=warming)
    assert warm.ready.is_set() is not warming  # Marked: no speed known yet.
    clock[0] += 1
    warm.after_loop(step=400, steps_left=8_000)
    assert warm.ready.is_set() is not warming  # Marked: 40 s left at 200 steps/s.


def test_a_write_out_pays_when_the_training_left_lasts_the_break_even():
  costs = closure_plan.SwitchCosts(write_out_seconds=8.0, looped_speed=0.75)  # 32 s.
  assert closure_plan.write_out_pays(None, costs)
  assert closure_plan.write_out_pays(32.0, costs)
  assert not closure_plan.write_out_pays(31.0, costs)
