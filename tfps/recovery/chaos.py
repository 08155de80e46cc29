"""Fault schedules for `tfps chaos`, and the report they add up to (pure).

A fault is written `TARGET@WHEN:ACTION[+AFTER]`, several comma-separated;
WHEN is seconds since training started, or `stepN`: once training has
reached global step N (as the progress log shows), whatever the host's speed:

  worker:1@20:kill+5     SIGKILL worker 1 at t=20 s, start it again 5 s later
  ps:0@40:term+3         SIGTERM (preemption notice) ps 0, back 3 s later
  chief:0@60:kill+2      SIGKILL the chief, an orchestrator restarts it 2 s later
  worker:0@30:stop+10    SIGSTOP worker 0 for 10 s, then SIGCONT
  worker:1@50:kill+never the worker never comes back
  ps:0@70:cut+8          cut ps 0's network link for 8 s (virtual hosts only)
  ps:0@step800:kill+3    SIGKILL ps 0 once step 800 is reached

Times count from the start of training. `random_schedule` draws a seeded
schedule, spread over the run's steps (or over seconds); whatever the draw,
it hits at least one worker, one ps and the chief, so the default run
exercises every row that matters. Faults placed by step always land while
training runs, on a fast host as on a slow one.
"""

import collections
import dataclasses
import enum
import random
import signal
import statistics
from typing import Sequence

from tfps.cluster import spec as spec_lib
from tfps.base import errors
from tfps.recovery import progress_log as progress_lib

NEVER = None


class FaultAction(str, enum.Enum):
  KILL = "kill"  # SIGKILL
  TERM = "term"  # SIGTERM: a preemption with notice
  STOP = "stop"  # SIGSTOP, then SIGCONT after the delay
  CUT = "cut"  # Network link down, up again after the delay (a partition)

  @property
  def signal(self) -> int | None:
    """The signal sent, or None for a network fault."""
    return {FaultAction.KILL: signal.SIGKILL, FaultAction.TERM: signal.SIGTERM,
            FaultAction.STOP: signal.SIGSTOP}.get(self)

  @property
  def name_of_fault(self) -> str:
    return signal.Signals(self.signal).name if self.signal else "LINK_DOWN"


@dataclasses.dataclass(frozen=True, order=True)
class Fault:
  """One injected fault. `back_after` is None when the target never returns.

  Injected at `at_step` (once training reached that step) if given, else at
  `at_seconds` since training started.
  """

  at_seconds: float
  target: spec_lib.TaskId
  action: FaultAction
  back_after: float | None = 5.0
  at_step: int | None = None

  def due(self, seconds: float, step: int) -> bool:
    """Time to inject, `seconds` into training at global step `step`?"""
    return step >= self.at_step if self.at_step is not None else seconds >= self.at_seconds

  def __post_init__(self):
    if self.at_seconds < 0:
      raise errors.UsageError(f"fault {self}: time ({self.at_seconds}) must be >= 0")
    if self.back_after is NEVER and self.action in (FaultAction.STOP, FaultAction.CUT):
      raise errors.UsageError(
          f"fault {self}: a stopped or cut-off task must come back (+SECONDS)")
    if self.back_after is NEVER and self.target.job != spec_lib.JobType.WORKER:
      raise errors.UsageError(
          f"fault {self}: only a worker may never come back (the job needs its ps and chief)")
    if self.back_after is not NEVER and self.back_after < 0:
      raise errors.UsageError(f"fault {self}: delay ({self.back_after}) must be >= 0")

  def __str__(self) -> str:
    after = "never" if self.back_after is NEVER else f"{self.back_after:g}"
    when = f"step{self.at_step}" if self.at_step is not None else f"{self.at_seconds:g}"
    return f"{self.target}@{when}:{self.action.value}+{after}"


