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

With ps failover (`policy.RestartPolicy.ps_failover`), a restart does not
wait for a ps that does not answer when it is decided: the new coordinator
runs on the ps that do, and the one left out is taken back later: once
running without it has cost as much as the restart that takes it back
(`readmission`), or at the next restart, whichever comes first.

It also watches the workers and ps (`task_watch`): a worker unreachable for
longer than the timeout is left out (the coordinator is asked to save and
stop with SIGTERM, then restarted on the cluster without it), and a left-out
worker or ps is taken back the same way once it has answered for a while, so
no single lost worker can stall training in TF's hour-long wait.

With elastic workers (`SupervisorConfig.min_workers`) the cluster spec lists
the most workers the job may have: every coordinator starts on those that
answer, once enough do, and the others join the same way a left-out worker
comes back.

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
import enum
import signal
import subprocess
import time
from typing import Callable, Mapping, Protocol

from absl import logging

from tfps.cluster import spec as spec_lib
from tfps.base import errors
from tfps.base import settings
from tfps.recovery import deaths as deaths_lib
from tfps.recovery import events as events_lib
from tfps.recovery import exit_report as exit_report_lib
from tfps.recovery import overdue as overdue_lib
from tfps.recovery import policy as policy_lib
from tfps.base import signals
from tfps.recovery import task_watch

Kind = policy_lib.FailureKind
Action = policy_lib.Action

_POLL_SECONDS = 0.5
# How long a coordinator that missed its ps deadline gets to write its
# thread stacks (SIGUSR1) before it is killed.
_STACKS_SECONDS = 1.0


class CoordinatorLauncher(Protocol):
  """How the supervisor starts coordinators and learns how each one ended."""

  def start(self, attempt: int, excluded: frozenset) -> subprocess.Popen:
    """Starts coordinator number `attempt` (from 0) on the cluster less `excluded`."""

  def idle(self) -> None:
    """Called every poll while a coordinator runs and is not being stopped
    (the chief prepares its warm standby here, `recovery.standby`)."""

  def ps_back_due(self) -> bool:
    """Whether a left-out ps that answers again is to be taken back now
    (`recovery.readmission`), judged by what the coordinators trained."""

  def exit_report(self) -> exit_report_lib.ExitReport | None:
    """What the coordinator that just exited said about why, if anything."""

  def last_lines(self) -> tuple[str, ...]:
    """The end of the output of the coordinator that just exited."""

  def trained(self) -> bool:
    """Whether the coordinator that just exited completed a train loop.

    A crash loop is failing again and again *without progress*: restarts
    followed by training do not spend the budget (`policy.RestartHistory`).
    """

  def close(self) -> None:
    """Ends whatever the launcher keeps ready (a warm standby)."""


