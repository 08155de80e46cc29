"""Stop signals (SIGTERM, SIGINT) as a flag that any loop can wait on.

Handlers only record the signal; the code that owns the process decides what
stopping means (a server exits 143, the chief saves first) and does it in
ordinary control flow, never inside the handler.
"""

import signal
import threading
import time

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_WAKE_SECONDS = 0.5


class StopSignals:
  """Records the first SIGTERM/SIGINT; `wait` blocks until one arrives."""

  def __init__(self):
    self._event = threading.Event()
    self.signum: int | None = None

  @classmethod
  def install(cls) -> "StopSignals":
    stop = cls()
    for sig in _STOP_SIGNALS:
      signal.signal(sig, stop._handle)
    return stop

  def _handle(self, signum, frame) -> None:
    del frame
    if self.signum is None:
      self.signum = signum
    self._event.set()

  @property
  def requested(self) -> bool:
    return self._event.is_set()

  def wait(self, timeout: float | None = None) -> bool:
    """Whether a stop signal came, within `timeout` seconds (None: waits for one)."""
    # Python runs signal handlers on the main thread, between bytecodes. A
    # signal the kernel hands to one of TF's threads does not interrupt a
    # main thread blocked in a lock wait, so the handler (and the stop)
    # would wait as long as that: wake up now and then to let it run.
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      left = _WAKE_SECONDS if deadline is None else min(_WAKE_SECONDS,
                                                        deadline - time.monotonic())
      if left <= 0:
        return self._event.is_set()
      if self._event.wait(left):
        return True
