"""A standby chief takes over with a coordinator prepared ahead (real processes).

Two chief replicas share a model_dir on a cluster whose spec lists both.
Chief 0 trains; chief 1 stands by and, once chief 0 trains, keeps a hot
standby coordinator: connected to the whole cluster, its experiment built
and its train closures instantiated on the workers. Chief 0 is SIGKILLed
once that is done (the event says so, whatever the host's speed), and never
comes back: chief 1 sees its process gone at once (its presence port
closed), and its prepared coordinator restores the last checkpoint and
trains on; nothing is restarted. The input accounting says every example
handed out was trained once. (The takeover's seconds: `tfps chaos
--chief_standby --faults=chief:0@standby:kill+never`, docs/recovery.md.)
"""

import signal

import pytest

from tfps.cluster import local
from tfps.recovery import coverage
from tfps.recovery import policy

from tests.support import chief_run

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
  config = local.LocalClusterConfig(num_ps=1, num_workers=2, ready_timeout=180,
                                    chief_standby=True,
                                    work_dir=str(tmp_path_factory.mktemp("standby-cluster")))
  with local.LocalCluster(config) as running:
    yield running


def _actions(run: chief_run.ChiefRun, action: policy.Action, task: str) -> list:
  return [e for e in run.events() if e.action == action.value and e.task == task]


def test_the_standby_chief_takes_over_with_its_prepared_coordinator(cluster, tmp_path):
  model_dir = str(tmp_path / "model")
  flags = [f"--experiment_params={chief_run.SMALL_CTR}", "--mode=train",
           "--train_steps=10000000", f"--steps_per_loop={chief_run.STEPS_PER_LOOP}",
           f"--steps_per_closure={chief_run.STEPS_PER_CLOSURE}",
           f"--checkpoint_interval={chief_run.CHECKPOINT_INTERVAL}", "--global_batch_size=128"]
  active = chief_run.ChiefRun(cluster, model_dir, flags, replica=0)
  standby = chief_run.ChiefRun(cluster, model_dir, flags, replica=1)
  try:
    active.start_training()
    standby.chief.start()
    active.wait_for(lambda: _actions(active, policy.Action.STANDBY_PREPARED, "chief:1"),
                    timeout=300, what="chief:1's coordinator prepared ahead")
    assert not _actions(active, policy.Action.STANDBY_RETIRED, "chief:1")
    prepared = _actions(active, policy.Action.STANDBY_PREPARED, "chief:1")[-1]
    assert "instantiated on 2 of 2 workers" in prepared.detail

    records = len(standby.history())
    active.chief.kill(signal.SIGKILL)
    assert active.chief.wait(timeout=10) == -signal.SIGKILL
    restored = standby.wait_for_restart_and_progress(records, timeout=120)
    [takeover] = [e for e in standby.events()
                  if e.action == policy.Action.TAKE_OVER.value and e.task == "chief:1"]
    [ran] = _actions(standby, policy.Action.PREPARED_RUNS, "chief:1")
    assert ran.time >= takeover.time
    # Seen gone at once (its presence port closed), not after a lease.
    [lost] = [e for e in standby.events()
              if e.kind == "failure" and e.failure == policy.FailureKind.CHIEF_LOST.value]
    assert "its process is gone" in lost.detail, lost
    assert restored.generation == 2 and restored.step > 0
    assert "taking over with the coordinator prepared ahead" in standby.log()

    standby.chief.kill(signal.SIGTERM)  # Saves where it is.
    assert standby.chief.wait(timeout=60) == 143
    accounted = coverage.account(standby.history())
    assert accounted.ok and accounted.trained_twice == 0, accounted
  finally:
    for replica in (active, standby):
      if replica.chief.alive:
        replica.chief.stop(grace=30)
