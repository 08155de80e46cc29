"""The coordinator's value types: its configuration, its result, their enums.

`CoordinatorConfig` is validated at construction (errors name the field and the
value, UsageError); `CoordinatorResult.as_dict()` is the one JSON line the command
line prints. `coordinator.run` re-exports all four.

Nothing here imports TensorFlow: the command line validates a chief's flags
with `CoordinatorConfig` before it starts any process (`tfps local`).
"""

import dataclasses
import enum
import importlib
import importlib.util
import types
from typing import Any, Callable, Mapping

from tfps.cluster import spec as spec_lib
from tfps.base import errors
from tfps.base import messages
from tfps.base import settings

_DEFAULTS = settings.DEFAULTS
# Variables larger than this are split across the ps tasks, in shards of at
# least this size (why this size: `coordinator.strategy`, which re-exports it).
DEFAULT_MIN_SHARD_BYTES = _DEFAULTS["min_shard_bytes"]

# The built-in experiments, by name: the factory each stands for.
# Each is an ordinary experiment module under `tfps.examples`, found the way a
# user's `package.module:factory` is: the name is only a short form of it.
BUILTIN_EXPERIMENTS = types.MappingProxyType({"ctr": "tfps.examples.ctr:factory"})


def experiment_target(name: str) -> tuple[str, str]:
  """The (module, attribute) of an experiment factory: a built-in name or `module:factory`.

  Only the name is checked (nothing is imported), so a misspelt experiment
  fails with the chief's flags, before TensorFlow loads.

  Raises:
    UsageError: an unknown built-in name, or not `package.module:factory`.
  """
  if not isinstance(name, str) or not name.strip():
    raise errors.UsageError(f"experiment ({name!r}) must be a name or package.module:factory")
  module, sep, attribute = BUILTIN_EXPERIMENTS.get(name, name).partition(":")
  if not sep:
    raise errors.UsageError(
        f"experiment {name!r} is unknown (built-in: {', '.join(sorted(BUILTIN_EXPERIMENTS))}; "
        "or give package.module:factory)")
  if not module or not attribute:
    raise errors.UsageError(f"experiment {name!r} must look like package.module:factory")
  return module, attribute


def check_experiment_findable(name: str) -> None:
  """UsageError if the experiment's module is not on the Python path.

  Found without importing it (importlib's finder): the command line checks
  this before it starts any task or imports TensorFlow. Whether the module
  imports and has the factory: `load_factory`; whether its settings are
  good: `check_params`.
  """
  module, _ = experiment_target(name)
  try:
    found = importlib.util.find_spec(module)
  except (ImportError, ValueError) as e:  # A parent package is missing, or a bad name.
    found, reason = None, f"{type(e).__name__}: {e}"
  else:
    reason = "not found on the Python path; is PYTHONPATH set?"
  if found is None:
    raise errors.UsageError(f"experiment {name!r}: cannot import module {module!r} ({reason})")


def _import(name: str):
  module_name, _ = experiment_target(name)
  try:
    return importlib.import_module(module_name)
  except Exception as e:  # Any failure to import is the user's to fix.
    raise errors.UsageError(
        f"experiment {name!r}: cannot import module {module_name!r} "
        f"({type(e).__name__}: {messages.one_line(e)})") from e


def check_params(name: str, params: Mapping[str, str]) -> None:
  """Checks `--experiment_params` with the experiment module's own `check_params`.

  An experiment's module may define `check_params(params)`, which raises
  `UsageError` naming a bad setting. tfps calls it before any task starts
  (`tfps.commands.experiment_check`) and in the coordinator before it
  connects; a module without one is checked by its factory when it runs.
  Cheap where the module imports no TensorFlow at its top, as the built-in
  `tfps.examples.ctr` does.

  Raises:
    UsageError: a bad setting, or a module that cannot be imported.
  """
  check = getattr(_import(name), "check_params", None)
  if not callable(check):
    return
  try:
    check(dict(params))
  except errors.UsageError:
    raise
  except Exception as e:  # The user's check failed otherwise: still their input's fault.
    raise errors.UsageError(f"experiment {name!r}: check_params raised "
                            f"{type(e).__name__}: {messages.one_line(e)}") from e


