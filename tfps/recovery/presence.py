"""Whether the chief lease's holder process is still there, known the moment it dies.

A standby chief takes over when the holder's beat stops for a lease
(`chief_lease`): a second, by its own clock, whatever happened to the
holder. When the holder's *process* dies on a host that stays up (killed,
crashed, its container ended), the holder's kernel closes its sockets at
once. So the holder serves a presence port (`PresenceServer`: it accepts
connections and keeps them open, saying nothing) and the standby keeps a
connection to it (`PresenceWatch`): end of file or a reset, or a refused
connection (nobody listens there any more), says the holder's process is
gone, and the standby need not wait out the lease.

A host that is lost, paused, or cut off closes nothing: the connection
stays open (or times out), and the lease decides, as before. A holder
whose process is paused or starved (a loaded host) also beats late; to
tell it from a lost host, the standby opens a new connection to the port
(`PresenceWatch.answers`): the holder's kernel completes it whatever its
process does, a lost or cut off host does not. A process known to live is
given more time (`chief_lease.PRESENT_LEASES`) before it is taken from.
"""

import selectors
import socket
import threading

from absl import logging

# A standby's connection attempt waits this long; a holder that does not
# answer in time is judged by its lease alone.
_CONNECT_SECONDS = 1.0


class PresenceServer:
  """A port that keeps every connection open while this process lives (a thread)."""

  def __init__(self):
    # Every interface (IPv6 and IPv4 where the host has both): the watcher
    # comes by the chief's name, whatever address that resolves to.
    if socket.has_dualstack_ipv6():
      self._listener = socket.create_server(("", 0), family=socket.AF_INET6,
                                            dualstack_ipv6=True)
    else:
      self._listener = socket.create_server(("", 0))
    self._listener.setblocking(False)
    self.port = self._listener.getsockname()[1]
    self._selector = selectors.DefaultSelector()
    self._selector.register(self._listener, selectors.EVENT_READ)
    self._thread = threading.Thread(target=self._serve, name="tfps-presence", daemon=True)

  def start(self) -> "PresenceServer":
    self._thread.start()
    return self

  def _serve(self) -> None:
    while True:
      for key, _ in self._selector.select():
        if key.fileobj is self._listener:
          try:
            connection, _ = self._listener.accept()
          except OSError:
            continue
          connection.setblocking(False)
          self._selector.register(connection, selectors.EVENT_READ)
          continue
        try:  # A watcher said something or left: drop it when it left.
          data = key.fileobj.recv(64)
        except OSError:
          data = b""
        if not data:
          self._selector.unregister(key.fileobj)
          key.fileobj.close()


class PresenceWatch:
  """Watches one holder's presence port from a thread: `gone` is set once its process
  is known to be gone (the connection ended, or was refused)."""

  def __init__(self, address: str):
    self.address = address
    self.gone = threading.Event()
    self.watching = threading.Event()  # Connected: its end will be seen.
    self._thread = threading.Thread(target=self._watch, name="tfps-presence-watch",
                                    daemon=True)
    self._stopped = False
    self._socket: socket.socket | None = None

  def start(self) -> "PresenceWatch":
    self._thread.start()
    return self

  def _watch(self) -> None:
    try:
      self._socket = socket.create_connection(self._host_port(), timeout=_CONNECT_SECONDS)
    except ConnectionRefusedError:
      self._said_gone("its presence port refuses connections")
      return
    except (OSError, ValueError) as e:  # Unreachable, timed out: the lease decides.
      logging.info("chief presence %s not watched (%s): the lease decides", self.address, e)
      return
    if self._stopped:  # Stopped while connecting.
      self._socket.close()
      return
    self._socket.settimeout(None)
    self.watching.set()
    try:
      while self._socket.recv(64):
        pass  # It never says anything; read on until it ends.
      self._said_gone("its presence connection closed")
    except OSError as e:
      self._said_gone(f"its presence connection failed ({e.strerror or e})")

  def answers(self, timeout: float) -> bool:
    """Whether the holder's host accepts a new connection to its presence port within
    `timeout`: its process is there (maybe paused or starved), and its host is up."""
    try:
      socket.create_connection(self._host_port(), timeout=timeout).close()
      return True
    except (OSError, ValueError):
      return False

  def _host_port(self) -> tuple[str, int]:
    host, _, port = self.address.rpartition(":")
    return host, int(port)  # ValueError for a bad port: the callers catch it.

  def _said_gone(self, why: str) -> None:
    if not self._stopped:
      logging.info("the chief lease holder's process is gone: %s", why)
      self.gone.set()

  def stop(self) -> None:
    """Stops watching (another holder now): its connection is closed, and the
    thread has ended when this returns (or is left, a daemon, past a second)."""
    self._stopped = True
    if self._socket is not None:
      try:
        self._socket.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass
    if self._thread.is_alive():
      self._thread.join(timeout=_CONNECT_SECONDS)
