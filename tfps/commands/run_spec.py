"""The run spec: every setting of a training run, parsed once from the flags.

`tfps run` (chief), `tfps local`, `tfps chaos` and `tfps k8s` build one
`RunSpec` from their flags at the command line's edge, validated at
construction (a one-line UsageError naming the flag and its value), and hand
that one object on: to the supervisor, to the coordinator it starts (as a
JSON file, `tfps run --run_spec=FILE`), to a local cluster's chief (the same
file) and to the Kubernetes renderer (`to_flags`, derived from the fields, so
no setting can be left out of a manifest).

Each field is named after its flag and holds the flag's value (e.g.
`ps_timeout` 0 means no deadline, as on the command line); `coordinator_config`
turns it into the coordinator's `CoordinatorConfig`. TensorFlow-free.
"""

import dataclasses
import json
import types
from typing import Any, Mapping

from tfps.base import errors
from tfps.base import files
from tfps.base import settings
from tfps.cluster import spec as spec_lib
from tfps.coordinator import api
from tfps.recovery import readmission

_DEFAULTS = settings.DEFAULTS


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSpec(settings.LoopSettings):
  """What to train and how to keep it running; one field per flag.

  Attributes (the flags' help says more):
    experiment, experiment_params, model_dir, mode, train_steps,
    train_epochs, input_shards, steps_per_loop, steps_per_closure, fast_start, trace_cache,
    checkpoint_interval, async_checkpoint, max_to_keep, eval_steps, eval_interval, eval_shards,
    global_batch_size, seed, ready_timeout, min_shard_bytes (0: never
    split), ps_timeout (0: no deadline): the coordinator's (`CoordinatorConfig`).
      Exactly one of train_steps and train_epochs is set.
    max_restarts, restart_window, cluster_wait_seconds, worker_timeout,
    min_workers (None: every worker of the cluster spec), grace_seconds, warm_standby, ps_failover, ps_readmit, ps_readmit_after:
      the chief's supervisor.
    failover_graphs: with ps_failover, the coordinator's too.
    exclude_tasks: workers and ps the supervisor leaves out of a
      coordinator's cluster (`worker:1`, `ps:0`); set by the supervisor, not
      by users.
    chief_lease_seconds: with two chief replicas, the lease (`recovery.chief_lease`).
    lease_generation: the lease generation a coordinator runs under (0: no
      lease); set by the supervisor.
  """

  experiment: str = _DEFAULTS["experiment"]
  experiment_params: Mapping[str, str] = dataclasses.field(default_factory=dict)
  model_dir: str | None = _DEFAULTS["model_dir"]
  mode: str = _DEFAULTS["mode"]
  train_steps: int | None = _DEFAULTS["train_steps"]
  train_epochs: int | None = _DEFAULTS["train_epochs"]
  min_shard_bytes: int = _DEFAULTS["min_shard_bytes"]
  ps_timeout: float = _DEFAULTS["ps_timeout"]
  max_restarts: int = _DEFAULTS["max_restarts"]
  restart_window: float = _DEFAULTS["restart_window"]
  cluster_wait_seconds: float = _DEFAULTS["cluster_wait_seconds"]
  worker_timeout: float = _DEFAULTS["worker_timeout"]
  min_workers: int | None = _DEFAULTS["min_workers"]
  grace_seconds: float = _DEFAULTS["grace_seconds"]
  warm_standby: bool = _DEFAULTS["warm_standby"]
  ps_failover: bool = _DEFAULTS["ps_failover"]
  failover_graphs: bool = _DEFAULTS["failover_graphs"]
  ps_readmit: str = _DEFAULTS["ps_readmit"]
  ps_readmit_after: float = _DEFAULTS["ps_readmit_after"]
  exclude_tasks: tuple[str, ...] = _DEFAULTS["exclude_tasks"]
  chief_lease_seconds: float = _DEFAULTS["chief_lease_seconds"]
  lease_generation: int = _DEFAULTS["lease_generation"]

  def __post_init__(self):
    api.experiment_target(self.experiment)  # A UsageError naming it, if it is not one.
    params = dict(self.experiment_params)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
      raise errors.UsageError(f"experiment_params ({params!r}) must map strings to strings")
    object.__setattr__(self, "experiment_params", types.MappingProxyType(params))
    if self.model_dir is not None and (not isinstance(self.model_dir, str)
                                       or not self.model_dir.strip()):
      raise errors.UsageError(f"model_dir ({self.model_dir!r}) must be a directory path")
    if self.mode not in {m.value for m in api.Mode}:
      allowed = ", ".join(m.value for m in api.Mode)
      raise errors.UsageError(f"mode ({self.mode!r}) must be one of {allowed}")
    if (self.train_steps is None) == (self.train_epochs is None):
      raise errors.UsageError(
          f"train_epochs ({self.train_epochs}) and train_steps ({self.train_steps}): "
          "give one of the two")
    for name in _POSITIVE_INTS:
      value = getattr(self, name)
      if value is not None and not (_is_int(value) and value >= 1):
        raise errors.UsageError(f"{name} ({value!r}) must be a positive integer")
    for name in ("seed", "max_restarts", "min_shard_bytes", "lease_generation"):
      if not (_is_int(getattr(self, name)) and getattr(self, name) >= 0):
        raise errors.UsageError(f"{name} ({getattr(self, name)!r}) must be >= 0")
    for name, lowest in _SECONDS.items():
      value = getattr(self, name)
      if not (_is_number(value) and value < float("inf")
              and (value > 0 if lowest == "positive" else value >= 0)):
        raise errors.UsageError(f"{name} ({value!r}) must be {lowest}")
    if self.ps_readmit not in {r.value for r in readmission.Readmit}:
      allowed = ", ".join(r.value for r in readmission.Readmit)
      raise errors.UsageError(f"ps_readmit ({self.ps_readmit!r}) must be one of {allowed}")
    for name in ("warm_standby", "fast_start", "trace_cache", "async_checkpoint",
                 "ps_failover", "failover_graphs", "rerun_slow_closures"):
      if not isinstance(getattr(self, name), bool):
        raise errors.UsageError(f"{name} ({getattr(self, name)!r}) must be true or false")
    object.__setattr__(self, "exclude_tasks", tuple(self.exclude_tasks))
    for name in self.exclude_tasks:
      if spec_lib.TaskId.parse(name).job not in (spec_lib.JobType.WORKER, spec_lib.JobType.PS):
        raise errors.UsageError(
            f"exclude_tasks ({name!r}) must name workers or ps (worker:N, ps:N)")

  def coordinator_config(self, cluster: spec_lib.ClusterSpec) -> api.CoordinatorConfig:
    """The coordinator's configuration on `cluster` (its left-out tasks removed)."""
    return api.CoordinatorConfig(
        cluster=cluster.without(map(spec_lib.TaskId.parse, self.exclude_tasks)),
        model_dir=self.model_dir,
        **{name: getattr(self, name) for name in _CHIEF_FIELDS},
        min_shard_bytes=self.min_shard_bytes or None,
        ps_timeout=self.ps_timeout or None, tasks_left_out=self.exclude_tasks,
        lease_generation=self.lease_generation,
        failover_graphs=self.ps_failover and self.failover_graphs,
        tasks_expected_back=readmission.expected_back(self.exclude_tasks, self.ps_readmit),
        # Elastic: the supervisor started it on workers that answered; one
        # gone since is left out by the next start, not waited for.
        workers_ready_timeout=(min(self.ready_timeout, self.worker_timeout)
                               if self.min_workers is not None else None))

  def to_json(self) -> dict[str, Any]:
    out = {name: getattr(self, name) for name in FIELDS}  # asdict cannot copy a mappingproxy.
    out["experiment_params"] = dict(self.experiment_params)
    out["exclude_tasks"] = list(self.exclude_tasks)
    return out

  @classmethod
  def from_json(cls, raw: Any, *, source: str) -> "RunSpec":
    if not isinstance(raw, dict):
      raise errors.UsageError(f"{source}: must hold a JSON object, not {type(raw).__name__}")
    unknown = set(raw) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise errors.UsageError(f"{source}: unknown setting(s) {', '.join(sorted(unknown))}")
    return cls(**raw)

  def to_flags(self, *, leave_out: frozenset[str] = frozenset()) -> list[str]:
    """The spec as `tfps run` flags (None: the flag's default, not written); the
    supervisor's own settings (`SUPERVISOR_SET`) only if set."""
    out = []
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if (field.name in leave_out or value is None or value == ()
          or (field.name in SUPERVISOR_SET and value == field.default)):
        continue
      if isinstance(value, bool):
        text = "true" if value else "false"
      elif field.name == "experiment_params":
        if not value:
          continue
        text = ",".join(f"{k}={v}" for k, v in value.items())
      elif isinstance(value, tuple):
        text = ",".join(value)
      else:
        text = repr(value) if isinstance(value, float) else str(value)
      out.append(f"--{field.name}={text}")
    return out


