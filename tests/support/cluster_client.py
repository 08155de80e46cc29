"""A TensorFlow client (a coordinator) run as a script inside a test cluster's network.

The test process cannot reach a cluster on a private network, and a coordinator
connected in it would share its eager context with every other test. So a
test writes its coordinator as a script, starts it on the cluster's network
with `start`, and talks to it over its stdin/stdout: the client prints one JSON
object per line (`{"event": ...}`), the test answers with lines on its stdin.
"""

import json
import os
import queue
import subprocess
import sys
import threading

from tfps.cluster import local


def start(cluster: local.LocalCluster, tmp_path, source: str) -> tuple[subprocess.Popen, str]:
  """Starts `source` as a client of `cluster` (its spec file as argv[1]); returns it and
  the path of its stderr. The caller stops it (`processes.stop_group`)."""
  script = tmp_path / "client.py"
  script.write_text(source)
  stderr_path = tmp_path / "client.stderr"
  # As `tfps` sets for its own processes (tfps/commands/cli.py); its temporary files
  # (AutoGraph's) in tmp_path, since a client leaves with os._exit.
  (tmp_path / "tmp").mkdir()
  env = dict(os.environ, GRPC_FAIL_FAST="use_caller", TF_CPP_MIN_LOG_LEVEL="1",
             TMPDIR=str(tmp_path / "tmp"))
  with open(stderr_path, "w") as stderr:
    client = cluster.spawn([sys.executable, str(script), cluster.spec_file], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
  return client, stderr_path


def tell(client: subprocess.Popen, line: str) -> None:
  """Writes one line to the client's stdin."""
  client.stdin.write(line.encode() + b"\n")
  client.stdin.flush()


class Lines:
  """The client's stdout, one JSON object per line, read with deadlines."""

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
