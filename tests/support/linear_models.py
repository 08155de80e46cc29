"""An ordinary single-machine Orbit trainer and evaluator, written without parameter
servers in mind (the `orbit` README style), and a user's experiment made of them.

The TensorFlow tests train them on the in-process cluster (support/inprocess.py).
"""

import numpy as np
import orbit
import tensorflow as tf
import tf_keras


def separable(n, seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 4)).astype("float32")
  y = (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32") > 0).astype("float32")[:, None]
  return x, y


class LinearTrainer(orbit.StandardTrainer):

  def __init__(self, model, optimizer, global_step, dataset):
    self.strategy = tf.distribute.get_strategy()
    self.model, self.optimizer, self.global_step = model, optimizer, global_step
    self.train_loss = tf_keras.metrics.Mean("loss")
    super().__init__(dataset)

  def train_loop_begin(self):
    self.train_loss.reset_state()

  def train_step(self, iterator):
    def step_fn(inputs):
      x, y = inputs
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf_keras.losses.binary_crossentropy(
            y, self.model(x, training=True), from_logits=True))
      grads = tape.gradient(loss, self.model.trainable_variables)
      self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
      self.train_loss.update_state(loss)

    self.strategy.run(step_fn, args=(next(iterator),))
    self.global_step.assign_add(1)

  def train_loop_end(self):
    return {"loss": self.train_loss.result()}


class LinearEvaluator(orbit.StandardEvaluator):

  def __init__(self, model, dataset):
    self.strategy = tf.distribute.get_strategy()
    self.model = model
    self.metrics = [tf_keras.metrics.BinaryAccuracy("accuracy", threshold=0.0),
                    tf_keras.metrics.Mean("loss")]
    super().__init__(dataset)

  def eval_begin(self):
    for metric in self.metrics:
      metric.reset_state()

  def eval_step(self, iterator):
    def step_fn(inputs):
      x, y = inputs
      logits = self.model(x, training=False)
      self.metrics[0].update_state(y, logits)
      self.metrics[1].update_state(
          tf_keras.losses.binary_crossentropy(y, logits, from_logits=True))

    self.strategy.run(step_fn, args=(next(iterator),))

  def eval_end(self):
    return {m.name: m.result() for m in self.metrics}


def linear_parts():
  model = tf_keras.Sequential([tf_keras.layers.Dense(8, activation="relu"),
                               tf_keras.layers.Dense(1)])
  model.build((None, 4))
  optimizer = tf_keras.optimizers.Adam(0.05)
  step = orbit.utils.create_global_step()
  x, y = separable(2048, seed=0)
  train = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
  return model, optimizer, step, LinearTrainer(model, optimizer, step, train)


def plain_factory(context):
  """A user experiment: the plain classes above, nothing PS-specific."""
  model, optimizer, step, trainer = linear_parts()
  ex, ey = separable(500, seed=1)
  evaluator = LinearEvaluator(model, tf.data.Dataset.from_tensor_slices((ex, ey)).batch(64))
  from tfps.coordinator import experiment
  return experiment.Experiment(trainer=trainer, evaluator=evaluator,
                               checkpoint_items={"model": model, "optimizer": optimizer},
                               global_step=step)
