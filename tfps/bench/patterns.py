"""The training patterns `tfps bench` compares, written for the benchmark.

Every pattern trains the built-in `ctr` experiment's own model, optimizer,
data (its training files, `params["data_dir"]`) and `train_step`; only the way
steps reach the workers (and how they read the files) differs:

* `SingleProcess`: Orbit's `StandardTrainer` loop in this process, no ps.
* `Tutorial`: TensorFlow's PS tutorial: each step is one `schedule()` of a
  one-step `tf.function`; `join()` every `steps_per_loop` steps.
* `ModelGarden`: Model Garden's async trainer: Orbit builds its usual
  `tf.while_loop` over `train_step`, the whole loop is *one* closure per
  Orbit loop, and `train_loop_end` joins (so one worker works at a time).
* `Tfps`: `coordinator.trainer.PSTrainer`, exactly as the chief builds it,
  on a runtime from `coordinator.strategy.connect` (tfps's own defaults).

The single process reads the whole file set, and each stock pattern's worker
its part of it (`create_per_worker_dataset`), repeated: the way their sources
read input (no position is kept). tfps reads the one epoch the experiment
gives and positions it (the coordinator's input ledger).

The stock patterns run on `stock_runtime`: the strategy as their sources
build it (the tutorial splits the embedding table over the ps, Model Garden
places every variable whole). They report the training loss the stock way, a
`tf_keras.metrics.Mean` updated every step from the step's logs (the
tutorial's metrics and Model Garden's `train_loss` are kept so); under
parameter servers its total and count live on a ps. tfps sums the same logs
inside each closure instead (`coordinator.step_logs`).

Each has `train(num_steps)`, which returns once those steps have run (no
closure still in flight), `evaluate()` (exact AUC over the whole eval set)
and `timer`, the time spent inside `schedule()` calls.
"""

import contextlib
import io
import time

import orbit
import tensorflow as tf
import tf_keras

from tfps.base import settings
from tfps.cluster import spec as spec_lib
from tfps.examples.ctr import experiment as ctr
from tfps.coordinator import evaluator as evaluator_lib
from tfps.coordinator import experiment as experiment_lib
from tfps.coordinator import strategy as strategy_lib
from tfps.coordinator import trainer as trainer_lib


class ScheduleTimer:
  """A ClusterCoordinator that counts and times its `schedule()` calls."""

  def __init__(self, coordinator):
    self._coordinator = coordinator
    self.calls = 0
    self.seconds = 0.0

  def schedule(self, fn, args=None, kwargs=None):
    start = time.perf_counter()
    try:
      return self._coordinator.schedule(fn, args=args, kwargs=kwargs)
    finally:
      self.seconds += time.perf_counter() - start
      self.calls += 1

  def reset(self) -> None:
    self.calls, self.seconds = 0, 0.0

  @property
  def micros_per_call(self) -> float:
    return 1e6 * self.seconds / self.calls if self.calls else 0.0

  def __getattr__(self, name):
    return getattr(self._coordinator, name)


# Each stock pattern places variables as its source does. TF's PS tutorial:
# `MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=NUM_PS)`. Model
# Garden (`official/common/distribute_utils.py`) builds its
# ParameterServerStrategy with no partitioner: every variable whole,
# round-robin over the ps.
TUTORIAL_MIN_SHARD_BYTES = 256 << 10
MODEL_GARDEN_MIN_SHARD_BYTES = None


def stock_runtime(cluster: spec_lib.ClusterSpec,
                  min_shard_bytes: int | None) -> strategy_lib.PSRuntime:
  """ParameterServerStrategy + ClusterCoordinator as the stock patterns build them.

  `min_shard_bytes`: a `MinSizePartitioner` with at most one shard per ps,
  or None for none. Call after `strategy_lib.connect` on the same cluster
  (which waits for it): the strategies then share this process's one
  connection to the cluster.
  """
  cluster = cluster.for_coordinator()
  num_ps = cluster.num_tasks(spec_lib.JobType.PS)
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster.as_dict()), rpc_layer="grpc")
  partitioner = None
  if min_shard_bytes:
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=min_shard_bytes, max_shards=num_ps)
  strategy = tf.distribute.experimental.ParameterServerStrategy(
      resolver, variable_partitioner=partitioner)
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  return strategy_lib.PSRuntime(strategy=strategy, coordinator=coordinator, cluster=cluster,
                                partitioned=partitioner is not None)


class _Quiet(io.TextIOBase):
  def write(self, text: str) -> int:
    return len(text)


