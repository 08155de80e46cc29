"""The experiment API (tfps.coordinator.experiment, .api), on the default strategy
(no cluster); its checkpoints: test_checkpoints.py."""

import subprocess
import sys
import textwrap

import orbit
import pytest
import tensorflow as tf

from tfps.coordinator import api
from tfps.coordinator import experiment as experiment_lib
from tfps.base import errors

pytestmark = pytest.mark.tf


class _Trainer(orbit.AbstractTrainer):
  def train(self, num_steps):
    return {}


def _context(**overrides):
  kwargs = dict(strategy=tf.distribute.get_strategy(), coordinator=None, model_dir="/m",
                global_batch_size=8, seed=1, num_workers=2, num_ps=2)
  kwargs.update(overrides)
  return experiment_lib.ExperimentContext(**kwargs)


def _experiment(**overrides):
  kwargs = dict(trainer=_Trainer(), evaluator=None, checkpoint_items={},
                global_step=orbit.utils.create_global_step())
  kwargs.update(overrides)
  return experiment_lib.Experiment(**kwargs)


def test_builtin_ctr_is_a_module_like_a_users():
  import tfps.examples.ctr
  assert experiment_lib.load_factory("ctr") is tfps.examples.ctr.factory
  assert experiment_lib.load_factory("tfps.examples.ctr:factory") is tfps.examples.ctr.factory


@pytest.mark.parametrize("name,message", [
    ("nosuch", "experiment 'nosuch' is unknown (built-in: ctr; or give package.module:factory)"),
    ("no_such_module_xyz:factory",
     "experiment 'no_such_module_xyz:factory': cannot import module 'no_such_module_xyz' "
     "(ModuleNotFoundError: No module named 'no_such_module_xyz')"),
    ("json:no_factory", "experiment 'json:no_factory': module 'json' has no attribute "
                        "'no_factory'"),
    ("json:__name__", "experiment 'json:__name__': '__name__' is a str, not callable"),
    (":f", "experiment ':f' must look like package.module:factory"),
])
def test_load_factory_errors_are_usage_errors(name, message):
  with pytest.raises(errors.UsageError) as e:
    experiment_lib.load_factory(name)
  assert str(e.value) == message


