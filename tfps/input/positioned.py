"""Training input read at positions the coordinator hands out (see `ledger`).

`PositionedInput` turns a trainer's finite `train_dataset` (a
`dataset_fn(input_context)` or a `tf.data.Dataset`) into shards and reads a
chunk of one shard inside a closure: `chunk(num_shards, shard, start)` is
the shard's dataset from batch `start` on, built on the worker by the
closure itself, so that its position lives in the closure's arguments and
not in a worker's iterator. `read(...)` is how a closure reads it: the
worker's open iterator goes on where the chunk starts if it stands there
(`reader`), else the chunk is built.

Shards: shard `s` of `S` is `dataset_fn(InputContext(S, s))` (the same
contract as per-worker input, with shards in place of workers), or
`dataset.shard(S, s)` for a `tf.data.Dataset`. Unless `--input_shards` says
otherwise, `S` makes a shard about one closure long (total batches /
steps per closure), so most chunks are a whole shard and start at batch 0.
A chunk that starts inside a shard is positioned by `seek`: a `shard` of a
`range`/`from_tensor_slices` source (through maps and batches) starts its
source there; any other form pays a `skip(start)`, which tf.data does by
reading the skipped batches, and the start says so in one line
(`cost_warning`) with the form to write instead.

What cannot be positioned is refused or said at the start, before training:
a dataset built from Python state (`from_generator`, `py_function`) cannot
run on the workers (UsageError); an endless dataset (`repeat()`) has no
epochs to count and no position to resume from, so it is read by per-worker
iterators as before, with one warning line (`is_endless`).
"""

import math
from typing import Any, Callable, Sequence

from absl import logging
import tensorflow as tf

from tfps.input import datasets
from tfps.input import ledger as ledger_lib
from tfps.input import reader as reader_lib
from tfps.input import seek
from tfps.base import messages
from tfps.base import errors
from tfps.base import tf_internals

# Largest number of batches counted on the chief for a dataset whose
# cardinality tf.data does not know; more is treated as endless.
_MAX_COUNTED_BATCHES = 10_000_000
# Most shards made by default: each is measured on the chief at the first
# start of a model_dir (one run of a traced function: ~1 ms when tf.data
# knows its cardinality, a read of the shard when it does not). Past this,
# shards hold more than a closure, and chunks inside them pay for their skip:
# a larger input wants --input_shards and shards that are cheap to position
# (files).
_MAX_DEFAULT_SHARDS = 256
# A "finite" dataset longer than this (e.g. range(2**62)) is a stream that
# will never end an epoch: read as endless input.
_ENDLESS_BATCHES = 2**40


# The tensor name of a PythonState's value in a checkpoint (TensorFlow's).
_PY_STATE = "py_state"


class LedgerState(tf.train.experimental.PythonState):
  """The input ledger as a checkpointed object (saved and restored with the model).

  Saved as any `PythonState` (its JSON), from a string variable on the chief
  that `capture()` fills: an asynchronous save snapshots variables, not
  Python objects, so the ledger must be in one when the model's variables
  are copied (`checkpoints.Manager` captures it before every save).
  """

  def __init__(self):
    self.ledger: ledger_lib.InputLedger | None = None
    with tf.init_scope():
      self._text = tf.Variable("", dtype=tf.string, trainable=False, name="input_ledger")

  def serialize(self) -> str:
    if self.ledger is None:
      raise errors.PermanentError("internal: a checkpoint was saved before the input was measured")
    return self.ledger.to_json()

  def deserialize(self, string_value) -> None:
    text = string_value.decode("utf-8") if isinstance(string_value, bytes) else string_value
    self.ledger = ledger_lib.InputLedger.from_json(text)

  def capture(self) -> None:
    """The ledger as it is now is what the next save writes."""
    with tf.init_scope():
      self._text.assign(self.serialize())

  def _serialize_to_tensors(self):  # A synchronous save: the ledger now.
    self.capture()
    with tf.init_scope():
      return {_PY_STATE: self._text.read_value()}

  def _copy_trackable_to_cpu(self, object_map):
    """An asynchronous save's snapshot: the captured ledger, copied beside the variables.

    Runs inside TensorFlow's snapshot function (traced once), so it copies the
    variable with a graph op instead of reading the ledger in Python.
    """
    if self not in object_map:
      object_map[self] = _LedgerSnapshot(self._text)
    object_map[self].text.assign(self._text)


class _LedgerSnapshot(tf_internals.Trackable):
  """What an asynchronous save writes for a `LedgerState`: a copy of its captured text."""

  def __init__(self, source: tf.Variable):
    with tf.init_scope(), tf.device(source.device):
      self.text = tf.Variable("", dtype=tf.string, trainable=False, name="input_ledger_snapshot")

  def _serialize_to_tensors(self):
    return {_PY_STATE: self.text.read_value()}


