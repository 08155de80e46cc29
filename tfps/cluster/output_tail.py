"""A child's output passed on as it comes, its last lines kept for when it dies.

A process that dies says why in its last lines (a Python traceback, a
`Fatal Python error`, a check failure). `OutputTail` reads a child's output
pipe on a named thread, writes every line on to where the output would have
gone (the parent's stderr, a log file), and keeps the last few, so whoever
records the death (`recovery.deaths`) can say what the process said last.
"""

import collections
import os
import threading
from typing import BinaryIO, Sequence

_KEEP = 200  # Enough to hold a crash report's first line above its thread dumps.


class OutputTail:
  """Copies `source` (a child's pipe, binary) to the file descriptors `sinks`.

  Lines are written on as soon as they are read. The thread ends when every
  writer of the pipe has closed it (the child, and anything it started, exited).
  """

  def __init__(self, source: BinaryIO, sinks: Sequence[int], *, name: str, keep: int = _KEEP,
               close_sinks: Sequence[int] = ()):
    """`close_sinks`: those of `sinks` this tail owns, closed when the output ends."""
    self._source = source
    self._sinks = tuple(sinks)
    self._close_sinks = tuple(close_sinks)
    self._lines: collections.deque[str] = collections.deque(maxlen=keep)
    self._lock = threading.Lock()
    self._thread = threading.Thread(target=self._pump, name=f"tfps-output-{name}", daemon=True)
    self._thread.start()

  def _pump(self) -> None:
    try:
      for line in iter(self._source.readline, b""):
        for fd in self._sinks:
          try:
            os.write(fd, line)
          except OSError:
            pass  # A sink gone (a closed log) must not stop the others.
        with self._lock:
          self._lines.append(line.decode("utf-8", "replace").rstrip("\n"))
    except (OSError, ValueError):
      pass  # The pipe was closed under us: the child is gone.
    finally:
      self._source.close()
      for fd in self._close_sinks:
        os.close(fd)

  def last_lines(self, wait: float = 1.0) -> tuple[str, ...]:
    """The last lines read; waits up to `wait` s for the output to end first."""
    self._thread.join(wait)
    with self._lock:
      return tuple(self._lines)
