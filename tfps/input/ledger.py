"""The input ledger: which part of the training data each closure reads.

The coordinator owns the position of the input, not the workers. A finite
training dataset is split into `num_shards` shards (the dataset function's
input pipelines: shard `s` is what `dataset_fn(InputContext(num_shards, s))`
produces), each `lengths[s]` batches long. The ledger hands out chunks, a
run of consecutive batches of one shard, and each closure reads exactly its
chunk (`Chunk`) and runs one step per batch. An epoch ends when every batch
of every shard has been handed out once; the next epoch starts every shard
again at batch 0.

Why this gives every batch to training once per epoch, through faults:

* a closure that fails on a worker is run again by TensorFlow with the same
  arguments, so with the same chunk: nothing is skipped, and the only double
  application is the failed attempt's partial updates (at most one closure);
* the ledger's state is saved in the checkpoint, with the model, and the
  checkpoint is written only between loops, when every chunk handed out has
  been trained (`join()` returned). A coordinator that restores a checkpoint
  resumes the input exactly where the restored model stopped: what the lost
  coordinator handed out after the checkpoint is handed out again, nothing
  else;
* no worker keeps a position: a worker that restarts or is left out and
  taken back reads whatever chunk it is given.

Order: chunks are handed out in turn to `lanes` lanes (one per worker), and
a lane reads its shard to the end before it takes another: the next
non-empty shard `lanes` on if not started (a worker's reader reads on into
it), else the lowest one not started, else a started one no lane holds,
else, at the end of an epoch, one another lane holds. Closures on a worker
follow one another, so a worker mostly gets the chunk after the one it has
just read and resumes its open reader (`tfps.input.reader`), as
TensorFlow's per-worker iterators read on through their own shard and
files; any other chunk is positioned at `start`
(`tfps.input.seek`). A loop's last, shorter request (`tail`) that would cut
its lane's shard is served from the head of a shard not started instead,
whose rest waits for the end of the epoch: so the lanes' chunks stay
aligned with their shards' ends, and full-size. The lanes are not saved:
they are only an order, and every order hands out every batch once.

Pure Python (no TensorFlow): decisions are tested on their own, and the
state is a small JSON document (`to_json`/`from_json`).
"""

import dataclasses
import json
from typing import Sequence

from tfps.base import errors

_STATE_VERSION = 1


def lane_after(lengths: Sequence[int], shard: int, stride: int) -> int | None:
  """The next non-empty shard `stride` on from `shard`, if any: where a lane's reader reads
  on (`reader.Lane`); None for a stride below 1."""
  if stride < 1:
    return None
  return next((s for s in range(shard + stride, len(lengths), stride) if lengths[s]), None)


@dataclasses.dataclass(frozen=True)
class Chunk:
  """Batches `[start, start + count)` of shard `shard` in epoch `epoch`."""

  shard: int
  start: int
  count: int
  epoch: int

  def as_list(self) -> list[int]:
    return [self.shard, self.start, self.count, self.epoch]


