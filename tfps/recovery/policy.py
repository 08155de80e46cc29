"""What to do after a failure: a pure function of the failure and the history.

Deciding is separate from doing: `RestartPolicy.decide` maps
(failure kind, past restarts, now) to an `Action`; the supervisor and the
handlers only carry actions out. No TensorFlow, no clocks, no I/O here, so
every row of the failure matrix is a plain unit test.

The failure matrix (docs/recovery.md) as decisions:

  kind                  action                  why
  WORKER_LOST           CONTINUE                TF re-runs its closures elsewhere and
                                                re-admits it when it returns
  WORKER_GONE           RESTART_WITHOUT_TASK    TF would wait up to an hour for it and
                                                block everyone; go on without it
  PS_LOST               WAIT_AND_RESTART        its variables are gone: wait for the
                                                cluster, new coordinator, restore;
                        RESTART_WITHOUT_TASK    with ps failover, when it does not
                                                answer and another ps does: restore
                                                on the ps that answer, at once
  CLUSTER_UNREACHABLE   WAIT_AND_RESTART        same, for whatever is missing
  CHIEF_LOST            WAIT_AND_RESTART        (decided by whoever restarts the chief)
  TASK_NOTICE           SAVE_NOW                a ps/worker got SIGTERM: save before it goes
  CHIEF_NOTICE          SAVE_AND_EXIT           the chief got SIGTERM: save, exit 143
  USER_ERROR, NAN_LOSS,
  BAD_CONFIG,
  BAD_CHECKPOINT        GIVE_UP                 permanent: a retry fails the same way

Ps failover: a lost ps comes back empty, so waiting for it buys nothing but
its memory and its share of the work; on preemptible VMs its replacement
can take minutes. With `ps_failover`, every restart that would wait for the
cluster leaves out the ps that do not answer at that moment (as long as one
does): the new coordinator places every variable on the ps that answer and
restores the checkpoint there (a checkpoint does not depend on where its
variables live). A ps left out is taken back at the next restart at which
it answers, or sooner by the supervisor's watch (`recovery.task_watch`).

Restarts are budgeted: more than `max_restarts` within `window_seconds`
is a crash loop, and the answer becomes GIVE_UP with the reason. The budget
counts only restarts that were not followed by progress (`RestartHistory`
forgets earlier restarts once a coordinator completes a train loop), so a
burst of real faults is recovered from and a coordinator that keeps dying
before it trains is stopped. A decision that ends the run carries the exit
code to end it with; `classify_exit` reads a coordinator's (or a chief's)
exit code as a failure kind, so the supervisor and `tfps local`'s
orchestrator decide with the same rules.
"""

import dataclasses
import enum
import math

from tfps.base import errors
from tfps.base import settings


class FailureKind(str, enum.Enum):
  WORKER_LOST = "worker_lost"
  WORKER_GONE = "worker_gone"
  PS_LOST = "ps_lost"
  CLUSTER_UNREACHABLE = "cluster_unreachable"
  CHIEF_LOST = "chief_lost"
  TASK_NOTICE = "task_preemption_notice"
  CHIEF_NOTICE = "chief_preemption_notice"
  USER_ERROR = "user_error"
  NAN_LOSS = "nan_loss"
  BAD_CONFIG = "bad_config"
  BAD_CHECKPOINT = "bad_checkpoint"

  @property
  def permanent(self) -> bool:
    return self in _PERMANENT


_PERMANENT = frozenset({FailureKind.USER_ERROR, FailureKind.NAN_LOSS,
                        FailureKind.BAD_CONFIG, FailureKind.BAD_CHECKPOINT})


class Action(str, enum.Enum):
  CONTINUE = "continue"
  SAVE_NOW = "save_checkpoint_now"
  SAVE_AND_EXIT = "save_and_exit"
  WAIT_AND_RESTART = "wait_for_cluster_and_restart_coordinator"
  RESTART_WITHOUT_TASK = "restart_coordinator_without_task"
  GIVE_UP = "give_up"
  # The standby chief replica starts its coordinator (`recovery.chief_replica`).
  TAKE_OVER = "standby_chief_takes_over"
  # Its coordinator was connected and built ahead (`commands.coordinate`), and,
  # at a takeover, that prepared coordinator runs (no import, connect or trace).
  # It retires when its cluster changed (a ps restarted); another is prepared.
  STANDBY_PREPARED = "standby_coordinator_prepared"
  PREPARED_RUNS = "prepared_coordinator_runs"
  STANDBY_RETIRED = "standby_coordinator_retired"

  @property
  def restarts_coordinator(self) -> bool:
    return self in (Action.WAIT_AND_RESTART, Action.RESTART_WITHOUT_TASK, Action.TAKE_OVER)


_ACTIONS = {
    FailureKind.WORKER_LOST: Action.CONTINUE,
    FailureKind.WORKER_GONE: Action.RESTART_WITHOUT_TASK,
    FailureKind.PS_LOST: Action.WAIT_AND_RESTART,
    FailureKind.CLUSTER_UNREACHABLE: Action.WAIT_AND_RESTART,
    FailureKind.CHIEF_LOST: Action.WAIT_AND_RESTART,
    FailureKind.TASK_NOTICE: Action.SAVE_NOW,
    FailureKind.CHIEF_NOTICE: Action.SAVE_AND_EXIT,
}