# Set by the supervisor for each coordinator it starts, never by users.
SUPERVISOR_SET = frozenset({"exclude_tasks", "lease_generation"})
# The coordinator's: its loop's settings (shared field for field) and these.
_CHIEF_FIELDS = ("experiment", "experiment_params", "mode", "train_steps", "train_epochs",
                 *(f.name for f in dataclasses.fields(settings.LoopSettings)))
_POSITIVE_INTS = ("train_steps", "train_epochs", "input_shards", "steps_per_loop",
                  "steps_per_closure", "checkpoint_interval", "max_to_keep", "eval_steps",
                  "eval_interval", "eval_shards", "global_batch_size", "min_workers")
_SECONDS = {"ready_timeout": "positive", "restart_window": "positive",
            "cluster_wait_seconds": "positive", "worker_timeout": "positive",
            "grace_seconds": "positive", "ps_timeout": ">= 0", "ps_readmit_after": ">= 0",
            "max_closure_seconds": ">= 0", "chief_lease_seconds": "positive"}
FIELDS = tuple(f.name for f in dataclasses.fields(RunSpec))


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_params(items: list[str]) -> dict[str, str]:
  """`--experiment_params` items `key=value` as a dict."""
  params = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
      raise errors.UsageError(f"--experiment_params: {item!r} must look like key=value")
    params[key.strip()] = value.strip()
  return params


