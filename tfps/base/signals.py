"""Stop signals (SIGTERM, SIGINT) as a flag that any loop can wait on.

Handlers only record the signal; the code that owns the process decides what
stopping means (a server exits 143, the chief saves first) and does it in
ordinary control flow, never inside the handler.

The handler takes no lock: Python runs a handler between any two bytecodes of
the main thread, and runs a second signal's handler inside the first's. A
`threading.Event.set` there (what this did) takes the event's lock, and a
second signal landing while the first handler held it (two SIGTERMs a moment
apart: `timeout(1)` forwarding one to its child while a `pkill` sends
another) blocked on it forever: `tfps local` hung and never stopped. So the
handler sets an attribute and writes a byte to a pipe that waiters poll.
"""

import os
import select
import signal
import time

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_WAKE_SECONDS = 0.5


class StopSignals:
  """Records the first SIGTERM/SIGINT; `wait` blocks until one arrives."""

  def __init__(self):
    self.signum: int | None = None
    # Readable once a stop signal came: never read, so every waiter sees it.
    self._readable, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

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
      try:
        os.write(self._write, b"\0")
      except OSError:  # Full or closed: the attribute says it all the same.
        pass

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def wait(self, timeout: float | None = None) -> bool:
    """Whether a stop signal came, within `timeout` seconds (None: waits for one)."""
    # Python runs signal handlers on the main thread, between bytecodes. A
    # signal the kernel hands to one of TF's threads does not interrupt a
    # main thread blocked in a poll, so the handler (and the stop) would
    # wait as long as that: wake up now and then to let it run.
    readable = select.poll()  # Not select(): a TF process may hold fds past 1024.
    readable.register(self._readable, select.POLLIN)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      left = _WAKE_SECONDS if deadline is None else min(_WAKE_SECONDS,
                                                        deadline - time.monotonic())
      if left <= 0 or self.signum is not None:
        return self.signum is not None
      readable.poll(left * 1000)
