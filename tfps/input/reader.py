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
in its place (`seek`), as before. The ledger hands a shard's chunks out one
after another to the same lane, and a worker's closures follow one another,
so most chunks resume.

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
from typing import Any, Sequence

import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.data.util import structure
from tensorflow.python.ops import gen_dataset_ops
from tensorflow.python.ops import gen_resource_variable_ops

# The table's keys: the shard the open iterator reads, and the next batch it gives.
_SHARD, _NEXT = 0, 1
_NONE = -1  # No position: the iterator must be built before it is read.


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
  def open(self, dataset: tf.data.Dataset, shard: tf.Tensor, start: tf.Tensor) -> Reading:
    """The read of `dataset` (the chunk from `start` of shard `shard`, to the shard's end).

    In a closure: takes the worker's lock, resumes its iterator if it stands at
    (`shard`, `start`), else makes it from `dataset`.
    """
    shard, start = tf.cast(shard, tf.int64), tf.cast(start, tf.int64)
    spec = dataset.element_spec
    mutex = gen_resource_variable_ops.mutex_v2(shared_name=f"{self._prefix}_lock")
    lock = gen_resource_variable_ops.mutex_lock(mutex)
    with tf.control_dependencies([lock]):
      table = tf.raw_ops.MutableHashTableV2(
          shared_name=f"{self._prefix}_at", use_node_name_sharing=False,
          key_dtype=tf.int64, value_dtype=tf.int64)
      keys = tf.constant([_SHARD, _NEXT], tf.int64)
      at = tf.raw_ops.LookupTableFindV2(table_handle=table, keys=keys,
                                        default_value=tf.constant(_NONE, tf.int64))
      handle = gen_dataset_ops.iterator_v2(
          shared_name=f"{self._prefix}_iterator", container="",
          output_types=structure.get_flat_tensor_types(spec),
          output_shapes=structure.get_flat_tensor_shapes(spec))
      with tf.control_dependencies([at]):  # Cleared before the first read.
        cleared = tf.raw_ops.LookupTableInsertV2(
            table_handle=table, keys=keys[1:], values=tf.constant([_NONE], tf.int64))
      resumes = tf.logical_and(tf.equal(at[0], shard), tf.equal(at[1], start))

      def build():
        variant = dataset._apply_debug_options()._variant_tensor  # pylint: disable=protected-access
        with tf.control_dependencies([gen_dataset_ops.make_iterator(variant, handle)]):
          return tf.constant(True)

      with tf.control_dependencies([cleared]):
        ready = tf.cond(resumes, lambda: tf.constant(False), build)
    with tf.control_dependencies([ready]):
      handle = tf.identity(handle)  # Every read of it comes after `ready`.
    iterator = iterator_ops.OwnedIterator(components=[handle], element_spec=spec)

    def finish(count, after):
      with tf.control_dependencies(list(after)):
        moved = tf.raw_ops.LookupTableInsertV2(
            table_handle=table, keys=keys,
            values=tf.stack([shard, start + tf.cast(count, tf.int64)]))
      with tf.control_dependencies([moved]):
        return gen_resource_variable_ops.consume_mutex_lock(lock)

    return Reading(iterator, finish, built=ready)
