"""Chaos fault schedules (tfps.chaos.faults) are pure: parsed and drawn here."""

import signal

import pytest

from tfps.base import errors
from tfps.chaos import faults as faults_lib
from tfps.chaos import tracker as tracker_lib
from tfps.cluster import spec as spec_lib

CLUSTER = spec_lib.ClusterSpec.from_dict({
    "chief": ["c:1"], "ps": ["p:1", "p:2"], "worker": ["w:1", "w:2"]})
Job = spec_lib.JobType


def test_parse_explicit_faults_sorted_by_time():
  faults = faults_lib.parse_faults(
      "ps:0@40:term+3, worker:1@20:kill+5,worker:0@30:stop+10,worker:1@50:kill+never,chief:0@60:kill",
      CLUSTER)
  assert [str(f) for f in faults] == [
      "worker:1@20:kill+5", "worker:0@30:stop+10", "ps:0@40:term+3",
      "worker:1@50:kill+never", "chief:0@60:kill+5"]
  assert faults[3].back_after is faults_lib.NEVER


@pytest.mark.parametrize("text, message", [
    ("", "no fault"),
    ("worker:1", "must look like TARGET@SECONDS|stepN|standby:ACTION"),
    ("chief:0@standby:kill+3", "@standby needs a standby chief (--chief_standby)"),
    ("chief:active@step5:kill+3", "chief:active needs a standby chief (--chief_standby)"),
    ("worker:1@x:kill", "must look like"),
    ("worker:7@1:kill", "no task worker:7 in this cluster"),
    ("evaluator:0@1:kill", "no task evaluator:0"),
    ("worker:1@1:nuke", "action 'nuke' is not kill, term, stop, cut, join or leave"),
    ("worker:1@1:leave+5", "leave is for good (no +SECONDS)"),
    ("ps:0@1:leave", "only a worker joins or leaves"),
    ("worker:1@1:join", "worker:1 is running by then"),
    ("ps:0@1:cut+never", "a stopped or cut-off task must come back"),
    ("ps:0@1:kill+never", "a ps must come back"),
    ("chief:0@1:kill+never", "needs a standby (--chief_standby)"),
    ("worker:0@1:stop+never", "a stopped or cut-off task must come back"),
    ("worker:0@-1:kill", "time (-1.0) must be >= 0"),
])
def test_bad_fault_specs_are_usage_errors(text, message):
  with pytest.raises(errors.UsageError) as raised:
    faults_lib.parse_faults(text, CLUSTER)
  assert message in str(raised.value) and raised.value.exit_code == 2


ROOMY = spec_lib.ClusterSpec.from_dict({  # Room for 4 workers; 2 start.
    "chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1", "w:2", "w:3", "w:4"]})


def test_workers_join_into_room_the_cluster_left_and_then_take_faults_like_any():
  faults = faults_lib.parse_faults(
      "worker:2@step40:join,worker:3@step80:join,worker:2@step90:kill+3,worker:3@step140:leave",
      ROOMY, workers_started=2)
  assert [str(f) for f in faults] == ["worker:2@step40:join", "worker:3@step80:join",
                                      "worker:2@step90:kill+3", "worker:3@step140:leave"]
  assert faults[0].action.name_of_fault == "JOIN" and faults[0].back_after is faults_lib.NEVER
  assert faults[3].action.signal == signal.SIGTERM and faults[3].back_after is faults_lib.NEVER


@pytest.mark.parametrize("text, message", [
    ("worker:2@step90:kill+3", "worker:2 has not joined by then"),
    ("worker:2@step90:kill+3,worker:2@step100:join", "worker:2 has not joined by then"),
    ("worker:2@step10:join,worker:2@step20:join", "worker:2 is running by then"),
    ("worker:1@step10:join", "worker:1 is running by then"),
])
def test_a_join_must_come_first_and_once_into_room_left_empty(text, message):
  with pytest.raises(errors.UsageError, match=message):
    faults_lib.parse_faults(text, ROOMY, workers_started=2)


@pytest.mark.parametrize("seed", range(10))
def test_a_random_schedule_hits_only_workers_that_started_and_never_resizes(seed):
  faults = faults_lib.random_schedule(seed=seed, count=6, duration=120, cluster=ROOMY,
                                      workers_started=2)
  assert all(f.target.index < 2 for f in faults if f.target.job == Job.WORKER)
  assert not any(f.action.resizes for f in faults)


@pytest.mark.parametrize("seed", range(20))
def test_random_schedule_hits_worker_ps_and_chief(seed):
  faults = faults_lib.random_schedule(seed=seed, count=4, duration=120, cluster=CLUSTER)
  assert {f.target.job for f in faults} >= {Job.WORKER, Job.PS, Job.CHIEF}
  assert list(faults) == sorted(faults) and all(0 <= f.at_seconds < 120 for f in faults)
  times = [f.at_seconds for f in faults]
  assert all(b - a >= 120 / 4 * 0.2 for a, b in zip(times, times[1:]))  # Spaced out.


