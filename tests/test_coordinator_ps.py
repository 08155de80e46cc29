"""The coordinator on a real (in-process) cluster: 2 ps, 2 workers, gRPC on loopback.

TensorFlow allows one cluster per process, so every test here shares one
module-scoped cluster; each `run_coordinator` builds its own strategy on it, as a
restarted coordinator would.
"""

import gc
import glob
import json
import logging
import os
import threading
import weakref

import numpy as np
import orbit
import pytest
import tensorflow as tf
import tf_keras

from tfps.cluster import inprocess
from tfps.cluster import processes
from tfps.cluster import spec as spec_lib
from tfps.coordinator import checkpoints
from tfps.coordinator import run as coordinator_run
from tfps.examples.ctr import experiment as ctr
from tfps.input import datasets
from tfps.coordinator import evaluator as evaluator_lib
from tfps.coordinator import experiment as experiment_lib
from tfps.coordinator import loop_ends
from tfps.coordinator import loop_guard
from tfps.coordinator import ps_state
from tfps.coordinator import pull_push
from tfps.coordinator import strategy as strategy_lib
from tfps.coordinator import trainer as trainer_lib
from tfps.base import errors
from tfps.recovery import interrupts as interrupts_lib
from tfps.recovery import notices
from tfps.recovery import progress_log as progress_log

NUM_PS, NUM_WORKERS = 2, 2
# One epoch of 512 batches of 256: more than any test here trains.
SMALL_CTR = {"vocab_sizes": "3000:2000:1000", "embedding_dim": "8", "hidden": "32:16",
             "eval_examples": "4096", "train_examples": "131072"}


@pytest.fixture(scope="module")
def cluster():
  return inprocess.start(NUM_PS, NUM_WORKERS).cluster


@pytest.fixture(scope="module")
def runtime(cluster):
  return strategy_lib.connect(cluster, ready_timeout=30, min_shard_bytes=16 << 10)


def _separable(n, seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 4)).astype("float32")
  y = (x @ np.array([1.0, -2.0, 0.5, 0.0], "float32") > 0).astype("float32")[:, None]
  return x, y


# An ordinary single-machine Orbit trainer and evaluator, written without
# parameter servers in mind (the `orbit` README style).

class LinearTrainer(orbit.StandardTrainer):

  def __init__(self, model, optimizer, global_step, dataset):
    self.strategy = tf.distribute.get_strategy()
    self.model, self.optimizer, self.global_step = model, optimizer, global_step
    self.train_loss = tf_keras.metrics.Mean("loss")
    super().__init__(dataset)

  def train_loop_begin(self):
    self.train_loss.reset_state()

  def train_step(self, iterator):
    def step_fn(inputs):
      x, y = inputs
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf_keras.losses.binary_crossentropy(
            y, self.model(x, training=True), from_logits=True))
      grads = tape.gradient(loss, self.model.trainable_variables)
      self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
      self.train_loss.update_state(loss)

    self.strategy.run(step_fn, args=(next(iterator),))
    self.global_step.assign_add(1)

  def train_loop_end(self):
    return {"loss": self.train_loss.result()}


class LinearEvaluator(orbit.StandardEvaluator):

  def __init__(self, model, dataset):
    self.strategy = tf.distribute.get_strategy()
    self.model = model
    self.metrics = [tf_keras.metrics.BinaryAccuracy("accuracy", threshold=0.0),
                    tf_keras.metrics.Mean("loss")]
    super().__init__(dataset)

  def eval_begin(self):
    for metric in self.metrics:
      metric.reset_state()

  def eval_step(self, iterator):
    def step_fn(inputs):
      x, y = inputs
      logits = self.model(x, training=False)
      self.metrics[0].update_state(y, logits)
      self.metrics[1].update_state(
          tf_keras.losses.binary_crossentropy(y, logits, from_logits=True))

    self.strategy.run(step_fn, args=(next(iterator),))

  def eval_end(self):
    return {m.name: m.result() for m in self.metrics}