def test_module_failing_at_import_is_a_usage_error(tmp_path, monkeypatch):
  (tmp_path / "broken_experiment.py").write_text("raise RuntimeError('boom at import')\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  with pytest.raises(errors.UsageError) as e:
    experiment_lib.load_factory("broken_experiment:factory")
  assert str(e.value) == ("experiment 'broken_experiment:factory': cannot import module "
                          "'broken_experiment' (RuntimeError: boom at import)")


def test_user_factory_loads(tmp_path, monkeypatch):
  (tmp_path / "my_pkg_experiment.py").write_text(textwrap.dedent("""
      def factory(context):
        return context
  """))
  monkeypatch.syspath_prepend(str(tmp_path))
  factory = experiment_lib.load_factory("my_pkg_experiment:factory")
  assert factory("x") == "x"
  sys.modules.pop("my_pkg_experiment", None)


def test_factory_raising_is_permanent_and_names_factory_and_exception():
  def factory(context):
    raise KeyError("vocab")
  with pytest.raises(errors.PermanentError) as e:
    experiment_lib.build(factory, _context(), name="mine:factory", partitioned=False)
  assert str(e.value) == "experiment factory 'mine:factory' raised KeyError: 'vocab'"


def test_factory_usage_errors_keep_their_type():
  def factory(context):
    raise errors.UsageError("ctr vocab_sizes (0) must be positive integers")
  with pytest.raises(errors.UsageError, match="vocab_sizes"):
    experiment_lib.build(factory, _context(), name="ctr", partitioned=False)


def test_factory_returning_wrong_type_is_a_usage_error():
  with pytest.raises(errors.UsageError) as e:
    experiment_lib.build(lambda context: {"trainer": 1}, _context(), name="f",
                         partitioned=False)
  assert str(e.value) == ("experiment factory 'f' returned dict, "
                          "expected tfps.Experiment")


def test_factory_runs_in_strategy_scope_and_gets_context():
  seen = {}

  def factory(context):
    seen["strategy"] = tf.distribute.get_strategy()
    seen["batch"] = context.global_batch_size
    return _experiment()

  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  experiment = experiment_lib.build(factory, _context(strategy=strategy), name="f",
                                    partitioned=False)
  assert seen == {"strategy": strategy, "batch": 8}
  assert isinstance(experiment, experiment_lib.Experiment)


@pytest.mark.parametrize("overrides,message", [
    ({"trainer": "t"}, "Experiment.trainer: expected an orbit.AbstractTrainer, got str"),
    ({"trainer": None}, "Experiment: needs a trainer, an evaluator or both"),
    ({"global_step": 3}, "Experiment.global_step: expected an integer tf.Variable, got int"),
    ({"checkpoint_items": {"global_step": 1}},
     "Experiment.checkpoint_items: 'global_step' is reserved for Experiment.global_step"),
])
def test_experiment_validates_its_parts(overrides, message):
  with pytest.raises(errors.UsageError) as e:
    _experiment(**overrides)
  assert str(e.value) == message


def test_keras3_model_with_partitioner_is_a_clear_usage_error():
  import keras  # Keras 3.
  layer = keras.layers.Dense(1)

  def factory(context):
    return _experiment(checkpoint_items={"model": layer})

  with pytest.raises(errors.UsageError) as e:
    experiment_lib.build(factory, _context(), name="k3", partitioned=True)
  message = str(e.value)
  assert message.startswith("experiment 'k3' uses a Keras 3 object (model: keras.")
  assert "need tf_keras" in message and "\n" not in message
  # Without a partitioner Keras 3 is the user's business.
  experiment_lib.build(factory, _context(), name="k3", partitioned=False)


def test_keras3_failing_inside_factory_with_partitioner_is_a_usage_error():
  import keras

  def factory(context):
    keras.layers.Dense(units=-1)  # Raises inside Keras 3.

  with pytest.raises(errors.UsageError, match="uses a Keras 3 object with a variable "
                                              "partitioner.*ValueError"):
    experiment_lib.build(factory, _context(), name="k3", partitioned=True)


def test_an_experiments_own_check_of_its_settings_runs_without_tensorflow(tmp_path, monkeypatch):
  # The built-in ctr is found and checked the way a user's module is.
  with pytest.raises(errors.UsageError, match=r"ctr: unknown setting\(s\) colour"):
    api.check_params("ctr", {"colour": "blue"})
  api.check_params("ctr", {"vocab_sizes": "10:20"})
  (tmp_path / "checked_experiment.py").write_text(
      "from tfps import UsageError\n"
      "def check_params(params):\n"
      "  if 'size' not in params: raise UsageError('mine: size (missing) is required')\n"
      "def factory(context): raise AssertionError('not called by a check')\n")
  (tmp_path / "unchecked_experiment.py").write_text("def factory(context): pass\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  with pytest.raises(errors.UsageError, match=r"mine: size \(missing\) is required"):
    api.check_params("checked_experiment:factory", {})
  api.check_params("checked_experiment:factory", {"size": "3"})
  api.check_params("unchecked_experiment:factory", {"anything": "1"})  # Its factory checks.
  code = ("import sys, tfps.coordinator.api as api; api.check_params('ctr', {}); "
          "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'orbit')))")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
  assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_a_train_only_experiment_needs_no_evaluator_argument():
  step = tf.Variable(0, dtype=tf.int64)
  made = experiment_lib.Experiment(trainer=_Trainer(), checkpoint_items={}, global_step=step)
  assert made.evaluator is None
  with pytest.raises(TypeError):  # Keywords only: no order to get wrong.
    experiment_lib.Experiment(_Trainer(), None, {}, step)  # pylint: disable=too-many-function-args
