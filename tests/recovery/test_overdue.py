"""Who is overdue (tfps.recovery.overdue): pure counters of silence and of refusals."""

import pytest

from tfps.base import errors
from tfps.cluster import spec as spec_lib
from tfps.recovery import overdue as overdue_lib

PS0, PS1 = (spec_lib.TaskId(spec_lib.JobType.PS, i) for i in range(2))


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


def test_refusals_count_in_a_row_per_task():
  refusals = overdue_lib.Refusals([PS0, PS1], rounds=2)
  assert refusals.update({PS0}) == []
  assert refusals.update({PS1}) == []  # PS0 answered (or was silent): its count starts over.
  assert refusals.update({PS1}) == [PS1]
  with pytest.raises(errors.UsageError, match=r"rounds \(0\) must be positive"):
    overdue_lib.Refusals([PS0], rounds=0)
