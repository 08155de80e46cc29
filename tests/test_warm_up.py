"""Warm-ups (tfps.coordinator.warm_up) run nothing, and never wait without end.

On a cluster: test_positioned_input.py (a fast start warms the workers and
reads each batch once) and test_recovery_cluster.py (a restarted worker is
warmed before its closures).
"""

import threading

import tensorflow as tf

from tfps.coordinator import warm_up


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


class _Worker:
  """A ClusterCoordinator worker that runs a resource on its own thread, or never (down).

  `at_once`: run it before `create_resource` returns, for a test whose short
  deadline must not depend on how soon a thread starts.
  """

  def __init__(self, index: int, *, up: bool = True, at_once: bool = False):
    self.device_name = f"/job:worker/replica:0/task:{index}"
    self.up, self.at_once, self.created = up, at_once, []
    self._is_dead_with_error = None  # TF's mark of a lost worker.

  def create_resource(self, fn):
    self.created.append(fn)
    if self.up and self.at_once:
      _ran(fn)
    elif self.up:
      threading.Thread(target=lambda: _ran(fn), daemon=True).start()
    return object()


def _ran(fn):
  try:
    fn()
  except Exception:  # pylint: disable=broad-except  (TF's worker thread would log it)
    pass


class _Coordinator:
  def __init__(self, workers):
    self._cluster = type("Cluster", (), {"workers": workers})()


def test_every_worker_runs_the_calls_once_and_nothing_trains():
  count, closure = _counting_closure()
  ran = []
  workers = [_Worker(0), _Worker(1)]
  calls = [(closure, (tf.constant(False), tf.constant(2))), (lambda: ran.append(1), ())]
  kept, not_warmed = warm_up.warm_workers(_Coordinator(workers), calls, wait_each=60)
  assert len(kept) == 2 and not_warmed == {}
  assert [len(w.created) for w in workers] == [1, 1]
  assert ran == [1, 1] and int(count.numpy()) == 0  # Both warm-ups ran; nothing trained.


def test_a_worker_that_is_down_is_given_up_at_the_deadline_and_the_next_one_warmed():
  ran = []
  workers = [_Worker(0, up=False), _Worker(1, at_once=True)]
  kept, not_warmed = warm_up.warm_workers(
      _Coordinator(workers), [(lambda: ran.append(1), ())], wait_each=0.2)
  assert len(kept) == 2 and ran == [1]
  assert not_warmed == {"/job:worker/replica:0/task:0": "no answer within 0.2s"}
  assert len(workers[0].created) == 1  # Queued: TF runs it when the worker is back.


def test_no_worker_is_warmed_while_another_is_lost():
  workers = [_Worker(0), _Worker(1)]
  workers[1]._is_dead_with_error = RuntimeError("lost")  # pylint: disable=protected-access
  found_back = []

  def back():  # Worker 1 comes back once worker 0's warm-up was held up.
    found_back.append(not workers[0].created)
    workers[1]._is_dead_with_error = False  # pylint: disable=protected-access

  timer = threading.Timer(0.3, back)
  timer.start()
  try:
    _, not_warmed = warm_up.warm_workers(_Coordinator(workers), [], wait_each=60)
  finally:
    timer.cancel()
  assert found_back == [True] and not_warmed == {}
  assert [len(w.created) for w in workers] == [1, 1]


def test_many_workers_are_warmed_a_quarter_at_a_time():
  log = []

  class Logged(_Worker):
    def create_resource(self, fn):
      log.append(("created", self.device_name[-1]))
      return super().create_resource(fn)

  workers = [Logged(i) for i in range(8)]
  calls = [(lambda: log.append(("warm", None)), ())]
  kept, not_warmed = warm_up.warm_workers(_Coordinator(workers), calls, wait_each=60)
  assert len(kept) == 8 and not_warmed == {}
  created = [i for i, (what, _) in enumerate(log) if what == "created"]
  warmed = [i for i, (what, _) in enumerate(log) if what == "warm"]
  for group in range(1, 4):  # Groups of 2: each starts after the earlier ones warmed.
    assert min(created[2 * group:2 * group + 2]) > max(warmed[:2 * group]), log


def test_a_warm_up_that_fails_says_why():
  def broken():
    raise ValueError("no such device")
  _, not_warmed = warm_up.warm_workers(_Coordinator([_Worker(0)]), [(broken, ())], wait_each=60)
  assert not_warmed == {"/job:worker/replica:0/task:0": "ValueError: no such device"}


def test_without_waiting_every_worker_gets_its_warm_up_at_once():
  workers = [_Worker(0, up=False), _Worker(1, up=False)]
  kept, not_warmed = warm_up.warm_workers(_Coordinator(workers), [], wait_each=None)
  assert len(kept) == 2 and not_warmed == {}
  assert [len(w.created) for w in workers] == [1, 1]
