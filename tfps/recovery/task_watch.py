"""When to give up on a worker, and when to take a worker or a ps back (pure).

TF re-admits a worker that returns at the same address by itself. One that
never returns is worse than lost: TF's failure handler waits up to an hour
for it, and while it waits no other returning worker is re-admitted. So the
supervisor probes the workers and ps and feeds what it sees here:

  * a worker in the coordinator's cluster that has been unreachable for
    `timeout` seconds is GONE: restart the coordinator without it;
  * an excluded worker that has answered for `readmit_after` seconds in a
    row is BACK: restart the coordinator with it again; one that answers for
    the first time (a worker joining, `min_workers`) is BACK at once: it has
    not gone away before, so there is no flapping to wait out;
  * an excluded ps (left out by ps failover, `recovery.policy`) that has
    answered for `ps_readmit_after` seconds in a row is BACK likewise, once
    the caller says taking it back is due (`recovery.readmission`). A ps is
    never GONE here: the coordinator notices a lost ps itself.

A worker of the coordinator's cluster that has not answered for `notice_after`
seconds is said once, and again when it answers (`notices`): until it is
excluded, whatever the coordinator must register with every task waits for it
(TensorFlow's, for a new function), so a silent stall has a name in the log.

A worker is never excluded if fewer than `min_workers` would be left (at
least one: without workers nothing can train; that is a cluster loss,
handled elsewhere). Nor is any worker judged while none
of the ps answers either: then it is the chief that is cut off (a partition
of the chief, or every ps lost), not the workers, and the coordinator's ps
deadline (`coordinator.ps_deadline`) handles it; the counting starts afresh
once the chief sees a ps again. No clock or I/O here: the caller passes
`now` and the set of reachable tasks.
"""

import dataclasses
import enum
from typing import Iterable

from tfps.cluster import spec as spec_lib


class Change(str, enum.Enum):
  GONE = "gone"
  BACK = "back"


@dataclasses.dataclass(frozen=True)
class Notice:
  """A worker of the coordinator's cluster silent for `seconds` (`silent`), or answering
  again after `seconds` of silence."""

  task: spec_lib.TaskId
  silent: bool
  seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskWatchConfig:
  """Attributes:
    timeout: seconds unreachable before a worker is excluded.
    notice_after: seconds unreachable before a worker's silence is said (`notices`).
    readmit_after: seconds reachable before an excluded worker is taken back.
    ps_readmit_after: seconds reachable before an excluded ps may be taken
      back. Longer than a worker's: a ps that has just come back may go
      again, and taking it back restarts the coordinator.
    min_workers: the fewest workers the coordinator's cluster may hold.
  """

  timeout: float = 60.0
  notice_after: float = 4.0
  readmit_after: float = 5.0
  ps_readmit_after: float = 30.0
  min_workers: int = 1

  def __post_init__(self):
    if self.timeout <= 0:
      raise ValueError(f"timeout ({self.timeout}) must be positive")
    if self.notice_after < 0:
      raise ValueError(f"notice_after ({self.notice_after}) must be >= 0")
    if self.min_workers < 1:
      raise ValueError(f"min_workers ({self.min_workers}) must be >= 1")
    for name in ("readmit_after", "ps_readmit_after"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")


class TaskWatch:
  def __init__(self, workers: Iterable[spec_lib.TaskId], config: TaskWatchConfig,
               ps: Iterable[spec_lib.TaskId] = ()):
    self._config = config
    self._workers = tuple(sorted(workers))
    self._ps = tuple(sorted(ps))
    # Since when each task has been in its current state (up or down).
    self._since: dict[spec_lib.TaskId, tuple[bool, float]] = {}
    self._ever_up: set[spec_lib.TaskId] = set()
    self._first_time_up: set[spec_lib.TaskId] = set()  # Up now, and never before.
    self._noticed: dict[spec_lib.TaskId, float] = {}  # Said silent, since when.

  @property
  def timeout(self) -> float:
    return self._config.timeout

  def update(self, reachable: set[spec_lib.TaskId], excluded: set[spec_lib.TaskId],
             now: float, *, ps_back_due: bool = True) -> list[tuple[Change, spec_lib.TaskId]]:
    """Changes to make now, given who answered and who is excluded.

    `ps_back_due`: whether an excluded ps that has answered long enough is
    to be taken back now (`recovery.readmission`); workers come back anyway.
    """
    if self._ps and not set(self._ps) & reachable:
      self._since.clear()  # We see no ps either: no verdict on any task.
      return []
    for task in self._workers + self._ps:
      up = task in reachable
      if self._since.get(task, (None, 0.0))[0] != up:
        self._since[task] = (up, now)
        if up and task not in self._ever_up:
          self._first_time_up.add(task)
        elif not up:
          self._first_time_up.discard(task)
        if up:
          self._ever_up.add(task)
    changes = []
    included = [w for w in self._workers if w not in excluded]
    for task in self._workers + self._ps:
      up, since = self._since[task]
      held_for = now - since
      readmit_after = (self._config.ps_readmit_after if task.job == spec_lib.JobType.PS
                       else self._config.readmit_after)
      if task in self._first_time_up and task.job == spec_lib.JobType.WORKER:
        readmit_after = 0.0  # Joining.
      if (task in excluded and up and held_for >= readmit_after
          and (ps_back_due or task.job != spec_lib.JobType.PS)):
        changes.append((Change.BACK, task))
      elif (task in included and not up and held_for >= self._config.timeout
            and len(included) > self._config.min_workers):
        changes.append((Change.GONE, task))
        included.remove(task)
    return changes

  def notices(self, excluded: set[spec_lib.TaskId], now: float) -> list[Notice]:
    """After `update`: the workers of the coordinator's cluster (not `excluded`) that
    have answered before and not for `notice_after` seconds, and those said so that
    answer again (or were excluded meanwhile: then nothing more is said of them)."""
    notices = []
    for task in self._workers:
      state = self._since.get(task)
      if task in self._noticed:
        if task in excluded:
          del self._noticed[task]
        elif state is not None and state[0]:
          notices.append(Notice(task, silent=False, seconds=state[1] - self._noticed.pop(task)))
      elif (state is not None and not state[0] and task in self._ever_up
            and task not in excluded and now - state[1] >= self._config.notice_after):
        self._noticed[task] = state[1]
        notices.append(Notice(task, silent=True, seconds=now - state[1]))
    return notices


def silent_workers(workers: Iterable[spec_lib.TaskId], reachable: set[spec_lib.TaskId],
                   min_workers: int) -> frozenset[spec_lib.TaskId] | None:
  """The workers a coordinator starts without: those that do not answer now.

  They join when they answer (BACK above). None while fewer than
  `min_workers` answer: then there is nothing to start on yet.
  """
  workers = tuple(workers)
  silent = frozenset(w for w in workers if w not in reachable)
  return silent if len(workers) - len(silent) >= min_workers else None
