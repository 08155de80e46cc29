"""Goodput: the share of a run's wall time that produced training that was kept.

Definition (the one `tfps chaos` and the soak report):

    goodput = (kept steps / fault-free steps per second) / wall seconds

* kept steps: the global step at the end minus the step at the start. The
  global step counts each scheduled step once and goes back with every
  restore (`trainer.PSTrainer`, `coordinator.ledger`), so steps trained and
  then lost to a restore, and steps re-run by retried closures, are not in it;
* fault-free steps per second: the median rate of the run's own train loops
  (step difference over time between consecutive loop records of one
  coordinator). Faults, restarts and a new coordinator's first loop are a
  few loops of many; the median is the run's speed when nothing is wrong;
* wall seconds: from the first record of the run (the first coordinator's
  start) to the last loop record.

So goodput is the time a fault-free run would have needed for what was kept,
over the time this run took: 1.0 for a run without faults, less for every
second spent recovering and every step trained again. Pure: records in.
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
  rates = []
  previous = None
  for record in records:
    if record.restored:
      previous = record  # A new coordinator: its first loop counts from its start.
      continue
    if previous is not None and record.time > previous.time and record.step > previous.step:
      rates.append((record.step - previous.step) / (record.time - previous.time))
    previous = record
  return Goodput(kept_steps=loops[-1].step - records[0].step,
                 wall_seconds=loops[-1].time - records[0].time,
                 fault_free_steps_per_sec=statistics.median(rates) if rates else 0.0)
