"""End to end through the command line: the chief's `tfps run` (supervisor and
coordinator) on the session's loopback cluster (conftest.py), with bad input.

Each case must end with one `tfps: error:` line and a permanent exit code (2
usage, 1 permanent), promptly, with the coordinator started once (the
supervisor does not restart permanent failures), or not at all.
"""

import json
import os
import subprocess
import textwrap
import time

import pytest

from tfps.cluster import local
from tfps.cluster import processes

from tests.support import chief_run
from tests.support import crash_check
from tests.support import tfps_command

pytestmark = pytest.mark.cluster

# A run that does not end within this is hung (a clean one takes ~30 s).
RUN_TIMEOUT = 240

FACTORIES = textwrap.dedent('''
    """Experiment factories for tests/e2e/test_run.py: two broken, one tiny and fine."""
    import orbit
    import tensorflow as tf
    import tf_keras

    from tfps.coordinator import experiment


    def raises(context):
      raise RuntimeError("the factory failed on purpose")


    def wrong_type(context):
      return {"trainer": None}


    def generator_input(context):
      """A trainer whose input is a Python generator: it cannot run on the workers."""
      step = orbit.utils.create_global_step()

      def gen():
        yield from range(100)

      def dataset_fn(input_context):
        return tf.data.Dataset.from_generator(
            gen, output_signature=tf.TensorSpec([], tf.int64)).batch(4)

      class Trainer(orbit.StandardTrainer):
        def train_step(self, iterator):
          next(iterator)
          step.assign_add(1)

      return experiment.Experiment(trainer=Trainer(dataset_fn), evaluator=None,
                                   checkpoint_items={}, global_step=step)


    class _TinyTrainer(orbit.StandardTrainer):
      def __init__(self, model, optimizer, global_step):
        self.strategy = tf.distribute.get_strategy()
        self.model, self.optimizer, self.global_step = model, optimizer, global_step
        super().__init__(lambda context: tf.data.Dataset.from_tensors(
            (tf.ones([8, 4]), tf.ones([8, 1]))).repeat())

      def train_step(self, iterator):
        def step_fn(inputs):
          x, y = inputs
          with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self.model(x) - y))
          grads = tape.gradient(loss, self.model.trainable_variables)
          self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))

        self.strategy.run(step_fn, args=(next(iterator),))
        self.global_step.assign_add(1)


    def tiny(context):
      """A linear model: a valid experiment whose checkpoint ctr cannot use."""
      model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
      model.build((None, 4))
      optimizer = tf_keras.optimizers.SGD(0.1)
      step = orbit.utils.create_global_step()
      return experiment.Experiment(trainer=_TinyTrainer(model, optimizer, step), evaluator=None,
                                   checkpoint_items={"model": model, "optimizer": optimizer},
                                   global_step=step)
''')


@pytest.fixture(scope="module")
def cluster(loopback_cluster):
  return loopback_cluster


@pytest.fixture(scope="module")
def factories_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("factories")
  (path / "e2e_factories.py").write_text(FACTORIES)
  return str(path)


