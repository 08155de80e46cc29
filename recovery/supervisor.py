"""The chief's supervisor: runs the coordinator as a child process, brings it back.

Why a child process: after a ps is lost, its variables are gone and TF's
in-process cluster state cannot be rebuilt; a *new coordinator process*
against the live servers can (FIELD_NOTES). So `tfps run` on the chief is a
small supervisor that starts the coordinator, reads how it ended from its
exit code (set by exception *type*, see `errors`), asks the pure
`RestartPolicy` what to do, and does it:

  coordinator exit          failure kind          usual action
  0                         -                     done
  2 (usage)                 BAD_CONFIG            give up, exit 2
  1 (permanent)             USER_ERROR            give up, exit 1
  170 (lost ps / cluster)   PS_LOST               wait for the cluster, restart
  killed by a signal        CHIEF_LOST            wait for the cluster, restart
  other                     CLUSTER_UNREACHABLE   wait for the cluster, restart

It also watches the workers (`worker_watch`): one unreachable for longer
than the timeout is left out (the coordinator is asked to save and stop with
SIGTERM, then restarted on the cluster without it), and taken back the same
way once it answers again, so no single lost worker can stall training in
TF's hour-long wait.

A SIGTERM/SIGINT to the supervisor is passed to the coordinator, which saves
and exits; the supervisor then exits 143/130 without restarting. Waiting for
the cluster has a deadline; past it the supervisor exits 170 so that the
orchestrator (Kubernetes, systemd) retries later. Every failure, action and
recovery goes to the event log.
"""

import dataclasses
import signal
import subprocess
import time
from typing import Callable

from absl import logging

from recovery import errors
from recovery import events as events_lib
from recovery import exit_report as exit_report_lib
from recovery import policy as policy_lib
from recovery import signals
from recovery import worker_watch

Kind = policy_lib.FailureKind
Action = policy_lib.Action

_POLL_SECONDS = 0.5


def classify_exit(code: int, reported: str | None = None) -> Kind | None:
  """The failure a coordinator exit code means; None when it finished.

  `reported` is the kind the coordinator wrote in its exit report; it only
  refines a permanent exit (1) and never turns a code into another action.
  """
  if code == errors.ExitCode.OK:
    return None
  if code == errors.ExitCode.PERMANENT and reported in _PERMANENT_REPORTS:
    return Kind(reported)
  if code == errors.ExitCode.USAGE:
    return Kind.BAD_CONFIG
  if code == errors.ExitCode.CLUSTER_LOST:
    return Kind.PS_LOST
  if code < 0 or code >= 128:
    # Killed (OOM killer, SIGKILL) or stopped by a signal we did not send.
    return Kind.CHIEF_LOST
  return Kind.USER_ERROR


_PERMANENT_REPORTS = frozenset(
    k.value for k in (Kind.USER_ERROR, Kind.NAN_LOSS, Kind.BAD_CHECKPOINT))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SupervisorConfig:
  """Attributes:
    policy: what to do per failure, and the restart budget.
    cluster_wait_seconds: how long to wait for the cluster before a restart;
      past it the supervisor exits 170 (retryable).
    stop_grace_seconds: how long the coordinator gets to save and exit after
      a passed-on SIGTERM before it is killed.
    probe_seconds: how often the workers are probed for the worker watch.
  """

  policy: policy_lib.RestartPolicy = policy_lib.RestartPolicy()
  cluster_wait_seconds: float = 600.0
  stop_grace_seconds: float = 60.0
  probe_seconds: float = 2.0

  def __post_init__(self):
    for field in ("cluster_wait_seconds", "stop_grace_seconds", "probe_seconds"):
      if getattr(self, field) <= 0:
        raise errors.UsageError(f"{field} ({getattr(self, field)}) must be positive")


@dataclasses.dataclass(frozen=True)
class SupervisorResult:
  exit_code: errors.ExitCode
  restarts: int
  reason: str