def _linear_parts():
  model = tf_keras.Sequential([tf_keras.layers.Dense(8, activation="relu"),
                               tf_keras.layers.Dense(1)])
  model.build((None, 4))
  optimizer = tf_keras.optimizers.Adam(0.05)
  step = orbit.utils.create_global_step()
  x, y = _separable(2048, seed=0)
  train = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
  return model, optimizer, step, LinearTrainer(model, optimizer, step, train)


def plain_factory(context):
  """A user experiment: the plain classes above, nothing PS-specific."""
  model, optimizer, step, trainer = _linear_parts()
  ex, ey = _separable(500, seed=1)
  evaluator = LinearEvaluator(model, tf.data.Dataset.from_tensor_slices((ex, ey)).batch(64))
  from tfps.coordinator import experiment
  return experiment.Experiment(trainer=trainer, evaluator=evaluator,
                               checkpoint_items={"model": model, "optimizer": optimizer},
                               global_step=step)


def test_plain_trainer_runs_under_ps_with_one_changed_line(runtime):
  # The trainer is ordinary: it trains on one machine as written...
  _, _, step, trainer = _linear_parts()
  orbit.Controller(trainer=trainer, global_step=step, steps_per_loop=10).train(10)
  assert int(step.numpy()) == 10

  # ...and under parameter servers with one changed line (the wrap).
  with runtime.strategy.scope():
    model, optimizer, step, trainer = _linear_parts()
  trainer = trainer_lib.PSTrainer(trainer, runtime, steps_per_closure=5)  # The line.
  controller = orbit.Controller(trainer=trainer, global_step=step, steps_per_loop=30)
  first = controller.trainer.train(tf.constant(30))["loss"].numpy()
  controller.train(120)

  assert int(step.numpy()) == 120 and int(optimizer.iterations.numpy()) == 120
  assert trainer.closures_scheduled == 24  # 4 loops x 30 steps / 5 per closure.
  # The first loop learns most of it already (Adam at 0.05, an unseeded
  # init): its mean ran 0.7-1.7x the last loop's over that half; the
  # accuracy below is what says the model learnt.
  assert trainer.train_loop_end()["loss"].numpy() < first
  x, y = _separable(500, seed=1)
  accuracy = np.mean((model(x).numpy() > 0) == (y > 0))
  assert accuracy > 0.9
  assert "/job:ps/" in model.trainable_variables[0].device


def test_unrolled_closures_run_exactly_the_steps_asked(runtime):
  # Closures of 7 steps written out 3 at a time: 1 step, then a loop of 2 x 3.
  # 23 steps: three of those and one of 2 (other sizes: a loop of 1 step per
  # iteration); then 12: two closures of 6. The global step counts every
  # step exactly once.
  with runtime.strategy.scope():
    _, optimizer, step, trainer = _linear_parts()
  trainer = trainer_lib.PSTrainer(trainer, runtime, steps_per_closure=7, unroll=3)
  trainer.train(tf.constant(23))
  assert int(step.numpy()) == 23 and int(optimizer.iterations.numpy()) == 23
  trainer.train(tf.constant(12))
  assert int(step.numpy()) == 35 and trainer.closures_scheduled == 4 + 2
  with pytest.raises(errors.UsageError, match=r"unroll \(0\) must be a positive integer"):
    trainer_lib.PSTrainer(trainer.trainer, runtime, steps_per_closure=7, unroll=0)


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
                                  steps_per_closure=7, unroll=3)
  assert trainer.train(tf.constant(30)) == {"ones": 1.0, "twos": -1}  # The trainer's wins.
  assert trainer.train(tf.constant(10)) == {"ones": 1.0, "twos": -1}
  assert int(step.numpy()) == 40 and trainer.closures_scheduled == 5 + 2

  with runtime.strategy.scope():
    bad = trainer_lib.PSTrainer(_StepLogTrainer(step, logs={"v": tf.zeros([2])}),
                                runtime, steps_per_closure=5)
  with pytest.raises(errors.UsageError, match=r"_StepLogTrainer.train_step returned "
                                              r"logs\['v'\] of shape \(2,\)"):
    bad.train(tf.constant(5))


