"""Fault schedules for `tfps chaos` (pure).

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
  chief:0@standby:kill+never  SIGKILL the active chief once the standby chief
                         has its coordinator prepared ahead (`--chief_standby`)
  chief:active@step500:kill+3  SIGKILL whichever chief replica holds the lease
                         then (`--chief_standby`; random schedules aim so)
  worker:2@step900:join  start worker 2, room the cluster had but did not fill
                         (`--max_workers`): a worker joins the running job
  worker:1@step990:leave SIGTERM worker 1 for good: a worker leaves the job

Times count from the start of training. `random_schedule` draws a seeded
schedule, spread over the run's steps (or over seconds); whatever the draw,
it hits at least one worker, one ps and the chief, so the default run
exercises every row that matters. Faults placed by step always land while
training runs, on a fast host as on a slow one.
"""

import dataclasses
import enum
import random
import signal

from tfps.cluster import spec as spec_lib
from tfps.base import errors

NEVER = None


class FaultAction(str, enum.Enum):
  KILL = "kill"  # SIGKILL
  TERM = "term"  # SIGTERM: a preemption with notice
  STOP = "stop"  # SIGSTOP, then SIGCONT after the delay
  CUT = "cut"  # Network link down, up again after the delay (a partition)
  JOIN = "join"  # A worker the cluster had room for starts (elastic workers)
  LEAVE = "leave"  # SIGTERM, never back: a worker taken away for good

  @property
  def signal(self) -> int | None:
    """The signal sent, or None for a network fault or a join."""
    return {FaultAction.KILL: signal.SIGKILL, FaultAction.TERM: signal.SIGTERM,
            FaultAction.STOP: signal.SIGSTOP, FaultAction.LEAVE: signal.SIGTERM}.get(self)

  @property
  def name_of_fault(self) -> str:
    if self == FaultAction.JOIN:
      return "JOIN"
    return signal.Signals(self.signal).name if self.signal else "LINK_DOWN"

  @property
  def resizes(self) -> bool:
    """A change of the set of workers, not a fault to come back from."""
    return self in (FaultAction.JOIN, FaultAction.LEAVE)


@dataclasses.dataclass(frozen=True, order=True)
class Fault:
  """One injected fault. `back_after` is None when the target never returns.

  Injected at `at_step` (once training reached that step) if given, once the
  standby chief is prepared if `at_standby`, else at `at_seconds` since
  training started.
  """

  at_seconds: float
  target: spec_lib.TaskId
  action: FaultAction
  back_after: float | None = 5.0
  at_step: int | None = None
  at_standby: bool = False
  # Aimed at the chief replica holding the lease when it is injected (`target`
  # is then chief:0 until `aimed_at` names the holder).
  active_chief: bool = False

  def due(self, seconds: float, step: int, standby_prepared: bool = False) -> bool:
    """Time to inject, `seconds` into training at global step `step` (and the standby
    chief's coordinator prepared ahead, or not)?"""
    if self.at_standby:
      return standby_prepared
    return step >= self.at_step if self.at_step is not None else seconds >= self.at_seconds

  def __post_init__(self):
    if self.at_seconds < 0:
      raise errors.UsageError(f"fault {self}: time ({self.at_seconds}) must be >= 0")
    if self.back_after is NEVER and self.action in (FaultAction.STOP, FaultAction.CUT):
      raise errors.UsageError(
          f"fault {self}: a stopped or cut-off task must come back (+SECONDS)")
    if self.action.resizes and (self.target.job != spec_lib.JobType.WORKER
                                or self.back_after is not NEVER):
      raise errors.UsageError(f"fault {self}: only a worker joins or leaves, and for good")
    if self.back_after is NEVER and self.target.job == spec_lib.JobType.PS:
      raise errors.UsageError(
          f"fault {self}: a ps must come back (the job needs its ps)")
    if self.back_after is not NEVER and self.back_after < 0:
      raise errors.UsageError(f"fault {self}: delay ({self.back_after}) must be >= 0")
    if self.active_chief and (self.target.job != spec_lib.JobType.CHIEF
                              or self.back_after is NEVER):
      raise errors.UsageError(f"fault {self}: the active chief is hit, then comes back "
                              "(+SECONDS)")

  def aimed_at(self, holder: spec_lib.TaskId) -> "Fault":
    """This fault on `holder`, the chief replica holding the lease as it is injected."""
    return dataclasses.replace(self, target=holder, active_chief=False)

  def __str__(self) -> str:
    after = "never" if self.back_after is NEVER else f"{self.back_after:g}"
    when = ("standby" if self.at_standby else
            f"step{self.at_step}" if self.at_step is not None else f"{self.at_seconds:g}")
    target = "chief:active" if self.active_chief else self.target
    if self.action.resizes:
      return f"{target}@{when}:{self.action.value}"
    return f"{target}@{when}:{self.action.value}+{after}"


