"""Runs a closure that a slow or paused worker holds again on another worker.

A thread beside the train loop looks at the running closures every
`POLL_SECONDS` and asks `recovery.slow_closures` about each; an overdue
closure's worker is probed, and a closure judged to be run again is taken
off its worker and queued first (`tf_internals.ClosureAttempts`): the next
free worker runs it, and the loop's `join()` no longer waits for the slow
one. With positioned input the taken run is fenced first
(`closure_fence`): the new run gets a ticket of its own (its shard argument
counts attempts), and the old one fails at its next check when its worker
wakes; its slot is freed once it has. Whatever the old run gives is dropped.
"""

import collections
import threading
import weakref
import time
from typing import Callable

from absl import logging
import tensorflow as tf

from tfps.base import tf_internals
from tfps.coordinator import closure_fence
from tfps.recovery import slow_closures

POLL_SECONDS = 0.1
PROBE_SECONDS = 0.3
_RECENT = 64  # Closures whose times make the expected time.


class Speculation:
  """Watches a coordinator's closures (see the module docstring) until `stop()`.

  `attempts`: the coordinator's closures as its worker threads run them
  (`tf_internals.track_closures`); `probe(task_index)`: whether that worker
  (`worker:task_index`) answers (within `PROBE_SECONDS`); `fence`/`num_shards`:
  positioned input's, else None. Only the closures given to `fenced` have tickets
  (an evaluator's closures, run by the same workers, have none).
  """

  def __init__(self, attempts: tf_internals.ClosureAttempts, *, num_workers: int,
               probe: Callable[[int], bool],
               fence: closure_fence.ClosureFence | None = None, num_shards: int | None = None,
               rules: slow_closures.Rules = slow_closures.Rules(),
               clock: Callable[[], float] = time.monotonic):
    self._num_workers, self._probe, self._rules, self._clock = num_workers, probe, rules, clock
    self._fence, self._num_shards = fence, num_shards
    self._durations: collections.deque[float] = collections.deque(maxlen=_RECENT)
    self.rerun = 0  # Closures taken off a worker and queued again.
    self.dropped = 0  # Taken runs that ended later (their outcome dropped).
    self._attempts = attempts
    self._fenced: weakref.WeakSet = weakref.WeakSet()  # Their `schedule` outputs.
    attempts.on_end.append(self._ended)
    attempts.on_done.append(lambda attempt, seconds: self._durations.append(seconds))
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._watch, name="tfps-slow-closures", daemon=True)
    self._thread.start()

  def fenced(self, output) -> None:
    """The closure `schedule` returned `output` for checks a ticket (its last two
    arguments: shard code and first batch, `closure_fence`)."""
    self._fenced.add(output)

  def stop(self) -> None:
    self._stop.set()
    self._thread.join(timeout=5)

  def _watch(self) -> None:
    while not self._stop.wait(POLL_SECONDS):
      try:
        self.look()
      except Exception as e:  # pylint: disable=broad-except  (never ends training)
        logging.warning("slow-closure watch: %s: %s", type(e).__name__, e)

  def look(self) -> None:
    """One look at every running closure (the thread's body; tests call it)."""
    now = self._clock()
    durations = list(self._durations)
    held = self._attempts.held_workers()
    for attempt in self._attempts.running():
      running = now - attempt.started
      if attempt.answers and slow_closures.probe_again(now - attempt.probed_at, durations,
                                                       self._rules):
        attempt.answers = None
      answers = attempt.answers
      # A worker whose thread waits on a taken run (a paused one) would run nothing.
      others = self._num_workers - 1 - len(held - {attempt.worker_index})
      verdict = slow_closures.judge(running, durations, other_workers=others,
                                    answers=answers, rules=self._rules)
      if verdict is slow_closures.Verdict.PROBE:
        answers = attempt.answers = self._probe(attempt.task_index)
        attempt.probed_at = now
        attempt.silent_probes = 0 if answers else attempt.silent_probes + 1
        verdict = slow_closures.judge(running, durations, other_workers=others,
                                      answers=answers, silent_probes=attempt.silent_probes,
                                      rules=self._rules)
      if verdict is slow_closures.Verdict.RERUN and self._rerun(attempt, running, answers):
        held.add(attempt.worker_index)  # Its thread now waits on the taken run.

  def _rerun(self, attempt: tf_internals.ClosureAttempt, running: float,
             answers: bool | None) -> bool:
    """Takes `attempt` off its worker and queues it again; False if it could not."""
    ticket = self._ticket(attempt)
    if ticket is not None:
      code, start = ticket
      if code // self._num_shards % closure_fence.ATTEMPTS == closure_fence.ATTEMPTS - 1:
        return False  # Its last ticket: it waits for its worker.
      # The next run's own ticket (the shard is the code modulo the shards).
      attempt.closure._args = (*attempt.args[:-2],  # pylint: disable=protected-access
                               tf.constant(code + self._num_shards, tf.int64),
                               tf.constant(start, tf.int64))
    if not self._attempts.take_away(attempt):
      return False  # It ended meanwhile.
    if ticket is not None:
      # Only once taken: a run that fails its check before would fail the loop.
      self._fence.revoke(*ticket)
      attempt.fenced = ticket
    self.rerun += 1
    logging.warning("worker %d has run a closure for %.1fs (recent closures %.2fs) and %s: "
                    "run again on another worker", attempt.task_index, running,
                    slow_closures.percentile_90(list(self._durations) or [0.0]),
                    "does not answer" if answers is False else "answers")
    return True

  def _ticket(self, attempt) -> tuple[int, int] | None:
    output = attempt.output if self._fence is not None else None
    if output is None or output not in self._fenced:
      return None  # Run again as it is: nothing stops its first run when it wakes.
    code, start = attempt.args[-2:]
    return int(code.numpy()), int(start.numpy())

  def _ended(self, attempt: tf_internals.ClosureAttempt) -> None:
    """A taken run's thread is done with it: its outcome was dropped."""
    self.dropped += 1
    if attempt.fenced is not None:
      self._fence.release(*attempt.fenced)
    logging.info("worker %d's first run of a closure run again elsewhere ended%s; its "
                 "outcome is dropped", attempt.task_index,
                 " (it woke and failed its fence check)" if attempt.fenced is not None else "")