@pytest.mark.parametrize("form", ["dataset", "dataset_fn"])
def test_per_worker_datasets_are_split_by_worker(runtime, form):
  if form == "dataset":
    data = tf.data.Dataset.range(1000)
  else:
    data = lambda ctx: tf.data.Dataset.range(1000).shard(ctx.num_input_pipelines,
                                                         ctx.input_pipeline_id)
  iterator = iter(datasets.per_worker_dataset(runtime.coordinator, data,
                                              num_workers=NUM_WORKERS))

  @tf.function
  def take(iterator):
    return (tf.distribute.coordinator.experimental_get_current_worker_index(),
            next(iterator))

  results = [runtime.coordinator.schedule(take, args=(iterator,)) for _ in range(20)]
  runtime.coordinator.join()
  by_worker = {}
  for worker, value in (r.fetch() for r in results):
    assert value % NUM_WORKERS == worker  # Worker w only ever sees part w.
    by_worker.setdefault(int(worker), []).append(int(value))
  for worker, values in by_worker.items():  # Each in order, from its first element.
    assert sorted(values) == list(range(worker, worker + NUM_WORKERS * len(values), NUM_WORKERS))


def _reference_ctr_metrics(model, config, seed, batch):
  """The evaluator's own single-machine evaluate(), on the chief, whole set."""
  whole = ctr.eval_dataset_fn(config, seed, batch)(tf.distribute.InputContext())
  reference = ctr.CtrEvaluator(model, whole)  # Outside the scope: plain metrics.
  out = reference.evaluate(tf.constant(-1))
  return {k: float(v) for k, v in out.items()}, float(reference.loss.count.numpy())


def test_exact_eval_equals_single_machine_metrics(runtime, tmp_path):
  config = ctr.CtrConfig.from_params(dict(SMALL_CTR, eval_examples="1000"))
  with runtime.strategy.scope():
    model = ctr.build_model(config, seed=3)
    optimizer = tf_keras.optimizers.Adam(0.01)
    trainer = ctr.CtrTrainer(model, optimizer,
                             ctr.train_dataset_fn(config, 3, 128, data_dir=str(tmp_path)))
    evaluator = ctr.CtrEvaluator(model, ctr.eval_dataset_fn(config, 3, 64))
  trainer_lib.PSTrainer(trainer, runtime, steps_per_closure=10).train(tf.constant(40))
  expected, count = _reference_ctr_metrics(model, config, 3, 64)
  assert count == 1000

  for shards in (3, 8):
    ps_evaluator = evaluator_lib.PSEvaluator(evaluator, runtime, num_shards=shards)
    got = {k: float(v) for k, v in ps_evaluator.evaluate(tf.constant(-1)).items()}
    assert evaluator.loss.count.numpy() == 1000  # Every example exactly once.
    assert got["auc"] == pytest.approx(expected["auc"], abs=1e-6)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
  assert 0.55 < got["auc"] < 1.0  # A trained model, not a constant.

  partial = evaluator_lib.PSEvaluator(evaluator, runtime, num_shards=4)
  partial.evaluate(tf.constant(6))  # 6 batches of 64 in total.
  assert evaluator.loss.count.numpy() == 6 * 64


