"""The event log: every failure, action and recovery as one JSON line.

`model_dir/events.jsonl` is append-only and shared by every incarnation of
the chief (and by `tfps local`), so a run's history survives restarts. Each
line is a complete JSON object written with one `write` call on a file opened
in append mode, so concurrent writers never interleave within a line.
`summarize` folds the log into the counts a run's final JSON line reports.
"""

import dataclasses
import json
import os
import time
from typing import Iterable

from tfps.recovery import policy

FILE_NAME = "events.jsonl"
KINDS = ("failure", "action", "recovered", "epoch", "died")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event:
  """One line of the event log.

  Attributes:
    kind: `failure`, `action`, `recovered`, `epoch` (an epoch of the
      positioned input was handed out whole and trained), or `died` (a
      process died: `recovery.deaths`).
    task: the task concerned, e.g. `worker:1`, `ps:0`, `chief:0`.
    failure: the failure kind (recovery.policy.FailureKind value), if any.
    action: the action taken (recovery.policy.Action value), if any.
    step: the global step when it happened, if known.
    steps_lost: steps that must be re-done because of it, if known.
    steps_reexecuted: steps TensorFlow ran twice retrying a failed closure
      (the failed attempt's partial updates stay applied).
    seconds_to_recover: from detection to progress again, for `recovered`.
    task_change: for a worker left out of training (`gone`), or a worker or
      ps taken back (`back`) by the supervisor: that change
      (recovery.task_watch.Change).
    tasks_left_out: with `task_change`, every worker and ps left out after it.
    pid, signal, exit_code, last_lines: for `died`, the process, the signal
      that killed it or its exit code, and the end of its output.
    detail: one human-readable line.
    time: seconds since the epoch.
  """

  kind: str
  task: str = ""
  failure: str | None = None
  action: str | None = None
  step: int | None = None
  steps_lost: int | None = None
  steps_reexecuted: int | None = None
  seconds_to_recover: float | None = None
  task_change: str | None = None
  tasks_left_out: tuple[str, ...] | None = None
  pid: int | None = None
  signal: str | None = None
  exit_code: int | None = None
  last_lines: tuple[str, ...] | None = None
  detail: str = ""
  time: float = dataclasses.field(default_factory=time.time)

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"kind ({self.kind!r}) must be one of {', '.join(KINDS)}")
    for name in ("tasks_left_out", "last_lines"):  # JSON gives a list back.
      if getattr(self, name) is not None:
        object.__setattr__(self, name, tuple(getattr(self, name)))


class EventLog:
  """Appends events to `<model_dir>/events.jsonl`."""

  def __init__(self, model_dir: str):
    self.path = os.path.join(model_dir, FILE_NAME)

  def append(self, event: Event) -> None:
    line = json.dumps({k: v for k, v in dataclasses.asdict(event).items() if v is not None})
    with open(self.path, "a", encoding="utf-8") as f:
      f.write(line + "\n")

  def read(self) -> list[Event]:
    try:
      with open(self.path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    except FileNotFoundError:
      return []
    return [Event(**json.loads(line)) for line in lines]


def summarize(events: Iterable[Event]) -> dict:
  """Counts for the final JSON line: `restarts`, `faults`, `steps_lost`,
  `steps_reexecuted`, and `deaths` (per process that died, how often)."""
  events = list(events)
  deaths: dict[str, int] = {}
  for event in events:
    if event.kind == "died":
      deaths[event.task] = deaths.get(event.task, 0) + 1
  return {
      "deaths": dict(sorted(deaths.items())),
      "faults": sum(1 for e in events if e.kind == "failure"),
      "restarts": sum(1 for e in events if e.kind == "action" and e.action is not None
                      and policy.Action(e.action).restarts_coordinator),
      "steps_lost": sum(e.steps_lost or 0 for e in events if e.kind == "recovered"),
      "steps_reexecuted": sum(e.steps_reexecuted or 0 for e in events),
  }
