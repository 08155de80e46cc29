"""Training data of the built-in `ctr` experiment: TFRecord files, written once.

A real CTR pipeline reads click logs from sharded files of `tf.train.Example`
records; so does `ctr`. Its synthetic examples are written once into a data
directory, and every run with the same settings reads the same files:

* Where: `<data_dir>/ctr-<key>/`, `key` a hash of everything the bytes
  depend on (`DataSettings`: seed, vocabularies, dense width, examples,
  examples per record, records per file, format). Other settings get
  another directory beside it, so sets are never mixed. Its `manifest.json`
  lists the settings and each file's records and bytes; a directory that no
  longer matches its manifest is an error naming it, never rewritten in place
  (others may be reading it).
* Atomic: a set is written into a temporary directory of its own beside the
  final one and renamed into place, so a reader sees a whole set or none. Two
  coordinators that generate at once each write their own copy; the first
  rename wins and the other copy is dropped. The temporary directory of a
  generator that was killed (on this host, its process gone) is removed by
  the next one. This holds where a directory rename is atomic (a POSIX file
  system); on an object store (gs://), generate the set before the job starts.
* Records: each `tf.train.Example` is a block of k consecutive examples
  (`examples_per_record`) as three flat lists: `cat` (int64, k x features:
  every categorical id of example 0, then of example 1, ...), `dense` (float,
  k x num_dense) and `label` (int64, k, 0 or 1). Blocks, as pre-batched
  TFRecord inputs do, because the reader pays per record and the parser per
  key and record: read as one example per record with a key per feature, the
  default batch costs about twice the CPU (docs/benchmarks.md, "Positioned
  input"; with three keys, one example per record reads a shard with about
  twice the CPU too). Any TF pipeline reads them with `parse_example` and a
  reshape.
  Blocks in example order, `records_per_file` to a file (the last may be
  shorter): file i holds examples [i * R * k, (i + 1) * R * k).
* Fast: NumPy builds the records a file at a time (`example_records`), a
  thread per core: 0.9-1.5 s for the default 2**20 examples (49 MB) on 2
  idle cores here (`python scripts/ctr_input_cost.py`), longer when they
  are busy.

Reading (`TrainFiles.dataset_fn`) gives ONE epoch of batches, each one dict
(`ExamplesFn`'s). Shard s of S is a
contiguous run of whole batches in the global order (batches
[s * T // S, (s + 1) * T // S) of T), read from only the files it spans:
the records before its first are skipped within its first file, as raw
records (before parsing or batching), so positioning a shard costs at most
one file's framing, never a scan of the data before it. A batch of B is B / k
whole records, parsed as one; a batch size that k does not divide still
works, at a higher cost (blocks parsed, split into examples and rebatched).
Its cardinality is asserted, so the coordinator reads each shard's length
without counting.
"""

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging as logging_lib
import os
import socket
import time
import uuid
from typing import Callable, Mapping

from absl import logging
import tensorflow as tf

from tfps.examples.ctr import records as example_records
from tfps.base import errors

_FORMAT = 2  # Bump when the bytes written for the same settings change.
_MANIFEST = "manifest.json"
_OWNER = "owner.json"  # Who wrote the set (in a temporary directory: who is writing it).
_TEMP_PREFIX = ".tmp-"

# The synthetic examples `index` as one dict of tensors: `cat` [n, features]
# int64, `dense` [n, num_dense] float32, `label` [n, 1] int64 (0 or 1); also
# what reading the files gives.
ExamplesFn = Callable[[tf.Tensor], Mapping[str, tf.Tensor]]


