"""Input pipelines on the workers: per-worker training datasets, eval shards.

An experiment's dataset may be given in either of two forms:

* a `dataset_fn(input_context) -> tf.data.Dataset` (recommended): called on
  each worker with a `tf.distribute.InputContext` whose
  `num_input_pipelines`/`input_pipeline_id` say which part of the data to
  produce (the id is a scalar int64 tensor, fine for `Dataset.shard`,
  `Dataset.range` or seeds). Only that part is ever computed.
* a `tf.data.Dataset` built on the chief, as a single-machine trainer has it:
  its graph is shipped to the workers, which split it by element
  (`shard(n, i)` over batches). Every worker then runs the whole pipeline and
  keeps its share, which is exact but costs input work.

A `DistributedDataset` (e.g. from `orbit.utils.make_distributed_dataset`) is
passed to `create_per_worker_dataset` unchanged for training: TensorFlow gives
its function one input pipeline per worker, so it is not split by worker.
"""

import inspect
from typing import Any, Callable

from absl import logging
import tensorflow as tf

from tfps.base import errors
from tfps.fast_restart import worker_functions

# tf.data's ExternalStatePolicy: refuse datasets whose graph cannot be shipped
# (py_function, from_generator); they could only run on the chief.
_FAIL_ON_EXTERNAL_STATE = 2


def _is_distributed(dataset: Any) -> bool:
  return isinstance(dataset, tf.distribute.DistributedDataset)


def _takes_input_context(fn: Callable[..., Any]) -> bool:
  try:
    return bool(inspect.signature(fn).parameters)
  except (TypeError, ValueError):
    return True


takes_input_context = _takes_input_context  # Public for the chief (error classification).


def _graph_for_workers(dataset: tf.data.Dataset, *, what: str, instead: str) -> tf.Tensor:
  """`dataset` as a graph another process can rebuild; Python state is a UsageError."""
  try:
    return tf.raw_ops.DatasetToGraphV2(
        input_dataset=tf.data.experimental.to_variant(dataset),
        external_state_policy=_FAIL_ON_EXTERNAL_STATE,
        strip_device_assignment=True)
  except tf.errors.FailedPreconditionError as e:
    raise errors.UsageError(
        f"{what}: this dataset cannot run on the workers (it uses Python state such as "
        f"from_generator or py_function); {instead}") from e


def check_runs_on_workers(dataset: tf.data.Dataset, *, what: str) -> None:
  """UsageError if a dataset built by a dataset_fn holds Python state (see above)."""
  _graph_for_workers(dataset, what=what, instead=(
      "build it from files or tensors (TFRecordDataset, from_tensor_slices, range) "
      "in the dataset_fn"))


class ShippedDataset:
  """A chief-side `tf.data.Dataset` serialized so that workers can rebuild it."""

  def __init__(self, dataset: tf.data.Dataset, *, what: str):
    self._graph = _graph_for_workers(dataset, what=what, instead="pass a dataset_fn instead")
    self._spec = dataset.element_spec

  def rebuild(self) -> tf.data.Dataset:
    return tf.data.experimental.from_variant(
        tf.raw_ops.DatasetFromGraph(graph_def=self._graph), structure=self._spec)


def _check_dataset(dataset: Any, *, what: str) -> None:
  if isinstance(dataset, tf.data.Dataset) or callable(dataset):
    return
  raise errors.UsageError(
      f"{what}: expected a tf.data.Dataset or a dataset_fn(input_context), "
      f"got {type(dataset).__name__}")


