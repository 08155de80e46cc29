"""Each of TensorFlow's private parts tfps uses (`tfps.base.tf_internals`), one test a hook.

A failure here means the TensorFlow release installed moved that hook: the
message names the function of `tf_internals` to mend.
"""

import inspect
import os

import pytest
import tensorflow as tf
import tf_keras

from tfps.base import tf_internals

pytestmark = pytest.mark.tf


def _moved(hook: str) -> str:
  return (f"TensorFlow {tf.__version__} moved what tfps.base.tf_internals.{hook} uses "
          f"(written for {tf_internals.SUPPORTED}): mend that function")


def test_the_installed_tensorflow_is_the_supported_one():
  assert tf_internals.check_version() is None, tf_internals.check_version()
  assert "2.99.0 is loaded" in tf_internals.check_version("2.99.0")


def test_shards_of_tells_a_sharded_variable_from_a_plain_one():
  parts = [tf.Variable([1.0, 2.0]), tf.Variable([3.0])]
  sharded = tf_internals.sharded_variable_lib.ShardedVariable(parts)
  assert tf_internals.shards_of(sharded) == parts, _moved("shards_of")
  assert tf_internals.shards_of(parts[0]) is None


def test_tracked_paths_name_each_object_by_its_checkpoint_path():
  module = tf.Module()
  module.weights = [tf.Variable(1.0)]
  root = tf.train.Checkpoint(step=tf.Variable(0), module=module)
  paths = dict(tf_internals.tracked_paths(root))
  assert paths[""] is root, _moved("tracked_paths")
  assert paths["step"] is root.step and paths["module/weights/0"] is module.weights[0]


def test_function_from_def_rebuilds_a_traced_function_with_new_captures():
  weight = tf.Variable(2.0)

  @tf.function
  def scaled(x):
    return {"y": helper(x) * weight}

  @tf.function
  def helper(x):
    return x + 1.0

  traced = scaled.get_concrete_function(tf.TensorSpec([], tf.float32))
  library = traced.graph.as_graph_def().library.function
  other = tf.Variable(10.0)
  for fdef in library:
    tf_internals.register_function_def(fdef)
  try:
    rebuilt = tf_internals.function_from_def(
        traced.function_def, [tf.TensorSpec([], tf.float32)], {"y": None}, [other.handle])
  except Exception as e:  # pylint: disable=broad-except
    pytest.fail(f"{_moved('function_from_def')}: {type(e).__name__}: {e}")
  assert float(rebuilt(tf.constant(1.0))["y"]) == 20.0  # (1 + 1) * the new capture.


def test_autograph_skips_a_module_but_still_converts_what_it_calls_back():
  from tests.support import autograph_helpers  # pylint: disable=import-outside-toplevel

  def user_absolute(x):
    if x > 0:
      return x
    return -x

  assert float(tf.function(autograph_helpers.absolute)(tf.constant(-2.0))) == 2.0
  tf_internals.autograph_skips(["tests.support.autograph_helpers"])
  with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
    tf.function(lambda x: autograph_helpers.absolute(x))(tf.constant(-2.0))
  called_back = tf.function(lambda x: autograph_helpers.call(lambda: user_absolute(x)))
  assert float(called_back(tf.constant(-3.0))) == 3.0, _moved("autograph_skips")


def test_trace_graph_converts_and_returns_what_the_function_returned():
  weight = tf.Variable(3.0)

  def step():
    value = weight * 2.0
    if value > 0:  # AutoGraph's cond.
      value = value + 1.0
    return {"value": value, "kind": "dense"}

  @tf.function
  def outer():
    graph, returned = tf_internals.trace_graph("step", step)
    assert returned["kind"] == "dense"
    assert any(external is weight.handle for external, _ in graph.captures), _moved(
        "trace_graph")
    assert not tf_internals.has_deferred_captures(graph)
    return tf.constant(0)

  outer()


def test_the_async_checkpoint_writer_hooks(tmp_path):
  step = tf.Variable(0, dtype=tf.int64)
  checkpoint = tf.train.Checkpoint(step=step, v=tf.Variable([1.0, 2.0]))
  manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=2,
                                       step_counter=step, checkpoint_interval=5)
  assert tf_internals.last_saved_step(manager) is None  # No save yet.
  step.assign(5)
  manager.save(options=tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True))
  assert tf_internals._async_writer(checkpoint) is not None, _moved("_async_writer")
  assert isinstance(tf_internals.async_write_running(checkpoint), bool)
  manager.sync()
  assert tf_internals.async_write_running(checkpoint) is False, _moved("async_write_running")
  tf_internals.raise_async_write_error(checkpoint)  # None failed.
  assert tf_internals.last_saved_step(manager) == 5, _moved("last_saved_step")
  tf_internals.close_async_writer(checkpoint)
  assert tf_internals._async_writer(checkpoint) is None, _moved("close_async_writer")
  assert os.path.exists(manager.latest_checkpoint + ".index")


def test_a_trackable_writes_its_own_tensors_into_a_checkpoint(tmp_path):
  class Text(tf_internals.Trackable):
    def _serialize_to_tensors(self):
      return {"text": tf.constant("kept")}

  path = tf.train.Checkpoint(t=Text()).write(str(tmp_path / "c"))
  assert tf.train.load_variable(path, "t/.ATTRIBUTES/text") == b"kept", _moved("Trackable")


