"""Checkpoints (tfps.coordinator.checkpoints): restored or refused on the default
strategy; written in the background on the in-process cluster."""

import gc
import threading
import weakref

import numpy as np
import orbit
import pytest
import tensorflow as tf
import tf_keras

from tfps.base import errors
from tfps.coordinator import checkpoints
from tfps.coordinator import loop_ends

from tests.support import inprocess
from tests.support import registrations

pytestmark = pytest.mark.tf


def _saved_dense(tmp_path, units):
  layer = tf_keras.layers.Dense(units)
  layer.build((None, 2))
  step = orbit.utils.create_global_step()
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(global_step=step, model=layer), str(tmp_path), max_to_keep=1)
  return layer, step, manager


def test_restore_roundtrip_and_empty_dir(tmp_path, caplog):
  caplog.set_level("INFO", logger="absl")
  layer, step, manager = _saved_dense(tmp_path, 3)
  assert checkpoints.restore(manager, step, experiment="e") is None
  step.assign(7)
  path = manager.save(checkpoint_number=7)
  _, step2, manager2 = _saved_dense(tmp_path, 3)
  assert checkpoints.restore(manager2, step2, experiment="e") == path
  assert int(step2.numpy()) == 7
  assert f"restored {path} at step 7" in caplog.text


@pytest.mark.parametrize("other", ["wider", "different"])
def test_restore_from_incompatible_model_is_permanent(tmp_path, other):
  _, step, manager = _saved_dense(tmp_path, 3)
  path = manager.save(checkpoint_number=1)
  if other == "wider":
    _, step2, manager2 = _saved_dense(tmp_path, 4)
  else:
    embedding = tf_keras.layers.Embedding(10, 2)
    embedding.build((None,))
    step2 = orbit.utils.create_global_step()
    manager2 = tf.train.CheckpointManager(
        tf.train.Checkpoint(global_step=step2, table=embedding), str(tmp_path), max_to_keep=1)
  with pytest.raises(errors.PermanentError) as e:
    checkpoints.restore(manager2, step2, experiment="ctr")
  message = str(e.value)
  assert message.startswith(f"checkpoint {path} does not fit experiment 'ctr' (")
  assert "\n" not in message and len(message) < 400


def test_check_writable_creates_the_directory(tmp_path):
  checkpoints.check_writable(str(tmp_path / "a" / "b"))
  assert (tmp_path / "a" / "b").is_dir()
  assert not list((tmp_path / "a" / "b").iterdir())  # The probe file is gone.


class _HeldWrite(tf.Module):
  """A checkpointed value whose background write waits until the test lets it go."""

  def __init__(self):
    super().__init__()
    self.release = threading.Event()
    self.writing = threading.Event()

  def _serialize_to_tensors(self):
    return {"held": tf.constant(1)}

  def _copy_trackable_to_cpu(self, object_map):
    if self not in object_map:
      object_map[self] = _HeldSnapshot(self)


class _HeldSnapshot(tf.__internal__.tracking.Trackable):
  def __init__(self, source):
    self._source = source

  def _serialize_to_tensors(self):  # Runs in the writer thread.
    self._source.writing.set()
    assert self._source.release.wait(timeout=60), "the test never released the write"
    return {"held": tf.constant(1)}


