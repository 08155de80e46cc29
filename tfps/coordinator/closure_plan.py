"""When a new coordinator writes its closures out: a decision from the run's history.

A coordinator can train with the looped closure, which it traces in a
fraction of a second but which runs slower, or stop training for the
seconds it takes to trace the written-out closure and have the workers
instantiate it, and then run at full speed (`coordinator.closures`). Which
pays depends on how long the coordinator will live: a ps or chief fault
ends it. That is the ski-rental problem: renting (looped) costs a share of
every second, buying (writing out) a fixed price. Not knowing the future,
the plan predicts a coordinator lives as long as the run's recent ones did:

* no earlier coordinator in this run, or recent ones lived at least the
  break-even time (the price over the looped closure's loss per second):
  write out at once;
* recent ones died sooner: train looped, and write out once this one has
  lived the break-even time after all. A coordinator that dies before then
  never paid the price; one that lives on pays at most twice the best
  choice in hindsight (the classic bound).

Pure functions of the progress records (`recovery.progress_log`); the
costs are measured ones (docs/recovery.md "Fast start").
"""

import dataclasses
import statistics
from typing import Sequence

from tfps.recovery import progress_log


@dataclasses.dataclass(frozen=True)
class SwitchCosts:
  """What writing out costs and what the looped closure loses.

  `write_out_seconds`: training stopped while the written-out closure is
  traced and instantiated; `looped_speed`: the looped closure's speed over
  the written-out one's (0 < looped_speed < 1).
  """

  write_out_seconds: float = 8.0
  looped_speed: float = 0.75

  def __post_init__(self):
    if self.write_out_seconds < 0:
      raise ValueError(f"write_out_seconds ({self.write_out_seconds}) must be >= 0")
    if not 0 < self.looped_speed < 1:
      raise ValueError(f"looped_speed ({self.looped_speed}) must be between 0 and 1")

  @property
  def break_even_seconds(self) -> float:
    """Looped training that loses as much as writing out costs."""
    return self.write_out_seconds / (1 - self.looped_speed)


MEASURED = SwitchCosts()
# The recent coordinators whose lives predict the next one's.
RECENT = 5


def coordinator_lifetimes(records: Sequence[progress_log.Progress]) -> list[float]:
  """Seconds each coordinator of the run trained: from its restore to its last loop.

  A coordinator starts with a `restored` record; one that ended before its
  first loop lived 0 s. Loops before any restore record are ignored.
  """
  lifetimes: list[float] = []
  start = last = None
  for record in records:
    if record.restored:
      if start is not None:
        lifetimes.append(max(0.0, last - start))
      start = last = record.time
    elif start is not None:
      last = record.time
  if start is not None:
    lifetimes.append(max(0.0, last - start))
  return lifetimes


def looped_seconds(earlier_lifetimes: Sequence[float], costs: SwitchCosts = MEASURED) -> float:
  """Seconds a new coordinator trains looped before it writes out (0: at once).

  `earlier_lifetimes`: the run's earlier coordinators, oldest first.
  """
  if not earlier_lifetimes:
    return 0.0
  expected = statistics.median(earlier_lifetimes[-RECENT:])
  if expected >= costs.break_even_seconds:
    return 0.0
  return costs.break_even_seconds
