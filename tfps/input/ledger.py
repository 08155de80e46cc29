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

Order: the next chunk comes from the shard with the fewest batches handed out
in this epoch (lowest index first), so shards advance together and a chunk
usually starts a shard (`start` 0), which is free to position; a chunk that
starts inside a shard is positioned at `start` (`tfps.input.seek`).

Pure Python (no TensorFlow): decisions are tested on their own, and the
state is a small JSON document (`to_json`/`from_json`).
"""

import dataclasses
import json
from typing import Sequence

from tfps.base import errors

_STATE_VERSION = 1


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

  def take(self, max_count: int) -> Chunk:
    """The next chunk: at most `max_count` batches, all from one shard."""
    if max_count < 1:
      raise ValueError(f"max_count ({max_count}) must be positive")
    if all(p >= n for p, n in zip(self.positions, self.lengths)):
      self.epoch += 1
      self.positions = [0] * self.num_shards
    shard = min((s for s in range(self.num_shards) if self.positions[s] < self.lengths[s]),
                key=lambda s: (self.positions[s], s))
    start = self.positions[shard]
    count = min(max_count, self.lengths[shard] - start)
    self.positions[shard] = start + count
    self.taken += count
    return Chunk(shard=shard, start=start, count=count, epoch=self.epoch)

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