def load_factory(name: str) -> Callable[..., Any]:
  """Imports an experiment's module and returns its factory (not called).

  TensorFlow-free itself (the user's module may import it): `tfps local`
  runs this in a short-lived child process before it starts any task
  (`tfps.commands.experiment_check`), the coordinator when it loads the experiment.
  Whether the factory returns an `Experiment` is known only when it is
  called, inside a strategy's scope on a running cluster: the coordinator's
  first start then exits 2, which is never retried.

  Raises:
    UsageError: unknown name, module that cannot be imported, missing or
      non-callable attribute.
  """
  module_name, attribute = experiment_target(name)
  factory = _import(name)
  for part in attribute.split("."):
    if not hasattr(factory, part):
      raise errors.UsageError(
          f"experiment {name!r}: module {module_name!r} has no attribute {attribute!r}")
    factory = getattr(factory, part)
  if not callable(factory):
    raise errors.UsageError(
        f"experiment {name!r}: {attribute!r} is a {type(factory).__name__}, not callable")
  return factory


class Mode(str, enum.Enum):
  TRAIN = "train"
  TRAIN_AND_EVAL = "train_and_eval"
  EVAL = "eval"

  def __str__(self) -> str:
    return self.value


class RunStatus(str, enum.Enum):
  """How a coordinator run ended. Only FINISHED so far; recovery adds more."""

  FINISHED = "finished"

  def __str__(self) -> str:
    return self.value


