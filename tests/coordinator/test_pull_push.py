"""pull_push (tfps.coordinator.pull_push): on one machine, the same values and gradients
as reading the variables; on the in-process cluster, where it saves transfers.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tfps.base import errors
from tfps.coordinator import experiment as experiment_lib
from tfps.coordinator import pull_push
from tfps.coordinator import strategy as strategy_lib
from tfps.examples.ctr import experiment as ctr

from tests.support import inprocess

pytestmark = pytest.mark.tf

IDS = tf.constant([[3, 3, 7], [0, 7, 49]], tf.int64)  # Duplicates, and the last row.


def _variables():
  rng = np.random.default_rng(0)
  table = tf.Variable(rng.normal(size=(50, 4)).astype("float32"), name="table")
  weights = tf.Variable(rng.normal(size=(3, 4)).astype("float32"), name="weights")
  unused = tf.Variable(np.ones((2,), "float32"), name="unused")
  return table, weights, unused


def _loss(rows, weights):
  # rows [2, 3, 4] (one per id), weights [3, 4]: something every row and weight feeds.
  return tf.reduce_sum(tf.tanh(rows * weights[tf.newaxis]) ** 2)


def _dense(grad) -> np.ndarray:
  return tf.convert_to_tensor(grad).numpy()


def test_lookups_and_gradients_equal_reading_the_variables():
  table, weights, unused = _variables()

  order = []

  @tf.function
  def both():
    with tf.GradientTape() as tape:
      plain = _loss(tf.gather(table, IDS), tf.convert_to_tensor(weights))
    plain_grads = tape.gradient(plain, [table, weights])
    pulled = pull_push.pull(tables=[(table, IDS)], dense=[weights, unused])
    with tf.GradientTape() as tape:
      tape.watch(pulled.values)
      (rows,), (w, _) = pulled.lookups(), pulled.dense()
      loss = _loss(rows, w)
    grads_and_vars = pulled.gradients(tape.gradient(loss, pulled.values))
    order[:] = [v for _, v in grads_and_vars]
    return plain, plain_grads, loss, rows, [g for g, _ in grads_and_vars]

  plain, plain_grads, loss, rows, grads = both()
  assert rows.shape == (2, 3, 4)
  np.testing.assert_allclose(rows.numpy(), tf.gather(table, IDS).numpy())
  np.testing.assert_allclose(loss.numpy(), plain.numpy(), rtol=1e-6)
  table_grad, weights_grad, unused_grad = grads
  assert [v.ref() for v in order] == [table.ref(), weights.ref(), unused.ref()]
  assert isinstance(table_grad, tf.IndexedSlices)
  # Each row once: 3 and 7 appear twice in the ids, their gradients summed.
  assert sorted(table_grad.indices.numpy().tolist()) == [0, 3, 7, 49]
  np.testing.assert_allclose(_dense(table_grad), _dense(plain_grads[0]), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(weights_grad.numpy(), plain_grads[1].numpy(), rtol=1e-5)
  np.testing.assert_array_equal(unused_grad.numpy(), np.zeros(2))  # The loss ignores it.


def test_an_optimizer_step_on_pulled_gradients_is_the_stock_step():
  class SGD(pull_push.DeduplicateOnDevice, tf_keras.optimizers.SGD):
    pass

  table, weights, _ = _variables()
  stock_table, stock_weights = tf.Variable(table), tf.Variable(weights)
  ours, stock = SGD(0.1), tf_keras.optimizers.SGD(0.1)

  @tf.function
  def steps():
    with tf.GradientTape() as tape:
      loss = _loss(tf.gather(stock_table, IDS), tf.convert_to_tensor(stock_weights))
    stock.apply_gradients(zip(tape.gradient(loss, [stock_table, stock_weights]),
                              [stock_table, stock_weights]))
    pulled = pull_push.pull(tables=[(table, IDS)], dense=[weights])
    with tf.GradientTape() as tape:
      tape.watch(pulled.values)
      loss = _loss(pulled.lookups()[0], pulled.dense()[0])
    ours.apply_gradients(pulled.gradients(tape.gradient(loss, pulled.values)))

  for _ in range(3):
    steps()
  np.testing.assert_allclose(table.numpy(), stock_table.numpy(), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(weights.numpy(), stock_weights.numpy(), rtol=1e-5)


def _unique_ops(concrete) -> int:
  return sum(op.type == "Unique" for op in concrete.graph.get_operations())


def test_deduplicate_on_device_sums_duplicates_only_when_they_can_exist():
  class SGD(pull_push.DeduplicateOnDevice, tf_keras.optimizers.SGD):
    pass

  table = tf.Variable(np.zeros((5, 2), "float32"))
  optimizer = SGD(1.0)
  optimizer.build([table])

  @tf.function
  def apply_duplicates(values):
    optimizer.apply_gradients([(tf.IndexedSlices(values, tf.constant([1, 1, 4])), table)])

  apply_duplicates(tf.ones((3, 2)))
  np.testing.assert_array_equal(table.numpy()[[1, 4]], [[-2, -2], [-1, -1]])
  assert _unique_ops(apply_duplicates.get_concrete_function(tf.ones((3, 2)))) == 1

  @tf.function
  def apply_pulled():
    pulled = pull_push.pull(tables=[(table, tf.constant([1, 1, 4]))])
    with tf.GradientTape() as tape:
      tape.watch(pulled.values)
      loss = tf.reduce_sum(pulled.lookups()[0])
    grads = pulled.gradients(tape.gradient(loss, pulled.values))
    assert pull_push.has_unique_indices(grads[0][0])
    optimizer.apply_gradients(grads)

  apply_pulled()
  np.testing.assert_array_equal(table.numpy()[[1, 4]], [[-4, -4], [-2, -2]])
  assert _unique_ops(apply_pulled.get_concrete_function()) == 1  # pull's own, no second one.


def test_indices_from_anywhere_else_are_not_known_unique():
  @tf.function
  def check():
    made = tf.IndexedSlices(tf.ones((2, 2)), tf.constant([0, 0]))
    return pull_push.has_unique_indices(made)

  assert not check()


def test_bad_input_is_a_usage_error():
  table, weights, _ = _variables()
  with pytest.raises(errors.UsageError, match=r"pull: table weights:0 must be 2-D"):
    pull_push.pull(tables=[(tf.Variable(np.zeros(3, "float32"), name="weights"), [0])])
  pulled = pull_push.pull(tables=[(table, IDS)], dense=[weights])
  with pytest.raises(errors.UsageError,
                     match=r"gradients: got 1 gradients for 2 pulled values"):
    pulled.gradients([None])


# What a ctr train step moves between the coordinator and the ps, read from
# the partitioned graphs TensorFlow actually ran (run metadata). The step runs
# on this process (the chief) as it would on a worker.

def _step_transfers(runtime, train_step, example) -> dict[str, list[str]]:
  """Per ps, the tensors one step sends to or receives from it (control signals left out)."""
  from tensorflow.python.eager import context
  step = tf.function(lambda: train_step(example))
  with runtime.strategy.scope():
    context.context().enable_run_metadata()  # Partitions are reported when first run.
    try:
      step()
      metadata = context.context().export_run_metadata()
    finally:
      context.context().disable_run_metadata()
  # The step itself (other functions may run too: variable reads, datasets,
  # or, reported here too, functions this process instantiated earlier, such
  # as the one that wrote ctr's training files): the largest one that moves
  # tensors to or from a ps.
  candidates = [_ps_transfers(f) for f in sorted(
      metadata.function_graphs, key=lambda f: -len(f.pre_optimization_graph.node))
      if len(f.partition_graphs) > 1]
  transfers = next((t for t in candidates if t), {})
  return transfers


def _ps_transfers(function) -> dict[str, list[str]]:
  """Per ps, the tensors a function's partitions send to or receive from it."""
  transfers = {}
  for partition in function.partition_graphs:
    nodes = {node.name: node for node in partition.node}
    for node in partition.node:
      if node.op != "_Send":
        continue
      source = nodes[node.input[0].split(":")[0]]
      if source.op == "Const" and any(i.startswith("^") for i in source.input):
        continue  # A control signal: TensorFlow sends a dummy constant.
      ends = (node.attr["send_device"].s.decode(), node.attr["recv_device"].s.decode())
      ps = next((d.split("/device")[0] for d in ends if "/job:ps/" in d), None)
      if ps is not None:
        transfers.setdefault(ps, []).append(node.attr["tensor_name"].s.decode())
  return transfers


