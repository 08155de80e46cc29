"""Runs an ordinary Orbit `StandardTrainer` on parameter servers.

`PSTrainer` wraps a trainer written for one machine and changes one thing:
the train loop. Orbit's loop of `num_steps` calls to `train_step` becomes
several remote closures of at most `steps_per_closure` steps each (a
`tf.while_loop` inside one `tf.function`), all queued at once so that every
worker is busy, followed by one `join()`. `train_loop_begin`, `train_step`
and `train_loop_end` are the wrapped trainer's own, unchanged.

Each closure is one of three functions (`coordinator.closures`): the
closure of `steps_per_closure` steps with its steps written out (no loop
with the defaults: the cheapest per step, the dearest to trace), a
fast-start closure of the same size with a few steps per loop iteration,
and a looped one for every other size. The steps and their order are those
of a one-step loop in each; only their cost differs.

    trainer = PSTrainer(MyTrainer(...), runtime, LoopOptions(steps_per_closure=50))

(the chief does this for every `StandardTrainer` an experiment returns, so
an experiment never needs to.)

Fast start and warm workers (`closures.WarmClosures`, positioned input
only): unless the run's recent coordinators lived long, a coordinator trains
with the fast-start closure for a while before it writes out
(`closure_plan`); a worker TensorFlow takes back has the closures in use
instantiated before it is handed one.

Step logs: a `train_step` may return its step's logs, a dict of scalars
such as `{"loss": loss}`. They are summed inside the closure (no per-step
write to a ps, see `coordinator.step_logs`) and their mean over the loop is
added to `train_loop_end`'s outputs. A trainer that keeps its own metrics
instead works unchanged; it pays their per-step writes to the ps.

Step counting and retries (at-least-once):
  `ClusterCoordinator` runs each closure *at least once*: when a worker dies
  mid-closure, the steps it already ran stay applied on the ps and the whole
  closure runs again elsewhere, with the same arguments (so, with positioned
  input, the same chunk of data). The global step is a variable on a ps that
  `train_step` increments once per step, so after a retry it has moved by
  more than the loop's steps. After `join()`, when no closure runs, the
  trainer sets it back by that excess (`reexecuted_steps` counts it): the
  global step counts each scheduled step once, equals the batches the input
  ledger handed out, and Orbit's `Controller`, which asks for
  `target - global_step` more steps after every loop, ends exactly at
  `train_steps`. Checkpoints are numbered with the step they contain, and a
  resumed run starts from exactly that step and input position. Metrics a
  trainer accumulates on the ps (e.g. a mean loss) include the failed
  attempt's steps; step logs do not (a closure's result is its successful
  attempt's).
"""

import collections
import contextlib
import dataclasses
import math
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from absl import logging
import orbit
import tensorflow as tf

from tfps.recovery import closure_plan
from tfps.base import tf_internals
from tfps.cluster import readiness
from tfps.cluster import spec as spec_lib
from tfps.coordinator import closure_fence
from tfps.coordinator import closures as closures_lib
from tfps.coordinator import reader_affinity
from tfps.coordinator import speculation as speculation_lib
from tfps.input import datasets
from tfps.fast_restart import failover_graphs as failover_graphs_lib
from tfps.input import ledger as ledger_lib
from tfps.input import positioned as positioned_lib
from tfps.coordinator import step_logs
from tfps.coordinator import strategy as strategy_lib
from tfps.fast_restart import trace_cache as trace_cache_lib
from tfps.fast_restart import warm_up
from tfps.base import errors


# As many as the default steps per closure: a closure of up to 50 steps has
# no while loop at all, which costs less CPU per step than any loop
# (docs/benchmarks.md). The price is tracing: the first closure takes longer
# to build, on every coordinator start.
DEFAULT_UNROLL = 50
# Steps per closure of a calibration's last wave (`PSTrainer._calibrate`).
_CALIBRATION_STEPS = 4
# After a worker did not answer (`_workers_all_answer`), the loops of the next
# seconds take it as silent still, rather than each wait for a probe (up to
# speculation.PROBE_SECONDS) while it is paused.
_SILENT_RECHECK_SECONDS = 2.0
_now = time.monotonic  # That recheck's clock (a test moves it).


def builds_failover_graphs(cluster, trace_cache: Any, failover_graphs: bool) -> bool:
  """Whether a `PSTrainer` on `cluster` has its workers build failover graphs ahead:
  asked for (`failover_graphs`), traces kept (`trace_cache`: a flag or the cache, None
  when off), and exactly 2 ps."""
  return bool(trace_cache) and failover_graphs and (
      failover_graphs_lib.failover_view(cluster) is not None)


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


@dataclasses.dataclass
class _Loop:
  """One train loop as it is scheduled."""

  start_step: int | None  # The global step before it (None: no step counter).
  steps: int  # What Orbit asked for.
  written_out: bool = False  # Its full-size closures are the written-out ones, else fast-start.
  left: int = -1  # Steps not scheduled yet.
  scheduled: list = dataclasses.field(default_factory=list)  # (size, remote value).
  chunks: list = dataclasses.field(default_factory=list)  # Positioned input's.
  cut_short: bool = False  # An interrupt is pending: no more closures.
  warming: bool = False  # A worker built failover graphs in it, holding its closures.

  def __post_init__(self):
    if self.left < 0:
      self.left = self.steps


