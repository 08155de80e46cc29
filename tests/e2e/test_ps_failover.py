"""Ps failover on a real cluster of 2 ps: a lost ps is not waited for, then taken back.

A supervised chief trains the counting experiment (input_experiments) with
its `counts` table split over both ps (a ShardedVariable). ps:1 is killed
and stays down: the chief restarts at once on ps:0 alone, which then holds
every variable, restored from the checkpoint of two shards. When ps:1 is
back, the chief saves and restarts on both ps again. A worker the job had
room for joins while ps:1 is down (elastic workers, `--min_workers`): the
chief takes it in without the lost ps. Through it all, the checkpoint's
counts say every example was trained on once per epoch.
"""

import os
import signal

import numpy as np
import pytest

from tfps.cluster import local
from tfps.recovery import coverage
from tfps.recovery import policy

from tests.support import chief_run

import input_experiments  # tests/support/experiments/, on sys.path (conftest.py).

pytestmark = pytest.mark.cluster

EXAMPLES, BATCH = 20000, 128
# counts: 20,000 int32 = 80 kB, split over both ps above this size.
MIN_SHARD_BYTES = 16384


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, experiments_importable):
  del experiments_importable  # For the chief, which imports input_experiments.
  config = local.LocalClusterConfig(num_ps=2, num_workers=2, ready_timeout=180,
                                    work_dir=str(tmp_path_factory.mktemp("failover-cluster")))
  with local.LocalCluster(config) as running:
    yield running


def test_a_lost_ps_is_not_waited_for_and_is_taken_back_with_no_example_lost(cluster, tmp_path):
  joining = cluster.worker(1)
  joining.pause()  # Not answering when the job starts: it joins during the failover.
  run = chief_run.ChiefRun(cluster, str(tmp_path / "model"), [
      "--experiment=input_experiments:counting",
      f"--experiment_params=examples={EXAMPLES},work=64", "--mode=train",
      "--train_steps=10000000", f"--steps_per_loop={chief_run.STEPS_PER_LOOP}",
      f"--steps_per_closure={chief_run.STEPS_PER_CLOSURE}",
      f"--checkpoint_interval={chief_run.CHECKPOINT_INTERVAL}",
      f"--global_batch_size={BATCH}", f"--min_shard_bytes={MIN_SHARD_BYTES}",
      # Timed: as fast without ps:1, the measured rule would keep it out
      # (recovery.readmission, tested without a cluster in test_readmission).
      "--ps_readmit=timed", "--ps_readmit_after=3", "--min_workers=1"])
  try:
    run.chief.start()
    # Past a checkpoint of trained counts, split over both ps.
    run.wait_for_step(chief_run.CHECKPOINT_INTERVAL, timeout=180)
    assert "variables sharded above 16384 bytes" in run.log()

    lost = cluster.ps(1)
    records = len(run.records)
    lost.kill(signal.SIGKILL)
    assert lost.wait(timeout=10) == -signal.SIGKILL
    # Training goes on while ps:1 is still down: restored on ps:0 alone.
    restored = run.wait_for_restart_and_progress(records, timeout=180)
    assert not lost.alive
    # Said in its restore record (tfps chaos reads it); the worker has not joined yet.
    assert restored.left_out == ("ps:1", "worker:1")
    actions = [e for e in run.events() if e.kind == "action"]
    assert actions[-1].action == policy.Action.RESTART_WITHOUT_TASK.value
    assert "ps:1 does not answer" in actions[-1].detail
    assert "connected to 1 ps" in run.log()
    assert not [e for e in run.events() if e.action == policy.Action.WAIT_AND_RESTART.value]

    # A worker joins while ps:1 is down: taken in on ps:0 alone.
    records = len(run.records)
    joining.resume()
    joined = run.wait_for_restart_and_progress(records, timeout=180)
    assert joined.left_out == ("ps:1",) and not lost.alive
    run.wait_for_work([joining])

    # Back (empty): after answering for --ps_readmit_after, taken back with a save first.
    records = len(run.records)
    lost.start()
    run.wait_for(lambda: any(e.task == "ps:1" and e.task_change == "back"
                             for e in run.events()), timeout=120, what="ps:1 taken back")
    back = run.wait_for_restart_and_progress(records, timeout=180)
    assert back.step >= restored.step and back.left_out == ()
    assert run.log().count("connected to 2 ps") >= 2

    # The ground truth: every example of every completed epoch trained on once.
    run.wait_for_epochs(1)
    run.chief.kill(signal.SIGTERM)  # Saves where it is: the final checkpoint.
    assert run.chief.wait(timeout=60) == 143
    history = run.history()
    accounted = coverage.account(history)
    assert accounted.ok, accounted
    with open(os.path.join(run.model_dir, "checkpoint")) as f:
      latest = os.path.join(run.model_dir, f.readline().split('"')[1])
    counts = input_experiments.counts_in(latest).astype(np.int64)
    lengths = next(r.shard_lengths for r in history if r.shard_lengths)
    expected = input_experiments.expected_counts(EXAMPLES, BATCH, lengths,
                                                 coverage.kept_chunks(history))
    assert expected.min() >= accounted.epochs_completed >= 1
    assert (counts >= expected).all(), np.flatnonzero(counts < expected)[:10]
    assert (counts - expected).sum() <= accounted.reexecuted * BATCH
  finally:
    joining.resume()
    chief_run.stop_chief(cluster)
