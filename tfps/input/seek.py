"""Positioning a shard's dataset at a batch without reading the batches before it.

A chunk is batches `[start, start + count)` of shard `s` of `S`
(`tfps.input.positioned`). `dataset.skip(start)` is exact but tf.data does it
by producing every skipped element, and a `shard(S, s)` produces each of its
elements by reading `S` of its input: a chunk of the common form
`range(N).shard(S, s).batch(B)` read `(start + count) * B * S` ids to train
on `count * B`.

`skip(dataset, start)` instead rewrites the dataset's graph (inside the
closure's `tf.function`, where the dataset is a chain of ops) when it is

    source -> one-to-one ops -> [shard(S, s)] -> one-to-one ops and batches

with a source that can be cut anywhere at no cost: `range` or
`from_tensor_slices`. Skipping `start` batches of the top is then skipping
`start * B` elements of the shard, which is starting the source at element
`s + start * B * S` with a stride of `S`: the shard op is dropped, the
source is rebuilt strided and started there, and every op above it is copied
unchanged onto it. The elements, their order and the batches' bounds are
exactly those of `dataset.skip(start)` (tests/input/test_seek.py compares
them form by form).

Any other graph gets the skip as low in its chain as it stays exact: below
the batches (times their sizes), the one-to-one maps and a shard (as a skip
of `s + k * S` under a `shard(S, 0)`), right above the first op that is none
of these. A shard of file names read through a flat_map or an interleave
(`list_files(...).shard(S, s).interleave(TFRecordDataset)`) then skips raw
records of its own files only, unparsed: cheap, like a strided source. A
shard of the records themselves still reads every shard's records (`S` per
element), and says so at the start.

`plan_of(dataset)` says whether a dataset's chunks are cheap to position
and, if not, why, so that the start can say in one line what a form costs
and what to write instead.
"""

import dataclasses
from typing import Any

import tensorflow as tf

from tfps.base import tf_internals

# Ops that make one element of each input element, in order: a skip passes
# through them unchanged. (A map's function runs on fewer elements, which is
# the point; a map drawing random numbers draws them for other elements.)
_ONE_TO_ONE = frozenset({
    "MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2", "PrefetchDataset",
    "OptionsDataset", "ModelDataset", "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset", "ExperimentalMaxIntraOpParallelismDataset",
    "ExperimentalPrivateThreadPoolDataset",
})
# Ops that make one element of `batch_size` input elements (their input 1):
# skipping k of them is skipping k * batch_size below.
_BATCHES = frozenset({"BatchDataset", "BatchDatasetV2", "ParallelBatchDataset",
                      "PaddedBatchDataset", "PaddedBatchDatasetV2"})
_SHARD = "ShardDataset"
# A chain of these alone has nothing for tf.data's rewrites or autotuning.
_PLAIN = frozenset({"RangeDataset", "TensorSliceDataset", "ShardDataset", "BatchDataset",
                    "BatchDatasetV2", "PaddedBatchDataset", "PaddedBatchDatasetV2"})
_RANGE = "RangeDataset"
_SLICES = "TensorSliceDataset"
# Ops that read records from files (each file through a flat_map or an interleave).
_READERS = ("TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset")
# Ops that read a file (their function's reader) per input element, in order.
_FILE_READS = frozenset({"FlatMapDataset", "InterleaveDataset"})


@dataclasses.dataclass(frozen=True)
class Plan:
  """How a dataset is positioned: `seekable`, else the op that stops it and why."""

  seekable: bool
  blocked_at: str = ""  # The op a skip cannot pass cheaply.
  advice: str = ""  # What to write instead; empty where the dataset_fn cuts its own shards.
  reads_all_shards: bool = False  # The op is below the shard: each shard reads them all.

  def warning(self, what: str) -> str | None:
    """The start-up line for a form the runtime cannot position cheaply; None if fine."""
    if self.seekable or not self.advice:
      return None
    if self.reads_all_shards:
      return (f"{what}: each shard of this input reads all the others' data (through "
              f"{self.blocked_at}), so it is read in one shard per worker, each read on by "
              "its worker as TensorFlow's per-worker input is; a chunk that starts elsewhere "
              f"(after a restart) reads its shard from the start: {self.advice}")
    return (f"{what}: a chunk of this input reads its shard through {self.blocked_at} from "
            f"the start: {self.advice}")


def skip(dataset: tf.data.Dataset, start: Any) -> tf.data.Dataset:
  """`dataset.skip(start)`, by starting its source there where the graph allows, else by
  skipping as low in its chain as stays exact."""
  chain = _chain(dataset)
  if chain is None:
    return dataset.skip(start)
  start = tf.cast(start, tf.int64)
  if _strided_plan(chain).seekable:
    return _positioned(dataset, chain, start)
  return _skipped_low(dataset, chain, start)


