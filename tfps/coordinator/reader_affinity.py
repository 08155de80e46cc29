"""Each positioned closure run by the worker whose reader stands at its chunk.

The decisions are `input.affinity`'s; this module hears the coordinator's
worker threads (`tf_internals.ClosureAttempts`): when one takes a train
closure, the closure may swap its chunk with a queued one that starts where
that worker's reader stands; when a closure succeeds, the chief's copy of
that reader's position moves on.
"""

import dataclasses
import threading
import weakref
from typing import Any, Callable, Hashable, Sequence

from absl import logging

from tfps.base import tf_internals
from tfps.input import affinity


@dataclasses.dataclass(frozen=True)
class _Chunk:
  at: affinity.At
  count: int
  kind: Hashable  # Closures of one kind may swap chunks: one function, one count.


class ReaderAffinity:
  """Hears `attempts` for the positioned train closures given to `ours` (see the module
  docstring). `full_size()`: the steps of a full-size closure (its count is not an
  argument); `lanes()`: the lanes a closure's reader is built with (the workers)."""

  def __init__(self, attempts: tf_internals.ClosureAttempts, *, lengths: Sequence[int],
               full_size: Callable[[], int | None], lanes: Callable[[], int]):
    self._attempts, self._full_size, self._lanes = attempts, full_size, lanes
    self._num_shards = len(lengths)
    self._positions = affinity.ReaderPositions(lengths)
    self._ours: weakref.WeakSet = weakref.WeakSet()  # Their `schedule` outputs.
    self._known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Closure: chunk.
    self._resumes: dict[int, bool] = {}  # Per worker: its running closure resumes its reader.
    self._lock = threading.Lock()
    self.closures = 0  # Train closures that succeeded,
    self.resumed = 0  # of them read on from their worker's reader,
    self.swapped = 0  # and taken by a worker in place of another (their chunks swapped).
    attempts.on_start.append(self._started)
    attempts.on_done.append(self._done)

  def ours(self, output: Any) -> None:
    """`output` (a `schedule` output) is a positioned train closure's."""
    self._ours.add(output)

  def _chunk(self, closure) -> _Chunk | None:
    output = tf_internals.closure_output(closure)
    if output is None or output not in self._ours:
      return None
    args = tf_internals.closure_arguments(closure)  # (train, [count,] code, start).
    # Read once per arguments (a swap gives a closure new ones): a worker's thread looks
    # at every queued closure while it holds the queue.
    known = self._known.get(closure)
    if known is not None and known[0] == tuple(map(id, args)):
      return known[1]
    count = int(args[1]) if len(args) == 4 else self._full_size()
    if count is None:
      return None
    at = affinity.At(int(args[-2]) % self._num_shards, int(args[-1]))
    chunk = _Chunk(at, count, (id(tf_internals.closure_function(closure)), count))
    self._known[closure] = (tuple(map(id, args)), chunk)
    return chunk

  def _started(self, worker: int, closure, first: bool) -> None:
    with self._lock:
      chunk = self._chunk(closure)
      if chunk is None:
        return
      at = self._positions.stands_at(worker)
      if first and chunk.at != at:
        others = self._positions.others(worker)

        def choose(queued):
          chunks = [self._chunk(q) if q is not None else None for q in queued]
          return affinity.pick(at, chunk.at, [c.at if c is not None and c.kind == chunk.kind
                                             else None for c in chunks], others)

        if self._attempts.swap_arguments(closure, choose):
          self.swapped += 1
          chunk = self._chunk(closure)
      self._resumes[worker] = self._positions.started(worker, chunk.at, chunk.count,
                                                      self._lanes())

  def _done(self, attempt: tf_internals.ClosureAttempt, seconds: float) -> None:
    del seconds
    with self._lock:
      if self._chunk(attempt.closure) is None:
        return
      self._positions.succeeded(attempt.worker_index)
      self.closures += 1
      self.resumed += self._resumes.pop(attempt.worker_index, False)

  def say(self) -> None:
    """One line: how this coordinator's train closures have read their input so far."""
    with self._lock:
      closures, resumed, swapped = self.closures, self.resumed, self.swapped
    if closures:
      logging.info("input: %d of %d train closures read on from their worker's open reader "
                   "(%.0f %%, %d of them by taking a queued closure's chunk); the others "
                   "built theirs", resumed, closures, 100 * resumed / closures, swapped)
