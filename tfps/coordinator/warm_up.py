"""Warm workers: the train closures instantiated on a worker before it trains.

The first call of a closure's function on a worker instantiates it there:
the worker optimizes the function's graph, splits it between itself and the
ps tasks and registers the parts with them. For the written-out closure (50
steps in one graph) that takes seconds (~2.5 s for the ctr on 2 cores), and
a loop whose closure lands on a cold worker waits for it. It did so twice
per fault: when a new coordinator switches from the looped to the written-out
closure (fast start), and when TensorFlow takes back a restarted worker.

A warm-up calls a closure's function with its `train` argument false. The
steps sit in the true branch of a `tf.cond` (`train_or_skip`), so nothing
runs: no input is read, no variable changes, on the worker or on a ps (the
branch not taken never executes; tests/test_warm_up.py and the input checks
of the cluster tests). The function is instantiated whole all the same,
both branches, so the next real call only runs.

`warm_workers` runs the warm-up as a per-worker resource of the
`ClusterCoordinator`: on the worker's own thread, before that worker's next
closure, and again whenever TensorFlow takes the worker back, before it
hands it a closure. Meanwhile the other workers take the closures. At a
coordinator start the workers are warmed a quarter at a time (at least one),
so that training never waits for all of them at once. (Measured and dropped: calling the
function on each worker's device from a background thread, beside the
running closures. It was faster on a real cluster, but two instantiations
at once on one worker, from two threads of the coordinator, hung an
in-process cluster; TF's own design keeps one call at a time per worker.)
"""

import threading
import time
from typing import Any, Callable, Sequence

from absl import logging
import tensorflow as tf

from tfps.base import errors
from tfps.base import messages
from tfps.base import task_names
from tfps.cluster import processes

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


# At a coordinator start, at most this share of the workers warm at once
# (at least one): the rest train meanwhile, and many workers take a few
# rounds, not one per worker.
_WARMING_SHARE = 4


def warm_workers(coordinator, calls: Sequence[Call], *,
                 wait_each: float | None) -> tuple[list[Any], dict[str, str]]:
  """Runs `calls` on each worker's own thread, again on each worker TF takes back.

  `wait_each` seconds (None: all at once, without waiting): warm the workers
  a group at a time (a quarter of them, at least one), each group before
  the next, so that the others go on training meanwhile; a worker that is
  down or slower than that is left cold (its first closure instantiates the
  functions). Returns (the per-worker values, which the caller must keep:
  TF holds resources weakly and forgets one whose values are gone;
  {device: why} for the workers not warmed).
  """
  kept, not_warmed = [], {}
  # Private, but the one way to run something on a worker's thread before
  # its closures, again whenever TF takes it back (per-worker datasets use it).
  workers = list(coordinator._cluster.workers)  # pylint: disable=protected-access
  size = len(workers) if wait_each is None else max(1, len(workers) // _WARMING_SHARE)
  for first in range(0, len(workers), size):
    group = workers[first:first + size]
    if wait_each is not None:
      # Not while another worker is lost: the ones warming could leave none
      # to train (measured: a 4.3 s loop). Warmed anyway after the bound.
      _wait_for_the_others(workers, group, timeout=wait_each)
    started = []
    for worker in group:
      done, failed = threading.Event(), []
      kept.append(worker.create_resource(_warm_up_fn(calls, worker.device_name, done, failed)))
      started.append((worker, done, failed))
    if wait_each is None:
      continue
    deadline = time.monotonic() + wait_each
    for worker, done, failed in started:
      if not done.wait(max(0.0, deadline - time.monotonic())):
        not_warmed[worker.device_name] = f"no answer within {wait_each:g}s"
      elif failed:
        not_warmed[worker.device_name] = failed[-1]
  return kept, not_warmed


def _wait_for_the_others(workers: Sequence[Any], group: Sequence[Any], *,
                         timeout: float) -> None:
  def others_up() -> bool:  # TF's own mark of a worker it lost and has not taken back.
    return not any(getattr(w, "_is_dead_with_error", None) for w in workers if w not in group)
  names = ", ".join(task_names.task_or_device(w.device_name) for w in group)
  try:
    processes.wait_until(others_up, timeout=timeout,
                         what=f"the other workers, before warming {names}")
  except TimeoutError as e:
    logging.info("%s; warming anyway", e)


def _warm_up_fn(calls: Sequence[Call], device: str, done: threading.Event,
                failed: list[str]) -> Callable[[], None]:
  def warm_up():  # On the worker's thread, inside its device scope.
    start = time.perf_counter()
    try:
      for function, args in calls:
        function(*args)
    except Exception as e:  # TF's worker thread handles it (a lost worker is retried).
      failed.append(f"{type(e).__name__}: {messages.one_line(e)}")
      raise
    finally:
      done.set()
    logging.info("%s: train closures instantiated in %.1fs, before it runs them",
                 task_names.task_or_device(device), time.perf_counter() - start)
  return warm_up


def log_not_warmed(not_warmed: dict[str, str], what: str) -> None:
  for device, why in sorted(not_warmed.items()):
    logging.warning("%s not instantiated on %s in advance (%s); its first closure there "
                    "instantiates it", what, task_names.task_or_device(device), why)
