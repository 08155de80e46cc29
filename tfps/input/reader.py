"""A worker's reader that resumes where its last chunk ended.

A positioned closure reads one chunk, `[start, start + count)` of a shard
(`ledger`). Built as a new iterator in every closure, a chunk pays for the
iterator each time: tf.data's graph rewrites, its functions instantiated,
files opened and their first buffers read, and batches that no prefetch has
read ahead. For a shard of files that was ~3x the cost of reading the same
batches from an iterator kept open (docs/benchmarks.md "Input forms").

So each worker keeps one iterator open between closures, in its own memory,
with the position it stopped at (a shard and a batch). A closure whose chunk
starts exactly there reads on from it; any other builds the chunk's iterator
in its place (`seek`), followed by the next shards of the chunk's lane
(`Lane`): a chunk that ends its shard leaves the reader at the next one's
first batch, as the endless iterator's interleave goes on into its next
file. The ledger hands a lane's chunks and shards out one after another,
and the coordinator runs each closure on the worker whose reader stands at
its chunk where it can (`affinity`), so most chunks resume: a lane costs
one iterator per epoch. Where the next shard is depends on the lengths in
the graph, the ledger's, fixed for the life of a model_dir.

Exactly once, still: the position is written only after the closure's last
step, and cleared before its first read, so a closure that fails part way
leaves no position, and the next closure on that worker builds its chunk.
A worker holds one reader per `ResumingReader` (per coordinator's input):
its resources are named with a number drawn when it was made, carried in
the closure's graph, so a stored trace rebuilt by the next coordinator
resumes the same readers (the same graph reads the same dataset) and no
other graph can. A coordinator that took over while its predecessor's
closure still runs on a worker may run the same graph there: a lock held
from the first read to the last makes the second wait (at most one
closure's time) instead of reading the same iterator at once.

What it costs: the open iterator's buffers stay in the worker's memory
(one per coordinator input that traced its closures), and a closure takes
a lock and reads a small table on its own worker.
"""

import dataclasses
import secrets
from typing import Any, Callable, Sequence

import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.data.util import structure
from tensorflow.python.ops import gen_dataset_ops
from tensorflow.python.ops import gen_resource_variable_ops

# The table's keys: the shard the open iterator reads, the next batch it gives, and
# the stride of the shards it reads on into after that one (`Lane`; 0: none).
_SHARD, _NEXT, _STRIDE = 0, 1, 2
_NONE = -1  # No position: the iterator must be built before it is read.


@dataclasses.dataclass(frozen=True)
class Lane:
  """What a built iterator reads after its chunk's shard: the lane's next shards.

  `lengths`: every shard's batches (the ledger's); `stride`: the lane's step
  between shards (the number of lanes); `shards(ids)`: the dataset of those
  shards' batches, one after the other. After shard `s`, the iterator reads
  the non-empty shards `s + stride, s + 2 * stride, ...`, as the ledger hands
  a lane's shards out while no other lane took them.
  """

  lengths: Sequence[int]
  stride: int
  shards: Callable[[tf.Tensor], tf.data.Dataset]

  def after(self, shard: tf.Tensor, stride: tf.Tensor) -> tf.Tensor:
    """The non-empty shards a lane of `stride` reads after `shard` (none if stride < 1)."""
    lengths = tf.constant(list(self.lengths), tf.int64)
    stride = tf.where(stride > 0, stride, len(self.lengths))  # None past the last shard.
    count = len(self.lengths)
    ids = tf.range(tf.minimum(shard + stride, count), count, stride, dtype=tf.int64)
    return tf.boolean_mask(ids, tf.gather(lengths, ids) > 0)


@dataclasses.dataclass
class Reading:
  """One closure's read of its chunk: `iterator` for its steps, then `close`."""

  iterator: Any
  _finish: Any = None  # (count, after) -> an op, or None for a plain iterator.
  built: Any = None  # A bool tensor: the iterator was built for this chunk (not resumed).

  def close(self, count: Any, after: Sequence[Any]) -> list[Any]:
    """After the closure's steps (`after`: their ops and outputs): the reader's position
    is `count` batches on, and its lock is released. Returns ops to depend on."""
    if self._finish is None:
      return []
    return [self._finish(count, after)]


