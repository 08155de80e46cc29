"""A loop's progress line and its checks (tfps.coordinator.progress), with a fake
trainer and clock."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tfps.base import errors
from tfps.coordinator import progress

from tests.support import fakes

pytestmark = pytest.mark.tf


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


def test_progress_counts_steps_that_ran_and_logs_a_line(caplog):
  step, clock = _FakeStep(), fakes.FakeClock(100.0)
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
  step, clock = _FakeStep(), fakes.FakeClock(100.0)
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
  step, clock = _FakeStep(), fakes.FakeClock(100.0)
  trainer = _FakeTrainer(step, clock, 0.0)
  trainer.train = lambda num_steps: (setattr(step, "value", step.value + 5), holder.outputs)[1]
  measured = progress.MeasuredTrainer(trainer, step, target=100, batch_size=10, clock=clock)
  with pytest.raises(errors.NonFiniteLossError, match="loss is nan at step 5"):
    measured.train(5)


@pytest.mark.parametrize("key", ["loss", "training_loss", "total_loss"])
@pytest.mark.parametrize("loss", [math.nan, math.inf])
def test_non_finite_loss_is_permanent_whatever_its_name(loss, key):
  step, clock = _FakeStep(), fakes.FakeClock(100.0)
  measured = progress.MeasuredTrainer(_FakeTrainer(step, clock, loss, key=key), step,
                                      target=100, batch_size=10, clock=clock)
  with pytest.raises(errors.PermanentError, match=f"{key} is {loss} at step 5"):
    measured.train(5)


def test_a_non_finite_output_that_is_not_a_loss_does_not_stop_the_run():
  step, clock = _FakeStep(), fakes.FakeClock(100.0)
  measured = progress.MeasuredTrainer(
      _FakeTrainer(step, clock, 0.5, extra={"grad_norm_max": math.inf}), step,
      target=100, batch_size=10, clock=clock)
  measured.train(5)
