"""Network partitions at the training level, on virtual hosts (real links going down).

The session's LocalCluster on virtual hosts (`netns_cluster` in conftest.py:
1 ps, 2 workers, every task on its own network namespace and address) serves
the module. Its tests share one supervised chief training without end; each
cuts one task's link, checks from the progress log (`progress.jsonl`) and the
event log how training came back, then heals the link. A cut link drops
packets (TCP hangs, nothing is refused), which is what these tests are about.
The last test (soak tier: `pytest -m soak`) kills a worker instead (refused
at once, no hang) and starts it again on a new host at a new address under
the same name, as Kubernetes restarts a pod: the failure matrix's "worker gone
for good" row, here because this chief's --worker_timeout is short (the row
tests' chief needs one long enough for a killed worker to come back,
test_failure_matrix.py). A ps and a
chief at new addresses: tests/e2e/test_jobset_play.py.

Every wait is bounded and names what it waited for. Skipped, with the
reason, where network namespaces cannot be made (not root, no iproute2).
"""

import signal

import pytest

from tfps.cluster import local
from tfps.recovery import policy

from tests.support import chief_run

pytestmark = pytest.mark.cluster

# Short deadlines keep the module within its budget; the defaults are 60 s.
WORKER_TIMEOUT = 6
PS_TIMEOUT = 10
PS_LOST = policy.FailureKind.PS_LOST.value
WORKER_GONE = policy.FailureKind.WORKER_GONE.value


# The shared chief trains for as long as the module's tests need it.
CHIEF_FLAGS = [f"--experiment_params={chief_run.SMALL_CTR}", "--mode=train",
               "--train_steps=10000000", f"--steps_per_loop={chief_run.STEPS_PER_LOOP}",
               f"--steps_per_closure={chief_run.STEPS_PER_CLOSURE}",
               f"--checkpoint_interval={chief_run.CHECKPOINT_INTERVAL}",
               "--global_batch_size=128",
               f"--worker_timeout={WORKER_TIMEOUT}", f"--ps_timeout={PS_TIMEOUT}",
               # The coordinator gets this long to save after the supervisor's SIGTERM
               # (a loop and a save take < 1 s here). A coordinator stuck on a cut
               # worker cannot end its loop and is killed after it: keep it short.
               "--grace_seconds=3"]


@pytest.fixture(scope="module")
def cluster(netns_cluster):
  return netns_cluster  # Skips where virtual hosts cannot be made.


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("partition") / "model"
  path.mkdir()
  return str(path)


@pytest.fixture(scope="module")
def run(cluster, model_dir):
  yield chief_run.ChiefRun(cluster, model_dir, CHIEF_FLAGS).start_training()


@pytest.fixture(autouse=True)
def _healthy(request):
  """Fault tests start with every link up, every task answering, the chief training."""
  if "run" in request.fixturenames:
    training = request.getfixturevalue("run")
    training.cluster.wait_ready(timeout=60)
    training.wait_for_step(training.step, timeout=120)
  yield


def test_every_task_has_its_own_name_and_address_and_the_chief_trains(run):
  tasks = list(run.cluster.spec.tasks())
  assert [run.cluster.spec.address(t) for t in tasks] == [
      f"{local.host_name(t)}:2222" for t in tasks]
  ips = [run.cluster.resolve(local.host_name(t)) for t in tasks]
  assert all(ip.startswith("10.213.") for ip in ips) and len(set(ips)) == len(ips), ips
  run.wait_for_step(run.step + 100)


def test_partitioned_worker_is_left_out_then_readmitted_when_healed(run):
  worker = run.cluster.worker(1)
  events, records = len(run.events()), len(run.records)
  run.cluster.partition(worker.task)
  try:
    run.wait_for(lambda: any(e.failure == WORKER_GONE and e.task == "worker:1"
                             for e in run.events()[events:]),
                 timeout=WORKER_TIMEOUT + 30, what="worker:1 to be declared gone")
    # Training goes on without it (a coordinator on the reduced cluster).
    run.wait_for_restart_and_progress(records, timeout=120)
    assert worker.alive  # Cut off, not dead.
  finally:
    run.cluster.heal(worker.task)
  records = len(run.records)
  run.wait_for(lambda: any(e.task == "worker:1" and e.task_change == "back"
                           for e in run.events()[events:]),
               timeout=60, what="worker:1 to be taken back after the heal")
  run.wait_for_restart_and_progress(records, timeout=120)
  run.wait_for_work([worker])  # Re-admitted: it runs closures again.


