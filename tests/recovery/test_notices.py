"""The control channel over real grpcio on loopback (no TensorFlow)."""

import concurrent.futures
import threading

import grpc
import portpicker
import pytest

from tfps.cluster import spec as spec_lib
from tfps.recovery import notices


@pytest.fixture
def address():
  return f"localhost:{portpicker.pick_unused_port()}"


def test_notice_waits_for_the_save_and_returns_its_step(address):
  received = []
  arrived, saved = threading.Event(), threading.Event()

  def handler(notice):
    received.append(notice)
    arrived.set()
    saved.wait(60)  # The chief answers only once its checkpoint is written.
    return notices.Reply(saved=True, step=1200, detail="saved ckpt-1200")

  server = notices.ControlServer(address, handler).start()
  try:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      sent = pool.submit(notices.send_notice, address,
                         notices.Notice(task="ps:1", deadline_seconds=60))
      assert arrived.wait(60)
      assert not sent.done()  # The task waits for the save...
      saved.set()
      reply = sent.result(timeout=60)  # ...and hears of it once it is written.
  finally:
    server.stop()
  assert reply == notices.Reply(saved=True, step=1200, detail="saved ckpt-1200")
  assert received == [notices.Notice(task="ps:1", kind="preemption", deadline_seconds=60)]


def test_a_chief_that_does_not_answer_in_time_is_a_deadline_error(address):
  release = threading.Event()
  server = notices.ControlServer(
      address, lambda n: (release.wait(10), notices.Reply(saved=False))[1]).start()
  try:
    with pytest.raises(grpc.RpcError) as raised:
      notices.send_notice(address, notices.Notice(task="worker:0", deadline_seconds=0.5))
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
  finally:
    release.set()
    server.stop()


def test_no_chief_listening_is_unavailable(address):
  with pytest.raises(grpc.RpcError) as raised:
    notices.send_notice(address, notices.Notice(task="worker:0", deadline_seconds=2))
  assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_notice_is_validated():
  with pytest.raises(spec_lib.ClusterSpecError):
    notices.Notice(task="boss")
  with pytest.raises(ValueError, match=r"deadline_seconds \(0\)"):
    notices.Notice(task="ps:0", deadline_seconds=0)


def test_control_address_is_chief_port_plus_one():
  cluster = spec_lib.ClusterSpec.from_dict({"chief": ["c:2222"], "ps": ["p:2222"]})
  assert notices.control_address(cluster) == "c:2223"


def test_with_a_standby_chief_the_notice_goes_to_the_replica_that_answers(address):
  # Only the coordinating replica serves the control channel: the standby's
  # port refuses at once, and the notice goes on to the next chief.
  standby = f"localhost:{portpicker.pick_unused_port()}"
  server = notices.ControlServer(
      address, lambda notice: notices.Reply(saved=True, step=7, detail="saved")).start()
  try:
    answered, reply = notices.send_to_chiefs(
        (standby, address), notices.Notice(task="worker:1", deadline_seconds=30))
  finally:
    server.stop()
  assert (answered, reply.step) == (address, 7)
  with pytest.raises(grpc.RpcError) as raised:  # Nobody answers: the last one's error.
    notices.send_to_chiefs((standby,), notices.Notice(task="worker:1", deadline_seconds=5))
  assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_every_chief_replica_has_a_control_address():
  cluster = spec_lib.ClusterSpec.from_dict({"chief": ["c0:2222", "c1:2222"], "ps": ["p:2222"]})
  assert notices.control_addresses(cluster) == ("c0:2223", "c1:2223")
