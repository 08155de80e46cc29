"""A chief replica's loop (tfps.recovery.chief_replica) on a real lease store, a fake clock,
a stand-in supervisor; no TF, no processes."""

import signal
import socket

import portpicker

from tfps.base import errors
from tfps.base import signals
from tfps.recovery import chief_lease
from tfps.recovery import chief_replica
from tfps.recovery import events
from tfps.recovery import supervisor

Result = supervisor.SupervisorResult


class Clock:
  """Each reading is `step` seconds after the last: the standby's polls pass time."""

  def __init__(self, step=0.25):
    self.now, self.step = 0.0, step

  def __call__(self):
    self.now += self.step
    return self.now


def replica(tmp_path, index, *, sees=lambda: True, stop=None):
  return chief_replica.ChiefReplica(
      chief_lease.LeaseStore(str(tmp_path)), chief_lease.LeaseConfig(1.0, 0.01),
      replica=index, me=f"chief:{index}", stop=stop or signals.StopSignals(),
      event_log=events.EventLog(str(tmp_path)), clock=Clock(), sees_cluster=sees)


def test_the_first_replica_takes_the_lease_at_once_and_its_end_is_written(tmp_path):
  held = []
  chief, other = replica(tmp_path, 0), replica(tmp_path, 1)  # Both start with the run.
  result = chief.run(lambda generation, superseded: held.append(generation) or
                     Result(errors.ExitCode.OK, 0, "finished"), stand_by=lambda: None)
  assert held == [1] and result.exit_code == errors.ExitCode.OK
  chief.release(result.exit_code)
  # The standby, seeing the end, leaves with the run's code without taking anything.
  ended = other.run(lambda *_: Result(errors.ExitCode.PERMANENT, 0, "must not run"),
                    stand_by=lambda: None)
  assert ended.exit_code == errors.ExitCode.OK and other.ended_elsewhere
  assert chief_lease.LeaseStore(str(tmp_path)).latest() == 1


def test_a_standby_takes_over_a_silent_holder_and_records_it(tmp_path):
  store = chief_lease.LeaseStore(str(tmp_path))
  store.take(1, "chief:0 (gone)")
  store.beat(1, 7)  # Never again: its holder was killed.
  stand_bys, held = [], []
  standby = replica(tmp_path, 1)
  result = standby.run(lambda generation, superseded: held.append(generation) or
                       Result(errors.ExitCode.OK, 0, "finished"),
                       stand_by=lambda: stand_bys.append(1))
  assert held == [2] and result.exit_code == errors.ExitCode.OK
  assert 3 <= len(stand_bys) <= 5  # A lease of 1 s at 0.25 s a reading.
  log = events.EventLog(str(tmp_path)).read()
  assert [e.action for e in log] == [None, "standby_chief_takes_over"]
  assert "heartbeat stopped" in log[0].detail and log[0].failure == "chief_lost"


def test_a_standby_takes_over_at_once_when_the_holder_process_is_gone(tmp_path):
  # Its presence port refuses connections: nobody serves it any more. The
  # lease (100 s) would take 400 readings to lapse.
  store = chief_lease.LeaseStore(str(tmp_path))
  store.take(1, "chief:0 (gone)")
  store.beat(1, 7)
  store.set_presence(1, f"localhost:{portpicker.pick_unused_port()}")
  stand_bys, held = [], []
  standby = chief_replica.ChiefReplica(
      store, chief_lease.LeaseConfig(100.0, 0.01), replica=1, me="chief:1",
      stop=signals.StopSignals(), event_log=events.EventLog(str(tmp_path)), clock=Clock(),
      presence_host="localhost")
  result = standby.run(lambda generation, superseded: held.append(generation) or
                       Result(errors.ExitCode.OK, 0, "finished"),
                       stand_by=lambda: stand_bys.append(1))
  assert held == [2] and result.exit_code == errors.ExitCode.OK and len(stand_bys) < 100
  log = events.EventLog(str(tmp_path)).read()
  assert "its process is gone" in log[0].detail
  # The new holder serves its own presence port, which a standby of it can reach.
  served = store.view(chief_lease.BeatWatch(), 0.0).presence
  host, _, port = served.rpartition(":")
  assert host == "localhost"
  socket.create_connection((host, int(port)), timeout=5).close()


