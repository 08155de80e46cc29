"""A closure its worker holds runs again on another worker (tfps.coordinator.speculation,
closure_fence, tf_internals.ClosureAttempts), on the in-process cluster.

A worker there cannot be paused (it is this process): the held closure waits
for a ps variable instead, as long as the test wants; the rerun, whose shard
argument counts an attempt more, does not wait.
"""

import threading
import time

import pytest
import tensorflow as tf

from tfps.base import tf_internals
from tfps.coordinator import closure_fence
from tfps.coordinator import speculation as speculation_lib
from tfps.cluster import processes
from tfps.recovery import slow_closures

pytestmark = pytest.mark.tf

SHARDS = 1000  # A code below WAITS waits for the gate: only the first attempt of shard < 100.
WAITS = 100


def test_tickets_are_unique_and_the_shard_is_the_code_modulo_the_shards():
  codes = {(s, e, a): closure_fence.shard_code(s, e, 7, a)
           for s in range(7) for e in range(3) for a in range(closure_fence.ATTEMPTS)}
  assert len(set(codes.values())) == len(codes)
  assert all(code % 7 == s for (s, _, _), code in codes.items())
  values = {closure_fence.ticket(code, start)[1] for code in codes.values() for start in range(9)}
  assert len(values) == len(codes) * 9
  assert all(0 <= closure_fence.ticket(code, 5)[0] < closure_fence.SLOTS for code in codes.values())


def test_a_revoked_ticket_fails_its_check_on_a_worker_until_released(runtime):
  fence = closure_fence.ClosureFence(runtime.strategy)

  @tf.function
  def check(code, start):
    with tf.control_dependencies([fence.check(code, start)]):
      return tf.constant(1)

  def on_worker(code, start):
    with tf.device("/job:worker/replica:0/task:0"):
      return int(check(tf.constant(code, tf.int64), tf.constant(start, tf.int64)).numpy())

  assert on_worker(3, 40) == 1
  fence.revoke(3, 40)
  with pytest.raises(tf.errors.InvalidArgumentError, match="run again on another worker"):
    on_worker(3, 40)
  assert on_worker(3 + 7, 40) == 1 and on_worker(3, 41) == 1  # Other tickets pass.
  fence.release(3, 40)
  assert on_worker(3, 40) == 1


def test_a_held_closure_runs_again_elsewhere_and_the_first_run_is_dropped(runtime):
  coordinator = runtime.coordinator
  with runtime.strategy.scope():
    gate = tf.Variable(0, dtype=tf.int64)
    runs = tf.Variable(0, dtype=tf.int64)
  fence = closure_fence.ClosureFence(runtime.strategy)

  @tf.function
  def closure(code, start):
    def held():
      return tf.while_loop(lambda i: tf.equal(gate.read_value(), 0), lambda i: i + 1,
                           [tf.constant(0, tf.int64)])[0]
    waited = tf.cond(code < WAITS, held, lambda: tf.constant(0, tf.int64))
    # After the wait, as a closure's checks come after its steps before.
    with tf.control_dependencies([fence.check(code, start, after=[waited])]):
      runs.assign_add(1)
      return tf.identity(code)

  def schedule(code):
    return coordinator.schedule(closure, args=(tf.constant(code, tf.int64),
                                               tf.constant(0, tf.int64)))

  attempts = tf_internals.track_closures(coordinator, time.monotonic)
  done = []
  attempts.on_done.append(lambda attempt, seconds: done.append(attempt.task_index))
  watch = speculation_lib.Speculation(
      attempts, num_workers=2, probe=lambda task: False, fence=fence, num_shards=SHARDS,
      rules=slow_closures.Rules(min_samples=4, margin=0.3))
  try:
    quick = [schedule(2 * SHARDS + i) for i in range(6)]  # Timed: the expected time.
    coordinator.join()
    held = schedule(5)
    watch.fenced(held)  # It checks its ticket: the rerun gets the next one.
    began = time.monotonic()
    # The join's deadline: were the closure not run again, the held run goes on at 30 s.
    deadline = threading.Timer(30, lambda: gate.assign(1))
    deadline.start()
    coordinator.join()  # Returns once the rerun is done, the first run still held.
    deadline.cancel()
    assert time.monotonic() - began < 30
    assert held.fetch() == 5 + SHARDS  # The rerun's outcome, under its own ticket.
    assert [q.fetch() for q in quick] == [2 * SHARDS + i for i in range(6)]
    assert watch.rerun == 1 and watch.dropped == 0
    gate.assign(1)  # The held run goes on: its check fails; that is dropped, not raised.
    processes.wait_until(lambda: watch.dropped == 1, timeout=30,
                         what="the held run to end")
    assert int(runs.numpy()) == 7  # Six quick runs and the rerun; the held one stopped.
    assert coordinator.fetch(schedule(7 * SHARDS)) == 7 * SHARDS  # The queue still works.
    # Each successful run was heard once, from the worker that ran it; not the held one.
    processes.wait_until(lambda: len(done) == 8, timeout=10, what="8 runs heard")
    assert set(done) <= {0, 1} and len(done) == 8
    # A closure with no ticket (an evaluator's) runs again as it is: the same arguments.
    gate.assign(0)
    plain = schedule(6)
    processes.wait_until(lambda: watch.rerun == 2, timeout=30, what="the plain closure taken")
    gate.assign(1)
    assert plain.fetch() == 6
    processes.wait_until(lambda: watch.dropped == 2, timeout=30, what="its first run to end")
  finally:
    gate.assign(1)
    watch.stop()
    attempts.close()


