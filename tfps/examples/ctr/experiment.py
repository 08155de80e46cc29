"""The built-in `ctr` experiment: click-through-rate prediction on synthetic data.

A model typical of parameter-server training, and the reference for writing
your own experiment (`factory` at the bottom is all the chief needs):

* several categorical features with large vocabularies, embedded by one
  tf_keras `Embedding` table (each feature its own rows); a table above the
  partitioner's size is a `ShardedVariable` split across the ps tasks;
* dense features; an MLP over [embeddings, dense] with its weights in one
  variable, on the same ps as the table; binary cross-entropy; Adagrad with
  fused update kernels;
* a train step that reads the rows it needs and the MLP's weights in one
  transfer from their ps, and sends all their gradients back in one
  (`coordinator.pull_push`);
* an ordinary Orbit `StandardTrainer` and `StandardEvaluator` (AUC, loss),
  written as for one machine: the runtime makes them parameter-server aware.

A batch of examples is one dict: `cat` (int64 [n, features], a categorical
id per feature), `dense` (float32 [n, num_dense]) and `label` (int64 [n, 1],
1 for a click), as a parsed `tf.train.Example` is; the model reads `cat` and
`dense`, the steps take the label from the same dict.

Data is synthetic and deterministic: example `i` of a split is a pure
function of `(seed, split, i)` (integer hashing, no random state). Labels come
from a hidden "true" model: a weight per categorical id plus a linear function
of the dense features, through a sigmoid. Ids are skewed toward small values
(a few frequent ids, a long tail), as in real click logs. The best possible
AUC (the true model's own) is about 0.845; dense features alone give about
0.74; the click rate is about 35%.

Training reads files, as a real CTR pipeline does: the first `train_examples`
examples of the training split are written once as sharded TFRecord files of
`tf.train.Example`s, each a block of `examples_per_record` examples, into
`data_dir` (`tfps.examples.ctr.data`: reused by every run with the same
settings, written atomically) and read one epoch at a time, shard `s` of `S`
a contiguous run of whole batches read from only its own files. The runtime
positions that finite input itself (every example trained on once per epoch,
through faults; `tfps.input.positioned`).
The workers open the files by the paths the chief wrote them to: on several
machines, `data_dir` must be on storage they all see at that path.
Evaluation reads the held-out split in-graph: it is small, it is split
exactly by index (every eval shard computes only its own examples), and it
has no position to keep, so files would add nothing but a second copy.

Settings (`ExperimentContext.params`, all optional): `vocab_sizes`
(colon-separated, default 60000:30000:20000:10000:5000 = 125k rows),
`embedding_dim` (16), `num_dense` (8), `hidden` (64:32), `learning_rate`
(0.05, Adagrad), `eval_examples` (16384), `train_examples` (1048576: an
epoch of 2048 steps of 512), `examples_per_record` (16; the set uses the
largest divisor of `train_examples` up to it), `records_per_file` (1024, so
16384 examples a file), `data_dir` (where
the training files go, shared by runs and users; default `<model_dir>/data`).
"""

import math
import os

import orbit
import tensorflow as tf
import tf_keras

from tfps.examples.ctr import config as ctr_config
from tfps.examples.ctr import data as ctr_data
from tfps.coordinator import experiment as experiment_lib
from tfps.coordinator import pull_push
from tfps.base import errors

_MASK32 = 0xFFFFFFFF
_TRAIN, _EVAL = 1, 2
_SKEW = 3.0  # id = floor(vocab * u**_SKEW): most traffic on a few ids.
_CAT_SCALE, _DENSE_SCALE, _BIAS = 1.0, 0.7, -1.0
# The settings, TensorFlow-free (the command line checks them before starting).
CtrConfig = ctr_config.CtrConfig


# Synthetic data ------------------------------------------------------------

@tf.autograph.experimental.do_not_convert  # Python loops only: no AutoGraph.
def _mix(x: tf.Tensor) -> tf.Tensor:
  """A 32-bit integer hash (int64 arithmetic, values kept below 2**32)."""
  for _ in range(2):
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))
    x = tf.bitwise.bitwise_and(x * 0x45D9F3B, _MASK32)
  return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))