def test_an_async_save_returns_before_the_write_and_writes_the_state_it_was_given(
    runtime, tmp_path):
  from tfps.input import ledger as ledger_lib
  from tfps.input import positioned
  with runtime.strategy.scope():
    table = tf.Variable(tf.zeros([4096, 8]))  # 128 KiB: split over both ps.
    step = tf.Variable(0, dtype=tf.int64)
  assert len(getattr(table, "variables", [table])) == inprocess.NUM_PS
  state = positioned.LedgerState()
  state.ledger = ledger_lib.InputLedger([10, 10])
  held = _HeldWrite()
  checkpoint = tf.train.Checkpoint(table=table, step=step, input_ledger=state, held=held)
  manager = checkpoints.Manager(checkpoint, str(tmp_path), asynchronous=True,
                                before_save=[state.capture], max_to_keep=3)
  held.release.set()
  manager.save_now(0)  # The first save builds the snapshots (and waits here).
  held.release.clear()
  held.writing.clear()

  table.assign(tf.fill([4096, 8], 2.0))
  step.assign(5)
  state.ledger.take(5)
  path = manager.save(checkpoint_number=5)
  # Returned while its write waits in the background: training goes on meanwhile.
  assert held.writing.wait(timeout=60) and not held.release.is_set()
  assert manager.latest_checkpoint.endswith("-0")  # Not indexed before it is complete.
  table.assign(tf.fill([4096, 8], 3.0))
  step.assign(9)
  state.ledger.take(4)
  held.release.set()
  manager.sync()
  assert manager.latest_checkpoint == path
  writer = weakref.ref(checkpoint._async_checkpointer_impl)
  manager.close()
  gc.collect()
  # Nothing keeps TF's writer (and the function it traced on this cluster) past close:
  # TF's exit hook would, and remove the function at exit from whatever cluster is then connected.
  assert writer() is None

  restored = positioned.LedgerState()
  with runtime.strategy.scope():
    table2 = tf.Variable(tf.zeros([4096, 8]))
    step2 = tf.Variable(0, dtype=tf.int64)
  tf.train.Checkpoint(table=table2, step=step2, input_ledger=restored).read(path).expect_partial()
  assert int(step2.numpy()) == 5
  np.testing.assert_array_equal(tf.convert_to_tensor(table2).numpy(), np.full([4096, 8], 2.0))
  assert restored.ledger.taken == 5 and restored.ledger.positions == [5, 0]


def test_a_due_save_is_skipped_while_the_last_write_runs_and_made_at_the_next_loop_end(
    runtime, tmp_path):
  # TensorFlow's next save would wait for the write in flight: training would
  # stand still for the rest of it. The boundary stays unsaved instead.
  with runtime.strategy.scope():
    step = tf.Variable(0, dtype=tf.int64)
  held = _HeldWrite()
  checkpoint = tf.train.Checkpoint(step=step, held=held)
  ends = loop_ends.LoopEnds(steps_per_loop=10, checkpoint_interval=10)
  manager = checkpoints.Manager(checkpoint, str(tmp_path), asynchronous=True, max_to_keep=5,
                                step_counter=step, checkpoint_interval=10,
                                save_due=ends.save_due)
  held.release.set()
  manager.save_now(0)  # The first save builds the snapshots (and waits here).
  held.release.clear()
  held.writing.clear()
  try:
    step.assign(10)
    assert manager.save(checkpoint_number=10).endswith("-10")
    assert held.writing.wait(timeout=60) and manager.writing()
    step.assign(20)
    assert manager.save(checkpoint_number=20) is None  # Due; returned without waiting.
    assert (manager.saves, manager.saves_skipped) == (2, 1)
    assert manager.latest_checkpoint.endswith("-0")
  finally:
    held.release.set()
  manager.sync()
  assert not manager.writing() and manager.latest_checkpoint.endswith("-10")
  step.assign(25)  # The next loop end: boundary 20 is still unsaved.
  assert manager.save(checkpoint_number=25).endswith("-25")
  manager.sync()
  step.assign(27)  # Within the same interval: not due, whatever the writer does.
  assert manager.save(checkpoint_number=27) is None
  assert (manager.saves, manager.saves_skipped) == (3, 1)
  manager.close()
  assert manager.latest_checkpoint.endswith("-25")


class _FailsInBackground(tf.Module):
  """A checkpointed value whose background write fails as a lost ps's would."""

  def _serialize_to_tensors(self):
    return {"value": tf.constant(1)}

  def _copy_trackable_to_cpu(self, object_map):
    if self not in object_map:
      object_map[self] = _FailingSnapshot()


class _FailingSnapshot(tf.__internal__.tracking.Trackable):
  def _serialize_to_tensors(self):
    raise tf.errors.UnavailableError(None, None, "ps:0 is gone")


def test_a_failed_background_write_is_raised_by_sync_and_not_indexed(runtime, tmp_path):
  with runtime.strategy.scope():
    step = tf.Variable(1, dtype=tf.int64)
  checkpoint = tf.train.Checkpoint(step=step, value=_FailsInBackground())
  manager = checkpoints.Manager(checkpoint, str(tmp_path), asynchronous=True, max_to_keep=1)
  with pytest.raises(tf.errors.UnavailableError, match="ps:0 is gone"):
    manager.save_now(1)
  assert manager.latest_checkpoint is None
  manager.close()  # The error was raised once; closing does not raise it again.