def test_the_coordinators_workers_can_run_a_resource_before_their_closures():
  from tensorflow.python.distribute.coordinator import cluster_coordinator as cc  # pylint: disable=import-outside-toplevel
  assert "self.workers" in inspect.getsource(cc.Cluster.__init__), _moved("coordinator_workers")
  assert callable(getattr(cc.Worker, "create_resource", None)), _moved("coordinator_workers")
  assert "_cluster" in inspect.getsource(cc.ClusterCoordinator.__init__), _moved(
      "coordinator_workers")


def test_the_tf_keras_optimizer_methods_pull_push_overrides_are_there():
  # tfps.coordinator.pull_push.DeduplicateOnDevice overrides these two.
  for name in ("_update_step", "_deduplicate_sparse_grad"):
    assert callable(getattr(tf_keras.optimizers.Optimizer, name, None)), (
        f"tf_keras moved Optimizer.{name}: mend tfps.coordinator.pull_push.DeduplicateOnDevice")


def test_a_failed_closure_is_put_back_at_the_head_of_the_queue():
  from tensorflow.python.distribute.coordinator import cluster_coordinator as cc  # pylint: disable=import-outside-toplevel

  class Closure:
    tag = None

    def __init__(self, name):
      self.name = name

    def mark_cancelled(self):
      raise AssertionError("not cancelled: nothing failed")

  queue = cc._CoordinatedClosureQueue()  # pylint: disable=protected-access
  coordinator = type("Coordinator", (), {})()
  coordinator._cluster = type("Cluster", (), {"closure_queue": queue})()
  try:
    tf_internals.put_back_failed_closures_first(coordinator)
  except AttributeError as e:
    pytest.fail(f"{_moved('put_back_failed_closures_first')}: {e}")
  for name in ("a", "b", "c"):
    queue.put(Closure(name))
  lost = queue.get(timeout=10)  # In flight on a worker that dies...
  queue.put_back(lost)  # ...put back by TF's worker thread.
  assert [queue.get(timeout=10).name for _ in range(3)] == ["a", "b", "c"], _moved(
      "put_back_failed_closures_first")
  assert queue.inflight_closure_count == 3
  for _ in range(3):
    queue.mark_finished()
  queue.wait(timeout=10)  # Nothing left: the count and conditions are TF's own.


def test_a_datasets_ops_can_be_read_and_rebuilt_in_a_graph():
  @tf.function(autograph=False)
  def rebuilt():
    dataset = tf.data.Dataset.range(10).map(lambda x: x * 2).batch(3)
    variant = tf_internals.dataset_variant(dataset)
    batch = variant.op
    map_op = batch.inputs[0].op
    assert (batch.type, map_op.type) == ("BatchDatasetV2", "MapDataset"), _moved("dataset_variant")
    (function_name,) = [v.func.name for v in map_op.node_def.attr.values() if v.func.name]
    definition = tf_internals.graph_function_def(map_op.graph, function_name)
    assert definition is not None and definition.node_def, _moved("graph_function_def")
    # The map and the batch again, on a range that starts at 4.
    source = tf_internals.create_op_like(
        map_op.inputs[0].op, [tf.constant(4, tf.int64), tf.constant(10, tf.int64),
                              tf.constant(1, tf.int64)])
    top = tf_internals.create_op_like(batch, [tf_internals.create_op_like(map_op, [source]),
                                              *batch.inputs[1:]])
    positioned = tf.data.experimental.from_variant(top, dataset.element_spec)
    return positioned.reduce(tf.constant(0, tf.int64), lambda total, b: total + tf.reduce_sum(b))
  assert int(rebuilt()) == sum(2 * x for x in range(4, 10)), _moved("create_op_like")


def test_a_closures_arguments_output_and_function_are_where_tfps_reads_and_swaps_them():
  from tensorflow.python.distribute.coordinator import cluster_coordinator as cc  # pylint: disable=import-outside-toplevel

  queue = cc._CoordinatedClosureQueue()  # pylint: disable=protected-access
  add = tf.function(lambda x: x + 1)
  closures = [cc.Closure(add, queue._cancellation_mgr, args=(tf.constant(i),))  # pylint: disable=protected-access
              for i in range(2)]
  outputs = [c.build_output_remote_value() for c in closures]
  moved = _moved("closure_arguments, closure_output, closure_function")
  assert tf_internals.closure_output(closures[0]) is outputs[0], moved
  assert int(tf_internals.closure_arguments(closures[1])[0]) == 1, moved
  assert tf_internals.closure_function(closures[0]) is tf_internals.closure_function(
      closures[1]), moved  # One trace for one signature: chunks of one kind swap.
  coordinator = type("Coordinator", (), {})()
  coordinator._cluster = type("Cluster", (), {"closure_queue": queue, "workers": []})()  # pylint: disable=protected-access
  attempts = tf_internals.ClosureAttempts(coordinator, clock=lambda: 0.0)
  try:
    for closure in closures:
      queue.put(closure)
    taken = queue.get(timeout=10)
    assert attempts.swap_arguments(taken, lambda queued: 0), _moved("swap_arguments")
    assert int(tf_internals.closure_arguments(taken)[0]) == 1
    assert int(tf_internals.closure_arguments(queue.get(timeout=10))[0]) == 0
  finally:
    attempts.close()
