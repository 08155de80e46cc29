"""Turns TensorFlow's gRPC error spam into one readable line per event.

When a peer goes away, TF's C++ runtime logs the same gRPC failure dozens of
times a second, with multi-kilobyte status payloads. `LogSummarizer` is a pure
line filter: feed it each stderr line and the time, it returns the lines a
person should see:
  * our own (absl) lines and anything it does not recognise pass unchanged;
  * TF's start-up chatter (oneDNN, CUDA, CPU instruction notes) is dropped;
  * a gRPC failure record (a header line and its many continuation lines,
    from TF's C++ or Python logging) becomes one line
    `grpc: <CODE> from <task> (<address>): <reason>`, naming the task that
    really failed (the deepest remote target); repeats of the same (code,
    task) within `quiet_seconds` are counted, not shown, and the count is
    reported with the next line for that event. A record with no status code
    we know is counted with the peer's latest event in that window; if there
    is none it is shown as `grpc: error from <task>: <start of its message>`.

This reads message text, which is fine for *display*; decisions about
failures never do (they use exception types and status codes).

`install_stderr_filter` applies the summarizer to this process's file
descriptor 2, so it also catches what TF's C++ code writes directly.
"""

import dataclasses
import faulthandler
import os
import re
import select
import threading
import time
from typing import Callable

from tfps.base import task_names

# A log record starts with one of these headers; other lines continue it.
# TF C++: "YYYY-MM-DD hh:mm:ss.ffffff: E tensorflow/...cc:123] message"
# glog/absl (C++ and Python): "E1121 12:00:00.123456 1234 file.py:123] message"
# Python logging's default: "ERROR:tensorflow:message"
_HEADER = re.compile(
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] (?P<cc>\S+):\d+\] "
    r"|[IWEF]\d{4} [\d:.]+\s+\d+ (?P<source>\S+):\d+\] "
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<logger>[\w.]+):)(?P<message>.*)$")
_GRPC_CODES = {
    "UNAVAILABLE": "UNAVAILABLE", "Unavailable": "UNAVAILABLE", "UnavailableError": "UNAVAILABLE",
    "DEADLINE_EXCEEDED": "DEADLINE_EXCEEDED", "DeadlineExceeded": "DEADLINE_EXCEEDED",
    "DeadlineExceededError": "DEADLINE_EXCEEDED", "CANCELLED": "CANCELLED",
    "Cancelled": "CANCELLED", "CancelledError": "CANCELLED", "ABORTED": "ABORTED",
    "AbortedError": "ABORTED", "grpc_status:14": "UNAVAILABLE", "grpc_status:4": "DEADLINE_EXCEEDED",
    "grpc_status:1": "CANCELLED", "grpc_status:10": "ABORTED",
}
_GRPC_CODE = re.compile(r"\b(" + "|".join(sorted(_GRPC_CODES, key=len, reverse=True)) + r")\b")
_REMOTE_TARGET = re.compile(r"remote target (/job:\w+/replica:\d+/task:\d+)")
_ADDRESS = re.compile(r"(?:ipv[46]:)?(\[[0-9a-fA-F:]+\]|\d+\.\d+\.\d+\.\d+|localhost):(\d+)")
_REASONS = (
    ("connection refused", re.compile(r"[Cc]onnection refused")),
    ("connection reset", re.compile(r"[Cc]onnection reset|Socket closed|[Bb]roken pipe")),
    ("deadline exceeded", re.compile(r"[Dd]eadline [Ee]xceeded|timed out")),
    ("cannot connect", re.compile(r"failed to connect to all addresses|No route|unreachable")),
    ("cancelled", re.compile(r"[Cc]ancelled")),
)
_STARTUP_NOISE = re.compile(
    r"oneDNN custom operations|cuda drivers|cudart_stub|rebuild TensorFlow with the appropriate"
    r"|This TensorFlow binary is optimized|Unable to register cu|computation placer already"
    r"|All log messages before absl::InitializeLog|TF-TRT Warning|cuInit"
    r"|could not retrieve CUDA device count|GPU will not be used|Started server with target"
    # Benign chatter while TF re-admits a worker; the event itself is reported.
    r"|Device filters can only be specified|releasing multi-device function handle"
    r"|deleting remote tensors handles"
    # Per-loop INFO chatter of TF's coordinator, saver and distribute code.
    r"|Reduce to /device:|then broadcast to \('|Waiting for all global closures to be finished"
    r"|Sharding callback duration|Sync on async checkpoint saving|default session config:"
    # A ps/worker dumps its session options (~20 lines) each time a coordinator
    # connects; the line before it ("Creating sync eager service context") stays.
    r"|^SessionOptions: "
    r"|Number of GPUs on workers"
    # A server that cannot bind its port: tfps says so itself, in one line
    # naming the address (ps_worker.server).
    r"|Could not start gRPC server|No address added out of total \d+ resolved"
    # Orbit's per-loop line; tfps's progress line says the same, with an ETA.
    r"|^train \| step: +\d+ \| steps/sec"
    # TF's checkpoint saver makes a new function per save of variables on
    # several devices, by design, then warns of its own retracing.
    r"|MultiDeviceSaver\.save\.<locals>\.tf_function_save at 0x[0-9a-f]+> triggered tf\.function"
    r" retracing")
