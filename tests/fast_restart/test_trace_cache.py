"""Stored traces of the train closures (tfps.fast_restart.trace_cache), in one process.

A "coordinator" here is a new set of variables and a new `TrainClosures`
over them, as a restarted coordinator has; closures run at once on the local
device. The cluster version (a restarted coordinator, every example once) is
in input/test_positioned.py.
"""

import collections
import json
import logging
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tfps.coordinator import closures as closures_lib
from tfps.fast_restart import trace_cache
from tfps.fast_restart import worker_functions

from tests.support import fakes

pytestmark = pytest.mark.tf

FULL = 4


class _Trainer(tf.Module):
  """Counts its steps, sums what it read, and keeps a running mean in a table row."""

  def __init__(self, width: int = 3):
    super().__init__()
    self.steps = tf.Variable(0, dtype=tf.int64)
    self.total = tf.Variable(0, dtype=tf.int64)
    self.row = tf.Variable(tf.zeros([width]))
    self.scale = tf.constant([1.0, 2.0, 3.0][:width])  # Captured by value.

  def train_step(self, iterator):
    value = next(iterator)
    self.steps.assign_add(1)
    self.total.assign_add(value)
    self.row.assign_add(self.scale * tf.cast(value, tf.float32))
    return {"value": tf.cast(value, tf.float32), "one": tf.constant(1.0)}


def _closures(trainer, cache):
  return closures_lib.TrainClosures(trainer.train_step, fakes.shard_iterator, full_size=FULL,
                                    unroll=FULL, what="Trainer", fast_unroll=2, cache=cache,
                                    variables_root=tf.train.Checkpoint(trainer=trainer))


def _train(closures):
  """A full-size closure written out and one of 3 steps, from shard 1."""
  shard, start = tf.constant(1, tf.int64), tf.constant(2, tf.int64)
  out = closures.schedule(fakes.FakeCoordinator(), FULL, True, (shard, start))
  closures.schedule(fakes.FakeCoordinator(), 3, True, (shard, start))
  return out


@pytest.fixture
def cache(tmp_path):
  return trace_cache.TraceCache(str(tmp_path / "traces"), {"experiment": "test"})


def _state(trainer):
  return int(trainer.steps.numpy()), int(trainer.total.numpy()), trainer.row.numpy().tolist()


def test_a_later_coordinator_runs_the_stored_closures_on_its_own_variables(cache, caplog):
  first = _Trainer()
  first_closures = _closures(first, cache)
  _train(first_closures)
  traced = _state(first)
  assert sorted(os.listdir(cache.directory)) == sorted(
      [os.path.basename(cache.path("full")), os.path.basename(cache.path("other"))])

  caplog.set_level("INFO", logger="absl")
  second = _Trainer()
  closures = _closures(second, cache)
  assert closures.write_out_stored()
  assert "rebuilt" not in caplog.text  # Known from the entries: rebuilt when first used.
  out = _train(closures)
  assert "full closure rebuilt" in caplog.text and "other closure rebuilt" in caplog.text
  # Nothing traced: the tf.functions were never called.
  assert all(f.experimental_get_tracing_count() == 0
             for f in closures._functions.values())  # pylint: disable=protected-access
  assert _state(second) == traced  # The same steps, on the new variables only.
  assert _state(first) == traced
  # Shard 1 (1, 3, 5, ...) from its third element: 5, 7, 9, 11 in the full-size closure.
  assert float(out["value"].numpy()) == 5 + 7 + 9 + 11
  assert float(out["one"].numpy()) == FULL


class _KerasTrainer(tf.Module):
  """A tf_keras model and optimizer, written for one machine: the optimizer's slots
  are made by its first `apply_gradients`, inside the traced step."""

  def __init__(self):
    super().__init__()
    self.model = tf_keras.Sequential([
        tf_keras.layers.Dense(2, name="hidden", kernel_initializer="ones"),
        tf_keras.layers.Dense(1, name="out", kernel_initializer="ones")])
    self.model.build((None, 1))
    self.optimizer = tf_keras.optimizers.Adam(0.1)

  def train_step(self, iterator):
    value = tf.reshape(tf.cast(next(iterator), tf.float32), [1, 1])
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(self.model(value) ** 2)
    variables = self.model.trainable_variables
    self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return {"loss": loss}


