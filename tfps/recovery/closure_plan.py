"""How a coordinator's closures are made: when it writes them out, how many steps each holds.

Two decisions from the run's history (pure, like the rest of `recovery`).

Write-out: when a new coordinator writes its closures out.

A coordinator can train with the fast-start closure, which is ready in a
few seconds but runs a few percent slower, or stop training for the seconds
it takes to trace the written-out closure and have the workers instantiate
it, and then run at full speed (`coordinator.closures`). That is the
ski-rental problem: renting (the fast start) costs a share of every second,
buying (writing out) a fixed price. What decides is how long the purchase
lasts.

With stored traces (`fast_restart.trace_cache`) a write-out outlasts the
coordinator that paid for it: the coordinators after it rebuild the closure
from the stored trace, and each worker reads back the graph it optimized
(`ps_worker.graph_cache`). Then the run's training left is what must repay
the price, and that is known from the run's target and speed: a coordinator
writes out at once if the training left (`--train_steps` less the last step,
at the latest loops' speed) lasts the break-even time (the price over the
fast start's loss per second); a run's first coordinator, which knows no
speed yet, trains looped for its first loops and decides then
(`closures.WarmClosures.after_loop`).

Without stored traces a write-out dies with its coordinator, and how long
that lives is not known: a ps or chief fault ends it. The plan rents until
the rent paid equals the price, then buys (the classic rule: never more
than about twice the best choice in hindsight), except where the run's
recent coordinators say the future:

* recent ones lived at least the break-even time, and the training left
  takes that long too: this one will live that long; write out at once;
* otherwise (recent ones died sooner, this is the run's first coordinator,
  or this one runs without a worker or ps that the supervisor will restart
  it to take back): train with the fast start, and write out once this one
  has lived the break-even time after all. A coordinator that dies before
  then never paid the price.

A coordinator the supervisor will soon replace to take a task back rents in
either case: its cluster lasts only until then.

A restart that takes a task back (a `back` task change in the event log)
ends no life: it follows a fault's failover by the supervisor's choice, so
the coordinator it starts continues its predecessor's life. Counting the
short-lived failover coordinators as lives would make every run that
fails over look short-lived.

Closure size: how many steps a closure holds. A closure is the unit TensorFlow
runs again when a worker dies in it: it starts over elsewhere, and the loop
waits for it. So a closure should not run much longer than
`--max_closure_seconds`: where a step takes longer than that allows,
closures hold fewer steps than `--steps_per_closure` (down to one), at the
speed the last loop ran (or, for a coordinator's first loop, the run's
recent loops, from the progress log). Fast steps keep full-size closures:
the bound costs them nothing.

Pure functions of the progress records (`recovery.progress_log`) and the
event log (`recovery.events`); the costs are measured ones (docs/recovery.md "Fast start").
"""

import dataclasses
import statistics
from typing import Iterable, NamedTuple, Sequence

from tfps.recovery import events as events_lib
from tfps.recovery import progress_log
from tfps.recovery import task_watch


@dataclasses.dataclass(frozen=True)
class SwitchCosts:
  """What writing out costs and what the fast-start closure loses.

  `write_out_seconds`: training stopped while the written-out closure is
  traced and instantiated; `looped_speed`: the fast-start closure's speed
  over the written-out one's (0 < looped_speed < 1).
  """

  write_out_seconds: float = 9.0
  # The ctr's fast-start closure against its written-out one, side by side:
  # 0.91-0.92 (docs/recovery.md "Fast start"; 0.89-0.94 in a stress soak).
  looped_speed: float = 0.91

  def __post_init__(self):
    if self.write_out_seconds < 0:
      raise ValueError(f"write_out_seconds ({self.write_out_seconds}) must be >= 0")
    if not 0 < self.looped_speed < 1:
      raise ValueError(f"looped_speed ({self.looped_speed}) must be between 0 and 1")

  @property
  def break_even_seconds(self) -> float:
    """Looped training that loses as much as writing out costs."""
    return self.write_out_seconds / (1 - self.looped_speed)


