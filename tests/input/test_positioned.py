"""Positioned input on a real (in-process) cluster: every example once per epoch.

The `counting` experiment (support/experiments/) adds 1 to a checkpointed
`counts[id]` for every id it trains on, so the final checkpoint is the
ground truth of what training read. Faults are in e2e/test_failure_matrix.py;
here: plain runs, a resumed run, and the input forms that are refused.
"""


import dataclasses
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tfps.coordinator import run as coordinator_run
from tfps.input import positioned as positioned_lib
from tfps.coordinator import trainer as trainer_lib
from tfps.fast_restart import failover_graphs
from tfps.fast_restart import trace_cache
from tfps.fast_restart import warm_up
from tfps.fast_restart import worker_functions
from tfps.recovery import coverage
from tfps.recovery import events as events_lib
from tfps.base import errors
from tfps.recovery import progress_log as progress_lib

import input_experiments  # tests/support/experiments/, on sys.path (conftest.py).

pytestmark = pytest.mark.tf

# 60 batches in 12 shards of 5 (shards of about one 5-step closure): no short batch.
EXAMPLES, BATCH, EPOCH = 960, 16, 60

OPTIONS = trainer_lib.LoopOptions


@pytest.fixture(scope="module")
def cluster(inprocess_cluster):
  # The session's: TensorFlow connects a process to one cluster only.
  return inprocess_cluster


def _config(cluster, model_dir, **overrides):
  kwargs = dict(cluster=cluster, model_dir=str(model_dir), mode="train",
                experiment="input_experiments:counting",
                experiment_params={"examples": str(EXAMPLES)}, global_batch_size=BATCH,
                steps_per_loop=20, checkpoint_interval=20, steps_per_closure=5,
                ready_timeout=30)
  kwargs.update(overrides)
  return coordinator_run.CoordinatorConfig(**kwargs)


def _counts(result):
  return input_experiments.counts_in(result.checkpoint)


def _coverage(model_dir):
  return coverage.account(progress_lib.ProgressLog(str(model_dir)).read_new())


def test_one_epoch_trains_every_example_once(cluster, tmp_path):
  result = coordinator_run.run_coordinator(_config(cluster, tmp_path, train_steps=EPOCH))
  assert result.global_step == EPOCH
  assert np.array_equal(_counts(result), np.ones(EXAMPLES, np.int32))
  assert result.input["positioned"] and result.input["batches_per_epoch"] == EPOCH
  accounted = _coverage(tmp_path)
  assert accounted.ok and accounted.epochs_completed == 1 and accounted.kept == EPOCH


def test_a_resumed_run_continues_the_epoch_where_the_checkpoint_was(cluster, tmp_path, caplog):
  first = coordinator_run.run_coordinator(_config(cluster, tmp_path, train_steps=30))
  counts = _counts(first)
  assert counts.sum() == 30 * BATCH and counts.max() == 1  # Part of an epoch, none twice.
  caplog.set_level("INFO", logger="absl")
  second = coordinator_run.run_coordinator(_config(cluster, tmp_path, train_steps=EPOCH * 2))
  # The second coordinator ran the first one's stored traces, on its own variables.
  assert "full closure rebuilt" in caplog.text and "traced again" not in caplog.text
  assert np.array_equal(_counts(second), np.full(EXAMPLES, 2, np.int32))
  accounted = _coverage(tmp_path)
  assert accounted.ok and accounted.epochs_completed == 2
  epochs = [e for e in events_lib.EventLog(str(tmp_path)).read() if e.kind == "epoch"]
  assert [e.step for e in epochs] == [EPOCH, 2 * EPOCH], epochs  # Once each, resume or not.


