"""Chief configuration, loop planning and progress: pure unit tests, no cluster."""

import json
import math

import pytest
import numpy as np
import tensorflow as tf

from tfps.cluster import spec as spec_lib
from tfps.coordinator import run as coordinator_run
from tfps.input import datasets
from tfps.coordinator import progress
from tfps.coordinator import trainer as trainer_lib
from tfps.base import errors

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


@pytest.mark.parametrize("num_steps,per_closure,workers,expected", [
    (100, 25, 2, [25, 25, 25, 25]),
    (100, 30, 2, [30, 30, 30, 10]),
    (10, 50, 2, [5, 5]),          # Smaller closures so that both workers work.
    (7, 50, 3, [3, 3, 1]),
    (1, 50, 4, [1]),
    (0, 50, 2, []),
])
def test_plan_closures(num_steps, per_closure, workers, expected):
  sizes = trainer_lib.plan_closures(num_steps, per_closure, workers)
  assert sizes == expected
  assert sum(sizes) == num_steps


def test_split_eval_steps_over_shards():
  assert datasets.split_steps(10, 4) == [3, 3, 2, 2]
  assert datasets.split_steps(2, 4) == [1, 1, 0, 0]


@pytest.mark.parametrize("step,expected", [(0, 40), (40, 40), (80, 20), (90, 10), (100, 40)])
def test_loops_end_on_checkpoint_boundaries(step, expected):
  config = coordinator_run.CoordinatorConfig(
      cluster=_CLUSTER, model_dir="/m", steps_per_loop=40, checkpoint_interval=100, steps_per_closure=1)
  assert coordinator_run._loop_ends(config).next_loop(step) == expected


class _FakeStep:
  def __init__(self):
    self.value = 0

  def numpy(self):
    return self.value


class _FakeTrainer:
  """Advances the step like a trainer would, `overshoot` extra (a retried closure)."""

  def __init__(self, step, clock, loss, overshoot=0, key="loss", extra=None):
    self.step, self.clock, self.loss, self.overshoot = step, clock, loss, overshoot
    self.key, self.extra = key, extra or {}

  def train(self, num_steps):
    self.step.value += int(num_steps) + self.overshoot
    self.clock.now += 2.0
    return {self.key: self.loss, **self.extra}


class _Clock:
  now = 100.0

  def __call__(self):
    return self.now


def test_progress_counts_steps_that_ran_and_logs_a_line(caplog):
  step, clock = _FakeStep(), _Clock()
  measured = progress.MeasuredTrainer(_FakeTrainer(step, clock, 0.5, overshoot=2), step,
                                      target=100, batch_size=10, clock=clock)
  caplog.set_level("INFO", logger="absl")
  output = measured.train(20)
  assert measured.steps == 22 and measured.seconds == 2.0  # Re-run steps are work done.
  assert output["examples_per_second"] == pytest.approx(110.0)
  assert "step 22/100 | 11.0 steps/s | 110 examples/s | loss 0.5 | ETA 0:00:07" \
      in caplog.text


def test_the_progress_line_shows_the_trainers_own_outputs(caplog):
  # Orbit's SingleTaskTrainer names its loss `training_loss`; others add metrics.
  step, clock = _FakeStep(), _Clock()
  trainer = _FakeTrainer(step, clock, 0.25, key="training_loss",
                         extra={"accuracy": np.float32(0.875), "lr": tf.constant(0.01),
                                "table": np.zeros([3]), "name": "not a number"})
  measured = progress.MeasuredTrainer(trainer, step, target=100, batch_size=10, clock=clock)
  caplog.set_level("INFO", logger="absl")
  measured.train(20)
  assert "| training_loss 0.25 accuracy 0.875 lr 0.01 | ETA" in caplog.text
  assert "n/a" not in caplog.text.replace("ETA n/a", "")


def test_outputs_in_tensorflows_tracked_dict_are_shown_and_checked(caplog):
  # PSTrainer's outputs come back in TF's tracking wrapper, which is no Mapping.
  holder = tf.Module()
  holder.outputs = {"loss": math.nan}
  step, clock = _FakeStep(), _Clock()
  trainer = _FakeTrainer(step, clock, 0.0)
  trainer.train = lambda num_steps: (setattr(step, "value", step.value + 5), holder.outputs)[1]
  measured = progress.MeasuredTrainer(trainer, step, target=100, batch_size=10, clock=clock)
  with pytest.raises(errors.NonFiniteLossError, match="loss is nan at step 5"):
    measured.train(5)


@pytest.mark.parametrize("key", ["loss", "training_loss", "total_loss"])
@pytest.mark.parametrize("loss", [math.nan, math.inf])
def test_non_finite_loss_is_permanent_whatever_its_name(loss, key):
  step, clock = _FakeStep(), _Clock()
  measured = progress.MeasuredTrainer(_FakeTrainer(step, clock, loss, key=key), step,
                                      target=100, batch_size=10, clock=clock)
  with pytest.raises(errors.PermanentError, match=f"{key} is {loss} at step 5"):
    measured.train(5)


def test_a_non_finite_output_that_is_not_a_loss_does_not_stop_the_run():
  step, clock = _FakeStep(), _Clock()
  measured = progress.MeasuredTrainer(
      _FakeTrainer(step, clock, 0.5, extra={"grad_norm_max": math.inf}), step,
      target=100, batch_size=10, clock=clock)
  measured.train(5)


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
