"""How long each coordinator's first loop took, read from `tfps chaos` logs.

  python scripts/first_loops.py /tmp/soak/run-*/chaos.log

A coordinator's first loop includes tracing its closure and the workers'
first run of it: the part of a ps or chief recovery that comes after the
restore. Measured from a coordinator's "restored ... at step" (or "no
checkpoint in") line to the next progress line; a start whose chief is
killed (SIGKILL or SIGTERM from the chaos schedule) before that line is not
counted. Prints the count, p50, min and max in seconds, then every value.
"""

import datetime
import statistics
import sys
from typing import Iterable

_STARTED = ("checkpoints.py", ("] restored ", "] no checkpoint in "))
_CHIEF_ENDED = ("chaos: SIGKILL chief", "chaos: SIGTERM chief")


def _time(line: str) -> datetime.datetime:
  """The time of an absl log line ("I1123 16:36:41.244651 ...")."""
  return datetime.datetime.strptime(line[1:21].strip(), "%m%d %H:%M:%S.%f")


def first_loop_seconds(lines: Iterable[str]) -> list[float]:
  """Seconds from each coordinator start to its first progress line, in order."""
  seconds, started = [], None
  for line in lines:
    if _STARTED[0] in line and any(s in line for s in _STARTED[1]):
      started = _time(line)
    elif started is not None and "progress.py" in line:
      seconds.append((_time(line) - started).total_seconds())
      started = None
    elif any(s in line for s in _CHIEF_ENDED):
      started = None
  return seconds


def main(paths: list[str]) -> int:
  seconds = []
  for path in paths:
    with open(path, encoding="utf-8", errors="replace") as f:
      seconds += first_loop_seconds(f)
  if not seconds:
    print("no coordinator start with a first loop in these logs", file=sys.stderr)
    return 1
  print(f"{len(seconds)} starts, p50 {statistics.median(seconds):.1f} s, "
        f"min {min(seconds):.1f} s, max {max(seconds):.1f} s")
  print(" ".join(f"{s:.1f}" for s in sorted(seconds)))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
