"""The coordinator's run (tfps.coordinator.run): its config and result, checked
before it connects; then whole runs on the in-process cluster (conftest.py).

A run on the in-process cluster builds its own strategy on it, as a restarted
coordinator would.
"""

import glob
import json
import logging
import os
import threading

import pytest
import tensorflow as tf
import tf_keras

from tfps.base import errors
from tfps.cluster import spec as spec_lib
from tfps.coordinator import run as coordinator_run
from tfps.fast_restart import warm_up
from tfps.input import positioned as positioned_lib
from tfps.recovery import coverage
from tfps.recovery import interrupts as interrupts_lib
from tfps.recovery import progress_log

from tests.support import inprocess
from tests.support import linear_models
from tests.support import paths

pytestmark = pytest.mark.tf

# Nothing listens here: every case below must fail before connecting.
_CLUSTER = spec_lib.ClusterSpec.from_dict(
    {"chief": ["localhost:1"], "ps": ["localhost:2"], "worker": ["localhost:3"]})


def _config(tmp_path, **overrides):
  kwargs = dict(cluster=_CLUSTER, model_dir=str(tmp_path / "model"), ready_timeout=0.5)
  kwargs.update(overrides)
  return coordinator_run.CoordinatorConfig(**kwargs)


@pytest.mark.parametrize("field,value", [
    ("train_steps", 0), ("train_steps", -5), ("train_steps", True), ("train_steps", "10"),
    ("steps_per_loop", 0), ("steps_per_closure", 0), ("checkpoint_interval", 0),
    ("max_to_keep", 0), ("global_batch_size", -1), ("eval_steps", 0),
    ("eval_interval", 0), ("eval_shards", 0), ("min_shard_bytes", 0),
])
def test_config_rejects_non_positive_integers(tmp_path, field, value):
  with pytest.raises(errors.UsageError) as e:
    _config(tmp_path, **{field: value})
  assert str(e.value) == f"{field} ({value!r}) must be a positive integer"


@pytest.mark.parametrize("overrides,message", [
    ({"mode": "fit"}, "mode ('fit') must be one of train, train_and_eval, eval"),
    ({"seed": -1}, "seed (-1) must be a non-negative integer"),
    ({"ready_timeout": 0}, "ready_timeout (0) must be positive seconds"),
    ({"ps_timeout": 0}, "ps_timeout (0) must be positive seconds"),
    ({"ps_timeout": "10"}, "ps_timeout ('10') must be positive seconds"),
    ({"model_dir": ""}, "model_dir ('') must be a directory path"),
    ({"experiment": " "}, "experiment (' ') must be a name or package.module:factory"),
    ({"cluster": {"ps": ["h:1"]}}, "cluster (dict) must be a tfps.cluster.spec.ClusterSpec"),
    ({"experiment_params": {"a": 1}}, "experiment_params ({'a': 1}) must map strings to strings"),
    ({"tasks_left_out": ("ps:0",), "tasks_expected_back": ("ps:1",)},
     "tasks_expected_back ('ps:1') must be one of tasks_left_out ('ps:0',)"),
])
def test_config_rejects_bad_values_naming_field_and_value(tmp_path, overrides, message):
  with pytest.raises(errors.UsageError) as e:
    _config(tmp_path, **overrides)
  assert str(e.value) == message


def test_config_accepts_mode_strings_and_freezes(tmp_path):
  config = _config(tmp_path, mode="eval", experiment_params={"hidden": "8"})
  assert config.mode is coordinator_run.Mode.EVAL
  with pytest.raises(Exception):
    config.train_steps = 5  # Frozen.
  with pytest.raises(TypeError):
    config.experiment_params["hidden"] = "9"  # Read-only view.