def _run_chief(cluster: local.LocalCluster, flags, *, pythonpath: str,
               timeout: float = RUN_TIMEOUT) -> tfps_command.Finished:
  """The chief's `tfps run` (supervisor + coordinator) inside the cluster's network."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in (pythonpath, os.environ.get("PYTHONPATH")) if p))
  env.pop("TF_CONFIG", None)
  start = time.monotonic()
  process = cluster.spawn(cluster.task_argv(chief_run.CHIEF, flags), task=chief_run.CHIEF, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    stdout, stderr = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    processes.stop_group(process, grace=5)  # The coordinator dies with it (pdeathsig).
    stdout, stderr = process.communicate(timeout=10)
    pytest.fail(f"tfps run (chief) {flags} hung for {timeout}s:\n{stderr.decode()[-3000:]}")
  finally:
    if process.poll() is None:
      processes.stop_group(process, grace=0)
  crash_check.note(stderr, "stderr of the chief's tfps run")
  return tfps_command.Finished(process.returncode, stdout.decode(), stderr.decode(),
                  time.monotonic() - start)


def _check_given_up_at_once(run: tfps_command.Finished, model_dir: str, failure: str) -> None:
  """The supervisor started the coordinator once, recorded the failure, gave up."""
  assert run.stderr.count("starting coordinator (attempt") == 1, run.stderr[-3000:]
  with open(os.path.join(model_dir, "events.jsonl")) as f:
    events = [json.loads(line) for line in f]
  assert [e["kind"] for e in events] == ["failure", "action"], events
  assert events[0]["failure"] == failure, events
  if run.code == 1:  # The coordinator's own one line, in the event log too.
    assert tfps_command.error_line(run) in events[0]["detail"], events
  assert events[1]["action"] == "give_up"


@pytest.mark.parametrize("flags, code, message", [
    (["--experiment=e2e_factories:raises"], 1,
     "experiment factory 'e2e_factories:raises' raised RuntimeError: "
     "the factory failed on purpose"),
    (["--experiment=e2e_factories:wrong_type"], 2,
     "experiment factory 'e2e_factories:wrong_type' returned dict, "
     "expected tfps.Experiment"),
    (["--experiment=e2e_factories:generator_input", "--mode=train"], 2,
     "Trainer.train_dataset: this dataset cannot run on the workers (it uses Python state "
     "such as from_generator or py_function); build it from files or tensors"),
], ids=["factory_raises", "factory_wrong_type", "generator_input"])
def test_chief_bad_input_is_one_line_and_permanent(cluster, factories_dir, tmp_path,
                                                   flags, code, message):
  model_dir = str(tmp_path / "model")
  run = _run_chief(cluster, [f"--model_dir={model_dir}", *flags], pythonpath=factories_dir)
  assert run.code == code, run.stderr[-3000:]
  assert message in tfps_command.error_line(run)
  _check_given_up_at_once(run, model_dir, "bad_config" if code == 2 else "user_error")


# Settings the chief's supervisor refuses itself (the run spec), before it
# starts any coordinator.
@pytest.mark.parametrize("flags, message", [
    (["--experiment=no_such_experiment"],
     "experiment 'no_such_experiment' is unknown (built-in: ctr;"),
    (["--train_steps=-1"], "train_steps (-1) must be a positive integer"),
], ids=["unknown_experiment", "negative_train_steps"])
def test_chief_bad_settings_fail_before_a_coordinator_starts(cluster, factories_dir, tmp_path,
                                                            flags, message):
  model_dir = str(tmp_path / "model")
  run = _run_chief(cluster, [f"--model_dir={model_dir}", *flags], pythonpath=factories_dir)
  assert run.code == 2, run.stderr[-3000:]
  assert message in tfps_command.error_line(run)
  assert "starting coordinator" not in run.stderr
  assert not os.path.exists(os.path.join(model_dir, "events.jsonl"))


def test_checkpoint_of_an_incompatible_model_is_permanent(cluster, factories_dir, tmp_path):
  model_dir = str(tmp_path / "model")
  tiny = _run_chief(cluster, [f"--model_dir={model_dir}", "--experiment=e2e_factories:tiny",
                              "--mode=train", "--train_steps=5", "--steps_per_loop=5",
                              "--checkpoint_interval=5"], pythonpath=factories_dir)
  assert tiny.code == 0, tiny.stderr[-3000:]
  checkpoint = json.loads(tiny.stdout)["checkpoint"]
  assert checkpoint == os.path.join(model_dir, "ckpt-5")
  assert not os.path.exists(os.path.join(model_dir, "events.jsonl"))  # No failure so far.
  saved = _checkpoint_files(model_dir)

  # The small ctr: its data is made before the restore is tried.
  run = _run_chief(cluster, [f"--model_dir={model_dir}", "--experiment=ctr", "--mode=train",
                             f"--experiment_params={chief_run.SMALL_CTR}",
                             "--train_steps=10"], pythonpath=factories_dir)
  assert run.code == 1, run.stderr[-3000:]
  assert tfps_command.error_line(run).startswith(
      f"checkpoint {checkpoint} does not fit experiment 'ctr'")
  _check_given_up_at_once(run, model_dir, "bad_checkpoint")
  assert _checkpoint_files(model_dir) == saved  # The other model's checkpoint is untouched.


def _checkpoint_files(model_dir: str) -> dict[str, int]:
  return {name: os.stat(os.path.join(model_dir, name)).st_mtime_ns
          for name in os.listdir(model_dir) if name.startswith(("ckpt-", "checkpoint"))}
