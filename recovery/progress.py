"""The progress log: the chief's global step over time, for watchers.

The chief appends `{"step": N, "time": T}` to `model_dir/progress.jsonl`
after every Orbit loop. `tfps chaos` and `tfps bench` read it to tell when
training is progressing again after a fault, without parsing human logs or
talking to the cluster. One `write` per line in append mode: readers never
see half a record from a live writer, only possibly a missing newline at the
very end, which they skip.
"""

import dataclasses
import json
import os
import time

FILE_NAME = "progress.jsonl"


@dataclasses.dataclass(frozen=True)
class Progress:
  step: int
  time: float  # Seconds since the epoch.


class ProgressLog:
  def __init__(self, model_dir: str):
    self.path = os.path.join(model_dir, FILE_NAME)
    self._offset = 0
    self._latest: Progress | None = None

  def append(self, step: int, now: float | None = None) -> None:
    line = json.dumps({"step": int(step), "time": time.time() if now is None else now})
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(line + "\n")

  def latest(self) -> Progress | None:
    """The newest record; reads only what was appended since the last call."""
    try:
      with open(self.path, "rb") as f:
        f.seek(self._offset)
        for line in f:
          if not line.endswith(b"\n"):
            break  # A record still being written; read it next time.
          self._offset += len(line)
          record = json.loads(line)
          self._latest = Progress(step=record["step"], time=record["time"])
    except FileNotFoundError:
      pass
    return self._latest
