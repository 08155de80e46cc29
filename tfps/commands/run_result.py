"""What a run ended with: one typed record, handed back up as a file.

Each process that starts another names the file its result goes to
(`tfps run --result_file=PATH`): the supervisor its coordinator (which writes
an `api.CoordinatorResult`), `tfps local` its chief (which writes a `RunResult`:
the last coordinator's record and what happened around it). Only the
outermost command prints the result, as one JSON line on stdout
(`RunResult.as_dict`). A file is written whole or not at all, and only by a
process that finished.
"""

import dataclasses
import json
from typing import Any, Mapping

from tfps.base import errors
from tfps.coordinator import api
from tfps.base import files


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunResult:
  """A finished run.

  Attributes:
    coordinator: the record of the coordinator that finished.
    faults, restarts, steps_lost, steps_reexecuted: from the event log
      (`recovery.events.summarize`); `tfps local` adds its chief restarts.
    input: the input over the whole run (every coordinator, replayed from
      the progress log) over what the last coordinator knew.
    task_restarts: ps/worker restarts by `tfps local`; None elsewhere.
    deaths: per process that died (`recovery.deaths`), how many times:
      `worker:1`, `coordinator`, `standby`, ...
  """

  coordinator: api.CoordinatorResult
  faults: int = 0
  restarts: int = 0
  steps_lost: int = 0
  steps_reexecuted: int = 0
  input: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  task_restarts: int | None = None
  deaths: Mapping[str, int] = dataclasses.field(default_factory=dict)

  def as_dict(self) -> dict[str, Any]:
    """The final JSON line: the coordinator's fields with the run's beside them."""
    out = self.coordinator.as_dict()
    out.update(faults=self.faults, restarts=self.restarts, steps_lost=self.steps_lost,
               steps_reexecuted=self.steps_reexecuted, input=dict(self.input),
               deaths=dict(self.deaths))
    if self.task_restarts is not None:
      out["task_restarts"] = self.task_restarts
    return out

  def to_json(self) -> dict[str, Any]:
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out["coordinator"], out["input"] = self.coordinator.as_dict(), dict(self.input)
    out["deaths"] = dict(self.deaths)
    return out

  @classmethod
  def from_json(cls, raw: Mapping[str, Any]) -> "RunResult":
    return cls(**{**raw, "coordinator": api.CoordinatorResult.from_dict(raw["coordinator"])})


def _read(path: str, what: str) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError:
    raise errors.PermanentError(f"the {what} exited 0 but wrote no result to {path}") from None
  except (OSError, ValueError) as e:
    raise errors.PermanentError(f"the {what}'s result {path} is unreadable ({e})") from None


def write_coordinator(result: api.CoordinatorResult, path: str) -> None:
  files.write_json(path, result.as_dict())


def read_coordinator(path: str) -> api.CoordinatorResult:
  try:
    return api.CoordinatorResult.from_dict(_read(path, "coordinator"))
  except ValueError as e:
    raise errors.PermanentError(f"the coordinator's result {path}: {e}") from None


def write(result: RunResult, path: str) -> None:
  files.write_json(path, result.to_json())


def read(path: str) -> RunResult:
  try:
    return RunResult.from_json(_read(path, "chief"))
  except (ValueError, KeyError, TypeError) as e:
    raise errors.PermanentError(f"the chief's result {path}: {e}") from None