@tf.autograph.experimental.do_not_convert
def _uniform(*keys) -> tf.Tensor:
  """A deterministic uniform in (0, 1) for each combination of integer keys."""
  h = tf.constant(0x9E3779B9, tf.int64)
  for key in keys:
    key = tf.bitwise.bitwise_and(tf.cast(key, tf.int64), _MASK32)
    h = _mix(tf.bitwise.bitwise_xor(h, key))
  return tf.cast((tf.cast(h, tf.float64) + 0.5) / 2.0**32, tf.float32)


@tf.autograph.experimental.do_not_convert
def _normal(*keys) -> tf.Tensor:
  u1, u2 = _uniform(*keys, 0), _uniform(*keys, 1)
  return tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(2.0 * math.pi * u2)


@tf.autograph.experimental.do_not_convert
def make_examples(index: tf.Tensor, config: CtrConfig, seed: int, split: int) -> dict:
  """Examples `index` (int64 vector) of a split, as one dict (see the module docstring).

  Vectorized over features and dense dimensions: the graph stays small, so a
  dataset that maps it is quick to trace (every worker and eval shard does).
  """
  row = index[:, tf.newaxis]
  feature = tf.range(len(config.vocab_sizes), dtype=tf.int64)[tf.newaxis, :]
  vocab = tf.constant(config.vocab_sizes, tf.int64)
  u = _uniform(seed, split, row, 10, feature)
  ids = tf.minimum(tf.cast(tf.cast(vocab, tf.float32) * tf.pow(u, _SKEW), tf.int64), vocab - 1)
  true_weights = _CAT_SCALE * (2.0 * _uniform(seed, 77, feature, ids) - 1.0)
  dim = tf.range(config.num_dense, dtype=tf.int64)
  dense = _normal(seed, split, row, 20, dim[tf.newaxis, :])
  dense_weights = 2.0 * _uniform(seed, 88, dim) - 1.0
  logit = (_BIAS + tf.reduce_sum(true_weights, axis=1)
           + _DENSE_SCALE * tf.linalg.matvec(dense, dense_weights))
  label = tf.cast(_uniform(seed, split, index, 30) < tf.sigmoid(logit), tf.int64)
  return {"cat": ids, "dense": dense, "label": label[:, tf.newaxis]}


def train_files(config: CtrConfig, seed: int, data_dir: str) -> ctr_data.TrainFiles:
  """The training split's first `train_examples` examples as TFRecord files in `data_dir`.

  Written on the first call for these settings (a line in the log says how
  long it took), found on every later one, in this process or another.
  """
  settings = ctr_data.DataSettings(
      seed=seed, vocab_sizes=config.vocab_sizes, num_dense=config.num_dense,
      num_examples=config.train_examples,
      # Whole blocks only: the largest block size up to the setting that divides the data.
      examples_per_record=math.gcd(config.examples_per_record, config.train_examples),
      records_per_file=config.records_per_file)
  # One traced function for every file: half the time of running it eagerly.
  examples = tf.function(lambda index: make_examples(index, config, seed, _TRAIN),
                         input_signature=[tf.TensorSpec([None], tf.int64)])
  return ctr_data.ensure_files(data_dir, settings, examples)


def train_dataset_fn(config: CtrConfig, seed: int, batch_size: int, *, data_dir: str):
  """dataset_fn(input_context): one epoch of the training files, shard i of n.

  Shard i is a contiguous run of whole batches (`ctr_data.TrainFiles`); the
  runtime hands out its chunks and keeps its position. A per-worker pattern
  reads `dataset_fn(InputContext(num_workers, worker)).repeat()`.
  """
  return train_files(config, seed, data_dir).dataset_fn(batch_size)


