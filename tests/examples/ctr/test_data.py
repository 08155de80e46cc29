"""The ctr experiment's training files: written once, read by shard, without a cluster."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tensorflow.python.util import deprecation

from tfps.examples.ctr import experiment as ctr
from tfps.examples.ctr import data as ctr_data
from tfps.input import positioned
from tfps.base import errors

pytestmark = pytest.mark.tf

SEED = 3

# 1000 examples in blocks of 8 (the largest divisor of 1000 up to the default
# 16), in files of 8 records (64 examples): 16 files, the last one short.
CONFIG = ctr.CtrConfig(vocab_sizes=(300, 20000), num_dense=3, train_examples=1000,
                       records_per_file=8)
SETTINGS = ctr_data.DataSettings(seed=SEED, vocab_sizes=(300, 20000), num_dense=3,
                                 num_examples=1000, examples_per_record=8, records_per_file=8)


def _expected(config=CONFIG, seed=SEED):
  """The training examples the files must hold, in order, straight from make_examples.

  Traced, as the generator runs it: TensorFlow's graph optimizations round
  `vocab * u**3` differently from eager execution for about one id in 1000.
  """
  examples = tf.function(ctr.make_examples)(
      tf.range(config.train_examples, dtype=tf.int64), config, seed, 1)
  return {k: v.numpy() for k, v in examples.items()}


def _read(dataset):
  """Every batch of a dataset as NumPy: [{key: values}]."""
  return [{k: v.numpy() for k, v in batch.items()} for batch in dataset]


def _concat(batches):
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _assert_examples_equal(got, expected):
  assert sorted(got) == sorted(expected) == ["cat", "dense", "label"]
  for key in expected:
    assert got[key].dtype == expected[key].dtype, key
    np.testing.assert_array_equal(got[key], expected[key])


def _file_state(files: ctr_data.TrainFiles):
  paths = [*files.paths, os.path.join(files.directory, "manifest.json")]
  return {p: (os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in paths}


# --- files: written once, deterministic, atomic ------------------------------

def test_files_hold_the_training_examples_in_order(tmp_path):
  files = ctr.train_files(CONFIG, SEED, str(tmp_path))
  assert len(files.paths) == 16
  assert [sum(1 for _ in tf.data.TFRecordDataset(p)) for p in files.paths] == [8] * 15 + [5]
  examples = _concat(_read(files.dataset_fn(100)(tf.distribute.InputContext())))
  _assert_examples_equal(examples, _expected())
  assert examples["cat"][:, 1].max() >= 128  # Multi-byte varints are in the data.


def test_building_the_input_prints_no_deprecation_notice(tmp_path, monkeypatch, caplog):
  # TF prints each notice once per process: forget those of earlier tests.
  monkeypatch.setattr(deprecation, "_PRINTED_WARNING", {})
  caplog.set_level("WARNING", logger="tensorflow")
  files = ctr.train_files(CONFIG, SEED, str(tmp_path))
  files.dataset_fn(100)(tf.distribute.InputContext())
  assert "deprecated" not in caplog.text


def test_a_record_is_an_ordinary_example_holding_a_block_of_examples(tmp_path):
  files = ctr.train_files(CONFIG, SEED, str(tmp_path))
  assert files.settings == SETTINGS
  records = list(tf.data.TFRecordDataset(files.paths[2]).skip(3).take(1))
  block = tf.train.Example.FromString(records[0].numpy()).features.feature
  assert sorted(block) == ["cat", "dense", "label"]
  first = (2 * 8 + 3) * 8  # File 2, record 3: examples [152, 160).
  expected = {k: v[first:first + 8].reshape(-1) for k, v in _expected().items()}
  assert list(block["cat"].int64_list.value) == expected["cat"].tolist()
  np.testing.assert_array_equal(np.array(block["dense"].float_list.value, np.float32),
                                expected["dense"])
  assert list(block["label"].int64_list.value) == expected["label"].tolist()


def test_blocks_divide_the_examples(tmp_path):
  assert ctr.train_files(ctr.CtrConfig(vocab_sizes=(50,), num_dense=1, train_examples=999),
                         SEED, str(tmp_path)).settings.examples_per_record == 1
  with pytest.raises(errors.UsageError, match=r"examples_per_record \(16\) must divide"):
    ctr_data.DataSettings(seed=1, vocab_sizes=(5,), num_dense=1, num_examples=1000,
                          examples_per_record=16, records_per_file=8)


def test_same_settings_give_the_same_bytes_and_other_settings_another_directory(tmp_path):
  first = ctr.train_files(CONFIG, SEED, str(tmp_path / "a"))
  second = ctr.train_files(CONFIG, SEED, str(tmp_path / "b"))
  assert os.path.basename(first.directory) == os.path.basename(second.directory)
  for p, q in zip(first.paths, second.paths, strict=True):
    with open(p, "rb") as f, open(q, "rb") as g:
      assert f.read() == g.read()
  other = ctr.train_files(CONFIG, SEED + 1, str(tmp_path / "a"))
  assert other.directory != first.directory
  with open(first.paths[0], "rb") as f, open(other.paths[0], "rb") as g:
    assert f.read() != g.read()
  manifest = json.load(open(os.path.join(first.directory, "manifest.json")))
  assert manifest["settings"]["seed"] == SEED and manifest["settings"]["num_examples"] == 1000
  assert manifest["settings"]["format"] == 2 and manifest["settings"]["examples_per_record"] == 8
  assert [e["records"] for e in manifest["files"]] == [8] * 15 + [5]


def test_a_second_call_reuses_the_files(tmp_path, monkeypatch):
  files = ctr.train_files(CONFIG, SEED, str(tmp_path))
  before = _file_state(files)

  def no_writing(*args):
    raise AssertionError("the files were written again")

  monkeypatch.setattr(ctr_data, "_write_files", no_writing)
  again = ctr.train_files(CONFIG, SEED, str(tmp_path))
  assert again == files
  assert _file_state(again) == before  # Same inodes, untouched.


def test_a_damaged_set_is_an_error_naming_it(tmp_path):
  files = ctr.train_files(CONFIG, SEED, str(tmp_path))
  with open(files.paths[3], "ab") as f:
    f.write(b"x")
  with pytest.raises(errors.PermanentError) as e:
    ctr.train_files(CONFIG, SEED, str(tmp_path))
  assert str(e.value).startswith(f"ctr: training data in {files.directory} does not match")
  assert "remove the directory" in str(e.value) and "\n" not in str(e.value)


def test_a_killed_generator_leaves_nothing_that_breaks_the_next(tmp_path):
  # A real generator, killed (SIGKILL) while it writes its second file.
  script = textwrap.dedent(f"""
      import os, signal
      from tfps.examples.ctr import experiment as ctr
      from tfps.examples.ctr import data as ctr_data
      from tfps.examples.ctr import records as example_records
      encode, calls = example_records.encode, []
      def dying_encode(*args):
        calls.append(1)
        if len(calls) == 2:
          os.kill(os.getpid(), signal.SIGKILL)
        return encode(*args)
      ctr_data.example_records.encode = dying_encode
      ctr.train_files(ctr.CtrConfig(vocab_sizes=(300, 20000), num_dense=3,
                                    train_examples=1000, records_per_file=8),
                      {SEED}, {str(tmp_path)!r})
      """)
  killed = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
  assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
  left = [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
  assert len(left) == 1 and not any(n.startswith("ctr-") for n in os.listdir(tmp_path))
  # A writer that is still running (this process) is left alone.
  live = tmp_path / f".tmp-ctr-{SETTINGS.key}-x"
  live.mkdir()
  (live / "owner.json").write_text(json.dumps({"host": socket.gethostname(),
                                               "pid": os.getpid()}))

  files = ctr.train_files(CONFIG, SEED, str(tmp_path))
  assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".tmp-")) == [live.name]
  reference = ctr.train_files(CONFIG, SEED, str(tmp_path / "clean"))
  for p, q in zip(files.paths, reference.paths, strict=True):
    with open(p, "rb") as f, open(q, "rb") as g:
      assert f.read() == g.read()


def test_a_set_written_meanwhile_by_another_process_wins(tmp_path, monkeypatch):
  write_files = ctr_data._write_files
  calls = []

  def racing_write(directory, settings, examples_fn):
    calls.append(directory)
    if len(calls) == 1:  # Another generator finishes first, while we write.
      ctr.train_files(CONFIG, SEED, str(tmp_path))
    return write_files(directory, settings, examples_fn)

  monkeypatch.setattr(ctr_data, "_write_files", racing_write)
  files = ctr.train_files(CONFIG, SEED, str(tmp_path))
  assert len(calls) == 2
  assert os.listdir(tmp_path) == [os.path.basename(files.directory)]  # No temp dir left.
  assert len(_read(files.dataset_fn(1000)(tf.distribute.InputContext()))[0]["label"]) == 1000


# --- shards -----------------------------------------------------------------------

# 40: 5 whole blocks a batch; 24 cuts blocks (blocks parsed, then split).
@pytest.mark.parametrize("batch", [40, 24])
@pytest.mark.parametrize("num_shards", [1, 7, 25])  # One, some, more than files.
def test_shards_cover_every_record_once_in_whole_batches(tmp_path, num_shards, batch):
  # 1000 examples in files of 64: shards start inside files (and, at 24, inside blocks).
  fn = ctr.train_files(CONFIG, SEED, str(tmp_path)).dataset_fn(batch)
  total = -(-1000 // batch)
  shards = []
  for shard in range(num_shards):
    dataset = fn(tf.distribute.InputContext(num_shards, shard))
    batches = _read(dataset)
    assert int(dataset.cardinality()) == len(batches)  # Known: the ledger need not count.
    shards.append(batches)
  sizes = [len(b) for b in shards]
  assert sum(sizes) == total and max(sizes) - min(sizes) <= 1  # Balanced, contiguous.
  every = [b for batches in shards for b in batches]
  last = 1000 - batch * (total - 1)
  assert [len(b["label"]) for b in every] == [batch] * (total - 1) + [last]
  _assert_examples_equal(_concat(every), _expected())


def test_only_the_last_batch_is_short_and_more_shards_than_batches_are_empty(tmp_path):
  fn = ctr.train_files(CONFIG, SEED, str(tmp_path)).dataset_fn(300)  # 4 batches, last 100.
  shards = [_read(fn(tf.distribute.InputContext(6, s))) for s in range(6)]
  assert [[len(b["label"]) for b in batches] for batches in shards] == \
      [[], [300], [300], [], [300], [100]]


def test_a_tensor_shard_index_inside_a_function_reads_the_same_shard(tmp_path):
  num_shards, batch = 7, 40
  fn = ctr.train_files(CONFIG, SEED, str(tmp_path)).dataset_fn(batch)

  @tf.function
  def shard_dense(shard):
    dataset = fn(tf.distribute.InputContext(num_shards, shard))
    whole = dataset.map(lambda example: example["dense"]).unbatch().batch(10**6)
    return dataset.cardinality(), whole.get_single_element()

  expected = _expected()
  start = 0
  for shard in range(num_shards):
    cardinality, dense = shard_dense(tf.constant(shard, tf.int64))
    assert int(cardinality) * batch == len(dense)
    np.testing.assert_array_equal(dense.numpy(), expected["dense"][start:start + len(dense)])
    start += len(dense)
  assert start == 1000


def test_the_runtime_measures_and_positions_the_files(tmp_path):
  fn = ctr.train_files(CONFIG, SEED, str(tmp_path)).dataset_fn(40)
  source = positioned.PositionedInput(fn, num_replicas_in_sync=1, what="ctr")
  assert not source.is_endless
  ledger = source.measure(num_shards=None, steps_per_closure=6)  # ceil(25 / 6) shards.
  assert ledger.lengths == (5, 5, 5, 5, 5)

  @tf.function
  def first_dense(shard, start):  # As a closure builds its chunk on a worker.
    return next(iter(source.chunk(5, shard, start)))["dense"][0]

  expected = _expected()
  for shard, start, batch_index in [(0, 0, 0), (1, 2, 7), (4, 3, 23)]:
    got = first_dense(tf.constant(shard, tf.int64), tf.constant(start, tf.int64))
    np.testing.assert_array_equal(got.numpy(), expected["dense"][40 * batch_index])
