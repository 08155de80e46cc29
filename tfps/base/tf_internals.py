"""The one module that reaches into TensorFlow's private parts.

tfps needs a few things TensorFlow does not publish: to rebuild a traced
function from its stored definition (stored traces), to ask its asynchronous
checkpoint writer whether a write is in flight and to close it, to run code
on a worker's thread before its closures (warm-ups), to tell a sharded
variable apart, to name the objects a trainer tracks by their paths, and to read and rebuild a dataset's ops in a graph
(positioned input's seek). Every other module uses TensorFlow's public API only and
reaches these through the functions here, one per hook. A TensorFlow release
that moves a hook breaks this module alone, and
`tests/base/test_tf_internals.py` names the hook that moved.

Supported: TensorFlow `SUPPORTED` (the release tf-models-official pins, and
the one the suite runs on); `check_version` says so when another is loaded.
"""

import contextlib
import os
import threading
import weakref
from typing import Any, Sequence

import tensorflow as tf

from tensorflow.core.function.polymorphism import function_type as function_type_lib
from tensorflow.python.distribute import sharded_variable as sharded_variable_lib
from tensorflow.python.distribute.coordinator import cluster_coordinator
from tensorflow.python.eager import context as context_lib
from tensorflow.python.eager import executor as executor_lib
from tensorflow.python.eager.polymorphic_function import concrete_function as concrete_lib
from tensorflow.python.framework import function_def_to_graph as function_def_to_graph_lib
from tensorflow.python.framework import func_graph as func_graph_lib

# The TensorFlow minor release these hooks are written for and tested on.
SUPPORTED = "2.20"

# A trackable object that writes its own tensors into a checkpoint.
Trackable = tf.__internal__.tracking.Trackable


def check_version(version: str = tf.__version__) -> str | None:
  """None on a supported TensorFlow; else one line saying which is loaded."""
  if version == SUPPORTED or version.startswith(SUPPORTED + "."):
    return None
  return (f"TensorFlow {version} is loaded; tfps's TensorFlow hooks are written for "
          f"{SUPPORTED} (tfps.base.tf_internals): stored traces, checkpoint writes and "
          "warm-ups may fail")


# -- variables --------------------------------------------------------------------------

def shards_of(variable: Any) -> list[tf.Variable] | None:
  """The parts of a sharded variable (a variable partitioner's); None for anything else."""
  if isinstance(variable, sharded_variable_lib.ShardedVariable):
    return list(variable.variables)
  return None


def tracked_paths(root) -> list[tuple[str, Any]]:
  """Each object `root` tracks, as a checkpoint walks them (breadth first), with its
  path of names ("trainer/model/layer_with_weights-0/kernel"): a path stays when
  objects made later (an optimizer's slots) are added beside it."""
  objects, paths = tf.train.TrackableView(root)._descendants_with_paths()  # pylint: disable=protected-access
  return [("/".join(ref.name for ref in paths[obj]), obj) for obj in objects]


# -- stored traces: a ConcreteFunction from its FunctionDefs --------------------------------

def register_function_def(fdef) -> None:
  """Makes `fdef` known to this process's runtime (a function another one calls)."""
  context_lib.context().add_function_def(fdef)


def function_from_def(outer, input_specs: Sequence[tf.TensorSpec], outputs: Any,
                      captures: Sequence[Any]):
  """A callable `ConcreteFunction` from the FunctionDef `outer`.

  `input_specs`: its inputs (before the captures); `outputs`: the structure its
  flat outputs are packed into; `captures`: the tensors (variable handles,
  constants) bound to its trailing inputs, in order. The functions `outer`
  calls must be registered first (`register_function_def`).

  Raises:
    ValueError: `outer` takes another number of inputs.
  """
  graph = function_def_to_graph_lib.function_def_to_graph(
      outer, structured_input_signature=(tuple(input_specs), {}))
  num_inputs = len(graph.inputs) - len(captures)
  expected = len(tf.nest.flatten(tuple(input_specs), expand_composites=True))
  if num_inputs != expected:  # A composite input (an iterator) is its components.
    raise ValueError(f"{num_inputs} inputs stored, {expected} expected")
  graph.structured_outputs = tf.nest.pack_sequence_as(outputs, graph.outputs)
  for external, internal in zip(captures, graph.inputs[num_inputs:]):
    graph.function_captures.add_or_replace(key=id(external), external=external,
                                           internal=internal, is_by_ref=False)
  function_type = function_type_lib.from_structured_signature(
      graph.structured_input_signature, graph.structured_outputs,
      graph.function_captures.capture_types)
  if "_input_shapes" in outer.attr:
    del outer.attr["_input_shapes"]
  function = concrete_lib.ConcreteFunction.from_func_graph(graph, function_type,
                                                           attrs=outer.attr)
  function.set_external_captures(list(captures))
  return function