def from_flags(flags) -> RunSpec:
  """The run's spec from the parsed flags, or from `--run_spec=FILE` (not both).

  The experiment's own settings are its module's to check
  (`api.check_params`); where the experiment must run here, callers also
  check that its module can be found (`api.check_experiment_findable`).
  """
  if flags.run_spec:
    given = [name for name in FIELDS if flags[name].present]
    if given:
      raise errors.UsageError(
          f"--run_spec: the run's settings come from {flags.run_spec!r}; "
          f"do not also give --{given[0]}")
    spec = read(flags.run_spec)
  else:
    values = {name: getattr(flags, name) for name in FIELDS}
    values["experiment_params"] = parse_params(flags.experiment_params)
    values["exclude_tasks"] = tuple(flags.exclude_tasks)
    if flags.train_epochs is not None and not flags["train_steps"].present:
      values["train_steps"] = None  # Epochs decide; giving both is refused.
    spec = RunSpec(**values)
  return spec


def write(spec: RunSpec, path: str) -> str:
  files.write_json(path, spec.to_json())
  return path


def read(path: str) -> RunSpec:
  try:
    with open(path, encoding="utf-8") as f:
      raw = json.load(f)
  except OSError as e:
    raise errors.UsageError(f"--run_spec: cannot read {path!r} ({e.strerror})") from None
  except ValueError as e:
    raise errors.UsageError(f"--run_spec: {path!r} is not JSON ({e})") from None
  return RunSpec.from_json(raw, source=f"--run_spec {path!r}")
