"""How each fault of a `tfps chaos` run was recovered, and the report they add up to (pure).

`RecoveryTracker` follows the faults through the run's progress log; `report`
is the fault part of the run's JSON line; `soak_summary` adds up several runs
(`scripts/chaos_soak.py`).
"""

import collections
import dataclasses
import statistics
from typing import Sequence

from tfps.chaos import faults as faults_lib
from tfps.cluster import spec as spec_lib
from tfps.recovery import progress_log as progress_lib

Fault = faults_lib.Fault
FaultAction = faults_lib.FaultAction
NEVER = faults_lib.NEVER


@dataclasses.dataclass(frozen=True)
class FaultOutcome:
  """What happened to one injected fault."""

  fault: Fault
  injected_at: float  # Seconds since the start of training.
  recovered: bool
  seconds_to_recover: float | None  # From injection to training progressing again.
  steps_lost: int = 0  # Steps between the restored checkpoint and the step at the fault.
  # The longest time without a loop ending, from the fault to the next fault
  # (or the end of the run); see RecoveryTracker.
  longest_stall: float | None = None
  # The median time of the loops just before the fault: what a stall would be
  # without it (a loop ends only when all its closures have).
  loop_before: float | None = None
  # The median time of the loops after its recovery, up to the next fault:
  # against `loop_before`, what the fault changed for good (a join: more workers).
  loop_after: float | None = None
  # The closures each worker ran in those loops (a joined worker's among them).
  closures_after: dict[str, int] = dataclasses.field(default_factory=dict)

  @property
  def stall_beyond_loop(self) -> float | None:
    """What the fault added to the longest stall: it less an ordinary loop."""
    if self.longest_stall is None or self.loop_before is None:
      return None
    return round(max(0.0, self.longest_stall - self.loop_before), 2)

  def as_dict(self) -> dict:
    return {"target": str(self.fault.target), "signal": self.fault.action.name_of_fault,
            "action": self.fault.action.value,
            "back_after": self.fault.back_after, "time": round(self.injected_at, 2),
            "recovered": self.recovered, "seconds_to_recover": self.seconds_to_recover,
            "longest_stall_seconds": self.longest_stall,
            "stall_beyond_loop_seconds": self.stall_beyond_loop,
            "loop_seconds_before": self.loop_before, "loop_seconds_after": self.loop_after,
            "closures_per_worker_after": dict(sorted(self.closures_after.items())),
            "steps_lost": self.steps_lost}


def report(outcomes: Sequence[FaultOutcome]) -> dict:
  """The fault part of `tfps chaos`'s JSON line."""
  faults = [o.as_dict() for o in outcomes]
  return {
      "faults_injected": len(outcomes),
      "recoveries": sum(1 for o in outcomes if o.recovered),
      "faults": faults,
      "steps_lost": sum(o.steps_lost for o in outcomes),
      "recovery_seconds": _seconds(faults),
      "longest_stall_seconds": _seconds(faults, "longest_stall_seconds"),
      "stall_beyond_loop_seconds": _seconds(faults, "stall_beyond_loop_seconds"),
  }


@dataclasses.dataclass
class _InFlight:
  fault: Fault
  injected_wall: float  # Epoch seconds, comparable with progress records.
  injected_at: float  # Seconds since the start of training.
  baseline: int  # Training has recovered once a loop ends past this step.
  step_at_fault: int
  # A ps or the chief that goes away (killed, preempted, cut off) takes the
  # coordinator with it: recovered only after a new one restored. Loops that
  # end before it is gone (a preempted task saves first) do not count.
  needs_restore: bool = False
  # A worker that joins: done once a coordinator restored with it in its cluster.
  joining: bool = False
  steps_lost: int = 0
  seconds_to_recover: float | None = None
  last_loop_end: float = 0.0  # The fault itself, then each loop's end in its window.
  longest_stall: float = 0.0
  window_open: bool = True
  loop_before: float | None = None
  loops_after: list[float] = dataclasses.field(default_factory=list)
  closures_after: collections.Counter = dataclasses.field(default_factory=collections.Counter)

  @property
  def stall_known(self) -> bool:
    """A loop has ended since the fault, or the next fault closed its window."""
    return self.last_loop_end > self.injected_wall or not self.window_open