class PositionedInput:
  """A finite training dataset, split into shards read chunk by chunk."""

  def __init__(self, dataset: Any, *, num_replicas_in_sync: int, what: str,
               saved_batches: int | None = None):
    """`saved_batches`: the batches of an epoch as a checkpoint's ledger recorded them (a
    restart), taken instead of counting an input whose length tf.data does not know: a
    count reads the whole input (seconds a GB), at every coordinator's start."""
    self._what = what
    self._replicas = num_replicas_in_sync
    if isinstance(dataset, tf.data.Dataset):
      shipped = datasets.ShippedDataset(dataset, what=what)  # Python state: UsageError.
      self._shard_fn = lambda n, s: shipped.rebuild().shard(n, s)
    elif callable(dataset):
      fn = dataset
      if datasets.takes_input_context(fn):
        self._shard_fn = lambda n, s: fn(tf.distribute.InputContext(
            num_input_pipelines=n, input_pipeline_id=s,
            num_replicas_in_sync=num_replicas_in_sync))
      else:
        self._shard_fn = lambda n, s: fn().shard(n, s)
    else:
      raise errors.UsageError(
          f"{what}: expected a tf.data.Dataset or a dataset_fn(input_context), "
          f"got {type(dataset).__name__}")
    self._reader = reader_lib.ResumingReader()
    whole = self._build(1, 0)
    datasets.check_runs_on_workers(whole, what=what)
    self._total = _length(whole, saved_batches, what)  # None: endless.
    plan = None if self._total is None else self._plan()
    # Its shards each read all the data (a shard of records, of batches): one per worker.
    self.reads_all_shards = plan is not None and plan.reads_all_shards
    # One line when chunks read their way to their start (said at the start, once).
    self.cost_warning = None if plan is None else plan.warning(what)
    if self.cost_warning:
      logging.warning("%s", self.cost_warning)

  @property
  def is_endless(self) -> bool:
    return self._total is None

  def measure(self, *, num_shards: int | None, steps_per_closure: int,
              num_workers: int = 1) -> ledger_lib.InputLedger:
    """A new ledger: the shards' lengths (read on the chief; counted if tf.data cannot say).
    `num_shards` None: about one closure a shard, or one per worker for an input whose
    shards each read all the data (as per-worker input does, each worker reading on
    through its own: `reader`)."""
    if self._total is None:
      raise errors.PermanentError(f"internal: {self._what} is endless and cannot be measured")
    if num_shards is None:
      num_shards = (max(1, num_workers) if self.reads_all_shards
                    else default_num_shards(self._total, steps_per_closure))
    lengths = []
    length_of = self._shard_length_fn(num_shards)
    for shard in range(num_shards):
      length = _length_of_shard(length_of, shard)
      if length is None:
        raise errors.UsageError(
            f"{self._what}: shard {shard} of {num_shards} is endless although the whole "
            "dataset is not; a dataset_fn must make shard i of n a part of the whole")
      lengths.append(length)
    empty = sum(1 for n in lengths if n == 0)
    logging.info("%s: %d batches per epoch in %d shards (%d empty)", self._what, sum(lengths),
                 num_shards, empty)
    if empty > num_shards // 2:
      logging.warning("%s: %d of %d input shards are empty (is the input split by file?); "
                      "--input_shards=<number of files> would make each shard one part",
                      self._what, empty, num_shards)
    return ledger_lib.InputLedger(lengths)

  def _shard_length_fn(self, num_shards: int) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """`(shard, count)` -> the shard's cardinality, or (`count` true) its batches counted.

    The shard is built in a function, for a shard id given as a tensor, as a
    closure builds its chunk: traced once, then run per shard. Built in Python
    per shard instead, a pipeline with a map costs ~50 ms a shard: 13 s for the
    default 256 shards of the ctr, at every first start of a model_dir.
    """

    @tf.function(input_signature=[tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.bool)],
                 autograph=False)
    def length_of(shard, count):
      dataset = self._build(num_shards, shard)
      return tf.cond(count, lambda: _counted(dataset), dataset.cardinality)

    return length_of

  def chunk(self, num_shards: int, shard: tf.Tensor, start: tf.Tensor) -> tf.data.Dataset:
    """Shard `shard` of `num_shards` from batch `start` on (tensors: built in a closure)."""
    return seek.skip(self._build(num_shards, shard), start)

  def read(self, lengths: Sequence[int], shard: tf.Tensor, start: tf.Tensor,
           lanes: int = 1) -> reader_lib.Reading:
    """In a closure: the read of that chunk of shard `shard` of `len(lengths)` (the
    ledger's lengths), resuming the worker's reader where it stands there (`reader`);
    `close` it after the closure's steps. A reader built here reads on into the next
    shards of its lane (one of `lanes`; 0: none), as the ledger hands them out."""
    lane = self.lane(lengths, lanes) if lanes > 0 else None
    return self._reader.open(self.chunk(len(lengths), shard, start), shard, start, lane)

  def lane(self, lengths: Sequence[int], lanes: int) -> reader_lib.Lane:
    """What a reader reads on into after its chunk's shard, in a lane of `lanes`: each
    shard from its first batch as a chunk is (`seek`: a strided source, not a `shard`
    reading every shard's elements)."""
    num_shards = len(lengths)
    return reader_lib.Lane(
        lengths=tuple(lengths), stride=lanes,
        shards=lambda ids: tf.data.Dataset.from_tensor_slices(ids).flat_map(
            lambda s: self.chunk(num_shards, s, tf.constant(0, tf.int64))))

  def _plan(self) -> seek.Plan:
    """How chunks are positioned (`seek`): shard 1 of 2, built in a function as a closure does
    (a function, not a bare graph: the dataset_fn may capture eager tensors)."""
    plans = []

    def build():
      plans.append(seek.plan_of(self._build(2, tf.constant(1, tf.int64))))
      return tf.constant(0)

    tf.function(build, autograph=False).get_concrete_function()
    return plans[0]

  def _build(self, num_shards: int, shard) -> tf.data.Dataset:
    try:
      dataset = self._shard_fn(num_shards, shard)
    except errors.TfpsError:
      raise
    except Exception as e:  # User code: one line that names it.
      raise errors.UsageError(
          f"{self._what}: building shard {shard} of {num_shards} raised "
          f"{type(e).__name__}: {messages.one_line(e)}") from e
    if not isinstance(dataset, tf.data.Dataset):
      raise errors.UsageError(
          f"{self._what}: the dataset_fn returned {type(dataset).__name__}, "
          "expected a tf.data.Dataset")
    return dataset


