"""PSTrainer (tfps.coordinator.trainer): how a loop's steps are cut into closures, and
an ordinary Orbit trainer run under parameter servers on the in-process cluster."""

import numpy as np
import orbit
import pytest
import tensorflow as tf

from tfps.base import errors
from tfps.coordinator import trainer as trainer_lib

from tests.support import linear_models
from tests.support import registrations

pytestmark = pytest.mark.tf

OPTIONS = trainer_lib.LoopOptions


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


@pytest.mark.parametrize("num_ps, trace_cache, asked, builds", [
    (2, True, True, True),
    (1, True, True, False),  # No failover leaves a ps.
    (3, True, True, False),  # Where a failover puts each variable is not foreseen.
    (2, False, True, False),  # Nothing stored to rebuild the graph from.
    (2, True, False, False),
])
def test_failover_graphs_are_built_for_two_ps_with_stored_traces_when_asked(
    num_ps, trace_cache, asked, builds):
  from tfps.cluster import spec as spec_lib  # pylint: disable=import-outside-toplevel
  cluster = spec_lib.ClusterSpec.from_dict({
      "chief": ["h:1"], "ps": [f"h:{10 + i}" for i in range(num_ps)], "worker": ["h:2"]})
  assert trainer_lib.builds_failover_graphs(cluster, trace_cache, asked) is builds


def test_plain_trainer_runs_under_ps_with_one_changed_line(runtime):
  # The trainer is ordinary: it trains on one machine as written...
  _, _, step, trainer = linear_models.linear_parts()
  orbit.Controller(trainer=trainer, global_step=step, steps_per_loop=10).train(10)
  assert int(step.numpy()) == 10

  # ...and under parameter servers with one changed line (the wrap).
  with runtime.strategy.scope():
    model, optimizer, step, trainer = linear_models.linear_parts()
  trainer = trainer_lib.PSTrainer(trainer, runtime, OPTIONS(steps_per_closure=5))  # The line.
  controller = orbit.Controller(trainer=trainer, global_step=step, steps_per_loop=30)
  first = controller.trainer.train(tf.constant(30))["loss"].numpy()
  controller.train(120)

  assert int(step.numpy()) == 120 and int(optimizer.iterations.numpy()) == 120
  assert trainer.closures_scheduled == 24  # 4 loops x 30 steps / 5 per closure.
  # The first loop learns most of it already (Adam at 0.05, an unseeded
  # init): its mean ran 0.7-1.7x the last loop's over that half; the
  # accuracy below is what says the model learnt.
  assert trainer.train_loop_end()["loss"].numpy() < first
  x, y = linear_models.separable(500, seed=1)
  accuracy = np.mean((model(x).numpy() > 0) == (y > 0))
  assert accuracy > 0.9
  assert "/job:ps/" in model.trainable_variables[0].device


def test_unrolled_closures_run_exactly_the_steps_asked(runtime):
  # Closures of 7 steps written out 3 at a time: 1 step, then a loop of 2 x 3.
  # 23 steps: three of those and one of 2 (other sizes: a loop of 1 step per
  # iteration); then 12: two closures of 6. The global step counts every
  # step exactly once.
  with runtime.strategy.scope():
    _, optimizer, step, trainer = linear_models.linear_parts()
  trainer = trainer_lib.PSTrainer(trainer, runtime, OPTIONS(steps_per_closure=7, unroll=3))
  trainer.train(tf.constant(23))
  assert int(step.numpy()) == 23 and int(optimizer.iterations.numpy()) == 23
  trainer.train(tf.constant(12))
  assert int(step.numpy()) == 35 and trainer.closures_scheduled == 4 + 2
  with pytest.raises(errors.UsageError, match=r"unroll \(0\) must be a positive integer"):
    trainer_lib.PSTrainer(trainer.trainer, runtime, OPTIONS(steps_per_closure=7, unroll=0))


class _StepLogTrainer(orbit.StandardTrainer):
  """Counts its steps and returns fixed logs: every step logs one and two."""

  def __init__(self, step, *, logs=None, output=None):
    self.step, self._logs, self._output = step, logs, output
    super().__init__(tf.data.Dataset.range(1 << 30))

  def train_step(self, iterator):
    next(iterator)
    self.step.assign_add(1)
    return self._logs if self._logs is not None else {"ones": 1.0, "twos": 2}

  def train_loop_end(self):
    return self._output


def test_step_logs_are_averaged_over_each_loop(runtime):
  # Closures of 7 steps written out 3 at a time, and of other sizes (the
  # steps before a loop and in it each log): a loop's mean of a log that is
  # 1 every step is exactly 1 only if every step was summed once and the
  # closures weighed by their steps. (Logged values come from the trainer,
  # not from a shared counter: `assign_add`'s returned value is re-read after
  # the add, so two workers can read the same one.)
  with runtime.strategy.scope():
    step = orbit.utils.create_global_step()
  trainer = trainer_lib.PSTrainer(_StepLogTrainer(step, output={"twos": -1}), runtime,
                                  OPTIONS(steps_per_closure=7, unroll=3))
  assert trainer.train(tf.constant(30)) == {"ones": 1.0, "twos": -1}  # The trainer's wins.
  assert trainer.train(tf.constant(10)) == {"ones": 1.0, "twos": -1}
  assert int(step.numpy()) == 40 and trainer.closures_scheduled == 5 + 2

  with runtime.strategy.scope():
    bad = trainer_lib.PSTrainer(_StepLogTrainer(step, logs={"v": tf.zeros([2])}),
                                runtime, OPTIONS(steps_per_closure=5))
  with pytest.raises(errors.UsageError, match=r"_StepLogTrainer.train_step returned "
                                              r"logs\['v'\] of shape \(2,\)"):
    bad.train(tf.constant(5))


def test_the_checkpoint_write_of_the_variables_a_trace_made_is_made_in_that_loop(
    runtime, tmp_path, monkeypatch):
  # Adam makes its slots in its step's first trace, after the run's first save.
  # Their write is made while that loop's closures run: the save after the loop
  # registers nothing (a registration waits for a paused worker).
  from tfps.coordinator import checkpoints  # pylint: disable=import-outside-toplevel
  with runtime.strategy.scope():
    model, optimizer, step, trainer = linear_models.linear_parts()
  manager = checkpoints.Manager(
      tf.train.Checkpoint(model=model, optimizer=optimizer, step=step), str(tmp_path),
      asynchronous=True, max_to_keep=2)
  manager.save_now(0)
  variables_at_save = len(optimizer.variables)
  trainer = trainer_lib.PSTrainer(trainer, runtime, OPTIONS(steps_per_closure=5))
  told = []
  trainer.on_traced.append(lambda: told.append(len(optimizer.variables)))
  trainer.on_traced.append(manager.prepare_writes)
  trainer.train(tf.constant(10))
  assert told and told[0] > variables_at_save  # Told after the trace made the slots.
  registered = registrations.record(monkeypatch)
  manager.save_now(10)
  assert not registered
  manager.close()
  reader = tf.train.load_checkpoint(manager.latest_checkpoint)
  slots = [key for key in reader.get_variable_to_shape_map()
           if key.startswith("optimizer/_variables/")]
  assert len(slots) == len(optimizer.variables) - 1 == 8  # Adam's m and v of 4 variables.
