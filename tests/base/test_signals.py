"""Stop signals reach a process whichever of its threads the kernel picks (no TF)."""

import subprocess
import sys
import textwrap

import pytest

# The signal is sent to a thread other than the main one, as the kernel may
# do in a process full of TF threads; the main thread waits (WAIT).
_SCRIPT = textwrap.dedent("""
    import signal, threading
    from tfps.base import signals
    stop = signals.StopSignals.install()
    ready = threading.Event()
    def other_thread():
      ready.wait()
      signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    threading.Thread(target=other_thread, daemon=True).start()
    ready.set()
    WAIT
    print("stopped by", signal.Signals(stop.signum).name)
""")


# Without a timeout, and with one far longer than the test's (a worker's wait
# between prunes of its graph cache).
@pytest.mark.parametrize("wait", ["stop.wait()", "while not stop.wait(600): pass"])
def test_a_stop_signal_taken_by_another_thread_ends_the_wait(wait):
  done = subprocess.run([sys.executable, "-c", _SCRIPT.replace("WAIT", wait)],
                        capture_output=True, text=True, timeout=20)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == "stopped by SIGTERM"


# A second signal's handler runs inside the first's, wherever Python is in it.
# Here one is run at every call, line and return of the first (a trace
# function; Python does not trace inside it). A handler that took a lock (as
# threading.Event.set does) blocked forever on the one its own thread held:
# two SIGTERMs a moment apart hung `tfps local`.
_NESTED = textwrap.dedent("""
    import signal, sys
    from tfps.base import signals
    stop = signals.StopSignals.install()
    nested = []
    def second_signal(frame, event, arg):
      nested.append(event)
      stop._handle(signal.SIGINT, None)
      return second_signal
    sys.settrace(second_signal)
    stop._handle(signal.SIGTERM, None)
    sys.settrace(None)
    assert stop.wait(0) and stop.requested and nested
    print("stopped")
""")


def test_a_signal_handled_inside_another_s_handler_does_not_block():
  done = subprocess.run([sys.executable, "-c", _NESTED], capture_output=True, text=True,
                        timeout=20)
  assert done.returncode == 0, done.stderr
  assert done.stdout.strip() == "stopped"
