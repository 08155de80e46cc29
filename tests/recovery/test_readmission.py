"""When a left-out ps is taken back (recovery.readmission): pure, no TensorFlow."""

import re

import pytest

from tfps.recovery import events
from tfps.recovery import progress_log
from tfps.recovery import readmission

Progress = progress_log.Progress


class Run:
  """Progress records as coordinators write them: a restore, then loops."""

  def __init__(self):
    self.records: list[Progress] = []
    self.time = 1000.0
    self.step = 0

  def coordinator(self, *, left_out=(), start_seconds=5.0):
    self.time += start_seconds
    self.records.append(Progress(step=self.step, time=self.time, restored=True,
                                 left_out=tuple(left_out)))
    return self

  def loops(self, count, rate, *, seconds=1.0, looped=False):
    for _ in range(count):
      self.time += seconds
      self.step += round(rate * seconds)
      self.records.append(Progress(step=self.step, time=self.time, looped=looped))
    return self


def without_ps0(run):
  return run.coordinator(left_out=("ps:0",))


def test_not_before_the_coordinator_without_the_ps_has_started():
  run = Run().coordinator().loops(20, 400)
  assert readmission.seconds_lost(run.records) is None
  assert not readmission.due(run.records)


def test_taken_back_at_once_when_the_run_never_trained_with_every_ps():
  run = without_ps0(Run()).loops(1, 400)
  assert readmission.due(run.records)
  # A first coordinator that only restored (no loop to measure) is no reference either.
  run = without_ps0(Run().coordinator()).loops(1, 400)
  assert readmission.due(run.records)


def test_as_fast_without_the_ps_it_is_never_due():
  run = without_ps0(Run().coordinator().loops(50, 400)).loops(2000, 400)
  assert readmission.seconds_lost(run.records) == pytest.approx(0.0, abs=0.05)
  assert not readmission.due(run.records)


def test_slower_without_it_due_once_the_loss_adds_up_to_a_restart():
  run = without_ps0(Run().coordinator().loops(50, 400))
  # 25 % slower: 0.2 s lost per 1 s loop beyond the 5 % of noise; the first loop is its start.
  run.loops(30, 300)
  assert readmission.seconds_lost(run.records) == pytest.approx(0.2 * 29, rel=0.01)
  assert not readmission.due(run.records)
  run.loops(12, 300)
  assert readmission.seconds_lost(run.records) == pytest.approx(0.2 * 41, rel=0.01)
  assert readmission.due(run.records)


def test_a_slowdown_within_the_hosts_drift_is_not_counted():
  run = without_ps0(Run().coordinator().loops(50, 400)).loops(5000, 384)  # 4 % slower.
  assert readmission.seconds_lost(run.records) == 0.0
  assert not readmission.due(run.records)
  exact = readmission.ReadmitCosts(speed_noise=0.0)
  assert readmission.seconds_lost(run.records, exact) == pytest.approx(0.04 * 4999, rel=0.01)
  assert readmission.due(run.records, exact)


def test_judged_only_after_enough_loops():
  costs = readmission.ReadmitCosts(restart_seconds=0.0, speed_noise=0.0, min_loops=3)
  run = without_ps0(Run().coordinator().loops(10, 400)).loops(3, 100)
  assert readmission.seconds_lost(run.records, costs) is None  # 2 loops after the first.
  assert not readmission.due(run.records, costs)
  run.loops(1, 100)
  assert readmission.due(run.records, costs)


def test_looped_loops_are_compared_with_looped_ones():
  # With every ps: written out at 400 steps/s, looped at 380.
  run = Run().coordinator().loops(20, 380, looped=True).loops(20, 400)
  without_ps0(run).loops(500, 380, looped=True)
  assert readmission.seconds_lost(run.records) == pytest.approx(0.0, abs=0.05)
  # Only written-out loops with every ps: looped ones are held to the
  # measured looped speed (0.91) of them.
  run = without_ps0(Run().coordinator().loops(20, 400)).loops(500, 364, looped=True)
  assert readmission.seconds_lost(run.records) == pytest.approx(0.0, abs=0.05)
  run = without_ps0(Run().coordinator().loops(20, 364, looped=True)).loops(500, 400)
  assert readmission.seconds_lost(run.records) == pytest.approx(0.0, abs=0.05)


def test_looped_loops_are_compared_with_the_latest_looped_ones_however_far_back():
  # Looped at 395 with every ps, then 1,000 written-out loops at 400 (the window's worth):
  # measured in a 4-fault run, the last coordinator looped on one ps at 0.87 of the run.
  run = Run().coordinator().loops(20, 395, looped=True).loops(1000, 400)
  without_ps0(run).loops(100, 345, looped=True)
  # 345/395 is 0.873 (7.7 % beyond the noise, over the 99 s after its first loop). Against
  # 0.91 x 400 (the measured looped speed) it would be 0.948, within the noise: no restart.
  assert readmission.seconds_lost(run.records) == pytest.approx(0.077 * 99, rel=0.02)
  assert readmission.due(run.records)


