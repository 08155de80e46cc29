"""Virtual hosts: one network namespace per task, joined by a private bridge.

A laptop run on loopback hides every networking fault. `VirtualHosts` makes
each task a separate network stack with its own address on a real interface,
as on separate VMs, all on one machine:

    hub namespace:  br0 (bridge) ── veth0 ── veth1 ── ...
    host i:         lo, eth0 = 10.213.0.(i+2)/24 (the other end of veth i)

The addresses exist only inside namespaces created here; the hub is not
connected to the machine's own network, so no packet can leave. Namespaces
are anonymous and kept alive by holder processes (with a parent-death
signal): when we exit, even by SIGKILL, the holders die and the kernel frees
the namespaces with their links. Nothing is left to clean up.

Faults: `partition(i)` takes host i's link down (`heal` brings it back);
`impair(i, delay_ms, loss_percent)` adds `tc netem` latency and loss on it.

Needs root, `unshare`, `nsenter`, `ip` and `tc` (iproute2); `unavailable()`
says why not, in one line.
"""

import os
import select
import shutil
import subprocess
from typing import Sequence

from tfps.cluster import processes

SUBNET = "10.213.0"
_READY_TIMEOUT = 10.0
_HOLDER = "ip link set lo up && {extra} echo ready && exec sleep 1000000"


def unavailable() -> str | None:
  """Why virtual hosts cannot be made here, or None if they can."""
  if not os.path.exists("/proc/self/ns/net"):
    return "no network namespaces on this system"
  if os.geteuid() != 0:
    return "network namespaces need root"
  for tool in ("unshare", "nsenter", "ip", "tc"):
    if shutil.which(tool) is None:
      return f"{tool!r} is not installed (util-linux / iproute2)"
  return None


class VirtualHosts:
  """`count` hosts on one private bridge. Use as a context manager."""

  def __init__(self, count: int):
    reason = unavailable()
    if reason is not None:
      raise OSError(f"virtual hosts: {reason}")
    if count < 1 or count > 250:
      raise ValueError(f"count ({count}) must be between 1 and 250")
    self._holders: list[subprocess.Popen] = []
    self._fds: list[int] = []
    try:
      self._hub = self._holder("ip link add br0 type bridge && ip link set br0 up &&")
      for i in range(count):
        host = self._holder("")
        self._fds.append(os.open(f"/proc/{host.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC))
        self._in_hub(f"ip link add veth{i} type veth peer name eth0 netns {host.pid}")
        self._in_hub(f"ip link set veth{i} master br0 && ip link set veth{i} up")
        self.run(i, ["sh", "-c", f"ip addr add {self.ip(i)}/24 dev eth0 && ip link set eth0 up"])
    except BaseException:
      self.close()
      raise

  def __enter__(self) -> "VirtualHosts":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @property
  def count(self) -> int:
    return len(self._fds)

  def ip(self, host: int) -> str:
    return self.ips(host + 1)[host]

  @staticmethod
  def ips(count: int) -> list[str]:
    """The addresses hosts 0..count-1 get, known before they exist."""
    return [f"{SUBNET}.{i + 2}" for i in range(count)]

  def fd(self, host: int) -> int:
    """An open descriptor of host's network namespace (for `processes.spawn`)."""
    return self._fds[host]

  def run(self, host: int, argv: Sequence[str], timeout: float = 10.0) -> str:
    """Runs `argv` on `host`; returns its stdout."""
    return processes.output_of(processes.spawn(
        argv, netns_fd=self.fd(host), stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
        argv, timeout)

  def partition(self, host: int) -> None:
    """Cuts `host` off the bridge (its link goes down, as a pulled cable)."""
    self._in_hub(f"ip link set veth{host} down")

  def heal(self, host: int) -> None:
    self._in_hub(f"ip link set veth{host} up")

  def impair(self, host: int, *, delay_ms: float = 0.0, loss_percent: float = 0.0) -> None:
    """Adds latency and loss to everything `host` sends (0, 0 removes them).

    Raises:
      OSError: the kernel has no netem queueing discipline (some sandboxes
        and minimal kernels lack the sch_netem module), in one line.
    """
    self.run(host, ["sh", "-c", "tc qdisc del dev eth0 root 2>/dev/null; true"])
    if delay_ms > 0 or loss_percent > 0:
      try:
        self.run(host, ["tc", "qdisc", "add", "dev", "eth0", "root", "netem",
                        "delay", f"{delay_ms:g}ms", "loss", f"{loss_percent:g}%"])
      except OSError as e:
        if "unknown" in str(e):
          raise OSError("tc netem is not available in this kernel (no sch_netem module); "
                        "latency and loss cannot be injected here") from None
        raise

  def close(self) -> None:
    for fd in self._fds:
      os.close(fd)
    self._fds = []
    for holder in self._holders:
      processes.stop_group(holder, grace=0)
      holder.stdout.close()
    self._holders = []

  def _holder(self, extra: str) -> subprocess.Popen:
    """A sleeping process that owns a new network namespace."""
    holder = processes.spawn(["unshare", "--net", "--", "sh", "-c", _HOLDER.format(extra=extra)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    self._holders.append(holder)
    readable, _, _ = select.select([holder.stdout], [], [], _READY_TIMEOUT)
    line = holder.stdout.readline() if readable else b""
    if line.strip() != b"ready":
      raise OSError(f"could not create a network namespace: {line.decode().strip() or 'timeout'}")
    return holder

  def _in_hub(self, command: str) -> None:
    processes.output_of(processes.spawn(
        ["nsenter", f"--net=/proc/{self._hub.pid}/ns/net", "sh", "-c", command],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT), [command], 10.0)