class ClusterProbes(Protocol):
  """The ps and workers as the supervisor sees them: reachable or not."""

  ps_addresses: Mapping[spec_lib.TaskId, str]  # Held to `ps_deadline_seconds`.
  workers: tuple[spec_lib.TaskId, ...]

  def reachable(self) -> set:
    """The ps and workers that answer now (probed every `probe_seconds`)."""

  def wait_until_reachable(self, seconds: float, excluded: frozenset) -> None:
    """Blocks until every task but `excluded` answers; raises a
    `RetryableError` after `seconds`."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SupervisorConfig:
  """Attributes:
    policy: what to do per failure, and the restart budget.
    cluster_wait_seconds: how long to wait for the cluster before a restart;
      past it the supervisor exits 170 (retryable).
    stop_grace_seconds: how long the coordinator gets to save and exit after
      a passed-on SIGTERM before it is killed.
    probe_seconds: how often the ps and workers are probed (task watch,
      ps deadline).
    ps_deadline_seconds: seconds a ps may stay silent, as the supervisor sees
      it, while the coordinator runs; past it the supervisor ends the
      coordinator itself (see the module docstring). None: no such deadline.
    min_workers: elastic workers: every coordinator starts on the workers
      that answer, once at least this many do (waiting up to
      `cluster_wait_seconds`); the others join when they answer (the task
      watch takes them back). None: every worker is waited for.
  """

  policy: policy_lib.RestartPolicy = policy_lib.RestartPolicy()
  cluster_wait_seconds: float = settings.DEFAULTS["cluster_wait_seconds"]
  stop_grace_seconds: float = settings.DEFAULTS["grace_seconds"]
  probe_seconds: float = 2.0
  ps_deadline_seconds: float | None = None
  min_workers: int | None = None

  def __post_init__(self):
    for field in ("cluster_wait_seconds", "stop_grace_seconds", "probe_seconds"):
      if getattr(self, field) <= 0:
        raise errors.UsageError(f"{field} ({getattr(self, field)}) must be positive")
    if self.ps_deadline_seconds is not None and not self.ps_deadline_seconds > 0:
      raise errors.UsageError(
          f"ps_deadline_seconds ({self.ps_deadline_seconds}) must be positive or None")
    if self.min_workers is not None and self.min_workers < 1:
      raise errors.UsageError(f"min_workers ({self.min_workers}) must be >= 1")


class CoordinatorState(str, enum.Enum):
  """A supervised coordinator, as the supervisor waits for it (`Supervisor._wait`)."""

  RUNNING = "running"  # Probed; the launcher keeps its standby ready.
  STOPPING = "stopping"  # Asked to save and exit (a stop signal passed on, or a change
  #                        of cluster): given the grace period, then killed.


@dataclasses.dataclass(frozen=True)
class _Ended:
  """How a coordinator process ended, as `Supervisor._wait` saw it.

  `change`: the cluster change we stopped it for; `lost`: why we killed it
  for missing its ps deadline (a ps loss). Both None: it exited by itself.
  `killed`: why we killed it, if we did.
  """

  code: int
  change: tuple | None = None
  lost: str | None = None
  killed: str | None = None
  superseded: bool = False  # Another chief replica took the lease; we killed it.


@dataclasses.dataclass(frozen=True)
class SupervisorResult:
  exit_code: errors.ExitCode
  restarts: int
  reason: str


class Supervisor:
  """Carries out the policy's decisions for one chief (see module docstring)."""

  def __init__(self, config: SupervisorConfig, *, launcher: CoordinatorLauncher,
               cluster: ClusterProbes, event_log: events_lib.EventLog,
               stop: signals.StopSignals, watch: task_watch.TaskWatch | None = None,
               clock: Callable[[], float] = time.monotonic,
               superseded: Callable[[], bool] = lambda: False):
    """Args:
      launcher: starts the coordinators, says how each ended.
      cluster: probes the ps and workers, waits for them before a restart.
      event_log: where failures, actions and recoveries are recorded.
      stop: the supervisor's own stop signals, passed on to the coordinator.
      watch: optional; every `probe_seconds` the reachable ps and workers go
        to it, and it says when to leave a worker out and take a task back.
      clock: seconds, for the budget, the deadlines and the events.
      superseded: whether another chief replica took the lease
        (`recovery.chief_lease`): the coordinator is killed at once, nothing
        is restarted, and the run returns `SUPERSEDED`.
    """
    self._config = config
    self._launcher = launcher
    self._cluster = cluster
    self._events = event_log
    self._stop = stop
    self._watch = watch
    self._clock = clock
    self._superseded = superseded
    self._history = policy_lib.RestartHistory()
    self.excluded: set = set()

  def run(self) -> SupervisorResult:
    try:
      return self._run()
    finally:
      self._launcher.close()

  def _run(self) -> SupervisorResult:
    attempt = 0
    if self._config.min_workers is not None:
      given_up = self._start_on_answering_workers()
      if given_up is not None:
        return given_up
    while True:
      if self._superseded():
        return self._superseded_result()
      process = self._launcher.start(attempt, frozenset(self.excluded))
      ended = self._wait(process)
      restarts = len(self._history.restarts)
      if ended.superseded or ended.code == errors.ExitCode.SUPERSEDED:
        return self._superseded_result()
      if self._stop.requested:
        reason = f"stopped by {signal.Signals(self._stop.signum).name}"
        return SupervisorResult(errors.exit_code_for_signal(self._stop.signum), restarts, reason)
      attempt += 1
      if ended.change is not None:
        self._record_change(*ended.change)  # It saved; we stopped it: not a failure.
        continue
      kind, detail = self._judge(process, ended)
      if kind is None:
        return SupervisorResult(errors.ExitCode.OK, restarts, "finished")
      given_up = self._restart_after(kind, detail, ended.code, attempt)
      if given_up is not None:
        return dataclasses.replace(given_up, restarts=restarts)

  def _superseded_result(self) -> SupervisorResult:
    reason = "the other chief replica took the lease: this one stands by"
    logging.warning("%s", reason)
    return SupervisorResult(errors.ExitCode.SUPERSEDED, len(self._history.restarts), reason)

  def _record_change(self, what: task_watch.Change, task) -> None:
    """A coordinator stopped to change its cluster (a worker or ps left out or taken back)."""
    preposition = "without" if what == task_watch.Change.GONE else "with"
    left_out = tuple(sorted(map(str, self.excluded)))
    self._events.append(events_lib.Event(
        kind="recovered", task=str(task), task_change=what.value,
        tasks_left_out=left_out, detail=
        f"coordinator restarting {preposition} {task}; "
        f"tasks left out: {', '.join(left_out) or 'none'}"))

  def _judge(self, process: subprocess.Popen, ended: _Ended
             ) -> tuple[policy_lib.FailureKind | None, str]:
    """What the coordinator's end means (None: finished), and its one line; a death is
    recorded, and progress forgives earlier restarts."""
    code = ended.code
    report = self._launcher.exit_report()
    if deaths_lib.is_death(code, serves=False):
      death = deaths_lib.Death("coordinator", process.pid, code, self._launcher.last_lines(),
                               cause=ended.killed or "")
      logging.error("%s", death.describe())
      self._events.append(death.event())
    if self._launcher.trained():
      self._history = self._history.progressed(self._clock())
    if ended.lost is not None:
      return Kind.PS_LOST, (f"coordinator exited with code {code}: {report.message}" if report
                            else f"coordinator stopped by the supervisor: {ended.lost}")
    kind = policy_lib.classify_exit(code, report.failure if report else None)
    return kind, f"coordinator exited with code {code}" + (f": {report.message}" if report
                                                            else "")

  def _restart_after(self, kind: policy_lib.FailureKind, detail: str, code: int,
                     attempt: int) -> SupervisorResult | None:
    """Decides and prepares the restart after a failure of `kind`: waits for the
    cluster it needs. A result when the run ends instead (restarts not filled in)."""
    now = self._clock()
    ps = frozenset(self._cluster.ps_addresses)
    ps_down = (ps - self._cluster.reachable() if self._config.policy.ps_failover
               else frozenset())
    decision = self._config.policy.decide(kind, self._history, now, ps=ps, ps_down=ps_down)
    self._record("chief:0", kind, decision, detail)
    if decision.action == Action.GIVE_UP:
      logging.error("coordinator exited with code %d (%s); giving up: %s",
                    code, kind.value, decision.reason)
      return SupervisorResult(decision.exit_code, 0, decision.reason)
    logging.warning("coordinator exited with code %d (%s): %s", code, kind.value,
                    decision.reason)
    # Every ps that answers is in the new coordinator's cluster (a ps left
    # out before is taken back here), but those the decision leaves out.
    self.excluded = {t for t in self.excluded if t not in ps} | set(decision.leave_out)
    if self._config.min_workers is not None:
      given_up = self._start_on_answering_workers()
      if given_up is not None:
        return given_up
    try:
      # Left-out workers are not waited for: the watch takes them back.
      self._cluster.wait_until_reachable(self._config.cluster_wait_seconds,
                                         frozenset(self.excluded))
    except errors.RetryableError as e:
      logging.error("cluster did not come back: %s", e)
      self._events.append(events_lib.Event(kind="action", task="chief:0",
                                           action=Action.GIVE_UP.value, detail=str(e)))
      return SupervisorResult(errors.ExitCode.CLUSTER_LOST, 0, str(e))
    self._history = self._history.restarted(now)
    without = sorted(map(str, self.excluded))
    self._events.append(events_lib.Event(
        kind="recovered", task="chief:0", failure=kind.value,
        seconds_to_recover=round(self._clock() - now, 3),
        detail=f"cluster reachable; starting coordinator attempt {attempt + 1}"
               + (f" without {', '.join(without)}" if without else "")))
    return None

  def _start_on_answering_workers(self) -> SupervisorResult | None:
    """Elastic workers: the next coordinator's workers are those that answer now.

    Waits (saying so once a minute) until `min_workers` answer; past
    `cluster_wait_seconds` the run ends retryable (170), as any wait for the
    cluster does. The workers left out join when they answer (task watch).
    A result when the run ends instead (restarts not filled in).
    """
    start = self._clock()
    deadline, next_note = start + self._config.cluster_wait_seconds, start
    workers = self._cluster.workers
    while True:
      reachable = self._cluster.reachable()
      silent = task_watch.silent_workers(workers, reachable, self._config.min_workers)
      if silent is not None:
        joined = {t for t in self.excluded if t.job == spec_lib.JobType.WORKER} - silent
        self.excluded = {t for t in self.excluded if t.job != spec_lib.JobType.WORKER} | silent
        if silent:
          logging.info("starting on %d of %d workers; %s join when they answer",
                       len(workers) - len(silent), len(workers),
                       ", ".join(sorted(map(str, silent))))
        if joined:
          logging.info("%s answer again: in the next coordinator's cluster",
                       ", ".join(sorted(map(str, joined))))
        return None
      now = self._clock()
      if self._stop.requested:
        return SupervisorResult(errors.exit_code_for_signal(self._stop.signum), 0,
                                f"stopped by {signal.Signals(self._stop.signum).name} "
                                "while waiting for workers")
      answering = sum(1 for w in workers if w in reachable)
      if now >= deadline:
        reason = (f"fewer workers than --min_workers={self._config.min_workers} answered for "
                  f"{self._config.cluster_wait_seconds:.0f}s ({answering} of {len(workers)})")
        logging.error("%s", reason)
        self._events.append(events_lib.Event(kind="action", task="chief:0",
                                             action=Action.GIVE_UP.value, detail=reason))
        return SupervisorResult(errors.ExitCode.CLUSTER_LOST, 0, reason)
      if now >= next_note:
        next_note = now + 60
        logging.warning("waiting for workers: %d of %d answer, --min_workers=%d",
                        answering, len(workers), self._config.min_workers)
      self._stop.wait(self._config.probe_seconds)

  def _wait(self, process: subprocess.Popen) -> _Ended:
    """Waits for the coordinator to exit; says how it ended (`_Ended`).

    While it RUNS: passes a stop signal on, or, when the task watch asks for
    a change of cluster, asks it to save and stop (SIGTERM); then it is
    STOPPING, and is killed if still running after the grace period. A
    running coordinator past the ps deadline is killed (`_end_overdue`).
    """
    state, stop_deadline, change = CoordinatorState.RUNNING, 0.0, None
    # A ps left out is nobody's concern until it is taken back.
    ps_addresses = {t: a for t, a in self._cluster.ps_addresses.items() if t not in self.excluded}
    ps_silence = (overdue_lib.Overdue(ps_addresses, self._config.ps_deadline_seconds,
                                      name="ps_deadline_seconds")
                  if ps_addresses and self._config.ps_deadline_seconds else None)
    next_probe = self._clock() + self._config.probe_seconds
    while True:
      try:
        return _Ended(process.wait(timeout=_POLL_SECONDS), change)
      except subprocess.TimeoutExpired:
        pass
      now = self._clock()
      if self._superseded():
        # It may not write anything more (its own fence stops it too): no grace.
        process.kill()
        return _Ended(process.wait(timeout=10), change, superseded=True,
                      killed="killed by the supervisor: the other chief replica took the lease")
      if state == CoordinatorState.RUNNING and self._stop.requested:
        logging.warning("passing %s to the coordinator (pid %d); it saves, then exits",
                        signal.Signals(self._stop.signum).name, process.pid)
        process.send_signal(self._stop.signum)
        state, stop_deadline = CoordinatorState.STOPPING, now + self._config.stop_grace_seconds
      if state == CoordinatorState.RUNNING:
        self._launcher.idle()
        if now >= next_probe:
          next_probe = now + self._config.probe_seconds
          reachable = self._cluster.reachable()
          silent = ps_silence.update(reachable, now) if ps_silence is not None else []
          if silent:
            return self._end_overdue(process, silent, ps_silence, now, reachable)
          change = self._watched_change(reachable, now)
          if change is not None:
            process.send_signal(signal.SIGTERM)  # Save, then exit: we restart it.
            state, stop_deadline = (CoordinatorState.STOPPING,
                                    now + self._config.stop_grace_seconds)
      elif now > stop_deadline:
        logging.error("coordinator did not exit %.0fs after SIGTERM; killing it",
                      self._config.stop_grace_seconds)
        process.kill()
        return _Ended(process.wait(timeout=10), change, killed=(
            f"killed by the supervisor: still running {self._config.stop_grace_seconds:.0f}s "
            "after SIGTERM"))

  def _end_overdue(self, process: subprocess.Popen, silent: list, ps_silence, now: float,
                   reachable: set) -> _Ended:
    """Kills a coordinator still running past the ps deadline: a ps loss."""
    names = ", ".join(f"{t} ({self._cluster.ps_addresses[t]}) did not answer for "
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
    return _Ended(
        process.wait(timeout=10), killed="killed by the supervisor: missed its ps deadline",
        lost=(f"lost the cluster: {names}, and the coordinator had not exited by itself (missed "
              "its own ps deadline): killed it, its thread stacks are in the chief's log"))

  def _watched_change(self, reachable: set, now: float):
    """The first cluster change the task watch asks for, applied to `excluded`."""
    if self._watch is None:
      return None
    ps_out = any(t.job == spec_lib.JobType.PS for t in self.excluded)
    changes = self._watch.update(reachable, self.excluded, now,
                                 ps_back_due=ps_out and self._launcher.ps_back_due())
    for notice in self._watch.notices(self.excluded, now):
      if notice.silent:
        # The coordinator may be unable to say it: a registration that waits for the
        # worker holds its every thread (docs/tensorflow-behaviour.md).
        logging.warning("%s has not answered for %.0fs (paused, overloaded or cut off): "
                        "whatever the coordinator registers with every task waits for it; "
                        "left out after %.0fs", notice.task, notice.seconds, self._watch.timeout)
      else:
        logging.warning("%s answers again after %.0fs of silence", notice.task, notice.seconds)
    for what, worker in changes:
      if what == task_watch.Change.BACK:
        logging.warning("%s answers again: saving and restarting the coordinator with it",
                        worker)
        self.excluded.discard(worker)
        return what, worker
      decision = self._config.policy.decide(Kind.WORKER_GONE, self._history, now)
      self._record(str(worker), Kind.WORKER_GONE, decision,
                   f"{worker} unreachable for {self._watch.timeout:.0f}s")
      if decision.action == Action.RESTART_WITHOUT_TASK:
        logging.warning("%s unreachable for %.0fs: saving and restarting the coordinator "
                        "without it", worker, self._watch.timeout)
        self._history = self._history.restarted(now)
        self.excluded.add(worker)
        return what, worker
    return None

  def _record(self, task: str, kind: Kind, decision: policy_lib.Decision, detail: str) -> None:
    self._events.append(events_lib.Event(kind="failure", task=task, failure=kind.value,
                                         detail=detail))
    self._events.append(events_lib.Event(
        kind="action", task=task, failure=kind.value, action=decision.action.value,
        detail=decision.reason))