def _controller(trainer, global_step, steps_per_loop, strategy=None) -> orbit.Controller:
  with contextlib.redirect_stdout(_Quiet()):  # Orbit prints its log lines too.
    return orbit.Controller(trainer=trainer, global_step=global_step, strategy=strategy,
                            steps_per_loop=steps_per_loop)


def _train_to(controller: orbit.Controller, num_steps: int) -> None:
  with contextlib.redirect_stdout(_Quiet()):
    controller.train(steps=int(controller.global_step.numpy()) + num_steps,
                     checkpoint_at_completion=False)


class _LossMetric(orbit.StandardTrainer):
  """A trainer whose step logs feed a per-step `Mean` metric (the stock way)."""

  def __init__(self, trainer: orbit.StandardTrainer, train_dataset):
    self._trainer = trainer
    self.train_loss = tf_keras.metrics.Mean("loss")
    super().__init__(train_dataset)

  def train_loop_begin(self):
    self.train_loss.reset_state()

  def train_step(self, iterator):
    self.train_loss.update_state(self._trainer.train_step(iterator)["loss"])

  def train_loop_end(self):
    return {"loss": self.train_loss.result()}


def _auc(output) -> float:
  return float(output["auc"].numpy() if hasattr(output["auc"], "numpy") else output["auc"])


class SingleProcess:
  """The ctr experiment on one machine: no strategy, no ps, no closures."""

  def __init__(self, params, *, batch_size: int, seed: int, steps_per_loop: int):
    config = ctr.CtrConfig.from_params(params)
    context = experiment_lib.ExperimentContext(
        strategy=tf.distribute.get_strategy(), coordinator=None, model_dir="",
        global_batch_size=batch_size, seed=seed, num_workers=1, num_ps=0, params=params)
    parts = ctr.factory(context).trainer
    self.global_step = parts.global_step
    whole = tf.distribute.InputContext()
    dataset = parts.train_dataset(whole).repeat()  # The files' one epoch, over and over.
    trainer = ctr.CtrTrainer(parts.model, parts.optimizer, dataset)
    self._trainer = _LossMetric(trainer, trainer.train_dataset)
    self._evaluator = ctr.CtrEvaluator(
        parts.model, ctr.eval_dataset_fn(config, seed, batch_size)(whole))
    self._controller = _controller(self._trainer, self.global_step, steps_per_loop)
    self.timer = None

  def train(self, num_steps: int) -> None:
    _train_to(self._controller, num_steps)

  def evaluate(self) -> float:
    return _auc(self._evaluator.evaluate(tf.constant(-1)))


class _Distributed:
  """What the three parameter-server patterns share: the experiment, eval."""

  def __init__(self, runtime: strategy_lib.PSRuntime, params, *, batch_size: int, seed: int):
    self.timer = ScheduleTimer(runtime.coordinator)
    self.runtime = strategy_lib.PSRuntime(
        strategy=runtime.strategy, coordinator=self.timer, cluster=runtime.cluster,
        partitioned=runtime.partitioned)
    context = experiment_lib.ExperimentContext(
        strategy=runtime.strategy, coordinator=runtime.coordinator, model_dir="",
        global_batch_size=batch_size, seed=seed, num_workers=runtime.num_workers,
        num_ps=runtime.num_ps, params=params)
    self.experiment = experiment_lib.build(ctr.factory, context, name="ctr",
                                           partitioned=runtime.partitioned)
    self.global_step = self.experiment.global_step
    # Evaluation is tfps's exact sharded eval for every pattern: the same
    # measurement of the model, whichever pattern trained it.
    self._evaluator = evaluator_lib.PSEvaluator(self.experiment.evaluator, runtime)

  def evaluate(self) -> float:
    with self.runtime.strategy.scope():
      return _auc(self._evaluator.evaluate(tf.constant(-1)))

  def stock_per_worker_dataset(self):
    """The tutorial's way: `create_per_worker_dataset` of a function of the worker index.

    Each worker reads its part of the files, repeated (the tutorial's
    `dataset.shard(...).repeat()`); a worker that restarts starts it again.
    """
    dataset_fn = self.experiment.trainer.train_dataset
    num_workers = self.runtime.num_workers

    def per_worker_fn():
      index = tf.distribute.coordinator.experimental_get_current_worker_index()
      return dataset_fn(tf.distribute.InputContext(
          num_input_pipelines=num_workers, input_pipeline_id=index)).repeat()

    return self.runtime.coordinator.create_per_worker_dataset(per_worker_fn)


