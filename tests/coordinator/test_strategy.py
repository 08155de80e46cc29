"""Connecting to a cluster: how long the coordinator waits for which task."""

import time

import portpicker
import pytest

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
