"""The chief lease holder's presence port (tfps.recovery.presence), with real processes."""

import signal
import subprocess
import sys
import textwrap

import portpicker

from tfps.cluster import processes
from tfps.recovery import presence

# Serves a presence port, says which, and lives until killed.
_HOLDER = textwrap.dedent("""
    import sys, time
    from tfps.recovery import presence
    server = presence.PresenceServer().start()
    print(server.port, flush=True)
    time.sleep(600)
""")


def _holder():
  process = processes.spawn([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE)
  return process, int(process.stdout.readline())


def test_a_killed_holder_is_gone_at_once():
  process, port = _holder()
  try:
    watch = presence.PresenceWatch(f"localhost:{port}").start()
    # Connected first, as a standby is long before its holder dies: killed before the
    # watch connects, the holder's port is free, and anything may be listening there.
    assert watch.watching.wait(timeout=10)
    process.send_signal(signal.SIGKILL)
    assert watch.gone.wait(timeout=10)
  finally:
    processes.stop_group(process, grace=0)


def test_a_port_nobody_serves_is_gone_and_a_stopped_watch_says_nothing():
  port = portpicker.pick_unused_port()
  assert presence.PresenceWatch(f"localhost:{port}").start().gone.wait(timeout=10)
  process, port = _holder()
  try:
    watch = presence.PresenceWatch(f"localhost:{port}").start()
    second = presence.PresenceWatch(f"localhost:{port}").start()
    assert watch.watching.wait(timeout=10) and second.watching.wait(timeout=10)
    watch.stop()  # Another holder now: its connection closes, and that says nothing.
    assert not watch.gone.is_set()
    process.send_signal(signal.SIGKILL)
    assert second.gone.wait(timeout=10)  # The server took the first one's leaving in its stride.
  finally:
    processes.stop_group(process, grace=0)


def test_a_paused_holder_s_host_still_answers_a_new_connection_and_a_free_port_does_not():
  process, port = _holder()
  try:
    watch = presence.PresenceWatch(f"localhost:{port}")
    process.send_signal(signal.SIGSTOP)  # Its kernel still completes connections.
    assert watch.answers(timeout=5)
  finally:
    processes.stop_group(process, grace=0)
  assert not presence.PresenceWatch(
      f"localhost:{portpicker.pick_unused_port()}").answers(timeout=5)