def test_unwritable_model_dir_fails_before_connecting(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  config = _config(tmp_path, model_dir=str(blocker / "model"))
  with pytest.raises(errors.UsageError) as e:
    coordinator_run.run_coordinator(config)  # Would hang/fail differently if it tried the cluster.
  assert str(e.value).startswith(f"model_dir ({blocker / 'model'}): cannot write there (")
  assert "\n" not in str(e.value)


def test_unknown_experiment_fails_before_connecting(tmp_path):
  with pytest.raises(errors.UsageError) as e:
    coordinator_run.run_coordinator(_config(tmp_path, experiment="nosuch"))
  assert "experiment 'nosuch' is unknown" in str(e.value)


def test_result_as_dict_is_json():
  result = coordinator_run.CoordinatorResult(
      status=coordinator_run.RunStatus.FINISHED, experiment="ctr", mode=coordinator_run.Mode.TRAIN,
      global_step=10, start_step=0, train_steps=10, examples_per_sec=1.5, steps_per_sec=0.5,
      train_seconds=2.0, eval={"auc": 0.7}, checkpoint="/m/ckpt-10", model_dir="/m")
  d = json.loads(json.dumps(result.as_dict()))
  assert d["status"] == "finished" and d["mode"] == "train" and d["restarts"] == 0
  assert d["eval"] == {"auc": 0.7} and d["checkpoint"] == "/m/ckpt-10"
  assert f"{result.status}" == "finished"


@pytest.mark.parametrize("step,expected", [(0, 40), (40, 40), (80, 20), (90, 10), (100, 40)])
def test_loops_end_on_checkpoint_boundaries(step, expected):
  config = coordinator_run.CoordinatorConfig(
      cluster=_CLUSTER, model_dir="/m", steps_per_loop=40, checkpoint_interval=100, steps_per_closure=1)
  assert coordinator_run._loop_ends(config).next_loop(step) == expected


@pytest.mark.parametrize("make, steps, cannot_end", [
    (lambda: tf.data.Dataset.range(10).repeat(), 1000, True),
    (lambda: tf.data.Dataset.range(2**40).batch(8), 1000, True),
    (lambda ctx: tf.data.Dataset.range(ctx.input_pipeline_id, 2**62, ctx.num_input_pipelines)
     .batch(128, drop_remainder=True).prefetch(2), 10**6, True),
    (lambda: tf.data.Dataset.range(1000).batch(10), 1000, False),  # 50 batches per worker.
    (lambda: tf.data.Dataset.range(10**6).filter(lambda x: x > 0), 10, False),  # Unknown.
    (lambda: 1 / 0, 10, False),  # A dataset_fn failing here proves nothing.
])
def test_input_cannot_end_only_when_its_cardinality_proves_it(make, steps, cannot_end):
  assert coordinator_run.input_cannot_end(make, num_workers=2, num_replicas_in_sync=1,
                                steps=steps) == cannot_end


def test_a_dataset_object_is_judged_by_one_workers_shard():
  dataset = tf.data.Dataset.range(4000)
  assert coordinator_run.input_cannot_end(dataset, num_workers=2, num_replicas_in_sync=1, steps=2000)
  assert not coordinator_run.input_cannot_end(dataset, num_workers=2, num_replicas_in_sync=1, steps=2001)


def _coordinator_config(cluster, model_dir, **overrides):
  kwargs = dict(cluster=cluster, model_dir=str(model_dir), experiment_params=inprocess.SMALL_CTR,
                global_batch_size=256, steps_per_loop=100, checkpoint_interval=100,
                steps_per_closure=25, min_shard_bytes=16 << 10, ready_timeout=30, seed=1)
  kwargs.update(overrides)
  return coordinator_run.CoordinatorConfig(**kwargs)


def test_checkpoint_and_resume_at_the_saved_step(inprocess_cluster, tmp_path, caplog):
  caplog.set_level("INFO", logger="absl")
  first = coordinator_run.run_coordinator(_coordinator_config(
      inprocess_cluster, tmp_path, train_steps=120, mode="train", steps_per_loop=50,
      checkpoint_interval=50))
  assert first.global_step == 120 and first.eval == {}
  saved = sorted(int(os.path.basename(p)[len("ckpt-"):-len(".index")])
                 for p in glob.glob(str(tmp_path / "ckpt-*.index")))
  # A loop may end up to 12 steps short of its boundary (less than half a
  # closure of 25) at a shard's end: the save follows it (coordinator.loop_ends).
  assert len(saved) == 3 and 38 <= saved[0] <= 50 and 88 <= saved[1] <= 100, saved
  assert saved[2] == 120  # The end of training is exact.

  caplog.clear()
  second = coordinator_run.run_coordinator(_coordinator_config(
      inprocess_cluster, tmp_path, train_steps=150, mode="train"))
  assert f"restored {tmp_path / 'ckpt-120'} at step 120" in caplog.text
  assert second.start_step == 120 and second.global_step == 150
  assert second.checkpoint == str(tmp_path / "ckpt-150")

  third = coordinator_run.run_coordinator(_coordinator_config(
      inprocess_cluster, tmp_path, train_steps=150, mode="eval"))
  assert third.start_step == third.global_step == 150
  assert 0.5 < third.eval["auc"] < 1.0

  records = progress_log.ProgressLog(str(tmp_path)).read_new()
  starts = [i for i, r in enumerate(records) if r.restored]
  assert len(starts) == 3 and records[0].step == 0
  first_loops = [r.step for r in records[1:starts[1]]]
  assert first_loops[-1] == 120 and set(saved[:2]) <= set(first_loops)  # A save per boundary.
  assert [(r.step, r.restored) for r in records[starts[1]:]] == [
      (120, True), (150, False),  # Resumed.
      (150, True)]                # Eval only.


def test_user_factory_with_plain_orbit_classes(inprocess_cluster, tmp_path):
  result = coordinator_run.run_coordinator(_coordinator_config(
      inprocess_cluster, tmp_path, experiment=f"{linear_models.__name__}:plain_factory",
      experiment_params={}, train_steps=60, steps_per_loop=30, checkpoint_interval=60,
      global_batch_size=32))
  assert result.global_step == 60
  assert result.eval["accuracy"] > 0.9


def test_eval_mode_without_checkpoint_is_a_usage_error(inprocess_cluster, tmp_path):
  with pytest.raises(errors.UsageError, match=r"mode \(eval\) needs a checkpoint"):
    coordinator_run.run_coordinator(_coordinator_config(inprocess_cluster, tmp_path, mode="eval"))


def test_readme_experiment_example_trains(inprocess_cluster, tmp_path, monkeypatch):
  """The README's "write your own experiment" code, run as written."""
  import re
  import sys
  readme = os.path.join(paths.REPO, "README.md")
  with open(readme) as f:
    (code,) = re.findall(r"```python\n(# my_experiment\.py\n.*?)```", f.read(), flags=re.S)
  (tmp_path / "my_experiment.py").write_text(code)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "my_experiment", raising=False)
  result = coordinator_run.run_coordinator(_coordinator_config(
      inprocess_cluster, tmp_path / "model", experiment="my_experiment:factory",
      experiment_params={}, train_steps=200, steps_per_loop=100, checkpoint_interval=100,
      global_batch_size=64))
  assert result.global_step == 200
  assert result.eval["accuracy"] > 0.9
  # One epoch of 64 batches, given as the README says: positioned, ~3 epochs.
  assert result.input["positioned"] and result.input["batches_per_epoch"] == 64
  assert result.input["epochs_completed"] == 3


