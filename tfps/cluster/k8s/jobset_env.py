"""A pod's place in a JobSet, derived from what JobSet and Kubernetes put in it: no TF_CONFIG.

JobSet names every pod `<jobset>-<replicated job>-<job index>-<pod index>` and,
with DNS hostnames on, makes that name resolve as `<name>.<subdomain>` (the
subdomain is the JobSet's name unless the manifest sets another). `tfps k8s`
renders one replicated job per role (`chief`, `ps`, `worker`), each a single
Indexed Job, so task `i` of a role is pod `i` of that role's job 0:

  ps:1  ->  <jobset>-ps-0-1.<subdomain>:2222

What a pod reads (the manifest maps the first three from the pod's labels with
the downward API; Kubernetes sets the fourth in every pod of an Indexed Job):

  JOBSET_NAME            label jobset.sigs.k8s.io/jobset-name
  REPLICATED_JOB_NAME    label jobset.sigs.k8s.io/replicatedjob-name
  JOB_INDEX              label jobset.sigs.k8s.io/job-index (0: one Job per role)
  JOB_COMPLETION_INDEX   the pod's index in its Job: the task index
  JOBSET_SUBDOMAIN       the manifest's network.subdomain (default: JOBSET_NAME)
  HOSTNAME               when set, must be the derived pod name (else the DNS
                         names derived for the other tasks would be wrong too)

A pod cannot see how many others there are: the replica counts are flags
(`--num_ps`, `--num_workers`, and `--chief_standby` for a second chief pod,
`chief:1`, the standby), rendered into every pod's command. Names, not
addresses: a pod restarted at a new IP keeps its name, and the others reach it
through DNS. Pure: the caller passes the environment in.

Elastic workers (`--max_workers=M`, also on every pod's command line): the
layout is the same, one Indexed Job per role, and the cluster spec names M
workers, `<jobset>-worker-0-0` to `<jobset>-worker-0-<M-1>`, whatever number
the worker Job runs now. Scaling that Job (its `completions` and
`parallelism`) adds or removes the pods with the highest indexes, each the
worker of its index; a name without a pod does not answer, and the chief
(`--min_workers`) trains on those that do. Not one Job per worker: JobSet
does not let a running JobSet's `replicas` change (docs/deployment.md).
"""

import dataclasses
import re
from typing import Mapping

from tfps.cluster import spec as spec_lib

JOBSET_NAME = "JOBSET_NAME"
REPLICATED_JOB_NAME = "REPLICATED_JOB_NAME"
JOB_INDEX = "JOB_INDEX"
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
JOBSET_SUBDOMAIN = "JOBSET_SUBDOMAIN"
HOSTNAME = "HOSTNAME"
# Where the manifest takes each variable from (the downward API's pod labels).
LABELS = {
    JOBSET_NAME: "jobset.sigs.k8s.io/jobset-name",
    REPLICATED_JOB_NAME: "jobset.sigs.k8s.io/replicatedjob-name",
    JOB_INDEX: "jobset.sigs.k8s.io/job-index",
}
ROLES = (spec_lib.JobType.CHIEF, spec_lib.JobType.PS, spec_lib.JobType.WORKER)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class JobSetEnvError(spec_lib.ClusterSpecError):
  """The pod's JobSet env or the replica flags are missing or inconsistent (exit 2)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSetLayout:
  """What every pod is told on its command line: the replica counts and the TF port."""

  num_ps: int
  num_workers: int
  port: int = 2222
  chief_standby: bool = False  # Two chief pods: an active chief and its standby.
  # Elastic: the worker Job may be scaled up to this many pods (None: fixed).
  max_workers: int | None = None

  def __post_init__(self):
    for field in ("num_ps", "num_workers"):
      if getattr(self, field) < 1:
        raise JobSetEnvError(f"--{field} ({getattr(self, field)}) must be a positive integer")
    if self.max_workers is not None and self.max_workers < self.num_workers:
      raise JobSetEnvError(f"--max_workers ({self.max_workers}) must be at least "
                           f"--num_workers ({self.num_workers})")
    if not 1 <= self.port <= 65535:
      raise JobSetEnvError(f"--task_port ({self.port}) is out of range 1-65535")

  def count(self, role: spec_lib.JobType) -> int:
    """The tasks of `role` in the cluster spec: with elastic workers, the most there may be."""
    return {spec_lib.JobType.CHIEF: 2 if self.chief_standby else 1,
            spec_lib.JobType.PS: self.num_ps,
            spec_lib.JobType.WORKER: self.max_workers or self.num_workers}[role]

  def count_flag(self, role: spec_lib.JobType) -> str:
    """The flag that sets `count(role)`, for errors."""
    return {spec_lib.JobType.CHIEF: "the chief replicas (--chief_standby: 2)",
            spec_lib.JobType.PS: "--num_ps",
            spec_lib.JobType.WORKER: ("--num_workers" if self.max_workers is None
                                      else "--max_workers")}[role]


def pod_name(jobset: str, role: spec_lib.JobType, index: int) -> str:
  """The hostname JobSet gives task `index` of `role` (job 0, pod `index`)."""
  return f"{jobset}-{role.value}-0-{index}"


def cluster_spec(jobset: str, subdomain: str, layout: JobSetLayout) -> spec_lib.ClusterSpec:
  """Every task's DNS name and port: the same on every pod, whatever their addresses."""
  return spec_lib.ClusterSpec.from_dict({
      role.value: [f"{pod_name(jobset, role, i)}.{subdomain}:{layout.port}"
                   for i in range(layout.count(role))]
      for role in ROLES})