def parse_faults(text: str, cluster: spec_lib.ClusterSpec, *,
                 workers_started: int | None = None) -> tuple[Fault, ...]:
  """Parses `--faults`; every target must exist in `cluster`.

  `workers_started`: the workers that start with the cluster (default: all);
  the others must join before any other fault hits them.
  """
  faults = []
  for item in filter(None, (part.strip() for part in text.split(","))):
    fault = _parse_one(item, cluster)
    if (fault.target.job == spec_lib.JobType.CHIEF and fault.back_after is NEVER
        and not cluster.chief_standby):
      raise errors.UsageError(
          f"fault {fault}: a chief that never comes back needs a standby (--chief_standby)")
    if (fault.at_standby or fault.active_chief) and not cluster.chief_standby:
      raise errors.UsageError(f"fault {fault}: {'@standby' if fault.at_standby else 'chief:active'}"
                              " needs a standby chief (--chief_standby)")
    faults.append(fault)
  if not faults:
    raise errors.UsageError(f"--faults: no fault in {text!r}")
  if len({f.at_step is None for f in faults if not f.at_standby}) > 1:
    raise errors.UsageError(f"--faults: {text!r} mixes seconds and steps; use one of the two")
  faults = sorted(faults, key=_order)
  _check_joins(faults, cluster.num_tasks(spec_lib.JobType.WORKER) if workers_started is None
               else workers_started)
  return tuple(faults)


def _check_joins(faults: list[Fault], workers_started: int) -> None:
  """A worker joins only into room the cluster left empty, once, before other faults hit it."""
  joined = set()
  for fault in faults:  # In the order they are injected.
    target = fault.target
    if target.job != spec_lib.JobType.WORKER:
      continue
    started = target.index < workers_started or target in joined
    if fault.action == FaultAction.JOIN:
      if started:
        raise errors.UsageError(
            f"--faults: {fault}: {target} is running by then; a worker joins into room "
            f"the cluster has beyond --num_workers ({workers_started}), once")
      joined.add(target)
    elif not started:
      raise errors.UsageError(f"--faults: {fault}: {target} has not joined by then "
                              f"(only {workers_started} workers start; add {target}@...:join)")


def _order(fault: Fault) -> tuple:
  return (fault.at_step or 0, fault.at_seconds, str(fault.target))


