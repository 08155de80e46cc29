"""CPU time of the benchmark's own processes, per role, from /proc (Linux).

The cluster's tasks are found by their command line (`tfps run
--cluster_spec=SPEC --job_name=J --task_index=I`, as `cluster.local` starts
them); the measuring process is the chief. CPU seconds per training step,
by role, say where a step's time goes: on a machine shared with other
work this is steadier than wall time, and on a machine whose cores are all
busy, throughput is about cores / CPU per step.
"""

import os

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: str) -> float | None:
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime + stime


def _task_of(pid: str, spec_flag: str) -> str | None:
  try:
    with open(f"/proc/{pid}/cmdline", encoding="utf-8") as f:
      args = f.read().split("\0")
  except OSError:
    return None
  if spec_flag not in args:
    return None
  flags = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
  return f"{flags.get('job_name', '?')}:{flags.get('task_index', '0')}"


class CpuMeter:
  """CPU seconds used by each task of the cluster at `spec_path`, and by us."""

  def __init__(self, spec_path: str | None):
    self._pids = {"chief:0": "self"}
    if spec_path:
      flag = f"--cluster_spec={spec_path}"
      for pid in filter(str.isdigit, os.listdir("/proc")):
        task = _task_of(pid, flag)
        if task is not None and task.split(":")[0] in ("ps", "worker"):
          self._pids[task] = pid

  def read(self) -> dict[str, float]:
    return {task: s for task, pid in self._pids.items()
            if (s := _cpu_seconds(pid)) is not None}

  @staticmethod
  def per_step_ms(before: dict[str, float], after: dict[str, float],
                  steps: int) -> dict[str, float]:
    """Milliseconds of CPU per step by role (chief, ps, worker) and in total."""
    roles = {}
    for task in before.keys() & after.keys():
      role = task.split(":")[0]
      roles[role] = roles.get(role, 0.0) + after[task] - before[task]
    out = {role: round(1e3 * s / max(1, steps), 2) for role, s in sorted(roles.items())}
    out["total"] = round(sum(out.values()), 2)
    return out