def eval_dataset_fn(config: CtrConfig, seed: int, batch_size: int):
  """dataset_fn(input_context): the fixed held-out set, part i of n."""

  def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    start = tf.cast(input_context.input_pipeline_id, tf.int64)
    step = tf.cast(input_context.num_input_pipelines, tf.int64)
    return (tf.data.Dataset.range(start, config.eval_examples, step)
            .batch(batch_size)
            .map(lambda i: make_examples(i, config, seed, _EVAL)))

  return dataset_fn


# Model, trainer, evaluator ---------------------------------------------------

class PackedMLP(tf_keras.layers.Layer):
  """An MLP (ReLU hidden layers, linear output) whose weights are one variable.

  The same computation as a stack of `Dense` layers (Glorot-uniform kernels,
  zero biases), but all kernels and biases live in one flat variable: under
  parameter servers a step reads it in one transfer and updates it with one
  optimizer op, instead of one of each per kernel and per bias.
  """

  def __init__(self, input_dim: int, units: tuple[int, ...], seed: int, **kwargs):
    super().__init__(**kwargs)
    dims = (input_dim, *units)
    self._shapes = [(dims[i], dims[i + 1]) for i in range(len(units))]
    self._seed = seed
    size = sum(n_in * n_out + n_out for n_in, n_out in self._shapes)
    self.packed = self.add_weight(name="packed", shape=(size,), initializer=self._initial)

  def _initial(self, shape, dtype=None):
    parts = []
    for i, (n_in, n_out) in enumerate(self._shapes):
      kernel = tf_keras.initializers.GlorotUniform(seed=self._seed + i)((n_in, n_out), dtype)
      parts += [tf.reshape(kernel, [-1]), tf.zeros([n_out], dtype)]
    return tf.concat(parts, axis=0)

  def call(self, x):
    return self.apply_weights(x, tf.convert_to_tensor(self.packed))  # One read of every weight.

  def apply_weights(self, x, packed: tf.Tensor):
    """The MLP on `x` with the given value of `packed` (e.g. one pulled from its ps)."""
    offset = 0
    for i, (n_in, n_out) in enumerate(self._shapes):
      kernel = tf.reshape(packed[offset:offset + n_in * n_out], (n_in, n_out))
      offset += n_in * n_out
      bias = packed[offset:offset + n_out]
      offset += n_out
      x = tf.matmul(x, kernel) + bias
      if i < len(self._shapes) - 1:
        x = tf.nn.relu(x)
    return x


class CtrModel(tf_keras.Model):
  """Embeddings of the categorical features + dense features -> MLP -> click logit.

  Every categorical feature has its own rows, but all features share one
  tf_keras `Embedding` table (feature f's ids are offset by the vocabularies
  before it), and the MLP's weights are one variable (`PackedMLP`). The model
  is the usual one-table-per-feature CTR model; the packing only means that a
  step does one lookup and one sparse update (per shard) and one dense read
  and update, whatever the number of features and layers: on parameter
  servers each of those is a remote operation, every step.

  The MLP's variable is placed with the table (its first shard, if split),
  so that a train step's `pull_push.pull` fetches both in one transfer.
  `call` reads the variables the ordinary way (evaluation, serving).
  """

  def __init__(self, config: CtrConfig, seed: int):
    super().__init__(name="ctr")
    self._num_features = len(config.vocab_sizes)
    self._dim = config.embedding_dim
    starts = [0]
    for vocab in config.vocab_sizes[:-1]:
      starts.append(starts[-1] + vocab)
    self._offsets = tf.constant(starts, tf.int64)
    self.embedding = tf_keras.layers.Embedding(
        sum(config.vocab_sizes), config.embedding_dim,
        embeddings_initializer=tf_keras.initializers.RandomUniform(-0.05, 0.05, seed=seed),
        name="embeddings")
    self.embedding.build((None,))  # The table first: the MLP goes where it is.
    with tf.distribute.get_strategy().extended.colocate_vars_with(self.table_home):
      self.mlp = PackedMLP(self._num_features * config.embedding_dim + config.num_dense,
                           (*config.hidden, 1), seed=seed + 100, name="mlp")

  @property
  def table(self):
    """The embedding table (a `ShardedVariable` if it was split over the ps)."""
    return self.embedding.embeddings

  @property
  def table_home(self) -> tf.Variable:
    """The table's variable to place others with: the table, or its first shard."""
    return pull_push.first_shard(self.table)

  def ids(self, features) -> tf.Tensor:
    """Every feature's row in the shared table: [batch, features]."""
    return tf.cast(features["cat"], tf.int64) + self._offsets

  def logits(self, rows, mlp_weights, features) -> tf.Tensor:
    """The click logit from looked-up rows [batch, features, dim] and the MLP's weights."""
    x = tf.concat([tf.reshape(rows, [-1, self._num_features * self._dim]),
                   features["dense"]], axis=1)
    return self.mlp.apply_weights(x, mlp_weights)

  def call(self, features, training=False):
    return self.logits(self.embedding(self.ids(features)),
                       tf.convert_to_tensor(self.mlp.packed), features)


