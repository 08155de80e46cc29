"""The chaos tracker and reports (tfps.chaos.tracker) are pure: recoveries, stalls and
steps lost summed from progress records."""

import pytest

from tfps.chaos import faults as faults_lib
from tfps.chaos import tracker as tracker_lib
from tfps.cluster import spec as spec_lib

CLUSTER = spec_lib.ClusterSpec.from_dict({
    "chief": ["c:1"], "ps": ["p:1", "p:2"], "worker": ["w:1", "w:2"]})


def test_report():
  w1 = faults_lib.parse_faults("worker:1@20:kill+5", CLUSTER)[0]
  p0 = faults_lib.parse_faults("ps:0@40:term+3", CLUSTER)[0]
  c0 = faults_lib.parse_faults("chief:0@60:kill+2", CLUSTER)[0]
  out = tracker_lib.report([tracker_lib.FaultOutcome(w1, 20.1, True, 4.0),
                      tracker_lib.FaultOutcome(p0, 40.0, True, 12.0),
                      tracker_lib.FaultOutcome(c0, 60.3, False, None)])
  assert out["faults_injected"] == 3 and out["recoveries"] == 2
  assert out["recovery_seconds"] == {"p50": 8.0, "max": 12.0}
  assert out["faults"][1] == {"target": "ps:0", "signal": "SIGTERM", "action": "term",
                              "back_after": 3.0, "time": 40.0, "recovered": True,
                              "seconds_to_recover": 12.0, "longest_stall_seconds": None,
                              "stall_beyond_loop_seconds": None, "loop_seconds_before": None,
                              "loop_seconds_after": None, "closures_per_worker_after": {},
                              "steps_lost": 0}


def _record(step, time, restored=False):
  from tfps.recovery import progress_log
  return progress_log.Progress(step, time, restored)


# Each case: the fault, the loops before it, when it was injected, then the
# batches of progress records observed after it (the fault counts as
# recovered only after the last batch), and the recovery seconds and steps
# lost the tracker must report.
@pytest.mark.parametrize("fault, before, injected_at, batches, seconds, lost", [
    # TF retries a lost worker's closures: the next loop is the recovery.
    ("worker:1@20:kill+5", [(100, 10.0), (200, 11.0)], 11.5, [[(300, 13.0)]], 1.5, 0),
    # A record not past the last step is no recovery; nor is the restore from
    # ckpt-200 itself; the first loop past the restored step is.
    ("ps:0@20:kill+3", [(200, 10.0), (300, 11.0)], 11.2,
     [[(250, 12.0)], [(200, 20.0, True)], [(300, 24.2)]], 13.0, 100),
    # Preempted: the loop it ends while saving is not a recovery, the
    # restore (exactly where it saved) and the next loop are.
    ("ps:0@20:term+3", [(300, 11.0)], 11.2,
     [[(400, 12.0)], [(400, 20.0, True), (500, 21.5)]], 10.3, 0),
    ("chief:0@20:term+3", [(300, 11.0)], 11.2,
     [[(400, 12.0)], [(400, 20.0, True), (500, 21.5)]], 10.3, 0),
    # A stopped ps resumes where it was: no restore.
    ("ps:0@20:stop+5", [(300, 11.0)], 11.2, [[(400, 17.0)]], 5.8, 0),
    # TCP bridges a short cut: the same coordinator goes on.
    ("ps:0@20:cut+5", [(300, 11.0)], 11.2, [[(350, 19.6)]], 8.4, 0),
    ("chief:0@20:cut+5", [(300, 11.0)], 11.2, [[(350, 19.6)]], 8.4, 0),
    # A cut past the ps deadline restarts the coordinator from a checkpoint.
    ("ps:0@20:cut+20", [(300, 11.0)], 11.2,
     [[(200, 40.0, True)], [(250, 45.2)]], 34.0, 100),
], ids=["worker_kill", "ps_kill", "ps_term", "chief_term", "ps_stop", "ps_short_cut",
        "chief_short_cut", "ps_long_cut"])
