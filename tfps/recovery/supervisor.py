"""The chief's supervisor: runs the coordinator as a child process, brings it back.

Why a child process: after a ps is lost, its variables are gone and TF's
in-process cluster state cannot be rebuilt; a *new coordinator process*
against the live servers can (docs/tensorflow-behaviour.md). So `tfps run` on the chief is a
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

The coordinator holds itself to a deadline on its ps (`coordinator.ps_deadline`):
a ps that stops answering makes it exit 170. That deadline is a thread inside
a TensorFlow process, and a process can stop running Python altogether (a
C++ call holding the interpreter lock while it waits on the network, a
deadlock in a gRPC library). So the supervisor, a separate process without
TensorFlow, keeps the same deadline from outside with a margin
(`ps_deadline_seconds`): when a ps it probes has been silent that long and
the coordinator is still running, it asks the coordinator for its thread
stacks (SIGUSR1, written to the chief's log), kills it and records a ps loss,
as if the coordinator had exited 170 itself. Training never hangs on a
coordinator that missed its own deadline.
"""

import dataclasses
import signal
import subprocess
import time
from typing import Callable, Mapping

from absl import logging

from tfps.cluster import spec as spec_lib
from tfps.base import errors
from tfps.recovery import events as events_lib
from tfps.recovery import exit_report as exit_report_lib
from tfps.recovery import overdue as overdue_lib
from tfps.recovery import policy as policy_lib
from tfps.base import signals
from tfps.recovery import worker_watch

Kind = policy_lib.FailureKind
Action = policy_lib.Action

