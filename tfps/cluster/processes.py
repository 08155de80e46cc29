"""Child processes that never outlive their parent.

Every process tfps starts (a task of a local cluster, a chief, a probe) goes
through `spawn`, which gives it:
  * its own process group, so a signal to the group reaches anything it forks;
  * a parent-death signal (SIGKILL), so it dies if the parent is killed, even
    with SIGKILL, where no `finally` or `atexit` runs;
  * optionally, membership of a private network namespace (see `netns`).

No Python runs between `fork` and `exec` (every tfps process has gRPC's
threads, and code in a forked child of a threaded process can crash or
deadlock it): `subprocess` forks and execs in C, and the child's first
program is `launcher`, which sets the parent-death signal, checks that the
parent still lives and enters the namespace, then execs the command. That
costs ~20 ms a start (docs/architecture.md, "Starting processes").

Linux delivers the parent-death signal when the *thread* that forked the child
exits, not the process. Spawn from the main thread or from a thread that lives
as long as the children should (the local cluster's own threads do).
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, Mapping, Sequence

from absl import logging

from tfps.cluster import launcher

_LAUNCHER = launcher.__file__


def launch_argv(argv: Sequence[str], *, parent_pid: int, netns_fd: int | None,
                hosts_file: str | None = None) -> list[str]:
  """`argv` behind the launcher: tied to `parent_pid`, in `netns_fd`, `hosts_file` its hosts."""
  return [sys.executable, "-I", "-S", _LAUNCHER, str(parent_pid),
          "-" if netns_fd is None else str(netns_fd), hosts_file or "-", "--", *argv]


def spawn(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
          stdout=None, stderr=None, stdin=subprocess.DEVNULL,
          netns_fd: int | None = None, hosts_file: str | None = None,
          cwd: str | None = None) -> subprocess.Popen:
  """Starts `argv` in a new process group, tied to this process's life.

  `netns_fd`: a network namespace to run in; `hosts_file`: what the process
  sees as /etc/hosts (needs root; see `launcher`).

  Raises:
    FileNotFoundError: `argv[0]` is not a program on the PATH (as `Popen` would).
  """
  path = (env or os.environ).get("PATH", os.defpath)
  if shutil.which(argv[0], path=path) is None:
    raise FileNotFoundError(f"{argv[0]!r}: no such program")
  pass_fds = (netns_fd,) if netns_fd is not None else ()
  return subprocess.Popen(
      launch_argv(argv, parent_pid=os.getpid(), netns_fd=netns_fd, hosts_file=hosts_file),
      env=dict(env) if env is not None else None, cwd=cwd,
      stdin=stdin, stdout=stdout, stderr=stderr,
      start_new_session=True, pass_fds=pass_fds)


def stop_group(process: subprocess.Popen, *, grace: float = 5.0) -> int | None:
  """Ends `process` and its process group: SIGTERM, then SIGKILL after `grace` s.

  Returns the exit code (negative: killed by that signal), or None if the
  process could not be reaped, which is logged.
  """
  for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
    if process.poll() is not None:
      break
    signal_group(process, sig)
    # A stopped process cannot act on SIGTERM until it continues.
    signal_group(process, signal.SIGCONT)
    try:
      process.wait(timeout=wait)
    except subprocess.TimeoutExpired:
      continue
  # Whatever it forked and left behind in its group goes too.
  signal_group(process, signal.SIGKILL)
  if process.poll() is None:
    logging.error("pid %d did not exit after SIGKILL", process.pid)
  return process.returncode


def signal_group(process: subprocess.Popen, sig: int) -> None:
  """Sends `sig` to the process group led by `process`, if it still exists."""
  try:
    os.killpg(process.pid, sig)
  except (ProcessLookupError, PermissionError):
    pass


def _descendants(pid: int) -> list[int]:
  """Every live descendant of `pid`, parents before their children (from /proc)."""
  children: dict[int, list[int]] = {}
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        stat = f.read()
    except OSError:
      continue  # Gone since listdir.
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    ppid = int(stat[stat.rindex(")") + 2:].split()[1])
    children.setdefault(ppid, []).append(int(entry))
  found, queue = [], list(children.get(pid, []))
  while queue:
    child = queue.pop(0)
    found.append(child)
    queue.extend(children.get(child, []))
  return found


def signal_tree(process: subprocess.Popen, sig: int) -> None:
  """Sends `sig` to `process`'s group and to every descendant's group.

  A task's children may run in their own sessions (the chief's supervisor
  starts its coordinator so), out of reach of `signal_group`; freezing a task
  (SIGSTOP, as a frozen VM or container would be) must reach them too.
  """
  signal_group(process, sig)
  for pid in _descendants(process.pid):
    try:
      os.killpg(os.getpgid(pid), sig)
    except (ProcessLookupError, PermissionError):
      pass


def wait_for_exit(process: subprocess.Popen, timeout: float) -> int:
  """Waits up to `timeout` s for `process` to exit; returns its exit code.

  Raises:
    TimeoutError: naming the pid and how long we waited.
  """
  try:
    return process.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    raise TimeoutError(f"pid {process.pid} still running after {timeout:.1f}s") from None


def output_of(process: subprocess.Popen, argv: Sequence[str], timeout: float) -> str:
  """Waits for a short-lived `process` (stdout piped); returns its stdout.

  Raises:
    TimeoutError: it ran over `timeout` s (it is killed).
    OSError: it exited non-zero; the message has its output.
  """
  try:
    out, _ = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    stop_group(process, grace=0)
    raise TimeoutError(f"{' '.join(argv)} ran over {timeout:.0f}s") from None
  text = out.decode(errors="replace") if isinstance(out, bytes) else (out or "")
  if process.returncode != 0:
    raise OSError(f"{' '.join(argv)} exited {process.returncode}: {text.strip()}")
  return text


def wait_until(predicate: Callable[[], bool], *, timeout: float, what: str,
               interval: float = 0.1) -> None:
  """Polls `predicate` until true; raises TimeoutError naming `what`."""
  end = time.monotonic() + timeout
  while not predicate():
    if time.monotonic() > end:
      raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
    time.sleep(interval)
