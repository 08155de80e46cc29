"""Connecting to a cluster: how long the coordinator waits for which task."""

import time

import portpicker
import pytest
import tensorflow as tf

from tfps.base import errors
from tfps.cluster import readiness
from tfps.cluster import spec as spec_lib
from tfps.coordinator import strategy as strategy_lib

pytestmark = pytest.mark.tf


def test_elastic_workers_are_waited_for_no_longer_than_their_own_timeout(grpc_server):
  # A worker that stopped between the supervisor's choice and this start:
  # the coordinator exits retryable after a short wait, not after ready_timeout.
  # grpc_server (conftest) stands where the ps is: it answers the probe.
  silent = f"127.0.0.1:{portpicker.pick_unused_port()}"
  cluster = spec_lib.ClusterSpec.from_dict({
      "chief": [f"127.0.0.1:{portpicker.pick_unused_port()}"], "ps": [grpc_server],
      "worker": [silent]})
  start = time.monotonic()
  with pytest.raises(readiness.ClusterUnreachableError) as raised:
    strategy_lib.connect(cluster, ready_timeout=600, workers_ready_timeout=1.0)
  assert time.monotonic() - start < 30  # The worker's 1 s, and probing; not 600 s.
  assert raised.value.unreachable == (spec_lib.TaskId(spec_lib.JobType.WORKER, 0),)
  assert raised.value.exit_code.retryable


def test_tensorflows_connect_runs_inside_the_watch_once_every_task_answered(monkeypatch):
  # The watch (ps_deadline.PsDeadline(connecting=True)) holds every task to a deadline
  # while TF connects: TF waits for each task with none. Here TF's connect fails at once.
  cluster = spec_lib.ClusterSpec.from_dict({
      job: [f"127.0.0.1:{portpicker.pick_unused_port()}"] for job in ("chief", "ps", "worker")})
  seen = []
  monkeypatch.setattr(readiness, "wait_until_reachable",
                      lambda cluster, timeout, tasks: seen.append("answered"))

  class Watch:
    def __init__(self, watched):
      seen.append(("watch", watched.num_tasks(spec_lib.JobType.WORKER)))

    def __enter__(self):
      seen.append("in")

    def __exit__(self, *exc):
      seen.append("out")

  def connect(*args, **kwargs):
    seen.append("connect")
    raise tf.errors.UnavailableError(None, None, "worker:0 went away")

  monkeypatch.setattr(tf.distribute.experimental, "ParameterServerStrategy", connect)
  with pytest.raises(errors.RetryableError, match="could not connect"):
    strategy_lib.connect(cluster, ready_timeout=30, watch=Watch)
  assert seen == ["answered", ("watch", 1), "in", "connect", "out"]