@dataclasses.dataclass(frozen=True)
class DataSettings:
  """Everything the bytes of a set of training files depend on."""

  seed: int
  vocab_sizes: tuple[int, ...]
  num_dense: int
  num_examples: int
  examples_per_record: int  # k: divides num_examples, so every record is a whole block.
  records_per_file: int

  def __post_init__(self):
    object.__setattr__(self, "vocab_sizes", tuple(self.vocab_sizes))
    for field in ("num_dense", "num_examples", "examples_per_record", "records_per_file"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise errors.UsageError(f"ctr data {field} ({value!r}) must be a positive integer")
    if isinstance(self.seed, bool) or not isinstance(self.seed, int):
      raise errors.UsageError(f"ctr data seed ({self.seed!r}) must be an integer")
    if self.num_examples % self.examples_per_record:
      raise errors.UsageError(
          f"ctr data examples_per_record ({self.examples_per_record}) must divide "
          f"num_examples ({self.num_examples})")

  def as_dict(self) -> dict:
    return {"format": _FORMAT, **dataclasses.asdict(self),
            "vocab_sizes": list(self.vocab_sizes)}

  @property
  def key(self) -> str:
    text = json.dumps(self.as_dict(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]

  @property
  def num_records(self) -> int:
    return self.num_examples // self.examples_per_record

  @property
  def num_files(self) -> int:
    return -(-self.num_records // self.records_per_file)

  def file_records(self, index: int) -> tuple[int, int]:
    """Records [start, end) of file `index`."""
    start = index * self.records_per_file
    return start, min(start + self.records_per_file, self.num_records)


@dataclasses.dataclass(frozen=True)
class TrainFiles:
  """A complete set of training files (see the module docstring)."""

  directory: str
  paths: tuple[str, ...]
  settings: DataSettings

  def dataset_fn(self, batch_size: int) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """dataset_fn(input_context): one epoch of shard `input_pipeline_id` of `num_input_pipelines`.

    The pipeline id may be a scalar tensor (a shard chosen inside a
    `tf.function`, or the worker index).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
      raise errors.UsageError(f"ctr batch_size ({batch_size!r}) must be a positive integer")
    settings = self.settings
    paths = list(self.paths)
    total_batches = -(-settings.num_examples // batch_size)
    per_file = settings.records_per_file
    k = settings.examples_per_record
    num_features, num_dense = len(settings.vocab_sizes), settings.num_dense
    # Parsed by a dataset op rather than inside `map`: functions are instantiated
    # again for every iterator, and a positioned input makes one per closure
    # (docs/benchmarks.md, "The ctr's file input"). TF calls the op deprecated
    # in favour of `map`; its three-line notice at every start says nothing
    # to a user of tfps.
    with _deprecation_notices_silenced():
      parse = tf.data.experimental.parse_example_dataset({
          "cat": tf.io.FixedLenFeature([k * num_features], tf.int64),
          "dense": tf.io.FixedLenFeature([k * num_dense], tf.float32),
          "label": tf.io.FixedLenFeature([k], tf.int64)})

    def examples(blocks):
      """n records' blocks -> their n * k examples (one dict, as the model reads them)."""
      return {"cat": tf.reshape(blocks["cat"], [-1, num_features]),
              "dense": tf.reshape(blocks["dense"], [-1, num_dense]),
              "label": tf.reshape(blocks["label"], [-1, 1])}

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
      shards = input_context.num_input_pipelines
      shard = tf.cast(input_context.input_pipeline_id, tf.int64)
      first_batch = shard * total_batches // shards
      end_batch = (shard + 1) * total_batches // shards
      first = first_batch * batch_size
      end = tf.minimum(end_batch * batch_size, settings.num_examples)
      first_record, end_record = first // k, (end + k - 1) // k
      first_file = first_record // per_file
      end_file = (end_record + per_file - 1) // per_file
      files = tf.constant(paths)[first_file:end_file]
      # Skipping raw records reads only their headers; the shard then ends on
      # a batch boundary (or at the end of the data), so its end is counted
      # in batches, not per record.
      records = tf.data.TFRecordDataset(files).skip(first_record - first_file * per_file)
      if batch_size % k == 0:  # Whole blocks per batch: parsed as read.
        batches = records.batch(batch_size // k).apply(parse).map(examples)
      else:  # Batches cut blocks: parsed per file's worth, then split and rebatched.
        batches = (records.batch(per_file).apply(parse).map(examples).unbatch()
                   .skip(first - first_record * k).batch(batch_size))
      # A positioned input builds a new iterator for every closure's chunk, and
      # tf.data's default graph rewrites were about half of that (34 -> 16 ms
      # CPU here) while finding nothing to fuse in a batch followed by one map.
      # Nothing here is AUTOTUNE'd either, so its model thread is only a cost
      # (docs/benchmarks.md, the ctr's file input).
      options = tf.data.Options()
      options.experimental_optimization.apply_default_optimizations = False
      options.autotune.enabled = False
      return (batches.take(end_batch - first_batch)
              .apply(tf.data.experimental.assert_cardinality(end_batch - first_batch))
              .prefetch(2)
              .with_options(options))

    return dataset_fn


def ensure_files(data_dir: str, settings: DataSettings, examples_fn: ExamplesFn) -> TrainFiles:
  """The training files of `settings` under `data_dir`: found, or written now (once)."""
  directory = os.path.join(data_dir, f"ctr-{settings.key}")
  found = _load(directory, settings)
  if found is not None:
    logging.info("ctr: reading %d training examples in %d files from %s",
                 settings.num_examples, len(found.paths), directory)
    return found
  try:
    tf.io.gfile.makedirs(data_dir)
  except (OSError, tf.errors.OpError) as e:
    raise errors.UsageError(f"ctr data_dir ({data_dir!r}) cannot be created ({e})") from None
  _remove_abandoned(data_dir, settings.key)
  temp = os.path.join(data_dir, f"{_TEMP_PREFIX}ctr-{settings.key}-{uuid.uuid4().hex[:12]}")
  start = time.perf_counter()
  try:
    tf.io.gfile.mkdir(temp)
    _write_text(os.path.join(temp, _OWNER),
                json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    sizes = _write_files(temp, settings, examples_fn)
    manifest = {"settings": settings.as_dict(),
                "files": [{"name": name, "records": records, "bytes": size}
                          for name, records, size in sizes]}
    _write_text(os.path.join(temp, _MANIFEST), json.dumps(manifest, indent=1, sort_keys=True))
    try:
      tf.io.gfile.rename(temp, directory)
    except (OSError, tf.errors.OpError):
      if _load(directory, settings) is None:  # Not another generator's complete set.
        raise
      logging.info("ctr: another process wrote %s first; using its files", directory)
  finally:
    if tf.io.gfile.exists(temp):  # An error, or another process's set won.
      tf.io.gfile.rmtree(temp)
  found = _load(directory, settings)
  if found is None:
    raise errors.PermanentError(f"ctr: the training files just written to {directory} are missing")
  megabytes = sum(size for _, _, size in sizes) / 1e6
  logging.info("ctr: wrote %d training examples (%d files, %.0f MB) to %s in %.1f s",
               settings.num_examples, len(found.paths), megabytes, directory,
               time.perf_counter() - start)
  return found


def _file_name(settings: DataSettings, index: int) -> str:
  return f"train-{index:05d}-of-{settings.num_files:05d}.tfrecord"


def _write_files(directory: str, settings: DataSettings,
                 examples_fn: ExamplesFn) -> list[tuple[str, int, int]]:
  """Writes every file of the set; (name, records, bytes) of each, in order."""

  def write(index: int) -> tuple[str, int, int]:
    start, end = settings.file_records(index)
    k = settings.examples_per_record
    examples = examples_fn(tf.range(start * k, end * k, dtype=tf.int64))
    # [examples, values] -> [records, k * values]: a block's examples in order.
    block = lambda key: examples[key].numpy().reshape(end - start, -1)
    data, offsets = example_records.encode({"cat": block("cat"), "label": block("label")},
                                           {"dense": block("dense")})
    name = _file_name(settings, index)
    with tf.io.TFRecordWriter(os.path.join(directory, name)) as writer:
      for begin, stop in zip(offsets[:-1], offsets[1:]):
        writer.write(data[begin:stop])
    return name, end - start, tf.io.gfile.stat(os.path.join(directory, name)).length

  # TensorFlow and most of NumPy release the GIL: files are written a thread per core.
  threads = max(1, min(os.cpu_count() or 1, settings.num_files))
  with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="ctr-data") as pool:
    return list(pool.map(write, range(settings.num_files)))


def _write_text(path: str, text: str) -> None:
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(text)


def _load(directory: str, settings: DataSettings) -> TrainFiles | None:
  """The complete set in `directory`; None if there is none; an error if it is damaged."""
  manifest_path = os.path.join(directory, _MANIFEST)
  if not tf.io.gfile.exists(manifest_path):
    if tf.io.gfile.exists(directory):
      raise errors.PermanentError(
          f"ctr: training data directory {directory} has no {_MANIFEST}; remove it to "
          "have the files written again")
    return None
  try:
    with tf.io.gfile.GFile(manifest_path) as f:
      manifest = json.loads(f.read())
    if manifest["settings"] != settings.as_dict():
      raise ValueError(f"its settings {manifest['settings']} are not {settings.as_dict()}")
    entries = manifest["files"]
    expected = [(_file_name(settings, i), settings.file_records(i)) for i in
                range(settings.num_files)]
    if [e["name"] for e in entries] != [name for name, _ in expected] or any(
        e["records"] != end - start for e, (_, (start, end)) in zip(entries, expected)):
      raise ValueError("its file list is not that of its settings")
    paths = []
    for entry in entries:
      path = os.path.join(directory, entry["name"])
      size = tf.io.gfile.stat(path).length if tf.io.gfile.exists(path) else None
      if size != entry["bytes"]:
        raise ValueError(f"{entry['name']} has {size} bytes, the manifest says {entry['bytes']}")
      paths.append(path)
  except (ValueError, KeyError, TypeError, tf.errors.OpError) as e:
    raise errors.PermanentError(
        f"ctr: training data in {directory} does not match its {_MANIFEST} ({e}); remove "
        "the directory to have the files written again") from None
  return TrainFiles(directory=directory, paths=tuple(paths), settings=settings)


def _remove_abandoned(data_dir: str, key: str) -> None:
  """Removes temporary directories of `key` whose writer (on this host) is gone."""
  prefix = f"{_TEMP_PREFIX}ctr-{key}-"
  for name in tf.io.gfile.listdir(data_dir):
    name = name.rstrip("/")
    if not name.startswith(prefix):
      continue
    temp = os.path.join(data_dir, name)
    try:
      with tf.io.gfile.GFile(os.path.join(temp, _OWNER)) as f:
        owner = json.loads(f.read())
      abandoned = owner["host"] == socket.gethostname() and not _alive(int(owner["pid"]))
    except (ValueError, KeyError, TypeError, tf.errors.OpError):
      abandoned = False  # Not ours to judge (a writer that just started, another format).
    if abandoned:
      logging.info("ctr: removing %s, left by a generator that did not finish", temp)
      tf.io.gfile.rmtree(temp)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # Someone else's process.
  return True


@contextlib.contextmanager
def _deprecation_notices_silenced():
  """TensorFlow's deprecation notices (WARNING lines of its logger) left out."""
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel(logging_lib.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)
