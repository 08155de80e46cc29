"""Datasets per worker (tfps.input.datasets): split by worker on the in-process
cluster, and evaluation steps split over shards."""

import pytest
import tensorflow as tf

from tfps.input import datasets

from tests.support import inprocess

pytestmark = pytest.mark.tf


def test_split_eval_steps_over_shards():
  assert datasets.split_steps(10, 4) == [3, 3, 2, 2]
  assert datasets.split_steps(2, 4) == [1, 1, 0, 0]


@pytest.mark.parametrize("form", ["dataset", "dataset_fn"])
def test_per_worker_datasets_are_split_by_worker(runtime, form):
  if form == "dataset":
    data = tf.data.Dataset.range(1000)
  else:
    data = lambda ctx: tf.data.Dataset.range(1000).shard(ctx.num_input_pipelines,
                                                         ctx.input_pipeline_id)
  iterator = iter(datasets.per_worker_dataset(runtime.coordinator, data,
                                              num_workers=inprocess.NUM_WORKERS))

  @tf.function
  def take(iterator):
    return (tf.distribute.coordinator.experimental_get_current_worker_index(),
            next(iterator))

  results = [runtime.coordinator.schedule(take, args=(iterator,)) for _ in range(20)]
  runtime.coordinator.join()
  by_worker = {}
  for worker, value in (r.fetch() for r in results):
    assert value % inprocess.NUM_WORKERS == worker  # Worker w only ever sees part w.
    by_worker.setdefault(int(worker), []).append(int(value))
  for worker, values in by_worker.items():  # Each in order, from its first element.
    assert sorted(values) == list(range(worker, worker + inprocess.NUM_WORKERS * len(values), inprocess.NUM_WORKERS))
