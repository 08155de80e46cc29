"""The coordinator's deadline on its parameter servers.

A ps that dies refuses connections, and TF raises UnavailableError to the
next call that touches it: but only once the coordinator's main thread gets
there, which can be seconds later (it may be tracing a closure, or joining
closures that wait for a warm-up), and a ps that comes back at once holds
none of its variables and raises nothing until one is read. A ps cut off by a
network partition, or a chief cut off from everyone, refuses nothing: its
packets are dropped, TCP retransmits for many minutes, and TF's RPCs wait
all that time, and `join()` and checkpoint saves with them (measured on
virtual hosts: docs/partitions.md). Training would stall without a word.

While TensorFlow connects (`connecting`), which waits for every task it was
given with no deadline, the workers are held to the same rules as the ps.

`PsDeadline` is a thread that probes every ps (and, to say what happened,
every worker) on gRPC from the chief's own network, every `interval`
seconds (the next round after `RECHECK_SECONDS` when a task refused). A ps
is lost when it has not answered for `timeout` seconds in a row (silent:
partitioned or hung), when it refused connections in
`refusals` rounds in a row (its process is gone: `recovery.overdue`), or
when it answers but no longer holds its sentinel variable (it came back
empty: `state_lost`). Then: one line on stderr and in the exit report
(which the supervisor puts in the event log), and the process ends at once
with exit 170
(`os._exit`: the main thread is stuck inside TF and cannot be unwound; what
matters is on disk already: the checkpoints, and the progress and event
logs, written a line at a time). The supervisor then waits for the cluster
and restarts the coordinator from the latest checkpoint, as after any ps
loss; a partitioned chief thus recovers like a lost chief once it is healed.
"""

import os
import sys
import threading
import time
from typing import Callable

from absl import logging

from tfps.cluster import readiness
from tfps.cluster import spec as spec_lib
from tfps.base import errors
from tfps.recovery import exit_report
from tfps.recovery import overdue as overdue_lib
from tfps.recovery import policy

# One probe round waits this long per task (in parallel); rounds repeat at
# `interval`. A busy but live ps answers a channel handshake well within it.
_PROBE_SECONDS = 2.0
# After a round in which a task refused, the next comes this soon instead:
# one refusal is a blip until the next round says otherwise, and a ps kill
# is then a loss ~0.2 s after the first refusal instead of a whole interval.
RECHECK_SECONDS = 0.2
# Rounds repeat this often. A round costs a channel handshake per task and a
# sentinel read per ps (milliseconds, off the main thread); a ps killed just
# after a round is seen up to this much later (a loss in a coordinator's
# first minute: 0.4-1.3 s of ~6 s at 1 s).
INTERVAL_SECONDS = 0.5


def _exit_lost(message: str, kind: policy.FailureKind = policy.FailureKind.PS_LOST) -> None:
  """Ends this process at once with the retryable 'lost the cluster' code."""
  # The supervisor puts this in the event log; stderr may lose the line, as
  # its filter thread dies with the process.
  exit_report.write(kind.value, message)
  sys.stderr.write(f"tfps: error: {message}\n")
  sys.stderr.flush()
  logging.flush()
  os._exit(int(errors.ExitCode.CLUSTER_LOST))


class PsDeadline:
  """A daemon thread holding the coordinator to `timeout` (see module docstring).

  Use as a context manager around the part of the run that talks to the
  cluster. `probe` and `on_overdue` are replaceable for tests.
  """

  def __init__(self, cluster: spec_lib.ClusterSpec, timeout: float, *,
               interval: float = INTERVAL_SECONDS, refusals: int = 2,
               probe: Callable[[list[spec_lib.TaskId]], dict] | None = None,
               state_lost: Callable[[spec_lib.TaskId], str | None] | None = None,
               on_overdue: Callable[[str], None] | None = None,
               clock: Callable[[], float] = time.monotonic, connecting: bool = False):
    """`probe(tasks)`: each task's `readiness.Answer`; `state_lost(ps)`: why an
    answering ps no longer holds its state (None: it does). `connecting`: around
    TensorFlow's connect, which waits for every task it was given with no deadline
    (a worker killed in the middle of it held a coordinator ~20 s, until its
    supervisor killed it): the workers are held to it too, and the restart that
    follows leaves a worker that does not come back out."""
    self._cluster = cluster
    self._ps = [t for t in cluster.tasks() if t.job == spec_lib.JobType.PS]
    self._workers = [t for t in cluster.tasks() if t.job == spec_lib.JobType.WORKER]
    held = self._ps + self._workers if connecting else self._ps
    self._connecting = connecting
    self._overdue = overdue_lib.Overdue(held, timeout)
    self._refusals = overdue_lib.Refusals(held, refusals)
    self._state_lost = state_lost or (lambda task: None)
    self._interval = interval
    self._probe = probe or (lambda tasks: readiness.answers(cluster, tasks, _PROBE_SECONDS))
    self._on_overdue = on_overdue or (
        (lambda message: _exit_lost(message, policy.FailureKind.CLUSTER_UNREACHABLE))
        if connecting else _exit_lost)
    self._clock = clock
    self._stopped = threading.Event()
    self._thread = threading.Thread(target=self._run, name="ps-deadline", daemon=True)

  def __enter__(self) -> "PsDeadline":
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stopped.set()
    self._thread.join(timeout=_PROBE_SECONDS + self._interval + 1)

  def _run(self) -> None:
    wait = 0.0  # The first round at once: a ps lost during the start is seen as early.
    while not self._stopped.wait(wait):
      answers = self._probe(self._ps + self._workers)
      if self._stopped.is_set():
        return  # The run ended while we probed: nothing to judge.
      reachable = {t for t, a in answers.items() if a == readiness.Answer.READY}
      overdue = self._overdue.update(reachable, self._clock())
      if overdue:
        self._on_overdue(self._message(overdue, reachable))
        return
      refused = {t for t, a in answers.items() if a == readiness.Answer.REFUSED}
      gone = self._refusals.update(refused)
      wait = min(self._interval, RECHECK_SECONDS) if refused else self._interval
      if gone:
        names = ", ".join(f"{t} ({self._cluster.address(t)})" for t in gone)
        # A chief whose own link is down gets every connection refused at
        # once (no route): that is this chief cut off, not the ps gone.
        why = ("no ps and no worker answers: this chief is cut off from the cluster"
               if not reachable else "its process is gone" if self._connecting
               else "its process is gone, and its variables with it")
        if self._connecting:
          why += "; TensorFlow's connect would wait for it"
        self._on_overdue(
            f"lost the cluster: {names} refused connections {self._refusals.rounds} times in "
            f"a row ({why}); exiting {int(errors.ExitCode.CLUSTER_LOST)} to restart from the "
            "latest checkpoint")
        return
      for task in (t for t in self._ps if t in reachable):
        why = self._state_lost(task)
        if why is not None:
          self._on_overdue(f"lost the cluster: {why}; exiting "
                           f"{int(errors.ExitCode.CLUSTER_LOST)} to restart from the latest "
                           "checkpoint")
          return

  def _message(self, overdue: list[spec_lib.TaskId], reachable: set) -> str:
    names = ", ".join(f"{t} ({self._cluster.address(t)})" for t in overdue)
    if not reachable:
      why = "no ps and no worker answers: this chief is cut off from the cluster"
    else:
      why = "partitioned or hung; TF would wait for it for many minutes"
    return (f"lost the cluster: {names} did not answer for {self._overdue.timeout:.0f}s "
            f"({why}); exiting {int(errors.ExitCode.CLUSTER_LOST)} to restart from the "
            "latest checkpoint")