def test_tracker_recovery_seconds_and_steps_lost(fault, before, injected_at, batches,
                                                 seconds, lost):
  tracker = tracker_lib.RecoveryTracker()
  tracker.observe([_record(*r) for r in before])
  tracker.injected(faults_lib.parse_faults(fault, CLUSTER)[0], wall_time=injected_at,
                   since_start=20.0)
  for batch in batches:
    assert not tracker.all_recovered
    tracker.observe([_record(*r) for r in batch])
  (outcome,) = tracker.outcomes()
  assert outcome.recovered and tracker.all_recovered
  assert (outcome.seconds_to_recover, outcome.steps_lost) == (seconds, lost)
  assert tracker_lib.report([outcome])["steps_lost"] == lost


def test_the_longest_stall_counts_a_later_loop_that_waits_for_a_cut_worker():
  # A loop whose closures were done ends just after the cut (first progress:
  # 0.1 s); the next one waits until the link heals (measured: 7.3 s).
  tracker = tracker_lib.RecoveryTracker()
  tracker.observe([_record(200, 10.0), _record(400, 10.8)])
  tracker.injected(faults_lib.parse_faults("worker:1@20:cut+5", CLUSTER)[0], wall_time=11.0,
                   since_start=20.0)
  tracker.observe([_record(600, 11.1), _record(800, 18.4), _record(1000, 19.2)])
  (outcome,) = tracker.outcomes()
  assert (outcome.seconds_to_recover, outcome.longest_stall) == (0.1, 7.3)
  assert tracker_lib.report([outcome])["longest_stall_seconds"] == {"p50": 7.3, "max": 7.3}


def test_the_stall_beyond_a_loop_is_the_longest_stall_less_the_loops_before_the_fault():
  # Measured (soak of 2026-11-26): with one worker away, each loop runs on
  # the other alone, 1.45 s against ~0.7 s before; no loop waits longer.
  tracker = tracker_lib.RecoveryTracker()
  # Loops of 0.7 s, then a slow one among the last ten: the median leaves it out.
  tracker.observe([_record(0, 0.0, restored=True)]
                  + [_record(200 * i, 10.0 + 0.7 * i) for i in range(1, 13)]
                  + [_record(2600, 20.0)])
  tracker.injected(faults_lib.parse_faults("worker:1@20:term+5", CLUSTER)[0], wall_time=20.1,
                   since_start=20.0)
  tracker.observe([_record(2800, 21.0), _record(3000, 22.45), _record(3200, 23.2)])
  (outcome,) = tracker.outcomes()
  assert (outcome.longest_stall, outcome.loop_before) == (1.45, 0.7)
  assert outcome.as_dict()["stall_beyond_loop_seconds"] == 0.75
  # A restore starts the count of loops again: the first loop of a new
  # coordinator, after its start, is no measure of an ordinary loop.
  tracker.observe([_record(3000, 40.0, restored=True), _record(3200, 45.0)])
  tracker.injected(faults_lib.parse_faults("ps:0@50:kill+3", CLUSTER)[0], wall_time=46.0,
                   since_start=50.0)
  tracker.observe([_record(3000, 55.0, restored=True), _record(3200, 60.0)])
  assert tracker.outcomes()[1].loop_before is None
  assert tracker.outcomes()[1].as_dict()["stall_beyond_loop_seconds"] is None