class Tutorial(_Distributed):
  """One `schedule()` per step; join every `steps_per_loop` steps."""

  def __init__(self, runtime, params, *, batch_size: int, seed: int, steps_per_loop: int):
    super().__init__(runtime, params, batch_size=batch_size, seed=seed)
    self._steps_per_loop = steps_per_loop
    dataset = self.stock_per_worker_dataset()
    self._iterator = iter(dataset)
    with runtime.strategy.scope():
      self._trainer = _LossMetric(self.experiment.trainer, dataset)
    self._step_fn = tf.function(self._trainer.train_step)

  def train(self, num_steps: int) -> None:
    coordinator = self.runtime.coordinator
    with self.runtime.strategy.scope():
      for i in range(num_steps):
        coordinator.schedule(self._step_fn, args=(self._iterator,))
        if (i + 1) % self._steps_per_loop == 0:
          coordinator.join()
      coordinator.join()


class _ModelGardenTrainer(orbit.StandardTrainer):
  """Model Garden's async pattern: Orbit's while loop, scheduled as one closure."""

  def __init__(self, trainer: orbit.StandardTrainer, coordinator, per_worker_dataset):
    self._trainer = trainer
    self._coordinator = coordinator
    super().__init__(per_worker_dataset,
                     options=orbit.StandardTrainerOptions(use_tf_while_loop=True))

  def train_loop_begin(self):
    return self._trainer.train_loop_begin()

  def train_step(self, iterator):
    self._trainer.train_step(iterator)

  def train_loop_end(self):
    self._coordinator.join()
    return self._trainer.train_loop_end()

  def create_train_loop_fn(self):
    loop_fn = super().create_train_loop_fn()

    def scheduled(iterator, num_steps):
      self._coordinator.schedule(loop_fn, args=(iterator, num_steps))

    return scheduled


class ModelGarden(_Distributed):
  """One closure of a whole Orbit loop, then join, under an Orbit Controller."""

  def __init__(self, runtime, params, *, batch_size: int, seed: int, steps_per_loop: int):
    super().__init__(runtime, params, batch_size=batch_size, seed=seed)
    dataset = self.stock_per_worker_dataset()
    with runtime.strategy.scope():
      with_metric = _LossMetric(self.experiment.trainer, dataset)
    trainer = _ModelGardenTrainer(with_metric, self.runtime.coordinator, dataset)
    self._controller = _controller(trainer, self.global_step, steps_per_loop,
                                   runtime.strategy)

  def train(self, num_steps: int) -> None:
    with self.runtime.strategy.scope():
      _train_to(self._controller, num_steps)


def tfps_loop_options(steps_per_closure: int, unroll: int) -> trainer_lib.LoopOptions:
  """The tfps variant's loops: written out from the first loop (the windows time the
  steady closure), with the chief's defaults for what costs in the steady state:
  closures bounded in time, and fenced so that a slow worker's closure can run
  again elsewhere."""
  return trainer_lib.LoopOptions(
      steps_per_closure=steps_per_closure, unroll=unroll,
      max_closure_seconds=settings.DEFAULTS["max_closure_seconds"],
      rerun_slow_closures=settings.DEFAULTS["rerun_slow_closures"])


class Tfps(_Distributed):
  """tfps's PSTrainer, built as the chief builds it, under an Orbit Controller."""

  def __init__(self, runtime, params, *, batch_size: int, seed: int, steps_per_loop: int,
               steps_per_closure: int, unroll: int = trainer_lib.DEFAULT_UNROLL):
    super().__init__(runtime, params, batch_size=batch_size, seed=seed)
    self._trainer = trainer_lib.PSTrainer(self.experiment.trainer, self.runtime,
                                          tfps_loop_options(steps_per_closure, unroll))
    self._controller = _controller(self._trainer, self.global_step, steps_per_loop,
                                   runtime.strategy)

  def train(self, num_steps: int) -> None:
    with self.runtime.strategy.scope():
      _train_to(self._controller, num_steps)


def noop_closure_micros(coordinator, count: int) -> float:
  """Wall µs per empty closure when `count` of them are queued at once, then joined."""
  noop = tf.function(lambda: tf.constant(0))
  coordinator.schedule(noop)  # Trace and warm up the path once.
  coordinator.join()
  start = time.perf_counter()
  for _ in range(count):
    coordinator.schedule(noop)
  coordinator.join()
  return 1e6 * (time.perf_counter() - start) / count