_POLL_SECONDS = 0.5
# How long a coordinator that missed its ps deadline gets to write its
# thread stacks (SIGUSR1) before it is killed.
_STACKS_SECONDS = 1.0


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
    probe_seconds: how often the ps and workers are probed (worker watch,
      ps deadline).
    ps_deadline_seconds: seconds a ps may stay silent, as the supervisor sees
      it, while the coordinator runs; past it the supervisor ends the
      coordinator itself (see the module docstring). None: no such deadline.
  """

  policy: policy_lib.RestartPolicy = policy_lib.RestartPolicy()
  cluster_wait_seconds: float = 600.0
  stop_grace_seconds: float = 60.0
  probe_seconds: float = 2.0
  ps_deadline_seconds: float | None = None

  def __post_init__(self):
    for field in ("cluster_wait_seconds", "stop_grace_seconds", "probe_seconds"):
      if getattr(self, field) <= 0:
        raise errors.UsageError(f"{field} ({getattr(self, field)}) must be positive")
    if self.ps_deadline_seconds is not None and not self.ps_deadline_seconds > 0:
      raise errors.UsageError(
          f"ps_deadline_seconds ({self.ps_deadline_seconds}) must be positive or None")


@dataclasses.dataclass(frozen=True)
class _Ended:
  """How a coordinator process ended, as `Supervisor._wait` saw it.

  `change`: the cluster change we stopped it for; `lost`: why we killed it
  for missing its ps deadline (a ps loss). Both None: it exited by itself.
  """

  code: int
  change: tuple | None = None
  lost: str | None = None


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
               probe_servers: Callable[[], set] | None = None,
               ps_addresses: Mapping[spec_lib.TaskId, str] | None = None,
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
      watch, probe_servers: optional; every `probe_seconds` the reachable
        ps and workers (`probe_servers()`) go to `watch`, which says when to
        leave a worker out and when to take it back.
      ps_addresses: the ps (with their addresses) held to
        `ps_deadline_seconds`, judged from the same probes.
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
    self._probe_servers = probe_servers
    self._ps_addresses = dict(ps_addresses or {})
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
      ended = self._wait(process, restart_times)
      code, change = ended.code, ended.change
      if self._stop.requested:
        reason = f"stopped by {signal.Signals(self._stop.signum).name}"
        return SupervisorResult(errors.exit_code_for_signal(self._stop.signum),
                                len(restart_times), reason)
      attempt += 1
      if change is not None:
        # We stopped it (it saved) to change its cluster: not a failure.
        what, worker = change
        preposition = "without" if what == worker_watch.Change.GONE else "with"
        left_out = tuple(sorted(map(str, self.excluded)))
        self._events.append(events_lib.Event(
            kind="recovered", task=str(worker), worker_change=what.value,
            workers_left_out=left_out, detail=
            f"coordinator restarting {preposition} {worker}; "
            f"workers left out: {', '.join(left_out) or 'none'}"))
        continue
      report = self._exit_report()
      if self._trained():
        self._progress_at = self._clock()  # Not a crash loop: older restarts are forgiven.
      if ended.lost is not None:
        kind = Kind.PS_LOST
        detail = (f"coordinator exited with code {code}: {report.message}" if report
                  else f"coordinator stopped by the supervisor: {ended.lost}")
      else:
        kind = classify_exit(code, report.failure if report else None)
        detail = f"coordinator exited with code {code}" + (f": {report.message}" if report else "")
      if kind is None:
        return SupervisorResult(errors.ExitCode.OK, len(restart_times), "finished")
      now = self._clock()
      decision = self._config.policy.decide(kind, self._unproductive(restart_times), now)
      self._record("chief:0", kind, decision, detail)
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

  def _wait(self, process: subprocess.Popen, restart_times: list[float]) -> _Ended:
    """Waits for the coordinator to exit; says how it ended (`_Ended`).

    Passes a stop signal on once. When the worker watch asks for a change of
    cluster, asks the coordinator to save and stop (SIGTERM) and returns the
    change once it has exited. A coordinator still running past the ps
    deadline is killed (`_end_overdue`).
    """
    stop_deadline = None
    change = None
    ps_silence = (overdue_lib.Overdue(self._ps_addresses, self._config.ps_deadline_seconds,
                                      name="ps_deadline_seconds")
                  if self._ps_addresses and self._config.ps_deadline_seconds else None)
    next_probe = self._clock() + self._config.probe_seconds
    while True:
      try:
        return _Ended(process.wait(timeout=_POLL_SECONDS), change)
      except subprocess.TimeoutExpired:
        pass
      now = self._clock()
      if stop_deadline is None and self._stop.requested:
        logging.warning("passing %s to the coordinator (pid %d); it saves, then exits",
                        signal.Signals(self._stop.signum).name, process.pid)
        process.send_signal(self._stop.signum)
        stop_deadline = now + self._config.stop_grace_seconds
      if stop_deadline is None:
        self._on_poll()
      if stop_deadline is None and self._probe_servers is not None and now >= next_probe:
        next_probe = now + self._config.probe_seconds
        reachable = self._probe_servers()
        silent = ps_silence.update(reachable, now) if ps_silence is not None else []
        if silent:
          return self._end_overdue(process, silent, ps_silence, now, reachable)
        change = self._watched_change(reachable, now, restart_times)
        if change is not None:
          process.send_signal(signal.SIGTERM)  # Save, then exit: we restart it.
          stop_deadline = now + self._config.stop_grace_seconds
      if stop_deadline is not None and now > stop_deadline:
        logging.error("coordinator did not exit %.0fs after SIGTERM; killing it",
                      self._config.stop_grace_seconds)
        process.kill()
        return _Ended(process.wait(timeout=10), change)

  def _end_overdue(self, process: subprocess.Popen, silent: list, ps_silence, now: float,
                   reachable: set) -> _Ended:
    """Kills a coordinator still running past the ps deadline: a ps loss."""
    names = ", ".join(f"{t} ({self._ps_addresses[t]}) did not answer for "
                      f"{ps_silence.silent_for(t, now):.0f}s" for t in silent)
    if not reachable:
      names += " (no ps and no worker answers: this chief is cut off from the cluster)"
    logging.error("%s, and the coordinator (pid %d) has not exited by itself: "
                  "asking it for its thread stacks, then killing it", names, process.pid)
    try:
      process.send_signal(signal.SIGUSR1)  # `tfps run` writes every thread's stack.
      process.wait(timeout=_STACKS_SECONDS)
    except subprocess.TimeoutExpired:
      pass
    if process.poll() is None:
      process.kill()
    return _Ended(process.wait(timeout=10), lost=(
        f"lost the cluster: {names}, and the coordinator had not exited by itself (missed its "
        "own ps deadline): killed it, its thread stacks are in the chief's log"))

  def _watched_change(self, reachable: set, now: float, restart_times: list[float]):
    """The first cluster change the worker watch asks for, applied to `excluded`."""
    if self._watch is None:
      return None
    for what, worker in self._watch.update(reachable, self.excluded, now):
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
