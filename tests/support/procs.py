"""What /proc says about a process (Linux): whether it lives, its parent, its command
line, its CPU time, its network namespace."""

import os


def _stat(pid: int | str) -> list[str]:
  """The fields of /proc/PID/stat after the command name (which may hold spaces): state first."""
  with open(f"/proc/{pid}/stat") as f:
    return f.read().rpartition(")")[2].split()


def alive(pid: int | str) -> bool:
  """Whether the process exists and is not a zombie (dead, only not yet reaped)."""
  try:
    return _stat(pid)[0] != "Z"
  except OSError:
    return False


def state(pid: int | str) -> str:
  """Its state letter: R, S, T (stopped), Z (zombie)..."""
  return _stat(pid)[0]


def parent(pid: int | str) -> int | None:
  """Its parent's pid (None once it is gone)."""
  try:
    return int(_stat(pid)[1])
  except (OSError, ValueError, IndexError):
    return None


def cpu_seconds(pid: int | str) -> float:
  """User + system CPU time of a process (to see that a worker runs closures)."""
  fields = _stat(pid)
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cmdline(pid: int | str) -> str:
  """A process's command line, its arguments joined by spaces ('' once it is gone)."""
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode(errors="replace")
  except OSError:
    return ""


def netns(pid: int | str) -> int | None:
  """The inode of its network namespace (None once it is gone)."""
  try:
    return os.stat(f"/proc/{pid}/ns/net").st_ino
  except OSError:
    return None