def test_exact_eval_of_chief_side_dataset(runtime):
  with runtime.strategy.scope():
    model, _, _, _ = _linear_parts()
    ex, ey = _separable(300, seed=5)
    evaluator = LinearEvaluator(model, tf.data.Dataset.from_tensor_slices((ex, ey)).batch(32))
  got = evaluator_lib.PSEvaluator(evaluator, runtime, num_shards=5).evaluate(tf.constant(-1))
  logits = model(ex).numpy()
  assert float(got["accuracy"]) == pytest.approx(np.mean((logits > 0) == (ey > 0)), abs=1e-6)
  assert evaluator.metrics[1].count.numpy() == 300


class Count(tf_keras.metrics.Metric):
  """A hand-written metric as users write them: its __init__ takes only a name."""

  def __init__(self, name="count"):
    super().__init__(name=name)
    self.seen = self.add_weight("seen", initializer="zeros", dtype=tf.int64)

  def update_state(self, values):
    self.seen.assign_add(tf.size(values, out_type=tf.int64))

  def result(self):
    return self.seen


class CountingEvaluator(orbit.StandardEvaluator):
  def __init__(self, dataset):
    self.strategy = tf.distribute.get_strategy()
    self.count = Count()
    self.mean = tf_keras.metrics.Mean("mean")
    super().__init__(dataset)

  def eval_begin(self):
    self.count.reset_state()
    self.mean.reset_state()

  def eval_step(self, iterator):
    def step_fn(values):
      self.count.update_state(values)
      self.mean.update_state(tf.cast(values, tf.float32))
    self.strategy.run(step_fn, args=(next(iterator),))

  def eval_end(self):
    return {"count": self.count.result(), "mean": self.mean.result()}


def test_exact_eval_of_a_metric_whose_init_does_not_take_its_config(runtime):
  with pytest.raises(TypeError):  # What copying it from its config did.
    Count.from_config(Count().get_config())
  with runtime.strategy.scope():
    evaluator = CountingEvaluator(tf.data.Dataset.range(1000).batch(32))
  got = evaluator_lib.PSEvaluator(evaluator, runtime, num_shards=6).evaluate(tf.constant(-1))
  assert int(got["count"]) == 1000  # Every example once, through 6 shards.
  assert float(got["mean"]) == pytest.approx(499.5)


def test_a_metric_whose_state_is_out_of_reach_is_refused_in_one_line(runtime):
  class Hidden(tf_keras.metrics.Metric):
    def __init__(self):
      super().__init__(name="hidden")
      self.parts = [self.add_weight("total", initializer="zeros")]  # In a list.

    def update_state(self, values):
      self.parts[0].assign_add(tf.reduce_sum(values))

    def result(self):
      return self.parts[0]

  with runtime.strategy.scope():
    evaluator = CountingEvaluator(tf.data.Dataset.range(10).batch(2))
    evaluator.count = Hidden()
  with pytest.raises(errors.UsageError, match="metric 'hidden' \\(Hidden\\) keeps state "
                     "variables"):
    evaluator_lib.PSEvaluator(evaluator, runtime, num_shards=2)


def _coordinator_config(cluster, model_dir, **overrides):
  kwargs = dict(cluster=cluster, model_dir=str(model_dir), experiment_params=SMALL_CTR,
                global_batch_size=256, steps_per_loop=100, checkpoint_interval=100,
                steps_per_closure=25, min_shard_bytes=16 << 10, ready_timeout=30, seed=1)
  kwargs.update(overrides)
  return coordinator_run.CoordinatorConfig(**kwargs)


def test_ctr_learns(cluster, tmp_path):
  result = coordinator_run.run_coordinator(_coordinator_config(cluster, tmp_path, train_steps=300,
                                         mode="train_and_eval"))
  line = json.loads(json.dumps(result.as_dict()))
  assert line["status"] == "finished" and line["global_step"] == 300
  assert line["eval"]["auc"] > 0.75, line  # Chance 0.5, dense features alone 0.74.
  assert line["eval"]["loss"] < 0.60, line  # Predicting the click rate: 0.65.
  assert line["examples_per_sec"] > 0 and line["restarts"] == 0
  assert line["checkpoint"] == str(tmp_path / "ckpt-300")
  assert glob.glob(str(tmp_path / "events.out.tfevents.*"))
  assert glob.glob(str(tmp_path / "eval" / "events.out.tfevents.*"))


