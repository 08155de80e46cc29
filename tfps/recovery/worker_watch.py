"""When to give up on a worker, and when to take it back (pure).

TF re-admits a worker that returns at the same address by itself. One that
never returns is worse than lost: TF's failure handler waits up to an hour
for it, and while it waits no other returning worker is re-admitted. So the
supervisor probes the workers and feeds what it sees here:

  * a worker in the coordinator's cluster that has been unreachable for
    `timeout` seconds is GONE: restart the coordinator without it;
  * an excluded worker that has answered for `readmit_after` seconds in a
    row is BACK: restart the coordinator with it again.

The last worker is never excluded (without workers nothing can train; that
is a cluster loss, handled elsewhere). Nor is any worker judged while none
of the `anchors` (the ps tasks) answers either: then it is the chief that is
cut off (a partition of the chief, or every ps lost), not the workers, and
the coordinator's ps deadline (`coordinator.ps_deadline`) handles it; the
counting starts afresh once the chief sees a ps again. No clock or I/O here:
the caller passes `now` and the set of reachable tasks.
"""

import dataclasses
import enum
from typing import Iterable

from tfps.cluster import spec as spec_lib


class Change(str, enum.Enum):
  GONE = "gone"
  BACK = "back"


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerWatchConfig:
  """Attributes:
    timeout: seconds unreachable before a worker is excluded.
    readmit_after: seconds reachable before an excluded worker is taken back.
  """

  timeout: float = 60.0
  readmit_after: float = 5.0

  def __post_init__(self):
    if self.timeout <= 0:
      raise ValueError(f"timeout ({self.timeout}) must be positive")
    if self.readmit_after < 0:
      raise ValueError(f"readmit_after ({self.readmit_after}) must be >= 0")


class WorkerWatch:
  def __init__(self, workers: Iterable[spec_lib.TaskId], config: WorkerWatchConfig,
               anchors: Iterable[spec_lib.TaskId] = ()):
    self._config = config
    self._workers = tuple(sorted(workers))
    self._anchors = frozenset(anchors)
    # Since when each worker has been in its current state (up or down).
    self._since: dict[spec_lib.TaskId, tuple[bool, float]] = {}

  @property
  def timeout(self) -> float:
    return self._config.timeout

  def update(self, reachable: set[spec_lib.TaskId], excluded: set[spec_lib.TaskId],
             now: float) -> list[tuple[Change, spec_lib.TaskId]]:
    """Changes to make now, given who answered and who is excluded."""
    if self._anchors and not self._anchors & reachable:
      self._since.clear()  # We see no ps either: no verdict on any worker.
      return []
    for worker in self._workers:
      up = worker in reachable
      if self._since.get(worker, (None, 0.0))[0] != up:
        self._since[worker] = (up, now)
    changes = []
    included = [w for w in self._workers if w not in excluded]
    for worker in self._workers:
      up, since = self._since[worker]
      held_for = now - since
      if worker in excluded and up and held_for >= self._config.readmit_after:
        changes.append((Change.BACK, worker))
      elif (worker not in excluded and not up and held_for >= self._config.timeout
            and len(included) > 1):
        changes.append((Change.GONE, worker))
        included.remove(worker)
    return changes
