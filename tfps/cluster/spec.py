"""Who is in the job and where: a validated, immutable cluster spec.

A `ClusterSpec` lists the `host:port` address of every task per job (chief,
ps, worker, evaluator). A `TaskConfig` adds which task this process is. Both
are built from `TF_CONFIG` text, a JSON file, or host lists from flags, and
every way in goes through the same validation, so a bad spec always fails the
same way: a one-line `ClusterSpecError` naming the field and its value
(exit code 2).

Nothing here reads the environment: callers pass `TF_CONFIG`'s text in.
"""

import dataclasses
import enum
import json
from typing import Iterable, Iterator, Mapping, Sequence

from tfps.base import errors


class ClusterSpecError(errors.UsageError):
  """The cluster spec or task role is invalid; the message names the field."""


class JobType(str, enum.Enum):
  CHIEF = "chief"
  PS = "ps"
  WORKER = "worker"
  EVALUATOR = "evaluator"


# The most tasks a job may hold: a chief may have a standby replica
# (`recovery.chief_lease`), an evaluator none.
_MAX_TASKS = {JobType.CHIEF: 2, JobType.EVALUATOR: 1}


@dataclasses.dataclass(frozen=True, order=True)
class TaskId:
  """One task of the cluster, written `job:index` (e.g. `worker:1`)."""

  job: JobType
  index: int

  def __str__(self) -> str:
    return f"{self.job.value}:{self.index}"

  @property
  def device(self) -> str:
    return f"/job:{self.job.value}/replica:0/task:{self.index}"

  @classmethod
  def parse(cls, text: str) -> "TaskId":
    """Parses `job:index`, e.g. `ps:0`."""
    job, sep, index = text.partition(":")
    if not sep or not index.isdigit():
      raise ClusterSpecError(f"task {text!r} must look like job:index, e.g. worker:0")
    return cls(_job_type(job, field="task"), int(index))


def _job_type(name: object, *, field: str) -> JobType:
  try:
    return JobType(name)
  except ValueError:
    allowed = ", ".join(j.value for j in JobType)
    raise ClusterSpecError(
        f"{field}: unknown job type {name!r} (expected one of {allowed})") from None