def test_an_optimizer_its_first_step_builds_is_built_ahead_and_the_trace_reused(cache, caplog):
  first = _KerasTrainer()
  _train(_closures(first, cache))
  slots = [(v.name, v.device) for v in first.optimizer.variables]
  caplog.set_level("INFO", logger="absl")
  second = _KerasTrainer()
  assert not second.optimizer.variables[2:]  # No slots yet (iterations, learning rate).
  closures = _closures(second, cache)
  assert closures.write_out_stored()  # Its optimizer built as the first one's trace did.
  assert [(v.name, v.device) for v in second.optimizer.variables] == slots
  _train(closures)
  assert "full closure rebuilt" in caplog.text and "traced again" not in caplog.text
  assert all(f.experimental_get_tracing_count() == 0
             for f in closures._functions.values())  # pylint: disable=protected-access
  # The same steps on its own model and slots: the same values as the first's.
  for mine, theirs in zip(second.model.variables + second.optimizer.variables,
                          first.model.variables + first.optimizer.variables):
    assert np.allclose(mine.numpy(), theirs.numpy()), mine.name


def test_asking_whether_the_write_out_is_stored_traces_nothing(cache):
  closures = _closures(_Trainer(), cache)
  assert not closures.write_out_stored()  # Nothing stored yet.
  assert all(f.experimental_get_tracing_count() == 0
             for f in closures._functions.values())  # pylint: disable=protected-access
  assert not os.path.exists(cache.directory)


def test_the_closure_for_other_sizes_is_traced_ahead_unless_stored(cache):
  first = _closures(_Trainer(), cache)
  first.trace_other_ahead()  # Nothing stored: traced now, and stored.
  assert first.traced() == 1
  later = _closures(_Trainer(), cache)
  later.trace_other_ahead()  # Stored: left to be rebuilt when a shard's tail needs it.
  assert later.traced() == 0
  assert later._concrete == {}  # pylint: disable=protected-access
  later.concrete("other")  # Rebuilt, not traced.
  assert later.traced() == 0


def test_a_different_variable_layout_is_traced_again(cache, caplog):
  _train(_closures(_Trainer(width=3), cache))
  caplog.set_level("INFO", logger="absl")
  other = _Trainer(width=2)
  closures = _closures(other, cache)
  assert not closures.write_out_stored()
  assert "variable" in caplog.text and "traced again" in caplog.text
  _train(closures)
  assert _state(other)[0] == FULL + 3


