"""Which running closures to run again on another worker (pure).

A worker that is paused (SIGSTOP, a VM live-migrating) or crawling holds its
closure, and the loop's `join()` waits for it: TensorFlow fails a closure
only when its worker's connection fails, and a paused process keeps its
connections. A closure is *overdue* once it has run far beyond what recent
closures took: twice their 90th percentile, and at least `margin` seconds
beyond it (fast closures jitter by more than their own length). An overdue
closure's worker is probed: one that does not answer is taken off the
closure at once; one that answers (busy, or building a function the first
time) is given `patience` times the expected time before it is.

Before enough closures are timed (a coordinator's first loops, where each
worker may still be building its functions) no time is expected, so only
silence counts: a closure that has run `cold_probe` seconds has its worker
probed, and again every `cold_probe` seconds while it answers; one that does
not answer `cold_silences` probes in a row loses the closure.

The caller acts: it fences the closure (its first attempt can no longer
finish its chunk when the worker wakes, `coordinator.closure_fence`) and
queues it again first, for the next free worker.
"""

import dataclasses
import enum
import math
from typing import Sequence


class Verdict(enum.Enum):
  """What to do about one running closure."""

  WAIT = "wait"  # Within its time, or no time is known yet.
  PROBE = "probe"  # Overdue: ask whether its worker answers.
  RERUN = "rerun"  # Take it off its worker and run it on another.


@dataclasses.dataclass(frozen=True)
class Rules:
  """How long a closure may run (see the module docstring)."""

  min_samples: int = 8  # Closures timed before any is judged.
  factor: float = 2.0
  margin: float = 0.75
  patience: float = 8.0  # Times the expected time, for a worker that answers.
  cold_probe: float = 2.0  # Seconds between probes while too few closures are timed.
  cold_silences: int = 2  # Probes unanswered in a row that lose a closure then.

  def __post_init__(self):
    if (self.min_samples < 1 or self.factor < 1 or self.margin < 0 or self.patience < self.factor
        or self.cold_probe <= 0 or self.cold_silences < 1):
      raise ValueError(f"slow-closure rules out of range: {self}")


def percentile_90(durations: Sequence[float]) -> float:
  """The 90th percentile of `durations` (nearest rank)."""
  ordered = sorted(durations)
  return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def overdue_after(durations: Sequence[float], rules: Rules = Rules()) -> float | None:
  """Seconds after which a closure is overdue; None while too few are timed."""
  if len(durations) < rules.min_samples:
    return None
  expected = percentile_90(durations)
  return max(rules.factor * expected, expected + rules.margin)


def judge(running_seconds: float, durations: Sequence[float], *, other_workers: int,
          answers: bool | None, silent_probes: int = 0, rules: Rules = Rules()) -> Verdict:
  """The verdict on a closure running for `running_seconds`.

  `durations`: recent closures' times; `other_workers`: workers that could run
  it instead (none: nothing to gain); `answers`: the probe's result for its
  worker (None: not probed yet, or probed again: `probe_again`); `silent_probes`:
  its worker's probes unanswered in a row.
  """
  limit = overdue_after(durations, rules)
  if other_workers < 1:
    return Verdict.WAIT
  if limit is None:  # Nothing to expect yet: only a silent worker loses its closure.
    if running_seconds < rules.cold_probe or answers:
      return Verdict.WAIT
    if answers is None or silent_probes < rules.cold_silences:
      return Verdict.PROBE
    return Verdict.RERUN
  if running_seconds < limit:
    return Verdict.WAIT
  if answers is None:
    return Verdict.PROBE
  if not answers:
    return Verdict.RERUN
  patient = max(rules.patience * percentile_90(durations), limit)
  return Verdict.RERUN if running_seconds >= patient else Verdict.WAIT


def probe_again(seconds_since_probe: float, durations: Sequence[float],
                rules: Rules = Rules()) -> bool:
  """Whether a worker that answered a probe `seconds_since_probe` ago is asked again:
  only while too few closures are timed (after that, `patience` bounds it)."""
  return len(durations) < rules.min_samples and seconds_since_probe >= rules.cold_probe
