"""A `PSTrainer`'s train closures, and how the fastest one is made ready.

`TrainClosures` holds the `tf.function`s a train loop schedules:

* the written-out closure of `steps_per_closure` steps (nearly every
  closure at full speed), traced with its shape fixed: steps written out
  `unroll` at a time, `n % unroll` (or `unroll`) of them first, then a while
  loop whose every iteration runs `unroll` more. With the defaults (50 and
  50) it has no loop at all, the cheapest form per step, and the dearest
  to make ready: training stops while it is traced and instantiated on the
  workers (the step is traced once per graph and copied, `step_copies`);
* the fast-start closure of the same size, built the same way with
  `FAST_UNROLL` steps per loop iteration: ready in a fraction of that time
  and ~9 % slower per step (figures: docs/recovery.md "Fast start");
* every other size (a loop's last closure, or closures shrunk so that each
  worker gets one): one step per loop iteration, traced once for all sizes.

All take `train` first: false runs no step and only instantiates the
function on the worker (a warm-up, `warm_up.train_or_skip`).

With a `trace_cache.TraceCache` (positioned input), each is traced at most
once per run: a closure an earlier coordinator traced is rebuilt from its
stored graph, and one traced here is stored for the next coordinator, then
rebuilt from there too. A rebuilt closure has the name every coordinator of
a cluster of the same shape gives it (`worker_functions`), so each worker
reads back the graph it optimized for the last one instead of optimizing it
again; with 2 ps, the workers build the one a ps failover will run ahead of
need (`failover_graphs`). Endless input's closure for every size, which takes
the per-worker iterators, is kept the same way in an `any_size_cache`, for
the iterators' type specs.

`WarmClosures` says which a loop uses. A coordinator trains with the
fast-start closure for the seconds `closure_plan.plan` gives it, then
writes out from the next loop (at once when that is 0) if the training left
repays it. The write-out is in the foreground: the next loop traces it, and
every worker instantiates it before its first such closure, all at once.
(Tracing it in a background thread beside training was never the better
choice on 2 cores: the trace and a worker-by-worker warm-up took longer and
slowed training more than the stop costs; docs/recovery.md "Fast start".) Warm workers: before the first loop of each kind, a per-worker
resource has every worker instantiate that kind's closures before its
first closure, and has TF do it again on a worker it takes back after a
restart, before it hands that worker a closure: no loop waits for a cold
worker after that. The steps and their order are the same in every
closure; only their cost changes.
"""

import enum
import hashlib
import threading
import time
from typing import Any, Callable

from absl import logging
import tensorflow as tf

from tfps.recovery import closure_plan
from tfps.base import tf_internals
from tfps.coordinator import closure_fence
from tfps.coordinator import step_copies
from tfps.coordinator import step_logs
from tfps.fast_restart import trace_cache as trace_cache_lib
from tfps.fast_restart import warm_up
from tfps.fast_restart import worker_functions
from tfps.input import reader as reader_lib

# tfps's own helpers that a closure's trace calls and that build its graph with no Python
# control flow on tensors: AutoGraph converting them was seconds of a coordinator's first
# trace (docs/recovery.md "Fast start"). The user's code they call back is still converted.
_NOT_CONVERTED = ("tfps.base", "tfps.input", "tfps.coordinator.closure_fence",
                  "tfps.coordinator.step_copies", "tfps.coordinator.step_logs",
                  "tfps.fast_restart.warm_up")
tf_internals.autograph_skips(_NOT_CONVERTED)


class ClosureKind(str, enum.Enum):
  """The train closures a loop schedules (see the module docstring); the values name
  their stored traces."""

  FULL = "full"  # Of the full size, written out.
  FAST = "fast"  # Of the full size, a few steps per loop iteration: the fast start.
  OTHER = "other"  # Any other size: one step per loop iteration.

  def __str__(self) -> str:
    return self.value


Kind = ClosureKind

# A positioned closure's arguments for a warm-up (nothing is read), and their specs.
_SKIP_SPECS = (tf.TensorSpec([], tf.bool), tf.TensorSpec([], tf.int64),
               tf.TensorSpec([], tf.int64))
# Each kind's positioned arguments: the other sizes' take their size second.
_SPECS = {Kind.FULL: _SKIP_SPECS, Kind.FAST: _SKIP_SPECS,
          Kind.OTHER: (_SKIP_SPECS[0], tf.TensorSpec([], tf.int32), *_SKIP_SPECS[1:])}


