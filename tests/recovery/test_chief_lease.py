"""The chief lease (tfps.recovery.chief_lease): the verdicts, the files, the fence; no TF."""

import threading

import pytest

from tfps.base import errors
from tfps.recovery import chief_lease

View = chief_lease.LeaseView
Verdict = chief_lease.Verdict


@pytest.mark.parametrize("view, mine, verdict", [
    (View(0), None, Verdict.TAKE),  # Nobody ever took it.
    (View(3, "a", silent_seconds=0.4), None, Verdict.WAIT),  # Its holder beats.
    (View(3, "a", silent_seconds=1.0), None, Verdict.TAKE),  # Silent a whole lease.
    (View(3, "a", end_code=143), None, Verdict.TAKE),  # Let go (preempted): at once.
    (View(3, "a", end_code=170), None, Verdict.TAKE),
    (View(3, "a", end_code=0), None, Verdict.ENDED),  # The run is over ...
    (View(3, "a", end_code=1, silent_seconds=9), None, Verdict.ENDED),  # ... or failed.
    (View(3, "a", end_code=2), None, Verdict.ENDED),
    (View(3, "a", silent_seconds=0.1, holder_gone=True), None, Verdict.TAKE),  # Its process died.
    # Silent, but its process lives (paused or starved): three leases, not one.
    (View(3, "a", silent_seconds=2.9, holder_present=True), None, Verdict.WAIT),
    (View(3, "a", silent_seconds=3.0, holder_present=True), None, Verdict.TAKE),
    (View(3, "a", end_code=0, holder_gone=True), None, Verdict.ENDED),  # Ended, then exited.
    (View(3, "a", silent_seconds=9), 3, Verdict.HOLD),  # Ours, whatever the reader saw.
    (View(4, "b"), 3, Verdict.SUPERSEDED),  # Taken from us while we did not beat.
])
def test_verdicts(view, mine, verdict):
  assert chief_lease.judge(view, mine=mine, lease_seconds=1.0) == verdict


def test_a_beat_is_silent_from_when_this_reader_last_saw_it_change():
  watch = chief_lease.BeatWatch()
  assert watch.silent_for(1, 5, now=100.0) == 0.0
  assert watch.silent_for(1, 5, now=100.7) == pytest.approx(0.7)
  assert watch.silent_for(1, 6, now=101.0) == 0.0  # It changed: alive.
  assert watch.silent_for(2, None, now=101.5) == 0.0  # A new generation starts afresh.


def test_one_replica_takes_each_generation_and_the_view_reads_it(tmp_path):
  store, other = chief_lease.LeaseStore(str(tmp_path)), chief_lease.LeaseStore(str(tmp_path))
  watch = chief_lease.BeatWatch()
  assert store.view(watch, 0.0) == View(0) and store.holder() is None
  assert store.view(watch, 2.0) == View(0, silent_seconds=2.0)  # Untaken that long.
  assert store.take(1, "chief:0 pid 1") and not other.take(1, "chief:1 pid 2")
  store.beat(1, 0)
  assert other.view(watch, 5.0) == View(1, "chief:0 pid 1")
  assert other.view(watch, 6.5).silent_seconds == pytest.approx(1.5)
  store.end(1, 143)
  assert other.view(watch, 7.0).end_code == 143
  assert not store.superseded(1) and other.take(2, "chief:1 pid 2") and store.superseded(1)
  assert other.latest() == 2 and store.holder() == "chief:1 pid 2"


def test_the_fence_stops_a_write_once_the_next_generation_is_taken(tmp_path):
  store = chief_lease.LeaseStore(str(tmp_path))
  store.take(1, "a")
  fence = chief_lease.Fence(str(tmp_path), 1)
  fence.check("the checkpoint of step 5")
  chief_lease.Fence(str(tmp_path), 0).check("anything")  # No lease: never fenced.
  store.take(2, "b")
  with pytest.raises(errors.Superseded, match="generation 2.*checkpoint of step 5 not written"):
    fence.check("the checkpoint of step 5")
  assert errors.Superseded.exit_code == errors.ExitCode.SUPERSEDED == 172


def test_the_keeper_beats_until_another_takes_the_next_generation(tmp_path):
  store = chief_lease.LeaseStore(str(tmp_path))
  store.take(1, "a")
  told = threading.Event()
  keeper = chief_lease.LeaseKeeper(store, 1, chief_lease.LeaseConfig(1.0, 0.01),
                                   on_superseded=told.set).start()
  watch = chief_lease.BeatWatch()
  first = store.view(watch, 0.0)
  for _ in range(500):  # A beat within 5 s, however slow the host.
    if store.view(watch, 1.0).silent_seconds == 0.0:
      break
    threading.Event().wait(0.01)
  assert store.view(watch, 1.0).silent_seconds == 0.0, first
  store.take(2, "b")
  assert told.wait(5.0) and keeper.superseded.is_set()
  keeper.stop()


def test_lease_settings_are_checked_by_name(tmp_path):
  with pytest.raises(errors.UsageError, match=r"chief_lease_seconds \(0\)"):
    chief_lease.LeaseConfig(lease_seconds=0)
  with pytest.raises(errors.UsageError, match="renew_seconds"):
    chief_lease.LeaseConfig(lease_seconds=1.0, renew_seconds=0.5)
  with pytest.raises(errors.UsageError, match="gs://b/m.*shared filesystem"):
    chief_lease.LeaseStore("gs://b/m")


def test_a_holder_s_name_gives_back_its_task():
  # tfps chaos aims `chief:active` faults at the task this returns.
  name = chief_lease.holder_named("chief:1", "vm-3:2222", 12)
  assert name == "chief:1 (vm-3:2222, pid 12)"
  assert chief_lease.holder_task(name) == "chief:1"
