"""A private network for a local cluster: loopback that no other host can reach.

`tf.distribute.Server` binds `0.0.0.0:PORT` whatever host the spec names, and
TF offers no bind-address option: every local fake cluster would otherwise be
an unauthenticated remote-execution service on every interface of the
machine. So a local cluster runs its processes inside a fresh network
namespace that has only a loopback interface: the sockets exist, but no
packet from outside the namespace can reach them.

The namespace is anonymous. We create it with `unshare --net`, keep it alive
by holding an open file descriptor to it, and move each child into it before
`exec` (see `processes.spawn`). When the last member exits and our
descriptor closes (also when we are SIGKILLed), the kernel frees it: nothing
to clean up after a crash.

Creating a network namespace needs root (CAP_SYS_ADMIN). Without it,
`PrivateNetwork.create` returns None and logs a loud warning; the caller then
runs on the host's loopback, reachable from other hosts.
"""

import os
import select
import shutil
import subprocess

from absl import logging

from tfps.cluster import processes

_READY_TIMEOUT = 10.0
# Brings loopback up, says so, then sleeps until we have opened the namespace.
_HOLDER_SCRIPT = "ip link set lo up && echo ready && exec sleep 3600"


class PrivateNetwork:
  """An open network namespace with only `lo` (up). Close it when done."""

  def __init__(self, fd: int):
    self._fd = fd

  @property
  def fd(self) -> int:
    if self._fd is None:
      raise ValueError("the private network is closed")
    return self._fd

  @classmethod
  def create(cls) -> "PrivateNetwork | None":
    """A new private network, or None (with a warning) where not permitted."""
    reason = _unavailable_reason()
    if reason is None:
      try:
        return cls(_open_new_namespace())
      except (OSError, TimeoutError) as e:
        reason = str(e)
    logging.warning(
        "NOT ISOLATED: cannot create a private network namespace (%s); the local "
        "cluster's TF servers listen on ALL interfaces, unauthenticated, for as "
        "long as it runs. Run as root on Linux to isolate them.", reason)
    return None

  def close(self) -> None:
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None


def _unavailable_reason() -> str | None:
  if not os.path.exists("/proc/self/ns/net"):
    return "no network namespaces on this system"
  if os.geteuid() != 0:
    return "not root"
  for tool in ("unshare", "ip"):
    if shutil.which(tool) is None:
      return f"{tool!r} is not installed (util-linux / iproute2)"
  return None


def _open_new_namespace() -> int:
  holder = processes.spawn(["unshare", "--net", "--", "sh", "-c", _HOLDER_SCRIPT],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    readable, _, _ = select.select([holder.stdout], [], [], _READY_TIMEOUT)
    line = holder.stdout.readline() if readable else b""
    if line.strip() != b"ready":
      holder.kill()
      err = holder.stderr.read().decode(errors="replace").strip()
      raise OSError(f"unshare --net failed: {err or 'no ready line'}")
    return os.open(f"/proc/{holder.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
  finally:
    processes.stop_group(holder, grace=0)
    holder.stdout.close()
    holder.stderr.close()
