"""Runs an ordinary Orbit `StandardTrainer` on parameter servers.

`PSTrainer` wraps a trainer written for one machine and changes one thing:
the train loop. Orbit's loop of `num_steps` calls to `train_step` becomes
several remote closures of at most `steps_per_closure` steps each (a
`tf.while_loop` inside one `tf.function`), all queued at once so that every
worker is busy, followed by one `join()`. `train_loop_begin`, `train_step`
and `train_loop_end` are the wrapped trainer's own, unchanged.

Inside a closure of `steps_per_closure` steps (all of a loop's closures but
perhaps its last), steps are written out `unroll` at a time: `n % unroll`
(or `unroll`) steps one after another, then a while loop whose every
iteration runs `unroll` more. The steps and their order are exactly those
of a one-step loop; what changes is the loop's cost. A loop spanning worker
and ps devices exchanges control messages with every ps it touches in every
iteration, and TensorFlow's executor runs a graph with a loop on a slower
path than one without. With the default `unroll` (50, the default steps per
closure) such a closure has no loop at all (measured: `tfps bench`,
docs/benchmarks.md). Closures of other sizes run one step per loop
iteration, all with one function: two traces per run, whatever the sizes.

    trainer = PSTrainer(MyTrainer(...), runtime, steps_per_closure=50)

(the chief does this for every `StandardTrainer` an experiment returns, so
an experiment never needs to.)

Step logs: a `train_step` may return its step's logs, a dict of scalars
such as `{"loss": loss}`. They are summed inside the closure (no per-step
write to a ps, see `coordinator.step_logs`) and their mean over the loop is
added to `train_loop_end`'s outputs. A trainer that keeps its own metrics
instead works unchanged; it pays their per-step writes to the ps.

Step counting and retries (at-least-once):
  `ClusterCoordinator` runs each closure *at least once*: when a worker dies
  mid-closure, the steps it already ran stay applied on the ps and the whole
  closure runs again elsewhere. The global step is a variable on a ps that
  the trainer's `train_step` increments once per step, so it counts steps
  that actually ran, re-run ones included: after a retry it exceeds the
  scheduled count by the steps the failed attempt completed. It never
  undercounts, it only moves forward, and it is read only after `join()`,
  when no closure of the loop is still running. Orbit's `Controller` re-reads
  it after every loop and asks for `target - global_step` more steps, so the
  run ends at or just past `train_steps`, checkpoints are numbered with the
  step value they contain, and a resumed run starts from exactly that value.
  Metrics a trainer accumulates on the ps (e.g. a mean loss) likewise include
  re-run steps; step logs do not (a closure's result is its successful
  attempt's).
"""

import math
from typing import Any, Callable, Mapping

import orbit
import tensorflow as tf

from tfps.coordinator import datasets
from tfps.coordinator import step_logs
from tfps.coordinator import strategy as strategy_lib
from tfps.recovery import errors


# As many as the default steps per closure: a closure of up to 50 steps has
# no while loop at all. Measured side by side on the ctr benchmark
# (docs/benchmarks.md): 6.2-6.5 ms of CPU per step against 7.0 with a loop
# of 10 steps per iteration, and 7.5 with the earlier loop whose remainder
# ran one step per iteration. The price is tracing: the first closure takes
# ~4 s longer to build (on every coordinator start).
DEFAULT_UNROLL = 50


def plan_closures(num_steps: int, steps_per_closure: int, num_workers: int) -> list[int]:
  """Splits a loop of `num_steps` into closure sizes that keep all workers busy.

  Closures hold at most `steps_per_closure` steps, and are made smaller when
  needed so that there are at least `num_workers` of them (when
  `num_steps >= num_workers`). (Shrinking the closures toward the end of a
  loop, so that workers finish closer together, was measured slower on the
  ctr benchmark: the extra closures cost more than the shorter tail saved.)
  """
  if num_steps <= 0:
    return []
  size = max(1, min(steps_per_closure, math.ceil(num_steps / num_workers)))
  full, rest = divmod(num_steps, size)
  return [size] * full + ([rest] if rest else [])