def test_checkpoint_and_resume_at_the_saved_step(cluster, tmp_path, caplog):
  caplog.set_level("INFO", logger="absl")
  first = coordinator_run.run_coordinator(_coordinator_config(cluster, tmp_path, train_steps=120, mode="train",
                                        steps_per_loop=50, checkpoint_interval=50))
  assert first.global_step == 120 and first.eval == {}
  saved = sorted(int(os.path.basename(p)[len("ckpt-"):-len(".index")])
                 for p in glob.glob(str(tmp_path / "ckpt-*.index")))
  # A loop may end up to 12 steps short of its boundary (less than half a
  # closure of 25) at a shard's end: the save follows it (coordinator.loop_ends).
  assert len(saved) == 3 and 38 <= saved[0] <= 50 and 88 <= saved[1] <= 100, saved
  assert saved[2] == 120  # The end of training is exact.

  caplog.clear()
  second = coordinator_run.run_coordinator(_coordinator_config(cluster, tmp_path, train_steps=150, mode="train"))
  assert f"restored {tmp_path / 'ckpt-120'} at step 120" in caplog.text
  assert second.start_step == 120 and second.global_step == 150
  assert second.checkpoint == str(tmp_path / "ckpt-150")

  third = coordinator_run.run_coordinator(_coordinator_config(cluster, tmp_path, train_steps=150, mode="eval"))
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


def test_user_factory_with_plain_orbit_classes(cluster, tmp_path):
  result = coordinator_run.run_coordinator(_coordinator_config(
      cluster, tmp_path, experiment=f"{__name__}:plain_factory", experiment_params={},
      train_steps=60, steps_per_loop=30, checkpoint_interval=60, global_batch_size=32))
  assert result.global_step == 60
  assert result.eval["accuracy"] > 0.9


def test_checkpoint_of_another_model_is_permanent(cluster, tmp_path):
  coordinator_run.run_coordinator(_coordinator_config(cluster, tmp_path, train_steps=10, mode="train"))
  other = dict(SMALL_CTR, vocab_sizes="3000:2000:999")
  with pytest.raises(errors.PermanentError) as e:
    coordinator_run.run_coordinator(_coordinator_config(cluster, tmp_path, train_steps=20, mode="train",
                                  experiment_params=other))
  message = str(e.value)
  assert message.startswith(f"checkpoint {tmp_path / 'ckpt-10'} does not fit experiment 'ctr'")
  assert "\n" not in message


def test_eval_mode_without_checkpoint_is_a_usage_error(cluster, tmp_path):
  with pytest.raises(errors.UsageError, match=r"mode \(eval\) needs a checkpoint"):
    coordinator_run.run_coordinator(_coordinator_config(cluster, tmp_path, mode="eval"))


def test_readme_experiment_example_trains(cluster, tmp_path, monkeypatch):
  """The README's "write your own experiment" code, run as written."""
  import re
  import sys
  readme = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
  with open(readme) as f:
    (code,) = re.findall(r"```python\n(# my_experiment\.py\n.*?)```", f.read(), flags=re.S)
  (tmp_path / "my_experiment.py").write_text(code)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "my_experiment", raising=False)
  result = coordinator_run.run_coordinator(_coordinator_config(
      cluster, tmp_path / "model", experiment="my_experiment:factory", experiment_params={},
      train_steps=200, steps_per_loop=100, checkpoint_interval=100, global_batch_size=64))
  assert result.global_step == 200
  assert result.eval["accuracy"] > 0.9
  # One epoch of 64 batches, given as the README says: positioned, ~3 epochs.
  assert result.input["positioned"] and result.input["batches_per_epoch"] == 64
  assert result.input["epochs_completed"] == 3