# Lines that continue a TF record: absorbed into a gRPC record or dropped with
# a noise record. Anything else ends the record and is shown.
_CONTINUATION = re.compile(
    r"^(?:\s*$|Additional GRPC error information|:\w+:Error received from peer"
    r"|To enable the following instructions|It is treated as a transient"
    r"|Graph execution error:|\s*failed to connect to all addresses|\s*\{"
    r"|This could happen if the remote target has been disconnected"
    r"|This derived error is ignored and not reported to users"
    # TF's chained errors: "2 root error(s) found.", "  (0) UNAVAILABLE: ...".
    r"|\d+ root error\(s\) found|\s*\(\d+\) \w+:|\d+ derived errors ignored|\s*\[\[\{\{node"
    r"|\d+ successful operations\.|Detected at node .* defined at|<stack traces unavailable>"
    r"|\s*\[\[.*\]\]$|\s*\[Op:\w+\]"
    # Protobuf text (e.g. a session config TF dumps after its header line).
    r"|\s*[a-z_]+ \{$|\s*\}$|\s+[a-z_]+: \S.*$|[a-z_]+: (?:true|false|-?\d+|\"[^\"]*\")$)")
# gRPC's own detail lines: they make the TF record just before them a gRPC
# record even when its header line names no status code (e.g. "Unable to find
# a context_id ... Perhaps the worker was restarted", status on a later line).
_GRPC_DETAIL = re.compile(r"^(?:Additional GRPC error information|:\w+:Error received from peer)")
# A gRPC record longer than this is cut: its summary is emitted, the rest dropped.
_MAX_RECORD_LINES = 200
# How much of a gRPC record with no known status code is shown.
_UNKNOWN_MESSAGE_CHARS = 160


@dataclasses.dataclass
class _Event:
  task: str  # The task (or address) it was about: records of one task are related.
  last_shown: float
  suppressed: int = 0


