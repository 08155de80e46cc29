"""The trace-ahead process: the closures' traces stored before a coordinator needs them.

Writing the full-size closures out stops training while the chief traces
them (~4-5 s of Python for the ctr on 2 cores) and the workers instantiate
them (~5 s). A stored trace (`coordinator.trace_cache`) leaves only the
instantiation, but it is stored by the first coordinator that writes out,
and each cluster layout has its own: the run's first write-out on every ps,
and the first on one ps less after a ps failover, traced while training
waited (docs/recovery.md "Trace ahead").

So once the first coordinator trains, the chief's supervisor runs one
process per layout (every ps; one ps less where ps failover is on), one
after the other: `tfps run` with `ENV_VAR` set to the layout's ps count,
at idle scheduling priority (it gets only CPU time no task of the cluster
wants: ~15 % of this host while training). It starts an in-process cluster
of that shape, builds the experiment on it, traces and stores the closures
(`coordinator.run.store_traces`), and exits. A coordinator that finds them
stored writes out sooner and at the stored price (`closure_plan.STORED`).

Pure plumbing, no TensorFlow.
"""

import os
import subprocess
from typing import Callable, Mapping, Sequence

from absl import logging

from tfps.cluster import processes

# Set in a trace-ahead process's environment: the number of ps of the layout it traces.
ENV_VAR = "TFPS_TRACE_AHEAD"


def layouts(num_ps: int, ps_failover: bool) -> tuple[int, ...]:
  """The ps counts a run's coordinators train on: all, and one less after a failover."""
  return (num_ps, num_ps - 1) if ps_failover and num_ps > 1 else (num_ps,)


class TraceAhead:
  """Runs `command()` once per layout in `num_ps`, one process at a time."""

  def __init__(self, command: Callable[[], Sequence[str]], *, env: Mapping[str, str],
               num_ps: Sequence[int], stdout_dir: str,
               spawn: Callable[..., subprocess.Popen] = processes.spawn):
    self._command = command
    self._env = dict(env)
    self._pending = list(num_ps)
    self._stdout_dir = stdout_dir
    self._spawn = spawn
    self._running: tuple[subprocess.Popen, int] | None = None

  @property
  def done(self) -> bool:
    """Every layout's process has ended."""
    return not self._pending and self._running is None

  def advance(self) -> None:
    """Starts the next layout's process once the one before has ended (never blocks)."""
    if self._running is not None:
      process, num_ps = self._running
      code = process.poll()
      if code is None:
        return
      self._running = None
      if code != 0:  # Its own log line says why; training goes on without it.
        logging.warning("trace ahead for %d ps exited with code %d", num_ps, code)
    if not self._pending:
      return
    num_ps = self._pending.pop(0)
    path = os.path.join(self._stdout_dir, f"trace-ahead-{num_ps}ps.stdout")
    with open(path, "w", encoding="utf-8") as out:
      process = self._spawn(self._command(), stdout=out, idle_priority=True,
                            env={**self._env, ENV_VAR: str(num_ps),
                                 "TMPDIR": self._stdout_dir})
    self._running = (process, num_ps)
    logging.info("trace ahead for %d ps started (pid %d, idle priority)", num_ps, process.pid)

  def close(self) -> None:
    """Ends the running process, if any, and starts no more."""
    self._pending.clear()
    if self._running is not None:
      processes.stop_group(self._running[0], grace=1.0)
      self._running = None