# What a ctr train step moves between the coordinator and the ps, read from
# the partitioned graphs TensorFlow actually ran (run metadata). The step runs
# on this process (the chief) as it would on a worker.

def _step_transfers(runtime, train_step, example) -> dict[str, list[str]]:
  """Per ps, the tensors one step sends to or receives from it (control signals left out)."""
  from tensorflow.python.eager import context
  step = tf.function(lambda: train_step(example))
  with runtime.strategy.scope():
    context.context().enable_run_metadata()  # Partitions are reported when first run.
    try:
      step()
      metadata = context.context().export_run_metadata()
    finally:
      context.context().disable_run_metadata()
  # The step itself (other functions may run too: variable reads, datasets,
  # or, reported here too, functions this process instantiated earlier, such
  # as the one that wrote ctr's training files): the largest one that moves
  # tensors to or from a ps.
  candidates = [_ps_transfers(f) for f in sorted(
      metadata.function_graphs, key=lambda f: -len(f.pre_optimization_graph.node))
      if len(f.partition_graphs) > 1]
  transfers = next((t for t in candidates if t), {})
  return transfers


def _ps_transfers(function) -> dict[str, list[str]]:
  """Per ps, the tensors a function's partitions send to or receive from it."""
  transfers = {}
  for partition in function.partition_graphs:
    nodes = {node.name: node for node in partition.node}
    for node in partition.node:
      if node.op != "_Send":
        continue
      source = nodes[node.input[0].split(":")[0]]
      if source.op == "Const" and any(i.startswith("^") for i in source.input):
        continue  # A control signal: TensorFlow sends a dummy constant.
      ends = (node.attr["send_device"].s.decode(), node.attr["recv_device"].s.decode())
      ps = next((d.split("/device")[0] for d in ends if "/job:ps/" in d), None)
      if ps is not None:
        transfers.setdefault(ps, []).append(node.attr["tensor_name"].s.decode())
  return transfers


def _ctr_parts(runtime, model_dir):
  config = ctr.CtrConfig.from_params(SMALL_CTR)
  context = experiment_lib.ExperimentContext(
      strategy=runtime.strategy, coordinator=runtime.coordinator, model_dir=str(model_dir),
      global_batch_size=256, seed=3, num_workers=NUM_WORKERS, num_ps=NUM_PS, params=SMALL_CTR)
  with runtime.strategy.scope():
    trainer = ctr.factory(context).trainer
  return trainer, ctr.make_examples(tf.range(256, dtype=tf.int64), config, 3, 1)


def _plain_step(trainer):
  """The same step reading the variables inside the tape, as models usually do."""
  model, optimizer = trainer.model, trainer.optimizer

  def step_fn(example):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(ctr._loss(ctr._labels(example), model(example, training=True)))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))

  return lambda example: trainer.strategy.run(step_fn, args=(example,))


def test_a_ctr_step_moves_three_tensors_to_and_from_one_ps(cluster, tmp_path):
  # Tables whole (tfps's default placement for a table this small).
  whole = strategy_lib.connect(cluster, ready_timeout=30, min_shard_bytes=None)
  trainer, example = _ctr_parts(whole, tmp_path)
  pulled = _step_transfers(whole, lambda inputs: trainer.train_step(iter([inputs])), example)
  # The unique ids out, the rows and the MLP's weights back in one tensor,
  # all the gradients out in one: everything on the table's ps.
  (ps, names), = pulled.items()
  assert len(names) == 3, pulled
  assert ps == trainer.model.table.device.split("/device")[0]
  plain = _step_transfers(whole, _plain_step(trainer), example)
  # Reading the variables: ids, rows, MLP weights, unique ids and summed rows
  # of the sparse gradient, the MLP's gradient.
  assert sum(map(len, plain.values())) == 6, plain


