"""Readiness against real gRPC servers (grpcio) on loopback; no TensorFlow."""

import concurrent.futures
import threading
import time

import grpc
import portpicker
import pytest

from tfps.cluster import readiness
from tfps.cluster import spec as spec_lib


def test_all_reachable_returns(grpc_server):
  cluster = spec_lib.ClusterSpec.from_dict({"ps": [grpc_server]})
  readiness.wait_until_reachable(cluster, deadline=60)  # Raises at the deadline otherwise.


def test_timeout_names_only_the_missing_task(grpc_server):
  dead = f"127.0.0.1:{portpicker.pick_unused_port()}"
  cluster = spec_lib.ClusterSpec.from_dict({"ps": [grpc_server], "worker": [dead]})
  start = time.monotonic()
  with pytest.raises(readiness.ClusterUnreachableError) as raised:
    readiness.wait_until_reachable(cluster, deadline=2)
  waited = time.monotonic() - start
  assert waited >= 1.9, waited  # It waited out its deadline, probing.
  assert raised.value.unreachable == (spec_lib.TaskId(spec_lib.JobType.WORKER, 0),)
  message = str(raised.value)
  assert f"worker:0 ({dead})" in message and "ps:0" not in message
  assert raised.value.exit_code.retryable


def test_task_that_comes_up_late_is_found(grpc_server, monkeypatch):
  port = portpicker.pick_unused_port()
  late = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1))
  late.add_insecure_port(f"127.0.0.1:{port}")
  cluster = spec_lib.ClusterSpec.from_dict({"ps": [grpc_server], "worker": [f"127.0.0.1:{port}"]})
  missed = threading.Semaphore(0)  # One release per probe round the worker missed.
  probe = readiness.reachable

  def counted(*args, **kwargs):
    found = probe(*args, **kwargs)
    if spec_lib.TaskId(spec_lib.JobType.WORKER, 0) not in found:
      missed.release()
    return found

  monkeypatch.setattr(readiness, "reachable", counted)
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    waiting = pool.submit(readiness.wait_until_reachable, cluster, 120)
    for _ in range(2):  # The probe retries while the server is still down...
      assert missed.acquire(timeout=60)
    assert not waiting.done()  # ...and does not give up.
    late.start()
    try:
      waiting.result(timeout=20)
    finally:
      late.stop(grace=None).wait(5)


def test_subset_of_tasks(grpc_server):
  dead = f"127.0.0.1:{portpicker.pick_unused_port()}"
  cluster = spec_lib.ClusterSpec.from_dict({"ps": [grpc_server], "worker": [dead]})
  readiness.wait_until_reachable(cluster, 5, tasks=[spec_lib.TaskId(spec_lib.JobType.PS, 0)])


def test_a_refusal_ends_a_probe_at_once_a_silent_listener_costs_the_timeout(grpc_server):
  import socket  # pylint: disable=import-outside-toplevel
  dead = f"127.0.0.1:{portpicker.pick_unused_port()}"
  cluster = spec_lib.ClusterSpec.from_dict({"ps": [grpc_server], "worker": [dead]})
  ps0, worker0 = spec_lib.TaskId(spec_lib.JobType.PS, 0), spec_lib.TaskId(spec_lib.JobType.WORKER, 0)
  start = time.monotonic()
  assert readiness.reachable(cluster, [ps0, worker0], timeout=300) == {ps0}
  # Nothing listens at `dead`: an answer at once, not a wait for the timeout.
  assert time.monotonic() - start < 150
  # The kernel accepts the TCP connection, nobody speaks HTTP/2 (a paused server).
  with socket.socket() as silent:
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    paused = spec_lib.ClusterSpec.from_dict({"ps": [f"127.0.0.1:{silent.getsockname()[1]}"]})
    start = time.monotonic()
    assert readiness.reachable(paused, [ps0], timeout=1.0) == set()
    assert time.monotonic() - start >= 0.9


def test_a_probe_answers_without_waiting_for_its_channels_to_close(grpc_server, monkeypatch):
  # grpc's channel close waits out its connectivity poll (0.2 s): a probe
  # that waited for it cost that much per task however fast the task answered.
  release, done, closed = threading.Event(), threading.Event(), []

  def slow_close(channels, callbacks):
    release.wait(30)
    readiness_close(channels, callbacks)
    closed.extend(channels)
    done.set()

  readiness_close = readiness._close
  monkeypatch.setattr(readiness, "_close", slow_close)
  dead = f"127.0.0.1:{portpicker.pick_unused_port()}"
  cluster = spec_lib.ClusterSpec.from_dict({"ps": [grpc_server], "worker": [dead]})
  try:
    assert readiness.reachable(cluster, list(cluster.tasks()), 10) == {
        spec_lib.TaskId(spec_lib.JobType.PS, 0)}
    assert not closed  # Answered while its channels were still being closed.
  finally:
    release.set()
  assert done.wait(30)
  assert sorted(closed) == sorted(cluster.tasks())