# -- asynchronous checkpoints -----------------------------------------------------------------

def _async_writer(checkpoint: tf.train.Checkpoint):
  """TensorFlow's asynchronous writer of `checkpoint`, once a save made one; else None."""
  return getattr(checkpoint, "_async_checkpointer_impl", None)


def async_write_running(checkpoint: tf.train.Checkpoint) -> bool:
  """Whether a background write of `checkpoint` still runs (its next save would wait)."""
  queue = getattr(_async_writer(checkpoint), "_queue", None)  # Its thread marks writes done.
  return bool(queue is not None and queue.unfinished_tasks)


def raise_async_write_error(checkpoint: tf.train.Checkpoint) -> None:
  """Raises the error of a failed background write now (TF keeps it for the next save)."""
  writer = _async_writer(checkpoint)
  if writer is not None:
    writer._check_async_thread_error()  # pylint: disable=protected-access


# Closed writers whose functions stay registered (`close_async_writer(keep=True)`).
_KEPT_WRITERS = []


def close_async_writer(checkpoint: tf.train.Checkpoint, *, keep: bool = False) -> None:
  """Ends `checkpoint`'s writer thread and forgets the writer (a later save makes a new one).

  TensorFlow's writer registers an exit hook that keeps it, and the function it
  traced on the cluster, alive until the process ends, when that cluster may be
  gone; closed here, it goes while its cluster still answers. `keep`: a worker
  does not answer (paused), and both would wait for it: removing the writer's
  functions (as a registration does, `write_with_one_function`), and its
  thread's end, which leaves an executor scope (docs/tensorflow-behaviour.md, "A
  paused worker's result copy"). The writer and its idle thread are kept instead.
  """
  import atexit  # pylint: disable=import-outside-toplevel
  writer = _async_writer(checkpoint)
  if writer is None:
    return
  checkpoint._async_checkpointer_impl = None  # pylint: disable=protected-access
  atexit.unregister(writer._join_async_save_thread)  # pylint: disable=protected-access
  if keep:
    _KEPT_WRITERS.append(writer)
    return
  writer._join_async_save_thread()  # pylint: disable=protected-access


def trace_async_copy(checkpoint: tf.train.Checkpoint) -> None:
  """Traces the asynchronous writer's copy function now, once its first write is made.

  TensorFlow's writer copies the variables at each write after its first through
  a function it traces at its second write: mid-run, where the registration of a
  new function waits for a paused worker with the GIL held
  (`write_with_one_function`). Traced here, right after the first write (a run's
  start), later writes register nothing.
  """
  writer = _async_writer(checkpoint)
  if writer is None or not writer._initialized or getattr(writer, "_tfps_copy_traced", False):  # pylint: disable=protected-access
    return
  writer._copy_to_cpu.get_concrete_function()  # pylint: disable=protected-access
  writer._tfps_copy_traced = True  # pylint: disable=protected-access


def write_with_one_function(checkpoint: tf.train.Checkpoint, *, asynchronous: bool) -> None:
  """Has every write of `checkpoint` (and of its asynchronous writer) run one
  function traced once, instead of a new one per write.

  On more than one task TensorFlow traces a new saver function at every
  write, and registers each new function with every task of the cluster.
  That registration holds the GIL until every task has taken it; while a
  worker is paused it waits for that worker, and the whole coordinator
  stands still with it (docs/tensorflow-behaviour.md). Traced once, a write
  registers nothing after the first.

  A function traced once writes what it read when traced unless it reads
  variables: a checkpointed object whose tensors are values made in Python
  (read outside the function) would be written stale. Such a checkpoint
  keeps TensorFlow's new function per write; so do writes TensorFlow makes
  otherwise (options this does not know, graph mode). The function is traced
  again when the checkpoint's objects change. Safe to call more than once;
  `asynchronous`: also (and first) for the asynchronous writer, made now if
  it is not yet.
  """
  _reuse_one_write_function(checkpoint)
  if asynchronous:  # The writer thread writes through a checkpoint of its own.
    _reuse_one_write_function(checkpoint._async_checkpointer().checkpointer())  # pylint: disable=protected-access