def _ctr_parts(runtime, model_dir):
  config = ctr.CtrConfig.from_params(inprocess.SMALL_CTR)
  context = experiment_lib.ExperimentContext(
      strategy=runtime.strategy, coordinator=runtime.coordinator, model_dir=str(model_dir),
      global_batch_size=256, seed=3, num_workers=inprocess.NUM_WORKERS,
      num_ps=inprocess.NUM_PS, params=inprocess.SMALL_CTR)
  with runtime.strategy.scope():
    trainer = ctr.factory(context).trainer
  return trainer, ctr.make_examples(tf.range(256, dtype=tf.int64), config, 3, 1)


def _plain_step(trainer):
  """The same step reading the variables inside the tape, as models usually do."""
  model, optimizer = trainer.model, trainer.optimizer

  def step_fn(example):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(ctr._loss(ctr._labels(example), model(example, training=True)))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))

  return lambda example: trainer.strategy.run(step_fn, args=(example,))


def test_a_ctr_step_moves_three_tensors_to_and_from_one_ps(inprocess_cluster, tmp_path):
  # Tables whole (tfps's default placement for a table this small).
  whole = strategy_lib.connect(inprocess_cluster, ready_timeout=30, min_shard_bytes=None)
  trainer, example = _ctr_parts(whole, tmp_path)
  pulled = _step_transfers(whole, lambda inputs: trainer.train_step(iter([inputs])), example)
  # The unique ids out, the rows and the MLP's weights back in one tensor,
  # all the gradients out in one: everything on the table's ps.
  (ps, names), = pulled.items()
  assert len(names) == 3, pulled
  assert ps == trainer.model.table.device.split("/device")[0]
  plain = _step_transfers(whole, _plain_step(trainer), example)
  # Reading the variables: ids, rows, MLP weights, unique ids and summed rows
  # of the sparse gradient, the MLP's gradient.
  assert sum(map(len, plain.values())) == 6, plain


