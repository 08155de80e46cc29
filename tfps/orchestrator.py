"""What an orchestrator (Kubernetes, systemd) does for a local cluster.

`tfps local` and `tfps chaos` both run the cluster through `Orchestrator`:
a ps or worker that exits is started again at the same address (unless the
chaos schedule holds it down); a chief that exits with a retryable code
(>= 128, or killed by a signal) is started again within a restart budget; a
permanent exit (1, 2) ends the run with that code. `poll` does one round and
never blocks, so callers interleave their own work (fault injection).
"""

import dataclasses
import signal

from absl import logging

from tfps.cluster import local
from tfps.cluster import spec as spec_lib
from tfps.base import errors
from tfps.base import signals


@dataclasses.dataclass(frozen=True)
class Outcome:
  code: errors.ExitCode
  reason: str


class Orchestrator:
  def __init__(self, cluster: local.LocalCluster, chief: local.TaskHandle,
               stop: signals.StopSignals, *, max_restarts: int,
               chief_stop_grace: float = 60.0):
    if max_restarts < 0:
      raise errors.UsageError(f"max_restarts ({max_restarts}) must be >= 0")
    self.cluster = cluster
    self.chief = chief
    self._stop = stop
    self._max_restarts = max_restarts
    self._chief_stop_grace = chief_stop_grace
    self.held: set[spec_lib.TaskId] = set()  # Down on purpose: not restarted.
    self.chief_restarts = 0
    self.task_restarts = 0

  def start(self) -> None:
    self.chief.start()

  def poll(self) -> Outcome | None:
    """One round: restart what died; returns the outcome once the chief is done."""
    if self._stop.requested:
      return self._stop_chief()
    for task, handle in self.cluster.tasks.items():
      if handle is self.chief or task in self.held or handle.alive:
        continue
      logging.warning("%s exited with code %s; starting it again at %s",
                      task, handle.returncode, handle.address)
      handle.start()
      self.task_restarts += 1
    code = self.chief.returncode
    if code is None or self.chief.task in self.held:
      return None
    if code == 0:
      return Outcome(errors.ExitCode.OK, "finished")
    if 0 < code < 128:
      logging.error("chief failed permanently (exit code %d); not restarting. Log: %s",
                    code, self.chief.log_path)
      return Outcome(errors.ExitCode.USAGE if code == 2 else errors.ExitCode.PERMANENT,
                     f"chief exited with code {code}")
    if self.chief_restarts >= self._max_restarts:
      reason = (f"chief exited with code {code} and the restart budget "
                f"({self._max_restarts}) is spent")
      logging.error("%s", reason)
      return Outcome(errors.ExitCode.PERMANENT, reason)
    self.chief_restarts += 1
    logging.warning("chief exited with retryable code %d; restart %d of %d",
                    code, self.chief_restarts, self._max_restarts)
    self.chief.start()
    return None

  def _stop_chief(self) -> Outcome:
    name = signal.Signals(self._stop.signum).name
    logging.warning("%s: stopping the chief (it saves a checkpoint first)", name)
    self.chief.kill(signal.SIGTERM)
    try:
      self.chief.wait(self._chief_stop_grace)
    except TimeoutError:
      logging.error("chief did not stop within %.0fs of %s", self._chief_stop_grace, name)
    return Outcome(errors.exit_code_for_signal(self._stop.signum), f"stopped by {name}")
