"""Experiments written the way TensorFlow's and Orbit's own guides write them.

Users bring trainers written for one machine. These are two such, kept as
their guides write them, for the recovery tests and measurements (loaded by
a real chief as `--experiment=user_experiments:NAME`, this directory on
PYTHONPATH):

* `tutorial`: TensorFlow's parameter-server tutorial (its custom training
  loop): string features mapped to ids by `StringLookup` preprocessing
  models inside the `dataset_fn`, an endless `repeat()`ed and shuffled
  dataset, an `Embedding` of 16384 columns averaged into one sigmoid unit,
  RMSprop, an `Accuracy` metric updated every step; wrapped as the Orbit
  `StandardTrainer` a user would write around the tutorial's `step_fn`.
* `single_task`: Orbit's own `SingleTaskTrainer`, unmodified, on a dict
  dataset (finite: one epoch, positioned by tfps; `repeat=1` makes it endless).
* `files`: the same on TFRecord files, in TensorFlow's form for files
  (`list_files(...).shard(n, i).interleave(TFRecordDataset)`, batched, parsed).

Settings (`--experiment_params`): `examples` (the tutorial: 200),
`embedding_dim` (16384), `batch` (per step; default the global batch size),
`repeat` (single_task: 0).
"""

import os
import random

import orbit
from orbit.examples.single_task import single_task_trainer
import tensorflow as tf
import tf_keras

from tfps import Experiment

FEATURE_VOCAB = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong",
                 "wonder_woman"]
LABEL_VOCAB = ["yes", "no"]


def _examples(count: int, seed: int) -> dict:
  """The tutorial's `feature_and_label_gen`: 3 features, `yes` if one is `avenger`."""
  rng = random.Random(seed)
  examples = {"features": [], "label": []}
  for _ in range(count):
    features = rng.sample(FEATURE_VOCAB, 3)
    examples["features"].append(features)
    examples["label"].append(["yes"] if "avenger" in features else ["no"])
  return examples


class TutorialTrainer(orbit.StandardTrainer):
  """The tutorial's `step_fn` as an Orbit trainer (one replica per worker)."""

  def __init__(self, model, optimizer, accuracy, global_step, dataset_fn):
    self.strategy = tf.distribute.get_strategy()
    self.model, self.optimizer, self.accuracy = model, optimizer, accuracy
    self.global_step = global_step
    self.loss = tf_keras.losses.BinaryCrossentropy(reduction=tf_keras.losses.Reduction.NONE)
    super().__init__(dataset_fn)

  def train_loop_begin(self):
    self.accuracy.reset_state()

  def train_step(self, iterator):
    def replica_fn(batch_data, labels):
      with tf.GradientTape() as tape:
        pred = self.model(batch_data, training=True)
        per_example_loss = self.loss(labels, pred)
        loss = tf.nn.compute_average_loss(per_example_loss)
      gradients = tape.gradient(loss, self.model.trainable_variables)
      self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables))
      actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
      self.accuracy.update_state(labels, actual_pred)
      return loss

    batch_data, labels = next(iterator)
    losses = self.strategy.run(replica_fn, args=(batch_data, labels))
    self.global_step.assign_add(1)
    return {"loss": self.strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)}

  def train_loop_end(self):
    return {"accuracy": self.accuracy.result()}


def tutorial(context):
  params = context.params
  examples = _examples(int(params.get("examples", 200)), context.seed)
  batch = int(params.get("batch", context.global_batch_size))
  # As the tutorial: preprocessing models built in the strategy's scope (the
  # factory runs in it), applied in the dataset_fn.
  feature_lookup = tf_keras.layers.StringLookup(vocabulary=FEATURE_VOCAB, mask_token=None)
  label_lookup = tf_keras.layers.StringLookup(vocabulary=LABEL_VOCAB, num_oov_indices=0,
                                              mask_token=None)
  raw_features = tf_keras.layers.Input(shape=(3,), dtype=tf.string, name="features")
  feature_stage = tf_keras.Model({"features": raw_features}, feature_lookup(raw_features))
  raw_labels = tf_keras.layers.Input(shape=(1,), dtype=tf.string, name="label")
  label_stage = tf_keras.Model({"label": raw_labels}, label_lookup(raw_labels))

  def dataset_fn(_):
    raw = tf.data.Dataset.from_tensor_slices(examples)
    return raw.map(lambda x: ({"features": feature_stage(x["features"])},
                              label_stage(x["label"]))).shuffle(200).batch(batch).repeat()

  model_input = tf_keras.layers.Input(shape=(3,), dtype=tf.int64, name="model_input")
  embedding = tf_keras.layers.Embedding(input_dim=len(feature_lookup.get_vocabulary()),
                                        output_dim=int(params.get("embedding_dim", 16384)))
  pooled = tf.reduce_mean(embedding(model_input), axis=1)
  model = tf_keras.Model({"features": model_input},
                         tf_keras.layers.Dense(units=1, activation="sigmoid")(pooled))
  optimizer = tf_keras.optimizers.RMSprop(learning_rate=0.1)
  accuracy = tf_keras.metrics.Accuracy()
  step = orbit.utils.create_global_step()
  return Experiment(trainer=TutorialTrainer(model, optimizer, accuracy, step, dataset_fn),
                    evaluator=None,
                    checkpoint_items={"model": model, "optimizer": optimizer},
                    global_step=step)