def task_config(env: Mapping[str, str], layout: JobSetLayout) -> spec_lib.TaskConfig:
  """This pod's cluster and role, from its env (module docstring); one-line errors."""
  jobset = _dns_label(env, JOBSET_NAME)
  subdomain = _dns_label(env, JOBSET_SUBDOMAIN) if env.get(JOBSET_SUBDOMAIN) else jobset
  role_name = _required(env, REPLICATED_JOB_NAME)
  role = next((r for r in ROLES if r.value == role_name), None)
  if role is None:
    raise JobSetEnvError(f"{REPLICATED_JOB_NAME} ({role_name!r}) is not a tfps role "
                         f"(expected one of {', '.join(r.value for r in ROLES)})")
  job_index = _required(env, JOB_INDEX)
  if job_index != "0":
    raise JobSetEnvError(f"{JOB_INDEX} ({job_index!r}) must be 0: tfps renders one Job per "
                         "role, its tasks are the Job's pods (replicas: 1)")
  index_text = _required(env, JOB_COMPLETION_INDEX)
  if not index_text.isdigit():
    raise JobSetEnvError(f"{JOB_COMPLETION_INDEX} ({index_text!r}) must be a task index")
  index = int(index_text)
  count = layout.count(role)
  if index >= count:
    # With elastic workers: the worker Job was scaled past the room the pods were rendered with.
    raise JobSetEnvError(f"{JOB_COMPLETION_INDEX} ({index}) of {role.value} is not below "
                         f"{layout.count_flag(role)} ({count})")
  expected = pod_name(jobset, role, index)
  hostname = env.get(HOSTNAME)
  if hostname and hostname.split(".")[0] != expected:
    raise JobSetEnvError(f"{HOSTNAME} ({hostname!r}) is not {expected!r}, the name JobSet "
                         "gives this pod: the other tasks' names would be wrong too")
  return spec_lib.TaskConfig(cluster_spec(jobset, subdomain, layout),
                             spec_lib.TaskId(role, index))


def _required(env: Mapping[str, str], name: str) -> str:
  value = env.get(name, "").strip()
  if not value:
    source = (f"the pod label {LABELS[name]}" if name in LABELS
              else "Kubernetes, in every pod of an Indexed Job")
    raise JobSetEnvError(f"{name}: missing (set from {source}; "
                         "render the manifest with `tfps k8s --format=jobset`)")
  return value


def _dns_label(env: Mapping[str, str], name: str) -> str:
  value = _required(env, name)
  if not _DNS_LABEL.fullmatch(value):
    raise JobSetEnvError(f"{name} ({value!r}) must be a DNS label (a-z, 0-9, -)")
  return value