def test_a_restart_takes_the_inputs_length_from_its_checkpoint_instead_of_counting(
    cluster, tmp_path, monkeypatch, caplog):
  # tf.data does not know a filtered input's length (nor a file's records'): a first
  # start counts it, reading the whole input on the chief; a restart must not again.
  config = lambda steps: _config(cluster, tmp_path, train_steps=steps,
                                 experiment_params={"examples": str(EXAMPLES),
                                                    "unknown_length": "1"})
  coordinator_run.run_coordinator(config(30))

  def no_count(dataset):
    raise AssertionError("the input was counted again")

  monkeypatch.setattr(positioned_lib, "_counted", no_count)
  caplog.set_level("INFO", logger="absl")
  second = coordinator_run.run_coordinator(config(EPOCH * 2))
  assert "60 batches an epoch, as the checkpoint recorded" in caplog.text
  assert np.array_equal(_counts(second), np.full(EXAMPLES, 2, np.int32))
  assert _coverage(tmp_path).ok


def test_a_saved_length_stands_for_a_count_only(tmp_path):
  missing = str(tmp_path / "none.tfrecord")  # Counting it would read it.
  records = lambda ctx: tf.data.TFRecordDataset([missing]).shard(
      ctx.num_input_pipelines, ctx.input_pipeline_id).batch(2)
  with pytest.raises(tf.errors.NotFoundError):
    positioned_lib.PositionedInput(records, num_replicas_in_sync=1, what="records")
  saved = positioned_lib.PositionedInput(records, num_replicas_in_sync=1, what="records",
                                         saved_batches=7)
  assert not saved.is_endless
  # Made endless since the checkpoint: tf.data says so, and its length is not taken.
  endless = positioned_lib.PositionedInput(lambda ctx: records(ctx).repeat(),
                                           num_replicas_in_sync=1, what="records",
                                           saved_batches=7)
  assert endless.is_endless


def test_a_python_generator_cannot_be_positioned(runtime):
  def gen():
    yield from range(10)

  dataset = tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec([], tf.int64))
  with pytest.raises(errors.UsageError, match="from_generator or py_function"):
    positioned_lib.PositionedInput(lambda ctx: dataset.batch(2), num_replicas_in_sync=1,
                                   what="MyTrainer.train_dataset")


def test_endless_input_is_read_per_worker_and_said_once(runtime, caplog):
  step = tf.Variable(0, dtype=tf.int64)
  endless = input_experiments.dataset_fn_for(100, 4)
  trainer = input_experiments.CountingTrainer(
      tf.Variable(tf.zeros([100], tf.int32)), step, lambda ctx: endless(ctx).repeat())
  with caplog.at_level("WARNING"):
    ps_trainer = trainer_lib.PSTrainer(trainer, runtime, OPTIONS(steps_per_closure=5))
  assert not ps_trainer.positioned and ps_trainer.ledger is None
  assert "is endless (repeat()?)" in caplog.text


def test_a_loop_cut_short_by_an_interrupt_takes_no_chunk_it_does_not_train(runtime):
  step = tf.Variable(0, dtype=tf.int64)
  counts = tf.Variable(tf.zeros([EXAMPLES], tf.int32))
  trainer = input_experiments.CountingTrainer(
      counts, step, input_experiments.dataset_fn_for(EXAMPLES, BATCH))
  ps_trainer = trainer_lib.PSTrainer(
      trainer, runtime, OPTIONS(steps_per_closure=5),
      pause=lambda: ps_trainer.closures_scheduled >= 1)  # Once the first is scheduled.
  ps_trainer.train(tf.constant(20))  # One closure, then stop.
  assert ps_trainer.closures_scheduled == 1
  assert int(step.numpy()) == ps_trainer.ledger.taken == 5
  assert counts.numpy().sum() == 5 * BATCH