def classify_exit(code: int, reported: str | None = None) -> FailureKind | None:
  """The failure a coordinator's exit code means; None when it finished.

  `reported` is the kind the coordinator wrote in its exit report; it only
  refines a permanent exit (1) and never turns a code into another action.
  """
  if code == errors.ExitCode.OK:
    return None
  if code == errors.ExitCode.PERMANENT and reported in _PERMANENT_REPORTS:
    return FailureKind(reported)
  if code == errors.ExitCode.USAGE:
    return FailureKind.BAD_CONFIG
  if code == errors.ExitCode.CLUSTER_LOST:
    return FailureKind.PS_LOST
  if code < 0 or code >= 128:
    # Killed (OOM killer, SIGKILL) or stopped by a signal we did not send.
    return FailureKind.CHIEF_LOST
  return FailureKind.USER_ERROR


_PERMANENT_REPORTS = frozenset(
    k.value for k in (FailureKind.USER_ERROR, FailureKind.NAN_LOSS, FailureKind.BAD_CHECKPOINT))


@dataclasses.dataclass(frozen=True)
class RestartHistory:
  """The coordinator restarts so far, and when one last made progress.

  Immutable: each change returns a new history, so a decision is a function
  of values the caller can print and test.
  """

  restarts: tuple[float, ...] = ()
  progress_at: float = -math.inf

  def restarted(self, now: float) -> "RestartHistory":
    return dataclasses.replace(self, restarts=self.restarts + (now,))

  def progressed(self, now: float) -> "RestartHistory":
    """A coordinator completed a train loop: earlier restarts are forgiven."""
    return dataclasses.replace(self, progress_at=now)

  @property
  def unproductive(self) -> tuple[float, ...]:
    """The restarts that count against the budget: those since the last progress."""
    return tuple(t for t in self.restarts if t > self.progress_at)


@dataclasses.dataclass(frozen=True)
class Decision:
  """What to do; `exit_code` is set when the action ends the run.

  `leave_out`: with a restart, the ps the new coordinator goes without
  (ps failover); every other ps is in its cluster.
  """

  action: Action
  reason: str
  exit_code: errors.ExitCode | None = None
  leave_out: frozenset = frozenset()


@dataclasses.dataclass(frozen=True, kw_only=True)
class RestartPolicy:
  """Maps failures to actions; budgets coordinator restarts.

  Attributes:
    max_restarts: coordinator restarts allowed within `window_seconds`.
    window_seconds: the sliding window of the budget (`math.inf`: the whole run).
    ps_failover: restart without the ps that do not answer instead of
      waiting for them (see the module docstring).
  """

  max_restarts: int = settings.DEFAULTS["max_restarts"]
  window_seconds: float = settings.DEFAULTS["restart_window"]
  ps_failover: bool = settings.DEFAULTS["ps_failover"]

  def __post_init__(self):
    if self.max_restarts < 0:
      raise ValueError(f"max_restarts ({self.max_restarts}) must be >= 0")
    if self.window_seconds <= 0:
      raise ValueError(f"window_seconds ({self.window_seconds}) must be positive")

  def left_out_at_takeover(self, ps: frozenset, ps_down: frozenset) -> frozenset:
    """The ps a standby chief's first coordinator goes without: with ps failover,
    those that do not answer while others do (the last holder's coordinator may
    have run without them); else none: every ps is waited for."""
    return frozenset(ps_down) if self.ps_failover and ps_down and ps - ps_down else frozenset()

  def decide(self, kind: FailureKind, history: RestartHistory, now: float, *,
             ps: frozenset = frozenset(), ps_down: frozenset = frozenset()) -> Decision:
    """The action for a failure of `kind`.

    Args:
      kind: what failed.
      history: the earlier coordinator restarts (any clock, the same one as
        `now`); only its unproductive restarts count.
      now: the current time.
      ps: every ps of the cluster (for ps failover).
      ps_down: those of them that do not answer now.
    """
    if kind.permanent:
      return Decision(Action.GIVE_UP, f"{kind.value} is permanent: a retry would fail the same way",
                      errors.ExitCode.USAGE if kind == FailureKind.BAD_CONFIG
                      else errors.ExitCode.PERMANENT)
    action = _ACTIONS[kind]
    if action.restarts_coordinator:
      recent = [t for t in history.unproductive if now - t < self.window_seconds]
      if len(recent) >= self.max_restarts:
        window = ("" if math.isinf(self.window_seconds)
                  else f" in the last {self.window_seconds:.0f}s")
        return Decision(Action.GIVE_UP,
                        f"restart budget spent: {len(recent)} restarts{window} "
                        f"(max {self.max_restarts})", errors.ExitCode.PERMANENT)
    if action == Action.WAIT_AND_RESTART and self.ps_failover and ps_down and ps - ps_down:
      names = ", ".join(sorted(map(str, ps_down)))
      verb = "does" if len(ps_down) == 1 else "do"
      return Decision(Action.RESTART_WITHOUT_TASK,
                      f"{kind.value} -> {Action.RESTART_WITHOUT_TASK.value}: {names} {verb} not "
                      "answer; the other ps take its variables (ps failover)",
                      leave_out=frozenset(ps_down))
    return Decision(action, f"{kind.value} -> {action.value}")
