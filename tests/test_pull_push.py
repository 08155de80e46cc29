"""pull_push on one machine: the same values and gradients as reading the variables.

(On a real cluster, where it saves transfers: tests/test_coordinator_ps.py.)
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tfps.coordinator import pull_push
from tfps.base import errors

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
