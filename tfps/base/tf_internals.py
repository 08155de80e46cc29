"""The one module that reaches into TensorFlow's private parts.

tfps needs a few things TensorFlow does not publish: to rebuild a traced
function from its stored definition (stored traces), to ask its asynchronous
checkpoint writer whether a write is in flight and to close it, to run code
on a worker's thread before its closures (warm-ups), to tell a sharded
variable apart, and to read and rebuild a dataset's ops in a graph
(positioned input's seek). Every other module uses TensorFlow's public API only and
reaches these through the functions here, one per hook. A TensorFlow release
that moves a hook breaks this module alone, and
`tests/base/test_tf_internals.py` names the hook that moved.

Supported: TensorFlow `SUPPORTED` (the release tf-models-official pins, and
the one the suite runs on); `check_version` says so when another is loaded.
"""

from typing import Any, Sequence

import tensorflow as tf

from tensorflow.core.function.polymorphism import function_type as function_type_lib
from tensorflow.python.distribute import sharded_variable as sharded_variable_lib
from tensorflow.python.eager import context as context_lib
from tensorflow.python.eager.polymorphic_function import concrete_function as concrete_lib
from tensorflow.python.framework import function_def_to_graph as function_def_to_graph_lib

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
  if num_inputs != len(input_specs):
    raise ValueError(f"{num_inputs} inputs stored, {len(input_specs)} expected")
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


def close_async_writer(checkpoint: tf.train.Checkpoint) -> None:
  """Ends `checkpoint`'s writer thread and forgets the writer (a later save makes a new one).

  TensorFlow's writer registers an exit hook that keeps it, and the function it
  traced on the cluster, alive until the process ends, when that cluster may be
  gone; closed here, it goes while its cluster still answers.
  """
  import atexit  # pylint: disable=import-outside-toplevel
  writer = _async_writer(checkpoint)
  if writer is None:
    return
  checkpoint._async_checkpointer_impl = None  # pylint: disable=protected-access
  atexit.unregister(writer._join_async_save_thread)  # pylint: disable=protected-access
  writer._join_async_save_thread()  # pylint: disable=protected-access


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


def put_back_failed_closures_first(coordinator) -> None:
  """Has `coordinator` run a closure a lost worker failed before the ones queued.

  TensorFlow puts such a closure back at the tail of its queue, so it waits
  for every closure scheduled after it (a loop's worth) and the loop's join
  waits for it last. At the head, the next free worker runs it at once.
  """
  queue = coordinator._cluster.closure_queue  # pylint: disable=protected-access
  # pylint: disable=protected-access

  def put_back(closure) -> None:
    # TF's put_back, but for where the closure goes.
    assert closure.tag is None
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

  queue.put_back = put_back