def test_steps_a_woken_run_trains_between_loops_are_counted_re_executed(runtime):
  # A paused worker's closure run again elsewhere: the first run, woken after
  # its loop was counted, trains until its fence check. The next loop counts
  # those steps as re-executed, and the global step stays the input's position.
  step, counts, _, ps_trainer = _looped_start(runtime)
  ps_trainer.train(tf.constant(20))
  step.assign_add(7)  # What the woken run's steps do to the counter.
  ps_trainer.train(tf.constant(20))
  assert int(step.numpy()) == ps_trainer.ledger.taken == 40
  assert ps_trainer.reexecuted_steps == ps_trainer.ledger.reexecuted == 7
  assert ps_trainer.last_loop.reexecuted == 7
  assert counts.numpy().sum() == 40 * BATCH


def test_a_restored_step_ahead_of_the_restored_input_is_set_back_at_the_start(runtime):
  # The woken run's steps landed after the loop's count and before the save: the
  # checkpoint's step is ahead of its ledger. The restored coordinator's start counts
  # them re-executed, and its first loop starts at the input's position.
  step, counts, _, ps_trainer = _looped_start(runtime)
  ps_trainer.train(tf.constant(20))
  step.assign_add(4)  # Before the save.
  restored = trainer_lib.PSTrainer(
      input_experiments.CountingTrainer(counts, step,
                                        input_experiments.dataset_fn_for(EXAMPLES, BATCH)),
      runtime, OPTIONS(steps_per_closure=10))
  restored.input_state.deserialize(ps_trainer.input_state.serialize())  # As a restore does.
  restored.start_training()
  assert int(step.numpy()) == restored.ledger.taken == 20
  assert restored.reexecuted_steps == restored.ledger.reexecuted == 4
  restored.train(tf.constant(20))
  assert int(step.numpy()) == restored.ledger.taken == 40
  assert counts.numpy().sum() == 40 * BATCH


def test_an_interrupt_pending_at_a_loop_start_schedules_and_traces_nothing(runtime):
  # A SIGTERM during the loop before a write-out: tracing and instantiating the
  # written-out closures first would hold the save (and the exit) ~10 s.
  pending = [False]
  _, counts, closures, ps_trainer = _looped_start(runtime, pause=lambda: pending[0])
  ps_trainer.train(tf.constant(20))  # Fast-start closures; the write-out is due next.
  traced, pending[0] = ps_trainer.closures_traced, True
  ps_trainer.train(tf.constant(20))
  assert closures.names == ["fast_closure"] * 2 and ps_trainer.ledger.taken == 20
  assert ps_trainer.closures_traced == traced and not ps_trainer.workers_kept_warm
  pending[0] = False  # Served (a save on a task's notice): training goes on.
  ps_trainer.train(tf.constant(40))
  assert closures.names[2:] == ["full_closure"] * 4, closures.names
  assert np.array_equal(counts.numpy(), np.ones(EXAMPLES, np.int32))  # Each batch once.


class _ClosureLog:
  """Wraps the coordinator's `schedule`: which function each closure ran."""

  def __init__(self, coordinator):
    self._coordinator, self.names = coordinator, []

  def schedule(self, fn, args=None, kwargs=None):
    name = fn.python_function.__name__  # Less this process's tag and count:
    self.names.append(worker_functions.kind(name))
    return self._coordinator.schedule(fn, args=args, kwargs=kwargs)

  def __getattr__(self, name):
    return getattr(self._coordinator, name)


class _Scheduling:
  """Wraps the coordinator: `then()` before each closure is scheduled."""

  def __init__(self, coordinator, then):
    self._coordinator, self._then = coordinator, then

  def schedule(self, fn, args=None, kwargs=None):
    self._then()
    return self._coordinator.schedule(fn, args=args, kwargs=kwargs)

  def __getattr__(self, name):
    return getattr(self._coordinator, name)