def _single_task_data(count: int, seed: int):
  rng = tf.random.Generator.from_seed(seed)
  x = rng.normal([count, 8])
  return x, tf.cast(tf.reduce_sum(x[:, :4], axis=1, keepdims=True) > 0, tf.float32)


def single_task(context):
  params = context.params
  batch = int(params.get("batch", context.global_batch_size))
  x, y = _single_task_data(int(params.get("examples", 4096)), context.seed)
  dataset = tf.data.Dataset.from_tensor_slices({"x": x, "label": y}).batch(batch)
  if int(params.get("repeat", 0)):
    dataset = dataset.repeat()
  return _single_task_experiment(dataset)


def files(context):
  """`single_task` on TFRecord files, read in TensorFlow's form for files: the file names
  sharded, then an interleave of their records, batched and parsed (`data_dir`: where
  the files are written once; `files`: how many)."""
  params = context.params
  batch = int(params.get("batch", context.global_batch_size))
  directory = params.get("data_dir") or os.path.join(context.model_dir, "records")
  count, num_files = int(params.get("examples", 65536)), int(params.get("files", 16))
  if not tf.io.gfile.glob(os.path.join(directory, "*.tfrecord")):
    x, y = (t.numpy() for t in _single_task_data(count, context.seed))
    tf.io.gfile.makedirs(directory)
    per_file = -(-count // num_files)
    for f in range(num_files):
      with tf.io.TFRecordWriter(os.path.join(directory, f"part-{f:03d}.tfrecord")) as writer:
        for i in range(f * per_file, min(count, (f + 1) * per_file)):
          writer.write(tf.train.Example(features=tf.train.Features(feature={
              "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i])),
              "label": tf.train.Feature(float_list=tf.train.FloatList(value=y[i])),
          })).SerializeToString())
  features = {"x": tf.io.FixedLenFeature([8], tf.float32),
              "label": tf.io.FixedLenFeature([1], tf.float32)}
  repeat = int(params.get("repeat", 0))

  def dataset_fn(ctx):
    names = tf.data.Dataset.list_files(os.path.join(directory, "*.tfrecord"), shuffle=False)
    records = names.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).interleave(
        tf.data.TFRecordDataset, cycle_length=2)
    dataset = records.batch(batch).map(lambda r: tf.io.parse_example(r, features))
    return dataset.repeat() if repeat else dataset

  return _single_task_experiment(dataset_fn)


def _single_task_experiment(dataset):
  model = tf_keras.Sequential([tf_keras.layers.Dense(64, activation="relu"),
                               tf_keras.layers.Dense(1)])
  model.build((None, 8))

  class Features(tf_keras.Model):  # SingleTaskTrainer hands the model the whole dict.
    def __init__(self, inner):
      super().__init__()
      self.inner = inner

    def call(self, inputs, training=False):
      return self.inner(inputs["x"], training=training)

  optimizer = tf_keras.optimizers.Adam(0.01)
  trainer = single_task_trainer.SingleTaskTrainer(
      dataset, label_key="label", model=Features(model),
      loss_fn=tf_keras.losses.BinaryCrossentropy(from_logits=True,
                                                 reduction=tf_keras.losses.Reduction.NONE),
      optimizer=optimizer, metrics=[tf_keras.metrics.BinaryAccuracy(threshold=0.0)])
  return Experiment(trainer=trainer, evaluator=None,
                    checkpoint_items={"model": model, "optimizer": optimizer},
                    global_step=optimizer.iterations)
