"""Goodput: the share of a run's wall time that produced training that was kept.

Definition (the one `tfps chaos` and the soak report):

    goodput = (kept steps / fault-free steps per second) / wall seconds

* kept steps: the global step at the end minus the step at the start. The
  global step counts each scheduled step once and goes back with every
  restore (`trainer.PSTrainer`, `coordinator.ledger`), so steps trained and
  then lost to a restore, and steps re-run by retried closures, are not in it;
* fault-free steps per second: the median rate of the run's own train loops
  at full speed (step difference over time between consecutive loop records
  of one coordinator). Not counted: a coordinator's first loop (its start),
  and loops of a fast start (`"looped"` records): the looped closure runs
  while the written-out one is traced and instantiated beside it, well below
  full speed (docs/recovery.md, "Goodput"). That slow stretch after every
  start is part of what a ps or chief fault costs.
  Faults and restarts are a few loops of many; the median is the run's speed
  when nothing is wrong. (A run with no loop at full speed falls back to all
  of its loops.)
* wall seconds: from the first record of the run (the first coordinator's
  start) to the last loop record.

So goodput is the time the run would have needed for what it kept at full
speed, over the time it took: less for every second spent recovering or
running slower after a restart, and every step trained again. Starting, as
in the industry's goodput figures, counts against it too: a run without
faults pays its first coordinator's start once (a few percent of a run of
minutes, nothing of one of days). Pure: records in.
"""

import dataclasses
import statistics
from typing import Sequence

from tfps.recovery import progress_log as progress_lib


@dataclasses.dataclass(frozen=True)
class Goodput:
  kept_steps: int
  wall_seconds: float
  fault_free_steps_per_sec: float

  @property
  def value(self) -> float | None:
    if self.wall_seconds <= 0 or self.fault_free_steps_per_sec <= 0:
      return None
    return min(1.0, self.kept_steps / self.fault_free_steps_per_sec / self.wall_seconds)

  def as_dict(self) -> dict:
    value = self.value
    return {"goodput": None if value is None else round(value, 4),
            "kept_steps": self.kept_steps, "wall_seconds": round(self.wall_seconds, 2),
            "fault_free_steps_per_sec": round(self.fault_free_steps_per_sec, 2)}


def measure(records: Sequence[progress_lib.Progress]) -> Goodput:
  """Goodput of a whole run from its progress log (see the module docstring)."""
  loops = [r for r in records if not r.restored]
  if not records or not loops:
    return Goodput(kept_steps=0, wall_seconds=0.0, fault_free_steps_per_sec=0.0)
  timed = [loop for _, of_one in progress_lib.loops_by_coordinator(records) for loop in of_one]
  steady = [loop.steps_per_sec for loop in timed if not loop.looped]
  rates = steady or [loop.steps_per_sec for loop in timed]
  return Goodput(kept_steps=loops[-1].step - records[0].step,
                 wall_seconds=loops[-1].time - records[0].time,
                 fault_free_steps_per_sec=statistics.median(rates) if rates else 0.0)