class RecoveryTracker:
  """Follows each injected fault through the progress log (pure; no clocks).

  A fault is recovered at the first loop that ends, after the fault, past
  the baseline step: the step at the fault, or, when a coordinator restarts
  from a checkpoint after the fault, the restored step (the difference is
  the steps lost). A fault that takes the coordinator down (a ps or the
  chief killed or preempted) is recovered only by a loop after the
  new coordinator's restore, so loops still finishing while a preempted task
  saves are not mistaken for recovery; a ps the running coordinator was
  started without (its restore record says so) takes nothing down. A
  worker that joins is in only after a restore whose cluster holds it (its
  seconds to recover count from its start: its import, the chief's wait for
  it to answer steadily, and the restart).

  First progress can understate what a fault cost: a loop whose closures were
  already done may end just after a worker is cut, and the *next* loop then
  waits for that worker; a worker that never returns costs a restart later,
  at `--worker_timeout`. So each fault also gets its longest stall: the
  longest time without a loop ending from the fault to the next fault
  injected (or the end of the run, or a restart that takes back a task another
  fault left out). Without a fault it is the time of one loop, so each
  fault also gets its stall beyond a loop:
  the longest stall less the median of the `LOOPS_BEFORE` loops that ended
  before it under the same coordinator. A fault in a coordinator's first
  loop has none: that loop also traces and starts what later loops reuse, so
  only a fault-free run's first loop tells what the fault added (side by
  side; `tests/e2e/test_user_experiments.py`).
  """

  LOOPS_BEFORE = 10

  def __init__(self):
    self._faults: list[_InFlight] = []
    self._last_step = 0
    self._left_out: tuple[str, ...] = ()  # The running coordinator's (its restore record).
    self._last_loop_end: float | None = None  # None after a restore: a start is no loop.
    self._loop_seconds: collections.deque[float] = collections.deque(maxlen=self.LOOPS_BEFORE)

  def injected(self, fault: Fault, *, wall_time: float, since_start: float) -> None:
    # A cut, like a stop, may heal without a new coordinator: one shorter than
    # the ps deadline is bridged by TCP (measured, docs/partitions.md). Its
    # loops cannot end while the link is down, so any later loop is progress.
    # A ps the running coordinator was started without (ps failover) takes
    # nothing down with it: training goes on, as for a worker.
    joining = fault.action == FaultAction.JOIN
    needs_restore = joining or (fault.target.job != spec_lib.JobType.WORKER
                                and fault.action not in (FaultAction.STOP, FaultAction.CUT)
                                and str(fault.target) not in self._left_out)
    for f in self._faults:  # A new fault ends the earlier ones' stall windows.
      if f.window_open:
        f.longest_stall = max(f.longest_stall, wall_time - f.last_loop_end)
        f.window_open = False
    loop_before = (round(statistics.median(self._loop_seconds), 2) if self._loop_seconds
                   else None)
    self._faults.append(_InFlight(fault, wall_time, since_start, self._last_step,
                                  self._last_step, needs_restore, joining,
                                  last_loop_end=wall_time, loop_before=loop_before))

  def observe(self, records: Sequence[progress_lib.Progress]) -> None:
    for record in records:
      # A restart that takes back a task an earlier fault left out is that
      # fault's cost: it ends the stall windows of the others, like a fault,
      # but not of one that this restart recovers (it may take a task back too).
      taken_back = set(self._left_out) - set(record.left_out) if record.restored else set()
      # Faults recovered before this record: its loop is an ordinary one for them.
      recovered = [f for f in self._faults if f.seconds_to_recover is not None]
      for f in self._faults:
        if record.time < f.injected_wall:
          continue
        if taken_back and str(f.fault.target) not in taken_back and not f.needs_restore:
          f.window_open = False
        if f.window_open and not record.restored:
          f.longest_stall = max(f.longest_stall, record.time - f.last_loop_end)
          f.last_loop_end = record.time
        if f.seconds_to_recover is not None:
          continue
        if record.restored and f.joining and str(f.fault.target) in record.left_out:
          continue  # A coordinator that has not taken the new worker in yet.
        if record.restored:
          f.baseline = record.step
          f.steps_lost = max(f.steps_lost, f.step_at_fault - record.step)
          f.needs_restore = False
        elif record.step > f.baseline and not f.needs_restore:
          f.seconds_to_recover = round(record.time - f.injected_wall, 2)
      # After a restore, training stands at the restored step: a later
      # fault must not count the steps an earlier one lost again.
      self._last_step = record.step
      if record.restored:
        self._left_out = record.left_out
        self._last_loop_end = None
        self._loop_seconds.clear()  # A new coordinator's loops may differ (fast start).
      else:
        if self._last_loop_end is not None:
          seconds = record.time - self._last_loop_end
          self._loop_seconds.append(seconds)
          for f in recovered:  # Ordinary loops after a recovery, before the next fault.
            if f.window_open:
              f.loops_after.append(seconds)
              f.closures_after.update(dict(record.closures))
        self._last_loop_end = record.time

  @property
  def all_recovered(self) -> bool:
    return all(f.seconds_to_recover is not None for f in self._faults)

  def outcomes(self) -> list[FaultOutcome]:
    return [FaultOutcome(f.fault, f.injected_at, f.seconds_to_recover is not None,
                         f.seconds_to_recover, f.steps_lost,
                         round(f.longest_stall, 2) if f.stall_known else None,
                         f.loop_before,
                         round(statistics.median(f.loops_after), 2) if f.loops_after else None,
                         dict(f.closures_after))
            for f in self._faults]