def test_a_restart_taking_back_a_task_an_earlier_fault_left_out_is_not_a_later_faults_stall():
  # Measured (soak of 2026-11-26, run 2): a ps SIGTERM, ps failover; a worker
  # SIGTERM; 50 s later the coordinator restarts to take the ps back (9 s to
  # its first loop), which the worker's window counted as its own stall.
  from tfps.recovery import progress_log
  tracker = tracker_lib.RecoveryTracker()
  tracker.observe([_record(1000, 10.0)])
  tracker.injected(faults_lib.parse_faults("ps:0@20:term+5", CLUSTER)[0], wall_time=10.5,
                   since_start=20.0)
  tracker.observe([progress_log.Progress(1000, 20.0, restored=True, left_out=("ps:0",)),
                   _record(1200, 21.0), _record(1400, 21.5)])
  tracker.injected(faults_lib.parse_faults("worker:1@40:term+5", CLUSTER)[0], wall_time=22.0,
                   since_start=40.0)
  tracker.observe([_record(1600, 23.0), _record(1800, 24.0),
                   _record(1800, 70.0, restored=True), _record(2000, 79.0)])
  ps, worker = tracker.outcomes()
  assert worker.longest_stall == 1.0 and worker.recovered
  assert ps.longest_stall == 10.5  # From the fault to the failover's first loop.
  # A restart that takes back the fault's own task stays in its window.
  tracker = tracker_lib.RecoveryTracker()
  tracker.observe([_record(1000, 10.0)])
  tracker.injected(faults_lib.parse_faults("ps:0@20:term+5", CLUSTER)[0], wall_time=10.5,
                   since_start=20.0)
  tracker.observe([progress_log.Progress(1000, 20.0, restored=True, left_out=("ps:0",)),
                   _record(1200, 21.0), _record(1200, 70.0, restored=True), _record(1400, 79.0)])
  assert tracker.outcomes()[0].longest_stall == 58.0  # 21.0 -> 79.0.
  # Nor the window of the fault the restart recovers, which may take back another
  # task too (run 3: the restart after a ps:0 kill took back ps:1, out since a failover).
  tracker = tracker_lib.RecoveryTracker()
  tracker.observe([progress_log.Progress(1000, 20.0, restored=True, left_out=("ps:1",)),
                   _record(1200, 21.0)])
  tracker.injected(faults_lib.parse_faults("ps:0@40:kill+5", CLUSTER)[0], wall_time=22.0,
                   since_start=40.0)
  tracker.observe([_record(1400, 22.5), _record(1200, 30.0, restored=True),
                   _record(1400, 35.0)])
  (ps,) = tracker.outcomes()
  assert (ps.seconds_to_recover, ps.longest_stall) == (13.0, 12.5)


def test_the_longest_stall_ends_at_the_next_fault_and_spans_a_restart():
  tracker = tracker_lib.RecoveryTracker()
  tracker.observe([_record(500, 10.0)])
  tracker.injected(faults_lib.parse_faults("worker:1@20:kill+never", CLUSTER)[0], wall_time=10.5,
                   since_start=20.0)
  # Its closures run elsewhere at once; at --worker_timeout the coordinator
  # saves and restarts without it (a restore record, then 12 s to a loop).
  tracker.observe([_record(700, 11.0), _record(900, 12.0), _record(900, 40.0, restored=True),
                   _record(1100, 52.0)])
  assert tracker.outcomes()[0].longest_stall is not None
  tracker.injected(faults_lib.parse_faults("ps:0@70:kill+3", CLUSTER)[0], wall_time=60.0,
                   since_start=70.0)
  tracker.observe([_record(1100, 75.0, restored=True), _record(1300, 90.0)])
  never, ps = tracker.outcomes()
  assert (never.seconds_to_recover, never.longest_stall) == (0.5, 40.0)  # 12.0 -> 52.0.
  assert (ps.seconds_to_recover, ps.longest_stall) == (30.0, 30.0)
  # No loop ended yet and no later fault: nothing to say.
  tracker.injected(faults_lib.parse_faults("chief:0@95:kill+3", CLUSTER)[0], wall_time=91.0,
                   since_start=95.0)
  assert tracker.outcomes()[2].longest_stall is None
  assert tracker.outcomes()[1].longest_stall == 30.0  # Closed at 91.0: 1.0 s since 90.0.