# A silent ps: the ps deadline's own tests (tests/coordinator/test_ps_deadline.py,
# tests/recovery/test_supervisor.py) and the chief cut below cover its detection.
@pytest.mark.soak
def test_partitioned_ps_is_a_ps_loss_restored_from_the_last_checkpoint(run):
  ps = run.cluster.ps(0)
  starts = ps.starts
  events, records = len(run.events()), len(run.records)
  step = run.step
  run.cluster.partition(ps.task)
  try:
    run.wait_for(lambda: any(e.failure == PS_LOST for e in run.events()[events:]),
                 timeout=PS_TIMEOUT + 30, what="the supervisor to record the ps loss")
  finally:
    run.cluster.heal(ps.task)
  failure = next(e for e in run.events()[events:] if e.failure == PS_LOST)
  # Normally the coordinator's own deadline; the supervisor's backstop (its
  # deadline, 8 s later) if the coordinator could not act on it.
  assert (failure.detail.startswith("coordinator exited with code 170: lost the cluster: "
                                    "ps:0 (ps-0:2222) did not answer for 10s "
                                    "(partitioned or hung")
          or failure.detail.startswith("coordinator stopped by the supervisor: lost the "
                                       "cluster: ps:0 (ps-0:2222) did not answer for ")
          ), failure.detail
  step = max(step, run.step)
  restored = run.wait_for_restart_and_progress(records, timeout=150)
  assert 0 <= step - restored.step <= chief_run.MAX_STEPS_LOST, (step, restored)
  assert ps.alive and ps.starts == starts  # The same server: never killed, only cut off.


def test_partitioned_chief_recovers_like_a_lost_chief(run):
  events, records = len(run.events()), len(run.records)
  step = run.step
  run.cluster.partition(chief_run.CHIEF)
  try:
    run.wait_for(lambda: any(e.failure == PS_LOST and "this chief is cut off" in e.detail
                             for e in run.events()[events:]),
                 timeout=PS_TIMEOUT + 30, what="the coordinator to find itself cut off")
  finally:
    run.cluster.heal(chief_run.CHIEF)
  step = max(step, run.step)
  restored = run.wait_for_restart_and_progress(records, timeout=150)
  assert 0 <= step - restored.step <= chief_run.MAX_STEPS_LOST, (step, restored)
  # No worker was blamed for the chief's own cut.
  assert not [e for e in run.events()[events:] if e.failure == WORKER_GONE]


# Left out and taken back as in the worker cut above; here refused, not silent.
@pytest.mark.soak
def test_killed_worker_that_never_returns_is_left_out_then_taken_back(run):
  worker = run.cluster.worker(1)
  events, records = len(run.events()), len(run.records)
  worker.kill(signal.SIGKILL)
  assert worker.wait(timeout=10) == -signal.SIGKILL
  gone = lambda: [e for e in run.events()[events:] if e.failure == WORKER_GONE]
  run.wait_for(gone, timeout=WORKER_TIMEOUT + 30,
               what="the task watch to leave the killed worker:1 out")
  assert gone()[-1].task == "worker:1"
  left_out = run.wait_for_restart_and_progress(records, timeout=120)
  run.wait_for_step(left_out.step + 100)  # Trains on without it...
  assert "without worker:1" in run.log()
  # It saved before restarting: nothing lost.
  assert left_out.step == max(r.step for r in run.records[:run.records.index(left_out)])
  records, old_ip = len(run.records), run.cluster.resolve(local.host_name(worker.task))
  worker.start()  # ...and takes it back when it answers again, at its new address.
  assert run.cluster.resolve(local.host_name(worker.task)) != old_ip
  run.wait_for(lambda: any(e.task == "worker:1" and e.task_change == "back"
                           and not e.tasks_left_out for e in run.events()[events:]),
               timeout=60, what="worker:1 to be taken back")
  run.wait_for_restart_and_progress(records, timeout=120)
  run.wait_for_work([worker])
