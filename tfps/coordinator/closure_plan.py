"""When a new coordinator writes its closures out: a decision from the run's history.

A coordinator can train with the fast-start closure, which is ready in a
few seconds but runs a few percent slower, or stop training for the seconds
it takes to trace the written-out closure and have the workers instantiate
it, and then run at full speed (`coordinator.closures`). Which pays depends
on how long the coordinator will live: a ps or chief fault ends it. That is
the ski-rental problem: renting (the fast start) costs a share of every
second, buying (writing out) a fixed price. Not knowing the future, the
plan rents until the rent paid equals the price, then buys (the classic
rule: never more than about twice the best choice in hindsight), except
where the run's recent coordinators say the future:

* recent ones lived at least the break-even time (the price over the fast
  start's loss per second): this one will too; write out at once;
* otherwise (recent ones died sooner, this is the run's first coordinator,
  or this one runs without a worker or ps that the supervisor will restart
  it to take back): train with the fast start, and write out once this one
  has lived the break-even time after all. A coordinator that dies before
  then never paid the price.

Pure functions of the progress records (`recovery.progress_log`); the
costs are measured ones (docs/recovery.md "Fast start").
"""

import dataclasses
import statistics
from typing import Sequence

from tfps.recovery import progress_log


@dataclasses.dataclass(frozen=True)
class SwitchCosts:
  """What writing out costs and what the fast-start closure loses.

  `write_out_seconds`: training stopped while the written-out closure is
  traced and instantiated; `looped_speed`: the fast-start closure's speed
  over the written-out one's (0 < looped_speed < 1).
  """

  write_out_seconds: float = 9.0
  looped_speed: float = 0.96

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


def looped_seconds(earlier_lifetimes: Sequence[float], costs: SwitchCosts = MEASURED, *,
                   replaced_soon: bool = False) -> float:
  """Seconds a new coordinator trains with the fast start before it writes out (0: at once).

  `earlier_lifetimes`: the run's earlier coordinators, oldest first.
  `replaced_soon`: this coordinator is expected to be replaced whatever the
  history says (it runs without tasks the supervisor will take back).
  """
  if not earlier_lifetimes or replaced_soon:
    return costs.break_even_seconds
  expected = statistics.median(earlier_lifetimes[-RECENT:])
  if expected >= costs.break_even_seconds:
    return 0.0
  return costs.break_even_seconds
