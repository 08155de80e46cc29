"""Turns TensorFlow's gRPC error spam into one readable line per event.

When a peer goes away, TF's C++ runtime logs the same gRPC failure dozens of
times a second, with multi-kilobyte status payloads. `LogSummarizer` is a pure
line filter: feed it each stderr line and the time, it returns the lines a
person should see:
  * our own (absl) lines and anything it does not recognise pass unchanged;
  * TF's start-up chatter (oneDNN, CUDA, CPU instruction notes) is dropped;
  * a gRPC failure becomes one line `grpc: <CODE> from <peer>: <reason>`, and
    repeats of the same (code, peer) within `quiet_seconds` are counted, not
    shown; the count is reported with the next line for that event.

This reads message text, which is fine for *display*; decisions about
failures never do (they use exception types and status codes).

`install_stderr_filter` applies the summarizer to this process's file
descriptor 2, so it also catches what TF's C++ code writes directly.
"""

import dataclasses
import os
import re
import threading
import time
from typing import Callable

# TF's C++ log line: "2026-01-01 12:00:00.123456: E tensorflow/...cc:123] message"
# or glog/absl style: "E0000 00:00:1700000000.123 1234 file.cc:123] message".
_CPP_LINE = re.compile(
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) \S+\] |([IWEF])\d{4} [\d:.]+\s+\d+ \S+\] )(.*)$")
_GRPC_CODE = re.compile(
    r"\b(UNAVAILABLE|DEADLINE_EXCEEDED|CANCELLED|ABORTED|UNKNOWN|INTERNAL|"
    r"FAILED_PRECONDITION|Unavailable|DeadlineExceeded|Cancelled|Aborted)\b")
_PEER = re.compile(
    r"(/job:\w+/replica:\d+/task:\d+|ipv[46]:[\[\]\w.:%]+:\d+|\blocalhost:\d+|\b\d+\.\d+\.\d+\.\d+:\d+)")
_REASONS = (
    ("connection refused", re.compile(r"[Cc]onnection refused")),
    ("connection reset", re.compile(r"[Cc]onnection reset|Socket closed|[Bb]roken pipe")),
    ("no route", re.compile(r"failed to connect to all addresses|No route|unreachable")),
    ("deadline exceeded", re.compile(r"[Dd]eadline [Ee]xceeded|timed out")),
    ("cancelled", re.compile(r"[Cc]ancelled")),
)
_STARTUP_NOISE = re.compile(
    r"oneDNN custom operations|cuda drivers|cudart_stub|rebuild TensorFlow with the appropriate"
    r"|This TensorFlow binary is optimized|Unable to register cu|computation placer already"
    r"|All log messages before absl::InitializeLog|TF-TRT Warning|cuInit"
    r"|could not retrieve CUDA device count|GPU will not be used|Started server with target")


@dataclasses.dataclass
class _Event:
  last_shown: float
  suppressed: int = 0


class LogSummarizer:
  """Pure line filter; see the module docstring. Not thread-safe."""

  def __init__(self, quiet_seconds: float = 30.0):
    self._quiet = quiet_seconds
    self._events: dict[tuple[str, str], _Event] = {}

  def feed(self, line: str, now: float) -> list[str]:
    """Returns the lines to show for one input `line` (without newline)."""
    match = _CPP_LINE.match(line)
    if match is None:
      return [line] if not _STARTUP_NOISE.search(line) else []
    message = match.group(3)
    if _STARTUP_NOISE.search(message):
      return []
    code = _GRPC_CODE.search(message)
    if code is None:
      return [line]
    return self._grpc_event(code.group(1), message, now)

  def _grpc_event(self, code: str, message: str, now: float) -> list[str]:
    code = _normalise_code(code)
    peer = _PEER.search(message)
    peer_name = peer.group(1) if peer else "a peer"
    reason = next((name for name, pattern in _REASONS if pattern.search(message)), "")
    key = (code, peer_name)
    event = self._events.get(key)
    if event is not None and now - event.last_shown < self._quiet:
      event.suppressed += 1
      return []
    repeats = f" ({event.suppressed} similar in the last {now - event.last_shown:.0f}s)" \
        if event is not None and event.suppressed else ""
    self._events[key] = _Event(last_shown=now)
    detail = f": {reason}" if reason else ""
    return [f"grpc: {code} from {peer_name}{detail}{repeats}"]


def _normalise_code(code: str) -> str:
  return {"Unavailable": "UNAVAILABLE", "DeadlineExceeded": "DEADLINE_EXCEEDED",
          "Cancelled": "CANCELLED", "Aborted": "ABORTED"}.get(code, code)


class StderrFilter:
  """Routes this process's fd 2 through a `LogSummarizer` on a named thread.

  Lines are forwarded as soon as they are read. A process killed with SIGKILL
  can lose the few lines still in the pipe; `close()` drains it on a normal
  exit and before `os._exit`.
  """

  def __init__(self, summarizer: LogSummarizer, clock: Callable[[], float] = time.monotonic):
    self._summarizer = summarizer
    self._clock = clock
    self._real_stderr = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    self._reader = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace")
    self._thread = threading.Thread(target=self._pump, name="tfps-stderr-filter", daemon=True)
    self._thread.start()

  def _pump(self) -> None:
    try:
      for line in self._reader:
        for out in self._summarizer.feed(line.rstrip("\n"), self._clock()):
          os.write(self._real_stderr, (out + "\n").encode("utf-8", errors="replace"))
    except Exception as e:  # Never die silently: say so on the real stderr.
      os.write(self._real_stderr, f"tfps: stderr filter stopped: {e!r}\n".encode())

  def close(self, timeout: float = 2.0) -> None:
    """Restores fd 2 and forwards whatever is still in the pipe."""
    try:
      import sys
      sys.stderr.flush()
    except (OSError, ValueError):
      pass
    os.dup2(self._real_stderr, 2)  # Closes the pipe's last write end.
    self._thread.join(timeout)


def install_stderr_filter(quiet_seconds: float = 30.0) -> StderrFilter:
  return StderrFilter(LogSummarizer(quiet_seconds))