def test_a_request_a_task_could_not_parse_is_retried_other_internal_errors_are_not():
  # Seen once in CI: TensorFlow's eager client sent a ps a request with a corrupted
  # device string; the coordinator gave up as for a bug in the user's program.
  garbled = tf.errors.InternalError(None, None, "2 root error(s) found. (0) INTERNAL: "
                                    "{{function_node __wrapped__Identity}} Unable to parse "
                                    "request Additional GRPC error information")
  with pytest.raises(errors.RetryableError, match="could not parse a request"):
    with coordinator_run._classified_errors("training"):  # pylint: disable=protected-access
      raise garbled
  with pytest.raises(errors.PermanentError, match="training failed: InternalError"):
    with coordinator_run._classified_errors("training"):  # pylint: disable=protected-access
      raise tf.errors.InternalError(None, None, "a kernel failed")


def test_the_chief_log_drops_routine_lines_only():
  routine = coordinator_run._RoutineLines()

  def kept(message):
    record = logging.LogRecord("tensorflow", logging.WARNING, __file__, 1, message, None, None)
    return routine.filter(record)

  schedule_warning = ("A `tf.distribute.experimental.ParameterServerStrategy` method is invoked "
                      "without using `ClusterCoordinator.schedule`. If you are not tracing ...")
  assert kept(schedule_warning)  # It may matter: once.
  assert not kept(schedule_warning)  # Then it is every traced step's.
  assert not kept("Starting async checkpoint save on the device: /job:chief/...")
  assert not kept("Sync on async checkpoint saving.")
  assert kept("saved checkpoint to /m/ckpt-200.")