class LogSummarizer:
  """Record-aware line filter; see the module docstring. Not thread-safe.

  `feed` may hold back the lines of a gRPC error record until the record
  ends (the next record starts); call `flush` when input goes quiet or ends.
  """

  def __init__(self, quiet_seconds: float = 30.0):
    self._quiet = quiet_seconds
    self._events: dict[tuple[str, str], _Event] = {}
    self._record: list[str] | None = None  # The gRPC record being collected.
    self._dropping = False  # In a noise record: drop its continuation lines.
    # A TF header line with no status code, held until the next line shows
    # whether gRPC detail lines follow it (then it opens a record).
    self._held: tuple[str, str] | None = None  # (line, message)
    # A line of plain text inside a gRPC record (TF's message goes on: "Socket
    # closed"), held until the next line shows whether the record goes on too.
    self._held_text: str | None = None

  def feed(self, line: str, now: float) -> list[str]:
    """Returns the lines to show, given one more input `line` (no newline)."""
    header = _HEADER.match(line)
    if self._held_text is not None:  # A record is open: only flush() closes one.
      text, self._held_text = self._held_text, None
      if header is not None or not _CONTINUATION.match(line):
        return self.flush(now) + [text] + self.feed(line, now)
      self._record.append(text)  # The record goes on: `line` joins it below.
    if self._held is not None:
      held_line, held_message = self._held
      self._held = None
      if header is None and _GRPC_DETAIL.match(line):
        self._record = [held_message, line]
        return []
      return [held_line] + self.feed(line, now)
    if line.startswith("tfps: "):  # Our own one-line errors always show.
      return self.flush(now) + [line]
    if header is None and _CONTINUATION.match(line):
      if self._record is not None:
        self._record.append(line)
        return [] if len(self._record) < _MAX_RECORD_LINES else self.flush(now)
      if self._dropping:
        return []
    if (header is None and self._record is not None and line.strip()
        and not line.startswith("Traceback")):
      self._held_text = line
      return []
    out = self.flush(now)
    self._dropping = False
    if header is None:
      return out + ([] if _STARTUP_NOISE.search(line) else [line])
    message = header.group("message")
    if _STARTUP_NOISE.search(message):
      self._dropping = True
      return out
    if _GRPC_CODE.search(message) or (
        _from_tensorflow(header) and any(p.search(message) for _, p in _REASONS)):
      self._record = [message]  # Its status code may come on a later line.
      return out
    if _from_tensorflow(header):
      self._held = (line, message)
      return out
    return out + [line]

  def flush(self, now: float) -> list[str]:
    """Ends the record being collected; returns its summary line, if shown."""
    if self._held_text is not None:
      text, self._held_text = self._held_text, None
      return self.flush(now) + [text]
    if self._held is not None:
      held_line, self._held = self._held[0], None
      return [held_line]
    if self._record is None:
      return []
    text = "\n".join(self._record)
    self._record = None
    return self._grpc_event(text, now)

  def _grpc_event(self, text: str, now: float) -> list[str]:
    found = _GRPC_CODE.search(text)
    task, peer = _peer(text)
    reason = next((name for name, pattern in _REASONS if pattern.search(text)), "")
    if found:
      code = _GRPC_CODES[found.group(1)]
    else:
      # No status we know: an echo of the failure just reported for the same
      # peer (counted with it), or else shown with the start of its message,
      # so that a person can tell what it was.
      recent = self._recent_event_of(task, now)
      if recent is not None:
        recent.suppressed += 1
        return []
      code = "error"
      first_line = text.split("\n", 1)[0].strip()
      reason = reason or first_line[:_UNKNOWN_MESSAGE_CHARS]
    key = (code, peer)
    event = self._events.get(key)
    if event is not None and now - event.last_shown < self._quiet:
      event.suppressed += 1
      return []
    repeats = f" ({event.suppressed} similar in the last {now - event.last_shown:.0f}s)" \
        if event is not None and event.suppressed else ""
    self._events[key] = _Event(task=task, last_shown=now)
    detail = f": {reason}" if reason else ""
    return [f"grpc: {code} from {peer}{detail}{repeats}"]

  def _recent_event_of(self, task: str, now: float) -> _Event | None:
    """The latest event shown for `task` within the quiet period, if any.

    By task, not by the peer shown: one record may give the task's address
    and the next not.
    """
    recent = [e for e in self._events.values()
              if e.task == task and now - e.last_shown < self._quiet]
    return max(recent, key=lambda e: e.last_shown, default=None)


def _from_tensorflow(header: re.Match) -> bool:
  """A record TF wrote (C++ source or the `tensorflow` logger), not one of ours."""
  source = header.group("cc") or header.group("source") or ""
  return source.endswith((".cc", ".h")) or header.group("logger") == "tensorflow"