class _Attempts:
  """Closure attempts as `Speculation` sees them: worker 0 holds a taken run."""

  def __init__(self, running, held):
    self.on_end, self.on_done = [], []
    self._running, self._held = running, held
    self.taken = []

  def running(self):
    return list(self._running)

  def held_workers(self):
    return set(self._held)

  def take_away(self, attempt):
    self.taken.append(attempt)
    return True


def _attempt(worker):
  return tf_internals.ClosureAttempt(closure=None, worker_index=worker, task_index=worker,
                                     started=0.0)


@pytest.mark.parametrize("running, held, taken", [
    ([1], (), [1]),
    ([1], (0,), []),
    ([1], (0, 1), []),
    ([0, 1], (), [0]),  # Worker 0's taken: worker 1's has nowhere left to go.
])
def test_a_closure_is_taken_only_when_a_worker_not_held_can_run_it(running, held, taken):
  # Worker 0's thread waits on a run taken from it (a paused worker): worker 1's
  # slow closure has nowhere else to go, and taking it would only drop its work.
  attempts = _Attempts([_attempt(w) for w in running], held)
  now = [100.0]
  watch = speculation_lib.Speculation(attempts, num_workers=2, probe=lambda task: False,
                                      clock=lambda: now[0])
  try:
    for seconds in [1.0] * 8:
      attempts.on_done[0](None, seconds)
    watch.look()
    assert [a.worker_index for a in attempts.taken] == taken and watch.rerun == len(taken)
  finally:
    watch.stop()


def test_in_a_first_loop_a_worker_silent_twice_in_a_row_loses_its_closure():
  # Nothing is timed yet: a worker that answers keeps its closure (it may be building
  # its functions) and is asked again every `cold_probe` seconds; a paused one does not.
  attempts = _Attempts([_attempt(1)], ())
  now, answers, probed = [0.0], [True], []

  def probe(task):
    probed.append(now[0])
    return answers[0]

  watch = speculation_lib.Speculation(attempts, num_workers=2, probe=probe,
                                      clock=lambda: now[0])
  try:
    for now[0] in (1.0, 2.5, 3.0):
      watch.look()
    assert probed == [2.5] and not attempts.taken
    answers[0] = False  # Paused now.
    for now[0] in (4.0, 4.5):
      watch.look()
    assert probed == [2.5, 4.5] and not attempts.taken
    now[0] = 4.6
    watch.look()
    assert probed == [2.5, 4.5, 4.6] and [a.worker_index for a in attempts.taken] == [1]
  finally:
    watch.stop()
