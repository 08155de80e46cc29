"""Which tasks have not answered for long enough to give up on them (pure).

Silence and refusal are told apart. A task that refuses connections has no
server listening: its process is gone, and with a ps its variables are gone
too, so waiting buys nothing; `Refusals` gives it up after a few probe rounds
in a row (a blip is not a loss). A silent task may be paused or cut off and
come back whole: `Overdue` waits out the timeout for it.

Both ends of the ps deadline count silence the same way: the coordinator's
own thread (`coordinator.ps_deadline`) and, as a backstop outside the
coordinator process, the chief's supervisor (`recovery.supervisor`). The
caller probes and passes the reachable tasks and the time; a task is
overdue once it has been silent in every update for `timeout` seconds in a
row. One answer resets its count: a blip is not a loss.
"""

from typing import Iterable

from tfps.cluster import spec as spec_lib
from tfps.base import errors


class Overdue:
  """Counts each task's silence; `update` returns the tasks silent for `timeout` s."""

  def __init__(self, tasks: Iterable[spec_lib.TaskId], timeout: float, *,
               name: str = "ps_timeout"):
    if timeout <= 0:
      raise errors.UsageError(f"{name} ({timeout}) must be positive")
    self.timeout = timeout
    self._tasks = tuple(sorted(tasks))
    self._silent_since: dict[spec_lib.TaskId, float] = {}

  def update(self, reachable: set[spec_lib.TaskId], now: float) -> list[spec_lib.TaskId]:
    for task in self._tasks:
      if task in reachable:
        self._silent_since.pop(task, None)
      else:
        self._silent_since.setdefault(task, now)
    return [t for t, since in sorted(self._silent_since.items())
            if now - since >= self.timeout]

  def silent_for(self, task: spec_lib.TaskId, now: float) -> float:
    """Seconds `task` has been silent (0 if it answered last time)."""
    since = self._silent_since.get(task)
    return 0.0 if since is None else now - since


class Refusals:
  """Counts each task's refusals in a row; `update` returns those refused `rounds` times."""

  def __init__(self, tasks: Iterable[spec_lib.TaskId], rounds: int = 2):
    if rounds < 1:
      raise errors.UsageError(f"rounds ({rounds}) must be positive")
    self.rounds = rounds
    self._tasks = tuple(sorted(tasks))
    self._count: dict[spec_lib.TaskId, int] = {}

  def update(self, refused: set[spec_lib.TaskId]) -> list[spec_lib.TaskId]:
    for task in self._tasks:
      self._count[task] = self._count.get(task, 0) + 1 if task in refused else 0
    return [t for t in self._tasks if self._count[t] >= self.rounds]