# Steps per loop iteration of the fast-start closure: the fewest that run
# nearly as fast as the written-out closure while staying quick to trace
# (measured for 1 to 5: docs/recovery.md "Fast start").
FAST_UNROLL = 5


class TrainClosures:
  """The written-out, fast-start and looped closures, over `make_iterator(*source)`.

  The full size may be chosen after the closures for other sizes are in use
  (`choose_full_size`): a trainer that does not know its step time yet
  measures it with one-step closures first.
  """

  def __init__(self, train_step: Callable[[Any], Any], make_iterator: Callable[..., Any], *,
               unroll: int, what: str, full_size: int | None = None,
               fast_unroll: int = FAST_UNROLL,
               cache: trace_cache_lib.TraceCache | None = None, variables_root: Any = None,
               fence: closure_fence.ClosureFence | None = None,
               any_size_cache: trace_cache_lib.TraceCache | None = None):
    """`full_size`: the written-out closure's steps (None: `choose_full_size` later);
    `cache`: where traces are stored and found (positioned arguments only);
    `variables_root` tracks every variable the closures capture (`trace_cache`);
    `fence`: positioned closures check their ticket in it (`closure_fence`);
    `any_size_cache`: where the closure of every size is stored and found for the
    arguments `schedule` gives it while no full size is chosen (endless input: its
    per-worker iterators), with `variables_root`."""
    self._train_step, self._make_iterator = train_step, make_iterator
    self._fence = fence
    self._unroll, self._fast_unroll, self._what = unroll, fast_unroll, what

    def other_closure(train, num_steps, *source):
      def run(iterator):
        checks = closure_fence.Checks(fence, source)
        sums = step_logs.start(checks.step(lambda: train_step(iterator)), what)
        for _ in tf.range(num_steps - 1):
          sums = step_logs.add(sums, checks.step(lambda: train_step(iterator), sums), what)
        return sums
      return warm_up.train_or_skip(train, lambda: _read(make_iterator, source, num_steps, run))

    self._functions = {Kind.OTHER: tf.function(worker_functions.named(other_closure,
                                                                   "other_closure"))}
    self.full_size: int | None = None
    self.has_fast_start = False
    self._train = tf.constant(True)
    self._cache = None
    self._variables_root = variables_root
    self._any_size_cache = any_size_cache
    self._any_size: dict[str, Any] = {}  # Its concrete function, by its arguments' specs.
    self._concrete: dict[str, Any] = {}
    self._stored: set[str] = set()  # Kinds rebuilt from the cache, not traced here.
    self._missing: set[str] = set()  # Kinds the cache has no valid trace of.
    if full_size is not None:
      self.choose_full_size(full_size, cache=cache, variables_root=variables_root)

  def choose_full_size(self, full_size: int, *, cache: trace_cache_lib.TraceCache | None = None,
                       variables_root: Any = None) -> None:
    """Makes the written-out and fast-start closures of `full_size` steps (once), and
    from now on keeps every kind's trace in `cache`."""
    if self.full_size is not None:
      raise RuntimeError(f"the full size is {self.full_size} already")
    self.full_size = full_size
    unroll, what, fence = self._unroll, self._what, self._fence
    train_step, make_iterator = self._train_step, self._make_iterator

    def of_full_size(unroll: int, name: str):
      peeled = full_size % unroll or min(unroll, full_size)
      iterations = (full_size - peeled) // unroll

      def full_closure(train, *source):
        def run(iterator):
          checks = closure_fence.Checks(fence, source)
          # Traced once per graph (the closure's, a loop's body), copied at every step.
          step = step_copies.StepCopies(lambda: train_step(iterator), f"{what}.train_step")
          # The first step's logs (if any) give the structure of the running sums.
          sums = step_logs.start(checks.step(step), what)
          for _ in range(peeled - 1):  # Python: written out.
            sums = step_logs.add(sums, checks.step(step, sums), what)
          if iterations:  # Python: known when traced.
            for _ in tf.range(iterations):  # A tf.while_loop on the worker.
              for _ in range(unroll):
                sums = step_logs.add(sums, checks.step(step, sums), what)
          return sums
        return warm_up.train_or_skip(train, lambda: _read(make_iterator, source, full_size, run))
      # TF's name for the function (in logs too), and a worker's graph cache key.
      full_closure.__name__ = worker_functions.traced(name)
      return full_closure

    # No fast start where the written-out closure is no dearer.
    self.has_fast_start = min(unroll, full_size) > self._fast_unroll
    self._functions[Kind.FULL] = tf.function(of_full_size(unroll, "full_closure"))
    if self.has_fast_start:
      self._functions[Kind.FAST] = tf.function(of_full_size(self._fast_unroll,
                                                             "fast_closure"))
    self._cache = cache
    self._variables_root = variables_root

  def _kind(self, kind: "ClosureKind | str") -> ClosureKind:
    kind = Kind(kind)
    return Kind.FULL if kind == Kind.FAST and not self.has_fast_start else kind

  def _load(self, kind: ClosureKind, stored_here: bool = False) -> bool:
    """Rebuilds `kind` from the cache once, if stored there; whether it now is."""
    if kind not in self._stored and kind not in self._missing and self._cache is not None:
      function = self._cache.load(kind, _SPECS[kind], self._variables_root)
      if function is None:
        self._missing.add(kind)
      else:
        self._concrete[kind] = function
        self._stored.add(kind)
        if not stored_here:
          logging.info("%s closure rebuilt from the trace an earlier coordinator stored", kind)
    return kind in self._stored

  def concrete(self, kind: "ClosureKind | str"):
    """The `ConcreteFunction` of `kind` (full, fast or other), rebuilt or traced once."""
    kind = self._kind(kind)
    if not self._load(kind) and kind not in self._concrete:
      with tf_internals.traced_as_scheduled():
        function = self._functions[kind].get_concrete_function(*_SPECS[kind])
      self._concrete[kind] = function
      if self._cache is not None and self._cache.save(kind, function, self._variables_root):
        self._missing.discard(kind)
        self._load(kind, stored_here=True)  # Under the name the next coordinator gives it.
    return self._concrete[kind]

  def write_out_stored(self) -> bool:
    """Whether an earlier coordinator's traces make the write-out cheap: a look at
    the stored entries, which rebuilds and traces nothing (a rebuild of the
    written-out closure is a fraction of a second a restart would wait for, before
    loops that use the fast-start one)."""
    return self.has_fast_start and self._fits(Kind.FULL) and self._fits(Kind.OTHER)

  def _fits(self, kind: ClosureKind) -> bool:
    """Whether `kind` is rebuilt from the cache, or will be (its stored trace fits)."""
    if kind in self._stored:
      return True
    if kind in self._missing or self._cache is None:
      return False
    if self._cache.fits(kind, self._variables_root):
      return True
    self._missing.add(kind)  # Said once why (`fits`); traced when first asked for.
    return False

  def _scheduled(self, kind: ClosureKind):
    # Without a cache, the tf.function: schedule() traces it for its arguments
    # (an iterator, without positioned input).
    return self.concrete(kind) if self._cache is not None else self._functions[self._kind(kind)]

  def schedule(self, coordinator, size: int, written_out: bool, source: tuple[Any, ...]):
    """Schedules a closure of `size` steps: of full size, written out or fast-start."""
    if self.full_size is None:  # Not chosen yet: kept in the cache for any size only.
      args = (self._train, tf.constant(size, tf.int32), *source)
      return coordinator.schedule(self._any_size_function(args), args=args)
    if size == self.full_size:
      function = self._scheduled(Kind.FULL if written_out else Kind.FAST)
      return coordinator.schedule(function, args=(self._train, *source))
    return coordinator.schedule(self._scheduled(Kind.OTHER),
                                args=(self._train, tf.constant(size, tf.int32), *source))

  def warm_calls(self, written_out: bool = True) -> list[warm_up.Call]:
    """The closures a loop of that kind uses, called to run no step; traces them (in scope).

    Written out: the written-out closure and the one for other sizes; else the fast-start one.
    """
    if not written_out:
      return [(self.concrete(Kind.FAST), _skip())]
    return [(self.concrete(Kind.FULL), _skip()), self.other_warm_call()]

  def trace_other_ahead(self) -> None:
    """Traces the closure for other sizes now, unless a stored trace will rebuild it when
    a shard's tail first needs it (a fraction of a second). A trace takes seconds, and
    mid-loop it would register its functions with every task, waiting for a paused one.
    Each worker instantiates it at its first call, which holds no other worker (handed
    out with the fast-start closure, it made a restart's first loop wait ~0.5 s longer)."""
    if not self._fits(Kind.OTHER):
      self.concrete(Kind.OTHER)

  def traced(self) -> int:
    """Traces made of the closures' functions so far (stored ones rebuilt are not)."""
    return sum(f.experimental_get_tracing_count() for f in self._functions.values())

  def any_size_warm_call(self, source: tuple[Any, ...]) -> warm_up.Call:
    """The closure `schedule` runs while no full size is chosen (endless input's, of
    every size), traced now for `source` as `schedule` passes it (the per-worker
    iterators), called to run no step."""
    one = tf.constant(1, tf.int32)
    function = self._any_size_function((self._train, one, *source))
    if function is self._functions[Kind.OTHER]:
      with tf_internals.traced_as_scheduled():
        function.get_concrete_function(
            *tf_internals.scheduled_specs((self._train, one, *source)))
    return (function, (tf.constant(False), one, *source))

  def _any_size_function(self, args: tuple[Any, ...]):
    """What `schedule` runs for `args` while no full size is chosen: the tf.function
    (traced by the schedule), or with `any_size_cache` its concrete function for these
    arguments' specs, rebuilt from a stored trace when one fits, else traced and stored."""
    if self._any_size_cache is None:
      return self._functions[Kind.OTHER]
    # A tensor argument (the size) by its spec: one closure for every size.
    specs = tf.nest.map_structure(
        lambda x: tf.TensorSpec.from_tensor(x) if isinstance(x, tf.Tensor) else x,
        tf_internals.scheduled_specs(args))
    key = repr(specs)
    if key not in self._any_size:
      cache = self._any_size_cache.extended(
          arguments=hashlib.sha256(key.encode()).hexdigest()[:16])
      function = cache.load(Kind.OTHER, specs, self._variables_root)
      if function is not None:
        logging.info("%s closure rebuilt from the trace an earlier coordinator stored", Kind.OTHER)
      else:
        with tf_internals.traced_as_scheduled():
          function = self._functions[Kind.OTHER].get_concrete_function(*specs)
        if cache.save(Kind.OTHER, function, self._variables_root):
          # Under the name the next coordinator gives it (a worker's graph cache key).
          function = cache.load(Kind.OTHER, specs, self._variables_root) or function
      self._any_size[key] = function
    return self._any_size[key]

  def other_warm_call(self) -> warm_up.Call:
    """The closure for other sizes (a shard's tail), called to run no step; traces it."""
    skip = _skip()
    return (self.concrete(Kind.OTHER), (skip[0], tf.constant(1, tf.int32), *skip[1:]))


  @property
  def cache(self) -> trace_cache_lib.TraceCache | None:
    return self._cache

  def failover_warm_calls(self, cache: trace_cache_lib.TraceCache, variables,
                          kind: "ClosureKind | str" = Kind.FULL, *,
                          with_other: bool = True) -> list[warm_up.Call] | None:
    """The full-size closure of `kind` (written out or fast-start), and (`with_other`)
    the one for other sizes if stored, as a coordinator of `cache`'s key and cluster
    rebuilds them from their stored traces, bound to `variables` (stand-ins:
    `failover_graphs`), called to run no step; None if no stored trace of `kind` fits.
    (A second rebuild of one trace in a process gets another name: ask for each once.)"""
    kind, skip = self._kind(kind), _skip()
    function = cache.load(kind, _SPECS[kind], None, variables=variables)
    if function is None:
      return None
    calls = [(function, skip)]
    if with_other:
      other = cache.load(Kind.OTHER, _SPECS[Kind.OTHER], None, variables=variables)
      if other is not None:
        calls.append((other, (skip[0], tf.constant(1, tf.int32), *skip[1:])))
    return calls


