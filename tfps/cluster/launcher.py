"""The first program of every child tfps starts: ties it to its parent, then execs it.

    python -I -S launcher.py PARENT_PID NETNS_FD|- HOSTS_FILE|- -- COMMAND [ARG ...]

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
  4. with HOSTS_FILE, see it as /etc/hosts: a mount namespace of its own
     (private, so nothing leaks back to the machine's) with the file bound
     over /etc/hosts, so that names resolve as on the virtual hosts' network;
then `exec` the command, which keeps the parent-death signal, the namespaces
and the pid.

Run by path with `-I -S` (no site, no environment, no tfps import), so it
starts in ~20 ms; the command gets the environment it was given.
"""

import ctypes
import os
import sys

_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_SIGKILL = 9
# Exit codes of the launcher itself (the command's own codes come after exec).
PARENT_GONE = 125
SETUP_FAILED = 126
NOT_FOUND = 127


def main(argv: list[str]) -> int:
  if len(argv) < 6 or argv[4] != "--":
    sys.stderr.write("usage: launcher.py PARENT_PID NETNS_FD|- HOSTS_FILE|- -- COMMAND [ARG ...]\n")
    return SETUP_FAILED
  parent, netns, hosts_file, command = int(argv[1]), argv[2], argv[3], argv[5:]
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
  if hosts_file != "-" and not _bind_hosts_file(libc, hosts_file):
    return SETUP_FAILED
  try:
    os.execvp(command[0], command)
  except OSError as e:
    sys.stderr.write(f"launcher: cannot run {command[0]!r}: {e.strerror}\n")
  return NOT_FOUND


def _bind_hosts_file(libc, path: str) -> bool:
  steps = (("unshare(CLONE_NEWNS)", lambda: libc.unshare(_CLONE_NEWNS)),
           ("mount --make-rprivate /",
            lambda: libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None)),
           (f"mount --bind {path} /etc/hosts",
            lambda: libc.mount(path.encode(), b"/etc/hosts", None, _MS_BIND, None)))
  for what, step in steps:
    if step() != 0:
      sys.stderr.write(f"launcher: {what}: {os.strerror(ctypes.get_errno())}\n")
      return False
  return True


if __name__ == "__main__":
  sys.exit(main(sys.argv))
