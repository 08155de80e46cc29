"""The resuming reader (tfps.input.reader): chunks read on from a worker's open iterator
exactly where it stands, and nowhere else. One process, no cluster: the "worker" is
this process's CPU device, as it is for the closures' functions on a worker."""

import concurrent.futures

import pytest
import tensorflow as tf

from tfps.base import tf_internals
from tfps.input import positioned as positioned_lib
from tfps.input import reader as reader_lib

_SHARDS, _BATCH = 3, 4


def _dataset_fn(ctx):
  # A map the seek cannot pass (a filter): chunks inside a shard are skipped to, not
  # strided, so building one reads its shard from the start, and resuming does not.
  return (tf.data.Dataset.range(600).filter(lambda x: x % 7 != 3)
          .shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(_BATCH))


def _length(dataset):
  return int(dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


_LENGTHS = tuple(_length(_dataset_fn(tf.distribute.InputContext(_SHARDS, s)))
                 for s in range(_SHARDS))


def _closure(positioned, fail_after=None, lanes=0, lengths=_LENGTHS):
  """A positioned closure as the runtime's: `count` steps, each the sum of a batch."""

  @tf.function
  def closure(shard, start, count):
    reading = positioned.read(lengths, shard, start, lanes=lanes)
    sums = tf.TensorArray(tf.int64, size=count)
    for i in tf.range(count):
      if fail_after is not None:
        tf.debugging.Assert(i < fail_after, ["the step failed"])
      sums = sums.write(i, tf.reduce_sum(next(reading.iterator)))
    sums = sums.stack()
    with tf.control_dependencies(reading.close(count, [sums])):
      return tf.identity(sums), tf.identity(reading.built)

  return lambda shard, start, count: [
      t.numpy() for t in closure(tf.constant(shard, tf.int64), tf.constant(start, tf.int64),
                                 tf.constant(count))]


def _expected(shard, start, count):
  ctx = tf.distribute.InputContext(num_input_pipelines=_SHARDS, input_pipeline_id=shard)
  return [int(tf.reduce_sum(b)) for b in _dataset_fn(ctx).skip(start).take(count)]


@pytest.fixture(scope="module")
def positioned():
  return positioned_lib.PositionedInput(_dataset_fn, num_replicas_in_sync=1, what="test input")


def test_a_chunk_that_starts_where_the_last_ended_resumes_and_reads_the_same(positioned):
  read = _closure(positioned)
  chunks = [(1, 0, 5), (1, 5, 5), (1, 10, 3), (2, 0, 4), (2, 4, 6), (1, 13, 2)]
  built = []
  for shard, start, count in chunks:
    sums, was_built = read(shard, start, count)
    assert list(sums) == _expected(shard, start, count), (shard, start, count)
    built.append(bool(was_built))
  # Only a new shard's first chunk, and a shard taken up again, build an iterator.
  assert built == [True, False, False, True, False, True]


def test_a_chunk_elsewhere_in_the_shard_is_built_where_it_starts(positioned):
  read = _closure(positioned)
  read(0, 0, 4)
  for shard, start, count in [(0, 6, 3), (0, 2, 2), (0, 5, 3)]:  # Ahead, back, ahead.
    sums, was_built = read(shard, start, count)
    assert was_built and list(sums) == _expected(shard, start, count)


def test_a_closure_that_fails_part_way_leaves_no_position_and_no_lock(positioned):
  read, failing = _closure(positioned), _closure(positioned, fail_after=2)
  read(2, 0, 3)
  with pytest.raises(tf.errors.InvalidArgumentError, match="the step failed"):
    failing(2, 3, 4)  # Read 2 batches of its chunk, then failed.
  # Run again (as TensorFlow retries it): built at its start, not resumed 2 batches on;
  # and the failed run's lock was let go (a wait here would be a hang: bounded).
  pool = concurrent.futures.ThreadPoolExecutor(1)
  try:
    sums, was_built = pool.submit(read, 2, 3, 4).result(timeout=60)
  finally:
    pool.shutdown(wait=False)  # A hung read fails the test; it does not hold it.
  assert was_built and list(sums) == _expected(2, 3, 4)
  sums, was_built = read(2, 7, 2)
  assert not was_built and list(sums) == _expected(2, 7, 2)


def test_two_inputs_keep_two_readers():
  one = positioned_lib.PositionedInput(_dataset_fn, num_replicas_in_sync=1, what="one")
  two = positioned_lib.PositionedInput(_dataset_fn, num_replicas_in_sync=1, what="two")
  read_one, read_two = _closure(one), _closure(two)
  read_one(0, 0, 3)
  read_two(1, 0, 3)
  assert not read_one(0, 3, 2)[1] and not read_two(1, 3, 2)[1]


def test_a_plain_iterator_reads_as_it_is():
  iterator = iter(tf.data.Dataset.range(3))
  reading = reader_lib.reading_of(iterator)
  assert reading.iterator is iterator and reading.close(3, []) == []
  assert reader_lib.reading_of(reading) is reading


def test_a_lookup_table_made_in_the_dataset_fn_serves_resumed_chunks():
  """A user's dataset_fn that builds its own table: the open iterator outlives the closure
  that made it, and later closures read on through the same table."""

  def dataset_fn(ctx):
    keys = tf.range(600, dtype=tf.int64)
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, keys * 10), -1)
    return _dataset_fn(ctx).map(table.lookup)

  positioned = positioned_lib.PositionedInput(dataset_fn, num_replicas_in_sync=1, what="table")
  read = _closure(positioned, lanes=1)
  last = _LENGTHS[1] - 3
  # On through the shard's end into the lane's next shard, whose dataset_fn (and table)
  # the open iterator made itself.
  for shard, start, count, built in [(1, 0, 5, True), (1, 5, last - 5, False),
                                     (1, last, 3, False), (2, 0, 4, False)]:
    sums, was_built = read(shard, start, count)
    assert bool(was_built) == built, (shard, start)
    assert list(sums) == [10 * s for s in _expected(shard, start, count)]