# A write-out traced here: the loop that wrote out took 9.3-19.0 s (median
# 15.9, ~0.7 s of it training) at the first write-out of ten faulty runs on
# the ctr (docs/recovery.md "Fast start").
MEASURED = SwitchCosts(write_out_seconds=15.0)
# A write-out traced here on a cluster of 2 ps whose workers then build its failover
# graph ahead (`fast_restart.failover_graphs`): that build is the write-out's price too,
# the loop in which both workers optimize it (7.6 s and 8.7 s lost in two fresh runs of
# the ctr, 2026-12-07; docs/recovery.md "Goodput").
MEASURED_WITH_FAILOVER_GRAPH = SwitchCosts(write_out_seconds=MEASURED.write_out_seconds + 8.0)
# A write-out whose closures an earlier coordinator traced (`trace_cache`):
# only the workers' instantiation is left (first loop ~7.1 s against ~2.2 s
# for the stored fast start; docs/recovery.md "Stored traces"), less where
# the workers read their optimized graphs back.
STORED = SwitchCosts(write_out_seconds=4.9)
# A stored write-out the workers have not optimized for this cluster: a
# failover coordinator's, whose workers did not build it ahead
# (`fast_restart.failover_graphs`). Each worker optimizes it afresh: 6.0-6.2 s
# in the first loop of such a coordinator (docs/recovery.md "Faults in a
# run's first minute").
COLD = SwitchCosts(write_out_seconds=7.0)
# The recent coordinators whose lives predict the next one's.
RECENT = 5
# The latest loops whose median speed says how long the training left takes.
RECENT_LOOPS = 20
# How long a coordinator whose write-out outlasts it trains looped when it
# cannot tell the training left yet (no loop of the run, or no target): its
# own first loops measure the speed, and it decides after them
# (`closures.WarmClosures.after_loop`).
MEASURING_SECONDS = 1.0


def coordinator_lifetimes(records: Sequence[progress_log.Progress],
                          continued: Iterable[float] = ()) -> list[float]:
  """Seconds each coordinator of the run trained: from its restore to its last loop.

  A coordinator starts with a `restored` record; one that ended before its
  first loop lived 0 s. Loops before any restore record are ignored.
  `continued`: times of restarts that end no life. A coordinator restored
  after one (and after its predecessor's last record) adds the seconds it
  trains to its predecessor's life instead of starting its own.
  """
  continued = list(continued)
  lifetimes: list[float] = []
  start = last = None
  for record in records:
    if record.restored:
      if start is not None:
        lifetimes[-1] += max(0.0, last - start)
      if not (start is not None and _restarted_between(continued, last, record.time)):
        lifetimes.append(0.0)
      start = last = record.time
    elif start is not None:
      last = record.time
  if start is not None:
    lifetimes[-1] += max(0.0, last - start)
  return lifetimes


def _restarted_between(times: Sequence[float], after: float, until: float) -> bool:
  return any(after < t <= until for t in times)


def planned_restarts(events: Iterable[events_lib.Event]) -> list[float]:
  """Times of the run's restarts that end no coordinator's life: those taking a task back."""
  return [e.time for e in events if e.task_change == task_watch.Change.BACK.value]


def looped_seconds(earlier_lifetimes: Sequence[float], costs: SwitchCosts = MEASURED, *,
                   replaced_soon: bool = False, lived: float = 0.0,
                   remaining: float | None = None) -> float:
  """Seconds a new coordinator trains with the fast start before it writes out (0: at once).

  `earlier_lifetimes`: the run's earlier coordinators, oldest first.
  `replaced_soon`: this coordinator is expected to be replaced whatever the
  history says (it runs without tasks the supervisor will take back).
  `lived`: seconds of the life this coordinator continues (its predecessors'
  since the last fault), not in `earlier_lifetimes`.
  `remaining`: seconds of training left in the run (None: not known); no
  coordinator outlives it.
  """
  if not earlier_lifetimes or replaced_soon:
    return costs.break_even_seconds
  expected = statistics.median(earlier_lifetimes[-RECENT:]) - lived
  if remaining is not None:
    expected = min(expected, remaining)
  if expected >= costs.break_even_seconds:
    return 0.0
  return costs.break_even_seconds


