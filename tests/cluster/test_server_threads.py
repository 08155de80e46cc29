"""Thread pool sizes of ps and worker servers (tfps.cluster.server_threads): pure."""

import pytest

from tfps.cluster import server_threads
from tfps.cluster.spec import JobType


def test_a_ps_gets_one_intra_op_thread_whatever_the_cores():
  assert server_threads.intra_op_threads(JobType.PS, 64) == 1
  assert server_threads.intra_op_threads(JobType.PS, 2, workers_on_host=2) == 1


@pytest.mark.parametrize("cores, workers, threads", [
    (2, 1, 2), (2, 2, 1), (2, 4, 1), (8, 2, 4), (8, 3, 2), (1, 1, 1)])
def test_workers_on_one_host_share_its_cores(cores, workers, threads):
  assert server_threads.intra_op_threads(JobType.WORKER, cores, workers) == threads


@pytest.mark.parametrize("affinity, cpu_max, cores", [
    (64, "max 100000\n", 64),        # No limit: the affinity.
    (64, "200000 100000\n", 2),      # A 2-CPU container on a 64-core node.
    (64, "150000 100000\n", 2),      # 1.5 CPUs: rounded up.
    (4, "800000 100000\n", 4),       # A quota above the affinity: the affinity.
    (64, "50000 100000", 1),         # Half a CPU: at least one.
    (8, "garbage", 8),               # Unreadable: the affinity.
])
def test_usable_cores_from_cgroup_v2(affinity, cpu_max, cores):
  assert server_threads.usable_cores(affinity=affinity, cpu_max=cpu_max) == cores


@pytest.mark.parametrize("quota, period, cores", [
    ("-1\n", "100000\n", 16), ("300000\n", "100000\n", 3), ("x", "100000", 16)])
def test_usable_cores_from_cgroup_v1(quota, period, cores):
  assert server_threads.usable_cores(affinity=16, cfs_quota=quota, cfs_period=period) == cores


def test_usable_cores_here_is_at_least_one_and_at_most_the_affinity():
  import os
  assert 1 <= server_threads.usable_cores() <= len(os.sched_getaffinity(0))
