"""LocalCluster: real `tfps run` processes on loopback, real signals.

The session's 1-ps/2-worker clusters (conftest.py: each start costs a
TensorFlow import per task) serve the module; every test leaves them with all
tasks serving.
"""

import json
import os
import re
import select
import signal
import subprocess
import sys
import textwrap

import pytest

from tfps.cluster import local
from tfps.cluster import processes
from tfps.cluster import readiness
from tfps.cluster import spec as spec_lib
from tfps.cluster import server_threads
from tfps.base import errors

from tests.support import procs

pytestmark = pytest.mark.cluster

WORKER_0 = spec_lib.TaskId(spec_lib.JobType.WORKER, 0)


def _port(address: str) -> int:
  return int(address.rpartition(":")[2])


def _host_listening_ports() -> set[int]:
  out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, timeout=10).stdout
  return {int(line.split()[3].rpartition(":")[2]) for line in out.splitlines() if line.strip()}


@pytest.fixture(scope="module")
def cluster(loopback_cluster):
  return loopback_cluster


def test_every_task_serves_at_its_spec_address(cluster):
  ports = cluster.listening_ports()
  for task, handle in cluster.tasks.items():
    assert handle.alive, task
    assert _port(cluster.spec.address(task)) in ports
  # The line follows the server start by a moment, so wait for it (bounded).
  expected = "serving worker:1 at " + cluster.spec.address(cluster.worker(1).task)
  processes.wait_until(lambda: expected in _read(cluster.worker(1).log_path), timeout=10,
                       what=f"{expected!r} in the worker's log")


def _read(path: str) -> str:
  with open(path) as f:
    return f.read()


def test_sigkilled_worker_restarts_at_the_same_address(cluster):
  worker = cluster.worker(1)
  old_pid, address = worker.pid, worker.address
  worker.kill(signal.SIGKILL)
  assert worker.wait(timeout=10) == -signal.SIGKILL
  # A dead task is reported at once, not after the readiness deadline.
  with pytest.raises(local.TaskExitedError, match=r"worker:1 killed by SIGKILL before it answered"):
    cluster.wait_ready([worker.task], timeout=1)
  worker.restart(timeout=60)
  assert worker.pid != old_pid and worker.address == address
  assert _port(address) in cluster.listening_ports()


def test_sigterm_gives_the_documented_exit_code(cluster):
  worker = cluster.worker(1)
  worker.kill(signal.SIGTERM)
  assert worker.wait(timeout=15) == errors.ExitCode.PREEMPTED == 143
  assert "worker:1 stopping on SIGTERM: exit code 143" in _read(worker.log_path)
  worker.restart(timeout=60)


def test_paused_task_is_named_unreachable_until_resumed(cluster):
  worker = cluster.worker(0)
  worker.pause()
  try:
    with pytest.raises(readiness.ClusterUnreachableError) as raised:
      cluster.wait_ready([WORKER_0, cluster.ps(0).task], timeout=2)
    assert raised.value.unreachable == (WORKER_0,)
    assert f"worker:0 ({worker.address})" in str(raised.value)
  finally:
    worker.resume()
  cluster.wait_ready([WORKER_0], timeout=30)


def test_servers_are_reachable_only_inside_the_private_network(cluster):
  if not cluster.isolated:
    pytest.skip("no private network namespace here (needs root and iproute2)")
  ports = {_port(cluster.spec.address(t)) for t in cluster.tasks}
  # TF binds every interface, but the only interface in the namespace is lo.
  links = cluster.run_tool(["ip", "-o", "link", "show"]).splitlines()
  assert [line.split(":")[1].strip() for line in links] == ["lo"]
  assert ports <= cluster.listening_ports()
  assert not ports & _host_listening_ports()


def test_close_leaves_no_process_and_no_socket(tmp_path):
  cluster = local.LocalCluster(local.LocalClusterConfig(
      num_ps=1, num_workers=1, work_dir=str(tmp_path)))
  with cluster:
    pids = [h.pid for h in cluster.tasks.values()]
    ports = {_port(cluster.spec.address(t)) for t in cluster.tasks}
    netns_inode = procs.netns(pids[0])
    assert all(procs.alive(pid) for pid in pids)
    # The worker's graph cache: in a scratch directory of the cluster's.
    worker, ps = (procs.cmdline(task.pid) for task in (cluster.worker(0), cluster.ps(0)))
    cache = re.search(r"--graph_cache_dir=(\S+)", worker)[1]
    assert os.path.isdir(cache) and "graph_cache_dir" not in ps
    # The one worker gets this machine's cores for its kernels; the ps its default (1).
    assert re.search(r"--intra_op_threads=(\d+)", worker)[1] == str(
        server_threads.usable_cores())
    assert "intra_op_threads" not in ps
  assert not any(procs.alive(pid) for pid in pids)
  assert not os.path.exists(cache)
  assert not ports & _host_listening_ports()
  if cluster.isolated:
    members = [p for p in os.listdir("/proc") if p.isdigit() and procs.netns(p) == netns_inode]
    assert members == []