def test_an_odd_slow_loop_is_not_the_missing_ps():
  run = without_ps0(Run().coordinator().loops(20, 400)).loops(10, 400)
  run.loops(1, 40, seconds=10.0)  # A paused worker, say.
  run.loops(10, 400)
  assert not readmission.due(run.records)


def test_the_reference_is_the_coordinators_with_every_ps_only():
  run = Run().coordinator().loops(20, 400)
  without_ps0(run).loops(20, 200)  # An earlier failover, slow.
  run.coordinator().loops(20, 400)
  without_ps0(run).loops(20, 400)
  # Compared with 400 (not with the earlier failover's 200): nothing lost.
  assert readmission.seconds_lost(run.records) == pytest.approx(0.0, abs=0.05)
  # A worker left out is not a ps left out.
  run.coordinator(left_out=("worker:1",)).loops(20, 200)
  assert readmission.seconds_lost(run.records) is None


@pytest.mark.parametrize("kwargs, message", [
    ({"restart_seconds": -1.0}, "restart_seconds (-1.0) must be >= 0"),
    ({"min_loops": 0}, "min_loops (0) must be >= 1"),
    ({"speed_noise": 1.0}, "speed_noise (1.0) must be in [0, 1)"),
    ({"window": 2}, "window (2) must be >= min_loops (3)"),
])
def test_costs_validation(kwargs, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    readmission.ReadmitCosts(**kwargs)


def test_the_chiefs_launcher_judges_from_the_whole_run_and_still_sees_its_coordinator_train(
    tmp_path):
  """The supervisor's launcher (run_command) reads the progress log for both
  the readmission and whether the running coordinator trained: one read
  must not hide a record from the other."""
  import json
  from tfps.commands import chief
  from tfps.commands import run_spec
  from tfps.cluster import spec as spec_lib
  config = spec_lib.from_tf_config(json.dumps({
      "cluster": {"chief": ["localhost:1"], "ps": ["localhost:2", "localhost:3"],
                  "worker": ["localhost:4"]}, "task": {"type": "chief", "index": 0}}))
  model_dir = str(tmp_path)

  def launcher(**spec):
    made = chief._CoordinatorLauncher(
        config, run_spec.RunSpec(model_dir=model_dir, warm_standby=False, **spec), model_dir,
        events.EventLog(model_dir))
    made._coordinators.start = lambda excluded, lease_generation=0: (None, False)  # No process.
    return made

  measured = launcher()
  log = progress_log.ProgressLog(model_dir)
  log.append(0, restored=True, now=0.0)
  for i in range(1, 11):
    log.append(400 * i, now=float(i))
  measured.start(1, frozenset({"ps:1"}))  # After ps:1's failover.
  log.append(4000, restored=True, now=20.0, left_out=("ps:1",))
  assert not measured.trained()
  assert not measured.ps_back_due()  # Not judged before min_loops.
  log.append(4100, now=22.0)
  assert not measured.ps_back_due()  # It read the loop record ...
  assert measured.trained()  # ... and the coordinator's having trained is still seen.
  assert launcher(ps_readmit="timed").ps_back_due()


@pytest.mark.parametrize("readmit, expected", [
    (readmission.Readmit.MEASURED, ("worker:1",)),  # The ps stays out unless it costs.
    (readmission.Readmit.TIMED, ("ps:0", "worker:1")),
    ("timed", ("ps:0", "worker:1")),
])
def test_which_left_out_tasks_are_expected_back_soon(readmit, expected):
  assert readmission.expected_back(("ps:0", "worker:1"), readmit) == expected


def test_the_speeds_compared_are_the_latest_loops_on_either_side():
  costs = readmission.ReadmitCosts(window=10)
  run = Run().coordinator().loops(100, rate=50).loops(10, rate=100)  # Faster lately.
  without_ps0(run).loops(20, rate=50).loops(30, rate=80)
  # Against the latest 10 loops with every ps (100/s), the latest 10 without (80/s): 15 % lost
  # over the 49 s of its loops after the first.
  assert readmission.seconds_lost(run.records, costs) == pytest.approx(0.15 * 49, rel=0.01)
  assert readmission.due(run.records, costs)
  everything = readmission.ReadmitCosts(window=1000)  # Medians 50/s and 50/s: nothing lost.
  assert readmission.seconds_lost(run.records, everything) == 0.0


def test_grouping_records_as_they_come_equals_grouping_them_at_once():
  run = Run().coordinator().loops(5, rate=50)
  without_ps0(run).loops(4, rate=40).loops(3, rate=45, looped=True)
  grouped = progress_log.CoordinatorLoops()
  for start in range(0, len(run.records), 3):  # Read a few at a time, as the launcher does.
    grouped.extend(run.records[start:start + 3])
  assert grouped.coordinators == progress_log.loops_by_coordinator(run.records)
  assert readmission.judge(grouped.coordinators) == readmission.due(run.records)