def prepare_writes(checkpoint: tf.train.Checkpoint) -> None:
  """Traces and registers now the write function of `checkpoint`'s objects as they
  are, for its next save (and its asynchronous writer's, once it writes).

  A checkpoint gains objects after its first write (an optimizer makes its
  slots when its step is first traced), and its next write would register a new
  function then: at a loop end, where a worker that just paused would hold the
  whole coordinator (`write_with_one_function`). Called where the objects were
  made (a trace), the registration is done while the workers answer. A
  checkpoint whose writes are not traced once is left alone.
  """
  writers = [checkpoint]
  writer = _async_writer(checkpoint)
  if writer is not None and writer._initialized:  # pylint: disable=protected-access
    writers.append(writer.checkpointer())  # Its saver reads the writer's copies once made.
  for each in writers:
    prepare = getattr(each._saver, "_tfps_prepare", None)  # pylint: disable=protected-access
    if prepare is not None:
      prepare()


def _reuse_one_write_function(checkpoint) -> None:
  saver = checkpoint._saver  # pylint: disable=protected-access
  if getattr(saver, "_tfps_one_function", False):
    return
  traced_save = saver.save  # The bound method: TensorFlow's write, traced or not.
  lock, cache = threading.Lock(), {}  # {objects' ids: concrete function or None}
  # Functions of objects the checkpoint no longer has, kept: a function that goes
  # is removed from every task, which waits for a paused worker as a registration does.
  retired = []
  last_options = [None]  # The last save's: a prepared write is traced as that save was.

  def function_for(options):
    key = tuple(id(t) for t in saver._graph_view.descendants())  # pylint: disable=protected-access
    with lock:
      if key not in cache:
        retired.extend(function for function in cache.values() if function is not None)
        cache.clear()
        write = tf.function(lambda prefix: traced_save(prefix, options=options),
                            input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
        function = write.get_concrete_function()
        cache[key] = function if _writes_live_values(function.graph) else None
      return cache[key]

  def save(file_prefix, checkpoint_number=None, session=None, options=None):
    if (checkpoint_number or session is not None or not context_lib.executing_eagerly()
        or tf.is_tensor(file_prefix) or not _plain(options)):
      return traced_save(file_prefix, checkpoint_number, session, options)
    last_options[0] = options
    function = function_for(options)
    if function is None:
      return traced_save(file_prefix, checkpoint_number, session, options)
    tf.io.gfile.makedirs(os.path.dirname(file_prefix))
    return function(tf.constant(file_prefix))

  saver.save = save
  saver._tfps_prepare = lambda: function_for(last_options[0])  # pylint: disable=protected-access
  saver._tfps_one_function = True  # pylint: disable=protected-access


# The tensor a write names the checkpoint's object graph by: a constant, made
# when traced, that changes only with the objects (the cache's key).
_OBJECT_GRAPH_KEY = b"_CHECKPOINTABLE_OBJECT_GRAPH"
_PASS_THROUGH = frozenset({"Identity", "IdentityN", "Snapshot"})


def _writes_live_values(graph) -> bool:
  """Whether every value the traced write `graph` saves is read when it runs.

  A value comes live from a stateful op (a variable's read, a table's
  export); a constant or a captured tensor was made in Python when traced.
  """
  writes = [op for op in graph.get_operations() if op.type == "SaveV2"]
  for op in writes:
    names = tf.get_static_value(op.inputs[1])
    if names is None:
      return False
    for name, value in zip(names, op.inputs[3:]):
      if name == _OBJECT_GRAPH_KEY:
        continue
      source = value.op
      while source.type in _PASS_THROUGH:
        source = source.inputs[0].op
      if source.type == "Placeholder" or not source.op_def.is_stateful:
        return False
  return bool(writes)


def _plain(options) -> bool:
  """Whether `options` asks the saver for nothing a write traced once would miss (the
  write callbacks are the checkpoint's, run after the saver)."""
  if options is None:
    return True
  return not (options.experimental_io_device or options.experimental_sharding_callback)


def last_saved_step(manager: tf.train.CheckpointManager) -> int | None:
  """The step `manager` last saved at by its interval check; None without an interval."""
  if manager._checkpoint_interval is None:  # pylint: disable=protected-access
    return None
  step = manager._last_checkpoint_step  # pylint: disable=protected-access
  return None if step is None else int(step)


# -- a dataset's ops in a graph (input.seek) -----------------------------------------------

def dataset_variant(dataset: tf.data.Dataset) -> tf.Tensor:
  """The variant tensor of `dataset`: in a graph, the output of its top op."""
  return dataset._variant_tensor  # pylint: disable=protected-access


def graph_function_def(graph: tf.Graph, name: str):
  """The FunctionDef of function `name` known to `graph` (a map's, a flat_map's), or None."""
  function = graph._get_function(name)  # pylint: disable=protected-access
  return None if function is None else function.cached_definition


def stateful_ops_since(graph: tf.Graph, mark: int) -> list[tf.Operation]:
  """The ops with side effects made in `graph` after its first `mark` ops (a control
  flow op counts as one: its body's ops are inside it)."""
  return [op for op in graph.get_operations()[mark:] if op._is_stateful]  # pylint: disable=protected-access


# -- a traced step copied into a closure's graph (coordinator.step_copies) ----------------------

def trace_graph(name: str, fn) -> tuple[Any, Any]:
  """`fn()` traced (AutoGraph on, automatic control dependencies) as a graph of its own
  in the current default graph's context, and what `fn` returned (before the trace made
  tensors of its Python values). The graph is a FuncGraph: its `captures` pair each
  tensor it took from outside (an enclosing graph's, or a variable's handle) with its
  placeholder, and its `structured_outputs` are what it returns."""
  from tensorflow.python.eager.polymorphic_function import autograph_util  # pylint: disable=import-outside-toplevel
  converted = autograph_util.py_func_from_autograph(fn)
  returned = []

  def traced():
    returned.append(converted())
    return returned[0]

  with autograph_on():
    graph = func_graph_lib.func_graph_from_py_func(name, traced, [], {})
  return graph, returned[0]


def autograph_skips(modules: Sequence[str]) -> None:
  """AutoGraph no longer converts the functions of `modules` (and their submodules)
  when converted code calls them: they run as written, as TensorFlow's own do. The
  callables they are given still are (a lambda of converted code stays converted, and
  what it calls with it), since AutoGraph stays on around them."""
  from tensorflow.python.autograph.core import config as autograph_config  # pylint: disable=import-outside-toplevel
  rules = [autograph_config.DoNotConvert(module) for module in modules
           if not any(str(rule) == str(autograph_config.DoNotConvert(module))
                      for rule in autograph_config.CONVERSION_RULES)]
  autograph_config.CONVERSION_RULES = (*rules, *autograph_config.CONVERSION_RULES)


def autograph_on():
  """A context in which AutoGraph converts the code called (a user's step called from
  tfps code AutoGraph does not convert), as it does inside a converted function."""
  from tensorflow.python.autograph.core import ag_ctx  # pylint: disable=import-outside-toplevel
  return ag_ctx.ControlStatusCtx(status=ag_ctx.Status.ENABLED)


def has_deferred_captures(graph) -> bool:
  """Whether `graph` (a `trace_graph`) takes a value it resolves only when called (a
  per-worker resource, `capture_call_time_value`)."""
  return bool(graph.function_captures.by_ref_external)


def set_colocation(op: tf.Operation, names: Sequence[str]) -> None:
  """Colocates `op` with the ops named `names` in its graph (its `_class` attribute, as
  `tf.compat.v1.colocate_with` sets it)."""
  from tensorflow.core.framework import attr_value_pb2  # pylint: disable=import-outside-toplevel
  op._set_attr("_class", attr_value_pb2.AttrValue(  # pylint: disable=protected-access
      list=attr_value_pb2.AttrValue.ListValue(s=[f"loc:@{name}".encode() for name in names])))


def control_inputs_for(op: tf.Operation, inputs: Sequence[tf.Tensor]) -> None:
  """Gives `op`, made outside the graph's `tf.control_dependencies` blocks (an imported
  op), the control inputs an op on `inputs` made here would get."""
  graph = op.graph
  controls = graph._control_dependencies_for_inputs([t.op for t in inputs])  # pylint: disable=protected-access
  if controls:
    op._add_control_inputs(controls)  # pylint: disable=protected-access


def create_op_like(op: tf.Operation, inputs: Sequence[tf.Tensor]) -> tf.Tensor:
  """A new op of `op`'s type and attributes (functions included) on `inputs`; its output."""
  new = op.graph._create_op_internal(  # pylint: disable=protected-access
      op.type, list(inputs), dtypes=[out.dtype for out in op.outputs],
      attrs={k: v for k, v in op.node_def.attr.items() if not k.startswith("_")})
  return new.outputs[0]


# -- the coordinator's workers ------------------------------------------------------------------

def coordinator_workers(coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator
                        ) -> list[Any]:
  """The coordinator's worker objects: each has `worker_index`, `device_name` and
  `create_resource(fn)`, which runs `fn` on that worker's thread before its next
  closure and again whenever TensorFlow takes the worker back (per-worker datasets
  use it)."""
  return list(coordinator._cluster.workers)  # pylint: disable=protected-access


def worker_args(args: tuple[Any, ...], worker_index: int) -> tuple[Any, ...]:
  """`args` as a closure on worker `worker_index` is called with them: its own of each
  per-worker value (an iterator), resolved. Call on that worker's thread, after its
  per-worker values were made there (they are made in order, before its next closure)."""
  from tensorflow.python.distribute.coordinator import coordinator_context  # pylint: disable=import-outside-toplevel
  return tf.nest.map_structure(coordinator_context.maybe_get_remote_value,
                               cluster_coordinator._select_worker_slice(worker_index, args))  # pylint: disable=protected-access


def scheduled_specs(args: tuple[Any, ...]) -> tuple[Any, ...]:
  """What `ClusterCoordinator.schedule` traces a function for, given `args`: a
  per-worker value's type spec in its place (tracing with these ahead, the
  schedule finds the trace made)."""
  return tf.nest.map_structure(cluster_coordinator._maybe_as_type_spec,  # pylint: disable=protected-access
                               cluster_coordinator._select_worker_slice(0, args))  # pylint: disable=protected-access


@contextlib.contextmanager
def traced_as_scheduled():
  """Traces made inside are made as `ClusterCoordinator.schedule` makes its own: a
  closure traced ahead of its schedule runs the strategy's methods as a scheduled one
  does, and ParameterServerStrategy's warning that one runs outside a schedule (each
  step's, once per process) would be noise (TensorFlow's flag for it)."""
  extended = tf.distribute.get_strategy().extended
  if not hasattr(extended, "_being_scheduled"):
    yield
    return
  before = extended._being_scheduled  # pylint: disable=protected-access
  extended._being_scheduled = True  # pylint: disable=protected-access
  try:
    yield
  finally:
    extended._being_scheduled = before  # pylint: disable=protected-access


def put_back_failed_closures_first(coordinator) -> None:
  """Has `coordinator` run a closure a lost worker failed before the ones queued.

  TensorFlow puts such a closure back at the tail of its queue, so it waits
  for every closure scheduled after it (a loop's worth) and the loop's join
  waits for it last. At the head, the next free worker runs it at once.
  """
  queue = coordinator._cluster.closure_queue  # pylint: disable=protected-access

  def put_back(closure) -> None:
    assert closure.tag is None
    _put_back_first(queue, closure)

  queue.put_back = put_back


def _put_back_first(queue, closure) -> None:
  """TensorFlow's `put_back` of an in-flight `closure`, at the head of `queue`: the
  next free worker runs it (cancelled instead once the queue holds an error)."""
  # pylint: disable=protected-access
  with queue._queue_lock:
    if queue._inflight_closure_count < 1:
      raise AssertionError("There is no inflight closures to put_back.")
    if queue._error:
      closure.mark_cancelled()
    else:
      waiting = queue._queue
      with waiting.mutex:
        waiting.queue.appendleft(closure)
        waiting.unfinished_tasks += 1
        waiting.not_empty.notify()
      queue._closures_queued_condition.notify()
    queue.inflight_closure_count -= 1
    if queue._inflight_closure_count == 0:
      queue._no_inflight_closure_condition.notify_all()


# -- closures taken off a slow worker (coordinator.speculation) -------------------------------

def closure_arguments(closure) -> tuple:
  """A scheduled closure's arguments, as it would be called now."""
  return tuple(closure._args)  # pylint: disable=protected-access


def closure_output(closure):
  """The `RemoteValue` `schedule` returned for `closure` (None if nobody holds it)."""
  ref = closure._output_remote_value_ref  # pylint: disable=protected-access
  return ref() if ref is not None else None


def closure_function(closure):
  """The function a scheduled closure calls (its concrete function, if traced)."""
  return getattr(closure, "_concrete_function", None) or closure._function  # pylint: disable=protected-access


class ClosureAttempt:
  """One worker's run of one closure: `closure`, `worker_index`, its `task_index` in
  the cluster spec, `started` (monotonic)."""

  def __init__(self, closure, worker_index: int, task_index: int, started: float):
    self.closure, self.worker_index, self.started = closure, worker_index, started
    self.task_index = task_index
    self.taken_away = False  # Queued again for another worker: this run's outcome is dropped.
    self.finished = False  # Its outcome was given to the queue: it can no longer be taken.
    self.succeeded = False
    self.answers: bool | None = None  # Whether its worker answered a probe (None: not probed).
    self.probed_at = 0.0  # When (monotonic) it was last probed.
    self.silent_probes = 0  # Its worker's probes unanswered in a row.
    self.fenced: Any = None  # What the taker fenced this run with, if anything.

  @property
  def args(self) -> tuple:
    """The closure's arguments (as it runs them: a queued closure's may be swapped)."""
    return closure_arguments(self.closure)

  @property
  def output(self):
    """The `RemoteValue` `schedule` returned for the closure (None if nobody holds it)."""
    return closure_output(self.closure)


class ClosureAttempts:
  """Which closure each of a coordinator's worker threads runs, and since when; a
  running closure can be taken away (`take_away`) and queued again first.

  TensorFlow's worker thread of a taken attempt goes on waiting for its
  worker; whatever that run gives when it ends (its result, its error, a put
  back after a worker failure) is dropped, so the queue and the closure's
  output hear only of the run that replaced it. Listeners: each of `on_start`
  hears `(worker_index, closure, first)` when a worker's thread took a closure,
  before it runs (`first`: it never ran before; it may `swap_arguments`); each
  of `on_end` hears `attempt` when a taken attempt's thread is done with it;
  each of `on_done` hears `(attempt, seconds)` when a run succeeded.
  """

  def __init__(self, coordinator, clock):
    self._clock = clock
    self.on_start: list = []
    self.on_end: list = []
    self.on_done: list = []
    self._ran: weakref.WeakSet = weakref.WeakSet()  # Closures a worker thread has taken.
    self._lock = threading.Lock()
    self._local = threading.local()
    self._running: dict[int, ClosureAttempt] = {}
    cluster = coordinator._cluster  # pylint: disable=protected-access
    self._queue = cluster.closure_queue
    for worker in cluster.workers:
      worker._process_closure = self._tracked(worker)  # pylint: disable=protected-access
    for name in ("mark_finished", "put_back", "mark_failed"):
      setattr(self._queue, name, self._unless_taken(getattr(self._queue, name), name))
    # TensorFlow logs a taken run's error (many lines); the taker says it in one.
    self._log_filter = _DropWhen(lambda: bool(self._current() and self._current().taken_away))
    tf.get_logger().addFilter(self._log_filter)

  def close(self) -> None:
    tf.get_logger().removeFilter(self._log_filter)

  def running(self) -> list[ClosureAttempt]:
    """The attempts whose outcome is still to come (none taken away)."""
    with self._lock:
      return [a for a in self._running.values() if not (a.finished or a.taken_away)]

  def held_workers(self) -> set[int]:
    """The workers whose thread still waits on a taken attempt: they run nothing else."""
    with self._lock:
      return {i for i, a in self._running.items() if a.taken_away and not a.finished}

  def take_away(self, attempt: ClosureAttempt) -> bool:
    """Queues `attempt`'s closure again, first; False if it had ended meanwhile."""
    # pylint: disable=protected-access
    with self._lock:
      if attempt.finished or attempt.taken_away:
        return False
      attempt.taken_away = True
      _put_back_first(self._queue, attempt.closure)
    # A run that had begun copying its result holds the result's lock until
    # its worker wakes: the next run must not wait for it.
    value = attempt.output
    if value is not None and value._has_fetched_to_local_lock.locked():
      value._has_fetched_to_local_lock = threading.Lock()
    return True

  def swap_arguments(self, closure, choose) -> bool:
    """Gives `closure` (taken by this worker thread, not run yet) the arguments of the
    queued closure that `choose(queued closures)` picks (an index, or None), and that
    one `closure`'s: which worker runs which call changes, nothing else. Closures a
    worker took before are offered as None. Only for closures of one function
    (their arguments are of one signature)."""
    # pylint: disable=protected-access
    with self._queue._queue_lock:
      waiting = self._queue._queue
      with waiting.mutex:
        # Only closures no worker has taken yet: a retry's draw stays where it was put.
        queued = [q if q not in self._ran else None for q in waiting.queue]
        index = choose(queued)
        if index is None:
          return False
        other = queued[index]
        closure._args, other._args = other._args, closure._args
    return True

  def _current(self) -> ClosureAttempt | None:
    return getattr(self._local, "attempt", None)

  def _tracked(self, worker):
    process = cluster_coordinator.Worker._process_closure  # pylint: disable=protected-access

    def process_closure(closure):
      if getattr(self._local, "executor", None) is None:
        # An executor of the thread's own for what it runs outside the closure's
        # call (its result's copy): else that goes to the context's default
        # executor, shared by every worker thread, and each of them, leaving its
        # closure's executor scope, waits for everything pending there
        # (`Executor.__del__`): a paused worker's copy held them all.
        self._local.executor = executor_lib.new_executor(enable_async=False)
        context_lib.context().executor = self._local.executor
      first = closure not in self._ran
      self._ran.add(closure)
      for listener in self.on_start:
        listener(worker.worker_index, closure, first)
      attempt = ClosureAttempt(closure, worker.worker_index,
                               int(worker.device_name.rsplit("task:", 1)[1].split("/")[0]),
                               self._clock())
      self._guard_output(closure)
      with self._lock:
        self._running[worker.worker_index] = attempt
      self._local.attempt = attempt
      try:
        process(worker, closure)
      finally:
        self._local.attempt = None
        with self._lock:
          if self._running.get(worker.worker_index) is attempt:
            del self._running[worker.worker_index]
          attempt.finished = True
        if attempt.taken_away:
          for listener in self.on_end:
            listener(attempt)
        elif attempt.succeeded:
          seconds = self._clock() - attempt.started
          for listener in self.on_done:
            listener(attempt, seconds)
    return process_closure

  def _guard_output(self, closure) -> None:
    """A taken attempt's thread neither sets nor reads the closure's output."""
    if getattr(closure, "_tfps_guarded", False):
      return
    call = closure.maybe_call_with_output_remote_value

    def maybe_call(method):
      attempt = self._current()
      if attempt is not None and attempt.taken_away:
        return None
      return call(method)
    closure.maybe_call_with_output_remote_value = maybe_call
    closure._tfps_guarded = True  # pylint: disable=protected-access

  def _unless_taken(self, method, name):
    def call(*args, **kwargs):
      attempt = self._current()
      if attempt is not None:
        with self._lock:
          if attempt.taken_away:
            return None
          # Its outcome is the queue's now (a put-back too, while its thread waits
          # for the worker to come back): it can no longer be taken away.
          attempt.finished = True
          attempt.succeeded = name == "mark_finished"
      return method(*args, **kwargs)
    return call


class _DropWhen:
  """A logging filter: drops the records logged while `drop()` is true."""

  def __init__(self, drop):
    self._drop = drop

  def filter(self, record) -> bool:  # pylint: disable=unused-argument
    return not self._drop()


def track_closures(coordinator, clock) -> ClosureAttempts:
  """Tracks `coordinator`'s closures per worker thread (`ClosureAttempts`)."""
  return ClosureAttempts(coordinator, clock)