def parse_faults(text: str, cluster: spec_lib.ClusterSpec) -> tuple[Fault, ...]:
  """Parses `--faults`; every target must exist in `cluster`."""
  faults = []
  for item in filter(None, (part.strip() for part in text.split(","))):
    faults.append(_parse_one(item, cluster))
  if not faults:
    raise errors.UsageError(f"--faults: no fault in {text!r}")
  if len({f.at_step is None for f in faults}) > 1:
    raise errors.UsageError(f"--faults: {text!r} mixes seconds and steps; use one of the two")
  return tuple(sorted(faults, key=_order))


def _order(fault: Fault) -> tuple:
  return (fault.at_step or 0, fault.at_seconds, str(fault.target))


def _parse_one(item: str, cluster: spec_lib.ClusterSpec) -> Fault:
  usage = "TARGET@SECONDS|stepN:ACTION[+SECONDS|+never], e.g. worker:1@20:kill+5"
  target_text, at, rest = item.partition("@")
  when, colon, action_text = rest.partition(":")
  action_name, plus, after = action_text.partition("+")
  if not at or not colon:
    raise errors.UsageError(f"--faults: {item!r} must look like {usage}")
  target = spec_lib.TaskId.parse(target_text)
  if target.index >= cluster.num_tasks(target.job):
    raise errors.UsageError(f"--faults: {item!r}: no task {target} in this cluster")
  try:
    action = FaultAction(action_name)
  except ValueError:
    raise errors.UsageError(
        f"--faults: {item!r}: action {action_name!r} is not kill, term, stop or cut") from None
  try:
    at_step = int(when[len("step"):]) if when.startswith("step") else None
    at_seconds = 0.0 if at_step is not None else float(when)
    back_after = (NEVER if after == "never" else float(after)) if plus else 5.0
  except ValueError:
    raise errors.UsageError(f"--faults: {item!r} must look like {usage}") from None
  if at_step is not None and at_step < 0:
    raise errors.UsageError(f"--faults: {item!r}: step ({at_step}) must be >= 0")
  return Fault(at_seconds, target, action, back_after, at_step=at_step)


# Random faults by step fall in this part of the run: after the first loops
# (a coordinator that trains), early enough that the run's remaining steps
# see the last one recovered.
_STEP_SPAN = (0.05, 0.75)


