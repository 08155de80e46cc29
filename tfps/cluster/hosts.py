"""Virtual hosts: one network namespace per task, joined by a private bridge.

A laptop run on loopback hides every networking fault. `VirtualHosts` makes
each task a separate network stack with its own address on a real interface,
as on separate VMs, all on one machine:

    hub namespace:  br0 (bridge) ── veth0 ── veth1 ── ...
    host i:         lo, eth0 = 10.213.x.y/16 (the other end of its veth)

Hosts have names, and processes started with `hosts_file` resolve them from
it (it is their /etc/hosts, see `launcher`). `move(i)` puts host i on a new
namespace at a new address under the same name, as Kubernetes does with a
restarted pod: whatever still dials the old address finds nothing there.

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

import dataclasses
import os
import select
import shutil
import subprocess
from typing import Sequence

from tfps.cluster import processes

SUBNET = "10.213"  # A /16: every move takes a new address.
_READY_TIMEOUT = 10.0
# Every line of the hosts file has this width, so that rewriting it in place
# (processes hold the file itself, bound over their /etc/hosts: it cannot be
# replaced by a rename) is one write of the same size, never a short file.
_LINE_WIDTH = 64
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
  """Named hosts on one private bridge. Use as a context manager.

  Args:
    names: one per host (resolvable on every host through `hosts_file`).
    hosts_file: where to keep the hosts file (a path in a directory of the
      caller's; written here). None: no names, addresses only.
  """

  def __init__(self, names: Sequence[str], hosts_file: str | None = None):
    reason = unavailable()
    if reason is not None:
      raise OSError(f"virtual hosts: {reason}")
    if not 1 <= len(names) <= 250:
      raise ValueError(f"hosts ({len(names)}) must be between 1 and 250")
    self.names = tuple(names)
    self.hosts_file = hosts_file
    self._hub: subprocess.Popen | None = None
    self._hosts: list[_Host] = []
    self._made = 0  # Namespaces made so far: the next one's link and address.
    try:
      self._hub = _holder("ip link add br0 type bridge && ip link set br0 up &&")
      for _ in self.names:
        self._hosts.append(self._new_host())
      self._write_hosts_file()
    except BaseException:
      self.close()
      raise

  def __enter__(self) -> "VirtualHosts":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @property
  def count(self) -> int:
    return len(self._hosts)

  def ip(self, host: int) -> str:
    """Host's address now (it changes when the host moves)."""
    return self._hosts[host].ip

  def fd(self, host: int) -> int:
    """An open descriptor of host's network namespace (for `processes.spawn`)."""
    return self._hosts[host].fd

  def move(self, host: int) -> str:
    """Puts `host` on a new namespace at a new address, same name; returns the address.

    What ran on the old namespace (and is gone by now) leaves with it; the
    hosts file names the new address before this returns.
    """
    old = self._hosts[host]
    self._hosts[host] = self._new_host()
    self._write_hosts_file()
    _close_host(old)
    return self._hosts[host].ip

  def add(self, name: str) -> int:
    """A new host named `name` (the hosts file names it before this returns); its index."""
    if len(self._hosts) >= 250:
      raise ValueError(f"hosts ({len(self._hosts) + 1}) must be between 1 and 250")
    self._hosts.append(self._new_host())
    self.names = (*self.names, name)
    self._write_hosts_file()
    return len(self._hosts) - 1

  def run(self, host: int, argv: Sequence[str], timeout: float = 10.0) -> str:
    """Runs `argv` on `host`; returns its stdout."""
    return processes.output_of(processes.spawn(
        argv, netns_fd=self.fd(host), hosts_file=self.hosts_file, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT), argv, timeout)

  def partition(self, host: int) -> None:
    """Cuts `host` off the bridge (its link goes down, as a pulled cable)."""
    self._in_hub(f"ip link set {self._hosts[host].link} down")

  def heal(self, host: int) -> None:
    self._in_hub(f"ip link set {self._hosts[host].link} up")

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
    for host in self._hosts:
      _close_host(host)
    self._hosts = []
    if self._hub is not None:
      processes.stop_group(self._hub, grace=0)
      self._hub.stdout.close()
      self._hub = None

  def _new_host(self) -> "_Host":
    index = self._made
    self._made += 1
    if index >= 250 * 250:
      raise OSError("virtual hosts: out of addresses")
    ip, link = f"{SUBNET}.{index // 250}.{index % 250 + 2}", f"veth{index}"
    holder = _holder("")
    host = _Host(holder, os.open(f"/proc/{holder.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC),
                 ip, link)
    try:
      self._in_hub(f"ip link add {link} type veth peer name eth0 netns {holder.pid}")
      self._in_hub(f"ip link set {link} master br0 && ip link set {link} up")
      processes.output_of(processes.spawn(
          ["sh", "-c", f"ip addr add {ip}/16 dev eth0 && ip link set eth0 up"],
          netns_fd=host.fd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT), ["ip addr"], 10.0)
    except BaseException:
      _close_host(host)
      raise
    return host

  def _write_hosts_file(self) -> None:
    if self.hosts_file is None:
      return
    lines = ["127.0.0.1 localhost"] + [f"{h.ip} {name}" for name, h in zip(self.names, self._hosts)]
    text = "".join(line.ljust(_LINE_WIDTH - 1) + "\n" for line in lines)
    fd = os.open(self.hosts_file, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
      os.pwrite(fd, text.encode(), 0)
    finally:
      os.close(fd)

  def _in_hub(self, command: str) -> None:
    processes.output_of(processes.spawn(
        ["nsenter", f"--net=/proc/{self._hub.pid}/ns/net", "sh", "-c", command],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT), [command], 10.0)


@dataclasses.dataclass(frozen=True)
class _Host:
  """One host's namespace now: its holder process, an open descriptor, address, link."""

  holder: subprocess.Popen
  fd: int
  ip: str
  link: str


def _close_host(host: _Host) -> None:
  os.close(host.fd)
  processes.stop_group(host.holder, grace=0)
  host.holder.stdout.close()


def _holder(extra: str) -> subprocess.Popen:
  """A sleeping process that owns a new network namespace."""
  holder = processes.spawn(["unshare", "--net", "--", "sh", "-c", _HOLDER.format(extra=extra)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  readable, _, _ = select.select([holder.stdout], [], [], _READY_TIMEOUT)
  line = holder.stdout.readline() if readable else b""
  if line.strip() != b"ready":
    processes.stop_group(holder, grace=0)
    raise OSError(f"could not create a network namespace: {line.decode().strip() or 'timeout'}")
  return holder
