"""The warm standby coordinator's plumbing, with real processes (no TF)."""

import glob
import json
import os
import signal
import sys
import textwrap
import time

import pytest

from tfps.cluster import processes
from tfps.base import signals
from tfps.recovery import events
from tfps.recovery import standby

# Stands in for `tfps run --nosupervise`: says which workers it would leave out.
_COORDINATOR = textwrap.dedent("""
    import json, os, sys
    from tfps.base import signals
    from tfps.recovery import standby
    excluded = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--exclude_tasks=")]
    if os.environ.get(standby.ENV_VAR):
      standby.mark_ready(os.environ[standby.ENV_VAR])
      go = standby.wait_for_go(signals.StopSignals.install(), sys.stdin)
      if go is None:
        sys.exit(0)
      excluded = [",".join(go.exclude_tasks)]
    print(json.dumps({"excluded": excluded[0], "warm": bool(os.environ.get(standby.ENV_VAR))}))
""")


def _coordinators(tmp_path, warm=True, program=_COORDINATOR, event_log=None):
  return standby.WarmCoordinators(
      lambda excluded: [sys.executable, "-c", program, f"--exclude_tasks={','.join(excluded)}"],
      env=dict(os.environ), stdout_dir=str(tmp_path), warm=warm, event_log=event_log)


def _said(coordinators):
  with open(coordinators.stdout_path) as f:
    return json.loads(f.read())


def test_a_restart_takes_the_standby_and_tells_it_whom_to_leave_out(tmp_path):
  coordinators = _coordinators(tmp_path)
  first, warm = coordinators.start([])
  assert not warm and first.wait(timeout=30) == 0
  assert _said(coordinators) == {"excluded": "", "warm": False}
  coordinators.prepare()
  prepared = coordinators.standby
  coordinators.prepare()
  assert coordinators.standby == prepared  # One standby at a time.
  second, warm = coordinators.start(["worker:1", "worker:0"])
  assert warm and second.wait(timeout=30) == 0
  assert _said(coordinators) == {"excluded": "worker:0,worker:1", "warm": True}
  # Each process has its own stdout file.
  assert sorted(glob.glob(str(tmp_path / "*.stdout"))) == [
      str(tmp_path / "coordinator-1.stdout"), str(tmp_path / "coordinator-2.stdout")]


def test_without_warm_standbys_every_start_is_cold(tmp_path):
  coordinators = _coordinators(tmp_path, warm=False)
  coordinators.prepare()
  process, warm = coordinators.start(["worker:1"])
  assert not warm and process.wait(timeout=30) == 0
  assert _said(coordinators) == {"excluded": "worker:1", "warm": False}


def test_close_ends_an_unused_standby(tmp_path):
  coordinators = _coordinators(tmp_path)
  coordinators.prepare()
  process, stdout_path = coordinators.standby
  coordinators.close()
  assert coordinators.standby is None
  assert process.poll() is not None  # Ended (end of its stdin, or the signal after it)...
  with open(stdout_path) as f:
    assert f.read() == ""  # ...having done nothing.
  coordinators.close()  # Nothing left to end.


# A standby still importing: sleeps before it would be ready, ignoring SIGTERM
# as an import in C would (signals wait for the interpreter).
_SLOW_IMPORT = textwrap.dedent("""
    import pathlib, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pathlib.Path(sys.argv[1]).touch()
    time.sleep(60)
""")


def test_close_ends_a_standby_still_importing_at_once(tmp_path):
  importing = tmp_path / "importing"
  coordinators = standby.WarmCoordinators(
      lambda excluded: [sys.executable, "-c", _SLOW_IMPORT, str(importing)],
      env=dict(os.environ), stdout_dir=str(tmp_path), warm=True)
  coordinators.prepare()
  process, _ = coordinators.standby
  try:
    processes.wait_until(importing.exists, timeout=30, what="the stand-in standby to start")
  except BaseException:
    processes.stop_group(process, grace=0.0)  # Never outlives the test.
    raise
  start = time.monotonic()
  coordinators.close()
  # Not ready, so nothing to lose: killed, not waited for (the 1 s stdin and
  # 5 s SIGTERM waits are for a ready standby).
  assert process.poll() == -signal.SIGKILL
  assert time.monotonic() - start < 1.0


def test_a_dead_standby_is_replaced_by_a_cold_start(tmp_path):
  coordinators = _coordinators(tmp_path)
  coordinators.prepare()
  standby_process, _ = coordinators.standby
  standby_process.kill()
  standby_process.wait(timeout=10)
  process, warm = coordinators.start(["worker:1"])
  assert not warm and process.wait(timeout=30) == 0
  assert _said(coordinators) == {"excluded": "worker:1", "warm": False}