def random_schedule(*, seed: int, count: int, duration: float,
                    cluster: spec_lib.ClusterSpec, never_returns: bool = False,
                    back_after: float = 5.0, network_faults: bool = False,
                    train_steps: int | None = None) -> tuple[Fault, ...]:
  """`count` faults drawn from `seed`, spread over the run's steps or `duration` seconds.

  With `train_steps`, fault i is injected once training reaches a step in
  the i-th of `count` equal slots of 5-75 % of `train_steps`: a fault waits
  for the step, and a ps or chief fault rolls training back, so each fault
  has recovered before the next, and every fault lands while training runs,
  whatever the host's speed. Without, faults are spread over `duration`
  seconds. The first three hit a worker, a ps and the chief (in a seeded
  order); the rest pick any task. With `never_returns`, one worker fault is
  permanent; with `network_faults` (virtual hosts), link cuts are drawn too.
  """
  if count < 3:
    raise errors.UsageError(f"fault count ({count}) must be >= 3 (a worker, a ps, the chief)")
  rng = random.Random(seed)
  tasks = list(cluster.for_coordinator().tasks())
  jobs = [spec_lib.JobType.WORKER, spec_lib.JobType.PS, spec_lib.JobType.CHIEF]
  rng.shuffle(jobs)
  targets = [rng.choice([t for t in tasks if t.job == job]) for job in jobs]
  targets += [rng.choice(tasks) for _ in range(count - 3)]
  slot = duration / count
  low, high = (train_steps * _STEP_SPAN[0], train_steps * _STEP_SPAN[1]) if train_steps else (0, 0)
  faults = []
  for i, target in enumerate(targets):
    fraction = rng.uniform(0.1, 0.4)
    action = rng.choice([a for a in FaultAction if a != FaultAction.CUT or network_faults])
    if train_steps:
      at_step = int(low + (high - low) / count * (i + fraction))
      faults.append(Fault(0.0, target, action, back_after, at_step=at_step))
    else:
      faults.append(Fault(round(slot * (i + fraction), 1), target, action, back_after))
  if never_returns:
    i = next(i for i, f in enumerate(faults) if f.target.job == spec_lib.JobType.WORKER)
    faults[i] = dataclasses.replace(faults[i], action=FaultAction.KILL, back_after=NEVER)
  return tuple(sorted(faults, key=_order))


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
  steps_lost: int = 0
  seconds_to_recover: float | None = None
  last_loop_end: float = 0.0  # The fault itself, then each loop's end in its window.
  longest_stall: float = 0.0
  window_open: bool = True
  loop_before: float | None = None

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
  started without (its restore record says so) takes nothing down.

  First progress can understate what a fault cost: a loop whose closures were
  already done may end just after a worker is cut, and the *next* loop then
  waits for that worker; a worker that never returns costs a restart later,
  at `--worker_timeout`. So each fault also gets its longest stall: the
  longest time without a loop ending from the fault to the next fault
  injected (or the end of the run, or a restart that takes back a task another
  fault left out). Without a fault it is the time of one loop (~0.8 s for the
  default ctr on 2 cores), so each fault also gets its stall beyond a loop:
  the longest stall less the median of the `LOOPS_BEFORE` loops that ended
  before it under the same coordinator.
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
    needs_restore = (fault.target.job != spec_lib.JobType.WORKER
                     and fault.action not in (FaultAction.STOP, FaultAction.CUT)
                     and str(fault.target) not in self._left_out)
    for f in self._faults:  # A new fault ends the earlier ones' stall windows.
      if f.window_open:
        f.longest_stall = max(f.longest_stall, wall_time - f.last_loop_end)
        f.window_open = False
    loop_before = (round(statistics.median(self._loop_seconds), 2) if self._loop_seconds
                   else None)
    self._faults.append(_InFlight(fault, wall_time, since_start, self._last_step,
                                  self._last_step, needs_restore, last_loop_end=wall_time,
                                  loop_before=loop_before))

  def observe(self, records: Sequence[progress_lib.Progress]) -> None:
    for record in records:
      # A restart that takes back a task an earlier fault left out is that
      # fault's cost: it ends the stall windows of the others, like a fault,
      # but not of one that this restart recovers (it may take a task back too).
      taken_back = set(self._left_out) - set(record.left_out) if record.restored else set()
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
          self._loop_seconds.append(record.time - self._last_loop_end)
        self._last_loop_end = record.time

  @property
  def all_recovered(self) -> bool:
    return all(f.seconds_to_recover is not None for f in self._faults)

  def outcomes(self) -> list[FaultOutcome]:
    return [FaultOutcome(f.fault, f.injected_at, f.seconds_to_recover is not None,
                         f.seconds_to_recover, f.steps_lost,
                         round(f.longest_stall, 2) if f.stall_known else None,
                         f.loop_before)
            for f in self._faults]


def fault_kind(fault: dict) -> str:
  """A reported fault's row in a soak table: `worker kill`, `ps term`, `worker never`..."""
  job = fault["target"].partition(":")[0]
  return f"{job} never" if fault.get("back_after") is NEVER else f"{job} {fault['action']}"


def soak_summary(results: Sequence[dict | None]) -> dict:
  """Adds up several `tfps chaos` JSON lines (None: a run that printed none).

  A run counts as finished only with status "ok" (every fault recovered and
  every end-of-run check passed). Recovery seconds are pooled over runs,
  overall and per kind of fault. Goodput is pooled as the runs' fault-free
  time for what they kept over their wall time together (`recovery.goodput`),
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