@pytest.mark.parametrize("asynchronous", [True, False])
def test_saves_after_the_first_register_no_function_and_write_the_values_of_their_time(
    runtime, tmp_path, asynchronous, monkeypatch):
  # TensorFlow would trace and register a new function with every task at each
  # write; the registration waits, holding the GIL, for a paused worker.
  registered = registrations.record(monkeypatch)
  with runtime.strategy.scope():
    table = tf.Variable(tf.zeros([4096, 8]))  # Split over both ps.
    step = tf.Variable(0, dtype=tf.int64)
  checkpoint = tf.train.Checkpoint(table=table, step=step)
  manager = checkpoints.Manager(checkpoint, str(tmp_path), asynchronous=asynchronous,
                                max_to_keep=5)
  manager.save_now(0)  # A run's first save: what later ones reuse is made here.
  registered.clear()
  for number in (1, 2, 3):
    table.assign(tf.fill([4096, 8], float(number)))
    step.assign(number)
    manager.save_now(number)
  assert not registered
  manager.close()
  with runtime.strategy.scope():
    table2 = tf.Variable(tf.zeros([4096, 8]))
    step2 = tf.Variable(0, dtype=tf.int64)
  tf.train.Checkpoint(table=table2, step=step2).read(manager.latest_checkpoint).expect_partial()
  assert manager.latest_checkpoint.endswith("-3") and int(step2.numpy()) == 3
  np.testing.assert_array_equal(tf.convert_to_tensor(table2).numpy(), np.full([4096, 8], 3.0))


@pytest.mark.parametrize("asynchronous", [True, False])
def test_a_write_prepared_after_new_objects_leaves_the_next_save_nothing_to_register(
    runtime, tmp_path, asynchronous, monkeypatch):
  # An optimizer makes its slots after the run's first save: the next write
  # would register a new function (and remove the old one) at a loop's end,
  # waiting for a worker paused there. Prepared when they are made, it does not.
  calls = registrations.record(monkeypatch, registrations.REGISTER + registrations.REMOVE)
  with runtime.strategy.scope():
    step = tf.Variable(0, dtype=tf.int64)
  model = tf.Module()
  model.kernel = tf.Variable(tf.zeros([4]))
  manager = checkpoints.Manager(tf.train.Checkpoint(step=step, model=model), str(tmp_path),
                                asynchronous=asynchronous, max_to_keep=5)
  manager.save_now(0)
  with runtime.strategy.scope():
    model.slot = tf.Variable(tf.zeros([4]))  # Made by the first traced step.
  calls.clear()
  manager.prepare_writes()
  assert set(calls) & set(registrations.REGISTER)
  calls.clear()
  model.slot.assign([1.0, 2.0, 3.0, 4.0])
  step.assign(1)
  manager.save_now(1)
  assert not calls
  manager.close()
  reader = tf.train.load_checkpoint(manager.latest_checkpoint)
  [key] = [k for k in reader.get_variable_to_shape_map() if k.startswith("model/slot/")]
  np.testing.assert_array_equal(reader.get_tensor(key), [1.0, 2.0, 3.0, 4.0])


class _ConstantValue(tf.Module):
  """A checkpointed value made in Python at each write, as a constant: a write traced
  once would keep the first."""

  def __init__(self):
    super().__init__()
    self.value = 0

  def _serialize_to_tensors(self):
    return {"value": tf.constant(self.value)}


class _StateValue(tf.train.experimental.PythonState):
  """The same as a `PythonState` (made outside the write, captured by a trace)."""

  def __init__(self):
    self.value = 0

  def serialize(self):
    return str(self.value)

  def deserialize(self, string_value):
    self.value = int(string_value)


@pytest.mark.parametrize("kind", [_ConstantValue, _StateValue])
def test_a_value_made_in_python_is_written_as_it_is_at_each_save(runtime, tmp_path, kind):
  with runtime.strategy.scope():
    step = tf.Variable(0, dtype=tf.int64)
  python_value = kind()
  manager = checkpoints.Manager(tf.train.Checkpoint(step=step, python_value=python_value),
                                str(tmp_path), asynchronous=False, max_to_keep=5)
  for number in (1, 2, 3):
    python_value.value = number
    manager.save_now(number)
  manager.close()
  reader = tf.train.load_checkpoint(manager.latest_checkpoint)
  [key] = [k for k in reader.get_variable_to_shape_map() if k.startswith("python_value/")]
  assert int(reader.get_tensor(key)) == 3
