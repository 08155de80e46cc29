"""Warm workers: the train closures instantiated on a worker before it trains.

The first call of a closure's function on a worker instantiates it there:
the worker optimizes the function's graph, splits it between itself and the
ps tasks and registers the parts with them. For the written-out closure (50
steps in one graph) that takes seconds, and a loop whose closure lands on a
cold worker waits for it. A worker that
TensorFlow takes back after a restart is such a worker.

A warm-up calls a closure's function with its `train` argument false. The
steps sit in the true branch of a `tf.cond` (`train_or_skip`), so nothing
runs: no input is read, no variable changes, on the worker or on a ps (the
branch not taken never executes; tests/fast_restart/test_warm_up.py and the input checks
of the cluster tests). The function is instantiated whole all the same,
both branches, so the next real call only runs.

`warm_workers` runs the warm-up as a per-worker resource of the
`ClusterCoordinator`: on the worker's own thread, before that worker's next
closure, and again whenever TensorFlow takes the worker back, before it
hands it a closure. Meanwhile the other workers take the closures.
(Measured and dropped: calling the function on each worker's device from a
background thread, beside the running closures. Two instantiations at once
on one worker, from two threads of the coordinator, hung an in-process
cluster; TF's own design keeps one call at a time per worker.)
"""

import threading
import time
from typing import Any, Callable, Sequence

from absl import logging
import tensorflow as tf

from tfps.base import errors
from tfps.base import tf_internals
from tfps.base import messages
from tfps.base import task_names

# A call of a function with its arguments: (concrete function, args).
Call = tuple[Callable[..., Any], tuple[Any, ...]]


def train_or_skip(train: tf.Tensor, steps: Callable[[], Any]) -> Any:
  """`steps()` when `train` is true, else zeros shaped as its result (call in a tf.function).

  The zeros branch runs nothing and changes nothing; calling the function
  with `train` false only instantiates it (a warm-up).
  """
  traced = []

  def run():
    traced.append(steps())
    return traced[-1]

  def skip():
    if not traced:  # tf.cond traces the true branch first.
      raise errors.PermanentError("internal: the warm-up branch was traced before the steps")
    return tf.nest.map_structure(lambda t: tf.zeros(t.shape, t.dtype), traced[-1])

  return tf.cond(train, run, skip)


def warm_workers(coordinator, calls: Sequence[Call],
                 done: Callable[[int], None] = lambda index: None) -> list[Any]:
  """Has every worker run `calls` on its own thread before its next closure, and again
  whenever TF takes it back (a worker that is down: when TF takes it back).
  `done(index)` each time a worker has run them.

  Returns the per-worker values, which the caller must keep: TF holds
  resources weakly and forgets one whose values are gone.
  """
  workers = tf_internals.coordinator_workers(coordinator)
  return [worker.create_resource(_warm_up_fn(calls, worker.device_name,
                                             lambda w=worker: done(w.worker_index)))
          for worker in workers]


class Activity:
  """When warm-ups ran: whether one ran at some time since a moment (a loop's start).

  A warm-up starts on a worker's thread when that worker next takes work, which
  may be after the loop that asked for it: the loop it holds up is the one to
  know it by (its time is not its steps')."""

  def __init__(self, clock: Callable[[], float] = time.monotonic):
    self._clock, self._lock = clock, threading.Lock()
    self._running, self._last_end = 0, float("-inf")

  def begin(self) -> None:
    with self._lock:
      self._running += 1

  def end(self) -> None:
    with self._lock:
      self._running -= 1
      self._last_end = self._clock()

  def since(self, moment: float) -> bool:
    """Whether a warm-up runs now, or ended at `moment` or after (the same clock)."""
    with self._lock:
      return self._running > 0 or self._last_end >= moment


def warm_once(coordinator, calls: Sequence[Call], indices: Sequence[int],
              done: Callable[[int], None], what: str,
              activity: Activity | None = None) -> list[Any]:
  """Has each worker of `indices` run `calls` on its own thread before its next closure,
  once: not again when TF takes it back (the first try counts, done or not).
  `done(index)` after a worker ran them; `activity` is told when each runs.
  Returns the values to keep (`warm_workers`).
  A per-worker value among a call's arguments (an iterator) is each worker's own.

  For calls that are only worth having: an error in one is logged in a line and
  goes no further (a worker that failed meanwhile fails its next closure instead).
  """
  tried: set[int] = set()
  lock = threading.Lock()

  def once(worker):
    def warm_up():  # On the worker's thread, inside its device scope.
      with lock:
        if worker.worker_index in tried:
          return
        tried.add(worker.worker_index)
      task, start = task_names.task_or_device(worker.device_name), time.perf_counter()
      if activity is not None:
        activity.begin()
      try:
        for function, args in calls:
          function(*tf_internals.worker_args(args, worker.worker_index))
      except Exception as e:  # pylint: disable=broad-except  (nothing depends on it)
        logging.warning("%s: %s not instantiated (%s: %s)", task, what, type(e).__name__,
                        messages.one_line(e))
        return
      finally:
        if activity is not None:
          activity.end()
      logging.info("%s: %s instantiated in %.1fs", task, what, time.perf_counter() - start)
      done(worker.worker_index)
    return warm_up

  workers = [w for w in tf_internals.coordinator_workers(coordinator)
             if w.worker_index in set(indices)]
  return [worker.create_resource(once(worker)) for worker in workers]


def _warm_up_fn(calls: Sequence[Call], device: str,
                done: Callable[[], None]) -> Callable[[], None]:
  def warm_up():  # On the worker's thread, inside its device scope.
    start = time.perf_counter()
    for function, args in calls:
      function(*args)
    logging.info("%s: train closures instantiated in %.1fs, before it runs them",
                 task_names.task_or_device(device), time.perf_counter() - start)
    done()
  return warm_up