def _take_over_a_silent_holder(tmp_path, *, host_answers: bool):
  """A standby takes over generation 1, whose holder beats no more and whose presence
  port is a listener here: its readings before it took, and the takeover's detail.

  The standby's watch connects to it first; then the listener stays (new
  connections completed by the kernel, never accepted: a paused or starved
  holder) or closes (new connections refused; the watch's own stays open)."""
  store = chief_lease.LeaseStore(str(tmp_path))
  store.take(1, "chief:0 (silent)")
  store.beat(1, 7)
  held, readings, watched = [], [], []
  with socket.create_server(("localhost", 0)) as listener:
    store.set_presence(1, f"localhost:{listener.getsockname()[1]}")
    listener.settimeout(10)

    def stand_by():
      readings.append(1)
      if not watched:  # The standby's watch connects before the lease runs out.
        watched.append(listener.accept()[0])
        if not host_answers:
          listener.close()

    result = replica(tmp_path, 1).run(lambda generation, superseded: held.append(generation)
                                      or Result(errors.ExitCode.OK, 0, "finished"),
                                      stand_by=stand_by)
    watched[0].close()
  assert held == [2] and result.exit_code == errors.ExitCode.OK
  return len(readings), events.EventLog(str(tmp_path)).read()[0].detail


def test_a_silent_holder_whose_process_lives_is_given_three_leases(tmp_path):
  # A holder starved for just over a lease on a loaded host is not taken from.
  readings, detail = _take_over_a_silent_holder(tmp_path, host_answers=True)
  # Three leases of 1 s at 0.25 s a reading (one lease: 3 to 5 readings).
  assert 11 <= readings <= 14, readings
  assert "its process lives" in detail, detail


def test_a_silent_holder_whose_host_answers_no_new_connection_is_given_one_lease(tmp_path):
  # As on a lost host: its presence connection is still open, but nothing
  # completes a new connection there.
  readings, detail = _take_over_a_silent_holder(tmp_path, host_answers=False)
  assert 3 <= readings <= 5, readings
  assert "heartbeat stopped" in detail and "its process lives" not in detail, detail


def test_a_replica_cut_off_from_the_cluster_neither_takes_nor_beats(tmp_path):
  store = chief_lease.LeaseStore(str(tmp_path))
  store.take(1, "chief:0")
  stop = signals.StopSignals()
  polls = []

  def stand_by():
    polls.append(1)
    if len(polls) == 20:  # 5 s of silence by its clock: long past the lease.
      stop._handle(signal.SIGTERM, None)

  result = replica(tmp_path, 1, sees=lambda: False, stop=stop).run(
      lambda *_: Result(errors.ExitCode.OK, 0, "must not run"), stand_by=stand_by)
  assert result.exit_code == errors.ExitCode.PREEMPTED and store.latest() == 1
  keeper = chief_lease.LeaseKeeper(store, 1, chief_lease.LeaseConfig(1.0, 0.01),
                                   sees_cluster=lambda: False).start()
  threading_wait = __import__("threading").Event().wait
  threading_wait(0.2)  # ~20 renewals skipped.
  keeper.stop()
  assert (tmp_path / chief_lease.DIR_NAME / "beat-000001").read_text() == "0"


def test_a_superseded_holder_stands_by_and_takes_over_again_later(tmp_path):
  store = chief_lease.LeaseStore(str(tmp_path))
  held = []

  def hold(generation, superseded):
    held.append(generation)
    if generation == 1:  # Paused past its lease; the other replica took generation 2 ...
      store.take(2, "chief:1")
      store.beat(2, 1)  # ... and was then killed: it beats no more.
      return Result(errors.ExitCode.SUPERSEDED, 0, "superseded")
    return Result(errors.ExitCode.OK, 0, "finished")

  result = replica(tmp_path, 0).run(hold, stand_by=lambda: None)
  assert held == [1, 3] and result.exit_code == errors.ExitCode.OK
  assert any("generation 1 superseded" in e.detail
             for e in events.EventLog(str(tmp_path)).read())