def closures_per_worker(records: Sequence[progress_lib.Progress]) -> dict[str, int]:
  """The closures each worker ran to success over `records` (the run's JSON line)."""
  total: collections.Counter = collections.Counter()
  for record in records:
    total.update(dict(record.closures))
  return dict(sorted(total.items()))


def fault_kind(fault: dict) -> str:
  """A reported fault's row in a soak table: `worker kill`, `ps term`, `worker never`..."""
  job = fault["target"].partition(":")[0]
  if fault.get("back_after") is NEVER and fault["action"] not in ("join", "leave"):
    return f"{job} never"
  return f"{job} {fault['action']}"


def soak_summary(results: Sequence[dict | None]) -> dict:
  """Adds up several `tfps chaos` JSON lines (None: a run that printed none).

  A run counts as finished only with status "ok" (every fault recovered and
  every end-of-run check passed). Recovery seconds are pooled over runs,
  overall and per kind of fault. Goodput is pooled as the runs' fault-free
  time for what they kept over their wall time together (`chaos.goodput`),
  so a long run weighs more than a short one.
  """
  faults = [f for r in results if r for f in r.get("faults", ())]
  kinds: dict[str, list[dict]] = {}
  for fault in faults:
    kinds.setdefault(fault_kind(fault), []).append(fault)
  return {
      "runs": len(results),
      "runs_finished": sum(1 for r in results if r and r.get("status") == "ok"),
      "faults_injected": len(faults),
      "recoveries": sum(1 for f in faults if f["recovered"]),
      "steps_lost": sum(f["steps_lost"] for f in faults),
      "recovery_seconds": _seconds(faults),
      "longest_stall_seconds": _seconds(faults, "longest_stall_seconds"),
      "stall_beyond_loop_seconds": _seconds(faults, "stall_beyond_loop_seconds"),
      "goodput": _pooled_goodput([r for r in results if r and r.get("goodput")]),
      "by_kind": {kind: {"faults": len(group),
                         "recovered": sum(1 for f in group if f["recovered"]),
                         "recovery_seconds": _seconds(group),
                         "longest_stall_seconds": _seconds(group, "longest_stall_seconds"),
                         "stall_beyond_loop_seconds":
                             _seconds(group, "stall_beyond_loop_seconds"),
                         "steps_lost_max": max(f["steps_lost"] for f in group)}
                  for kind, group in sorted(kinds.items())},
  }


def _pooled_goodput(results: Sequence[dict]) -> dict:
  """The runs' goodput together, the lowest of one run, and the rate of faults they
  ran at (their wall time over their faults: placed by step, faults come faster on
  a faster host)."""
  measured = [r for r in results if r["goodput"].get("goodput") is not None]
  wall = sum(r["goodput"]["wall_seconds"] for r in measured)
  if not wall:
    return {"goodput": None, "lowest_run": None, "seconds_per_fault": None}
  needed = sum(r["goodput"]["kept_steps"] / r["goodput"]["fault_free_steps_per_sec"]
               for r in measured)
  faults = sum(len(r.get("faults", ())) for r in measured)
  return {"goodput": round(min(1.0, needed / wall), 4),
          "lowest_run": min(r["goodput"]["goodput"] for r in measured),
          "seconds_per_fault": round(wall / faults, 1) if faults else None}


def _seconds(faults: Sequence[dict], key: str = "seconds_to_recover") -> dict:
  seconds = sorted(f[key] for f in faults if f.get(key) is not None)
  if not seconds:
    return {"p50": None, "max": None}
  return {"p50": round(statistics.median(seconds), 2), "max": round(seconds[-1], 2)}