class InputLedger:
  """Hands out chunks of a finite, sharded dataset, epoch after epoch.

  Attributes:
    lengths: batches in each shard (fixed for the life of a model_dir).
    epoch: the epoch being handed out (0-based).
    positions: batches of each shard handed out in this epoch.
    taken: batches handed out since the start of training; equals the global
      step whenever no closure runs (the trainer keeps them equal).
    reexecuted: steps run again by TensorFlow's retries of failed closures.
  """

  def __init__(self, lengths: Sequence[int]):
    lengths = tuple(lengths)
    if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 0
                          for n in lengths):
      raise errors.UsageError(f"input ledger: shard lengths {lengths!r} must be "
                              "non-negative integers, at least one shard")
    if sum(lengths) == 0:
      raise errors.UsageError("train_dataset: every shard is empty; there is nothing to train on")
    self.lengths = lengths
    self.epoch = 0
    self.positions = [0] * len(lengths)
    self.taken = 0
    self.reexecuted = 0
    self._lanes: list[int | None] = []  # The shard each lane reads (not saved).
    self._next_lane = 0

  @property
  def num_shards(self) -> int:
    return len(self.lengths)

  @property
  def batches_per_epoch(self) -> int:
    return sum(self.lengths)

  @property
  def epochs_completed(self) -> int:
    """Whole epochs handed out (and, between loops, trained)."""
    return self.taken // self.batches_per_epoch

  def take(self, max_count: int, lanes: int = 1, tail: bool = False) -> Chunk:
    """The next chunk: at most `max_count` batches, all from one shard, for the next of
    `lanes` lanes; `tail`: a loop's last request, shorter than its others (see the
    module docstring)."""
    if max_count < 1 or lanes < 1:
      raise ValueError(f"max_count ({max_count}) and lanes ({lanes}) must be positive")
    if all(p >= n for p, n in zip(self.positions, self.lengths)):
      self.epoch += 1
      self.positions = [0] * self.num_shards
      self._lanes = []
    if len(self._lanes) != lanes:  # Workers joined or left: lanes past the last are let go.
      self._lanes = (self._lanes + [None] * lanes)[:lanes]
      self._next_lane %= lanes
    lane, self._next_lane = self._next_lane, (self._next_lane + 1) % lanes
    shard = self._lanes[lane]
    left = 0 if shard is None else self.lengths[shard] - self.positions[shard]
    fresh = self._fresh_shard(lanes) if tail and not 0 < left <= max_count else None
    if fresh is not None:  # A tail that would cut (or start) a lane's shard: no lane's.
      shard = fresh
    elif not left:
      shard = self._lanes[lane] = self._next_shard(held=set(self._lanes) - {shard},
                                                   after=shard, lanes=lanes)
    start = self.positions[shard]
    count = min(max_count, self.lengths[shard] - start)
    self.positions[shard] = start + count
    self.taken += count
    return Chunk(shard=shard, start=start, count=count, epoch=self.epoch)

  def _fresh_shard(self, lanes: int) -> int | None:
    """The lowest shard not started that no lane holds, if any; one that no lane reads
    on into next first."""
    ahead = {lane_after(self.lengths, s, lanes) for s in self._lanes if s is not None}
    fresh = [s for s in range(self.num_shards)
             if self.positions[s] == 0 < self.lengths[s] and s not in self._lanes]
    return min(fresh, key=lambda s: (s in ahead, s), default=None)

  def _next_shard(self, held: set[int | None], after: int | None, lanes: int) -> int:
    """The shard a lane reads next: the one its reader reads on into (the next non-empty
    shard `lanes` on from the one it finished) if not started; else one no other lane
    holds, the lowest not started first, then started ones; at the end of an epoch, one
    another lane holds."""
    if after is not None:
      on = lane_after(self.lengths, after, lanes)
      if on is not None and self.positions[on] == 0 and on not in held:
        return on
    left = [s for s in range(self.num_shards) if self.positions[s] < self.lengths[s]]
    return min(left, key=lambda s: (s in held, self.positions[s] > 0, s))

  def to_json(self) -> str:
    return json.dumps({"version": _STATE_VERSION, "lengths": list(self.lengths),
                       "epoch": self.epoch, "positions": self.positions,
                       "taken": self.taken, "reexecuted": self.reexecuted})

  def load_json(self, text: str) -> None:
    """Replaces this ledger's state with a saved one (see `from_json`)."""
    self.__dict__.update(InputLedger.from_json(text).__dict__)

  @classmethod
  def from_json(cls, text: str) -> "InputLedger":
    try:
      state = json.loads(text)
      if state.get("version") != _STATE_VERSION:
        raise ValueError(f"version {state.get('version')!r}, expected {_STATE_VERSION}")
      ledger = cls(state["lengths"])
      positions = [int(p) for p in state["positions"]]
      if len(positions) != ledger.num_shards or any(
          not 0 <= p <= n for p, n in zip(positions, ledger.lengths)):
        raise ValueError(f"positions {positions} do not fit lengths {list(ledger.lengths)}")
      ledger.epoch, ledger.positions = int(state["epoch"]), positions
      ledger.taken, ledger.reexecuted = int(state["taken"]), int(state["reexecuted"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise errors.BadCheckpointError(f"input ledger state is unreadable ({e})") from None
    return ledger