def _check_address(address: object, *, field: str) -> str:
  """Returns `address` if it is `host:port` with a valid port."""
  if not isinstance(address, str) or ":" not in address:
    raise ClusterSpecError(f"{field}: address {address!r} must be host:port")
  host, _, port = address.rpartition(":")
  if not host or host == "[]":
    raise ClusterSpecError(f"{field}: address {address!r} has no host")
  if not port.isdigit():
    raise ClusterSpecError(f"{field}: port {port!r} of {address!r} is not a number")
  if not 1 <= int(port) <= 65535:
    raise ClusterSpecError(f"{field}: port {port} of {address!r} is out of range 1-65535")
  return address


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
  """Addresses of every task, per job. Immutable; build with `from_dict`.

  `jobs` is a tuple of `(JobType, (address, ...))` pairs in a fixed job order
  so that equal clusters compare and hash equal.
  """

  jobs: tuple[tuple[JobType, tuple[str, ...]], ...]

  @classmethod
  def from_dict(cls, cluster: object, *,
                field_names: Mapping[JobType, str] | None = None) -> "ClusterSpec":
    """Validates a `{"ps": ["host:port", ...], ...}` mapping.

    `field_names` renames the fields in error messages (for flags: the
    `ps` list is `--ps_hosts`); the default is `cluster.<job>`.
    """
    field_names = field_names or {}
    if not isinstance(cluster, Mapping):
      raise ClusterSpecError(f"cluster: expected an object of job lists, got {cluster!r}")
    jobs: dict[JobType, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    for name, addresses in cluster.items():
      job = _job_type(name, field="cluster")
      field = field_names.get(job, f"cluster.{job.value}")
      if isinstance(addresses, str) or not isinstance(addresses, Sequence):
        raise ClusterSpecError(f"{field}: expected a list of host:port, got {addresses!r}")
      if not addresses:
        raise ClusterSpecError(f"{field}: the job list is empty")
      if len(addresses) > _MAX_TASKS.get(job, len(addresses)):
        raise ClusterSpecError(
            f"{field}: at most {_MAX_TASKS[job]} {job.value} task(s) allowed"
            f"{' (an active chief and its standby)' if job == JobType.CHIEF else ''}, "
            f"got {len(addresses)}")
      for i, address in enumerate(addresses):
        _check_address(address, field=f"{field}[{i}]")
        if address in seen:
          raise ClusterSpecError(
              f"{field}[{i}]: duplicate address {address!r} (also {seen[address]})")
        seen[address] = f"{field}[{i}]"
      jobs[job] = tuple(addresses)
    if not jobs.get(JobType.PS):
      field = field_names.get(JobType.PS, "cluster.ps")
      raise ClusterSpecError(f"{field}: a parameter-server cluster needs at least one ps task")
    ordered = tuple((job, jobs[job]) for job in JobType if job in jobs)
    return cls(jobs=ordered)

  def addresses(self, job: JobType) -> tuple[str, ...]:
    return dict(self.jobs).get(job, ())

  def address(self, task: TaskId) -> str:
    return self.addresses(task.job)[task.index]

  def num_tasks(self, job: JobType) -> int:
    return len(self.addresses(job))

  def tasks(self) -> Iterator[TaskId]:
    for job, addresses in self.jobs:
      for index in range(len(addresses)):
        yield TaskId(job, index)

  def as_dict(self) -> dict[str, list[str]]:
    """The plain mapping `tf.train.ClusterSpec` and `TF_CONFIG` use."""
    return {job.value: list(addresses) for job, addresses in self.jobs}

  def for_coordinator(self, replica: int = 0) -> "ClusterSpec":
    """The cluster as the coordinator of chief replica `replica` must see it:
    that replica as the one chief, no evaluator.

    A coordinator whose cluster lists an evaluator waits forever for it
    (tensorflow#46169), so the evaluator is dropped here, once, for everyone.
    TensorFlow knows one chief: a standby replica's coordinator is that chief
    once it takes over (`recovery.chief_lease`).
    """
    chiefs = self.addresses(JobType.CHIEF)
    if not chiefs:
      raise ClusterSpecError("cluster.chief: the coordinator role needs a chief task")
    return ClusterSpec(jobs=tuple(
        (job, (chiefs[replica],) if job == JobType.CHIEF else addresses)
        for job, addresses in self.jobs if job != JobType.EVALUATOR))

  @property
  def chief_standby(self) -> bool:
    """Whether the chief has a standby replica (two chief addresses)."""
    return self.num_tasks(JobType.CHIEF) > 1


  def without(self, tasks: Iterable[TaskId]) -> "ClusterSpec":
    """This cluster minus some workers and ps, the rest of each job renumbered from 0.

    ParameterServerStrategy addresses the tasks of a job as 0..n-1, so the
    remaining ones must be dense; a task's identity is its address. At least
    one worker and one ps must remain.
    """
    drop = set(tasks)
    if any(t.job not in (JobType.WORKER, JobType.PS) for t in drop):
      raise ClusterSpecError(f"only workers and ps can be left out, not {sorted(map(str, drop))}")
    jobs = []
    for job, addresses in self.jobs:
      kept = tuple(a for i, a in enumerate(addresses) if TaskId(job, i) not in drop)
      if not kept:
        raise ClusterSpecError(f"cluster.{job.value}: cannot leave out every {job.value} task")
      jobs.append((job, kept))
    return ClusterSpec(jobs=tuple(jobs))


def renumbered(task: TaskId, left_out: Iterable[TaskId]) -> TaskId | None:
  """`task` as `ClusterSpec.without(left_out)` numbers it; None if it is left out.

  Tasks name themselves by the whole cluster (a ps's notice says `ps:1`);
  a coordinator started without some of them addresses the rest renumbered.
  """
  drop = set(left_out)
  if task in drop:
    return None
  before = sum(1 for t in drop if t.job == task.job and t.index < task.index)
  return TaskId(task.job, task.index - before)


def host_of(address: str) -> str:
  """The host part of `host:port` ('[::1]:2222' -> '[::1]')."""
  return address.rpartition(":")[0]


def shares_host(cluster: ClusterSpec, task: TaskId) -> bool:
  """Whether `task` runs on a host a ps or worker of `cluster` also runs on (by
  their addresses' host parts: `tfps local` puts every task on localhost)."""
  mine = host_of(cluster.address(task))
  return any(host_of(cluster.address(other)) == mine for other in cluster.tasks()
             if other.job in (JobType.PS, JobType.WORKER))


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """A validated cluster plus the role of this process in it."""

  cluster: ClusterSpec
  task: TaskId

  def __post_init__(self):
    count = self.cluster.num_tasks(self.task.job)
    if count == 0:
      raise ClusterSpecError(
          f"task.type: job {self.task.job.value!r} is not in the cluster")
    if not 0 <= self.task.index < count:
      raise ClusterSpecError(
          f"task.index: {self.task.index} is out of range for job "
          f"{self.task.job.value!r} with {count} task(s)")
    if self.task.job == JobType.CHIEF:
      self.cluster.for_coordinator(self.task.index)  # Validates that the chief can coordinate.

  @property
  def address(self) -> str:
    return self.cluster.address(self.task)

  def to_tf_config(self) -> str:
    """This config as `TF_CONFIG` JSON text."""
    return json.dumps({
        "cluster": self.cluster.as_dict(),
        "task": {"type": self.task.job.value, "index": self.task.index},
    })


def _load_json(text: str, *, source: str) -> object:
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    snippet = text if len(text) <= 40 else text[:37] + "..."
    raise ClusterSpecError(
        f"{source}: malformed JSON {snippet!r} ({e.msg} at line {e.lineno} column {e.colno})"
    ) from None


def _task_from_json(task: object, *, source: str) -> TaskId:
  if not isinstance(task, Mapping):
    raise ClusterSpecError(f"{source}.task: expected an object with type and index, got {task!r}")
  if "type" not in task:
    raise ClusterSpecError(f"{source}.task.type: missing")
  index = task.get("index", 0)
  if isinstance(index, bool) or not isinstance(index, int):
    raise ClusterSpecError(f"{source}.task.index: {index!r} is not an integer")
  if index < 0:
    raise ClusterSpecError(f"{source}.task.index: {index} is negative")
  return TaskId(_job_type(task["type"], field=f"{source}.task.type"), index)


def from_tf_config(text: str, *, source: str = "TF_CONFIG") -> TaskConfig:
  """Parses `TF_CONFIG` text: `{"cluster": {...}, "task": {"type", "index"}}`."""
  if not text or not text.strip():
    raise ClusterSpecError(f"{source}: is empty; set it or pass --cluster_spec or host flags")
  config = _load_json(text, source=source)
  if not isinstance(config, Mapping):
    raise ClusterSpecError(f"{source}: expected a JSON object, got {config!r}")
  for key in ("cluster", "task"):
    if key not in config:
      raise ClusterSpecError(f"{source}.{key}: missing")
  try:
    cluster = ClusterSpec.from_dict(config["cluster"])
  except ClusterSpecError as e:
    raise ClusterSpecError(f"{source}.{e}") from None
  return TaskConfig(cluster, _task_from_json(config["task"], source=source))


def from_json_file(path: str, *, job_name: str | None = None,
                   task_index: int | None = None) -> TaskConfig:
  """Reads a cluster file: either TF_CONFIG-shaped or just the cluster mapping.

  `job_name`/`task_index`, when given, choose or override the task role.
  """
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except OSError as e:
    raise ClusterSpecError(f"--cluster_spec: cannot read {path!r} ({e.strerror})") from None
  config = _load_json(text, source=path)
  if isinstance(config, Mapping) and "cluster" in config:
    cluster_dict, task = config["cluster"], config.get("task")
  else:
    cluster_dict, task = config, None
  try:
    cluster = ClusterSpec.from_dict(cluster_dict)
  except ClusterSpecError as e:
    raise ClusterSpecError(f"{path}: {e}") from None
  if job_name is not None:
    return TaskConfig(cluster, TaskId(_job_type(job_name, field="--job_name"), task_index or 0))
  if task is None:
    raise ClusterSpecError(f"{path}: no task in the file; pass --job_name and --task_index")
  return TaskConfig(cluster, _task_from_json(task, source=path))


_HOST_FLAGS = {JobType.CHIEF: "--chief_host", JobType.PS: "--ps_hosts",
               JobType.WORKER: "--worker_hosts"}


def from_host_flags(*, ps_hosts: Sequence[str], worker_hosts: Sequence[str],
                    chief_host: str | None, job_name: str | None,
                    task_index: int) -> TaskConfig:
  """Builds the config from `--ps_hosts --worker_hosts --chief_host --job_name --task_index`."""
  if not job_name:
    raise ClusterSpecError("--job_name: missing (one of chief, ps, worker, evaluator)")
  cluster: dict[str, list[str]] = {}
  if chief_host:
    cluster["chief"] = [chief_host]
  cluster["ps"] = list(ps_hosts)
  if worker_hosts:
    cluster["worker"] = list(worker_hosts)
  spec = ClusterSpec.from_dict(cluster, field_names=_HOST_FLAGS)
  if task_index < 0:
    raise ClusterSpecError(f"--task_index: {task_index} is negative")
  return TaskConfig(spec, TaskId(_job_type(job_name, field="--job_name"), task_index))