def _positive_int(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise errors.UsageError(f"{name} ({value!r}) must be a positive integer")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoordinatorConfig(settings.LoopSettings):
  """Everything the coordinator needs; validated at construction.

  Attributes:
    cluster: the cluster (evaluators are ignored by the coordinator).
    model_dir: checkpoints, summaries; created if missing.
    experiment: a built-in name (`ctr`) or `package.module:factory`.
    experiment_params: experiment-specific `key=value` settings.
    mode: `train`, `train_and_eval` or `eval`.
    train_steps: train until the global step reaches this; None when
      train_epochs decides. Exactly one of the two is set: given neither,
      train_steps is the run's default (`base.settings`).
    train_epochs: train this many epochs of a finite training dataset
      (positioned input, input.ledger); the step to reach is then
      known once the input is measured. None: train_steps decides.
    input_shards: shards of the finite training input; None lets the
      runtime choose (input.positioned).
    steps_per_loop: steps per Orbit train loop (one progress line each).
    steps_per_closure: at most this many steps per remote closure.
    max_closure_seconds: fewer steps per closure where steps are slower, so that
      a closure runs about this long at most (`recovery.closure_plan`); 0: no bound.
    checkpoint_interval: save every this many steps (and at the end).
    async_checkpoint: write checkpoints in the background from an in-memory
      snapshot on each ps (`checkpoints.Manager`).
    max_to_keep: checkpoints kept in model_dir.
    eval_steps: batches per evaluation; None evaluates the whole eval set.
    eval_interval: in train_and_eval, steps between evaluations; None
      evaluates once, at the end.
    eval_shards: closures per evaluation; None means 4 per worker of the
      spec (the left-out ones too: a resize keeps the shards).
    global_batch_size: examples per training step. A step runs on one worker
      (asynchronous training), so this is also each worker's batch.
    seed: seed of data and initialization.
    ready_timeout: seconds to wait for the cluster to answer.
    min_shard_bytes: split variables larger than this across the ps tasks;
      None disables partitioning.
    fast_start: start with the fast-start closures and write out once the
      run's training left repays it (with `trace_cache`), else once the
      coordinator has lived long enough to repay it, or at once after
      long-lived coordinators (`recovery.closure_plan`).
    trace_cache: store the traced train closures in `model_dir/traces` and
      rebuild them from there in later coordinators of the same program and
      configuration instead of tracing them (`fast_restart.trace_cache`).
    ps_timeout: seconds a ps may not answer before the run counts it lost
      and exits 170 (a partition hangs TF instead of failing it, see
      `coordinator.ps_deadline`); None: no deadline.
    failover_graphs: with `trace_cache` on 2 ps, have the workers optimize the
      written-out closure of the cluster a ps failover would leave, ahead of
      need (`fast_restart.failover_graphs`); for a coordinator whose supervisor
      fails over (`tfps run` with --ps_failover).
    tasks_left_out: the workers and ps the supervisor left out of `cluster`
      (`worker:1`, `ps:0`).
    tasks_expected_back: those of `tasks_left_out` the supervisor will
      restart this coordinator to take back soon after they answer again
      (`recovery.readmission.expected_back`): with any, it is expected to
      live short (`recovery.closure_plan`).
    workers_ready_timeout: seconds to wait for the workers to answer, if
      less than `ready_timeout`: with elastic workers (`--min_workers`) the
      supervisor started this coordinator on the workers that answered; one
      that has stopped since makes it exit retryable at once, and the next
      starts without it. None: `ready_timeout`.
    lease_generation: the chief lease generation this coordinator runs under
      (`recovery.chief_lease`; 0: no lease): once another replica takes the
      next one, it writes no checkpoint and no progress record.
  """

  cluster: spec_lib.ClusterSpec
  model_dir: str
  experiment: str = _DEFAULTS["experiment"]
  experiment_params: Mapping[str, str] = dataclasses.field(default_factory=dict)
  mode: Mode = Mode(_DEFAULTS["mode"])
  train_steps: int | None = None  # Neither it nor train_epochs: the default.
  train_epochs: int | None = _DEFAULTS["train_epochs"]
  min_shard_bytes: int | None = _DEFAULTS["min_shard_bytes"]
  ps_timeout: float | None = _DEFAULTS["ps_timeout"]
  # The supervisor's ps failover is what these graphs are for: a coordinator
  # run alone (this API) has none, `tfps run` sets it from its flags.
  failover_graphs: bool = False
  tasks_left_out: tuple[str, ...] = ()
  tasks_expected_back: tuple[str, ...] = ()
  workers_ready_timeout: float | None = None
  lease_generation: int = 0

  def __post_init__(self):
    if not isinstance(self.cluster, spec_lib.ClusterSpec):
      raise errors.UsageError(
          f"cluster ({type(self.cluster).__name__}) must be a tfps.cluster.spec.ClusterSpec")
    if not isinstance(self.model_dir, str) or not self.model_dir.strip():
      raise errors.UsageError(f"model_dir ({self.model_dir!r}) must be a directory path")
    experiment_target(self.experiment)  # A UsageError naming it, if it is not one.
    try:
      object.__setattr__(self, "mode", Mode(self.mode))
    except ValueError:
      allowed = ", ".join(m.value for m in Mode)
      raise errors.UsageError(f"mode ({self.mode!r}) must be one of {allowed}") from None
    if self.train_steps is None and self.train_epochs is None:
      object.__setattr__(self, "train_steps", _DEFAULTS["train_steps"])
    if self.train_steps is not None and self.train_epochs is not None:
      raise errors.UsageError(
          f"train_epochs ({self.train_epochs}) and train_steps ({self.train_steps}): "
          "give one of the two")
    for name in ("steps_per_loop", "steps_per_closure",
                 "checkpoint_interval", "max_to_keep", "global_batch_size"):
      _positive_int(name, getattr(self, name))
    for name in ("train_steps", "eval_steps", "eval_interval", "eval_shards", "min_shard_bytes",
                 "train_epochs", "input_shards"):
      if getattr(self, name) is not None:
        _positive_int(name, getattr(self, name))
    for name in ("fast_start", "trace_cache", "async_checkpoint", "failover_graphs",
                 "rerun_slow_closures"):
      if not isinstance(getattr(self, name), bool):
        raise errors.UsageError(f"{name} ({getattr(self, name)!r}) must be true or false")
    if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
      raise errors.UsageError(f"seed ({self.seed!r}) must be a non-negative integer")
    if isinstance(self.ready_timeout, bool) or not isinstance(self.ready_timeout, (int, float)) \
        or not 0 < self.ready_timeout < float("inf"):
      raise errors.UsageError(f"ready_timeout ({self.ready_timeout!r}) must be positive seconds")
    if self.workers_ready_timeout is not None and not 0 < self.workers_ready_timeout < float(
        "inf"):
      raise errors.UsageError(f"workers_ready_timeout ({self.workers_ready_timeout!r}) must be "
                              "positive seconds or None")
    if isinstance(self.max_closure_seconds, bool) or not isinstance(
        self.max_closure_seconds, (int, float)) or not 0 <= self.max_closure_seconds < float("inf"):
      raise errors.UsageError(
          f"max_closure_seconds ({self.max_closure_seconds!r}) must be >= 0 seconds")
    if self.ps_timeout is not None and (
        isinstance(self.ps_timeout, bool) or not isinstance(self.ps_timeout, (int, float))
        or not 0 < self.ps_timeout < float("inf")):
      raise errors.UsageError(f"ps_timeout ({self.ps_timeout!r}) must be positive seconds")
    params = dict(self.experiment_params)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
      raise errors.UsageError(
          f"experiment_params ({params!r}) must map strings to strings")
    object.__setattr__(self, "experiment_params", types.MappingProxyType(params))
    for name in ("tasks_left_out", "tasks_expected_back"):
      object.__setattr__(self, name, tuple(getattr(self, name)))
    for task in self.tasks_expected_back:
      if task not in self.tasks_left_out:
        raise errors.UsageError(
            f"tasks_expected_back ({task!r}) must be one of tasks_left_out {self.tasks_left_out}")


@dataclasses.dataclass(frozen=True)
class CoordinatorResult:
  """The outcome of `run_coordinator`; `as_dict()` is the JSON line of the CLI.

  Attributes:
    status: how the run ended.
    experiment, mode, train_steps, model_dir: as configured.
    global_step: the step reached (may pass `train_steps` by the steps of
      re-run closures, see `trainer.PSTrainer`).
    start_step: the step restored at start (0 without a checkpoint).
    examples_per_sec, steps_per_sec, train_seconds: over this run's train
      loops only (evaluation and checkpoint saves excluded).
    eval: the last evaluation's metrics ({} in mode train).
    checkpoint: the latest checkpoint in model_dir, if any.
    restarts: coordinator restarts (0 here; counted by the supervisor).
    input: the training input as this coordinator left it (positioned or
      not, shards, epochs; see `input.ledger`).
    checkpoint_saves, checkpoint_stall_seconds: this coordinator's saves and
      the time training stood still for them (`checkpoints.Manager`).
    checkpoint_saves_skipped: saves that were due while the previous write
      still ran, left to the next loop end (`checkpoints.Manager`).
  """

  status: RunStatus
  experiment: str
  mode: Mode
  global_step: int
  start_step: int
  train_steps: int
  examples_per_sec: float
  steps_per_sec: float
  train_seconds: float
  eval: Mapping[str, float]
  checkpoint: str | None
  model_dir: str
  restarts: int = 0
  input: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  checkpoint_saves: int = 0
  checkpoint_stall_seconds: float = 0.0
  checkpoint_saves_skipped: int = 0

  def as_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["status"], d["mode"], d["eval"] = self.status.value, self.mode.value, dict(self.eval)
    d["input"] = dict(self.input)
    return d

  @classmethod
  def from_dict(cls, raw: Mapping[str, Any]) -> "CoordinatorResult":
    """The record `as_dict` wrote (the coordinator's result file, read by its supervisor).

    Raises:
      ValueError: not such a record (a field missing or unknown, a bad enum).
    """
    names = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(raw, Mapping) or set(raw) - names:
      raise ValueError(f"not a coordinator result: {raw!r:.200}")
    try:
      return cls(**{**raw, "status": RunStatus(raw["status"]), "mode": Mode(raw["mode"])})
    except (KeyError, TypeError) as e:
      raise ValueError(f"not a coordinator result ({e}): {raw!r:.200}") from None