def plan_of(dataset: tf.data.Dataset) -> Plan:
  """How `skip` positions `dataset` (a graph-mode dataset; else not seekable)."""
  chain = _chain(dataset)
  if chain is None:
    return Plan(False, "an eager dataset", "")
  return _plan(chain)


def _chain(dataset: tf.data.Dataset) -> list[Any] | None:
  """The dataset's ops from the top down to its source, if built in a graph."""
  variant = tf_internals.dataset_variant(dataset)
  if tf.executing_eagerly() or not hasattr(variant, "op"):
    return None
  chain, op = [], variant.op
  while True:
    chain.append(op)
    if not op.inputs or op.inputs[0].dtype != tf.variant:
      return chain
    op = op.inputs[0].op


def _plan(chain: list[Any]) -> Plan:
  plan = _strided_plan(chain)
  if plan.seekable or not _skips_raw_records(chain):
    return plan
  return Plan(True)


def _strided_plan(chain: list[Any]) -> Plan:
  """Whether the source can be started at the chunk (`range`/slices under a shard)."""
  shard = next((i for i, op in enumerate(chain) if op.type == _SHARD), None)
  above = chain[:shard] if shard is not None else chain[:-1]
  for op in above:
    if op.type not in _ONE_TO_ONE and op.type not in _BATCHES:
      return _blocked(op, chain, shard)
  if shard is not None:
    for op in chain[shard + 1:-1]:
      if op.type not in _ONE_TO_ONE:
        return _blocked(op, chain, shard)
  source = chain[-1]
  # Slices of ragged or nested components (variants) are not cut here.
  if source.type not in (_RANGE, _SLICES) or any(t.dtype == tf.variant for t in source.inputs):
    return _blocked(source, chain, shard)
  return Plan(True)


def _blocked(op, chain: list[Any], shard: int | None) -> Plan:
  """Why a skip reads its way through `op`, and the form that would not."""
  if shard is None:  # The dataset_fn cuts its own shards: its way, its cost.
    return Plan(False, op.type)
  below_shard = chain.index(op) > shard
  reads_files = any(_reads_files(o) for o in chain)
  if op.type == "DatasetFromGraph":  # A tf.data.Dataset built on the chief, split by batch.
    advice = ("pass a dataset_fn(input_context) that shards before batching: "
              "range(N).shard(n, i).batch(b)")
  elif below_shard and op.type in _BATCHES:
    advice = "shard before batching: .shard(n, i).batch(b), not .batch(b).shard(n, i)"
  elif below_shard and reads_files:
    advice = ("shard the file names, not the records: Dataset.list_files(pattern, "
              "shuffle=False).shard(n, i).interleave(TFRecordDataset or TextLineDataset), "
              "with --input_shards <= the number of files")
  elif reads_files:
    advice = ("give each shard whole files of about one closure of batches "
              "(--input_shards=<number of files>): then every chunk starts a file")
  elif not below_shard:
    advice = "shard after the ops that change the number of elements (filter, unbatch...)"
  else:
    advice = ("shard a Dataset.range or from_tensor_slices source, then map/batch: "
              "range(N).shard(n, i).map(f).batch(b)")
  return Plan(False, op.type, advice, reads_all_shards=below_shard)


def _reads_files(op) -> bool:
  """Whether `op`, or a function it calls (flat_map, interleave), reads files."""
  if op.type.startswith(_READERS):
    return True
  return any(_function_reads_files(op.graph, value.func.name, depth=3)
             for value in op.node_def.attr.values() if value.func.name)


def _function_reads_files(graph, name: str, depth: int) -> bool:
  definition = tf_internals.graph_function_def(graph, name)
  if definition is None or depth == 0:
    return False
  for node in definition.node_def:
    if node.op.startswith(_READERS):
      return True
    if any(_function_reads_files(graph, value.func.name, depth - 1)
           for value in node.attr.values() if value.func.name):
      return True
  return False


def _skip_point(chain: list[Any]) -> tuple[int, int | None]:
  """Where a skip can go lowest: the index in `chain` of the op it goes right above (the
  first op from the top that is neither one-to-one nor a batch, nor a shard it can pass),
  and the index of the shard it passes (None if it passes none)."""
  shard = None
  for depth, op in enumerate(chain[:-1]):
    if op.type in _ONE_TO_ONE or op.type in _BATCHES:
      continue
    if op.type == _SHARD and shard is None and not op.get_attr("require_non_empty"):
      shard = depth
      continue
    return depth, shard
  return len(chain) - 1, shard


