"""What an orchestrator (Kubernetes, systemd) does for a local cluster.

`tfps local` and `tfps chaos` both run the cluster through `Orchestrator`:
a ps or worker that exits is started again at the same address (unless the
chaos schedule holds it down; room for a worker that has not joined is left
empty); a chief that exits with a retryable code (>= 128, or killed by a
signal) is started again within a restart budget; a
permanent exit (1, 2) of any task ends the run with that code, as a JobSet's
pod failure policy would. Every death (`recovery.deaths`: a ps or worker
that exits, a chief killed by a signal) is an event in the event log, with
the process's last lines, before anything is restarted. With a standby chief
replica (two chiefs) each replica is restarted the same way, and the first to
end the run (0, 1, 2) ends it. Which is which, and when
the budget is spent, is the same pure policy the chief's supervisor asks
(`recovery.policy`); here the budget counts every chief restart of the run.
`poll` does one round and never blocks, so callers interleave their own work
(fault injection).
"""

import dataclasses
import math
import signal
import time

from absl import logging

from tfps.cluster import local
from tfps.cluster import spec as spec_lib
from tfps.base import errors
from tfps.base import signals
from tfps.recovery import deaths
from tfps.recovery import events
from tfps.recovery import policy


@dataclasses.dataclass(frozen=True)
class Outcome:
  code: errors.ExitCode
  reason: str


class Orchestrator:
  def __init__(self, cluster: local.LocalCluster, chief: local.TaskHandle,
               stop: signals.StopSignals, *, max_restarts: int,
               chief_stop_grace: float = 60.0, event_log: events.EventLog | None = None):
    if max_restarts < 0:
      raise errors.UsageError(f"max_restarts ({max_restarts}) must be >= 0")
    self.cluster = cluster
    self.chief = chief
    self._stop = stop
    self._policy = policy.RestartPolicy(max_restarts=max_restarts, window_seconds=math.inf)
    self._history = policy.RestartHistory()
    self._chief_stop_grace = chief_stop_grace
    self._events = event_log
    self.held: set[spec_lib.TaskId] = set()  # Down on purpose: not restarted.
    self.task_restarts = 0
    self._judged: dict[spec_lib.TaskId, int] = {}  # The start whose end was judged last.

  @property
  def chiefs(self) -> list[local.TaskHandle]:
    """The chief replicas: `chief`, and its standby if the cluster has one."""
    return [h for t, h in sorted(self.cluster.tasks.items())
            if t.job == spec_lib.JobType.CHIEF] or [self.chief]

  def start(self) -> None:
    for chief in self.chiefs:
      chief.start()

  def poll(self) -> Outcome | None:
    """One round: restart what died; returns the outcome once the chief is done."""
    if self._stop.requested:
      return self._stop_chief()
    chiefs = self.chiefs
    for task, handle in self.cluster.tasks.items():
      if handle in chiefs or handle.alive or not handle.starts:
        continue  # Not started: room for a worker that has not joined.
      self._judge(handle, serves=True)
      if task in self.held:
        continue
      if handle.returncode in (errors.ExitCode.PERMANENT, errors.ExitCode.USAGE):
        reason = f"{task} exited with code {handle.returncode} (permanent)"
        logging.error("%s; ending the run. Log: %s", reason, handle.log_path)
        return Outcome(errors.ExitCode(handle.returncode), reason)
      logging.warning("%s exited with code %s; starting it again at %s",
                      task, handle.returncode, handle.address)
      handle.start()
      self.task_restarts += 1
    for chief in chiefs:
      outcome = self._poll_chief(chief)
      if outcome is not None:
        return outcome
    return None

  def _poll_chief(self, chief: local.TaskHandle) -> Outcome | None:
    code = chief.returncode
    if code is None or not chief.starts:
      return None
    self._judge(chief, serves=False)
    if chief.task in self.held:
      return None
    kind = policy.classify_exit(code)
    if kind is None:
      return Outcome(errors.ExitCode.OK, "finished")
    now = time.monotonic()
    decision = self._policy.decide(kind, self._history, now)
    if decision.action == policy.Action.GIVE_UP:
      reason = f"{chief.task} exited with code {code}: {decision.reason}"
      logging.error("%s; not restarting. Log: %s", reason, chief.log_path)
      return Outcome(decision.exit_code, reason)
    self._history = self._history.restarted(now)
    logging.warning("%s exited with retryable code %d; restart %d of %d",
                    chief.task, code, self.chief_restarts, self._policy.max_restarts)
    chief.start()
    return None

  def _judge(self, handle: local.TaskHandle, *, serves: bool) -> None:
    """Records `handle`'s end as a death, if it is one (once per start)."""
    if self._judged.get(handle.task) == handle.starts:
      return
    self._judged[handle.task] = handle.starts
    if not deaths.is_death(handle.returncode, serves=serves):
      return
    death = deaths.Death(str(handle.task), handle.pid, handle.returncode, handle.last_lines(),
                         cause="taken down by a fault" if handle.task in self.held else "")
    logging.warning("%s", death.describe())
    if self._events is not None:
      self._events.append(death.event())

  @property
  def chief_restarts(self) -> int:
    return len(self._history.restarts)

  def _stop_chief(self) -> Outcome:
    name = signal.Signals(self._stop.signum).name
    logging.warning("%s: stopping the chief (it saves a checkpoint first)", name)
    # Every replica at once: a standby stops at once, before the active lets go.
    for chief in self.chiefs:
      chief.kill(signal.SIGTERM)
    for chief in self.chiefs:
      try:
        chief.wait(self._chief_stop_grace)
      except TimeoutError:
        logging.error("%s did not stop within %.0fs of %s", chief.task, self._chief_stop_grace,
                      name)
    return Outcome(errors.exit_code_for_signal(self._stop.signum), f"stopped by {name}")