def test_pull_push_on_a_table_split_over_the_ps_equals_reading_the_variables(runtime, tmp_path):
  trainer, example = _ctr_parts(runtime, tmp_path)  # 16 KiB shards: split over both ps.
  model = trainer.model
  assert len(model.table.variables) == inprocess.NUM_PS
  transfers = _step_transfers(runtime, lambda inputs: trainer.train_step(iter([inputs])),
                              example)
  assert sorted(map(len, transfers.values())) == [3, 3], transfers  # Per ps: ids, pull, push.
  devices = []

  labels = ctr._labels(example)

  @tf.function
  def gradients():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(ctr._loss(labels, model(example)))
    plain = tape.gradient(loss, model.trainable_variables)
    pulled = pull_push.pull(tables=[(model.table, model.ids(example))],
                            dense=[model.mlp.packed])
    with tf.GradientTape() as tape:
      tape.watch(pulled.values)
      (rows,), (weights,) = pulled.lookups(), pulled.dense()
      loss = tf.reduce_mean(ctr._loss(labels, model.logits(rows, weights, example)))
    grads_and_vars = pulled.gradients(tape.gradient(loss, pulled.values))
    devices[:] = [(g.values.device if isinstance(g, tf.IndexedSlices) else g.device, v.device)
                  for g, v in grads_and_vars]
    return ([tf.convert_to_tensor(g) for g in plain],
            [tf.convert_to_tensor(g) for g, _ in grads_and_vars])

  with runtime.strategy.scope():
    plain, pulled = gradients()
  # Variable order: the table's shards, then the MLP; every gradient made on its ps.
  assert all(grad_device == var_device for grad_device, var_device in devices), devices
  plain_table = np.concatenate([g.numpy() for g in plain[:inprocess.NUM_PS]])
  np.testing.assert_allclose(np.concatenate([g.numpy() for g in pulled[:inprocess.NUM_PS]]),
                             plain_table, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(pulled[inprocess.NUM_PS].numpy(), plain[inprocess.NUM_PS].numpy(),
                             rtol=1e-5, atol=1e-7)