def per_worker_dataset(coordinator, dataset: Any, *, num_workers: int,
                       num_replicas_in_sync: int = 1, what: str = "train_dataset"):
  """Creates `dataset` on every worker, each worker reading its own part.

  Args:
    coordinator: the `ClusterCoordinator`.
    dataset: a `dataset_fn(input_context)`, a `tf.data.Dataset` or a
      `DistributedDataset` (see the module docstring).
    num_workers: number of workers; worker i reads part i of `num_workers`.
    num_replicas_in_sync: passed on in the input context.
    what: names the dataset in errors.

  Returns:
    The per-worker dataset; `iter()` of it is a per-worker iterator to pass to
    `coordinator.schedule`. A worker that restarts rebuilds its dataset from
    the beginning (TensorFlow's behaviour), so its part restarts at element 0.
  """
  if _is_distributed(dataset):
    logging.warning(
        "%s is a DistributedDataset: every worker reads the same input pipeline "
        "(not split by worker); pass a dataset_fn(input_context) to split it", what)
    return coordinator.create_per_worker_dataset(dataset)
  _check_dataset(dataset, what=what)

  if isinstance(dataset, tf.data.Dataset):
    shipped = ShippedDataset(dataset, what=what)

    def dataset_fn():
      index = tf.distribute.coordinator.experimental_get_current_worker_index()
      return shipped.rebuild().shard(num_workers, index)
  else:
    user_fn = dataset

    def dataset_fn():
      index = tf.distribute.coordinator.experimental_get_current_worker_index()
      if not _takes_input_context(user_fn):
        return user_fn().shard(num_workers, index)
      return user_fn(tf.distribute.InputContext(
          num_input_pipelines=num_workers, input_pipeline_id=index,
          num_replicas_in_sync=num_replicas_in_sync))

  dataset_fn.__name__ = worker_functions.traced("dataset_fn")  # A worker's graph cache key.
  return coordinator.create_per_worker_dataset(dataset_fn)


class EvalShards:
  """Splits a finite eval dataset into `num_shards` disjoint parts.

  `build(shard_index, num_batches)` is meant to be called *inside* a
  `tf.function` that runs on a worker, so that each shard's iterator lives
  and dies with its closure. Together the shards cover every batch of the
  dataset exactly once.
  """

  def __init__(self, dataset: Any, num_shards: int, *,
               num_replicas_in_sync: int = 1, what: str = "eval_dataset"):
    if _is_distributed(dataset):
      raise errors.UsageError(
          f"{what}: a DistributedDataset cannot be split for exact evaluation; "
          "pass a tf.data.Dataset or a dataset_fn(input_context)")
    _check_dataset(dataset, what=what)
    self.num_shards = num_shards
    self._num_replicas_in_sync = num_replicas_in_sync
    self._what = what
    self._shipped = None
    self._fn = None
    if isinstance(dataset, tf.data.Dataset):
      _check_finite(dataset, what=what)
      self._shipped = ShippedDataset(dataset, what=what)
    else:
      self._fn = dataset
      if _takes_input_context(dataset):
        _check_finite(dataset(tf.distribute.InputContext()), what=what)
      else:
        _check_finite(dataset(), what=what)

  def build(self, shard_index: tf.Tensor) -> tf.data.Dataset:
    """The dataset of shard `shard_index` (an int64 scalar tensor)."""
    if self._shipped is not None:
      return self._shipped.rebuild().shard(self.num_shards, shard_index)
    if not _takes_input_context(self._fn):
      return self._fn().shard(self.num_shards, shard_index)
    return self._fn(tf.distribute.InputContext(
        num_input_pipelines=self.num_shards, input_pipeline_id=shard_index,
        num_replicas_in_sync=self._num_replicas_in_sync))


def split_steps(num_steps: int, num_shards: int) -> list[int]:
  """Batches per shard when an eval is limited to `num_steps` batches in total."""
  base, extra = divmod(num_steps, num_shards)
  return [base + (1 if i < extra else 0) for i in range(num_shards)]


def _check_finite(dataset: tf.data.Dataset, *, what: str) -> None:
  if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
    raise errors.UsageError(
        f"{what}: the eval dataset is infinite (repeat()?); exact evaluation "
        "reads every element once, so it must end")
