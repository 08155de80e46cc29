"""Goodput: the share of a run's wall time that produced training that was kept.

Definition (the one `tfps chaos` and the soak report):

    goodput = (kept steps / fault-free steps per second) / wall seconds

* kept steps: the global step at the end minus the step at the start. The
  global step counts each scheduled step once and goes back with every
  restore (`trainer.PSTrainer`, `input.ledger`), so steps trained and
  then lost to a restore, and steps re-run by retried closures, are not in it;
* fault-free steps per second: the run's own throughput at full speed, the
  steps over the seconds of its full-speed loops together (time between
  consecutive loop records of one coordinator, so what happens between two
  loops, a save, counts). Not full speed, and so not counted in it:
  - a coordinator's first loop (its start);
  - loops of a fast start (`"looped"` records), the slower closure a new
    coordinator trains with until it writes out (docs/recovery.md "Fast
    start"): that slower stretch is part of what a ps or chief fault costs;
  - stalled loops, slower than `STALLED` of the median loop: a worker lost
    or paused mid-loop holds the loop until its closures run elsewhere or it
    returns. A healthy run's loops stay far above that, so the cut takes out
    the faults' loops and leaves the host's ordinary variation in.
  A run with no loop at full speed falls back to all of its loops.
  Why not the median loop rate: loop rates spread (shard ends, saves, the
  host's own swings), and slower loops take more of the time, so a run's
  throughput is below its median loop's rate, and a run without faults
  would lose time to the spread alone (measured: docs/recovery.md "Goodput").
* wall seconds: from the first record of the run (the first coordinator's
  start) to the last loop record.

So goodput is the time the run would have needed for what it kept at its
fault-free throughput, over the time it took: less for every second spent
recovering or running slower after a restart, and every step trained again.
Starting, as in the industry's goodput figures, counts against it too: a run
without faults pays its first coordinator's start once (a few percent of a
run of minutes, nothing of one of days). Pure: records in.
"""

import dataclasses
import statistics
from typing import Sequence

from tfps.recovery import progress_log as progress_lib

# A loop slower than this share of the median loop was held up by a fault.
STALLED = 0.5


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


def throughput(loops: Sequence[progress_lib.Loop]) -> float:
  """Steps per second over `loops` together, leaving out stalled ones (`STALLED`)."""
  if not loops:
    return 0.0
  floor = STALLED * statistics.median(loop.steps_per_sec for loop in loops)
  kept = [loop for loop in loops if loop.steps_per_sec >= floor]
  return (sum(loop.steps_per_sec * loop.seconds for loop in kept)
          / sum(loop.seconds for loop in kept))


def measure(records: Sequence[progress_lib.Progress]) -> Goodput:
  """Goodput of a whole run from its progress log (see the module docstring)."""
  loops = [r for r in records if not r.restored]
  if not records or not loops:
    return Goodput(kept_steps=0, wall_seconds=0.0, fault_free_steps_per_sec=0.0)
  timed = [loop for _, of_one in progress_lib.loops_by_coordinator(records) for loop in of_one]
  steady = [loop for loop in timed if not loop.looped and not loop.warming]
  return Goodput(kept_steps=loops[-1].step - records[0].step,
                 wall_seconds=loops[-1].time - records[0].time,
                 fault_free_steps_per_sec=throughput(steady or timed))
