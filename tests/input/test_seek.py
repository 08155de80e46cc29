"""Positioning a shard's dataset (tfps.input.seek): a positioned chunk yields exactly
the batches `dataset.skip(start)` yields, form by form, and the forms it cannot
position say what to write instead."""

import os

import pytest
import tensorflow as tf

from tfps.input import seek

pytestmark = pytest.mark.tf

N, B = 1003, 7  # Not a multiple of the batch or the shards: short last batches.


def _flat(dataset: tf.data.Dataset) -> tuple[tf.Tensor, tf.Tensor]:
  """Every id in order, and each element's size (the batches' bounds)."""
  def add(state, element):
    ids, sizes = state
    parts = [tf.reshape(tf.cast(x, tf.int64), [-1]) for x in tf.nest.flatten(element)]
    flat = tf.concat(parts, 0)
    return tf.concat([ids, flat], 0), tf.concat([sizes, [tf.size(flat, tf.int64)]], 0)
  empty = tf.zeros([0], tf.int64)
  return dataset.reduce((empty, empty), add)


FORMS = {
    "range.shard.batch": lambda n, i: tf.data.Dataset.range(N).shard(n, i).batch(B),
    "range(5,N,3).map.shard.batch(drop).map.prefetch": lambda n, i: tf.data.Dataset.range(
        5, N, 3).map(lambda x: x * 2).shard(n, i).batch(B, drop_remainder=True).map(
            lambda x: x + 1).prefetch(2),
    "slices(dict).shard.padded_batch": lambda n, i: tf.data.Dataset.from_tensor_slices(
        {"id": tf.range(N, dtype=tf.int64), "pair": tf.reshape(tf.range(2 * N, dtype=tf.int64),
                                                               [N, 2])}).shard(n, i)
        .padded_batch(B),
    "strided range.batch (no shard)": lambda n, i: tf.data.Dataset.range(i, N, n).batch(B),
    "range.shard.batch.batch": lambda n, i: tf.data.Dataset.range(N).shard(n, i).batch(
        3, drop_remainder=True).batch(2),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_a_positioned_chunk_yields_the_plain_skips_batches(form):
  make = FORMS[form]

  @tf.function
  def both(num_shards, shard, start):
    dataset = make(num_shards, shard)
    assert seek.plan_of(dataset).seekable  # Traced: the rewrite, not the fallback.
    return _flat(seek.skip(dataset, start)), _flat(dataset.skip(start))

  for num_shards in (1, 4):
    for shard in sorted({0, num_shards - 1}):
      batches = int(make(num_shards, shard).cardinality())
      for start in (0, 1, batches // 2, batches - 1, batches, batches + 3):
        (ids, sizes), (want_ids, want_sizes) = both(
            tf.constant(num_shards, tf.int64), tf.constant(shard, tf.int64),
            tf.constant(start, tf.int64))
        assert ids.numpy().tolist() == want_ids.numpy().tolist(), (num_shards, shard, start)
        assert sizes.numpy().tolist() == want_sizes.numpy().tolist(), (num_shards, shard, start)


def test_the_shard_is_read_without_the_other_shards():
  # 64 shards of a million ids: reading a chunk deep in a shard reads the chunk only.
  @tf.function
  def chunk_sum(start):
    dataset = tf.data.Dataset.range(64 * 10**6).shard(64, 5).batch(100)
    return seek.skip(dataset, start).take(2).reduce(tf.constant(0, tf.int64),
                                                   lambda n, b: n + tf.reduce_sum(b))
  # Batch 9000 of shard 5 holds ids 5 + 64 * (900000 .. 900099).
  want = sum(5 + 64 * k for k in range(900_000, 900_200))
  assert int(chunk_sum(tf.constant(9000, tf.int64))) == want


def _plan(make):
  plans = []

  @tf.function
  def build():
    plans.append(seek.plan_of(make()))
    return 0

  build()
  return plans[0]


def test_forms_read_through_say_what_to_write_instead(tmp_path):
  path = os.path.join(tmp_path, "r.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    writer.write(b"x")
  batch_then_shard = _plan(lambda: tf.data.Dataset.range(N).batch(B).shard(4, 1))
  assert not batch_then_shard.seekable and ".shard(n, i).batch(b)" in batch_then_shard.advice
  records = _plan(lambda: tf.data.TFRecordDataset([path]).shard(4, 1).batch(B))
  assert not records.seekable and "shard the file names" in records.advice
  files = _plan(lambda: tf.data.Dataset.from_tensor_slices([path]).shard(4, 1).interleave(
      tf.data.TFRecordDataset).batch(B))
  assert files.seekable  # Its skip reads the shard's own files' raw records.
  filtered = _plan(lambda: tf.data.Dataset.range(N).shard(4, 1).filter(lambda x: x > 3))
  assert not filtered.seekable and filtered.blocked_at == "FilterDataset"


def _write_records(directory, files: int, per_file: int) -> list[str]:
  paths = []
  for f in range(files):
    paths.append(os.path.join(directory, f"r{f}.tfrecord"))
    with tf.io.TFRecordWriter(paths[-1]) as writer:
      for i in range(per_file + f):  # Files of unequal lengths.
        writer.write(str(1000 * f + i).encode())
  return paths


def _to_id(record):
  return tf.strings.to_number(record, tf.int64)


def _low_forms(paths: list[str], text: str) -> dict:
  """Forms whose skip goes below their batches and maps (not a strided source)."""
  return {
      "files.shard.interleave(tfrecord).batch.map": lambda n, i: tf.data.Dataset
          .from_tensor_slices(paths).shard(n, i).interleave(
              tf.data.TFRecordDataset, cycle_length=2, block_length=3).batch(B).map(_to_id),
      "tfrecord(files).map.shard.batch.map": lambda n, i: tf.data.TFRecordDataset(paths)
          .map(_to_id).shard(n, i).batch(B).map(lambda x: x + 1),
      "text.shard.batch(drop).batch.map": lambda n, i: tf.data.TextLineDataset(text)
          .shard(n, i).batch(3, drop_remainder=True).batch(2).map(_to_id),
      "range.shard.filter.batch": lambda n, i: tf.data.Dataset.range(N).shard(n, i)
          .filter(lambda x: x % 3 > 0).batch(B),
  }


def test_a_skip_moved_below_the_batches_and_maps_yields_the_plain_skips_batches(tmp_path):
  paths = _write_records(tmp_path, files=5, per_file=60)
  text = os.path.join(tmp_path, "ids.csv")
  with open(text, "w") as out:
    out.write("".join(f"{i}\n" for i in range(N)))
  for form, make in _low_forms(paths, text).items():
    @tf.function
    def both(num_shards, shard, start, make=make):
      dataset = make(num_shards, shard)
      return _flat(seek.skip(dataset, start)), _flat(dataset.skip(start))

    for num_shards in (1, 3):
      for shard in sorted({0, num_shards - 1}):
        batches = int(make(num_shards, shard).reduce(0, lambda n, _: n + 1))
        for start in (0, 1, batches // 2, batches - 1, batches, batches + 2):
          (ids, sizes), (want_ids, want_sizes) = both(
              tf.constant(num_shards, tf.int64), tf.constant(shard, tf.int64),
              tf.constant(start, tf.int64))
          where = (form, num_shards, shard, start)
          assert ids.numpy().tolist() == want_ids.numpy().tolist(), where
          assert sizes.numpy().tolist() == want_sizes.numpy().tolist(), where


def test_a_chunk_of_a_file_shard_skips_raw_records_not_batches(tmp_path):
  # A map that counts its calls: the moved skip does not run it on the skipped records.
  paths = _write_records(tmp_path, files=2, per_file=500)
  calls = tf.Variable(0, dtype=tf.int64)

  def counted(record):
    calls.assign_add(1)
    return _to_id(record)

  @tf.function
  def first_batch(start):
    dataset = tf.data.Dataset.from_tensor_slices(paths).shard(2, 1).interleave(
        tf.data.TFRecordDataset).map(counted).batch(B)
    return next(iter(seek.skip(dataset, start)))

  batch = first_batch(tf.constant(40, tf.int64))
  assert batch.numpy().tolist() == [1000 + i for i in range(40 * B, 41 * B)]
  # Its batch, and what tf.data's injected prefetch reads ahead; a skip of the batches
  # would have mapped 41 * B records.
  assert B <= int(calls.numpy()) < 10 * B


def test_a_dataset_that_cannot_be_positioned_is_skipped_the_plain_way():
  @tf.function
  def first(start):
    dataset = tf.data.Dataset.range(N).shard(4, 1).filter(lambda x: x % 2 == 1).batch(B)
    return next(iter(seek.skip(dataset, start)))
  assert first(tf.constant(2, tf.int64)).numpy().tolist() == [
      1 + 4 * k for k in range(2 * B, 3 * B)]


def test_the_start_says_in_one_line_what_to_write_instead(caplog):
  from tfps.input import positioned  # pylint: disable=import-outside-toplevel
  with caplog.at_level("WARNING"):
    cheap = positioned.PositionedInput(
        lambda ctx: tf.data.Dataset.range(N).shard(ctx.num_input_pipelines,
                                                   ctx.input_pipeline_id).batch(B),
        num_replicas_in_sync=1, what="Cheap.train_dataset")
  assert cheap.cost_warning is None and "Cheap" not in caplog.text
  with caplog.at_level("WARNING"):
    dear = positioned.PositionedInput(
        lambda ctx: tf.data.Dataset.range(N).batch(B).shard(ctx.num_input_pipelines,
                                                            ctx.input_pipeline_id),
        num_replicas_in_sync=1, what="Dear.train_dataset")
  lines = [r.getMessage() for r in caplog.records if "Dear" in r.getMessage()]
  assert lines == [dear.cost_warning] and "\n" not in lines[0]
  assert "through BatchDatasetV2" in lines[0] and ".shard(n, i).batch(b)" in lines[0]