def _skips_raw_records(chain: list[Any]) -> bool:
  """Whether a skip, moved down, reads only raw records of this shard's own files: it goes
  right above a flat_map/interleave of file readers, and any shard is of the file names
  below it (a shard of the records above would still read every shard's records)."""
  depth, passed_shard = _skip_point(chain)
  base = chain[depth]
  return (passed_shard is None and base.type in _FILE_READS and _reads_files(base)
          and _element_types(base) is not None)


def _skipped_low(dataset: tf.data.Dataset, chain: list[Any], start: tf.Tensor
                 ) -> tf.data.Dataset:
  """`dataset.skip(start)`, the skip moved as far down the chain as it stays exact.

  Skipping `start` batches is skipping `start * B` elements below the batch, and one-to-one
  ops (maps, prefetches) pass a skip unchanged; a `shard(S, s)` passes it as a skip of
  `s + k * S` below and `shard(S, 0)` on top. So the skipped elements are read as the op
  below produces them (a file's raw records), not parsed, mapped and batched first.
  """
  depth, shard = _skip_point(chain)
  types = _element_types(chain[depth])
  if depth == 0 or types is None:
    return dataset.skip(start)
  elements = start
  for index, op in enumerate(chain[:depth]):
    if op.type in _BATCHES:
      elements = elements * tf.cast(op.inputs[1], tf.int64)
    elif index == shard:
      num_shards = tf.cast(op.inputs[1], tf.int64)
      elements = tf.cast(op.inputs[2], tf.int64) + elements * num_shards
  variant = tf.raw_ops.SkipDataset(input_dataset=chain[depth].outputs[0], count=elements,
                                   output_types=types[0], output_shapes=types[1])
  for index in range(depth - 1, -1, -1):
    op = chain[index]
    if index == shard:  # Its elements now start at the skip: shard 0 of them.
      variant = tf_internals.create_op_like(
          op, [variant, op.inputs[1], tf.zeros([], op.inputs[2].dtype)])
    else:
      variant = _copy_onto(op, variant)
  return tf.data.experimental.from_variant(variant, structure=dataset.element_spec)


def _element_types(op) -> tuple[list[Any], list[Any]] | None:
  """The dtypes and shapes of `op`'s elements (from its attributes), if it says them."""
  attrs = op.node_def.attr
  if "output_types" not in attrs or "output_shapes" not in attrs:
    return None
  return op.get_attr("output_types"), op.get_attr("output_shapes")


def _positioned(dataset: tf.data.Dataset, chain: list[Any], start: tf.Tensor) -> tf.data.Dataset:
  shard = next((i for i, op in enumerate(chain) if op.type == _SHARD), None)
  above = chain[:shard] if shard is not None else chain[:-1]
  elements = start  # Elements to skip at the level below `above`.
  for op in above:
    if op.type in _BATCHES:
      elements = elements * tf.cast(op.inputs[1], tf.int64)
  if shard is None:
    first, stride = elements, tf.constant(1, tf.int64)
  else:
    num_shards = tf.cast(chain[shard].inputs[1], tf.int64)
    index = tf.cast(chain[shard].inputs[2], tf.int64)
    first, stride = index + elements * num_shards, num_shards
  variant = _strided_source(chain[-1], first, stride)
  below = chain[shard + 1:-1] if shard is not None else []
  for op in reversed(above + below):
    variant = _copy_onto(op, variant)
  positioned = tf.data.experimental.from_variant(variant, structure=dataset.element_spec)
  if all(op.type in _PLAIN for op in chain):
    # A new iterator per closure pays for tf.data's graph rewrites and its autotuning
    # thread (~half of a 50-batch chunk of range+batch here), which find nothing to
    # fuse or tune in a source and batches; a pipeline with maps, prefetches or
    # options of its own keeps them.
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    options.autotune.enabled = False
    positioned = positioned.with_options(options)
  return positioned


def _strided_source(source, first: tf.Tensor, stride: tf.Tensor) -> tf.Tensor:
  """The source's elements `first, first + stride, ...`, as a new source op."""
  if source.type == _RANGE:
    begin, end, step = (tf.cast(t, tf.int64) for t in source.inputs)
    inputs = [begin + first * step, end, step * stride]
  else:  # Slices: each component cut along its first dimension.
    inputs = [c[first::stride] if c.shape.rank else c for c in source.inputs]
  return tf_internals.create_op_like(source, inputs)


def _copy_onto(op, variant: tf.Tensor) -> tf.Tensor:
  return tf_internals.create_op_like(op, [variant, *op.inputs[1:]])
