"""Why a coordinator process ended, told to its supervisor beside the exit code.

Exit code 1 covers every permanent failure (user code, NaN loss, a bad
checkpoint). The supervisor gives up on all of them the same way, but the
event log should say which one it was and why, in the coordinator's own
words. The supervisor names a file in `ENV_VAR`; a coordinator that fails
with a `TfpsError` writes `{"failure": ..., "message": ...}` there before it
exits. A missing or unreadable file just means "no more than the exit code".
"""

import dataclasses
import json
import os

ENV_VAR = "TFPS_EXIT_REPORT"


@dataclasses.dataclass(frozen=True)
class ExitReport:
  failure: str  # A `policy.FailureKind` value.
  message: str  # The one line the coordinator printed.


def write(failure: str, message: str, path: str | None = None) -> None:
  """Writes the report where the supervisor asked (`ENV_VAR`); no-op if it did not."""
  path = path or os.environ.get(ENV_VAR)
  if not path:
    return
  try:
    with open(path, "w", encoding="utf-8") as f:
      json.dump({"failure": failure, "message": message}, f)
  except OSError:
    pass  # The exit code still says enough to act on.


def take(path: str) -> ExitReport | None:
  """Reads and removes the report at `path`; None if there is none."""
  try:
    with open(path, encoding="utf-8") as f:
      raw = json.load(f)
    os.remove(path)
    return ExitReport(failure=str(raw["failure"]), message=str(raw["message"]))
  except (OSError, ValueError, KeyError, TypeError):
    return None
