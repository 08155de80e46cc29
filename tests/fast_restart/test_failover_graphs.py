"""Which failover graphs are built ahead, for whom, and the record of who holds them
(tfps.fast_restart.failover_graphs). On a cluster: test_trace_relocation.py (the
closure built ahead has the failover coordinator's name, and trains nothing).
"""

import json
import os

import pytest

from tfps.cluster import spec as spec_lib
from tfps.fast_restart import failover_graphs
from tfps.fast_restart import worker_functions

from tests.support import procs

pytestmark = pytest.mark.tf


def _cluster(num_ps: int) -> spec_lib.ClusterSpec:
  return spec_lib.ClusterSpec.from_dict({
      "chief": ["h:1"], "ps": [f"h:{10 + i}" for i in range(num_ps)],
      "worker": ["h:20", "h:21"]})


def test_only_two_ps_have_a_failover_graph_to_build_and_either_loss_gives_it():
  assert failover_graphs.failover_view(_cluster(1)) is None
  assert failover_graphs.failover_view(_cluster(3)) is None  # The strategy places on 2.
  view = failover_graphs.failover_view(_cluster(2))
  assert view.num_tasks(spec_lib.JobType.PS) == 1
  assert view.addresses(spec_lib.JobType.WORKER) == ("h:20", "h:21")
  # The shape a worker's graph sees is the same whichever ps is lost.
  without_ps0 = _cluster(2).without([spec_lib.TaskId(spec_lib.JobType.PS, 0)])
  assert (worker_functions.placement(view.as_dict())
          == worker_functions.placement(without_ps0.as_dict()))


def test_a_variable_on_a_ps_moves_to_the_one_left_and_others_stay():
  assert (failover_graphs.failover_device("/job:ps/replica:0/task:1/device:CPU:0")
          == "/job:ps/replica:0/task:0/device:CPU:0")
  assert (failover_graphs.failover_device("/job:ps/replica:0/task:0/device:CPU:0")
          == "/job:ps/replica:0/task:0/device:CPU:0")
  chief = "/job:chief/replica:0/task:0/device:CPU:0"
  assert failover_graphs.failover_device(chief) == chief


def test_workers_recorded_as_holding_the_graph_are_not_asked_again(tmp_path):
  record = failover_graphs.Record(str(tmp_path / failover_graphs.RECORD))
  workers = {0: "h:20", 1: "h:21"}
  assert failover_graphs.to_ask(record.read(), "g@1", workers) == workers
  record.add("g@1", "h:21")
  record.add("g@1", "h:21")  # Once.
  assert record.read() == {"g@1": ["h:21"]}
  assert failover_graphs.to_ask(record.read(), "g@1", workers) == {0: "h:20"}
  # Another graph, or the same under another chief: every worker again.
  assert failover_graphs.to_ask(record.read(), "g@2", workers) == workers
  record.add("g@1", "h:20")
  assert failover_graphs.to_ask(record.read(), "g@1", workers) == {}


def test_a_damaged_record_asks_every_worker_again(tmp_path):
  path = tmp_path / failover_graphs.RECORD
  path.write_text("{half")
  record = failover_graphs.Record(str(path))
  assert record.read() == {}
  record.add("g@1", "h:20")  # Replaced whole.
  assert json.loads(path.read_text()) == {"g@1": ["h:20"]}
  assert not [f for f in os.listdir(tmp_path) if ".tmp-" in f]


def test_the_workers_epoch_is_the_chiefs_parent_with_its_start_time_on_this_boot():
  boot, started = failover_graphs.workers_epoch().split(":")
  parent, start = started.split("@")
  assert int(parent) == procs.parent(os.getppid())
  assert start.isdigit() and len(boot) == 8
  assert failover_graphs.workers_epoch() == f"{boot}:{started}"
