"""TaskWatch is pure: step it one observation at a time."""

import pytest

from tfps.cluster import spec as spec_lib
from tfps.recovery import task_watch

W = [spec_lib.TaskId(spec_lib.JobType.WORKER, i) for i in range(3)]
GONE, BACK = task_watch.Change.GONE, task_watch.Change.BACK


def watch(timeout=10.0, readmit_after=3.0):
  return task_watch.TaskWatch(W, task_watch.TaskWatchConfig(
      timeout=timeout, readmit_after=readmit_after))


def test_a_worker_that_returns_before_the_timeout_is_left_to_tf():
  w = watch()
  assert w.update(set(W), set(), now=0) == []
  assert w.update({W[0], W[2]}, set(), now=1) == []
  assert w.update({W[0], W[2]}, set(), now=10.9) == []
  assert w.update(set(W), set(), now=11) == []  # Back in time: TF re-admits it.
  assert w.update(set(W), set(), now=30) == []


def test_gone_after_the_timeout_then_back_after_being_stable():
  w = watch()
  w.update(set(W), set(), now=0)
  w.update({W[0], W[2]}, set(), now=1)
  assert w.update({W[0], W[2]}, set(), now=11) == [(GONE, W[1])]
  excluded = {W[1]}
  assert w.update({W[0], W[2]}, excluded, now=50) == []  # Still away: nothing.
  assert w.update(set(W), excluded, now=60) == []  # Answers, not yet stable.
  assert w.update({W[0], W[2]}, excluded, now=61) == []  # Flapped: the clock restarts.
  assert w.update(set(W), excluded, now=62) == []
  assert w.update(set(W), excluded, now=65) == [(BACK, W[1])]


def test_the_last_worker_is_never_excluded():
  w = watch()
  w.update(set(), set(), now=0)
  changes = w.update(set(), set(), now=20)
  assert len(changes) == 2 and all(c == GONE for c, _ in changes)
  assert w.update(set(), {W[0], W[1]}, now=40) == []


def test_no_worker_is_left_out_below_min_workers():
  w = task_watch.TaskWatch(W, task_watch.TaskWatchConfig(timeout=10.0, min_workers=2))
  w.update({W[0]}, set(), now=0)
  assert w.update({W[0]}, set(), now=20) == [(GONE, W[1])]  # Two left; not a second.
  assert w.update({W[0]}, {W[1]}, now=40) == []


def test_a_worker_answering_for_the_first_time_joins_at_once_and_one_back_waits():
  w = watch(readmit_after=3.0)
  w.update({W[0]}, {W[1], W[2]}, now=0)  # Started on worker 0; 1 and 2 not there yet.
  assert w.update({W[0], W[1]}, {W[1], W[2]}, now=1) == [(BACK, W[1])]  # Joins.
  w.update({W[0], W[1]}, {W[2]}, now=2)
  w.update({W[0]}, {W[2]}, now=3)  # Worker 1 goes...
  w.update({W[0]}, {W[1], W[2]}, now=20)  # ...is left out...
  assert w.update({W[0], W[1]}, {W[1], W[2]}, now=21) == []  # ...and must answer steadily.
  assert w.update({W[0], W[1]}, {W[1], W[2]}, now=24) == [(BACK, W[1])]


def test_a_coordinator_starts_on_the_workers_that_answer_once_enough_do():
  assert task_watch.silent_workers(W, {W[0]}, min_workers=2) is None
  assert task_watch.silent_workers(W, {W[0], W[2]}, min_workers=2) == {W[1]}
  assert task_watch.silent_workers(W, set(W), min_workers=3) == frozenset()


@pytest.mark.parametrize("kwargs, message", [
    (dict(timeout=0), r"timeout \(0\)"), (dict(readmit_after=-1), r"readmit_after \(-1\)"),
    (dict(min_workers=0), r"min_workers \(0\)")])
def test_config_validation(kwargs, message):
  with pytest.raises(ValueError, match=message):
    task_watch.TaskWatchConfig(**kwargs)


PS = spec_lib.TaskId(spec_lib.JobType.PS, 0)


