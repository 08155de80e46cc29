"""Step logs summed per closure (`coordinator.step_logs`), without a cluster."""

import pytest
import tensorflow as tf

from tfps.coordinator import step_logs
from tfps.base import errors

pytestmark = pytest.mark.tf


def test_loop_means_weigh_each_closure_by_its_steps():
  # Two closures: 3 steps summing to 6.0, 1 step of 10.0: mean 16 / 4.
  means = step_logs.loop_means([(3, {"loss": 6.0, "n": 3}), (1, {"loss": 10.0, "n": 1})])
  assert means == {"loss": 4.0, "n": 1.0}
  assert step_logs.loop_means([]) == {}
  assert step_logs.loop_means([(5, {}), (5, {})]) == {}  # A trainer without logs.


def test_sums_in_a_while_loop_are_exact():
  @tf.function
  def run(n):
    sums = step_logs.start({"x": tf.constant(1.0), "i": tf.constant(1)}, "T")
    for k in tf.range(2, n + 1):
      sums = step_logs.add(sums, {"x": tf.cast(k, tf.float32), "i": k}, "T")
    return sums

  sums = {key: float(value) for key, value in run(tf.constant(100)).items()}
  assert sums == {"x": 5050.0, "i": 5050.0}
  assert step_logs.start(None, "T") == {} and step_logs.add({}, None, "T") == {}


@pytest.mark.parametrize("logs,message", [
    (tf.constant(1.0), "T.train_step returned EagerTensor; step logs must be a dict"),
    ({"loss": tf.zeros([2])}, "T.train_step returned logs['loss'] of shape (2,) and dtype "
                              "float32; step logs must be numeric scalars"),
    ({"name": tf.constant("a")}, "T.train_step returned logs['name'] of shape () and dtype "
                                 "string"),
])
def test_logs_that_are_not_numeric_scalars_are_usage_errors(logs, message):
  with pytest.raises(errors.UsageError) as e:
    step_logs.start(logs, "T")
  assert str(e.value).startswith(message)


@pytest.mark.parametrize("later", [{"loss": 1.0, "extra": 2.0}, {}, None])
def test_later_steps_must_return_the_first_steps_keys(later):
  sums = step_logs.start({"loss": tf.constant(1.0)}, "T")
  with pytest.raises(errors.UsageError, match=r"^T\.train_step returned logs with keys .* "
                     r"after \['loss'\]; every step must return the same keys$"):
    step_logs.add(sums, later, "T")


def test_a_usage_error_raised_while_tracing_is_found_under_autograph():
  @tf.function
  def closure():
    return step_logs.start({"v": tf.zeros([3])}, "T")

  with pytest.raises(Exception) as e:
    closure()
  assert not isinstance(e.value, errors.UsageError)  # AutoGraph wrapped it...
  found = step_logs.usage_error_in(e.value)  # ...and the original is kept.
  assert str(found).startswith("T.train_step returned logs['v'] of shape (3,)")
  assert step_logs.usage_error_in(ValueError("other")) is None