def _parse_one(item: str, cluster: spec_lib.ClusterSpec) -> Fault:
  usage = "TARGET@SECONDS|stepN|standby:ACTION[+SECONDS|+never], e.g. worker:1@20:kill+5"
  target_text, at, rest = item.partition("@")
  when, colon, action_text = rest.partition(":")
  action_name, plus, after = action_text.partition("+")
  if not at or not colon:
    raise errors.UsageError(f"--faults: {item!r} must look like {usage}")
  active_chief = target_text.strip() == "chief:active"
  target = spec_lib.TaskId(spec_lib.JobType.CHIEF, 0) if active_chief else (
      spec_lib.TaskId.parse(target_text))
  if target.index >= cluster.num_tasks(target.job):
    raise errors.UsageError(f"--faults: {item!r}: no task {target} in this cluster")
  try:
    action = FaultAction(action_name)
  except ValueError:
    raise errors.UsageError(f"--faults: {item!r}: action {action_name!r} is not kill, term, "
                            "stop, cut, join or leave") from None
  if action.resizes and plus:
    raise errors.UsageError(f"--faults: {item!r}: {action.value} is for good (no +SECONDS)")
  at_standby = when == "standby"
  try:
    at_step = int(when[len("step"):]) if when.startswith("step") else None
    at_seconds = 0.0 if at_step is not None or at_standby else float(when)
    back_after = NEVER if action.resizes else (
        (NEVER if after == "never" else float(after)) if plus else 5.0)
  except ValueError:
    raise errors.UsageError(f"--faults: {item!r} must look like {usage}") from None
  if at_step is not None and at_step < 0:
    raise errors.UsageError(f"--faults: {item!r}: step ({at_step}) must be >= 0")
  return Fault(at_seconds, target, action, back_after, at_step=at_step, at_standby=at_standby,
               active_chief=active_chief)


# Random faults by step fall in this part of the run: after the first loops
# (a coordinator that trains), early enough that the run's remaining steps
# see the last one recovered.
_STEP_SPAN = (0.05, 0.75)


def random_schedule(*, seed: int, count: int, duration: float,
                    cluster: spec_lib.ClusterSpec, never_returns: bool = False,
                    back_after: float = 5.0, network_faults: bool = False,
                    train_steps: int | None = None,
                    workers_started: int | None = None) -> tuple[Fault, ...]:
  """`count` faults drawn from `seed`, spread over the run's steps or `duration` seconds.

  With `train_steps`, fault i is injected once training reaches a step in
  the i-th of `count` equal slots of 5-75 % of `train_steps`: a fault waits
  for the step, and a ps or chief fault rolls training back, so each fault
  has recovered before the next, and every fault lands while training runs,
  whatever the host's speed. Without, faults are spread over `duration`
  seconds. The first three hit a worker, a ps and the chief (in a seeded
  order); the rest pick any task. With `never_returns`, one worker fault is
  permanent; with `network_faults` (virtual hosts), link cuts are drawn too.
  Only the `workers_started` first workers are hit (default: all); joins and
  leaves are never drawn. With a standby chief, a chief fault hits whichever
  replica holds the lease then (`chief:active`): the one whose loss counts.
  """
  if count < 3:
    raise errors.UsageError(f"fault count ({count}) must be >= 3 (a worker, a ps, the chief)")
  rng = random.Random(seed)
  tasks = [t for t in cluster.for_coordinator().tasks()
           if t.job != spec_lib.JobType.WORKER or workers_started is None
           or t.index < workers_started]
  jobs = [spec_lib.JobType.WORKER, spec_lib.JobType.PS, spec_lib.JobType.CHIEF]
  rng.shuffle(jobs)
  targets = [rng.choice([t for t in tasks if t.job == job]) for job in jobs]
  targets += [rng.choice(tasks) for _ in range(count - 3)]
  slot = duration / count
  low, high = (train_steps * _STEP_SPAN[0], train_steps * _STEP_SPAN[1]) if train_steps else (0, 0)
  faults = []
  for i, target in enumerate(targets):
    fraction = rng.uniform(0.1, 0.4)
    action = rng.choice([a for a in FaultAction if not a.resizes
                         and (a != FaultAction.CUT or network_faults)])
    active = cluster.chief_standby and target.job == spec_lib.JobType.CHIEF
    if train_steps:
      at_step = int(low + (high - low) / count * (i + fraction))
      faults.append(Fault(0.0, target, action, back_after, at_step=at_step,
                          active_chief=active))
    else:
      faults.append(Fault(round(slot * (i + fraction), 1), target, action, back_after,
                          active_chief=active))
  if never_returns:
    i = next(i for i, f in enumerate(faults) if f.target.job == spec_lib.JobType.WORKER)
    faults[i] = dataclasses.replace(faults[i], action=FaultAction.KILL, back_after=NEVER)
  return tuple(sorted(faults, key=_order))
