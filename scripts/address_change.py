"""How long TensorFlow's gRPC takes to find a server restarted under its name at a new address.

  sudo python scripts/address_change.py --runs=3

Two virtual hosts (`tfps.cluster.hosts`) resolve names from one hosts file.
A `tf.distribute.Server` ("worker", named `w0`) serves; a client on the
other host connects to the cluster by name and runs an op on the worker every
0.1 s. The server is SIGKILLed and started again, either on the same host
(same address) or on a new host (`move`: a new address under the same name,
as a restarted Kubernetes pod). What is measured: seconds from the new
server's "serving" to the client's first RPC that reaches it (TensorFlow
then answers that the client's context is unknown: the server is new). Each
case runs with gRPC's default DNS refresh (at most every 30 s) and with the
1 s that `tfps` sets (`TF_GRPC_DEFAULT_OPTIONS`). One JSON line: the
medians per case. Needs root (network namespaces).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from tfps.cluster import hosts
from tfps.cluster import processes

flags.DEFINE_integer("runs", 3, "Restarts per case.")
FLAGS = flags.FLAGS

_SERVER = """
import sys, time, tensorflow as tf
cluster = tf.train.ClusterSpec({"worker": ["w0:2222"], "chief": ["chief:2222"]})
tf.distribute.Server(cluster, job_name="worker", task_index=0, start=True)
print("serving", time.time(), flush=True)
time.sleep(100000)
"""
_CLIENT = """
import time, tensorflow as tf
cluster = tf.train.ClusterSpec({"worker": ["w0:2222"], "chief": ["chief:2222"]})
tf.config.experimental_connect_to_cluster(cluster, job_name="chief", task_index=0)
reached = None
while True:
  try:
    with tf.device("/job:worker/task:0"):
      (tf.constant(1.0) + 1.0).numpy()
    print("ok", time.time(), flush=True)
  except tf.errors.AbortedError:  # A server that does not know our context: a new one.
    print("reached", time.time(), flush=True)
  except tf.errors.UnavailableError:
    pass
  time.sleep(0.1)
"""
_DNS_REFRESH = "grpc.dns_min_time_between_resolutions_ms=1000"


def _spawn(vh, host, code, log, grpc_options):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("TF_GRPC_DEFAULT_OPTIONS", None)
  if grpc_options:
    env["TF_GRPC_DEFAULT_OPTIONS"] = grpc_options
  return processes.spawn([sys.executable, "-c", code], netns_fd=vh.fd(host),
                         hosts_file=vh.hosts_file, stdout=log, stderr=subprocess.DEVNULL, env=env)


def _wait_line(path, word, after=0.0, timeout=120.0):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    with open(path, encoding="utf-8") as f:
      for line in f:
        if line.startswith(word) and float(line.split()[1]) > after:
          return float(line.split()[1])
    time.sleep(0.05)
  raise TimeoutError(f"no {word!r} line in {path} within {timeout:.0f}s")


def _one(work, moved, grpc_options):
  """Seconds from the restarted server's start to the client's first RPC reaching it."""
  with hosts.VirtualHosts(["chief", "w0"], os.path.join(work, "hosts")) as vh:
    logs = [os.path.join(work, name) for name in ("server1", "server2", "client")]
    for path in logs:
      open(path, "w").close()
    server = _spawn(vh, 1, _SERVER, open(logs[0], "a"), grpc_options)
    client = None
    try:
      _wait_line(logs[0], "serving")
      client = _spawn(vh, 0, _CLIENT, open(logs[2], "a"), grpc_options)
      _wait_line(logs[2], "ok")
      processes.stop_group(server, grace=0)
      if moved:
        vh.move(1)
      server = _spawn(vh, 1, _SERVER, open(logs[1], "a"), grpc_options)
      serving = _wait_line(logs[1], "serving")
      return _wait_line(logs[2], "reached", after=0.0) - serving
    finally:
      processes.stop_group(server, grace=0)
      if client is not None:
        processes.stop_group(client, grace=0)


def main(argv):
  del argv
  result = {}
  with tempfile.TemporaryDirectory(prefix="tfps-address-") as work:
    for moved in (False, True):
      for options in ("", _DNS_REFRESH):
        case = (f"{'new' if moved else 'same'} address, "
                f"{'1 s' if options else 'default'} DNS refresh")
        seconds = [_one(work, moved, options) for _ in range(FLAGS.runs)]
        print(f"{case}: {', '.join(f'{s:.2f}' for s in seconds)}", file=sys.stderr)
        result[case] = round(statistics.median(seconds), 2)
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