def test_a_changed_source_file_makes_the_entry_stale(cache, tmp_path, monkeypatch, caplog):
  module_path = tmp_path / "user_code.py"
  module_path.write_text("FACTOR = 1\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  import user_code  # pylint: disable=import-outside-toplevel,import-error
  try:
    _train(_closures(_Trainer(), cache))
    module_path.write_text("FACTOR = 22\n")  # Another size: changed whatever the clock says.
    caplog.set_level("INFO", logger="absl")
    assert not _closures(_Trainer(), cache).write_out_stored()
    assert f"{module_path} changed since it was traced" in caplog.text
  finally:
    del sys.modules[user_code.__name__]


def test_a_damaged_entry_is_traced_again_with_one_warning(cache, caplog):
  _train(_closures(_Trainer(), cache))
  with open(cache.path("full"), "r+", encoding="utf-8") as f:
    f.truncate(100)
  caplog.set_level("INFO", logger="absl")
  trainer = _Trainer()
  closures = _closures(trainer, cache)
  assert not closures.write_out_stored()
  warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and "did not load" in warnings[0].getMessage()
  _train(closures)
  assert _state(trainer)[0] == FULL + 3
  with open(cache.path("full"), encoding="utf-8") as f:
    assert json.load(f)["format"] == trace_cache.FORMAT  # Stored again, whole.


def test_another_key_does_not_see_the_entry(cache):
  _train(_closures(_Trainer(), cache))
  assert not _closures(_Trainer(), cache.extended(seed=2)).write_out_stored()
  assert _closures(_Trainer(), cache.extended()).write_out_stored()


def test_a_trace_stored_on_another_number_of_ps_counts_as_stored_for_its_key(cache):
  # What a coordinator restarted on the ps left after a failover asks, to keep
  # the closure size whose trace its predecessor stored on all the ps.
  on_two = cache.extended(steps=FULL, num_ps=2)
  _train(_closures(_Trainer(), on_two))
  assert on_two.stored("full") and not on_two.stored("fast")
  assert cache.extended(steps=FULL, num_ps=1).stored("full")
  assert not cache.extended(steps=FULL + 1, num_ps=1).stored("full")  # Another size.


def test_a_function_capturing_a_table_is_not_stored(cache, caplog):
  table = tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(tf.constant([0, 1], tf.int64),
                                          tf.constant([10, 20], tf.int64)), default_value=0)
  trainer = _Trainer()

  def step(iterator):
    trainer.total.assign_add(table.lookup(next(iterator) % 2))
    return {}

  closures = closures_lib.TrainClosures(step, fakes.shard_iterator, full_size=FULL, unroll=FULL,
                                        what="Table", cache=cache,
                                        variables_root=tf.train.Checkpoint(trainer=trainer))
  caplog.set_level("INFO", logger="absl")
  closures.schedule(fakes.FakeCoordinator(), FULL, True, (tf.constant(0, tf.int64),
                                                  tf.constant(0, tf.int64)))
  assert "not a variable the trainer tracks" in caplog.text
  assert not os.path.exists(cache.path("full"))
  assert int(trainer.total.numpy()) == 4 * 10  # Shard 0 reads 0, 2, 4, 6: key 0 each.


def test_changed_file_sees_size_time_and_removal(tmp_path):
  path = tmp_path / "a.py"
  path.write_text("x = 1\n")
  stat = os.stat(path)
  files = [(str(path), stat.st_size, stat.st_mtime_ns)]
  assert trace_cache.changed_file(files) is None
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
  assert trace_cache.changed_file(files) == str(path)
  path.unlink()
  assert trace_cache.changed_file(files) == str(path)


def _graph_cache_key(function) -> str:
  """The name a worker's graph cache files `function` under: less TF's counter."""
  return function.name.decode().rsplit("_", 1)[0]


def test_every_coordinator_of_a_cluster_runs_the_closure_under_one_name(cache, monkeypatch):
  cluster = {"chief": ["h:1"], "ps": ["h:2"], "worker": ["h:3", "h:4"]}

  def coordinator_in(cluster):
    # A new coordinator: a new process, which counts its rebuilds from 0.
    monkeypatch.setattr(worker_functions, "_REBUILT", collections.Counter())
    closures = _closures(_Trainer(), cache.in_cluster(cluster))
    _train(closures)
    return closures

  first = coordinator_in(cluster)
  traced = first._functions["full"].get_concrete_function(  # pylint: disable=protected-access
      *closures_lib._SPECS["full"])  # pylint: disable=protected-access
  assert worker_functions.PROCESS_TAG in _graph_cache_key(traced)  # Read by no other process.
  # The first coordinator runs it rebuilt from what it stored, as the next ones do.
  name = _graph_cache_key(first.concrete("full"))
  assert name != _graph_cache_key(traced)
  assert _graph_cache_key(coordinator_in(cluster).concrete("full")) == name
  renumbered = {**cluster, "worker": ["h:4", "h:3"]}
  assert _graph_cache_key(coordinator_in(renumbered).concrete("full")) != name
  # A placed graph names the ps by number, so another ps address (the one
  # left after losing the other of two) is the same graph, under the same name.
  other_ps = {**cluster, "ps": ["h:5"], "chief": ["h:6"]}
  assert _graph_cache_key(coordinator_in(other_ps).concrete("full")) == name
