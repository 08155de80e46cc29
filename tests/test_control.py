"""The control channel over real grpcio on loopback (no TensorFlow)."""

import threading
import time

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
  saved = threading.Event()

  def handler(notice):
    received.append(notice)
    saved.wait(10)  # The chief answers only once its checkpoint is written.
    return notices.Reply(saved=True, step=1200, detail="saved ckpt-1200")

  server = notices.ControlServer(address, handler).start()
  try:
    threading.Timer(0.5, saved.set).start()
    start = time.monotonic()
    reply = notices.send_notice(address, notices.Notice(task="ps:1", deadline_seconds=10))
    assert time.monotonic() - start >= 0.4
  finally:
    server.stop()
  assert reply == notices.Reply(saved=True, step=1200, detail="saved ckpt-1200")
  assert received == [notices.Notice(task="ps:1", kind="preemption", deadline_seconds=10)]


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