def default_num_shards(total_batches: int, steps_per_closure: int) -> int:
  """Shards of about one closure each, at most `_MAX_DEFAULT_SHARDS`."""
  return max(1, min(_MAX_DEFAULT_SHARDS, math.ceil(total_batches / steps_per_closure)))


def _length(dataset: tf.data.Dataset, saved: int | None = None, what: str = "") -> int | None:
  """Batches in `dataset`; None if it is endless (or longer than we count). `saved`:
  its length as a checkpoint recorded it, for a count (`repeat()` is still seen)."""

  def count() -> int:
    if saved is None:
      return int(_counted(dataset))
    logging.info("%s: %d batches an epoch, as the checkpoint recorded (not counted again)",
                 what, saved)
    return saved

  return _judged(int(dataset.cardinality()), count)


def saved_ledger(checkpoint: str, key: str) -> ledger_lib.InputLedger | None:
  """The input ledger a checkpoint holds under `key` (a `LedgerState`), read from its
  files alone (no variable is made); None if it holds none (endless input)."""
  try:
    reader = tf.train.load_checkpoint(checkpoint)
    name = f"{key}/.ATTRIBUTES/{_PY_STATE}"  # TensorFlow's name for the object's value.
    if not reader.has_tensor(name):
      return None
    return ledger_lib.InputLedger.from_json(reader.get_tensor(name).decode("utf-8"))
  except (tf.errors.OpError, ValueError) as e:
    logging.info("no input ledger read from %s (%s): the input is measured", checkpoint,
                 messages.one_line(str(e)))
    return None


def _length_of_shard(length_of, shard: int) -> int | None:
  """Batches in shard `shard` (`length_of` from `_shard_length_fn`); None if endless."""
  shard = tf.constant(shard, tf.int64)
  return _judged(int(length_of(shard, tf.constant(False))),
                 lambda: int(length_of(shard, tf.constant(True))))


def _judged(cardinality: int, count: Callable[[], int]) -> int | None:
  """The length from tf.data's cardinality, counted (`count`) if it does not know it."""
  if cardinality == tf.data.INFINITE_CARDINALITY or cardinality > _ENDLESS_BATCHES:
    return None
  if cardinality != tf.data.UNKNOWN_CARDINALITY:
    return cardinality
  counted = count()
  return None if counted > _MAX_COUNTED_BATCHES else counted


def _counted(dataset: tf.data.Dataset) -> tf.Tensor:
  """Batches in `dataset`, read up to one past the most counted."""
  return dataset.take(_MAX_COUNTED_BATCHES + 1).reduce(
      tf.constant(0, tf.int64), lambda n, _: n + 1)