# The loops after which a coordinator says how its closures read their input.
_SAY_READS_AT = frozenset({10, 100, 1000, 10000})


@dataclasses.dataclass(frozen=True)
class LoopInput:
  """What one train loop read: its chunks (positioned input) and re-executed steps.

  `looped`: its full-size closures were the fast-start ones (`closure_plan`):
  a slower loop than the run's fault-free speed (`chaos.goodput`).
  `warming`: a worker also built failover graphs in it: its time is not
  its steps' (`closure_plan.recent_step_seconds`). `closures`: (worker, closures
  it ran to success) since the loop before (a closure whose worker thread
  ends just after the join may count in the next loop).
  """

  chunks: tuple[ledger_lib.Chunk, ...] = ()
  reexecuted: int = 0
  looped: bool = False
  warming: bool = False
  closures: tuple[tuple[str, int], ...] = ()


def _positive_int(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise errors.UsageError(f"{name} ({value!r}) must be a positive integer")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopOptions:
  """How a `PSTrainer` makes and schedules its closures (the chief fills it from its
  configuration, `coordinator.run`).

  Attributes:
    steps_per_closure: at most this many steps in one closure.
    max_closure_seconds: closures hold fewer steps where a step is slower than
      that allows (`recovery.closure_plan`; 0: no bound).
    step_seconds: a worker's seconds per step, known before the first loop
      (the run's recent loops); None: measured at the first loop.
    unroll: steps per while-loop iteration inside a closure (module docstring).
    input_shards: shards of a finite input (default: about one closure each).
    loop_slack: with positioned input and `target` set, a loop whose planned
      closures are scheduled ends up to this many steps short rather than
      schedule another closure for a shard's tail (`coordinator.loop_ends`;
      the Controller then asks for them in the next loop); never the loop
      that reaches `target`. 0: every loop trains exactly its steps.
    looped_seconds: with positioned input, train with the fast-start closure
      this long before writing out the full-size closures
      (`recovery.closure_plan`; 0: written out from the first loop).
    looped_seconds_stored: replaces `looped_seconds` when the written-out
      closures are found in `trace_cache` (a write-out that traces nothing).
    looped_seconds_cold: replaces it when they are found there but the workers
      have not optimized them for this cluster (a failover coordinator's,
      not built ahead: `_write_out_cold`).
    trace_cache: with positioned input, where the closures' traces are stored
      for later coordinators and found from earlier ones
      (`fast_restart.trace_cache`).
    failover_graphs: with `trace_cache` on 2 ps, have the workers optimize the
      written-out closure of the cluster a ps failover would leave, after the
      first loop with this one (`fast_restart.failover_graphs`).
    rerun_slow_closures: run a closure that a slow or paused worker holds
      again on another worker (`coordinator.speculation`; positioned closures
      are fenced, `coordinator.closure_fence`).
  """

  steps_per_closure: int
  max_closure_seconds: float = 0.0
  step_seconds: float | None = None
  unroll: int = DEFAULT_UNROLL
  input_shards: int | None = None
  loop_slack: int = 0
  looped_seconds: float = 0.0
  looped_seconds_stored: float | None = None
  looped_seconds_cold: float | None = None
  trace_cache: trace_cache_lib.TraceCache | None = None
  failover_graphs: bool = False
  rerun_slow_closures: bool = False

  def __post_init__(self):
    _positive_int("steps_per_closure", self.steps_per_closure)
    _positive_int("unroll", self.unroll)
    if isinstance(self.loop_slack, bool) or not isinstance(self.loop_slack, int) \
        or self.loop_slack < 0:
      raise errors.UsageError(f"loop_slack ({self.loop_slack!r}) must be a non-negative integer")
    if not 0 <= self.max_closure_seconds < float("inf"):
      raise errors.UsageError(
          f"max_closure_seconds ({self.max_closure_seconds!r}) must be >= 0 seconds")


class PSTrainer(orbit.StandardTrainer):
  """A single-machine `orbit.StandardTrainer` run as closures on all workers.

  The wrapped trainer's `train_dataset` (a `dataset_fn(input_context)` or a
  `tf.data.Dataset`, see `input.datasets`) should be finite: one epoch.
  Its position is then the coordinator's (`input.ledger`): each closure
  is given the chunk of the data it reads, and the position is checkpointed
  with the model (`input_state`), epoch after epoch. An endless dataset
  (`repeat()`) is created on every worker instead, each reading its own part
  from the start whenever its iterator is created (no position is kept).
  `train_step` runs on the workers, inside `strategy.scope()`, and must
  increment the global step once per step (see the module docstring for retries).
  """

  def __init__(self, trainer: orbit.StandardTrainer, runtime: strategy_lib.PSRuntime,
               options: "LoopOptions", *, pause: Callable[[], bool] | None = None,
               global_step: tf.Variable | None = None,
               saved_ledger: ledger_lib.InputLedger | None = None):
    """`options`: how the loops are made (`LoopOptions`). `pause()` true: schedule
    no more closures this loop (an interrupt is pending). `global_step`: the step
    counter `train_step` increments (default: the wrapped trainer's `global_step`
    attribute, if any); after every loop it is set back by the steps that
    TensorFlow re-executed when it retried a failed closure, so it counts each
    scheduled step once. `saved_ledger`: the input ledger of the checkpoint this
    trainer is to restore (a restart), read ahead: its shards shape the first
    closures, and its length stands for a count of the input.
    """
    if not isinstance(trainer, orbit.StandardTrainer):
      raise errors.UsageError(
          f"PSTrainer wraps an orbit.StandardTrainer, got {type(trainer).__name__}")
    steps_per_closure, unroll = options.steps_per_closure, options.unroll
    self._trainer = trainer
    self._unroll = unroll
    self._runtime = runtime
    self._steps_per_closure = steps_per_closure
    self._pause = pause or (lambda: False)
    self._global_step = global_step if global_step is not None else getattr(
        trainer, "global_step", None)
    self._input_shards = options.input_shards
    self._looped_seconds = options.looped_seconds
    self._trace_cache = options.trace_cache
    self._looped_seconds_stored = options.looped_seconds_stored
    self._looped_seconds_cold = options.looped_seconds_cold
    self._failover_graphs = options.failover_graphs
    self._rerun_slow_closures = options.rerun_slow_closures
    self._fence: closure_fence.ClosureFence | None = None  # Positioned, rerunning closures.
    self.speculation: speculation_lib.Speculation | None = None  # Started at the first loop.
    # Positioned input: closures run where their worker's reader stands (first loop on).
    self.affinity: reader_affinity.ReaderAffinity | None = None
    self._attempts: tf_internals.ClosureAttempts | None = None  # From the first loop.
    # Closures each worker ran to success since the last loop end ("worker:1": 7).
    self._closures_done: collections.Counter[str] = collections.Counter()
    self._closures_lock = threading.Lock()
    self._max_closure_seconds = options.max_closure_seconds
    self.step_seconds = options.step_seconds  # A worker's, measured by each loop.
    self.closure_overhead = 0.0  # A closure's own seconds (dispatch, iterator): calibrated.
    self._full_size: int | None = None  # Steps of a full-size closure: chosen at the first loop.
    self._last_kind: bool | None = None  # The closure kind of the last loop.
    self._closures: closures_lib.TrainClosures | None = None  # Made with the loop.
    self._failover: failover_graphs_lib.FailoverGraphs | None = None  # Made with the loop.
    self._written_out_loops = 0
    self._said_silent = False  # A silent worker held back new closures (said once).
    self._probe_again_at = 0.0  # After a worker was silent, when to probe them again.
    self._counted_step: int | None = None  # The global step the last loop left.
    self._fast_loops = 0  # Loops with the fast-start closure (positioned input).
    self._loop_slack = options.loop_slack
    self.full_closure_ready = threading.Event()  # Full-size closures are written out.
    self._warm: closures_lib.WarmClosures | None = None  # Positioned input, once looping.
    self._warmed_ahead = None  # `build_ahead`'s per-worker resources, kept (TF holds them weakly).
    self.closures_scheduled = 0
    self.reexecuted_steps = 0
    # Run after a loop's closures are scheduled if they were traced (or first):
    # the checkpoint's write is made ready there (`_tell_traced`).
    self.on_traced: list[Callable[[], None]] = []
    self._traced_told: int | None = None
    # The step training ends at (None: not known); set once known, after the restore.
    self.target: int | None = None
    self.last_loop = LoopInput()
    self._loop_logs = {}
    self.input_state = positioned_lib.LedgerState()
    what = f"{type(trainer).__name__}.train_dataset"
    self._positioned = _positioned_input(trainer.train_dataset, runtime, what,
                                         saved_ledger.batches_per_epoch if saved_ledger else None)
    if self._positioned is not None:
      self.input_state.ledger = saved_ledger  # The restore reads it again, as saved.
    if self._positioned is None:
      per_worker = tf.nest.map_structure(
          lambda d: datasets.per_worker_dataset(
              runtime.coordinator, d, num_workers=runtime.num_workers,
              num_replicas_in_sync=runtime.strategy.num_replicas_in_sync, what=what),
          trainer.train_dataset)
    else:
      per_worker = ()  # Each closure builds the chunk it reads.
    super().__init__(train_dataset=per_worker,
                     options=orbit.StandardTrainerOptions(use_tf_while_loop=True))

  @property
  def trainer(self) -> orbit.StandardTrainer:
    """The wrapped single-machine trainer."""
    return self._trainer

  @property
  def closures_traced(self) -> int:
    """How many times this trainer's train closures were traced (Python run) so far."""
    return 0 if self._closures is None else self._closures.traced()

  def workers_silent(self) -> bool:
    """Whether a worker still holds a closure that was run again elsewhere, or does
    not answer a probe now (paused, or far slower than the others)."""
    if self._attempts is not None and self._attempts.held_workers():
      return True
    return bool(self._silent_workers())

  @property
  def positioned(self) -> bool:
    """True when the input's position is the coordinator's (a finite dataset)."""
    return self._positioned is not None

  @property
  def times_a_step_first(self) -> bool:
    """True when the first loop times closures before it chooses their size: endless
    input whose step time is not known (positioned input starts with the fast-start
    closure instead)."""
    return (self.step_seconds is None and self._max_closure_seconds > 0
            and self._positioned is None)

  @property
  def ledger(self) -> ledger_lib.InputLedger | None:
    """The input ledger (measured or restored), None for endless input."""
    return self.ensure_ledger() if self._positioned is not None else None

  @property
  def workers_kept_warm(self) -> bool:
    """True once TF re-instantiates the closures on a worker it takes back (`warm_up`)."""
    return self._warm is not None and self._warm.workers_kept_warm

  def ensure_ledger(self) -> ledger_lib.InputLedger:
    """The ledger restored from a checkpoint, else the input measured now (once)."""
    if self.input_state.ledger is None:
      self.input_state.ledger = self._positioned.measure(
          num_shards=self._input_shards, steps_per_closure=self._steps_per_closure,
          num_workers=self._runtime.num_workers)
    elif self._input_shards not in (None, self.input_state.ledger.num_shards):
      logging.warning("input_shards (%d) differs from the checkpoint's %d shards; keeping "
                      "the checkpoint's (the input's position is counted in them)",
                      self._input_shards, self.input_state.ledger.num_shards)
      self._input_shards = None
    return self.input_state.ledger

  def build_ahead(self, timeout: float) -> int:
    """What the first loop would build, built before training (a standby chief's
    coordinator, `coordinator.run.prepare_ahead`): the train closures, and every
    worker has instantiated them (`warm_ahead`), with (positioned input) the
    closure for other sizes, a shard's tail maybe in the first loop.

    Returns the workers that instantiated the closures within `timeout` seconds.
    """
    wanted = 1 if self._positioned is None else 2  # Calls each worker runs.
    calls, lock, all_done = collections.Counter(), threading.Lock(), threading.Event()
    warm = lambda: sum(1 for n in calls.values() if n >= wanted)

    def done(index: int) -> None:
      with lock:
        calls[index] += 1
        if warm() == self._runtime.num_workers:
          all_done.set()

    if not self.warm_ahead(done, other_sizes=True):
      return 0
    if not all_done.wait(timeout):
      logging.warning("built ahead: %d of %d workers instantiated the train closures within "
                      "%.0fs; the others will when they first run one",
                      warm(), self._runtime.num_workers, timeout)
    return warm()

  def warm_ahead(self, done: Callable[[int], None] = lambda index: None, *,
                 other_sizes: bool = False) -> bool:
    """The first loop's train closures built now, and handed to every worker to
    instantiate on its own thread, not waited for: a restarted coordinator's
    workers do it while it builds its evaluator and restores (`coordinator.run`),
    a standby's before it is needed. Nothing runs: no input is read, no variable changes
    (`warm_up.train_or_skip`). Endless input has its per-worker iterators made
    (each reads from its part's start whenever made) and its closure (one for
    every size) traced for them. `done(index)` after each call a worker ran;
    `other_sizes`: the closure for other sizes too (positioned input).

    Returns False where nothing was handed out (no full-size closures).
    """
    if self._train_loop_fn is None:
      self._train_loop_fn = self.create_train_loop_fn()
    endless = self._positioned is None
    if endless and self._train_iter is None:
      self._train_iter = tf.nest.map_structure(iter, self.train_dataset)
    workers = range(self._runtime.num_workers)
    with self._runtime.strategy.scope():
      if endless:  # Its size is chosen at the first loop (maybe measuring a step).
        with _step_log_errors():
          self._warmed_ahead = warm_up.warm_once(
              self._runtime.coordinator, [self._closures.any_size_warm_call((self._train_iter,))],
              workers, done, "train closures")
        return True
      self._choose_full_size(None, _Loop(start_step=None, steps=0))
      if self._warm is None:
        return False
      with _step_log_errors():
        self._warm.before_loop(written_out=self.full_closure_ready.is_set(), done=done)
        if other_sizes:
          self._warmed_ahead = warm_up.warm_once(
              self._runtime.coordinator, [self._closures.other_warm_call()], workers, done,
              "closures of other sizes")
    return True

  def start_training(self) -> None:
    """Training starts now (after a restore, or a `build_ahead`): its loops' clocks start
    here, and a restored step ahead of the restored input's position is set back."""
    if self._warm is not None:
      self._warm.restart_clock()
    self._align_step_with_input()

  def _align_step_with_input(self) -> None:
    """Sets the global step back to the input's position (`ledger.taken`) where it is ahead.

    They are equal whenever no closure runs, but for one case: a run taken elsewhere
    (`speculation`) that woke after its loop was counted and before the save trained
    up to `closure_fence.CHECK_EVERY` steps that the saved step holds and the saved
    ledger does not. Nothing runs yet here, so the difference is exactly those steps:
    re-executed, as the next loop's count would have called them.
    """
    ledger = self.input_state.ledger
    step = self._read_step()
    if ledger is None or step is None or step <= ledger.taken:
      return
    extra = step - ledger.taken
    self._counted_step = ledger.taken
    self._set_back(extra)
    logging.info("the restored global step (%d) was %d ahead of the restored input's position: "
                 "steps a woken closure trained before the save, counted as re-executed",
                 step, extra)

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
    if self._positioned is None:
      make_iterator = lambda iterator: iterator
    else:
      ledger = self.ensure_ledger()
      num_shards, lengths = ledger.num_shards, ledger.lengths
      positioned, runtime = self._positioned, self._runtime
      # Built on the worker, inside the closure: the chunk's position is in
      # the closure's arguments, which a retry runs again unchanged (the
      # worker's open reader is resumed only where it stands at that position:
      # `input.reader`). Its shard argument also codes the epoch and attempt
      # (`closure_fence.shard_code`).
      make_iterator = lambda code, start: positioned.read(
          lengths, tf.math.floormod(code, num_shards), start, lanes=runtime.num_workers)
      if self._rerun_slow_closures and self._runtime.num_workers > 1:
        self._fence = closure_fence.ClosureFence(self._runtime.strategy,
                                                 beside=self._global_step)
    any_size_cache = variables_root = None
    if self._positioned is None and self._trace_cache is not None:
      # Endless input's closure (every size, over the per-worker iterators) is stored too.
      any_size_cache, variables_root = self._endless_trace_cache(), self._variables_root()
    # Their full size is chosen at the first loop, once a step's time is known.
    self._closures = closures_lib.TrainClosures(
        self._trainer.train_step, make_iterator, unroll=self._unroll,
        what=type(self._trainer).__name__, fence=self._fence, any_size_cache=any_size_cache,
        variables_root=variables_root)
    return self._loop

  def _variables_root(self) -> tf.train.Checkpoint:
    """What the stored traces' captures are found in (`trace_cache`)."""
    tracked = {"trainer": self._trainer}
    if self._global_step is not None:
      tracked["global_step"] = self._global_step
    if self._fence is not None:
      tracked["closure_fence"] = self._fence.variable
    return tf.train.Checkpoint(**tracked)

  def _choose_full_size(self, iterator, loop: "_Loop") -> None:
    """The first loop's start: a step's time (measured if not known), then the closures.

    Full-size closures hold as many steps as run in `max_closure_seconds`, up
    to `steps_per_closure`; their traces are kept (positioned input), the
    failover graphs and the warm workers are made for them.
    """
    if self.times_a_step_first:
      # Positioned input starts with the fast-start closure, a few steps of the
      # trainer traced, and measures its loops; calibrating would trace and
      # instantiate the looped closure too, seconds of every run's first start.
      self._calibrate(iterator, loop)
    full_size = self._full_size = self._closure_steps(self._steps_per_closure)
    if self._positioned is not None and self._trace_cache is not None:
      full_size = self._full_size = self._stored_full_size(full_size)
    if self._positioned is None:
      # Every closure is the looped one, one step per loop iteration: its trace
      # is a step's, stored for the per-worker iterators (`_endless_trace_cache`).
      # No fast start and no write-out: a closure takes a per-worker iterator,
      # whose structure no written-out trace could be checked against ahead.
      self.full_closure_ready.set()
      return
    cache = variables_root = None
    if self._positioned is not None and self._trace_cache is not None:
      cache = self._trace_cache_for(self.ensure_ledger().num_shards, full_size)
      variables_root = self._variables_root()
    closures = self._closures
    closures.choose_full_size(full_size, cache=cache, variables_root=variables_root)
    if builds_failover_graphs(self._runtime.cluster, cache, self._failover_graphs):
      self._failover = failover_graphs_lib.FailoverGraphs(
          warm_call=closures.failover_warm_calls, cache=cache, variables_root=variables_root,
          cluster=self._runtime.cluster, coordinator=self._runtime.coordinator)
    looped_seconds, costs = self._looped_seconds, closure_plan.MEASURED
    if self._failover is not None:  # The workers build its failover graph after it.
      costs = closure_plan.MEASURED_WITH_FAILOVER_GRAPH
    if self._looped_seconds_stored is not None and closures.write_out_stored():
      looped_seconds, costs = self._looped_seconds_stored, closure_plan.STORED
      if self._looped_seconds_cold is not None and self._write_out_cold(cache, variables_root):
        looped_seconds, costs = self._looped_seconds_cold, closure_plan.COLD
    self._warm = closures_lib.WarmClosures(
        closures, self._runtime.strategy, self._runtime.coordinator,
        ready=self.full_closure_ready,
        looped_seconds=looped_seconds if closures.has_fast_start else 0.0, costs=costs)

  def _write_out_cold(self, cache: trace_cache_lib.TraceCache, variables_root) -> bool:
    """Whether the stored written-out closure is a graph this cluster's workers have
    not optimized: stored on another number of ps only (this is a failover
    coordinator), and not built ahead on every worker (`failover_graphs`).

    Its first loop would wait seconds for each worker's optimization, where a
    fast-start one whose graph the workers hold trains at once."""
    if cache.stored_on_this_layout(closures_lib.Kind.FULL, variables_root):
      return False
    held = failover_graphs_lib.held(cache, closures_lib.Kind.FULL, variables_root,
                                    self._runtime.cluster)
    if not held:
      logging.info("the stored written-out closure is new to the workers of this cluster "
                   "(not built ahead): the first loops run the fast-start one")
    return not held

  def _stored_full_size(self, chosen: int) -> int:
    """`chosen`, or a larger size a coordinator stored the trace of, if it fits
    (`closure_plan.keep_stored_size`): a restart then rebuilds instead of tracing."""
    num_shards = self.ensure_ledger().num_shards
    # Stored on any number of ps: a coordinator restarted on the ps left after a
    # failover rebuilds the trace its predecessor stored on all of them.
    stored = [size for size in {self._steps_per_closure, *closure_plan.SIZES}
              if chosen < size <= self._steps_per_closure
              and any(self._trace_cache_for(num_shards, size).stored(kind)
                      for kind in (closures_lib.Kind.FAST, closures_lib.Kind.FULL))]
    kept = closure_plan.keep_stored_size(chosen, stored, self.step_seconds,
                                         self._max_closure_seconds, self._steps_per_closure,
                                         self.closure_overhead)
    if kept != chosen:
      logging.info("full-size closures of %d steps, not %d: their trace is stored "
                   "(closure_plan.keep_stored_size)", kept, chosen)
    return kept

  def _trace_cache_for(self, num_shards: int, full_size: int) -> trace_cache_lib.TraceCache:
    """The trace cache under the key of everything that shapes these closures.

    Not the number of workers: each runs the same function, so a coordinator
    restarted for a worker that joined or left rebuilds the trace; the name a
    worker keeps its optimized graph under holds the cluster's shape
    (`worker_functions`)."""
    trainer_type = type(self._trainer)
    return self._trace_cache.in_cluster(self._runtime.cluster.as_dict()).extended(
        trainer=f"{trainer_type.__module__}.{trainer_type.__qualname__}",
        steps_per_closure=full_size, unroll=self._unroll,
        fast_unroll=closures_lib.FAST_UNROLL, input_shards=num_shards,
        num_ps=self._runtime.num_ps)

  def _endless_trace_cache(self) -> trace_cache_lib.TraceCache:
    """Where endless input's closure is stored: its key is the positioned closures'
    but for what only they have (sizes, shards); the iterators' structure is added
    by the closures (`TrainClosures(any_size_cache=)`)."""
    trainer_type = type(self._trainer)
    return self._trace_cache.in_cluster(self._runtime.cluster.as_dict()).extended(
        trainer=f"{trainer_type.__module__}.{trainer_type.__qualname__}", input="endless",
        num_ps=self._runtime.num_ps)

  def _loop(self, iterator, num_steps) -> None:
    """One train loop: its closures on every worker, then join (see the module docstring)."""
    # From where the last loop's count left the step, not from a read of it: a
    # run whose closure was taken and run elsewhere (`speculation`) may wake
    # between loops and train until its fence check (`closure_fence.CHECK_EVERY`
    # steps at most); this loop's count then sets those back too.
    start = self._read_step() if self._counted_step is None else self._counted_step
    loop = _Loop(start_step=start, steps=int(num_steps))
    if self._attempts is None:
      self._attempts = tf_internals.track_closures(self._runtime.coordinator, time.monotonic)
      self._attempts.on_done.append(self._count_closure)
      if self._positioned is not None:
        self.affinity = reader_affinity.ReaderAffinity(
            self._attempts, lengths=self.ensure_ledger().lengths,
            full_size=lambda: self._closures.full_size, lanes=lambda: self._runtime.num_workers)
    if self.speculation is None and self._rerun_slow_closures and self._runtime.num_workers > 1:
      self.speculation = speculation_lib.Speculation(
          self._attempts, num_workers=self._runtime.num_workers,
          probe=self._worker_answers, fence=self._fence,
          num_shards=self.ensure_ledger().num_shards if self._fence is not None else None)
    # Traced in scope so that the trainer sees the strategy it was built in.
    with self._runtime.strategy.scope():
      if self._full_size is None:
        self._choose_full_size(iterator, loop)
      # A pending interrupt: this loop schedules nothing (`_schedule`) and makes
      # nothing new, as a new kind's trace and instantiation would hold the save
      # for seconds (~10 s at a write-out).
      stopping = self._pause()
      # One kind per loop. The written-out kind's first trace registers new
      # functions with every worker, which waits for a paused one (holding the
      # GIL: the whole coordinator would stand still), so it waits until all answer.
      loop.written_out = bool(self._last_kind) if stopping else (
          self.full_closure_ready.is_set() and (
              self._written_out_loops > 0 or self._workers_all_answer()))
      if self._warm is not None and not stopping:
        with _step_log_errors():  # Traces the closures of that kind (the warm-ups' calls).
          self._warm.before_loop(written_out=loop.written_out)
      # Its first loop instantiates them.
      fresh = stopping or loop.written_out is not self._last_kind
      self._last_kind = self._last_kind if stopping else loop.written_out
      began, before = time.monotonic(), len(loop.scheduled)
      most = self._closure_steps(self._full_size)
      self._schedule(iterator, loop, plan_closures(loop.left, most, self._runtime.num_workers),
                     slack=True)
      self._tell_traced()
      kind = closures_lib.Kind.FULL if loop.written_out else closures_lib.Kind.FAST
      if self._failover is not None and not loop.cut_short and (
          self._written_out_loops if loop.written_out else self._fast_loops) and (
          self._failover.started(kind) or self._workers_all_answer()):
        # Once per kind, from its second loop: the first (maybe the coordinator's
        # first) is not kept waiting, nor a save. Here, the workers train meanwhile.
        loop.warming = self._failover.start(kind)
      self._runtime.coordinator.join()
      # A worker optimizes it when it next takes work: often in the loop after.
      loop.warming = loop.warming or (
          self._failover is not None and self._failover.ran_since(began))
    # A loop that instantiated its closures, or built failover graphs, says nothing
    # of the steps.
    if not fresh and not loop.warming:
      measured = closure_plan.worker_step_seconds(
          time.monotonic() - began, sum(size for size, _ in loop.scheduled[before:]),
          len(loop.scheduled) - before, self._runtime.num_workers, self.closure_overhead)
      self.step_seconds = measured if measured is not None else self.step_seconds
    self._end_loop(loop)

  def _calibrate(self, iterator, loop: "_Loop") -> None:
    """A worker's seconds per step and a closure's own, measured before the loop's
    other closures.

    Three waves of closures, one per worker, each joined: of one step (it
    instantiates the function on the workers), of one step again, and of
    `_CALIBRATION_STEPS`; the last two are timed (`closure_plan.calibrated`).
    Only a coordinator that knows no speed (the run's first, at its first loop),
    of endless input: its closures are all the looped one, which this makes ready.
    """
    workers, timed = self._runtime.num_workers, []
    for steps in (1, 1, _CALIBRATION_STEPS):
      if loop.left < workers * steps or loop.cut_short:
        return
      began = time.monotonic()
      self._schedule(iterator, loop, [steps] * workers, slack=False)
      self._tell_traced()
      self._runtime.coordinator.join()
      timed.append(time.monotonic() - began)
    self.step_seconds, self.closure_overhead = closure_plan.calibrated(
        timed[1], _CALIBRATION_STEPS, timed[2])
    logging.info("a worker takes ~%.3fs a step and ~%.3fs a closure: closures of up to %d "
                 "steps (at most %.1fs each, --max_closure_seconds)", self.step_seconds,
                 self.closure_overhead, self._closure_steps(self._steps_per_closure),
                 self._max_closure_seconds)

  def _tell_traced(self) -> None:
    """Runs `on_traced` at the first loop and after closures were traced again.

    A trace can make variables: an optimizer makes its slots in the first
    trace of its step, a stored trace's rebuild makes them before it (the first
    loop). The checkpoint's next write would then register a new function at
    the loop's end, where a worker that just paused holds the whole
    coordinator (`tf_internals.prepare_writes`); here its closures run.
    """
    traced = self.closures_traced
    if traced == self._traced_told:
      return
    self._traced_told = traced
    for hook in self.on_traced:
      hook()

  def _closure_steps(self, most: int) -> int:
    return closure_plan.closure_steps(self.step_seconds, self._max_closure_seconds, most,
                                      self.closure_overhead)

  def _schedule(self, iterator, loop: "_Loop", sizes: list[int], *, slack: bool) -> None:
    """Schedules closures of `sizes` steps (positioned: each a chunk of the input).

    A chunk ends at its shard's end: maybe more closures than sizes, unless the
    loop may end short of its steps (`slack` and `loop_slack`). Stops early when
    an interrupt is pending (`pause`).
    """
    coordinator = self._runtime.coordinator
    allowed = 0
    if slack and self.target is not None and loop.start_step is not None and (
        loop.start_step + loop.steps < self.target):
      allowed = self._loop_slack
    taken = 0
    while loop.left > 0 and not loop.cut_short:
      if self._pause():  # Before a chunk is taken: none is left untrained.
        logging.info("loop cut short after %d closures: an interrupt is pending "
                     "(the chief saves next)", len(loop.scheduled))
        loop.cut_short = True  # Finish what runs (join).
        return
      if self._positioned is None:
        if taken >= len(sizes):
          return
        size, source, chunk = sizes[taken], (iterator,), None
      else:
        if taken >= len(sizes) and (not slack or loop.left <= allowed):
          return  # The next loop trains them: no closure for a shard's tail.
        ledger = self.ensure_ledger()
        asked = sizes[0] if sizes else 1
        chunk = ledger.take(min(asked, loop.left), lanes=self._runtime.num_workers,
                            tail=loop.left < asked)
        size = chunk.count
        code = closure_fence.shard_code(chunk.shard, chunk.epoch, ledger.num_shards)
        source = (tf.constant(code, tf.int64), tf.constant(chunk.start, tf.int64))
      taken += 1
      with _step_log_errors():  # Traced at the first schedule.
        remote = self._closures.schedule(coordinator, size, loop.written_out, source)
      if chunk is not None and self.affinity is not None:
        self.affinity.ours(remote)
      if chunk is not None and self.speculation is not None and self._fence is not None:
        self.speculation.fenced(remote)  # It checks its ticket (closure_fence).
      loop.scheduled.append((size, remote))
      loop.left -= size
      if chunk is not None:
        loop.chunks.append(chunk)
      self.closures_scheduled += 1

  def _end_loop(self, loop: "_Loop") -> None:
    """After join: steps counted once, the loop's record, its step logs, warm closures."""
    scheduled_steps = sum(size for size, _ in loop.scheduled)
    self._written_out_loops += loop.written_out
    self._fast_loops += not loop.written_out
    if self.affinity is not None and (self._written_out_loops + self._fast_loops) in _SAY_READS_AT:
      self.affinity.say()
    reexecuted = self._count_each_step_once(loop.start_step, scheduled_steps)
    with self._closures_lock:
      done, self._closures_done = self._closures_done, collections.Counter()
    self.last_loop = LoopInput(chunks=tuple(loop.chunks), reexecuted=reexecuted,
                               looped=not loop.written_out, warming=loop.warming,
                               closures=tuple(sorted(done.items())))
    # After join() every closure has its result; fetching is one small
    # read per closure (a few per loop), not per step.
    self._loop_logs = step_logs.loop_means(
        [(size, remote.fetch()) for size, remote in loop.scheduled])
    if self._warm is not None:
      # The global step counts each scheduled step once (above): no read needed.
      step = None if loop.start_step is None else loop.start_step + scheduled_steps
      self._warm.after_loop(step, None if self.target is None or step is None
                            else max(0, self.target - step), warming=loop.warming)

  def _count_closure(self, attempt: tf_internals.ClosureAttempt, seconds: float) -> None:
    del seconds  # A worker thread's: counted for the loop's record.
    with self._closures_lock:
      self._closures_done[f"worker:{attempt.task_index}"] += 1

  def _workers_all_answer(self) -> bool:
    """Whether every worker answers a probe now (says once which did not): before
    anything that makes new functions mid-run (they are registered with every worker)."""
    if _now() < self._probe_again_at:
      return False  # One did not answer a moment ago: spare each loop a probe's wait.
    silent = self._silent_workers()
    if silent:
      self._probe_again_at = _now() + _SILENT_RECHECK_SECONDS
    if silent and not self._said_silent:
      self._said_silent = True
      logging.warning("%s does not answer: new closures (written out, failover graphs) wait "
                      "for it (registering them would)", ", ".join(map(str, silent)))
    return not silent

  def _silent_workers(self, indices: Sequence[int] | None = None) -> list[spec_lib.TaskId]:
    """The workers (`indices`; default all) that do not answer a probe now."""
    tasks = [spec_lib.TaskId(spec_lib.JobType.WORKER, i)
             for i in (range(self._runtime.num_workers) if indices is None else indices)]
    return sorted(set(tasks) - readiness.reachable(self._runtime.cluster, tasks,
                                                    speculation_lib.PROBE_SECONDS))

  def _worker_answers(self, task_index: int) -> bool:
    return not self._silent_workers([task_index])

  def _read_step(self) -> int | None:
    return None if self._global_step is None else int(self._global_step.numpy())

  def _set_back(self, extra: int) -> None:
    """The global step less `extra` steps that ran twice, counted as re-executed."""
    self._global_step.assign_sub(extra)
    self.reexecuted_steps += extra
    if self.input_state.ledger is not None:
      self.input_state.ledger.reexecuted += extra

  def _count_each_step_once(self, start_step: int | None, scheduled: int) -> int:
    """Sets the global step back by the steps re-executed in retries; returns them.

    A closure that failed on a worker ran some of its steps (their updates
    stay applied) and then ran whole elsewhere: the step counter moved by
    more than the loop's steps. Called after join(): none of the loop's
    closures runs (a first run taken elsewhere may wake later: the next loop,
    which starts from `start_step + scheduled`, counts its steps).
    """
    if start_step is None:
      return 0
    extra = self._read_step() - start_step - scheduled
    self._counted_step = start_step + scheduled
    if extra > 0:
      self._set_back(extra)
      logging.info("%d steps re-executed by retried or woken closures (their partial updates "
                   "stay applied); the global step counts each scheduled step once", extra)
    return max(0, extra)


@contextlib.contextmanager
def _step_log_errors():
  """A trace that failed on bad step logs raises the UsageError that says so."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except  (re-raised unless it is that)
    usage = step_logs.usage_error_in(e)
    if usage is None:
      raise
    raise usage from None


def _positioned_input(dataset: Any, runtime: strategy_lib.PSRuntime, what: str,
                      saved_batches: int | None) -> positioned_lib.PositionedInput | None:
  """The positioned form of a trainer's input; None where per-worker iterators read it."""
  if isinstance(dataset, tf.distribute.DistributedDataset) or not (
      isinstance(dataset, tf.data.Dataset) or callable(dataset)):
    return None  # A DistributedDataset or a structure of datasets: per_worker_dataset.
  positioned = positioned_lib.PositionedInput(
      dataset, num_replicas_in_sync=runtime.strategy.num_replicas_in_sync, what=what,
      saved_batches=saved_batches)
  if positioned.is_endless:
    logging.warning(
        "%s is endless (repeat()?): each worker reads its own part from the start of its "
        "iterator, and the input's position is not kept across failures; give one epoch "
        "(no repeat()) to have every example trained once per epoch", what)
    return None
  return positioned