def kept_looped_seconds(remaining: float | None, costs: SwitchCosts = MEASURED) -> float:
  """Seconds a new coordinator trains looped when its write-out outlasts it (0: at once).

  `remaining`: seconds of training left in the run (None: not known yet).
  """
  if remaining is None:
    return MEASURING_SECONDS
  return 0.0 if remaining >= costs.break_even_seconds else costs.break_even_seconds


def write_out_pays(seconds_left: float | None, costs: SwitchCosts = MEASURED) -> bool:
  """Whether a write-out now can repay itself: the training left (None: not known)
  lasts at least the break-even time."""
  return seconds_left is None or seconds_left >= costs.break_even_seconds


def _recent_loops(records: Sequence[progress_log.Progress]) -> list[progress_log.Loop]:
  """The run's latest `RECENT_LOOPS` timed loops, less those in which the workers also
  built graphs ahead (their time says nothing of the steps)."""
  return [loop for _, of_one in progress_log.loops_by_coordinator(records)
          for loop in of_one if not loop.warming][-RECENT_LOOPS:]


def remaining_seconds(records: Sequence[progress_log.Progress],
                      train_steps: int | None) -> float | None:
  """Seconds of training left to `train_steps` from the run's last record, at the
  median speed of its latest `RECENT_LOOPS` loops; None without a target or a loop."""
  if not train_steps or not records:
    return None
  loops = _recent_loops(records)
  if not loops:
    return None
  speed = statistics.median(loop.steps_per_sec for loop in loops)
  return max(0, train_steps - records[-1].step) / speed


def plan(records: Sequence[progress_log.Progress], events: Iterable[events_lib.Event],
         costs: SwitchCosts = MEASURED, *, replaced_soon: bool = False,
         train_steps: int | None = None, kept: bool = False) -> float:
  """`looped_seconds` for a coordinator starting now, from the run's logs so far.

  `records` and `events` are the run's progress records and events before
  this coordinator's restore; `train_steps`, the step the run trains to
  (None: not known); `kept`: the write-out outlasts this coordinator (see
  the module docstring; `plans` says when).
  """
  remaining = remaining_seconds(records, train_steps)
  if kept and not replaced_soon:
    return kept_looped_seconds(remaining, costs)
  restarts = planned_restarts(events)
  lifetimes = coordinator_lifetimes(records, restarts)
  lived = 0.0
  if lifetimes and _restarted_between(restarts, records[-1].time, float("inf")):
    lived = lifetimes.pop()  # This coordinator continues the last life.
  return looped_seconds(lifetimes, costs, replaced_soon=replaced_soon, lived=lived,
                        remaining=remaining)


class Plans(NamedTuple):
  """Seconds a coordinator starting now trains looped, by what its write-out costs."""
  traced: float  # Traced here.
  stored: float  # Stored by an earlier coordinator, its graph on the workers.
  cold: float  # Stored, but a graph the workers optimize afresh (`COLD`).


def plans(records: Sequence[progress_log.Progress], events: Sequence[events_lib.Event], *,
          trace_cache: bool, replaced_soon: bool = False,
          train_steps: int | None = None, failover_graph: bool = False) -> Plans:
  """`plan` for a coordinator starting now, for each cost of its write-out.

  With `trace_cache` a stored write-out outlasts the coordinator. So does
  one traced by the run's first coordinator, which stores it. A later
  coordinator that has to trace found nothing stored that fits (its
  predecessor died before storing it, or the trace cannot be stored): it
  plans by lives. `failover_graph`: the workers build a traced write-out's
  failover graph ahead (`MEASURED_WITH_FAILOVER_GRAPH`).
  """
  first = not any(record.restored for record in records)
  stored = [plan(records, events, costs, replaced_soon=replaced_soon,
                 train_steps=train_steps, kept=trace_cache) for costs in (STORED, COLD)]
  # A cold write-out's first loop would wait for every worker's optimization;
  # a looped one trains at once. The write-out costs the same a loop later.
  traced = MEASURED_WITH_FAILOVER_GRAPH if failover_graph else MEASURED
  return Plans(traced=plan(records, events, traced, replaced_soon=replaced_soon,
                           train_steps=train_steps, kept=trace_cache and first),
               stored=stored[0], cold=max(stored[1], MEASURING_SECONDS))


