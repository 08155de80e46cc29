"""A warm standby coordinator: the next coordinator process, ready before it is needed.

A coordinator restart (after a ps loss, or to leave a worker out or take it
back) starts a new process, and most of its first seconds go to importing
TensorFlow, tf_keras and Orbit (~5-9 s on 2 cores, measured in the chief's
log between "starting coordinator" and "connected"). The chief's supervisor
therefore keeps the *next* coordinator started and imported ahead of need,
blocked before it does anything else: on a restart it is told to go (with
the workers and ps to leave out) instead of a cold process being started.

The standby is only made once the current coordinator has trained (so it
never takes CPU from a coordinator that is still starting, and a
coordinator that fails at once, e.g. on bad input, is not shadowed by a
process that would fail the same way), one at a time. It waits on its stdin:
one JSON line `{"exclude_tasks": [...]}` says go; end of file (the
supervisor is gone) or a stop signal ends it without doing anything.

Pure plumbing, no TensorFlow: the coordinator side (`wait_for_go`) is called
by `tfps run` after it has imported what a coordinator needs.
"""

import dataclasses
import json
import os
import select
import subprocess
from typing import Callable, Sequence, TextIO

from absl import logging

from tfps.cluster import processes
from tfps.base import signals

# Set in a standby's environment: wait for the go line before coordinating.
ENV_VAR = "TFPS_STANDBY"
# How often a waiting standby looks at its stop signals.
_WAKE_SECONDS = 0.5


@dataclasses.dataclass(frozen=True)
class Go:
  """What a standby is told when it takes over."""

  exclude_tasks: tuple[str, ...] = ()


def wait_for_go(stop: signals.StopSignals, stdin: TextIO) -> Go | None:
  """Blocks until the supervisor says go; None: end of file or a stop signal."""
  while not stop.requested:
    if not select.select([stdin], [], [], _WAKE_SECONDS)[0]:
      continue
    line = stdin.readline()
    if not line:
      return None  # The supervisor is gone (or closed us): nothing to do.
    return Go(exclude_tasks=tuple(json.loads(line)["exclude_tasks"]))
  return None


class WarmCoordinators:
  """Starts coordinator processes for the supervisor, the next one kept warm.

  `command(excluded)` is the command line of a coordinator that leaves the
  tasks `excluded` out (`tfps run` writes them into the run spec file it
  names); a standby is started with `command(())` and told whom to leave out
  in its go line. Every process writes its
  stdout to its own file in `stdout_dir`; `stdout_path` is the current one's.
  Their temporary files go there too (`TMPDIR`): each coordinator keeps them
  in its own scratch directory, which the next one removes if it was killed
  (`cluster.scratch`), and the chief removes `stdout_dir` when it ends.
  """

  def __init__(self, command: Callable[[tuple[str, ...]], Sequence[str]], *, env: dict,
               stdout_dir: str, warm: bool,
               spawn: Callable[..., subprocess.Popen] = processes.spawn):
    self._command = command
    self._env = env
    self._stdout_dir = stdout_dir
    self._warm = warm
    self._spawn = spawn
    self._count = 0
    self._standby: tuple[subprocess.Popen, str] | None = None
    self.stdout_path: str | None = None

  @property
  def standby(self) -> tuple[subprocess.Popen, str] | None:
    """The prepared standby (its process and stdout file), if there is one."""
    return self._standby

  def _new(self, argv: Sequence[str], env: dict, stdin) -> tuple[subprocess.Popen, str]:
    self._count += 1
    path = os.path.join(self._stdout_dir, f"coordinator-{self._count}.stdout")
    with open(path, "w", encoding="utf-8") as out:
      return self._spawn(argv, stdout=out, env={**env, "TMPDIR": self._stdout_dir},
                         stdin=stdin), path

  def start(self, excluded: Sequence[str]) -> tuple[subprocess.Popen, bool]:
    """The coordinator that runs next, and whether it was the warm standby."""
    excluded = tuple(sorted(excluded))
    if self._standby is not None:
      process, path = self._standby
      self._standby = None
      if process.poll() is None:
        try:
          process.stdin.write((json.dumps({"exclude_tasks": list(excluded)}) + "\n").encode())
          process.stdin.close()
          self.stdout_path = path
          return process, True
        except (BrokenPipeError, OSError):
          pass  # It died in between: start a cold one instead.
      processes.stop_group(process, grace=0)
    process, self.stdout_path = self._new(self._command(excluded), self._env, subprocess.DEVNULL)
    return process, False

  def prepare(self) -> None:
    """Starts the standby, if warm standbys are on and there is none."""
    if not self._warm or (self._standby is not None and self._standby[0].poll() is None):
      return
    self._standby = self._new(self._command(()), {**self._env, ENV_VAR: "1"}, subprocess.PIPE)
    logging.info("warm standby coordinator started (pid %d)", self._standby[0].pid)

  def close(self) -> None:
    """Ends the standby, if any (closing its stdin tells it so; then the signal)."""
    if self._standby is None:
      return
    process, _ = self._standby
    self._standby = None
    try:
      process.stdin.close()
      process.wait(timeout=1.0)  # Waiting on its stdin, it leaves at once.
    except (OSError, subprocess.TimeoutExpired):
      pass  # Still importing: the signal (it records it and leaves after).
    processes.stop_group(process, grace=5.0)