class FusedAdagrad(pull_push.DeduplicateOnDevice, tf_keras.optimizers.Adagrad):
  """tf_keras's Adagrad, each update one fused kernel on the variable's device.

  Same state (one accumulator per variable, so checkpoints are
  interchangeable with `tf_keras.optimizers.Adagrad`) and the same rule up to
  where epsilon sits (`lr * g / (sqrt(acc) + eps)` instead of
  `/ sqrt(acc + eps)`, eps = 1e-7). tf_keras builds each update from five to
  seven small ops; on a parameter server every one of them is a separately
  scheduled op on the ps, every step. `ResourceSparseApplyAdagradV2` and
  `ResourceApplyAdagradV2` do the whole update in one. The learning rate is a
  constant here (no ps read per variable per step). Sparse gradients are
  deduplicated on the variable's device, if at all (`DeduplicateOnDevice`).
  """

  def __init__(self, learning_rate: float, **kwargs):
    super().__init__(learning_rate, **kwargs)
    self._constant_lr = float(learning_rate)

  def update_step(self, grad, variable):
    accumulator = self._accumulators[self._index_dict[self._var_key(variable)]]
    lr = tf.constant(self._constant_lr, variable.dtype)
    epsilon = tf.constant(self.epsilon, variable.dtype)
    if isinstance(grad, tf.IndexedSlices):
      tf.raw_ops.ResourceSparseApplyAdagradV2(
          var=variable.handle, accum=accumulator.handle, lr=lr, epsilon=epsilon,
          grad=grad.values, indices=grad.indices)
    else:
      tf.raw_ops.ResourceApplyAdagradV2(
          var=variable.handle, accum=accumulator.handle, lr=lr, epsilon=epsilon, grad=grad)


def _labels(example) -> tf.Tensor:
  """An example's clicks as float [batch, 1]."""
  return tf.cast(example["label"], tf.float32)


def _loss(labels, logits):
  return tf_keras.losses.binary_crossentropy(labels, logits, from_logits=True)


class CtrTrainer(orbit.StandardTrainer):
  """A plain single-machine Orbit trainer; the runtime schedules it on workers.

  A step pulls the rows of its ids and the MLP's weights from their ps in one
  transfer and pushes their gradients back in one (`coordinator.pull_push`;
  on one machine the same code reads local variables). The same values and
  updates as reading the variables inside the tape, in 3 transfers per step
  instead of 6 (docs/benchmarks.md).

  `train_step` returns the step's logs (`{"loss": ...}`) instead of updating
  a loss metric: under parameter servers a metric's total and count are two
  variables on a ps, written every step (docs/benchmarks.md measures the
  cost), while `PSTrainer` sums returned logs inside each
  closure and reports their mean per loop. Run by plain Orbit, the logs are
  dropped (Orbit's loop ignores what `train_step` returns). The step counter
  is the optimizer's own `iterations` (see `factory`), so no separate
  counter is written per step either.
  """

  def __init__(self, model, optimizer, train_dataset):
    self.strategy = tf.distribute.get_strategy()
    self.model = model
    self.optimizer = optimizer
    self.global_step = optimizer.iterations  # Counted by apply_gradients.
    super().__init__(train_dataset)

  def train_step(self, iterator):
    model = self.model
    # One replica per worker: nothing to aggregate, and tf_keras's aggregation
    # can copy the gradients to the worker and back (see pull_push).
    skip_aggregation = self.strategy.num_replicas_in_sync == 1

    def step_fn(example):
      labels = _labels(example)
      pulled = pull_push.pull(tables=[(model.table, model.ids(example))],
                              dense=[model.mlp.packed])
      with tf.GradientTape() as tape:
        tape.watch(pulled.values)
        (rows,), (mlp_weights,) = pulled.lookups(), pulled.dense()
        loss = tf.reduce_mean(_loss(labels, model.logits(rows, mlp_weights, example)))
      self.optimizer.apply_gradients(pulled.gradients(tape.gradient(loss, pulled.values)),
                                     skip_gradients_aggregation=skip_aggregation)
      return loss

    return {"loss": self.strategy.run(step_fn, args=(next(iterator),))}


