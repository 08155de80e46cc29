"""The progress log (tfps.recovery.progress_log): pure, no TF."""

from tfps.recovery import progress_log as progress_lib


def test_progress_log_reads_incrementally_and_skips_a_partial_line(tmp_path):
  writer, reader = progress_lib.ProgressLog(str(tmp_path)), progress_lib.ProgressLog(str(tmp_path))
  assert reader.read_new() == []
  writer.append(100, now=1.0)
  writer.append(80, restored=True, now=2.0)
  assert reader.read_new() == [progress_lib.Progress(100, 1.0),
                               progress_lib.Progress(80, 2.0, restored=True)]
  with open(writer.path, "a") as f:
    f.write('{"step": 3')  # A writer caught mid-line.
  assert reader.read_new() == []
  with open(writer.path, "a") as f:
    f.write('00, "time": 3.0}\n')
  assert reader.read_new() == [progress_lib.Progress(300, 3.0)]


def test_looped_and_warming_loops_are_marked_in_the_progress_log(tmp_path):
  log = progress_lib.ProgressLog(str(tmp_path))
  log.append(0, restored=True, now=1.0)
  log.append(200, looped=True, now=2.0)
  log.append(400, warming=True, now=3.0)
  log.append(600, now=4.0)
  records = log.read_new()
  assert [(r.looped, r.warming) for r in records] == [(False, False), (True, False),
                                                      (False, True), (False, False)]
  assert [loop.warming for _, loops in progress_lib.loops_by_coordinator(records)
          for loop in loops] == [True, False]
  assert '"looped"' not in (tmp_path / progress_lib.FILE_NAME).read_text().splitlines()[3]


def test_closures_per_worker_are_kept_in_a_loop_record(tmp_path):
  log = progress_lib.ProgressLog(str(tmp_path))
  log.append(200, now=1.0, closures=[("worker:1", 3), ("worker:0", 4)])
  log.append(400, now=2.0)
  assert [r.closures for r in log.read_new()] == [(("worker:0", 4), ("worker:1", 3)), ()]


def test_a_superseded_coordinator_writes_no_record_and_its_late_ones_are_dropped(tmp_path):
  from tfps.base import errors
  from tfps.recovery import chief_lease
  import pytest
  store = chief_lease.LeaseStore(str(tmp_path))
  assert store.take(1, "chief:0")
  old = progress_lib.ProgressLog(str(tmp_path), chief_lease.Fence(str(tmp_path), 1))
  old.append(100, now=1.0)
  assert store.take(2, "chief:1")  # The standby takes over ...
  new = progress_lib.ProgressLog(str(tmp_path), chief_lease.Fence(str(tmp_path), 2))
  new.append(80, restored=True, now=2.0)
  with pytest.raises(errors.Superseded, match="progress record of step 120 not written"):
    old.append(120, now=3.0)  # ... and the old one, awake, writes nothing.
  with open(old.path, "a") as f:  # One that checked just before the takeover: too late.
    f.write('{"step": 120, "time": 3.0, "generation": 1}\n')
  new.append(280, now=4.0)
  assert [(r.step, r.generation) for r in progress_lib.ProgressLog(str(tmp_path)).read_new()
          ] == [(100, 1), (80, 2), (280, 2)]