def test_tracker_does_not_count_an_earlier_faults_lost_steps_again():
  tracker = tracker_lib.RecoveryTracker()
  tracker.observe([_record(2700, 10.0)])
  tracker.injected(faults_lib.parse_faults("ps:0@20:kill+3", CLUSTER)[0], wall_time=10.5,
                   since_start=20.0)
  tracker.observe([_record(2500, 20.0, restored=True)])  # Lost 200; no loop ended yet...
  tracker.injected(faults_lib.parse_faults("chief:0@30:term+3", CLUSTER)[0], wall_time=21.0,
                   since_start=30.0)  # ...when the chief is preempted (it saves at 2550).
  tracker.observe([_record(2550, 30.0, restored=True), _record(2700, 32.0)])
  ps, chief = tracker.outcomes()
  assert (ps.steps_lost, chief.steps_lost) == (200, 0)
  assert ps.recovered and chief.recovered


def test_a_kill_of_a_ps_the_coordinator_runs_without_needs_no_restore(tmp_path):
  from tfps.recovery import progress_log
  log = progress_log.ProgressLog(str(tmp_path))  # The restore record says what was left out.
  log.append(1000, restored=True, now=10.0, left_out=("ps:1",))
  log.append(1200, now=11.0)
  tracker = tracker_lib.RecoveryTracker()
  tracker.observe(log.read_new())
  tracker.injected(faults_lib.parse_faults("ps:1@20:kill+3", CLUSTER)[0], wall_time=11.5,
                   since_start=20.0)
  tracker.observe([_record(1400, 12.0)])  # Training went on: recovered, nothing lost.
  (left_out,) = tracker.outcomes()
  assert (left_out.seconds_to_recover, left_out.steps_lost) == (0.5, 0)
  # ps:0 holds the coordinator's variables: its loss needs a new coordinator.
  tracker.injected(faults_lib.parse_faults("ps:0@30:kill+3", CLUSTER)[0], wall_time=12.5,
                   since_start=30.0)
  tracker.observe([_record(1600, 13.0)])
  assert not tracker.outcomes()[1].recovered
  tracker.observe([_record(1400, 20.0, restored=True), _record(1600, 21.0)])
  assert tracker.outcomes()[1].seconds_to_recover == 8.5
  # That coordinator (a restore record without left_out) runs on ps:1 again.
  tracker.injected(faults_lib.parse_faults("ps:1@40:kill+3", CLUSTER)[0], wall_time=22.0,
                   since_start=40.0)
  tracker.observe([_record(1800, 23.0)])
  assert not tracker.outcomes()[2].recovered


def test_a_join_is_done_once_a_coordinator_restored_with_the_new_worker(tmp_path):
  from tfps.recovery import progress_log
  cluster = spec_lib.ClusterSpec.from_dict({
      "chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1", "w:2", "w:3"]})
  log = progress_log.ProgressLog(str(tmp_path))
  log.append(0, restored=True, now=10.0, left_out=("worker:1", "worker:2"))  # Room for two.
  for step, now in [(200, 11.0), (400, 12.5), (600, 14.0)]:  # Loops of 1.5 s.
    log.append(step, now=now)
  tracker = tracker_lib.RecoveryTracker()
  tracker.observe(log.read_new())
  join, = faults_lib.parse_faults("worker:1@step600:join", cluster, workers_started=1)
  tracker.injected(join, wall_time=14.5, since_start=4.5)
  log.append(800, now=15.5)  # A loop of the coordinator without it: not the join.
  log.append(600, restored=True, now=16.0, left_out=("worker:1", "worker:2"))  # Another restart.
  log.append(800, now=17.0)
  tracker.observe(log.read_new())
  assert not tracker.outcomes()[0].recovered
  log.append(800, restored=True, now=20.0, left_out=("worker:2",))  # It is in.
  for step, now in [(1000, 21.5), (1200, 22.5), (1400, 23.5), (1600, 24.5)]:
    # Faster with it: loops of 1 s, and closures on the new worker.
    log.append(step, now=now, closures=[("worker:0", 2), ("worker:1", 2)])
  records = log.read_new()
  tracker.observe(records)
  (joined,) = tracker.outcomes()
  assert (joined.seconds_to_recover, joined.steps_lost) == (7.0, 0)
  assert (joined.loop_before, joined.loop_after) == (1.5, 1.0)
  # The loops after the one that recovered it (1.5 s, 1.0 s, ...: its first is the recovery).
  assert joined.as_dict()["closures_per_worker_after"] == {"worker:0": 6, "worker:1": 6}
  assert tracker_lib.closures_per_worker(records) == {"worker:0": 8, "worker:1": 8}
  assert tracker_lib.fault_kind(joined.as_dict()) == "worker join"


