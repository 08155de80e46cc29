"""Processes that died: killed by a signal, or gone when they should not have been.

Every process tfps starts and watches is judged when it ends: a local
cluster's ps, workers and chief (by `tfps local`'s orchestrator), the chief's
coordinators and warm standbys (by the supervisor). A death is never passed
over: it becomes a `died` event in the event log (who, pid, the signal or
exit code, its last output lines) and is counted in the run's result, even
when the process is replaced at once.

What counts as a death depends on the process:
  * one that serves until told to stop (a ps, a worker, a standby waiting for
    its turn): any exit;
  * one that ends by itself (a chief, a coordinator): a signal, or an exit
    code tfps never gives (`errors.ExitCode`); its documented codes are
    decisions, recorded as failures by whoever acts on them.
Pure: no processes, no clocks.
"""

import dataclasses
import signal
from typing import Sequence

from tfps.base import errors
from tfps.base import fatal_output
from tfps.recovery import events

# Output lines kept with a death: enough for a stack's last frames; a crash
# report's first line (`Fatal Python error: ...`) is kept too, even when a
# dump of every thread's stack pushed it further up.
LAST_LINES = 20
_DOCUMENTED = frozenset(int(code) for code in errors.ExitCode)


def is_death(returncode: int, *, serves: bool) -> bool:
  """Whether a process that ended with `returncode` (Popen's: -N = signal N) died.

  Args:
    serves: it runs until told to stop (ps, worker, standby): any end is a death.
  """
  if serves:
    return True
  return returncode < 0 or returncode not in _DOCUMENTED


def last_words(lines: Sequence[str]) -> tuple[str, ...]:
  """What to keep of a dead process's output `lines`: its last `LAST_LINES`,
  preceded by the crash lines above them (`base.fatal_output`)."""
  tail = tuple(lines[-LAST_LINES:])
  earlier = fatal_output.fatal_lines("\n".join(lines[:-LAST_LINES]))
  return tuple(earlier[-5:]) + tail


def signal_name(returncode: int) -> str | None:
  """`SIGKILL` for a process killed by signal 9 (returncode -9); None if it exited."""
  if returncode >= 0:
    return None
  try:
    return signal.Signals(-returncode).name
  except ValueError:
    return f"signal {-returncode}"


@dataclasses.dataclass(frozen=True)
class Death:
  """One process that died.

  Attributes:
    process: who: a task (`worker:1`, `chief:0`), `coordinator` or `standby`.
    pid: its process id.
    returncode: as `subprocess.Popen` gives it (-N: killed by signal N).
    last_lines: the end of its output.
    cause: what we know of why, if anything (e.g. "held down by a fault").
  """

  process: str
  pid: int
  returncode: int
  last_lines: tuple[str, ...] = ()
  cause: str = ""

  def describe(self) -> str:
    name = signal_name(self.returncode)
    how = f"killed by {name}" if name else f"exited with code {self.returncode}"
    return f"{self.process} (pid {self.pid}) {how}" + (f": {self.cause}" if self.cause else "")

  def event(self) -> events.Event:
    return events.Event(kind="died", task=self.process, pid=self.pid,
                        signal=signal_name(self.returncode),
                        exit_code=self.returncode if self.returncode >= 0 else None,
                        last_lines=last_words(self.last_lines), detail=self.describe())