def test_the_second_replica_leaves_the_first_generation_to_the_first(tmp_path):
  held = []
  result = replica(tmp_path, 1).run(
      lambda generation, superseded: held.append(generation) or
      Result(errors.ExitCode.OK, 0, "finished"), stand_by=lambda: None)
  # Nobody took it for 10 leases (the first replica never started): then it does.
  assert held == [1] and result.exit_code == errors.ExitCode.OK


def test_an_earlier_run_s_end_does_not_end_a_resumed_run(tmp_path):
  store = chief_lease.LeaseStore(str(tmp_path))
  store.take(4, "chief:1 (the last run)")
  store.end(4, errors.ExitCode.OK)  # That run finished; this model_dir is resumed now.
  held = []
  result = replica(tmp_path, 0).run(
      lambda generation, superseded: held.append(generation) or
      Result(errors.ExitCode.OK, 0, "finished"), stand_by=lambda: None)
  assert held == [5] and result.exit_code == errors.ExitCode.OK
  assert events.EventLog(str(tmp_path)).read() == []  # A start, not a takeover.


def test_a_replica_restarted_while_the_other_held_hears_that_holder_s_end_as_this_run_s(
    tmp_path):
  # Restarted (its host came back) while chief:0 held generation 3: chief:0's end
  # written later is this run's, not an earlier run's.
  store = chief_lease.LeaseStore(str(tmp_path))
  store.take(3, "chief:0 (holds)")
  standby = replica(tmp_path, 1)
  store.end(3, errors.ExitCode.PREEMPTED)  # SIGTERM: it saved and let go.
  held = []
  result = standby.run(lambda generation, superseded: held.append(generation) or
                       Result(errors.ExitCode.OK, 0, "finished"), stand_by=lambda: None)
  # Taken at once, as a takeover (not a new run waiting 10 leases for chief:0).
  assert held == [4] and result.exit_code == errors.ExitCode.OK
  log = events.EventLog(str(tmp_path)).read()
  assert [e.action for e in log] == [None, "standby_chief_takes_over"]
  # chief:0, back while generation 5 is held, hears the run finish there and leaves.
  back = replica(tmp_path, 0)
  store.take(5, "chief:1 (holds)")
  store.end(5, errors.ExitCode.OK)
  ended = back.run(lambda *_: Result(errors.ExitCode.PERMANENT, 0, "must not run"),
                   stand_by=lambda: None)
  assert ended.exit_code == errors.ExitCode.OK and back.ended_elsewhere


def test_the_cluster_is_in_sight_while_a_ps_answers_and_out_of_it_after(grpc_server):
  import portpicker  # pylint: disable=import-outside-toplevel
  import threading  # pylint: disable=import-outside-toplevel
  from tfps.cluster import spec as spec_lib  # pylint: disable=import-outside-toplevel
  silent = f"127.0.0.1:{portpicker.pick_unused_port()}"  # Nothing listens: refused.
  ps = [spec_lib.TaskId(spec_lib.JobType.PS, 0)]
  for address, seen in ((grpc_server, True), (silent, False)):
    cluster = spec_lib.ClusterSpec.from_dict({"chief": ["127.0.0.1:1"], "ps": [address]})
    now = [0.0]
    sight = chief_replica.ClusterSight(cluster, ps, within=0.4, clock=lambda: now[0]).start()
    try:
      now[0] = 100.0  # Long after the start: in sight only if a probe answered since.
      for _ in range(100):  # However slow the host: two probe rounds within 10 s.
        if sight() or sight.rounds >= 2:
          break
        threading.Event().wait(0.1)
      assert sight() == seen and (seen or sight.rounds >= 2), address
    finally:
      sight.stop()