class Supervisor:
  """Carries out the policy's decisions for one chief (see module docstring)."""

  def __init__(self, config: SupervisorConfig, *,
               start_coordinator: Callable[[int, frozenset], subprocess.Popen],
               wait_for_cluster: Callable[[float], None],
               event_log: events_lib.EventLog,
               stop: signals.StopSignals,
               watch: worker_watch.WorkerWatch | None = None,
               probe_workers: Callable[[], set] | None = None,
               exit_report: Callable[[], exit_report_lib.ExitReport | None] = lambda: None,
               trained: Callable[[], bool] = lambda: False,
               on_poll: Callable[[], None] = lambda: None,
               clock: Callable[[], float] = time.monotonic):
    """Args:
      start_coordinator: starts the coordinator process, given the attempt
        number and the workers to leave out of its cluster.
      wait_for_cluster: blocks until every ps/worker answers, or raises a
        `RetryableError` after the given number of seconds.
      event_log: where failures, actions and recoveries are recorded.
      stop: the supervisor's own stop signals, passed on to the coordinator.
      watch, probe_workers: optional; every `probe_seconds` the reachable
        workers (`probe_workers()`) go to `watch`, which says when to leave a
        worker out and when to take it back.
      exit_report: what the coordinator that just exited said about why
        (`recovery.exit_report`), if anything.
      trained: whether the coordinator that just exited completed a train
        loop. A crash loop is failing again and again *without progress*:
        restarts that were followed by training do not spend the budget, so
        a burst of real faults (several ps preempted in a minute) is
        recovered from, while a coordinator that dies before it trains
        still stops after `max_restarts`.
      on_poll: called every poll while a coordinator runs (the chief
        prepares the next coordinator there, `recovery.standby`).
    """
    self._config = config
    self._start = start_coordinator
    self._wait_for_cluster = wait_for_cluster
    self._events = event_log
    self._stop = stop
    self._watch = watch
    self._probe_workers = probe_workers
    self._exit_report = exit_report
    self._trained = trained
    self._on_poll = on_poll
    self._progress_at = float("-inf")  # When a coordinator last made progress.
    self._clock = clock
    self.excluded: set = set()

  def run(self) -> SupervisorResult:
    restart_times: list[float] = []
    attempt = 0
    while True:
      process = self._start(attempt, frozenset(self.excluded))
      code, change = self._wait(process, restart_times)
      if self._stop.requested:
        reason = f"stopped by {signal.Signals(self._stop.signum).name}"
        return SupervisorResult(errors.exit_code_for_signal(self._stop.signum),
                                len(restart_times), reason)
      attempt += 1
      if change is not None:
        # We stopped it (it saved) to change its cluster: not a failure.
        self._events.append(events_lib.Event(
            kind="recovered", task=str(change[1]), detail=
            f"coordinator restarting {'without' if change[0] == worker_watch.Change.GONE else 'with'}"
            f" {change[1]}; workers left out: {sorted(map(str, self.excluded)) or 'none'}"))
        continue
      report = self._exit_report()
      if self._trained():
        self._progress_at = self._clock()  # Not a crash loop: older restarts are forgiven.
      kind = classify_exit(code, report.failure if report else None)
      if kind is None:
        return SupervisorResult(errors.ExitCode.OK, len(restart_times), "finished")
      now = self._clock()
      decision = self._config.policy.decide(kind, self._unproductive(restart_times), now)
      self._record("chief:0", kind, decision, f"coordinator exited with code {code}"
                   + (f": {report.message}" if report else ""))
      if decision.action == Action.GIVE_UP:
        logging.error("coordinator exited with code %d (%s); giving up: %s",
                      code, kind.value, decision.reason)
        exit_code = errors.ExitCode.USAGE if kind == Kind.BAD_CONFIG else errors.ExitCode.PERMANENT
        return SupervisorResult(exit_code, len(restart_times), decision.reason)
      logging.warning("coordinator exited with code %d (%s): %s", code, kind.value,
                      decision.action.value)
      try:
        self._wait_for_cluster(self._config.cluster_wait_seconds)
      except errors.RetryableError as e:
        logging.error("cluster did not come back: %s", e)
        self._events.append(events_lib.Event(kind="action", task="chief:0",
                                             action=Action.GIVE_UP.value, detail=str(e)))
        return SupervisorResult(errors.ExitCode.CLUSTER_LOST, len(restart_times), str(e))
      restart_times.append(now)
      self._events.append(events_lib.Event(
          kind="recovered", task="chief:0", failure=kind.value,
          seconds_to_recover=round(self._clock() - now, 3),
          detail=f"cluster reachable; starting coordinator attempt {attempt + 1}"))

  def _wait(self, process: subprocess.Popen, restart_times: list[float]):
    """Waits for the coordinator to exit; returns (exit code, cluster change).

    Passes a stop signal on once. When the worker watch asks for a change of
    cluster, asks the coordinator to save and stop (SIGTERM) and returns the
    change once it has exited.
    """
    stop_deadline = None
    change = None
    next_probe = self._clock() + self._config.probe_seconds
    while True:
      try:
        return process.wait(timeout=_POLL_SECONDS), change
      except subprocess.TimeoutExpired:
        pass
      if stop_deadline is None:
        self._on_poll()
      now = self._clock()
      if stop_deadline is None and self._stop.requested:
        logging.warning("passing %s to the coordinator (pid %d); it saves, then exits",
                        signal.Signals(self._stop.signum).name, process.pid)
        process.send_signal(self._stop.signum)
        stop_deadline = now + self._config.stop_grace_seconds
      if stop_deadline is None and self._watch is not None and now >= next_probe:
        next_probe = now + self._config.probe_seconds
        change = self._watched_change(now, restart_times)
        if change is not None:
          process.send_signal(signal.SIGTERM)  # Save, then exit: we restart it.
          stop_deadline = now + self._config.stop_grace_seconds
      if stop_deadline is not None and now > stop_deadline:
        logging.error("coordinator did not exit %.0fs after SIGTERM; killing it",
                      self._config.stop_grace_seconds)
        process.kill()
        return process.wait(timeout=10), change

  def _watched_change(self, now: float, restart_times: list[float]):
    """The first cluster change the worker watch asks for, applied to `excluded`."""
    for what, worker in self._watch.update(self._probe_workers(), self.excluded, now):
      if what == worker_watch.Change.BACK:
        logging.warning("%s answers again: restarting the coordinator with it", worker)
        self.excluded.discard(worker)
        return what, worker
      decision = self._config.policy.decide(Kind.WORKER_GONE, self._unproductive(restart_times),
                                            now)
      self._record(str(worker), Kind.WORKER_GONE, decision,
                   f"{worker} unreachable for {self._watch.timeout:.0f}s")
      if decision.action == Action.RESTART_WITHOUT_TASK:
        logging.warning("%s unreachable for %.0fs: saving and restarting the coordinator "
                        "without it", worker, self._watch.timeout)
        restart_times.append(now)
        self.excluded.add(worker)
        return what, worker
    return None

  def _unproductive(self, restart_times: list[float]) -> list[float]:
    """The restarts that count against the budget: those since the last progress."""
    return [t for t in restart_times if t > self._progress_at]

  def _record(self, task: str, kind: Kind, decision: policy_lib.Decision, detail: str) -> None:
    self._events.append(events_lib.Event(kind="failure", task=task, failure=kind.value,
                                         detail=detail))
    self._events.append(events_lib.Event(
        kind="action", task=task, failure=kind.value, action=decision.action.value,
        detail=decision.reason))