def test_random_schedule_is_reproducible_from_the_seed():
  draw = lambda seed: faults_lib.random_schedule(seed=seed, count=6, duration=100, cluster=CLUSTER)
  assert draw(7) == draw(7)
  assert any(draw(7) != draw(s) for s in range(8, 12))


def test_never_returning_worker():
  faults = faults_lib.random_schedule(seed=1, count=3, duration=60, cluster=CLUSTER,
                                 never_returns=True)
  permanent = [f for f in faults if f.back_after is faults_lib.NEVER]
  assert len(permanent) == 1 and permanent[0].target.job == Job.WORKER
  assert permanent[0].action == faults_lib.FaultAction.KILL


def test_link_cuts_are_drawn_only_with_network_faults():
  draw = lambda seed, net: faults_lib.random_schedule(seed=seed, count=8, duration=100,
                                                 cluster=CLUSTER, network_faults=net)
  assert not any(f.action == faults_lib.FaultAction.CUT for s in range(20) for f in draw(s, False))
  assert any(f.action == faults_lib.FaultAction.CUT for s in range(20) for f in draw(s, True))
  cut = faults_lib.parse_faults("ps:0@70:cut+8", CLUSTER)[0]
  assert tracker_lib.FaultOutcome(cut, 70.0, True, 9.0).as_dict()["signal"] == "LINK_DOWN"


def test_faults_by_step_parse_and_wait_for_their_step():
  faults = faults_lib.parse_faults("worker:1@step500:kill+2,chief:0@step100:term+3", CLUSTER)
  assert [(str(f.target), f.at_step) for f in faults] == [("chief:0", 100), ("worker:1", 500)]
  assert str(faults[1]) == "worker:1@step500:kill+2"
  assert not faults[0].due(seconds=1e6, step=99) and faults[0].due(seconds=0.0, step=100)


def test_a_fault_at_standby_waits_for_the_prepared_standby_chief_whatever_the_step():
  cluster = spec_lib.ClusterSpec.from_dict({
      "chief": ["c:1", "c:2"], "ps": ["p:1"], "worker": ["w:1", "w:2"]})
  faults = faults_lib.parse_faults("worker:1@step500:kill+2,chief:0@standby:kill+never", cluster)
  assert [str(f) for f in faults] == ["chief:0@standby:kill+never", "worker:1@step500:kill+2"]
  assert not faults[0].due(seconds=1e6, step=10**9, standby_prepared=False)
  assert faults[0].due(seconds=0.0, step=0, standby_prepared=True)
  assert not faults[1].due(seconds=0.0, step=499, standby_prepared=True)


STANDBY = spec_lib.ClusterSpec.from_dict({
    "chief": ["c:1", "c:2"], "ps": ["p:1"], "worker": ["w:1", "w:2"]})


def test_the_active_chief_is_a_target_named_when_the_fault_is_injected():
  fault, = faults_lib.parse_faults("chief:active@step500:kill+3", STANDBY)
  assert fault.active_chief and str(fault) == "chief:active@step500:kill+3"
  aimed = fault.aimed_at(spec_lib.TaskId(Job.CHIEF, 1))
  assert str(aimed) == "chief:1@step500:kill+3" and not aimed.active_chief
  with pytest.raises(errors.UsageError, match="the active chief is hit, then comes back"):
    faults_lib.parse_faults("chief:active@step500:kill+never", STANDBY)


@pytest.mark.parametrize("seed", range(6))
def test_a_random_schedule_aims_chief_faults_at_the_active_chief_when_there_is_a_standby(seed):
  draw = lambda cluster: faults_lib.random_schedule(seed=seed, count=6, duration=100,
                                                    cluster=cluster)
  chiefs = [f for f in draw(STANDBY) if f.target.job == Job.CHIEF]
  assert chiefs and all(f.active_chief for f in chiefs)
  assert not any(f.active_chief for f in draw(CLUSTER))


def test_seconds_and_steps_do_not_mix():
  with pytest.raises(errors.UsageError, match="mixes seconds and steps"):
    faults_lib.parse_faults("worker:1@step500:kill,ps:0@20:kill", CLUSTER)


@pytest.mark.parametrize("seed", range(1, 11))
def test_a_random_schedule_by_step_lands_inside_the_run_for_every_seed(seed):
  faults = faults_lib.random_schedule(seed=seed, count=3, duration=60, cluster=CLUSTER,
                                 train_steps=2000)
  steps = [f.at_step for f in faults]
  assert steps == sorted(steps) and all(100 <= s <= 1500 for s in steps), steps
  assert {f.target.job.value for f in faults} == {"worker", "ps", "chief"}
  # Whatever the host's speed: a fault is due only by the step reached.
  assert all(not f.due(seconds=1e9, step=f.at_step - 1) for f in faults)