def test_no_verdict_while_the_chief_sees_no_ps_either():
  w = task_watch.TaskWatch(W, task_watch.TaskWatchConfig(timeout=10.0), ps=[PS])
  assert w.update({PS, *W}, set(), now=0) == []
  # The chief is cut off: no worker and no ps answers. Nobody is blamed.
  assert w.update(set(), set(), now=1) == []
  assert w.update(set(), set(), now=100) == []
  # Healed, except worker 1: its clock starts now, not at the cut.
  assert w.update({PS, W[0], W[2]}, set(), now=101) == []
  assert w.update({PS, W[0], W[2]}, set(), now=110) == []
  assert w.update({PS, W[0], W[2]}, set(), now=111) == [(GONE, W[1])]


P = [spec_lib.TaskId(spec_lib.JobType.PS, i) for i in range(2)]


def test_an_excluded_ps_is_back_after_answering_for_its_own_time_and_never_gone():
  w = task_watch.TaskWatch(W, task_watch.TaskWatchConfig(
      timeout=10.0, readmit_after=3.0, ps_readmit_after=30.0), ps=P)
  everyone = {*W, *P}
  assert w.update(everyone - {P[0]}, {P[0]}, now=0) == []
  assert w.update(everyone - {P[0]}, {P[0]}, now=100) == []  # Down for long: not GONE.
  assert w.update(everyone, {P[0]}, now=101) == []
  assert w.update(everyone, {P[0]}, now=130) == []  # 29 s: not yet.
  assert w.update(everyone, {P[0]}, now=131) == [(BACK, P[0])]
  # A ps in the coordinator's cluster that stops answering is the coordinator's to notice.
  assert w.update(everyone - {P[1]}, set(), now=132) == []
  assert w.update(everyone - {P[1]}, set(), now=200) == []


def test_an_excluded_ps_waits_for_its_readmission_to_be_due_and_workers_do_not():
  w = task_watch.TaskWatch(W, task_watch.TaskWatchConfig(
      timeout=10.0, readmit_after=3.0, ps_readmit_after=5.0), ps=P)
  everyone = {*W, *P}
  w.update(everyone, set(), now=-20)
  w.update(everyone - {P[0], W[1]}, set(), now=-15)  # Both went, and were left out.
  assert w.update(everyone, {P[0], W[1]}, now=0, ps_back_due=False) == []
  # Both have answered long enough: the worker comes back, the ps waits.
  assert w.update(everyone, {P[0], W[1]}, now=10, ps_back_due=False) == [(BACK, W[1])]
  assert w.update(everyone, {P[0]}, now=60, ps_back_due=False) == []
  assert w.update(everyone, {P[0]}, now=61, ps_back_due=True) == [(BACK, P[0])]


def notices(w, excluded=frozenset(), *, now):
  return [(n.task, n.silent, n.seconds) for n in w.notices(set(excluded), now)]


def test_a_silent_worker_is_said_once_and_again_when_it_answers():
  w = task_watch.TaskWatch(W, task_watch.TaskWatchConfig(timeout=60.0, notice_after=4.0))
  w.update(set(W), set(), now=0)
  w.update({W[0], W[2]}, set(), now=1)  # Worker 1 stops answering.
  assert notices(w, now=1) == []
  w.update({W[0], W[2]}, set(), now=4.9)
  assert notices(w, now=4.9) == []  # Not yet: a probe or two can miss.
  w.update({W[0], W[2]}, set(), now=5)
  assert notices(w, now=5) == [(W[1], True, 4.0)]
  w.update({W[0], W[2]}, set(), now=20)
  assert notices(w, now=20) == []  # Said once.
  w.update(set(W), set(), now=31)
  assert notices(w, now=31) == [(W[1], False, 30.0)]
  w.update(set(W), set(), now=40)
  assert notices(w, now=40) == []


def test_no_notice_for_a_worker_left_out_or_one_that_has_not_answered_yet():
  w = task_watch.TaskWatch(W, task_watch.TaskWatchConfig(timeout=10.0, notice_after=4.0))
  w.update({W[0], W[1]}, set(), now=0)  # Worker 2 has not answered yet (joining).
  w.update({W[0]}, set(), now=1)  # Worker 1 goes silent.
  w.update({W[0]}, set(), now=6)
  assert notices(w, now=6) == [(W[1], True, 5.0)]  # Worker 2: never answered, not said.
  w.update({W[0]}, {W[1]}, now=12)  # Left out at its timeout: nothing more of it.
  assert notices(w, {W[1]}, now=12) == []
  w.update({W[0], W[1], W[2]}, {W[1]}, now=13)
  assert notices(w, {W[1]}, now=13) == []