PARENT = textwrap.dedent("""
    import json, sys, time
    from tfps.cluster import local
    cluster = local.LocalCluster(local.LocalClusterConfig(num_ps=1, num_workers=1))
    cluster.start()
    print(json.dumps([cluster.work_dir, [h.pid for h in cluster.tasks.values()]]), flush=True)
    time.sleep(600)
""")


def test_tasks_die_when_the_parent_is_sigkilled_and_its_files_go_with_the_next_cluster():
  parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
  try:
    ready, _, _ = select.select([parent.stdout], [], [], 120)
    assert ready, "the parent did not report its cluster within 120 s"
    work_dir, pids = json.loads(parent.stdout.readline())
    assert len(pids) == 2 and all(procs.alive(pid) for pid in pids)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    processes.wait_until(lambda: not any(procs.alive(pid) for pid in pids), timeout=15,
                         what=f"tasks {pids} to die with their parent")
  finally:
    parent.kill()
    parent.wait(timeout=10)
  assert os.path.isdir(work_dir)  # A killed owner removes nothing...
  cluster = local.LocalCluster(local.LocalClusterConfig(num_ps=1, num_workers=1))
  assert not os.path.exists(work_dir)  # ...the next cluster does.
  cluster.close()
  assert not os.path.exists(cluster.work_dir)


@pytest.fixture(scope="module")
def hosts_cluster(netns_cluster):
  return netns_cluster  # Skips where virtual hosts cannot be made.


def test_virtual_hosts_each_task_has_its_own_name_address_and_stack(hosts_cluster):
  addresses = [hosts_cluster.spec.address(t) for t in hosts_cluster.tasks]
  assert [a.rpartition(":")[0] for a in addresses] == [
      local.host_name(t) for t in hosts_cluster.tasks]  # Names, not addresses.
  assert {a.rpartition(":")[2] for a in addresses} == {"2222"}  # Same port, separate hosts.
  ips = {hosts_cluster.resolve(local.host_name(t)) for t in hosts_cluster.tasks}
  assert len(ips) == len(addresses) and all(ip.startswith("10.213.") for ip in ips)
  for task in hosts_cluster.tasks:
    assert hosts_cluster.listening_ports(task) == {2222}
  # None of the virtual hosts' addresses exist in the machine's own namespace.
  own = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
  assert "10.213." not in own


def test_a_restarted_task_answers_under_its_name_at_a_new_address(hosts_cluster):
  worker = hosts_cluster.worker(0)
  before = hosts_cluster.resolve("worker-0")
  worker.restart(timeout=120)  # Waits until it answers, dialled by name.
  after = hosts_cluster.resolve("worker-0")
  assert after != before
  assert hosts_cluster.listening_ports(worker.task) == {2222}


def test_partitioned_worker_is_unreachable_until_healed(hosts_cluster):
  worker = hosts_cluster.worker(1)
  hosts_cluster.partition(worker.task)
  try:
    with pytest.raises(readiness.ClusterUnreachableError) as raised:
      hosts_cluster.wait_ready(timeout=2)
    assert raised.value.unreachable == (worker.task,)
    assert worker.alive  # Cut off, not dead.
  finally:
    hosts_cluster.heal(worker.task)
  hosts_cluster.wait_ready([worker.task], timeout=30)


def test_workers_split_the_machine_s_cores_unless_the_flags_say(tmp_path):
  def worker_flags(**config):
    cluster = local.LocalCluster(local.LocalClusterConfig(work_dir=str(tmp_path), **config))
    return cluster._worker_flags("/cache")  # pylint: disable=protected-access

  share = server_threads.intra_op_threads(spec_lib.JobType.WORKER,
                                          server_threads.usable_cores(), 4)
  # Every worker of the spec (those that join later too) counts.
  assert worker_flags(num_workers=2, max_workers=4) == (
      "--graph_cache_dir=/cache", f"--intra_op_threads={share}")
  assert worker_flags(num_workers=2, task_flags=("--intra_op_threads=3",)) == (
      "--graph_cache_dir=/cache",)
