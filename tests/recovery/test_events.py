"""The event log (tfps.recovery.events): pure, no TF."""

import json

import pytest

from tfps.recovery import events
from tfps.recovery import policy

Kind = policy.FailureKind
Action = policy.Action


def test_event_log_round_trip_and_summary(tmp_path):
  log = events.EventLog(str(tmp_path))
  log.append(events.Event(kind="failure", task="ps:0", failure=Kind.PS_LOST.value, step=120))
  log.append(events.Event(kind="action", task="ps:0", action=Action.WAIT_AND_RESTART.value))
  log.append(events.Event(kind="recovered", task="ps:0", steps_lost=20, seconds_to_recover=9.5))
  log.append(events.Event(kind="failure", task="worker:1", failure=Kind.WORKER_LOST.value))
  log.append(events.Event(kind="action", task="worker:1", action=Action.CONTINUE.value))
  with open(log.path) as f:
    lines = [json.loads(line) for line in f]
  assert len(lines) == 5 and lines[0]["task"] == "ps:0" and "steps_lost" not in lines[0]
  assert events.summarize(log.read()) == {"faults": 2, "restarts": 1, "steps_lost": 20,
                                      "steps_reexecuted": 0, "deaths": {}}


def test_event_kind_is_validated():
  with pytest.raises(ValueError, match="kind \\('oops'\\)"):
    events.Event(kind="oops")
