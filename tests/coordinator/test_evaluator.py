"""Exact evaluation (tfps.coordinator.evaluator) on the in-process cluster: every
example once, the metrics of a single machine. With a worker killed mid-evaluation:
test_evaluator_cluster.py."""

import numpy as np
import orbit
import pytest
import tensorflow as tf
import tf_keras

from tfps.base import errors
from tfps.coordinator import evaluator as evaluator_lib
from tfps.coordinator import trainer as trainer_lib
from tfps.examples.ctr import experiment as ctr

from tests.support import inprocess
from tests.support import linear_models

pytestmark = pytest.mark.tf


def _reference_ctr_metrics(model, config, seed, batch):
  """The evaluator's own single-machine evaluate(), on the chief, whole set."""
  whole = ctr.eval_dataset_fn(config, seed, batch)(tf.distribute.InputContext())
  reference = ctr.CtrEvaluator(model, whole)  # Outside the scope: plain metrics.
  out = reference.evaluate(tf.constant(-1))
  return {k: float(v) for k, v in out.items()}, float(reference.loss.count.numpy())


def test_exact_eval_equals_single_machine_metrics(runtime, tmp_path):
  config = ctr.CtrConfig.from_params(dict(inprocess.SMALL_CTR, eval_examples="1000"))
  with runtime.strategy.scope():
    model = ctr.build_model(config, seed=3)
    optimizer = tf_keras.optimizers.Adam(0.01)
    trainer = ctr.CtrTrainer(model, optimizer,
                             ctr.train_dataset_fn(config, 3, 128, data_dir=str(tmp_path)))
    evaluator = ctr.CtrEvaluator(model, ctr.eval_dataset_fn(config, 3, 64))
  trainer_lib.PSTrainer(trainer, runtime, trainer_lib.LoopOptions(steps_per_closure=2)).train(tf.constant(40))
  expected, count = _reference_ctr_metrics(model, config, 3, 64)
  assert count == 1000

  for shards in (8,):  # More shards than workers, of uneven sizes.
    ps_evaluator = evaluator_lib.PSEvaluator(evaluator, runtime, num_shards=shards)
    got = {k: float(v) for k, v in ps_evaluator.evaluate(tf.constant(-1)).items()}
    assert evaluator.loss.count.numpy() == 1000  # Every example exactly once.
    assert got["auc"] == pytest.approx(expected["auc"], abs=1e-6)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
  assert 0.55 < got["auc"] < 1.0  # A trained model, not a constant.

  partial = evaluator_lib.PSEvaluator(evaluator, runtime, num_shards=4)
  partial.evaluate(tf.constant(6))  # 6 batches of 64 in total.
  assert evaluator.loss.count.numpy() == 6 * 64


def test_exact_eval_of_chief_side_dataset(runtime):
  with runtime.strategy.scope():
    model, _, _, _ = linear_models.linear_parts()
    ex, ey = linear_models.separable(300, seed=5)
    evaluator = linear_models.LinearEvaluator(
        model, tf.data.Dataset.from_tensor_slices((ex, ey)).batch(32))
  got = evaluator_lib.PSEvaluator(evaluator, runtime, num_shards=5).evaluate(tf.constant(-1))
  logits = model(ex).numpy()
  assert float(got["accuracy"]) == pytest.approx(np.mean((logits > 0) == (ey > 0)), abs=1e-6)
  assert evaluator.metrics[1].count.numpy() == 300


class Count(tf_keras.metrics.Metric):
  """A hand-written metric as users write them: its __init__ takes only a name."""

  def __init__(self, name="count"):
    super().__init__(name=name)
    self.seen = self.add_weight("seen", initializer="zeros", dtype=tf.int64)

  def update_state(self, values):
    self.seen.assign_add(tf.size(values, out_type=tf.int64))

  def result(self):
    return self.seen


class CountingEvaluator(orbit.StandardEvaluator):
  def __init__(self, dataset):
    self.strategy = tf.distribute.get_strategy()
    self.count = Count()
    self.mean = tf_keras.metrics.Mean("mean")
    super().__init__(dataset)

  def eval_begin(self):
    self.count.reset_state()
    self.mean.reset_state()

  def eval_step(self, iterator):
    def step_fn(values):
      self.count.update_state(values)
      self.mean.update_state(tf.cast(values, tf.float32))
    self.strategy.run(step_fn, args=(next(iterator),))

  def eval_end(self):
    return {"count": self.count.result(), "mean": self.mean.result()}


def test_exact_eval_of_a_metric_whose_init_does_not_take_its_config(runtime):
  with pytest.raises(TypeError):  # What copying it from its config did.
    Count.from_config(Count().get_config())
  with runtime.strategy.scope():
    evaluator = CountingEvaluator(tf.data.Dataset.range(1000).batch(32))
  got = evaluator_lib.PSEvaluator(evaluator, runtime, num_shards=6).evaluate(tf.constant(-1))
  assert int(got["count"]) == 1000  # Every example once, through 6 shards.
  assert float(got["mean"]) == pytest.approx(499.5)


def test_a_metric_whose_state_is_out_of_reach_is_refused_in_one_line(runtime):
  class Hidden(tf_keras.metrics.Metric):
    def __init__(self):
      super().__init__(name="hidden")
      self.parts = [self.add_weight("total", initializer="zeros")]  # In a list.

    def update_state(self, values):
      self.parts[0].assign_add(tf.reduce_sum(values))

    def result(self):
      return self.parts[0]

  with runtime.strategy.scope():
    evaluator = CountingEvaluator(tf.data.Dataset.range(10).batch(2))
    evaluator.count = Hidden()
  with pytest.raises(errors.UsageError, match="metric 'hidden' \\(Hidden\\) keeps state "
                     "variables"):
    evaluator_lib.PSEvaluator(evaluator, runtime, num_shards=2)