def _looped_start(runtime, examples=EXAMPLES, pause=None):
  """(step, counts, closure log, trainer) of a counting run whose looped start is past
  once its first loop ends."""
  step = tf.Variable(0, dtype=tf.int64)
  counts = tf.Variable(tf.zeros([examples], tf.int32))
  trainer = input_experiments.CountingTrainer(
      counts, step, input_experiments.dataset_fn_for(examples, BATCH))
  closures = _ClosureLog(runtime.coordinator)
  ps_trainer = trainer_lib.PSTrainer(
      trainer, dataclasses.replace(runtime, coordinator=closures),
      OPTIONS(steps_per_closure=10, looped_seconds=1e-9), pause=pause)
  return step, counts, closures, ps_trainer


def test_a_looped_start_writes_out_after_its_time_and_reads_each_batch_once(runtime):
  step, counts, closures, ps_trainer = _looped_start(runtime)
  ps_trainer.train(tf.constant(20))  # Fast-start closures.
  assert closures.names == ["fast_closure"] * 2 and ps_trainer.full_closure_ready.is_set()
  assert ps_trainer.last_loop.looped  # Its progress record says so (not full speed).
  assert not ps_trainer.workers_kept_warm
  ps_trainer.train(tf.constant(40))  # The rest of the epoch, written out.
  assert not ps_trainer.last_loop.looped
  assert closures.names[2:] == ["full_closure"] * 4, closures.names
  assert ps_trainer.workers_kept_warm  # Their warm-ups trained nothing (below).
  assert np.array_equal(counts.numpy(), np.ones(EXAMPLES, np.int32))  # Each batch once.
  assert int(step.numpy()) == EPOCH


