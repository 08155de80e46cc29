"""Scratch directories that do not outlive their owner, even one killed by SIGKILL.

A `tfps local` cluster and a supervising chief keep logs, exit reports and
the coordinators' temporary files in a scratch directory under the system's
temporary directory, removed when they end. A process killed with SIGKILL
(a chaos fault, a preempted VM's last second, a test killing the parent)
removes nothing, and a chief that is killed again and again would leave a
directory each time, with the Python files TensorFlow's AutoGraph writes for
every traced function (~20 per coordinator of the ctr).

So each scratch directory carries its owner's pid in its name
(`<prefix><pid>-<random>`), and making a new one first removes those of the
same prefix whose owner is no longer running. A pid taken again by an
unrelated process only keeps a stale directory for longer; a running owner's
directory is never touched.
"""

import os
import re
import shutil
import tempfile
from typing import Callable, Iterable


def owner_pid(name: str, prefix: str) -> int | None:
  """The pid in a scratch directory's name; None if the name is not one of `prefix`'s."""
  match = re.fullmatch(re.escape(prefix) + r"(\d+)-[^-]+", name)
  return int(match.group(1)) if match else None


def stale(names: Iterable[str], prefix: str, alive: Callable[[int], bool]) -> list[str]:
  """The names among `names` that are `prefix` scratch directories of dead owners."""
  result = []
  for name in names:
    pid = owner_pid(name, prefix)
    if pid is not None and not alive(pid):
      result.append(name)
  return sorted(result)


def pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # Another user's process: running.
  return True


def sweep(prefix: str, parent: str | None = None) -> list[str]:
  """Removes `prefix` scratch directories whose owners have died; returns their paths."""
  parent = parent or tempfile.gettempdir()
  try:
    names = os.listdir(parent)
  except OSError:
    return []
  removed = []
  for name in stale(names, prefix, pid_alive):
    path = os.path.join(parent, name)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
  return removed


class ScratchDir:
  """A `<prefix><pid>-<random>` directory, removed by `cleanup` (or by a later sweep).

      with ScratchDir("tfps-chief-") as path:
        ...
  """

  def __init__(self, prefix: str, parent: str | None = None):
    if not prefix.endswith("-"):
      raise ValueError(f"prefix ({prefix!r}) must end with '-'")
    sweep(prefix, parent)
    self.path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)

  def cleanup(self) -> None:
    shutil.rmtree(self.path, ignore_errors=True)

  def __enter__(self) -> str:
    return self.path

  def __exit__(self, *exc) -> None:
    self.cleanup()


def use_for_temporary_files(prefix: str) -> ScratchDir:
  """Points this process's temporary files (`tempfile`, so AutoGraph's too) at a scratch dir.

  For processes that leave with `os._exit` (a coordinator: TF's destructors
  can hang at interpreter shutdown), which skips the exit hooks that would
  remove those files: call `cleanup()` just before leaving. If the process is
  killed instead, the next one made with the same prefix sweeps it.
  """
  scratch = ScratchDir(prefix)
  tempfile.tempdir = scratch.path
  return scratch