def _read(make_iterator: Callable[..., Any], source: tuple[Any, ...], count: Any,
          run: Callable[[Any], Any]) -> Any:
  """`run(iterator)` over the chunk `make_iterator(*source)` reads (`count` steps), its
  read closed after every op of the steps (`reader.Reading`): outputs that come after it."""
  graph = tf.compat.v1.get_default_graph()
  mark = len(graph.get_operations())
  reading = reader_lib.reading_of(make_iterator(*source))
  sums = run(reading.iterator)
  steps = tf_internals.stateful_ops_since(graph, mark)
  closed = reading.close(count, steps + [t for t in tf.nest.flatten(sums)
                                          if isinstance(t, tf.Tensor)])
  if not closed:
    return sums
  with tf.control_dependencies(closed):
    return tf.nest.map_structure(tf.identity, sums)


def _skip() -> tuple[tf.Tensor, ...]:
  """A positioned closure's arguments for a call that runs no step (`_SKIP_SPECS`)."""
  return tf.constant(False), tf.constant(0, tf.int64), tf.constant(0, tf.int64)


class WarmClosures:
  """Which closure a loop uses, and workers kept warm for it.

  `ready` is set once full-size closures are written out: at once when
  `looped_seconds` is 0, else after the first loop that ends that many
  seconds after this object was made (the coordinator's first loop) and
  finds the training left long enough to repay `costs` (known from the
  second loop on, when there is a target).
  """

  def __init__(self, closures: TrainClosures, strategy, coordinator, *,
               ready: threading.Event, looped_seconds: float,
               costs: closure_plan.SwitchCosts = closure_plan.MEASURED):
    self._closures = closures
    self._costs = costs  # What the write-out costs here (traced or stored).
    self._strategy = strategy
    self._coordinator = coordinator
    self.ready = ready
    self._made = time.monotonic()
    self._looped_until = self._made + looped_seconds
    # The kind of loop the workers are kept warm for (None: not yet), and
    # the per-worker resources doing it, kept: TF forgets one nobody holds.
    self._warm_for: bool | None = None
    self._resources = None
    self._last_loop: tuple[float, int] | None = None  # (time, global step) after it.
    self._timed = (0.0, 0)  # Seconds and steps of the loops since the first, less warming ones.
    self._stays_looped = False
    if looped_seconds <= 0:
      self.ready.set()
    else:
      logging.info("full-size closures %d steps per loop iteration for %.0fs or more, then "
                   "written out if the training left repays it (closure_plan)",
                   FAST_UNROLL, looped_seconds)

  @property
  def workers_kept_warm(self) -> bool:
    """True once workers are kept warm for the written-out closure."""
    return self._warm_for is True

  def before_loop(self, written_out: bool,
                  done: Callable[[int], None] = lambda index: None) -> None:
    """Before the first loop of each kind: every worker instantiates its closures first.

    As a per-worker resource (`warm_up`), which each worker runs on its own
    thread before its first closure of the loop, and again whenever TF takes
    it back; so the loop's join() also waits for the warm-ups of the workers
    that are up, and no call of them is left running after it. The
    resource of the kind before is dropped (TF forgets it). `done(index)`
    each time a worker has run its warm-up.

    A fast-start loop's closure for other sizes is traced then too, once the
    workers have theirs (`TrainClosures.trace_other_ahead`).
    """
    if self._warm_for is not written_out:
      with self._strategy.scope():  # Traced as schedule() would trace them.
        self._resources = warm_up.warm_workers(
            self._coordinator, self._closures.warm_calls(written_out), done)
        if not written_out:
          self._closures.trace_other_ahead()
      self._warm_for = written_out

  def restart_clock(self) -> None:
    """The coordinator starts training now (it was built ahead, `PSTrainer.build_ahead`):
    its looped time counts from here."""
    looped = self._looped_until - self._made
    self._made = time.monotonic()
    self._looped_until = self._made + looped

  def after_loop(self, step: int | None = None, steps_left: int | None = None,
                 warming: bool = False) -> None:
    """After each loop: write out from the next one once the looped time is past,
    unless the training left (`steps_left` after global step `step`, at the
    speed of the loops since the first) is too short to repay it. A `warming`
    loop waited for failover graphs: its time says nothing of the speed (taken
    with it, a loop that waited seconds made a run of a minute look like minutes)."""
    now = time.monotonic()
    if step is not None:
      if self._last_loop is not None and not warming:
        seconds, steps = self._timed
        self._timed = (seconds + now - self._last_loop[0], steps + step - self._last_loop[1])
      self._last_loop = (now, step)
    if self.ready.is_set() or now < self._looped_until:
      return
    seconds_left = None
    if self._last_loop is not None and steps_left is not None:
      seconds, steps = self._timed
      if steps_left == 0:
        seconds_left = 0.0
      elif seconds > 0 and steps > 0:
        seconds_left = steps_left * seconds / steps
      else:
        return  # The speed is not known before a loop that says it: decide after one.
    if not closure_plan.write_out_pays(seconds_left, self._costs):
      if not self._stays_looped:
        logging.info("the training left (~%.0fs) is too short to repay a write-out: the "
                     "full-size closures stay looped", seconds_left)
        self._stays_looped = True
      return
    left = "not known" if seconds_left is None else f"~{seconds_left:.0f}s"
    logging.info("writing out the full-size closures after %.0fs looped (training left: %s; "
                 "the next loop traces them)", now - self._made, left)
    self.ready.set()