# A standby that crashes while it imports (as one forked unsafely did): a real SIGSEGV.
_CRASHING_STANDBY = textwrap.dedent("""
    import faulthandler, os, signal, sys
    faulthandler.enable()
    if os.environ.get("TFPS_STANDBY_READY_FILE"):
      print("importing what a coordinator needs", file=sys.stderr, flush=True)
      os.kill(os.getpid(), signal.SIGSEGV)
""")


def _wait_dead(coordinators):
  process, _ = coordinators.standby
  process.wait(timeout=30)


@pytest.mark.crash_output_expected("Fatal Python error: Segmentation fault")
def test_a_standby_that_dies_before_it_is_ready_is_reported_and_not_forked_forever(tmp_path):
  log = events.EventLog(str(tmp_path))
  coordinators = _coordinators(tmp_path, program=_CRASHING_STANDBY, event_log=log)
  coordinators.prepare()
  _wait_dead(coordinators)
  coordinators.prepare()  # Sees the death; starts the second (and last) one.
  _wait_dead(coordinators)
  coordinators.prepare()  # Sees the second: no more.
  assert coordinators.standby is None and not coordinators.warm
  coordinators.prepare()
  assert coordinators.standby is None
  first, second, gave_up = log.read()
  for died in (first, second):
    assert (died.kind, died.task, died.signal) == ("died", "standby", "SIGSEGV")
    assert died.detail.endswith("before it was ready")
    assert "importing what a coordinator needs" in died.last_lines
    assert any("Fatal Python error: Segmentation fault" in line for line in died.last_lines)
  assert gave_up.kind == "action" and "2 warm standby coordinators in a row" in gave_up.detail
  assert events.summarize(log.read())["deaths"] == {"standby": 2}
  process, warm = coordinators.start([])  # Restarts go on, cold.
  assert not warm and process.wait(timeout=30) == 0


def test_a_standby_killed_after_it_was_ready_is_reported_and_replaced(tmp_path):
  log = events.EventLog(str(tmp_path))
  coordinators = _coordinators(tmp_path, event_log=log)
  coordinators.prepare()
  process, stdout_path = coordinators.standby
  processes.wait_until(lambda: os.path.exists(stdout_path + ".ready"), timeout=30,
                       what="the stand-in standby to be ready")
  coordinators.prepare()  # Seen ready.
  process.send_signal(signal.SIGKILL)
  process.wait(timeout=10)
  coordinators.prepare()
  [died] = log.read()
  assert (died.task, died.pid, died.signal) == ("standby", process.pid, "SIGKILL")
  assert not died.detail.endswith("before it was ready")
  assert coordinators.warm and coordinators.standby[0].pid != process.pid
  coordinators.close()


def test_wait_for_go_ends_on_end_of_file_or_a_stop_signal():
  r, w = os.pipe()
  os.close(w)
  with os.fdopen(r) as stdin:
    assert standby.wait_for_go(signals.StopSignals(), stdin) is None
  stop = signals.StopSignals()
  stop._handle(15, None)
  r, w = os.pipe()
  with os.fdopen(r) as stdin, os.fdopen(w, "w"):
    assert standby.wait_for_go(stop, stdin) is None
  r, w = os.pipe()
  with os.fdopen(r) as stdin:
    with os.fdopen(w, "w") as out:
      out.write('{"exclude_tasks": ["worker:2"]}\n')
    assert standby.wait_for_go(signals.StopSignals(), stdin) == standby.Go(("worker:2",))


# Like `tfps run`'s coordinator: temporary files in its own scratch directory;
# writes one (where a killed coordinator's AutoGraph files would stay), then
# waits to be killed.
_LITTERING_COORDINATOR = textwrap.dedent("""
    import tempfile, time
    from tfps.cluster import scratch
    scratch.use_for_temporary_files("tfps-coordinator-")
    with tempfile.NamedTemporaryFile(suffix=".py", delete=False) as f:
      print(f.name, flush=True)
    time.sleep(60)
""")


def test_a_killed_coordinators_temporary_files_go_at_the_next_start(tmp_path):
  coordinators = standby.WarmCoordinators(lambda _: [sys.executable, "-c", _LITTERING_COORDINATOR],
                                          env=dict(os.environ), stdout_dir=str(tmp_path),
                                          warm=False)

  def said() -> str:
    with open(coordinators.stdout_path) as f:
      return f.read()

  written = []
  for _ in range(2):
    process, _ = coordinators.start([])
    processes.wait_until(lambda: said().endswith("\n"), timeout=30,
                         what="the stand-in coordinator to write its temporary file")
    path = said().strip()
    assert os.path.dirname(os.path.dirname(path)) == str(tmp_path)  # In the chief's scratch.
    assert os.path.exists(path)  # Kept while it runs...
    written.append(path)
    process.send_signal(signal.SIGKILL)  # ...which leaves it behind...
    process.wait(timeout=10)
  assert not os.path.exists(os.path.dirname(written[0]))  # ...until the next one starts.
  assert os.path.exists(written[1])  # The chief's scratch goes with the chief.
  coordinators.close()


