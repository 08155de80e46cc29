"""The first program of every child tfps starts: ties it to its parent, then execs it.

    python -I -S launcher.py PARENT_PID NETNS_FD|- -- COMMAND [ARG ...]

`processes.spawn` runs this instead of handing `subprocess` a hook to run before exec:
code that runs between `fork` and `exec` in a process with threads (every
tfps process has gRPC's) can deadlock or crash the child before it exists.
Here the same three steps run in a fresh, single-threaded process, after
`exec`:
  1. ask the kernel for SIGKILL when the parent dies (PR_SET_PDEATHSIG);
  2. if the parent already died (between fork and step 1, so nobody would
     ever send that signal), leave at once;
  3. enter the network namespace open at NETNS_FD, if any (a namespace must
     be entered before any thread exists: threads keep the one they started in);
then `exec` the command, which keeps the parent-death signal and the pid.

Run by path with `-I -S` (no site, no environment, no tfps import), so it
starts in ~20 ms; the command gets the environment it was given.
"""

import ctypes
import os
import sys

_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000
_SIGKILL = 9
# Exit codes of the launcher itself (the command's own codes come after exec).
PARENT_GONE = 125
SETUP_FAILED = 126
NOT_FOUND = 127


def main(argv: list[str]) -> int:
  if len(argv) < 5 or argv[3] != "--":
    sys.stderr.write("usage: launcher.py PARENT_PID NETNS_FD|- -- COMMAND [ARG ...]\n")
    return SETUP_FAILED
  parent, netns, command = int(argv[1]), argv[2], argv[4:]
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0) != 0:
    sys.stderr.write(f"launcher: prctl(PR_SET_PDEATHSIG): {os.strerror(ctypes.get_errno())}\n")
    return SETUP_FAILED
  if os.getppid() != parent:
    return PARENT_GONE  # Our parent is gone: nobody wants what we would start.
  if netns != "-":
    fd = int(netns)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
      sys.stderr.write(f"launcher: setns(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}\n")
      return SETUP_FAILED
    os.close(fd)  # The command has no use for it.
  try:
    os.execvp(command[0], command)
  except OSError as e:
    sys.stderr.write(f"launcher: cannot run {command[0]!r}: {e.strerror}\n")
  return NOT_FOUND


if __name__ == "__main__":
  sys.exit(main(sys.argv))
