"""How many threads a ps or worker server needs (shared by real and in-process servers)."""

import math
import os

from tfps.cluster import spec as spec_lib

_CGROUP_V2_CPU_MAX = "/sys/fs/cgroup/cpu.max"
_CGROUP_V1_QUOTA = "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"
_CGROUP_V1_PERIOD = "/sys/fs/cgroup/cpu/cpu.cfs_period_us"


def inter_op_threads(num_workers: int) -> int:
  """Inter-op threads a ps or worker needs so that closures cannot starve each other.

  With fewer than `num_workers + 1` inter-op threads, servers on a 2-core
  machine deadlock when closures of several workers run at once: measured
  for workers (docs/tensorflow-behaviour.md; TF's own test helper applies the
  same rule) and for ps tasks (2 threads hang with 2 workers, 3 run).
  """
  return max(2, num_workers + 1)


def intra_op_threads(job: spec_lib.JobType, cores: int, workers_on_host: int = 1) -> int:
  """Intra-op threads of a ps or worker server on a host of `cores` usable cores
  that `workers_on_host` workers share.

  A ps gets 1: its kernels are row gathers and updates, too small to gain from
  splitting, and handing them to other threads costs more than it saves. A
  worker gets its share of the cores: TensorFlow's default is every core the
  process may run on, so workers sharing a host (`tfps local`) each split
  their kernels over all of them, which costs more CPU per step than it
  saves (measured: docs/benchmarks.md, "Threads per task").
  """
  if job == spec_lib.JobType.PS:
    return 1
  return max(1, cores // max(1, workers_on_host))


def usable_cores(*, affinity: int | None = None, cpu_max: str | None = None,
                 cfs_quota: str | None = None, cfs_period: str | None = None) -> int:
  """Cores this process may keep busy: its CPU affinity, capped by a cgroup CPU
  quota (a container's CPU limit), rounded up.

  TensorFlow sizes its pools by the affinity alone, so a container limited to
  2 CPUs on a 64-core node would run 64 threads per pool. Each keyword
  replaces what is read from this machine (tests): `cpu_max` is cgroup v2's
  `cpu.max` ("max 100000" or "200000 100000"); `cfs_quota`/`cfs_period`
  cgroup v1's files.
  """
  if affinity is None:
    affinity = len(os.sched_getaffinity(0))
  if cpu_max is None and cfs_quota is None:
    cpu_max = _read(_CGROUP_V2_CPU_MAX)
    if cpu_max is None:
      cfs_quota, cfs_period = _read(_CGROUP_V1_QUOTA), _read(_CGROUP_V1_PERIOD)
  quota = _quota_cores(cpu_max, cfs_quota, cfs_period)
  return max(1, min(affinity, quota) if quota else affinity)


def _quota_cores(cpu_max: str | None, cfs_quota: str | None,
                 cfs_period: str | None) -> int | None:
  """Whole cores of a CPU quota (rounded up), None when there is none or it is unreadable."""
  try:
    if cpu_max is not None:
      quota, period = cpu_max.split()[:2]
    elif cfs_quota is not None and cfs_period is not None:
      quota, period = cfs_quota.strip(), cfs_period.strip()
    else:
      return None
    if quota == "max" or int(quota) <= 0 or int(period) <= 0:
      return None
    return math.ceil(int(quota) / int(period))
  except ValueError:
    return None


def _read(path: str) -> str | None:
  try:
    with open(path, encoding="ascii") as f:
      return f.read()
  except OSError:
    return None