def test_pull_push_on_a_table_split_over_the_ps_equals_reading_the_variables(runtime, tmp_path):
  trainer, example = _ctr_parts(runtime, tmp_path)  # 16 KiB shards: split over both ps.
  model = trainer.model
  assert len(model.table.variables) == NUM_PS
  transfers = _step_transfers(runtime, lambda inputs: trainer.train_step(iter([inputs])),
                              example)
  assert sorted(map(len, transfers.values())) == [3, 3], transfers  # Per ps: ids, pull, push.
  devices = []

  labels = ctr._labels(example)

  @tf.function
  def gradients():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(ctr._loss(labels, model(example)))
    plain = tape.gradient(loss, model.trainable_variables)
    pulled = pull_push.pull(tables=[(model.table, model.ids(example))],
                            dense=[model.mlp.packed])
    with tf.GradientTape() as tape:
      tape.watch(pulled.values)
      (rows,), (weights,) = pulled.lookups(), pulled.dense()
      loss = tf.reduce_mean(ctr._loss(labels, model.logits(rows, weights, example)))
    grads_and_vars = pulled.gradients(tape.gradient(loss, pulled.values))
    devices[:] = [(g.values.device if isinstance(g, tf.IndexedSlices) else g.device, v.device)
                  for g, v in grads_and_vars]
    return ([tf.convert_to_tensor(g) for g in plain],
            [tf.convert_to_tensor(g) for g, _ in grads_and_vars])

  with runtime.strategy.scope():
    plain, pulled = gradients()
  # Variable order: the table's shards, then the MLP; every gradient made on its ps.
  assert all(grad_device == var_device for grad_device, var_device in devices), devices
  plain_table = np.concatenate([g.numpy() for g in plain[:NUM_PS]])
  np.testing.assert_allclose(np.concatenate([g.numpy() for g in pulled[:NUM_PS]]),
                             plain_table, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(pulled[NUM_PS].numpy(), plain[NUM_PS].numpy(), rtol=1e-5,
                             atol=1e-7)


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
  assert len(getattr(table, "variables", [table])) == NUM_PS
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


def test_the_checkpoint_cost_bench_times_both_kinds_of_save(runtime, tmp_path, caplog):
  from tfps.bench import checkpoint_cost
  with caplog.at_level("INFO"):
    row, = checkpoint_cost.measure(runtime, (200_000,), str(tmp_path), repeats=1, loops=3,
                                   loop_steps=4)
  assert "async checkpoint" not in caplog.text  # TF's per-save lines, as in the chief's log.
  assert row["parameters"] == 200_000 and row["checkpoint_bytes"] >= 2 * 200_000 * 4
  for key in ("save_seconds", "async_first_seconds", "async_return_seconds",
              "async_write_seconds", "restore_seconds"):
    assert 0 < row[key] < 60, (key, row)
  assert row["async_return_seconds"] <= row["async_write_seconds"]
  waiting, skipping = row["every_loop"]["waiting"], row["every_loop"]["skipping"]
  assert (waiting["saves"], waiting["skipped"]) == (3, 0)
  # Whether a write outlasts a loop is the host's business; every loop end is one or the other.
  assert skipping["saves"] >= 1 and skipping["saves"] + skipping["skipped"] == 3
  assert not os.listdir(tmp_path)  # Its checkpoints are removed.


class _LostPs:
  """Sentinels of a ps that restarted: what `PsSentinels.check` raises then."""

  def check(self):
    raise ps_state.PsStateLost("ps:1 lost its variables (it restarted, or is down): ...")


def _guard(runtime, tmp_path, sentinels, step_on_lost_ps=False, interrupts=None, left_out=()):
  with runtime.strategy.scope():
    step = tf.Variable(7, dtype=tf.int64)
  items = {"step": step}
  if step_on_lost_ps:  # A checkpointed variable that cannot be read any more.
    items["gone"] = _Unreadable()
  manager = checkpoints.Manager(tf.train.Checkpoint(**items), str(tmp_path),
                                asynchronous=True, max_to_keep=2)
  return manager, loop_guard.LoopGuard(
      interrupts=interrupts or interrupts_lib.Interrupts(), manager=manager, global_step=step,
      cluster=runtime.cluster, model_dir=str(tmp_path), sentinels=sentinels, left_out=left_out)


class _Unreadable(tf.Module):
  """Saves like a variable whose ps lost it: the read fails with TensorFlow's error."""

  def __init__(self):
    super().__init__()
    self.value = tf.Variable(0.0)

  def _serialize_to_tensors(self):
    raise tf.errors.FailedPreconditionError(None, None, "Resource gone/N10tensorflow3VarE "
                                            "does not exist.")


def test_a_ps_that_lost_its_variables_ends_the_loop_retryable_after_a_save(runtime, tmp_path):
  sentinels = ps_state.PsSentinels(runtime.cluster)
  sentinels.check()  # Every ps of a healthy cluster holds its sentinel.
  assert [v.device for v in sentinels.variables] == [
      f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(NUM_PS)]
  (tmp_path / "saved").mkdir()
  manager, guard = _guard(runtime, tmp_path / "saved", _LostPs())
  with pytest.raises(ps_state.PsStateLost) as e:
    guard.after_loop(7)
  # Training just ran without that ps: the checkpoint is saved first, nothing lost.
  assert str(e.value).startswith("ps:1 lost its variables (it restarted, or is down)")
  assert str(e.value).endswith(f"at step 7; saved {tmp_path}/saved/ckpt-7 first")
  assert manager.latest_checkpoint == f"{tmp_path}/saved/ckpt-7"
  assert e.value.exit_code == errors.ExitCode.CLUSTER_LOST
  manager.close()

  # The checkpoint needs that ps: no save (and no partial checkpoint), still retryable.
  (tmp_path / "unsaved").mkdir()
  manager, guard = _guard(runtime, tmp_path / "unsaved", _LostPs(), step_on_lost_ps=True)
  with pytest.raises(ps_state.PsStateLost, match=r"at step 7; could not save "
                                                 r"\(FailedPreconditionError: Resource gone"):
    guard.after_loop(7)
  assert manager.latest_checkpoint is None
  manager.close()


def test_a_ps_notice_after_a_failover_is_matched_to_the_renumbered_cluster(
    runtime, tmp_path, monkeypatch):
  # Measured (soak of 2026-11-26, run 3): a coordinator running without ps:0
  # got ps:0's notice, waited 13 s for its own ps:0 (the whole cluster's ps:1)
  # to go, and restarted: a 26 s stall for a ps it did not use.
  probed = []
  monkeypatch.setattr(loop_guard.readiness, "reachable",
                      lambda cluster, tasks, timeout: probed.extend(tasks) or set())
  inbox = interrupts_lib.Interrupts()
  manager, guard = _guard(runtime, tmp_path, None, interrupts=inbox, left_out=("ps:0",))

  def after_a_notice_from(task):
    waiter = threading.Thread(target=inbox.notice,
                              args=(notices.Notice(task=task, deadline_seconds=10),))
    waiter.start()
    processes.wait_until(lambda: inbox.pending, timeout=10, what=f"{task}'s notice")
    try:
      guard.after_loop(7)
    finally:
      waiter.join(10)

  # The ps this coordinator runs without: answered at once, no save, training goes on.
  after_a_notice_from("ps:0")
  assert probed == [] and manager.latest_checkpoint is None
  # ps:1 is this coordinator's ps:0: save, wait for it to go, then restart.
  with pytest.raises(errors.RetryableError, match="ps:1 is being preempted; saved at step 7"):
    after_a_notice_from("ps:1")
  assert probed == [spec_lib.TaskId.parse("ps:0")]
  assert manager.latest_checkpoint == f"{tmp_path}/ckpt-7"
  manager.close()


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
