"""The coordinator's ps deadline: the pure counter, and the thread with a fake probe."""

import threading

import pytest

from tfps.cluster import spec as spec_lib
from tfps.coordinator import ps_deadline
from tfps.base import errors
from tfps.recovery import overdue as overdue_lib

CLUSTER = spec_lib.ClusterSpec.from_dict({
    "chief": ["10.213.0.2:2222"], "ps": ["10.213.0.3:2222", "10.213.0.4:2222"],
    "worker": ["10.213.0.5:2222"]})
PS0, PS1 = (spec_lib.TaskId(spec_lib.JobType.PS, i) for i in range(2))
W0 = spec_lib.TaskId(spec_lib.JobType.WORKER, 0)


def test_overdue_only_after_timeout_seconds_of_silence_in_a_row():
  overdue = overdue_lib.Overdue([PS0, PS1], timeout=10)
  assert overdue.update({PS0, PS1}, now=0) == []
  assert overdue.update({PS1}, now=1) == []
  assert overdue.update({PS1}, now=10.9) == []
  assert overdue.update({PS0, PS1}, now=11) == []  # Answered in time: a blip.
  assert overdue.update({PS1}, now=12) == []
  assert overdue.update(set(), now=21) == []
  assert overdue.update(set(), now=22) == [PS0]
  assert overdue.update(set(), now=31) == [PS0, PS1]


def test_timeout_must_be_positive():
  with pytest.raises(errors.UsageError, match=r"ps_timeout \(0\) must be positive"):
    overdue_lib.Overdue([PS0], timeout=0)


class FakeClock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def _run_until_overdue(answers):
  """Runs the thread against `answers` (one reachable set per probe round)."""
  clock = FakeClock()
  fired = threading.Event()
  messages = []
  rounds = iter(answers)

  def probe(tasks):
    assert set(tasks) == {PS0, PS1, W0}
    clock.now += 5
    return next(rounds)

  def on_overdue(message):
    messages.append(message)
    fired.set()

  with ps_deadline.PsDeadline(CLUSTER, 12, interval=0.01, probe=probe, on_overdue=on_overdue,
                              clock=clock):
    assert fired.wait(timeout=10), "the deadline never fired"
  return messages


def test_a_silent_ps_ends_the_run_naming_it():
  (message,) = _run_until_overdue([{PS0, PS1, W0}, {PS0, W0}, {PS0, W0}, {PS0, W0}, {PS0, W0}])
  assert "ps:1 (10.213.0.4:2222) did not answer for 12s" in message
  assert "partitioned or hung" in message


def test_a_chief_that_sees_nobody_says_it_is_cut_off():
  (message,) = _run_until_overdue([set()] * 5)
  assert "ps:0 (10.213.0.3:2222), ps:1 (10.213.0.4:2222) did not answer" in message
  assert "this chief is cut off from the cluster" in message


def test_stopping_before_the_deadline_fires_nothing():
  probed = threading.Event()

  def probe(tasks):
    probed.set()
    return set()

  with ps_deadline.PsDeadline(CLUSTER, 1000, interval=0.01, probe=probe,
                              on_overdue=lambda m: pytest.fail(m)) as deadline:
    assert probed.wait(timeout=10), "never probed"
  assert not deadline._thread.is_alive()
