"""Which of the queued closures a worker runs next: the one its open reader stands at.

A worker's reader (`reader`) reads on only where its last chunk ended; the
ledger hands a lane's chunks out one after another (`ledger`). But
TensorFlow's worker threads take closures from one queue in turn, as each
becomes free: as soon as one worker is a little faster, it takes the other
lane's next chunk, and both workers build iterators (a shard's files opened
again, no read-ahead) where they could have read on.

So, when a worker's thread takes a closure, the coordinator looks at where
that worker's reader stands (`ReaderPositions`, the chief's copy of each
worker's table: cleared when a closure starts, moved when it succeeds, as
the worker's own) and, if another queued closure of the same function
starts there, the two swap their chunks; else, if the chunk it took is where
another worker's reader stands (or will, when its closure ends), it swaps
for one where none does (`pick`). Neither closure has run yet, so the loop
trains the same chunks, each once: only which worker reads which changes.
A closure that ran before (a retry) keeps its chunk.

Pure Python: the decisions are tested on their own (tests/input/test_affinity.py).
"""

import dataclasses
from typing import Collection, Sequence

from tfps.input import ledger as ledger_lib


@dataclasses.dataclass(frozen=True)
class At:
  """A chunk's start, or where a reader stands: batch `start` of shard `shard`."""

  shard: int
  start: int


class ReaderPositions:
  """Where each worker's reader stands, as the coordinator sees it (None: unknown).

  `lengths`: the ledger's shard lengths. A reader built for a chunk reads on
  into its lane's next non-empty shard (`stride` on, the number of lanes its
  closure was traced with), as `reader.Lane` does.
  """

  def __init__(self, lengths: Sequence[int]):
    self._lengths = tuple(lengths)
    self._at: dict[int, At] = {}
    self._stride: dict[int, int] = {}  # The lane stride each worker's reader was built with.
    self._running: dict[int, At | None] = {}  # Where each running closure leaves its reader.

  def stands_at(self, worker: int) -> At | None:
    return self._at.get(worker)

  def others(self, worker: int) -> set[At]:
    """Where the other workers' readers stand, or will when their closures succeed."""
    return {at for w, at in [*self._at.items(), *self._running.items()]
            if w != worker and at is not None}

  def started(self, worker: int, chunk: At, count: int, stride: int) -> bool:
    """A closure of `count` batches from `chunk` began on `worker`, traced for `stride`
    lanes: its reader's position is cleared until it succeeds. Whether it resumes."""
    resumed = self._at.pop(worker, None) == chunk
    if not resumed or worker not in self._stride:
      self._stride[worker] = stride
    end = chunk.start + count
    if end < self._lengths[chunk.shard]:
      self._running[worker] = At(chunk.shard, end)
    else:
      after = ledger_lib.lane_after(self._lengths, chunk.shard, self._stride[worker])
      self._running[worker] = None if after is None else At(after, 0)
    return resumed

  def succeeded(self, worker: int) -> None:
    """`worker`'s closure succeeded: its reader stands after its chunk."""
    at = self._running.pop(worker, None)
    if at is not None:
      self._at[worker] = at


def pick(at: At | None, taken: At, queued: Sequence[At | None],
         others: Collection[At] = ()) -> int | None:
  """The index in `queued` (the chunks of the queued closures that may swap with the one
  a worker took, None for the others) of the one to run instead of `taken`; None to run
  `taken` as it is. The first that starts where the worker's reader stands (`at`); else,
  if `taken` starts where another worker's reader stands (`others`), the first that
  starts where none does: that worker reads on from it, this one builds either way."""
  if taken == at:
    return None
  if at is not None:
    mine = next((i for i, chunk in enumerate(queued) if chunk == at), None)
    if mine is not None:
      return mine
  if taken not in others:
    return None
  return next((i for i, chunk in enumerate(queued)
               if chunk is not None and chunk not in others), None)