@pytest.mark.parametrize("experiment, params, positioned", [
    ("ctr", inprocess.SMALL_CTR, True),  # The closures its checkpoint's ledger shapes.
    ("user_experiments:tutorial", {"embedding_dim": "64"}, False),  # A lookup table.
])
def test_a_restarted_coordinators_workers_instantiate_its_closures_while_it_restores(
    inprocess_cluster, tmp_path, monkeypatch, caplog, experiment, params, positioned):
  # A coordinator started after a checkpoint (a chief restart, a ps failover) hands
  # its first closures to the workers before it restores, not after: the restore
  # below waits until every worker has instantiated them, and on its own deadline
  # goes on without (then the assertion fails).
  config = lambda steps: _coordinator_config(inprocess_cluster, tmp_path, train_steps=steps,
                                             mode="train", experiment=experiment,
                                             experiment_params=params)
  coordinator_run.run_coordinator(config(200))  # Two loops: a step's time is known.
  instantiated, lock, all_done = set(), threading.Lock(), threading.Event()

  def seen(done):
    def record(index):
      with lock:
        instantiated.add(index)
        if len(instantiated) == inprocess.NUM_WORKERS:
          all_done.set()
      done(index)
    return record

  warm_workers, warm_once = warm_up.warm_workers, warm_up.warm_once
  monkeypatch.setattr(warm_up, "warm_workers", lambda coordinator, calls, done=lambda i: None:
                      warm_workers(coordinator, calls, seen(done)))
  monkeypatch.setattr(warm_up, "warm_once", lambda coordinator, calls, indices, done, what,
                      activity=None: warm_once(coordinator, calls, indices, seen(done), what,
                                               activity))
  restore, before_restore = coordinator_run._Controller.restore_checkpoint, []

  def restore_when_warm(self, checkpoint_path=None):
    all_done.wait(60)
    with lock:
      before_restore.append(len(instantiated))
    return restore(self, checkpoint_path)

  monkeypatch.setattr(coordinator_run._Controller, "restore_checkpoint", restore_when_warm)
  caplog.set_level("WARNING", logger="tensorflow")
  result = coordinator_run.run_coordinator(config(300))
  assert before_restore == [inprocess.NUM_WORKERS]
  # Traced before the restore, its steps' routine warnings are still said once.
  assert caplog.text.count("without using `ClusterCoordinator.schedule`") <= 1
  assert (result.start_step, result.global_step) == (200, 300)
  if positioned:
    accounted = coverage.account(progress_log.ProgressLog(str(tmp_path)).read_new())
    assert accounted.ok and accounted.trained_twice == 0, accounted


@pytest.mark.parametrize("endless", [False, True])
def test_a_restarted_single_task_trainer_on_files_is_not_traced_again(
    inprocess_cluster, tmp_path, monkeypatch, caplog, endless):
  # Orbit's SingleTaskTrainer as written for one machine (its Adam builds its slots
  # in the first step) on TFRecord files, one epoch (tf.data does not know its
  # length) or repeated: a restart rebuilds the stored trace (of the fast-start
  # closure; endless: of the closure over the per-worker iterators), and takes the
  # epoch's length from the checkpoint, where it used to trace again and read the
  # whole input.
  config = lambda steps: _coordinator_config(
      inprocess_cluster, tmp_path, train_steps=steps, mode="train",
      experiment="user_experiments:files", global_batch_size=64, steps_per_closure=8,
      experiment_params={"examples": "4096", "data_dir": str(tmp_path / "records"),
                         "repeat": str(int(endless))})
  # Each coordinator names its layers as a new process would (Keras numbers its
  # default names per process: a second model here would be dense_2).
  tf_keras.backend.reset_uids()
  coordinator_run.run_coordinator(config(16))
  caplog.set_level("INFO", logger="absl")
  counted = []
  monkeypatch.setattr(positioned_lib, "_counted", lambda dataset: counted.append(1))
  tf_keras.backend.reset_uids()
  result = coordinator_run.run_coordinator(config(48))
  assert (result.start_step, result.global_step) == (16, 48)
  assert "traced again" not in caplog.text
  if endless:
    assert "other closure rebuilt" in caplog.text
    return
  assert "fast closure rebuilt" in caplog.text
  assert "as the checkpoint recorded (not counted again)" in caplog.text and not counted
  accounted = coverage.account(progress_log.ProgressLog(str(tmp_path)).read_new())
  assert accounted.ok and accounted.trained_twice == 0, accounted


