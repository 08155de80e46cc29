"""The experiment API: what user code gives the chief, and how the chief finds it.

An experiment is a factory, `factory(context: ExperimentContext) -> Experiment`,
that the chief calls once, inside `context.strategy.scope()` (so every
variable it creates lives on the ps tasks). It returns ordinary Orbit
objects; the chief makes them parameter-server aware:

* a `StandardTrainer` is wrapped in `trainer.PSTrainer` (closures on all
  workers); any other `orbit.AbstractTrainer` is used as it is;
* a `StandardEvaluator` is wrapped in `evaluator.PSEvaluator` (exact,
  shard-by-shard evaluation).

Name an experiment with `load_factory`: a built-in name (`ctr`) or
`package.module:factory` for user code.

    def factory(context):
      model = make_tf_keras_model()
      optimizer = tf_keras.optimizers.Adam()
      step = orbit.utils.create_global_step()
      return Experiment(
          trainer=MyTrainer(model, optimizer, step, context.global_batch_size),
          evaluator=MyEvaluator(model),
          checkpoint_items={"model": model, "optimizer": optimizer},
          global_step=step)

Models must be tf_keras (Keras 2): Keras 3 cannot train the ShardedVariables
that a variable partitioner creates (docs/tensorflow-behaviour.md).
"""

import dataclasses
import types
from typing import Any, Callable, Mapping

import orbit
import tensorflow as tf

from tfps.coordinator import api
from tfps.base import messages
from tfps.base import errors

# Built-in experiments: name -> "module:factory", imported only when chosen.
BUILTIN = api.BUILTIN_EXPERIMENTS
# The checkpoint name of the input ledger (input.ledger), beside the
# experiment's own items.
INPUT_LEDGER_KEY = "input_ledger"