def test_tracker_fault_never_followed_by_progress_is_not_recovered():
  tracker = tracker_lib.RecoveryTracker()
  fault = faults_lib.parse_faults("chief:0@5:kill+2", CLUSTER)[0]
  tracker.injected(fault, wall_time=5.0, since_start=5.0)
  tracker.observe([_record(0, 9.0, restored=True)])
  assert not tracker.all_recovered and not tracker.outcomes()[0].recovered


def _reported(target, action, seconds, lost=0, back_after=5.0, stall=None):
  return {"target": target, "action": action, "back_after": back_after,
          "recovered": seconds is not None, "seconds_to_recover": seconds,
          "longest_stall_seconds": stall, "steps_lost": lost}


def test_soak_summary_pools_runs_and_splits_by_kind_of_fault():
  runs = [
      {"status": "ok", "faults": [_reported("worker:1", "kill", 4.0, stall=6.0),
                                  _reported("ps:0", "kill", 20.0, lost=150, stall=21.0)],
       # 1,000 steps at 10/s: 100 s of fault-free time, in 125 s.
       "goodput": {"goodput": 0.8, "kept_steps": 1000, "wall_seconds": 125.0,
                   "fault_free_steps_per_sec": 10.0}},
      {"status": "failed", "faults": [_reported("ps:0", "kill", None),
                                      _reported("worker:0", "kill", 2.0, back_after=None)],
       # 12.5 s of fault-free time in 25 s: a short run weighs less.
       "goodput": {"goodput": 0.5, "kept_steps": 100, "wall_seconds": 25.0,
                   "fault_free_steps_per_sec": 8.0}},
      None,  # A run that printed no result.
  ]
  summary = tracker_lib.soak_summary(runs)
  assert (summary["runs"], summary["runs_finished"]) == (3, 1)
  assert (summary["faults_injected"], summary["recoveries"], summary["steps_lost"]) == (4, 3, 150)
  assert summary["recovery_seconds"] == {"p50": 4.0, "max": 20.0}
  assert summary["longest_stall_seconds"] == {"p50": 13.5, "max": 21.0}
  assert summary["by_kind"]["ps kill"] == {
      "faults": 2, "recovered": 1, "recovery_seconds": {"p50": 20.0, "max": 20.0},
      "longest_stall_seconds": {"p50": 21.0, "max": 21.0},
      "stall_beyond_loop_seconds": {"p50": None, "max": None}, "steps_lost_max": 150}
  assert summary["by_kind"]["worker never"]["faults"] == 1
  assert summary["by_kind"]["worker kill"]["recovery_seconds"] == {"p50": 4.0, "max": 4.0}
  # (100 s + 12.5 s of fault-free time) over (125 s + 25 s) of wall time,
  # which saw 4 faults.
  assert summary["goodput"] == {"goodput": 0.75, "lowest_run": 0.5, "seconds_per_fault": 37.5}
  assert tracker_lib.soak_summary([None])["recovery_seconds"] == {"p50": None, "max": None}
  assert tracker_lib.soak_summary([None])["goodput"] == {
      "goodput": None, "lowest_run": None, "seconds_per_fault": None}