def test_a_prepared_coordinator_is_stale_once_a_ps_is_gone_not_while_one_is_silent(
    monkeypatch):
  # A paused or cut off ps comes back with this coordinator's variables: the
  # standby is kept (a takeover that must leave the ps out starts a cold one).
  # A silent ps is never read (the read would wait). One whose process is gone
  # (refused twice in a row) or that came back empty retires it.
  Answer = coordinator_run.readiness.Answer
  cluster = spec_lib.ClusterSpec.from_dict({"chief": ["c:1"], "ps": ["p:1", "p:2"],
                                            "worker": ["w:1"]})
  ps0, ps1 = spec_lib.TaskId.parse("ps:0"), spec_lib.TaskId.parse("ps:1")
  said, emptied, read = {ps0: Answer.READY, ps1: Answer.SILENT}, set(), []

  class Sentinels:
    def lost(self, task):
      read.append(task)
      return f"{task} lost its variables" if task in emptied else None

  monkeypatch.setattr(coordinator_run.readiness, "answers",
                      lambda cluster, tasks, timeout: dict(said))
  prepared = lambda: coordinator_run.Prepared(
      config=None, factory=None, runtime=type("Runtime", (), {"cluster": cluster})(),
      sentinels=Sentinels(), built=None, input_shards=None, workers_warm=0)
  silent = prepared()
  assert [silent.stale() for _ in range(5)] == [None] * 5  # ps:1 silent all along.
  assert set(read) == {ps0}
  said[ps1] = Answer.READY
  emptied.add(ps1)  # It was restarted.
  assert silent.stale() == "ps:1 lost its variables"
  emptied.clear()
  killed = prepared()
  said[ps1] = Answer.REFUSED
  assert killed.stale() is None  # One refusal is a blip ...
  said[ps1] = Answer.READY
  assert killed.stale() is None
  said[ps1] = Answer.REFUSED
  assert killed.stale() is None
  assert killed.stale() == "ps:1 refused connections (its process is gone)"  # ... two are not.


@pytest.mark.parametrize("experiment, params, positioned", [
    ("ctr", inprocess.SMALL_CTR, True),
    # Endless input, lookup tables in its dataset_fn: its closure (one for every
    # size) traced ahead for the per-worker iterators.
    ("user_experiments:tutorial", {"embedding_dim": "64"}, False),
])
def test_a_coordinator_prepared_ahead_restores_the_checkpoint_saved_after_it(
    inprocess_cluster, tmp_path, experiment, params, positioned):
  # A standby chief's coordinator (`prepare_ahead`): connected, built and its
  # closures instantiated on the workers while another coordinator trains; it
  # trains nothing and reads no input until it runs, and then restores the
  # checkpoint that coordinator saved last, after it was prepared.
  config = lambda steps: _coordinator_config(inprocess_cluster, tmp_path, train_steps=steps,
                                             mode="train", experiment=experiment,
                                             experiment_params=params)
  coordinator_run.run_coordinator(config(100))
  prepared = coordinator_run.prepare_ahead(config(400), interrupts_lib.Interrupts(),
                                           warm_timeout=60)
  assert prepared.workers_warm == inprocess.NUM_WORKERS
  traced = prepared.built.trainer.closures_traced
  assert int(prepared.built.experiment.global_step.numpy()) == 0  # Its own, untouched.
  assert prepared.stale() is None
  assert coordinator_run.run_coordinator(config(300)).global_step == 300  # Saved after it.
  records = len(progress_log.ProgressLog(str(tmp_path)).read_new())

  result = coordinator_run.run_prepared(prepared, interrupts_lib.Interrupts(),
                                        lease_generation=0)
  assert (result.start_step, result.global_step) == (300, 400)
  history = progress_log.ProgressLog(str(tmp_path)).read_new()
  assert history[records].restored and history[records].step == 300
  if not positioned:  # Its loops ran the closure traced ahead.
    assert prepared.built.trainer.closures_traced == traced > 0
  if positioned:
    assert result.input["shards"] == prepared.input_shards
    accounted = coverage.account(history)
    assert accounted.ok and accounted.trained_twice == 0, accounted