def reading_of(value: Any) -> Reading:
  """`value` as a `Reading`: a plain iterator (endless input) has nothing to close."""
  return value if isinstance(value, Reading) else Reading(value)


class ResumingReader:
  """Builds, inside a closure, the read of a chunk that resumes the worker's reader."""

  def __init__(self):
    # Names this input's resources on every worker: drawn here (not from `random`, which
    # an experiment may seed: two coordinators would draw the same), kept in each trace.
    self._prefix = f"tfps_reader_{secrets.randbits(62):016x}"

  @tf.autograph.experimental.do_not_convert  # Graph ops only: nothing for autograph to do.
  def open(self, dataset: tf.data.Dataset, shard: tf.Tensor, start: tf.Tensor,
           lane: Lane | None = None) -> Reading:
    """The read of `dataset` (the chunk from `start` of shard `shard`, to the shard's end).

    In a closure: takes the worker's lock, resumes its iterator if it stands at
    (`shard`, `start`), else makes it from `dataset`, followed by `lane`'s next
    shards if given: a chunk that ends its shard leaves the reader at the
    first batch of the next one.
    """
    shard, start = tf.cast(shard, tf.int64), tf.cast(start, tf.int64)
    stride = tf.constant(lane.stride if lane is not None else 0, tf.int64)
    if lane is not None:
      dataset = dataset.concatenate(lane.shards(lane.after(shard, stride)))
    spec = dataset.element_spec
    mutex = gen_resource_variable_ops.mutex_v2(shared_name=f"{self._prefix}_lock")
    lock = gen_resource_variable_ops.mutex_lock(mutex)
    with tf.control_dependencies([lock]):
      table = tf.raw_ops.MutableHashTableV2(
          shared_name=f"{self._prefix}_at", use_node_name_sharing=False,
          key_dtype=tf.int64, value_dtype=tf.int64)
      keys = tf.constant([_SHARD, _NEXT, _STRIDE], tf.int64)
      at = tf.raw_ops.LookupTableFindV2(table_handle=table, keys=keys,
                                        default_value=tf.constant(_NONE, tf.int64))
      handle = gen_dataset_ops.iterator_v2(
          shared_name=f"{self._prefix}_iterator", container="",
          output_types=structure.get_flat_tensor_types(spec),
          output_shapes=structure.get_flat_tensor_shapes(spec))
      with tf.control_dependencies([at]):  # Cleared before the first read.
        cleared = tf.raw_ops.LookupTableInsertV2(
            table_handle=table, keys=keys[1:2], values=tf.constant([_NONE], tf.int64))
      resumes = tf.logical_and(tf.equal(at[0], shard), tf.equal(at[1], start))

      def build():
        variant = dataset._apply_debug_options()._variant_tensor  # pylint: disable=protected-access
        with tf.control_dependencies([gen_dataset_ops.make_iterator(variant, handle)]):
          return tf.constant(True)

      with tf.control_dependencies([cleared]):
        ready = tf.cond(resumes, lambda: tf.constant(False), build)
      # The lane the iterator reads on into: the one it was built with (a graph traced
      # for another number of workers may have built it).
      built_stride = tf.where(ready, stride, at[2])
    with tf.control_dependencies([ready]):
      handle = tf.identity(handle)  # Every read of it comes after `ready`.
    iterator = iterator_ops.OwnedIterator(components=[handle], element_spec=spec)

    def finish(count, after):
      end = start + tf.cast(count, tf.int64)
      position = tf.stack([shard, end])
      if lane is not None:
        following = lane.after(shard, built_stride)
        length = tf.gather(tf.constant(list(lane.lengths), tf.int64), shard)
        moved_on = tf.logical_and(end >= length, tf.size(following) > 0)
        first = tf.concat([following, [_NONE]], 0)[0]
        position = tf.where(moved_on, tf.stack([first, 0]), position)
      with tf.control_dependencies(list(after)):
        moved = tf.raw_ops.LookupTableInsertV2(
            table_handle=table, keys=keys,
            values=tf.concat([position, [built_stride]], 0))
      with tf.control_dependencies([moved]):
        return gen_resource_variable_ops.consume_mutex_lock(lock)

    return Reading(iterator, finish, built=ready)