@pytest.mark.parametrize("fast_start", [True, False])
def test_every_loop_a_failover_graph_held_up_is_marked_and_the_graph_trains_nothing(
    runtime, tmp_path, monkeypatch, fast_start):
  # The written-out closure's failover graph, from the second written-out loop.
  # A loop marked `warming` gives no step time: one that waited for a worker
  # without the mark made a run look slower than it is (closure sizes, the
  # write-out's decision).
  asked, warming, go_on = [], [], threading.Event()
  start = failover_graphs.FailoverGraphs.start
  monkeypatch.setattr(failover_graphs.FailoverGraphs, "start",
                      lambda self, kind: asked.append(str(kind)) or start(self, kind))
  # Each worker optimizes it when it next takes work: here, held until the loop
  # after the one that asked schedules its closures, which then wait for it.
  warm_once = warm_up.warm_once
  monkeypatch.setattr(warm_up, "warm_once", lambda coordinator, calls, *args, **kwargs: warm_once(
      coordinator, [(lambda: go_on.wait(60), ()), *calls], *args, **kwargs))
  step = tf.Variable(0, dtype=tf.int64)
  counts = tf.Variable(tf.zeros([EXAMPLES], tf.int32))
  trainer = input_experiments.CountingTrainer(
      counts, step, input_experiments.dataset_fn_for(EXAMPLES, BATCH))
  cache = trace_cache.TraceCache(str(tmp_path), {"experiment": "counting"})
  coordinator = _Scheduling(runtime.coordinator, lambda: asked and go_on.set())
  ps_trainer = trainer_lib.PSTrainer(trainer, dataclasses.replace(runtime, coordinator=coordinator),
                                     OPTIONS(steps_per_closure=10, trace_cache=cache,
                                             looped_seconds=1e-9 if fast_start else 0.0,
                                             failover_graphs=True))
  for _ in range(4):  # An epoch. Fast start: looped, then written out; else written out.
    ps_trainer.train(tf.constant(EPOCH // 4))
    warming.append(ps_trainer.last_loop.warming)
  assert set(asked) == {"full"}, asked  # The fast start's one loop asks for nothing.
  # Asked from the second written-out loop (not the write-out's own); the loop it
  # held up is marked too, and so is any after it while a worker still optimizes.
  asking = 2 if fast_start else 1
  assert warming[:asking + 2] == [False] * asking + [True, True], warming
  # One graph, held by both workers (a worker the last loop did not wait for may
  # still be optimizing it).
  record, began = failover_graphs.Record(str(tmp_path / failover_graphs.RECORD)), time.monotonic()
  while sum(map(len, record.read().values())) < 2 and time.monotonic() - began < 60:
    time.sleep(0.05)
  assert [len(workers) for workers in record.read().values()] == [2], record.read()
  assert np.array_equal(counts.numpy(), np.ones(EXAMPLES, np.int32))  # Built, trained nothing.


def test_the_written_out_closures_wait_while_a_worker_does_not_answer(runtime, monkeypatch):
  # Their first trace registers functions with every worker: a paused one would
  # hold the whole coordinator, so the looped ones go on until it answers.
  from tfps.cluster import readiness
  reachable = readiness.reachable
  silent, probes, clock = {"worker:1"}, [], [0.0]
  monkeypatch.setattr(readiness, "reachable", lambda cluster, tasks, timeout: probes.append(
      tasks) or {t for t in reachable(cluster, tasks, timeout) if str(t) not in silent})
  monkeypatch.setattr(trainer_lib, "_now", lambda: clock[0])
  examples = 80 * BATCH  # An epoch of 4 loops of 20 steps.
  _, counts, closures, ps_trainer = _looped_start(runtime, examples)
  ps_trainer.train(tf.constant(20))
  ps_trainer.train(tf.constant(20))  # Ready to write out, but worker:1 is silent.
  assert closures.names == ["fast_closure"] * 4 and ps_trainer.full_closure_ready.is_set()
  assert probes
  probed, _ = len(probes), silent.clear()
  # It answers now; but it was silent a moment ago, and the next loops do not each
  # wait for a probe (a paused worker's can take up to 0.3 s) until a while later.
  ps_trainer.train(tf.constant(20))
  assert closures.names[4:] == ["fast_closure"] * 2 and len(probes) == probed
  clock[0] += trainer_lib._SILENT_RECHECK_SECONDS  # pylint: disable=protected-access
  ps_trainer.train(tf.constant(20))
  assert closures.names[6:] == ["full_closure"] * 2, closures.names
  assert np.array_equal(counts.numpy(), np.ones(examples, np.int32))  # Each batch once.


def test_by_default_every_full_closure_is_written_out(runtime):
  step = tf.Variable(0, dtype=tf.int64)
  trainer = input_experiments.CountingTrainer(
      tf.Variable(tf.zeros([EXAMPLES], tf.int32)), step,
      input_experiments.dataset_fn_for(EXAMPLES, BATCH))
  closures = _ClosureLog(runtime.coordinator)
  ps_trainer = trainer_lib.PSTrainer(trainer, dataclasses.replace(runtime, coordinator=closures),
                                     OPTIONS(steps_per_closure=5))
  ps_trainer.train(tf.constant(20))
  assert closures.names == ["full_closure"] * 4 and ps_trainer.full_closure_ready.is_set()
  assert ps_trainer.workers_kept_warm and int(step.numpy()) == 20
  assert not ps_trainer.last_loop.looped


def _tail_trainer(runtime, closures, target):
  # 433 ids in 3 strided shards of 145, 144, 144 ids: 10, 9 and 9 batches of 16.
  counts = tf.Variable(tf.zeros([433], tf.int32))
  trainer = input_experiments.CountingTrainer(
      counts, tf.Variable(0, dtype=tf.int64), input_experiments.dataset_fn_for(433, 16))
  ps_trainer = trainer_lib.PSTrainer(
      trainer, dataclasses.replace(runtime, coordinator=closures),
      OPTIONS(steps_per_closure=10, input_shards=3, loop_slack=4))
  ps_trainer.target = target
  assert ps_trainer.ledger.lengths == (10, 9, 9)
  return ps_trainer, counts


def test_a_loop_ends_at_a_shard_tail_instead_of_a_closure_for_it(runtime):
  closures = _ClosureLog(runtime.coordinator)
  ps_trainer, counts = _tail_trainer(runtime, closures, target=28)
  ps_trainer.train(tf.constant(20))  # Shards 0 and 1 (10 + 9): 1 step short, within 4.
  assert closures.names == ["full_closure", "other_closure"]
  assert int(ps_trainer.trainer.global_step.numpy()) == ps_trainer.ledger.taken == 19
  ps_trainer.train(tf.constant(9))  # Reaches the target: exact.
  assert int(ps_trainer.trainer.global_step.numpy()) == 28
  assert np.array_equal(counts.numpy(), np.ones(433, np.int32))  # The epoch, each batch once.


def test_the_loop_that_reaches_the_target_trains_all_its_steps(runtime):
  closures = _ClosureLog(runtime.coordinator)
  ps_trainer, counts = _tail_trainer(runtime, closures, target=20)
  ps_trainer.train(tf.constant(20))  # 10 + 9, and the shard tail's 1 in a third closure.
  assert closures.names == ["full_closure", "other_closure", "other_closure"]
  assert [c.count for c in ps_trainer.last_loop.chunks] == [10, 9, 1]
  # Shards 0 and 1 whole (145 and 144 ids), and shard 2's first batch.
  assert int(ps_trainer.trainer.global_step.numpy()) == 20
  assert counts.numpy().sum() == 145 + 144 + 16


def test_orbits_step_count_warning_does_not_reach_the_log(caplog):
  from absl import logging  # pylint: disable=import-outside-toplevel
  with caplog.at_level("WARNING"), coordinator_run.routine_lines_dropped():
    logging.warning("`trainer.train(100)` did not update `global_step` by 100. Old value ...")
    logging.warning("another warning")
  assert "did not update" not in caplog.text and "another warning" in caplog.text


def _chunk_forms(tmp_path, examples):
  """dataset_fns of the forms users write, each one epoch of batches of the ids 0..examples-1."""
  paths = []
  for f in range(3):
    paths.append(str(tmp_path / f"ids-{f}.tfrecord"))
    with tf.io.TFRecordWriter(paths[-1]) as writer:
      for i in range(f, examples, 3):
        writer.write(str(i).encode())
  text = tmp_path / "ids.csv"
  text.write_text("".join(f"{i},x\n" for i in range(examples)))
  to_id = lambda record: tf.strings.to_number(record, tf.int64)
  csv_id = lambda line: tf.io.decode_csv(line, [tf.constant(0, tf.int64), ""])[0]
  shard = lambda d, ctx: d.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
  return {
      "range.shard.batch": lambda ctx: shard(tf.data.Dataset.range(examples), ctx).batch(5),
      "range.map.shard.batch.map": lambda ctx: shard(
          tf.data.Dataset.range(examples).map(lambda x: x + 1), ctx).batch(5).map(
              lambda x: x - 1),
      "range.batch.shard": lambda ctx: shard(tf.data.Dataset.range(examples).batch(5), ctx),
      "slices.shard.batch": lambda ctx: shard(tf.data.Dataset.from_tensor_slices(
          {"id": np.arange(examples)}), ctx).batch(5).map(lambda d: d["id"]),
      "files.shard.interleave": lambda ctx: shard(tf.data.Dataset.from_tensor_slices(paths),
                                                  ctx).interleave(tf.data.TFRecordDataset)
          .batch(5).map(to_id),
      "tfrecord.shard.batch": lambda ctx: shard(tf.data.TFRecordDataset(paths), ctx).batch(
          5).map(to_id),
      "text.shard.batch": lambda ctx: shard(tf.data.TextLineDataset(str(text)), ctx).batch(
          5).map(csv_id),
  }


@pytest.mark.parametrize("form", ["range.shard.batch", "range.map.shard.batch.map",
                                  "range.batch.shard", "slices.shard.batch",
                                  "files.shard.interleave", "tfrecord.shard.batch",
                                  "text.shard.batch"])
def test_each_chunk_is_its_slice_of_the_shard_and_an_epoch_every_id_once(tmp_path, form):
  examples = 203
  dataset_fn = _chunk_forms(tmp_path, examples)[form]
  source = positioned_lib.PositionedInput(dataset_fn, num_replicas_in_sync=1, what=form)
  ledger = source.measure(num_shards=3, steps_per_closure=4)

  @tf.function
  def chunk_ids(shard, start, count):
    batches = source.chunk(3, shard, start).take(count)
    return batches.reduce(tf.zeros([0], tf.int64), lambda ids, b: tf.concat([ids, b], 0))

  def plain(shard):  # The shard read from its start, eagerly: the reference.
    return [b.numpy().tolist() for b in dataset_fn(tf.distribute.InputContext(3, shard))]

  shards = {s: plain(s) for s in range(3)}
  seen = []
  while ledger.epoch == 0:
    chunk = ledger.take(4)
    if chunk.epoch:
      break
    ids = chunk_ids(tf.constant(chunk.shard, tf.int64), tf.constant(chunk.start, tf.int64),
                    tf.constant(chunk.count, tf.int64)).numpy().tolist()
    want = shards[chunk.shard][chunk.start:chunk.start + chunk.count]
    assert ids == [i for batch in want for i in batch], chunk
    seen += ids
  assert sorted(seen) == list(range(examples))


@pytest.mark.parametrize("form,shards", [("tfrecord.shard.batch", 3), ("text.shard.batch", 3),
                                         ("range.batch.shard", 3), ("range.shard.batch", 41),
                                         ("files.shard.interleave", 41)])
def test_a_form_whose_shards_each_read_all_the_data_gets_one_shard_per_worker(
    tmp_path, form, shards):
  """Each worker then reads on through its own, as TF's per-worker input does; shards of a
  closure each would read all the data once a closure."""
  source = positioned_lib.PositionedInput(_chunk_forms(tmp_path, 203)[form],
                                          num_replicas_in_sync=1, what=form)
  assert source.reads_all_shards == (shards == 3)
  assert source.measure(num_shards=None, steps_per_closure=1, num_workers=3).num_shards == shards
  assert source.measure(num_shards=5, steps_per_closure=1, num_workers=3).num_shards == 5


def test_shard_lengths_are_counted_where_tf_data_does_not_know_them():
  built = []

  # A filter hides the cardinality: shard s of 4 keeps the multiples of 3 in it.
  def dataset_fn(ctx):
    built.append(ctx.input_pipeline_id)
    ids = tf.data.Dataset.range(100).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return ids.filter(lambda x: x % 3 == 0).batch(2)

  source = positioned_lib.PositionedInput(dataset_fn, num_replicas_in_sync=1, what="filtered")
  built.clear()
  ledger = source.measure(num_shards=4, steps_per_closure=2)
  # Built once for a shard id given as a tensor, not once per shard in Python
  # (~50 ms each for a pipeline with a map: seconds for hundreds of shards).
  assert len(built) == 1 and tf.is_tensor(built[0])
  expected = [len(list(dataset_fn(tf.distribute.InputContext(4, s)))) for s in range(4)]
  assert list(ledger.lengths) == expected and sum(expected) == 18


def test_a_shard_that_is_endless_when_the_whole_is_not_is_refused():
  def dataset_fn(ctx):  # Its shards repeat for ever: not parts of the whole.
    ids = tf.data.Dataset.range(40)
    if ctx.num_input_pipelines == 1:
      return ids.batch(4)
    return ids.repeat().shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(4)

  source = positioned_lib.PositionedInput(dataset_fn, num_replicas_in_sync=1, what="broken")
  with pytest.raises(errors.UsageError, match=r"broken: shard 0 of 2 is endless although"):
    source.measure(num_shards=2, steps_per_closure=2)
