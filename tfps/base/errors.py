"""Exit codes and the exception types that carry them.

Every error tfps raises on purpose is a `TfpsError` whose *type* says whether
an orchestrator should retry. The command-line edge turns the type into the
exit code below; nothing ever inspects message text to decide.

Exit codes follow the README's table and Kubeflow's `restartPolicy: ExitCode`, which
retries exactly the codes >= 128 and treats 1-127 as permanent.
"""

import enum
import signal


class ExitCode(enum.IntEnum):
  """Process exit codes of every `tfps` command."""

  OK = 0
  # User code raised, NaN loss, unreadable checkpoint, restart budget spent.
  PERMANENT = 1
  # Bad command line, invalid cluster spec or experiment configuration.
  USAGE = 2
  # Interrupted by the user (SIGINT): 128 + 2.
  INTERRUPTED = 128 + signal.SIGINT
  # Preempted (SIGTERM), after saving what could be saved: 128 + 15.
  PREEMPTED = 128 + signal.SIGTERM
  # Lost a task or the whole cluster (unreachable, ps gone): retry later.
  CLUSTER_LOST = 170
  # A ps/worker's address is taken (often by the previous process of the same
  # task, still exiting): retry, after freeing it if it stays taken.
  ADDRESS_IN_USE = 171
  # Another chief replica took the lease (`recovery.chief_lease`): this
  # coordinator stopped without writing anything; its chief stands by.
  SUPERSEDED = 172

  @property
  def retryable(self) -> bool:
    return self >= 128


def exit_code_for_signal(signum: int) -> ExitCode:
  """The exit code for a process asked to stop by `signum`."""
  if signum == signal.SIGINT:
    return ExitCode.INTERRUPTED
  return ExitCode.PREEMPTED


class TfpsError(Exception):
  """Base of every error tfps raises on purpose.

  The message is one line meant for a person; `exit_code` is for machines.
  """

  exit_code: ExitCode = ExitCode.PERMANENT


class UsageError(TfpsError, ValueError):
  """Bad flags, cluster spec or configuration: fix the input, do not retry."""

  exit_code = ExitCode.USAGE


class PermanentError(TfpsError):
  """A failure that will happen again on retry (user code, NaN, bad checkpoint).

  `failure` names the kind for the event log (`policy.FailureKind` values);
  all kinds share exit code 1.
  """

  exit_code = ExitCode.PERMANENT
  failure = "user_error"


class NonFiniteLossError(PermanentError):
  """The loss became NaN or infinite: retrying replays the same divergence."""

  failure = "nan_loss"


class BadCheckpointError(PermanentError):
  """The checkpoint is unreadable or belongs to another model."""

  failure = "bad_checkpoint"


class RetryableError(TfpsError):
  """A failure of the environment; the same command may succeed later."""

  exit_code = ExitCode.CLUSTER_LOST


class AddressInUseError(RetryableError):
  """This task's host:port is held by another process."""

  exit_code = ExitCode.ADDRESS_IN_USE


class Superseded(TfpsError):
  """Another chief replica holds the lease now: stop, write nothing (a fenced coordinator)."""

  exit_code = ExitCode.SUPERSEDED


class Preempted(RetryableError):
  """The process was asked to stop by a signal (SIGTERM/SIGINT)."""

  def __init__(self, signum: int, detail: str = ""):
    self.signum = signum
    self.exit_code = exit_code_for_signal(signum)
    suffix = f" ({detail})" if detail else ""
    super().__init__(f"stopped by {signal.Signals(signum).name}{suffix}")