def _five_shards_one_empty(ctx):
  shard = tf.cast(ctx.input_pipeline_id, tf.int64)
  return (tf.data.Dataset.range(500).filter(lambda x: tf.logical_and(x % 7 != 3, shard != 2))
          .shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(_BATCH))


def _five(shard, start, count):
  ctx = tf.distribute.InputContext(num_input_pipelines=5, input_pipeline_id=shard)
  return [int(tf.reduce_sum(b)) for b in _five_shards_one_empty(ctx).skip(start).take(count)]


def test_a_reader_reads_on_into_its_lanes_next_shard_past_an_empty_one():
  positioned = positioned_lib.PositionedInput(_five_shards_one_empty, num_replicas_in_sync=1,
                                              what="lanes")
  lengths = tuple(_length(_five_shards_one_empty(tf.distribute.InputContext(5, s)))
                  for s in range(5))
  assert lengths[2] == 0 and all(lengths[s] > 3 for s in (0, 1, 3, 4))
  two_lanes, one_lane = (_closure(positioned, lanes=lanes, lengths=lengths) for lanes in (2, 1))
  steps = [
      (two_lanes, 0, 0, lengths[0] - 3, True),
      (two_lanes, 0, lengths[0] - 3, 3, False),
      (two_lanes, 4, 0, 2, False),  # Lane 0 of 2: shard 0, then 4 (2 is empty).
      (two_lanes, 1, 0, lengths[1], True),  # Not where it stands: built.
      (one_lane, 3, 0, 2, False),  # Read on with the stride it was built with (2).
      # A graph of one lane takes over a reader built for two: the shard after 3 is
      # the one its builder's lane reads (none: 5 is past the last), not 4.
      (one_lane, 3, 2, lengths[3] - 2, False),
      (one_lane, 4, 2, 2, True),
      (one_lane, 4, 4, lengths[4] - 4, False),
  ]
  for read, shard, start, count, built in steps:
    sums, was_built = read(shard, start, count)
    assert bool(was_built) == built, (shard, start, count)
    assert list(sums) == _five(shard, start, count), (shard, start, count)


def test_a_lanes_next_shards_are_positioned_as_chunks_are():
  """A strided source (`seek`) in the shards a reader reads on into too: `shard(S, s)`
  itself would read every shard's elements to keep one in S."""

  def dataset_fn(ctx):
    return (tf.data.Dataset.range(600).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
            .batch(_BATCH))

  positioned = positioned_lib.PositionedInput(dataset_fn, num_replicas_in_sync=1, what="strided")
  chains = []
  chunk = positioned.chunk

  def chunk_seen(num_shards, shard, start):
    dataset = chunk(num_shards, shard, start)
    op, chain = tf_internals.dataset_variant(dataset).op, []
    while True:  # The ops of the dataset the lane reads, from the top down.
      chain.append(op.type)
      if not op.inputs or op.inputs[0].dtype != tf.variant:
        break
      op = op.inputs[0].op
    chains.append(chain)
    return dataset

  positioned.chunk = chunk_seen
  lane = positioned.lane((15,) * 10, lanes=1)
  tf.function(lambda: lane.shards(tf.constant([2, 3], tf.int64)) and tf.constant(0),
              autograph=False).get_concrete_function()
  assert chains and all("ShardDataset" not in c and c[-1] == "RangeDataset" for c in chains), chains
