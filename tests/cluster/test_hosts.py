"""VirtualHosts without TensorFlow: links, partitions, and what latency injection says here."""

import gzip
import select
import subprocess
import sys

import pytest

from tfps.cluster import hosts
from tfps.cluster import processes


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
  if (reason := hosts.unavailable()) is not None:
    pytest.skip(f"virtual hosts unavailable: {reason}")
  hosts_file = str(tmp_path_factory.mktemp("hosts") / "hosts")
  with hosts.VirtualHosts(["alpha", "beta"], hosts_file=hosts_file) as vh:
    yield vh


LISTEN = ("import socket, sys, time; s = socket.socket(); s.bind(('0.0.0.0', 2222)); "
          "s.listen(); print('listening', flush=True); time.sleep(120)")
CONNECT = ("import socket, sys\n"
           "try:\n  socket.create_connection((sys.argv[1], 2222), timeout=1); print('connected')\n"
           "except socket.timeout: print('timeout')\n"
           "except OSError as e: print(type(e).__name__)\n")


def _connect(vh, src: int, dst: int | str) -> str:
  target = dst if isinstance(dst, str) else vh.ip(dst)
  return vh.run(src, [sys.executable, "-c", CONNECT, target], timeout=10).strip()


def _listen(vh, host: int) -> subprocess.Popen:
  listener = processes.spawn([sys.executable, "-c", LISTEN], netns_fd=vh.fd(host),
                             stdout=subprocess.PIPE)
  ready, _, _ = select.select([listener.stdout], [], [], 10)
  assert ready and listener.stdout.readline().strip() == b"listening"
  return listener


def _resolve(vh, src: int, name: str) -> str:
  return vh.run(src, ["getent", "hosts", name]).split()[0]


def test_a_moved_host_keeps_its_name_at_a_new_address(two_hosts):
  old_ip = two_hosts.ip(1)
  assert _resolve(two_hosts, 0, "beta") == old_ip
  assert _resolve(two_hosts, 1, "alpha") == two_hosts.ip(0)
  # This machine's own /etc/hosts is not touched: the file is bound over it
  # in the processes' own mount namespaces only.
  assert "beta" not in open("/etc/hosts").read()
  new_ip = two_hosts.move(1)
  assert new_ip != old_ip
  assert _resolve(two_hosts, 0, "beta") == new_ip
  listener = _listen(two_hosts, 1)
  try:
    assert _connect(two_hosts, 0, "beta") == "connected"
    # Nothing answers at the old address: as after a pod's restart.
    assert _connect(two_hosts, 0, old_ip) in ("timeout", "ConnectionRefusedError", "OSError")
  finally:
    processes.stop_group(listener, grace=0)
    listener.stdout.close()


def test_a_cut_link_drops_packets_until_healed(two_hosts):
  listener = _listen(two_hosts, 1)
  try:
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