@dataclasses.dataclass(frozen=True)
class ExperimentContext:
  """What the chief tells an experiment factory.

  Attributes:
    strategy: the ParameterServerStrategy (the factory runs in its scope).
    coordinator: its ClusterCoordinator.
    model_dir: where checkpoints and summaries go.
    global_batch_size: examples per training step. Each step runs on one
      worker, so this is also each worker's batch per step.
    seed: seed for data and initialization; the same seed gives the same data.
    num_workers: workers in the cluster.
    num_ps: parameter servers in the cluster.
    params: experiment-specific settings (`key=value` strings from the
      command line); each experiment parses and validates its own.
  """

  strategy: tf.distribute.Strategy
  coordinator: Any
  model_dir: str
  global_batch_size: int
  seed: int
  num_workers: int
  num_ps: int
  params: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    object.__setattr__(self, "params", types.MappingProxyType(dict(self.params)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Experiment:
  """What an experiment factory returns (keyword arguments only).

  Attributes:
    trainer: an `orbit.AbstractTrainer`, usually a plain `StandardTrainer`;
      None (the default) for an evaluation-only experiment.
    evaluator: an `orbit.AbstractEvaluator`, usually a plain
      `StandardEvaluator` keeping its results in tf_keras metrics; None (the
      default) for a train-only experiment.
    checkpoint_items: name -> trackable (model, optimizer, ...) to checkpoint.
    global_step: the integer `tf.Variable` the trainer increments once per
      step (`orbit.utils.create_global_step()` or a tf_keras optimizer's
      `iterations`); it is checkpointed too.
  """

  trainer: orbit.AbstractTrainer | None = None
  evaluator: orbit.AbstractEvaluator | None = None
  checkpoint_items: Mapping[str, Any]
  global_step: tf.Variable

  def __post_init__(self):
    if self.trainer is not None and not isinstance(self.trainer, orbit.AbstractTrainer):
      raise errors.UsageError(
          f"Experiment.trainer: expected an orbit.AbstractTrainer, "
          f"got {type(self.trainer).__name__}")
    if self.evaluator is not None and not isinstance(self.evaluator, orbit.AbstractEvaluator):
      raise errors.UsageError(
          f"Experiment.evaluator: expected an orbit.AbstractEvaluator, "
          f"got {type(self.evaluator).__name__}")
    if self.trainer is None and self.evaluator is None:
      raise errors.UsageError("Experiment: needs a trainer, an evaluator or both")
    if not isinstance(self.global_step, tf.Variable) or not self.global_step.dtype.is_integer:
      raise errors.UsageError(
          f"Experiment.global_step: expected an integer tf.Variable, "
          f"got {type(self.global_step).__name__}")
    if not isinstance(self.checkpoint_items, Mapping):
      raise errors.UsageError(
          f"Experiment.checkpoint_items: expected a mapping of name to trackable, "
          f"got {type(self.checkpoint_items).__name__}")
    items = dict(self.checkpoint_items)
    for reserved, owner in (("global_step", "Experiment.global_step"),
                            (INPUT_LEDGER_KEY, "the input's position")):
      if reserved in items:
        raise errors.UsageError(
            f"Experiment.checkpoint_items: {reserved!r} is reserved for {owner}")
    object.__setattr__(self, "checkpoint_items", types.MappingProxyType(items))


Factory = Callable[[ExperimentContext], Experiment]


def load_factory(name: str) -> Factory:
  """Finds an experiment factory: a built-in name or `package.module:factory`.

  Raises:
    UsageError: unknown name, module that cannot be imported, missing or
      non-callable attribute (`api.load_factory`).
  """
  return api.load_factory(name)


def check_params(name: str, params) -> None:
  """The experiment module's own check of its settings (`api.check_params`)."""
  api.check_params(name, params)


def build(factory: Factory, context: ExperimentContext, *, name: str,
          partitioned: bool) -> Experiment:
  """Calls `factory(context)` inside the strategy's scope and checks the result.

  Raises:
    UsageError: the factory returned something other than an `Experiment`,
      or (with a variable partitioner) uses Keras 3; TfpsErrors the factory
      raises keep their type.
    PermanentError: the factory raised any other exception.
  """
  try:
    with context.strategy.scope():
      experiment = factory(context)
  except errors.TfpsError:
    raise
  except Exception as e:
    if partitioned and _raised_in_keras3(e):
      raise errors.UsageError(
          f"{_keras3_message(name)} ({type(e).__name__}: {messages.one_line(e)})") from e
    raise errors.PermanentError(
        f"experiment factory {name!r} raised {type(e).__name__}: {messages.one_line(e)}") from e
  if not isinstance(experiment, Experiment):
    raise errors.UsageError(
        f"experiment factory {name!r} returned {type(experiment).__name__}, "
        "expected tfps.Experiment")
  if partitioned:
    culprit = _find_keras3(experiment)
    if culprit is not None:
      raise errors.UsageError(_keras3_message(name, culprit))
  return experiment


def _keras3_message(name: str, culprit: str | None = None) -> str:
  what = f" ({culprit})" if culprit else ""
  return (f"experiment {name!r} uses a Keras 3 object{what} with a variable partitioner; "
          "ParameterServerStrategy's sharded variables need tf_keras (import tf_keras)")


def _is_keras3(obj: Any) -> bool:
  return any(cls.__module__.split(".")[0] == "keras" for cls in type(obj).__mro__)


def _find_keras3(experiment: Experiment) -> str | None:
  """Names a Keras 3 object among the experiment's parts (one level deep), if any."""
  parts = dict(experiment.checkpoint_items)
  for owner_name in ("trainer", "evaluator"):
    owner = getattr(experiment, owner_name)
    if owner is None:
      continue
    for attr, value in vars(owner).items():
      if not attr.startswith("_self_"):
        parts[f"{owner_name}.{attr}"] = value
  for label, value in parts.items():
    if _is_keras3(value):
      return f"{label}: {type(value).__module__}.{type(value).__name__}"
  return None


def _raised_in_keras3(e: BaseException) -> bool:
  tb = e.__traceback__
  while tb is not None:
    module = tb.tb_frame.f_globals.get("__name__", "")
    if module.split(".")[0] == "keras":
      return True
    tb = tb.tb_next
  return False