def _peer(text: str) -> tuple[str, str]:
  """The task that failed, and how to show it (with its address when given).

  The task is the deepest remote target named (a ps before any worker), else
  the first task: TF nests errors, a worker's closure fails *because* a ps is
  gone, and the ps is usually the last "remote target" in the chain. Without
  a task, the address stands for it.
  """
  targets = _REMOTE_TARGET.findall(text)
  # A ps among them is what failed: a worker's closure fails because of it,
  # and TF does not always list the ps last.
  targets = [t for t in targets if t.startswith("/job:ps/")] or targets
  name = task_names.find_task(targets[-1] if targets else text) or ""
  address = _ADDRESS.search(text)
  where = f"{address.group(1)}:{address.group(2)}" if address else ""
  task = name or where or "a peer"
  return task, f"{name} ({where})" if name and where else task


_IDLE_FLUSH_SECONDS = 0.5


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
    # For writers that must not depend on our thread (faulthandler's dumps).
    self.real_stderr = os.fdopen(self._real_stderr, "w", closefd=False)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    if faulthandler.is_enabled():
      # A crash's report (absl enables it) must not go through our thread,
      # which dies with the process: straight to the real stderr.
      faulthandler.enable(file=self.real_stderr, all_threads=True)
    self._read_fd = read_fd
    self._thread = threading.Thread(target=self._pump, name="tfps-stderr-filter", daemon=True)
    self._thread.start()

  def _pump(self) -> None:
    # Raw reads with our own line splitting: a buffered reader would hold
    # complete lines that select() cannot see, delaying them indefinitely.
    pending = b""
    try:
      while True:
        # A gRPC record is complete when the next one starts or input pauses.
        if not select.select([self._read_fd], [], [], _IDLE_FLUSH_SECONDS)[0]:
          self._write(self._summarizer.flush(self._clock()))
          continue
        chunk = os.read(self._read_fd, 65536)
        if not chunk:
          break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
          self._write(self._summarizer.feed(line.decode("utf-8", "replace"), self._clock()))
      if pending:
        self._write(self._summarizer.feed(pending.decode("utf-8", "replace"), self._clock()))
      self._write(self._summarizer.flush(self._clock()))
    except Exception as e:  # Never die silently: say so on the real stderr.
      os.write(self._real_stderr, f"tfps: stderr filter stopped: {e!r}\n".encode())
    finally:
      os.close(self._read_fd)

  def _write(self, lines: list[str]) -> None:
    for out in lines:
      os.write(self._real_stderr, (out + "\n").encode("utf-8", errors="replace"))

  def close(self, timeout: float = 2.0) -> None:
    """Restores fd 2 and forwards whatever is still in the pipe."""
    try:
      import sys
      sys.stderr.flush()
    except (OSError, ValueError):
      pass
    os.dup2(self._real_stderr, 2)  # Closes the pipe's last write end.
    self._thread.join(timeout)


# grpc's connectivity-polling thread raises this when the channel it watches is
# closed while it is between two polls (a race inside grpc): the readiness
# probes close their channels as soon as they have an answer. Nothing is lost;
# shown, it is a thread's traceback in the chief's log that means nothing.
_GRPC_CLOSED_CHANNEL = "Cannot monitor channel state: Channel closed!"


def without_grpc_closed_channel_tracebacks(previous: Callable) -> Callable:
  """A `threading.excepthook` that drops grpc's closed-channel race, else calls `previous`."""

  def hook(args) -> None:
    if args.exc_type is ValueError and str(args.exc_value) == _GRPC_CLOSED_CHANNEL:
      return
    previous(args)

  return hook


def install_stderr_filter(quiet_seconds: float = 30.0) -> StderrFilter:
  """This process's stderr, for people: TF's gRPC spam summarized (`StderrFilter`),
  and grpc's closed-channel race no thread traceback."""
  threading.excepthook = without_grpc_closed_channel_tracebacks(threading.excepthook)
  return StderrFilter(LogSummarizer(quiet_seconds))
