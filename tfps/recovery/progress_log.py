"""The progress log: the chief's global step over time, for watchers.

The chief appends `{"step": N, "time": T}` to `model_dir/progress.jsonl`
after every Orbit loop, and `{"step": N, "time": T, "restored": true}` when a
coordinator starts from a checkpoint at step N; `"looped": true` marks a
loop run with the slower looped closure of a fast start (see
`coordinator.trainer`), and `"warming": true` one in which the workers also
built graphs ahead of need (its time is not its steps'). With positioned input a
loop's record also lists the chunks it trained and the steps retries
re-executed, and a `restored` record the shards' lengths: enough for
`recovery.coverage` to account for every batch of the input. `tfps chaos` and `tfps bench`
read it to tell when training progresses again after a fault and how many
steps were lost, without parsing human logs or talking to the cluster.

One `write` per line in append mode: a reader never sees half a record from a
live writer, except a last line still missing its newline, which it leaves
for the next read.
"""

import dataclasses
import json
import os
import time
from typing import Iterable, Sequence

from tfps.recovery import chief_lease

FILE_NAME = "progress.jsonl"


@dataclasses.dataclass(frozen=True)
class Progress:
  step: int
  time: float  # Seconds since the epoch.
  restored: bool = False  # A coordinator (re)started from a checkpoint at `step`.
  # Positioned input (tfps.input.ledger): a loop's chunks as
  # [shard, start, count, epoch], in the order they were handed out ...
  chunks: tuple[tuple[int, int, int, int], ...] | None = None
  # ... the steps TensorFlow re-executed in the loop's retried closures ...
  reexecuted: int = 0
  # ... and, on a `restored` record, every shard's length in batches.
  shard_lengths: tuple[int, ...] | None = None
  # The loop ran the looped closure (a coordinator's fast start): slower than
  # the run's fault-free speed, so not counted in it (chaos.goodput).
  looped: bool = False
  # The workers also built graphs ahead of need in this loop (failover graphs):
  # its time says nothing of a step's (closure_plan, chaos.goodput).
  warming: bool = False
  # On a `restored` record: the workers and ps this coordinator runs without
  # (the supervisor left them out): a fault on one of them does not touch it.
  left_out: tuple[str, ...] = ()
  # On a `restored` record: the coordinator's process, for whoever watches it.
  pid: int | None = None
  # The chief lease generation of the coordinator that wrote it (0: no lease).
  generation: int = 0
  # The closures each worker ran to success in the loop: (("worker:0", 7), ...).
  closures: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Loop:
  """One loop of a coordinator at its speed (not its first: that one carries
  its start, the trace and the instantiation)."""

  steps_per_sec: float
  seconds: float
  looped: bool
  warming: bool = False


class CoordinatorLoops:
  """Each coordinator's `restored` record and its loops after the first, in order,
  kept up to date as records are read (so a run of days is walked once).

  Loops before any `restored` record come first, under None. A loop that
  took no time or made no step is left out.
  """

  def __init__(self):
    self.coordinators: list[tuple[Progress | None, list[Loop]]] = []
    self._previous: Progress | None = None

  def extend(self, records: Iterable[Progress]) -> "CoordinatorLoops":
    for record in records:
      previous = self._previous
      if record.restored or previous is None:
        self.coordinators.append((record if record.restored else None, []))
      elif (not previous.restored and record.time > previous.time
            and record.step > previous.step):
        seconds = record.time - previous.time
        self.coordinators[-1][1].append(
            Loop((record.step - previous.step) / seconds, seconds, record.looped,
                 record.warming))
      self._previous = record
    return self


def loops_by_coordinator(records: Sequence[Progress]) -> list[tuple[Progress | None, list[Loop]]]:
  """`CoordinatorLoops.coordinators` of `records`."""
  return CoordinatorLoops().extend(records).coordinators


class ProgressLog:
  """The log of one `model_dir`.

  With two chief replicas (`recovery.chief_lease`) a writer holds a `fence`:
  an append raises `Superseded` once another replica took the lease. A
  record of an older generation than one already read is dropped: a paused
  coordinator's, written after the takeover it had not yet seen.
  """

  def __init__(self, model_dir: str, fence: chief_lease.Fence | None = None):
    self.path = os.path.join(model_dir, FILE_NAME)
    self._offset = 0
    self._fence = fence
    self._generation = 0  # The newest read.

  def append(self, step: int, *, restored: bool = False, now: float | None = None,
             chunks=None, reexecuted: int = 0, shard_lengths=None,
             looped: bool = False, warming: bool = False, left_out=(),
             pid: int | None = None, closures=()) -> None:
    generation = 0
    if self._fence is not None:
      self._fence.check(f"the progress record of step {step}")
      generation = self._fence.generation
    record = {"step": int(step), "time": time.time() if now is None else now}
    if restored:
      record["restored"] = True
    if chunks is not None:
      record["chunks"] = [list(map(int, c)) for c in chunks]
    if reexecuted:
      record["reexecuted"] = int(reexecuted)
    if shard_lengths is not None:
      record["shard_lengths"] = [int(n) for n in shard_lengths]
    if looped:
      record["looped"] = True
    if warming:
      record["warming"] = True
    if left_out:
      record["left_out"] = sorted(map(str, left_out))
    if pid is not None:
      record["pid"] = int(pid)
    if generation:
      record["generation"] = generation
    if closures:
      record["closures"] = {str(task): int(n) for task, n in closures}
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record) + "\n")

  def read_new(self) -> list[Progress]:
    """The complete records appended since the last call."""
    records = []
    try:
      with open(self.path, "rb") as f:
        f.seek(self._offset)
        for line in f:
          if not line.endswith(b"\n"):
            break  # A record still being written; read it next time.
          self._offset += len(line)
          record = _record(json.loads(line))
          if record.generation >= self._generation:
            self._generation = record.generation
            records.append(record)
    except FileNotFoundError:
      pass
    return records


def _record(fields: dict) -> Progress:
  if "closures" in fields:
    fields["closures"] = tuple(sorted(fields["closures"].items()))
  for name in ("chunks", "shard_lengths", "left_out"):
    if fields.get(name) is not None:
      fields[name] = tuple(tuple(v) if isinstance(v, list) else v for v in fields[name])
  return Progress(**fields)
