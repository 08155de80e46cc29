"""Input accounting from the progress log: was every batch trained once per epoch?

With positioned input (tfps.input.ledger) every loop record lists the
chunks the loop trained, and every coordinator start the step it restored.
The global step counts the batches handed out (the trainer keeps them
equal), so a restore at step `r` rolls back exactly the chunks handed out
past batch `r` of the history: they were trained by a coordinator whose
updates the restored checkpoint does not hold, and are handed out again.
What is left, the *kept* history, is what the final model was trained on.

This module replays the log, independently of the ledger that wrote it, and
counts in batches:

* handed_out: every chunk any coordinator trained, lost ones included;
* kept: batches in the kept history;
* retrained_after_restore: handed out, rolled back by a restore, handed out
  again (`handed_out - kept`);
* reexecuted: steps TensorFlow ran twice when it retried a failed closure
  (their partial updates stay applied: at most one closure per worker fault);
* never_trained: batches of a completed epoch missing from the kept history;
* trained_twice: batches of one epoch present twice in the kept history.

The last two are 0 when the ledger is right; `tfps chaos` fails a run where
they are not. Pure: records in, numbers out.
"""

import collections
import dataclasses
from typing import Any, Sequence

from tfps.recovery import progress_log as progress_lib


@dataclasses.dataclass(frozen=True)
class Coverage:
  """The input accounting of a run (see the module docstring); counts in batches."""

  positioned: bool
  shards: int = 0
  batches_per_epoch: int = 0
  epochs_completed: int = 0
  handed_out: int = 0
  kept: int = 0
  reexecuted: int = 0
  never_trained: int = 0
  trained_twice: int = 0
  consistent: bool = True  # Every loop record ended at the step its chunks add up to.

  @property
  def retrained_after_restore(self) -> int:
    return self.handed_out - self.kept

  @property
  def ok(self) -> bool:
    return self.consistent and self.never_trained == 0 and self.trained_twice == 0

  def as_dict(self, examples_per_batch: int | None = None) -> dict[str, Any]:
    """The JSON form; with `examples_per_batch`, examples too (a shard's last batch may be short)."""
    if not self.positioned:
      return {"positioned": False}
    d = dataclasses.asdict(self)
    d["retrained_after_restore"] = self.retrained_after_restore
    if examples_per_batch:
      for name in ("handed_out", "kept", "retrained_after_restore", "reexecuted",
                   "never_trained", "trained_twice"):
        d[f"{name}_examples"] = d[name] * examples_per_batch
    return d


def account(records: Sequence[progress_lib.Progress]) -> Coverage:
  """Replays a whole progress log (from the run's first record) into a `Coverage`."""
  lengths = next((r.shard_lengths for r in records if r.shard_lengths), None)
  if lengths is None:
    return Coverage(positioned=False)
  kept, consistent = _replay(records)
  never, twice, completed = _epochs(kept, lengths)
  return Coverage(positioned=True, shards=len(lengths), batches_per_epoch=sum(lengths),
                  epochs_completed=completed,
                  handed_out=sum(c[2] for r in records for c in r.chunks or ()),
                  kept=sum(c[2] for c in kept),
                  reexecuted=sum(r.reexecuted for r in records),
                  never_trained=never, trained_twice=twice, consistent=consistent)


def kept_chunks(records: Sequence[progress_lib.Progress]) -> list[tuple[int, int, int, int]]:
  """The chunks ([shard, start, count, epoch]) the final model was trained on, in order."""
  return _replay(records)[0]


def _replay(records: Sequence[progress_lib.Progress]) -> tuple[list, bool]:
  """(kept chunks, whether every record agreed with the chunks before it)."""
  kept: list[tuple[int, tuple[int, int, int, int]]] = []  # (first batch in the history, chunk)
  position, consistent = 0, True
  for record in records:
    if record.restored:
      kept = [(at, c) for at, c in kept if at + c[2] <= record.step]
      consistent &= (kept[-1][0] + kept[-1][1][2] if kept else 0) == record.step
      position = record.step
      continue
    for chunk in record.chunks or ():
      kept.append((position, chunk))
      position += chunk[2]
    consistent &= record.chunks is None or position == record.step
  return [c for _, c in kept], consistent


def _epochs(chunks: Sequence[tuple[int, int, int, int]],
            lengths: Sequence[int]) -> tuple[int, int, int]:
  """(never trained in a completed epoch, trained twice in an epoch, epochs completed)."""
  by_epoch = collections.defaultdict(lambda: collections.defaultdict(list))
  for shard, start, count, epoch in chunks:
    by_epoch[epoch][shard].append((start, start + count))
  if not by_epoch:
    return 0, 0, 0
  last = max(by_epoch)
  never = twice = completed = 0
  for epoch in range(last + 1):
    gaps = 0
    for shard, length in enumerate(lengths):
      covered = 0
      end = 0  # Furthest batch covered so far in this shard.
      for a, b in sorted(by_epoch[epoch][shard]):
        twice += max(0, min(b, end) - a)
        covered += max(0, b - max(a, end))
        end = max(end, b)
      gaps += length - covered
    if epoch < last:
      never += gaps
    if epoch < last or gaps == 0:
      completed += 1
  return never, twice, completed