# -- how many steps a closure holds ---------------------------------------------------------

# Steps a shortened closure may hold: a few sizes, so that a measure that
# differs a little from one coordinator to the next gives the same closure
# (and finds its stored trace).
SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 25, 32, 40)
# A full-size closure is kept up to this many times `max_seconds`: a measure
# taken on a busy host must not cut the closures of fast steps.
SLACK = 2.0


def closure_steps(step_seconds: float | None, max_seconds: float, most: int,
                  overhead_seconds: float = 0.0) -> int:
  """Steps per closure: `most`, unless a closure of `most` steps would run more than
  `SLACK` x `max_seconds` at `step_seconds` a step and `overhead_seconds` a closure
  (dispatch, starting its iterator); then as many as run in `max_seconds`, one of
  `SIZES`, at least 1.

  `step_seconds` None (not measured yet) or `max_seconds` 0 (no bound): `most`.
  """
  if step_seconds is None or step_seconds <= 0 or max_seconds <= 0:
    return most
  if overhead_seconds + most * step_seconds <= SLACK * max_seconds:
    return most
  fits = int((max_seconds - overhead_seconds) / step_seconds)
  return min(most, max([1] + [size for size in SIZES if size <= fits]))


# A restart estimates a step's time from whole loops (saves and dispatch
# included), a little over what the last coordinator measured per closure: on
# a size's edge the two choose differently, and a size whose trace is not
# stored costs seconds of the chief's Python to trace again. So a stored size
# is kept up to this many times the bound on a closure's length.
STORED_SLACK = 1.5


def keep_stored_size(chosen: int, stored: Iterable[int], step_seconds: float | None,
                     max_seconds: float, most: int, overhead_seconds: float = 0.0) -> int:
  """The full size a new coordinator takes: the largest size above `chosen` (and at
  most `most`) whose trace is `stored`, if its closures run within `STORED_SLACK` x
  `SLACK` x `max_seconds`; else `chosen`."""
  if step_seconds is None or step_seconds <= 0 or max_seconds <= 0:
    return chosen
  bound = STORED_SLACK * SLACK * max_seconds
  fitting = [size for size in stored if chosen < size <= most
             and overhead_seconds + size * step_seconds <= bound]
  return max(fitting, default=chosen)


def worker_step_seconds(loop_seconds: float, steps: int, closures: int, num_workers: int,
                        overhead_seconds: float = 0.0) -> float | None:
  """A worker's seconds per step in a loop that ran `steps` in `closures` closures.

  The workers ran the closures side by side: as many at once as there were
  closures, up to `num_workers`; each closure also cost `overhead_seconds`.
  None when the loop says nothing (no step, no time).
  """
  if steps <= 0 or loop_seconds <= 0 or closures <= 0:
    return None
  busy = loop_seconds * min(closures, max(1, num_workers)) - closures * overhead_seconds
  return max(busy, loop_seconds * min(closures, max(1, num_workers)) * 0.1) / steps


def calibrated(one_step_seconds: float, steps: int, seconds: float) -> tuple[float, float]:
  """(seconds per step, a closure's own seconds) from two waves of closures timed on
  idle workers: one step each in `one_step_seconds`, `steps` each in `seconds`."""
  if steps <= 1 or seconds <= one_step_seconds:
    return max(seconds, one_step_seconds) / max(1, steps), 0.0
  step = (seconds - one_step_seconds) / (steps - 1)
  return step, max(0.0, one_step_seconds - step)


def recent_step_seconds(records: Sequence[progress_log.Progress], num_workers: int
                        ) -> float | None:
  """A worker's seconds per step from the run's latest loops (median of `RECENT_LOOPS`),
  for a coordinator that has run no loop yet; None before any loop."""
  loops = _recent_loops(records)
  if not loops:
    return None
  return max(1, num_workers) / statistics.median(loop.steps_per_sec for loop in loops)
