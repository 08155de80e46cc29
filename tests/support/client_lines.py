"""A client subprocess's stdout, one JSON object per line, read with deadlines.

The cluster tests that run a TensorFlow client inside a LocalCluster's network
(the test process may not reach it) talk to it over its stdin and stdout: the
client says `{"event": ...}` lines, the test answers on stdin.
"""

import json
import queue
import threading


class Lines:
  """Reads `stream` on a thread; `expect` waits, bounded, for one event."""

  def __init__(self, stream):
    self._queue = queue.Queue()
    self.seen = []
    threading.Thread(target=self._read, args=(stream,), name="client-stdout",
                     daemon=True).start()

  def _read(self, stream):
    for line in stream:
      self._queue.put(line.decode(errors="replace"))
    self._queue.put(None)

  def expect(self, event: str, timeout: float) -> dict:
    while True:
      try:
        line = self._queue.get(timeout=timeout)
      except queue.Empty:
        raise TimeoutError(f"no {event!r} from the client in {timeout}s; "
                           f"got {self.seen}") from None
      if line is None:
        raise EOFError(f"the client exited before {event!r}; got {self.seen}")
      self.seen.append(line.rstrip())
      if line.startswith("{") and json.loads(line).get("event") == event:
        return json.loads(line)
