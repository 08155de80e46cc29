"""Warm-ups (tfps.fast_restart.warm_up) run nothing and never wait for a worker.

On a cluster: input/test_positioned.py (written-out closures warm the
workers, and each batch is read once) and e2e/test_failure_matrix.py (a restarted
worker is warmed before its closures).
"""

import pytest
import tensorflow as tf

from tfps.fast_restart import warm_up

from tests.support import fakes

pytestmark = pytest.mark.tf


def _counting_closure():
  """A closure whose steps change a variable whether or not they read data."""
  count = tf.Variable(0, dtype=tf.int64)

  @tf.function
  def closure(train, steps):
    def run():
      total = tf.constant(0.0)
      for _ in tf.range(steps):
        count.assign_add(1)  # Depends on no input: the kind a failed read does not stop.
        total += 1.0
      return {"loss": total}
    return warm_up.train_or_skip(train, run)

  return count, closure


def test_a_warm_up_changes_nothing_and_returns_zeros_shaped_as_the_steps():
  count, closure = _counting_closure()
  skipped = closure(tf.constant(False), tf.constant(3))
  assert int(count.numpy()) == 0 and float(skipped["loss"]) == 0.0
  trained = closure(tf.constant(True), tf.constant(3))
  assert int(count.numpy()) == 3 and float(trained["loss"]) == 3.0
  assert closure.experimental_get_tracing_count() == 1  # One function for both.


def test_steps_without_logs_warm_up_too():
  step = tf.Variable(0)

  @tf.function
  def closure(train):
    def run():
      step.assign_add(1)
      return {}
    return warm_up.train_or_skip(train, run)

  assert closure(tf.constant(False)) == {} and int(step.numpy()) == 0
  closure(tf.constant(True))
  assert int(step.numpy()) == 1


def test_every_worker_runs_the_calls_once_and_nothing_trains():
  count, closure = _counting_closure()
  ran = []
  workers = [fakes.FakeWorker(0), fakes.FakeWorker(1)]
  calls = [(closure, (tf.constant(False), tf.constant(2))), (lambda: ran.append(1), ())]
  kept = warm_up.warm_workers(fakes.FakeCoordinator(workers), calls)
  assert len(kept) == 2
  assert [len(w.created) for w in workers] == [1, 1]
  assert ran == [1, 1] and int(count.numpy()) == 0  # Both warm-ups ran; nothing trained.


def test_a_worker_that_is_down_gets_its_warm_up_queued_without_a_wait():
  ran = []
  workers = [fakes.FakeWorker(0, up=False), fakes.FakeWorker(1)]
  kept = warm_up.warm_workers(fakes.FakeCoordinator(workers), [(lambda: ran.append(1), ())])
  assert len(kept) == 2 and ran == [1]
  assert len(workers[0].created) == 1  # Queued: TF runs it when the worker is back.


def test_warm_once_asks_only_the_workers_named_and_never_again_when_one_is_taken_back():
  ran, done = [], []
  workers = [fakes.FakeWorker(0), fakes.FakeWorker(1), fakes.FakeWorker(2, up=False)]
  kept = warm_up.warm_once(fakes.FakeCoordinator(workers), [(lambda: ran.append(1), ())], [1, 2],
                           done=done.append, what="a graph")
  assert len(kept) == 2 and [len(w.created) for w in workers] == [0, 1, 1]
  assert ran == [1] and done == [1]
  workers[1].created[0]()  # TF took worker 1 back: it runs the resource again.
  assert ran == [1] and done == [1]
  workers[2].created[0]()  # Worker 2 was down: its first run is when TF takes it back.
  assert ran == [1, 1] and done == [1, 2]


def test_a_failing_warm_once_call_is_logged_and_goes_no_further():
  def fails():
    raise tf.errors.UnavailableError(None, None, "worker gone")

  done = []
  workers = [fakes.FakeWorker(0)]
  warm_up.warm_once(fakes.FakeCoordinator(workers), [(fails, ())], [0], done=done.append,
                    what="a graph")
  assert done == []
  workers[0].created[0]()  # Taken back: not tried again.
  assert done == []


def test_activity_says_whether_a_warm_up_ran_since_a_moment_failed_or_not():
  clock = [10.0]
  activity = warm_up.Activity(clock=lambda: clock[0])
  assert not activity.since(0.0)  # None ran yet.
  seen = []

  def call():
    seen.append(activity.since(10.0))  # Runs now: any moment before counts.
    clock[0] = 12.0
    raise tf.errors.UnavailableError(None, None, "worker gone")

  workers = [fakes.FakeWorker(0), fakes.FakeWorker(1, up=False)]
  warm_up.warm_once(fakes.FakeCoordinator(workers), [(call, ())], [0, 1], done=lambda i: None,
                    what="a graph", activity=activity)
  assert seen == [True]
  # Ended (failed) at 12: it ran in a loop begun at 11 or 12, not in one begun after.
  assert activity.since(11.0) and activity.since(12.0) and not activity.since(12.5)
  workers[1].created[0]()  # Worker 1 was down: it runs when TF takes it back, at 12 again.
  assert seen == [True, True] and activity.since(12.0)
