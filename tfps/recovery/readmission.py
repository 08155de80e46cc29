"""When to take a left-out ps back: once running without it has cost a restart (pure).

After a ps failover (`recovery.policy`) the coordinator trains on the ps that
answered, every variable on them. Taking the lost ps back, once it answers
again, costs a coordinator restart: a save, a new coordinator's start and
its first loop, seconds in which nothing trains. Running without it costs
whatever speed the cluster lost with it: much on a cluster whose ps are its
bottleneck, nothing measurable where the workers are. Which is cheaper is
another ski-rental problem (as `recovery.closure_plan`'s): rent (train
without the ps) until the rent paid equals the price (a restart), then buy.

The rent is measured, not assumed: the speed of the coordinator without the
ps against the run's speed with every ps, loop by loop from the progress
records (`recovery.progress_log`), like with like (looped closures against
looped ones). Its median ratio is robust to the odd slow loop (a worker
fault, a checkpoint) that is not the missing ps's doing, and a slowdown
within the host's own drift is not counted. A run that never trained with
every ps has nothing to compare with: the ps is taken back. Any restart
takes every answering ps back anyway (`recovery.supervisor`).
"""

import dataclasses
import enum
import statistics
from typing import Sequence

from tfps.recovery import closure_plan
from tfps.recovery import progress_log


class Readmit(str, enum.Enum):
  """How the supervisor decides to take back a ps that answers again."""

  MEASURED = "measured"  # Once running without it has cost a restart (`due`).
  TIMED = "timed"  # Once it has answered for `--ps_readmit_after` seconds.


@dataclasses.dataclass(frozen=True)
class ReadmitCosts:
  """`restart_seconds`: training a restart that takes a ps back costs (a
  save, a start from the warm standby and its first looped loop: 4-6 s on
  2 cores, docs/recovery.md "Taking the ps back"). `speed_noise`: a slowdown
  this small is not counted: a host's speed drifts that much between
  stretches of one run (measured here: 4 % between the minutes before a
  ps failover and those after its ps was taken back), and it cannot be told
  from the missing ps's doing. `min_loops`: loops of the coordinator
  without the ps before its speed is judged at all. `window`: the latest
  loops compared on either side (of each kind, looped or written out, on
  every ps): the speeds of now rather than of hours ago, and a judgement
  (every probe, while a ps is out) that reads no more loops than that,
  unless one kind is rare and must be looked for further back."""

  restart_seconds: float = 6.0
  speed_noise: float = 0.05
  min_loops: int = 3
  window: int = 1000

  def __post_init__(self):
    if self.restart_seconds < 0:
      raise ValueError(f"restart_seconds ({self.restart_seconds}) must be >= 0")
    if not 0 <= self.speed_noise < 1:
      raise ValueError(f"speed_noise ({self.speed_noise}) must be in [0, 1)")
    if self.min_loops < 1:
      raise ValueError(f"min_loops ({self.min_loops}) must be >= 1")
    if self.window < self.min_loops:
      raise ValueError(f"window ({self.window}) must be >= min_loops ({self.min_loops})")


MEASURED = ReadmitCosts()


def _is_ps(task: str) -> bool:
  return task.startswith("ps:")


def _without_ps(restore: progress_log.Progress | None) -> bool:
  return restore is not None and any(_is_ps(name) for name in restore.left_out)


def _loops_on_every_ps(coordinators, count: int,
                       looped: bool | None = None) -> list[progress_log.Loop]:
  """The latest `count` loops of the run's earlier coordinators that ran with every ps
  (only looped ones, or only written-out ones, when `looped` says which)."""
  latest: list[progress_log.Loop] = []  # Newest first.
  for restore, loops in reversed(coordinators[:-1]):
    if restore is None or _without_ps(restore):
      continue
    for loop in reversed(loops):
      if looped is None or loop.looped == looped:
        latest.append(loop)
        if len(latest) >= count:
          return latest[::-1]
  return latest[::-1]


def seconds_lost(records: Sequence[progress_log.Progress],
                 costs: ReadmitCosts = MEASURED) -> float | None:
  """Training seconds the running coordinator has lost to running without a ps
  (beyond `costs.speed_noise`).

  None: nothing to judge by (it runs with every ps, has trained fewer than
  `costs.min_loops` loops, or the run never trained with every ps).
  """
  return _seconds_lost(progress_log.loops_by_coordinator(records), costs)


def _seconds_lost(coordinators, costs: ReadmitCosts) -> float | None:
  if not coordinators or not _without_ps(coordinators[-1][0]):
    return None
  current = coordinators[-1][1]
  if len(current) < costs.min_loops:
    return None
  # Each kind against its own latest loops with every ps, however far back:
  # the measured looped speed stands in only for a kind never run with every ps.
  full_rates = {kind: [loop.steps_per_sec
                       for loop in _loops_on_every_ps(coordinators, costs.window, kind)]
                for kind in (True, False)}
  if not (full_rates[True] or full_rates[False]):
    return None  # The run never trained with every ps.
  looped_speed = closure_plan.MEASURED.looped_speed

  def full_rate(looped: bool) -> float:
    if full_rates[looped]:
      return statistics.median(full_rates[looped])
    other = statistics.median(full_rates[not looped])
    return other * looped_speed if looped else other / looped_speed

  ratio = statistics.median(loop.steps_per_sec / full_rate(loop.looped)
                            for loop in current[-costs.window:])
  return max(0.0, 1.0 - ratio - costs.speed_noise) * sum(loop.seconds for loop in current)


def expected_back(left_out: Sequence[str], readmit: Readmit) -> tuple[str, ...]:
  """The left-out tasks the supervisor will restart the coordinator to take back soon.

  A worker: 5 s after it answers again. A ps: `--ps_readmit_after` after it
  answers with `Readmit.TIMED`; with `Readmit.MEASURED` only once running
  without it has cost a restart, which where the ps are not the bottleneck is
  never: a coordinator without it plans to live like any other
  (`recovery.closure_plan`).
  """
  readmit = Readmit(readmit)
  return tuple(name for name in left_out if not _is_ps(name) or readmit == Readmit.TIMED)


def due(records: Sequence[progress_log.Progress], costs: ReadmitCosts = MEASURED) -> bool:
  """Whether to take the left-out ps back now that it answers (the run's records so far).

  Not before the coordinator without it has started and trained
  `costs.min_loops` loops, unless the run never trained with every ps (then
  there is nothing to compare with, and it is taken back at once).
  """
  return judge(progress_log.loops_by_coordinator(records), costs)


def judge(coordinators: Sequence[tuple[progress_log.Progress | None, list[progress_log.Loop]]],
          costs: ReadmitCosts = MEASURED) -> bool:
  """`due` from the run's loops grouped by coordinator (`progress_log.CoordinatorLoops`)."""
  if not coordinators or not _without_ps(coordinators[-1][0]):
    return False  # The coordinator without it has not started yet.
  if not _loops_on_every_ps(coordinators, 1):
    return True
  lost = _seconds_lost(coordinators, costs)
  return lost is not None and lost >= costs.restart_seconds