# Stands in for a standby chief replica's hot standby: marks itself connected
# to the whole cluster, then waits for its go (or, with --retire, retires as
# one whose ps restarted does: exit 0 before any go).
_HOT_COORDINATOR = textwrap.dedent("""
    import json, os, sys
    from tfps.base import signals
    from tfps.recovery import standby
    excluded = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--exclude_tasks=")]
    hot = bool(os.environ.get(standby.HOT_ENV_VAR))
    if os.environ.get(standby.ENV_VAR):
      standby.mark_ready(os.environ[standby.ENV_VAR])
      if hot:
        standby.mark_connected(os.environ[standby.ENV_VAR])
        if os.environ.get("RETIRE"):
          sys.exit(0)
      go = standby.wait_for_go(signals.StopSignals.install(), sys.stdin)
      if go is None:
        sys.exit(0)
      excluded = [",".join(go.exclude_tasks)]
    print(json.dumps({"excluded": excluded[0], "hot": hot}))
""")


def _wait_connected(coordinators):
  _, stdout_path = coordinators.standby
  processes.wait_until(lambda: os.path.exists(standby.connected_path(stdout_path + ".ready")),
                       timeout=30, what="the stand-in hot standby to connect")


def test_a_hot_standby_takes_over_the_whole_cluster_only(tmp_path):
  coordinators = _coordinators(tmp_path, program=_HOT_COORDINATOR)
  coordinators.prepare(hot=True)
  _wait_connected(coordinators)
  hot_one = coordinators.standby[0]
  # A takeover that leaves a ps out cannot use it: a cold coordinator instead.
  process, warm = coordinators.start(["ps:1"])
  assert not warm and process.wait(timeout=30) == 0
  assert _said(coordinators) == {"excluded": "ps:1", "hot": False}
  assert hot_one.poll() is not None  # Ended, not left behind.
  coordinators.prepare(hot=True)
  _wait_connected(coordinators)
  process, warm = coordinators.start([])
  assert warm and process.wait(timeout=30) == 0
  assert _said(coordinators) == {"excluded": "", "hot": True}


def test_a_warm_standby_and_a_hot_one_replace_each_other(tmp_path):
  coordinators = _coordinators(tmp_path, program=_HOT_COORDINATOR)
  coordinators.prepare()
  warm_one = coordinators.standby[0]
  coordinators.prepare(hot=True)  # The replica now stands by.
  hot_one = coordinators.standby[0]
  assert hot_one.pid != warm_one.pid and warm_one.poll() is not None  # Ended, not left.
  coordinators.prepare()  # It holds the lease now: its next coordinator cannot connect ahead.
  assert coordinators.standby[0].pid != hot_one.pid and hot_one.poll() is not None
  coordinators.close()


def test_a_retired_hot_standby_is_not_a_death_and_is_replaced_at_once(tmp_path):
  # Replaced at the first look after it retired: the new one imports while
  # the cluster recovers (it connects only once the cluster trains again).
  log = events.EventLog(str(tmp_path))
  coordinators = standby.WarmCoordinators(
      lambda excluded: [sys.executable, "-c", _HOT_COORDINATOR],
      env={**os.environ, "RETIRE": "1"}, stdout_dir=str(tmp_path), warm=True, event_log=log)
  assert coordinators.prepare(hot=True)
  retired = coordinators.standby[0]
  assert retired.wait(timeout=30) == 0
  assert coordinators.prepare(hot=True)
  assert coordinators.standby[0].pid != retired.pid and log.read() == []
  # Where the cluster's tasks share the host, not at once: the caller asks
  # again once the cluster trains (its import would slow the recovery).
  retired = coordinators.standby[0]
  assert retired.wait(timeout=30) == 0
  assert coordinators.prepare(hot=True, replace_retired=False) is False
  assert coordinators.standby is None and log.read() == []
  assert coordinators.prepare(hot=True) and coordinators.standby[0].pid != retired.pid
  coordinators.standby[0].wait(timeout=30)
  coordinators.close()


def test_wait_for_go_looks_after_what_it_prepared_between_looks():
  looks = []
  r, w = os.pipe()
  with os.fdopen(r) as stdin, os.fdopen(w, "w") as out:
    def idle():
      looks.append(time.monotonic())
      if len(looks) == 2:
        out.write('{"exclude_tasks": [], "lease_generation": 3}\n')
        out.flush()
    assert standby.wait_for_go(signals.StopSignals(), stdin, idle=idle) == standby.Go((), 3)
  assert len(looks) == 2
