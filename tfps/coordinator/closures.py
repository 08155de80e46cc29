"""A `PSTrainer`'s two train closures, and how the faster one is made ready.

`TrainClosures` holds the two `tf.function`s a train loop schedules:

* the closure of `steps_per_closure` steps (nearly every closure), traced
  with its shape fixed: steps written out `unroll` at a time, `n % unroll`
  (or `unroll`) of them first, then a while loop whose every iteration runs
  `unroll` more. With the defaults (50 and 50) it has no loop at all, the
  cheapest form per step measured (docs/history/2026-11-23-benchmarks.md),
  and the dearest to trace: ~0.25 s per step written out on 2 cores.
* every other size (a loop's last closure, or closures shrunk so that each
  worker gets one): one step per loop iteration, traced once for all sizes,
  in a fraction of that time; also every closure of a looped start (below).

Both take `train` first: false runs no step and only instantiates the
function on the worker (a warm-up, `warm_up.train_or_skip`).

`WarmClosures` says which a loop uses. A coordinator writes its closures
out from its first loop, or trains looped for the seconds
`closure_plan.looped_seconds` gives it (recent coordinators of the run died
too soon to repay the write-out) and writes out from the loop after. The
write-out is in the foreground: the next loop traces it, and every worker
instantiates it on its first such closure, all at once. (Tracing it in a
background thread beside looped training was never the better of the two
at any coordinator lifetime measured on 2 cores: there the trace and a
worker-by-worker warm-up took ~2.5x as long and slowed the looped closure
to ~0.55x; docs/recovery.md "Fast start".) Warm workers: before the first
written-out loop, a per-worker resource has every worker instantiate both
closures before its first closure, and has TF do it again on a worker it
takes back after a restart, before it hands that worker a closure: no loop
waits for a cold worker after that. The steps and their order are
the same either way; only their cost changes.
"""

import threading
import time
from typing import Any, Callable

from absl import logging
import tensorflow as tf

from tfps.coordinator import step_logs
from tfps.coordinator import warm_up

# A positioned closure's arguments for a warm-up (nothing is read), and their specs.
_SKIP_SPECS = (tf.TensorSpec([], tf.bool), tf.TensorSpec([], tf.int64),
               tf.TensorSpec([], tf.int64))


class TrainClosures:
  """The written-out closure and the looped one, over `make_iterator(*source)`."""

  def __init__(self, train_step: Callable[[Any], Any], make_iterator: Callable[..., Any], *,
               full_size: int, unroll: int, what: str):
    self.full_size = full_size
    peeled = full_size % unroll or min(unroll, full_size)
    iterations = (full_size - peeled) // unroll

    def full_closure(train, *source):
      def steps():
        iterator = make_iterator(*source)
        # The first step's logs (if any) give the structure of the running sums.
        sums = step_logs.start(train_step(iterator), what)
        for _ in range(peeled - 1):  # Python: written out.
          sums = step_logs.add(sums, train_step(iterator), what)
        if iterations:  # Python: known when traced.
          for _ in tf.range(iterations):  # A tf.while_loop on the worker.
            for _ in range(unroll):
              sums = step_logs.add(sums, train_step(iterator), what)
        return sums
      return warm_up.train_or_skip(train, steps)

    def other_closure(train, num_steps, *source):
      def steps():
        iterator = make_iterator(*source)
        sums = step_logs.start(train_step(iterator), what)
        for _ in tf.range(num_steps - 1):
          sums = step_logs.add(sums, train_step(iterator), what)
        return sums
      return warm_up.train_or_skip(train, steps)

    self._full = tf.function(full_closure)
    self._other = tf.function(other_closure)
    self._train = tf.constant(True)

  def schedule(self, coordinator, size: int, written_out: bool, source: tuple[Any, ...]):
    """Schedules a closure of `size` steps; the written-out one if asked and of full size."""
    if size == self.full_size and written_out:
      return coordinator.schedule(self._full, args=(self._train, *source))
    return coordinator.schedule(self._other,
                                args=(self._train, tf.constant(size, tf.int32), *source))

  def warm_calls(self) -> list[warm_up.Call]:
    """Both closures (positioned), called to run no step; traces them (call in scope)."""
    skip = (tf.constant(False), tf.constant(0, tf.int64), tf.constant(0, tf.int64))
    return [(self._full.get_concrete_function(*_SKIP_SPECS), skip),
            (self._other.get_concrete_function(_SKIP_SPECS[0], tf.TensorSpec([], tf.int32),
                                               *_SKIP_SPECS[1:]),
             (skip[0], tf.constant(1, tf.int32), *skip[1:]))]


class WarmClosures:
  """Which closure a loop uses, and workers kept warm once it is written out.

  `ready` is set once full-size closures are written out: at once when
  `looped_seconds` is 0, else after the first loop that ends that many
  seconds after this object was made (the coordinator's first loop).
  """

  def __init__(self, closures: TrainClosures, strategy, coordinator, *,
               ready: threading.Event, looped_seconds: float):
    self._closures = closures
    self._strategy = strategy
    self._coordinator = coordinator
    self.ready = ready
    self._looped_until = time.monotonic() + looped_seconds
    self._looped_seconds = looped_seconds
    self._resources = None  # Kept: TF forgets a per-worker resource nobody holds.
    if looped_seconds <= 0:
      self.ready.set()
    else:
      logging.info("full-size closures looped for %.0fs (earlier coordinators of this run "
                   "lived too short to repay writing them out), then written out",
                   looped_seconds)

  @property
  def workers_kept_warm(self) -> bool:
    return self._resources is not None

  def before_loop(self, written_out: bool) -> None:
    """Before the first written-out loop: every worker instantiates both closures first.

    As a per-worker resource (`warm_up`), which each worker runs on its own
    thread before its first closure of the loop, and again whenever TF takes
    it back; so the loop's join() also waits for the warm-ups of the workers
    that are up, and no call of them is left running after it.
    """
    if written_out and self._resources is None:
      with self._strategy.scope():  # Traced as schedule() would trace them.
        self._resources = warm_up.warm_workers(self._coordinator, self._closures.warm_calls())

  def after_loop(self) -> None:
    """After each loop: write out from the next one once this coordinator has looped long enough."""
    if not self.ready.is_set() and time.monotonic() >= self._looped_until:
      logging.info("this coordinator has lived %.0fs: writing out the full-size closures "
                   "(the next loop traces them)", self._looped_seconds)
      self.ready.set()