class CtrEvaluator(orbit.StandardEvaluator):
  """A plain single-machine Orbit evaluator: AUC and loss on the held-out set."""

  def __init__(self, model, eval_dataset):
    self.strategy = tf.distribute.get_strategy()
    self.model = model
    self.auc = tf_keras.metrics.AUC(name="auc", num_thresholds=1000)
    self.loss = tf_keras.metrics.Mean("loss")
    super().__init__(eval_dataset)

  def eval_begin(self):
    self.auc.reset_state()
    self.loss.reset_state()

  def eval_step(self, iterator):
    def step_fn(example):
      labels = _labels(example)
      logits = self.model(example, training=False)
      self.auc.update_state(labels, tf.sigmoid(logits))
      self.loss.update_state(_loss(labels, logits))

    self.strategy.run(step_fn, args=(next(iterator),))

  def eval_end(self):
    return {"auc": self.auc.result(), "loss": self.loss.result()}


def build_model(config: CtrConfig, seed: int) -> CtrModel:
  """The model with its variables created (call inside the strategy's scope)."""
  model = CtrModel(config, seed)
  model(make_examples(tf.range(2, dtype=tf.int64), config, seed, _TRAIN))
  return model


def training_data_dir(config: CtrConfig, model_dir: str) -> str:
  """Where the training files go: `data_dir`, else `<model_dir>/data`.

  A local path is made absolute here: the workers read the files by the
  paths the chief puts in the input's graph, from their own working directory.
  """
  path = config.data_dir or (model_dir and os.path.join(model_dir, "data"))
  if not path:
    raise errors.UsageError("ctr data_dir ('') must be set when there is no model_dir")
  return path if "://" in path else os.path.abspath(path)


def factory(context: experiment_lib.ExperimentContext) -> experiment_lib.Experiment:
  """The `ctr` experiment (called by the chief inside the strategy's scope)."""
  config = CtrConfig.from_params(context.params)
  model = build_model(config, context.seed)
  # Adagrad touches only the embedding rows of a batch (Adam decays every row
  # of every table each step: several times slower, docs/benchmarks.md). A tiny initial accumulator
  # lets rare ids move from their first update on. Its step counter goes
  # with the table too (its slots always go with their variables), so that a
  # step touches one ps.
  with context.strategy.extended.colocate_vars_with(model.table_home):
    optimizer = FusedAdagrad(config.learning_rate, initial_accumulator_value=1e-6)
  optimizer.build(model.trainable_variables)  # Slots exist before a restore.
  # The optimizer counts its updates, one per step: that counter is the
  # global step (a second counter would be one more ps write per step).
  global_step = optimizer.iterations
  batch = context.global_batch_size
  return experiment_lib.Experiment(
      trainer=CtrTrainer(model, optimizer,
                         train_dataset_fn(config, context.seed, batch,
                                          data_dir=training_data_dir(config, context.model_dir))),
      evaluator=CtrEvaluator(model, eval_dataset_fn(config, context.seed, batch)),
      checkpoint_items={"model": model, "optimizer": optimizer},
      global_step=global_step)
