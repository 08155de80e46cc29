"""VirtualHosts without TensorFlow: links, partitions, and what latency injection says here."""

import gzip
import select
import subprocess
import sys

import pytest

from tfps.cluster import hosts
from tfps.cluster import processes


@pytest.fixture(scope="module")
def two_hosts():
  if (reason := hosts.unavailable()) is not None:
    pytest.skip(f"virtual hosts unavailable: {reason}")
  with hosts.VirtualHosts(2) as vh:
    yield vh


LISTEN = ("import socket, sys, time; s = socket.socket(); s.bind(('0.0.0.0', 2222)); "
          "s.listen(); print('listening', flush=True); time.sleep(120)")
CONNECT = ("import socket, sys\n"
           "try:\n  socket.create_connection((sys.argv[1], 2222), timeout=1); print('connected')\n"
           "except socket.timeout: print('timeout')\n"
           "except OSError as e: print(type(e).__name__)\n")


def _connect(vh, src: int, dst: int) -> str:
  return vh.run(src, [sys.executable, "-c", CONNECT, vh.ip(dst)], timeout=10).strip()


def test_a_cut_link_drops_packets_until_healed(two_hosts):
  listener = processes.spawn([sys.executable, "-c", LISTEN], netns_fd=two_hosts.fd(1),
                             stdout=subprocess.PIPE)
  try:
    ready, _, _ = select.select([listener.stdout], [], [], 10)
    assert ready and listener.stdout.readline().strip() == b"listening"
    assert _connect(two_hosts, 0, 1) == "connected"
    two_hosts.partition(1)
    try:
      # Dropped, not refused: a peer sees silence, as with a pulled cable.
      assert _connect(two_hosts, 0, 1) == "timeout"
    finally:
      two_hosts.heal(1)
    assert _connect(two_hosts, 0, 1) == "connected"
  finally:
    processes.stop_group(listener, grace=0)
    listener.stdout.close()


def _has_netem() -> bool:
  with open("/proc/config.gz", "rb") as f:
    return b"CONFIG_NET_SCH_NETEM=" in gzip.decompress(f.read())


def test_latency_is_added_with_netem_or_refused_in_one_line(two_hosts):
  try:
    netem = _has_netem()
  except OSError:
    netem = None  # Unknown kernel config: accept either outcome, checked below.
  try:
    two_hosts.impair(1, delay_ms=5)
  except OSError as e:
    assert netem is not True, "netem is built in, yet impair() refused"
    assert str(e) == ("tc netem is not available in this kernel (no sch_netem module); "
                      "latency and loss cannot be injected here")
    return
  try:
    assert netem is not False
    assert "netem" in two_hosts.run(1, ["tc", "qdisc", "show", "dev", "eth0"])
  finally:
    two_hosts.impair(1)  # 0 ms: removed.