class PSTrainer(orbit.StandardTrainer):
  """A single-machine `orbit.StandardTrainer` run as closures on all workers.

  The wrapped trainer's `train_dataset` (a `dataset_fn(input_context)` or a
  `tf.data.Dataset`, see `coordinator.datasets`) is created on every worker,
  each reading its own part; it should repeat indefinitely. Its `train_step`
  runs on the workers, inside `strategy.scope()`, and must increment the
  global step once per step (see the module docstring for retries).
  """

  def __init__(self, trainer: orbit.StandardTrainer, runtime: strategy_lib.PSRuntime, *,
               steps_per_closure: int, pause: Callable[[], bool] | None = None,
               unroll: int = DEFAULT_UNROLL):
    """`pause()` true: schedule no more closures this loop (an interrupt is pending).

    `unroll`: steps per while-loop iteration inside a closure (see the module
    docstring).
    """
    if not isinstance(trainer, orbit.StandardTrainer):
      raise errors.UsageError(
          f"PSTrainer wraps an orbit.StandardTrainer, got {type(trainer).__name__}")
    if isinstance(steps_per_closure, bool) or not isinstance(steps_per_closure, int) \
        or steps_per_closure < 1:
      raise errors.UsageError(
          f"steps_per_closure ({steps_per_closure!r}) must be a positive integer")
    if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 1:
      raise errors.UsageError(f"unroll ({unroll!r}) must be a positive integer")
    self._trainer = trainer
    self._unroll = unroll
    self._runtime = runtime
    self._steps_per_closure = steps_per_closure
    self._pause = pause or (lambda: False)
    self.closures_scheduled = 0
    self._loop_logs = {}
    per_worker = tf.nest.map_structure(
        lambda d: datasets.per_worker_dataset(
            runtime.coordinator, d, num_workers=runtime.num_workers,
            num_replicas_in_sync=runtime.strategy.num_replicas_in_sync,
            what=f"{type(trainer).__name__}.train_dataset"),
        trainer.train_dataset)
    super().__init__(train_dataset=per_worker,
                     options=orbit.StandardTrainerOptions(use_tf_while_loop=True))

  @property
  def trainer(self) -> orbit.StandardTrainer:
    """The wrapped single-machine trainer."""
    return self._trainer

  def train_loop_begin(self):
    return self._trainer.train_loop_begin()

  def train_step(self, iterator):
    return self._trainer.train_step(iterator)

  def train_loop_end(self):
    """The wrapped trainer's outputs, plus the loop's mean step logs.

    On a name both have, the wrapped trainer's own output wins.
    """
    output = self._trainer.train_loop_end()
    logs, self._loop_logs = self._loop_logs, {}
    if not logs:
      return output
    if output is None:
      return logs
    if isinstance(output, (dict, Mapping)):  # dict: also TF's tracked dict wrapper.
      return {**logs, **output}
    raise errors.UsageError(
        f"{type(self._trainer).__name__}.train_loop_end returned {type(output).__name__}; "
        f"with step logs it must return a dict or None")

  def create_train_loop_fn(self) -> Callable[[Any, tf.Tensor], None]:
    """The loop Orbit calls: schedule closures over all workers, then join."""
    coordinator = self._runtime.coordinator
    strategy = self._runtime.strategy
    train_step = self._trainer.train_step
    unroll = self._unroll

    what = type(self._trainer).__name__
    full_size = self._steps_per_closure

    # A closure of `steps_per_closure` steps (nearly all of them), traced
    # with its shape fixed: `peeled` steps written out, then a loop of
    # `unroll` steps per iteration (no loop at all with the defaults).
    peeled = full_size % unroll or min(unroll, full_size)
    iterations = (full_size - peeled) // unroll

    @tf.function
    def full_closure(iterator):
      # The first step's logs (if any) give the structure of the running sums.
      sums = step_logs.start(train_step(iterator), what)
      for _ in range(peeled - 1):  # Python: written out.
        sums = step_logs.add(sums, train_step(iterator), what)
      if iterations:  # Python: known when traced.
        for _ in tf.range(iterations):  # A tf.while_loop on the worker.
          for _ in range(unroll):
            sums = step_logs.add(sums, train_step(iterator), what)
      return sums

    # Any other size (a loop's last closure, or closures shrunk so that every
    # worker gets one): one step per loop iteration, traced once for all sizes.
    @tf.function
    def other_closure(iterator, num_steps):
      sums = step_logs.start(train_step(iterator), what)
      for _ in tf.range(num_steps - 1):
        sums = step_logs.add(sums, train_step(iterator), what)
      return sums

    def schedule(iterator, size: int):
      if size == full_size:
        return coordinator.schedule(full_closure, args=(iterator,))
      return coordinator.schedule(other_closure, args=(iterator, tf.constant(size, tf.int32)))

    def loop_fn(iterator, num_steps):
      sizes = plan_closures(int(num_steps), self._steps_per_closure,
                            self._runtime.num_workers)
      scheduled = []
      # Traced in scope so that the trainer sees the strategy it was built in.
      with strategy.scope():
        for size in sizes:
          if self._pause():
            break  # Finish what runs (join below); the chief saves next.
          try:
            remote = schedule(iterator, size)
          except Exception as e:  # Traced at the first schedule: bad step logs.
            usage = step_logs.usage_error_in(e)
            if usage is None:
              raise
            raise usage from None
          scheduled.append((size, remote))
          self.closures_scheduled += 1
      coordinator.join()
      # After join() every closure has its result; fetching is one small
      # read per closure (a few per loop), not per step.
      self._loop_logs = step_logs.loop_means(
          [(size, remote.fetch()) for size, remote in scheduled])

    return loop_fn
