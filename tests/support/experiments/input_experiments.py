"""Experiments that count what they train on, for the input-coverage tests.

Loaded by a real chief as `--experiment=input_experiments:counting` (this
directory on PYTHONPATH), or called in-process. `counting` trains on the ids
`0 .. examples-1` of a finite dataset in the documented
`dataset_fn(input_context)` form (one epoch, no repeat) and adds 1 to a
checkpointed `counts[id]` for every id of every batch: after a run, the
final checkpoint says how often each example was trained on. Settings
(`--experiment_params`): `examples` (default 4000), `wait_ms` (default
0: each step also waits this long on its worker, without CPU), `unknown_length` (default
0; 1: the ids filtered, so that tf.data does not know their length), `work` (default 0: a
[batch, work] x [work, batch] matmul per step on the worker, so that a
working worker uses CPU as a real one does), `eval_examples` (default 0: no
evaluator; else a `CountingEvaluator` over as many ids).
"""

import orbit
import tensorflow as tf
import tf_keras
# TensorFlow's own test transformation (no public alias in 2.20).
from tensorflow.python.data.experimental.ops import testing as tf_data_testing

from tfps import Experiment


class CountingTrainer(orbit.StandardTrainer):
  """A plain Orbit trainer whose step counts the ids of its batch."""

  def __init__(self, counts: tf.Variable, global_step: tf.Variable, dataset, work: int = 0,
               wait_ms: int = 0):
    self.strategy = tf.distribute.get_strategy()
    self.counts, self.global_step, self._work = counts, global_step, work
    self._wait_ms = wait_ms
    super().__init__(dataset)

  def train_step(self, iterator):
    ids = next(iterator)
    if self._wait_ms:  # A step that waits on its worker (as on a remote service), no CPU.
      waited = tf.data.Dataset.from_tensors(0).apply(
          tf_data_testing.sleep(self._wait_ms * 1000)).get_single_element()
      ids = ids + tf.cast(waited, ids.dtype)
    self.counts.scatter_add(tf.IndexedSlices(tf.ones_like(ids, tf.int32), ids))
    self.global_step.assign_add(1)
    logs = {"loss": tf.cast(tf.size(ids), tf.float32)}
    if self._work:
      x = tf.cast(ids[:, tf.newaxis], tf.float32) * tf.ones([1, self._work])
      logs["work"] = tf.reduce_mean(tf.matmul(x, x, transpose_b=True))
    return logs


class CountingEvaluator(orbit.StandardEvaluator):
  """Sums the ids it evaluates: how many, their sum and the sum of their squares.

  Nothing here reads the model, so every evaluation of the same batches gives
  the same three sums, on any number of workers; the whole set `0 .. n-1` once
  gives n, n(n-1)/2 and (n-1)n(2n-1)/6 (`id_sums`).
  """

  def __init__(self, dataset):
    self.sums = [tf_keras.metrics.Sum(name, dtype=tf.float64)
                 for name in ("seen", "id_sum", "id_square_sum")]
    super().__init__(dataset)

  def eval_step(self, iterator):
    ids = tf.cast(next(iterator), tf.float64)
    for metric, value in zip(self.sums, (tf.ones_like(ids), ids, ids * ids)):
      metric.update_state(tf.reduce_sum(value))

  def eval_end(self):
    return {metric.name: metric.result() for metric in self.sums}


def id_sums(examples: int) -> dict[str, float]:
  """What `CountingEvaluator` reports for every id of `0 .. examples-1` once."""
  n = examples
  return {"seen": n, "id_sum": n * (n - 1) / 2, "id_square_sum": (n - 1) * n * (2 * n - 1) / 6}


def dataset_fn_for(examples: int, batch_size: int, unknown_length: bool = False):
  """One epoch of ids, shard i of n strided so that building any shard is cheap.
  `unknown_length`: a filter that keeps every id hides its length from tf.data, as a
  file's records do (it is then counted)."""

  def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    ids = tf.data.Dataset.range(tf.cast(input_context.input_pipeline_id, tf.int64),
                                examples, tf.cast(input_context.num_input_pipelines, tf.int64))
    if unknown_length:
      ids = ids.filter(lambda i: i >= 0)
    return ids.batch(batch_size)

  return dataset_fn


def counting(context):
  examples = int(context.params.get("examples", 4000))
  counts = tf.Variable(tf.zeros([examples], tf.int32), name="counts")
  step = orbit.utils.create_global_step()
  # `wait_ms`: each step also waits this long on its worker (a worker-bound
  # model whose steps/s grow with the workers, even on few cores).
  unknown_length = bool(int(context.params.get("unknown_length", 0)))
  trainer = CountingTrainer(counts, step,
                            dataset_fn_for(examples, context.global_batch_size, unknown_length),
                            work=int(context.params.get("work", 0)),
                            wait_ms=int(context.params.get("wait_ms", 0)))
  # `eval_examples`: a CountingEvaluator over the ids 0 .. eval_examples-1.
  eval_examples = int(context.params.get("eval_examples", 0))
  evaluator = (CountingEvaluator(dataset_fn_for(eval_examples, context.global_batch_size))
               if eval_examples else None)
  return Experiment(trainer=trainer, evaluator=evaluator, checkpoint_items={"counts": counts},
                    global_step=step)


def counts_in(checkpoint_path: str):
  """The `counts` saved in a checkpoint, as a numpy array (no cluster needed)."""
  return tf.train.load_checkpoint(checkpoint_path).get_tensor("counts/.ATTRIBUTES/VARIABLE_VALUE")


def expected_counts(examples: int, batch_size: int, shard_lengths, chunks):
  """How often each id is in `chunks` ([shard, start, count, epoch]) of `dataset_fn_for`."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  shards = len(shard_lengths)
  expected = np.zeros([examples], np.int64)
  for shard, start, count, _ in chunks:
    ids = np.arange(shard, examples, shards)[start * batch_size:(start + count) * batch_size]
    expected[ids] += 1
  return expected
