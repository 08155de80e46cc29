"""The failure matrix (docs/recovery.md), one row per test, with real processes and signals.

The session's loopback LocalCluster (`loopback_cluster` in conftest.py: 1 ps,
2 workers) and one supervised chief (`tfps run`, training without end on the
`counting` experiment of support/experiments/input_experiments.py, which counts in a checkpointed
variable how often it trained on each example of its finite dataset) are
shared by the row tests, which run in file order; each injects one fault,
checks how training came back from the progress log (`progress.jsonl`: one
record per loop, a `restored` one per coordinator start) and the event log,
and leaves every task running. After the rows, the counts in the final
checkpoint are checked against the input accounting: through every fault
above, each example was trained once per epoch. Every wait is bounded.
"""

import glob
import os
import signal
import tempfile

import numpy as np
import pytest

from tfps.cluster import local
from tfps.cluster import processes
from tfps.recovery import coverage
from tfps.recovery import policy

from tests.support import chief_run

import input_experiments  # tests/support/experiments/, on sys.path (conftest.py).

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("experiments_importable")]

# Long enough for a killed worker to restart on a loaded 2-core machine. The
# row of a worker gone for good, which waits this out, is tested on a chief
# with a short one (test_partitions.py).
WORKER_TIMEOUT = 30
# The rows' experiment: a finite dataset of EXAMPLES ids in batches of BATCH
# (about 160 batches an epoch), each step with some work for the worker's CPU.
EXAMPLES, BATCH = 20000, 128
COUNTING = f"examples={EXAMPLES},work=256"


def _chief_run(cluster: local.LocalCluster, model_dir: str, *,
               experiment: str = "input_experiments:counting",
               params: str = COUNTING) -> chief_run.ChiefRun:
  """A supervised chief training without end (not started yet)."""
  return chief_run.ChiefRun(cluster, model_dir, [
      f"--experiment={experiment}", f"--experiment_params={params}", "--mode=train",
      "--train_steps=10000000", f"--steps_per_loop={chief_run.STEPS_PER_LOOP}",
      f"--steps_per_closure={chief_run.STEPS_PER_CLOSURE}",
      f"--checkpoint_interval={chief_run.CHECKPOINT_INTERVAL}", f"--global_batch_size={BATCH}",
      f"--worker_timeout={WORKER_TIMEOUT}", "--grace_seconds=20"])


@pytest.fixture(scope="module")
def cluster(loopback_cluster):
  return loopback_cluster


@pytest.fixture(scope="module")
def run(cluster, tmp_path_factory):
  yield _chief_run(cluster, str(tmp_path_factory.mktemp("recovery") / "model")).start_training()


@pytest.fixture(autouse=True)
def _healthy(request):
  """Row tests start with every task up and the chief training."""
  if "run" in request.fixturenames:
    training = request.getfixturevalue("run")
    training.cluster.wait_ready(timeout=60)
    if not training.chief.alive:
      training.chief.start()
    training.wait_for_step(training.step, timeout=180)
  yield


def _warm_ups(run, task: str) -> int:
  """Times the chief instantiated the train closures on `task` ahead of its closures."""
  return run.log().count(f"{task}: train closures instantiated in")


def test_worker_killed_and_restarted_training_goes_on(run):
  worker = run.cluster.worker(1)
  # Once the written-out closure is in use, workers are kept warm (warm_up.py).
  run.wait_for(lambda: _warm_ups(run, "worker:1") >= 1, timeout=180,
               what="the train closures kept warm on worker:1")
  warm_ups = _warm_ups(run, "worker:1")
  restores = len(run.restores)
  step = run.step
  worker.kill(signal.SIGKILL)
  assert worker.wait(timeout=10) == -signal.SIGKILL
  worker.start()  # Back within --worker_timeout: TF re-admits it by itself.
  run.cluster.wait_ready([worker.task], timeout=60)
  run.wait_for_work([worker])  # Re-admitted: the returning worker runs closures again.
  run.wait_for_step(step)
  assert len(run.restores) == restores  # No coordinator restart.
  # Warmed before TF handed it a closure; the input check after the rows
  # shows the warm-up trained nothing.
  run.wait_for(lambda: _warm_ups(run, "worker:1") > warm_ups, timeout=60,
               what="worker:1 warmed again after its restart")
  # Logged readably: a few summary lines, none of TF's raw gRPC records.
  lines = [l for l in run.log().splitlines() if l.startswith("grpc: ") and "worker:1" in l]
  assert 1 <= len(lines) <= 3, lines
  assert "Additional GRPC error information" not in run.log()


def test_a_paused_worker_s_closure_runs_again_elsewhere_and_training_goes_on(run):
  """SIGSTOP: the worker keeps its connections, so TF would wait for its closure.
  Its closure runs again on the other worker while it sleeps; woken, its own run
  stops at its next fence check, and it takes closures again."""
  worker = run.cluster.worker(1)
  # Paused while it instantiates closures (a warm-up, which no loop waits for),
  # it would hold no train closure to take: pause it once it trains written-out ones.
  written_out = "writing out the full-size closures"
  run.wait_for(lambda: written_out in run.log() and "worker:1: train closures instantiated"
               in run.log().rsplit(written_out, 1)[1], timeout=60,
               what="worker:1 to instantiate the written-out closures")
  run.wait_for_work([worker])
  reruns = run.log().count("run again on another worker")
  restores = len(run.restores)
  worker.pause()
  try:
    run.wait_for(lambda: run.log().count("run again on another worker") > reruns, timeout=60,
                 what="worker:1's closure run again elsewhere")
    step = run.step
    # Two loops end while it sleeps: the loop no longer waits for its closure.
    run.wait_for_step(run.wait_for_step(step, timeout=60), timeout=60)
    assert worker.alive
  finally:
    worker.resume()
  run.wait_for(lambda: "run again elsewhere ended" in run.log(), timeout=60,
               what="worker:1's first run, woken, to end (its outcome dropped)")
  run.wait_for_work([worker])
  assert len(run.restores) == restores  # No coordinator restart.
  assert "Detected at node" not in run.log()  # TF's error for the dropped run: not logged.


def test_ps_killed_and_restarted_restores_the_last_checkpoint(run):
  ps = run.cluster.ps(0)
  ps.kill(signal.SIGKILL)
  assert ps.wait(timeout=10) == -signal.SIGKILL
  processes.wait_until(lambda: any(e.failure == policy.FailureKind.PS_LOST.value
                                   for e in run.events()), timeout=60,
                       what="the supervisor to record the ps loss")
  # Read once the loss is recorded and before the ps is back (no restart can
  # have happened): a loop that ended just before the kill counts as trained.
  step, records = run.step, len(run.records)
  ps.start()
  restored = run.wait_for_restart_and_progress(records, timeout=180)
  lost = step - restored.step
  assert 0 <= lost <= chief_run.MAX_STEPS_LOST, (step, restored)
  # A checkpoint that was completely written, not a guess.
  assert f"ckpt-{restored.step} at step {restored.step}" in run.log()
  # The new coordinator was the warm standby, started while the old one trained.
  assert ", warm standby)" in run.log()
  actions = [e.action for e in run.events() if e.kind == "action"]
  assert policy.Action.WAIT_AND_RESTART.value in actions
  if lost:
    reported = [e.steps_lost for e in run.events() if e.kind == "recovered" and e.steps_lost]
    assert reported and reported[-1] <= lost


def test_ps_preempted_with_notice_loses_no_steps(run):
  ps = run.cluster.ps(0)
  restores = len(run.restores)
  ps.kill(signal.SIGTERM)
  assert ps.wait(timeout=30) == 143
  step_at_exit = run.step
  ps.start()
  run.wait_for_step(step_at_exit, timeout=180)
  restored = run.restores[restores]
  assert restored.step == step_at_exit  # Saved on the notice, restored exactly there.
  notice = [e for e in run.events() if e.failure == policy.FailureKind.TASK_NOTICE.value]
  assert notice and notice[-1].task == "ps:0" and notice[-1].step == step_at_exit
  with open(ps.log_path) as f:
    assert "ps:0: chief saved a checkpoint" in f.read()


def test_worker_preempted_with_notice_is_answered_and_training_goes_on(run):
  worker = run.cluster.worker(0)
  restores = len(run.restores)
  worker.kill(signal.SIGTERM)
  assert worker.wait(timeout=30) == 143
  with open(worker.log_path) as f:
    assert "worker:0: chief saved a checkpoint" in f.read()
  run.wait_for_step(run.step + 100, timeout=60)
  worker.start()
  assert len(run.restores) == restores


def test_chief_preempted_saves_and_exits_143_then_resumes_exactly(run):
  run.chief.kill(signal.SIGTERM)
  assert run.chief.wait(timeout=60) == 143
  step = run.step
  restores = len(run.restores)
  run.chief.start()
  run.wait_for_step(step, timeout=180)
  assert run.restores[restores].step == step  # Zero steps lost.
  saved = [e for e in run.events() if e.action == policy.Action.SAVE_AND_EXIT.value]
  assert saved and saved[-1].step == step


def test_chief_killed_resumes_from_the_latest_checkpoint(run):
  killed = run.chief.pid
  run.chief.kill(signal.SIGKILL)
  assert run.chief.wait(timeout=10) == -signal.SIGKILL
  # Read after the kill: the killed chief's loops run on until the signal lands.
  step, since = run.step, len(run.records)
  run.chief.start()  # As an orchestrator would; ps and workers kept running.
  restored = run.wait_for_restart_and_progress(since, timeout=180)
  assert 0 <= step - restored.step <= chief_run.MAX_STEPS_LOST
  # The killed chief's scratch (its coordinators' logs and AutoGraph files)
  # was swept by the new one.
  assert not glob.glob(os.path.join(tempfile.gettempdir(), f"tfps-chief-{killed}-*"))


@pytest.mark.crash_output_expected("Fatal Python error: Segmentation fault")
def test_a_coordinator_that_crashes_is_a_death_with_its_last_words_and_is_restarted(run):
  # A real SIGSEGV to the coordinator (the supervisor's child): what a crash
  # in TensorFlow's C++ code does. It dies with CPython's fatal-error report.
  coordinator = run.restores[-1].pid
  step, since = run.step, len(run.records)
  os.kill(coordinator, signal.SIGSEGV)
  restored = run.wait_for_restart_and_progress(since, timeout=180)
  assert restored.pid != coordinator and 0 <= step - restored.step <= chief_run.MAX_STEPS_LOST
  [died] = [e for e in run.events() if e.kind == "died" and e.pid == coordinator]
  assert (died.task, died.signal) == ("coordinator", "SIGSEGV"), died
  assert any("Fatal Python error: Segmentation fault" in line for line in died.last_lines), died
  failure = [e for e in run.events() if e.kind == "failure" and e.time >= died.time][0]
  assert failure.failure == policy.FailureKind.CHIEF_LOST.value


def test_two_workers_killed_together_are_both_readmitted(run):
  step = run.step
  workers = [run.cluster.worker(0), run.cluster.worker(1)]
  for worker in workers:
    worker.kill(signal.SIGKILL)
  for worker in workers:
    worker.wait(timeout=10)
    worker.start()
  run.cluster.wait_ready(timeout=90)
  run.wait_for_work(workers, timeout=180)
  run.wait_for_step(step)


# A second readmission of the same worker: the rows above readmit each worker once.
@pytest.mark.soak
def test_a_worker_failing_repeatedly_is_readmitted_each_time(run):
  worker = run.cluster.worker(0)
  restores = len(run.restores)
  for _ in range(2):
    step = run.step
    worker.kill(signal.SIGKILL)
    worker.wait(timeout=10)
    worker.start()
    run.cluster.wait_ready([worker.task], timeout=60)
    run.wait_for_step(step + 100, timeout=120)
  run.wait_for_work([worker])
  assert len(run.restores) == restores  # Absorbed by TF every time.


def test_ps_failing_while_a_worker_recovers(run):
  worker, ps = run.cluster.worker(1), run.cluster.ps(0)
  ps_losses = sum(e.failure == policy.FailureKind.PS_LOST.value for e in run.events())
  worker.kill(signal.SIGKILL)
  worker.wait(timeout=10)
  worker.start()  # Still importing TF (seconds) when the ps goes too.
  ps.kill(signal.SIGKILL)
  ps.wait(timeout=10)
  processes.wait_until(
      lambda: sum(e.failure == policy.FailureKind.PS_LOST.value for e in run.events())
      > ps_losses, timeout=60, what="the supervisor to record the ps loss")
  step, records = run.step, len(run.records)  # As in the test above.
  ps.start()
  # The ps loss restarted the coordinator from a checkpoint.
  restored = run.wait_for_restart_and_progress(records, timeout=240)
  assert 0 <= step - restored.step <= chief_run.MAX_STEPS_LOST
  run.cluster.wait_ready([worker.task], timeout=60)
  run.wait_for_work([worker])  # And the recovering worker works again.


def test_every_example_was_trained_once_per_epoch_through_every_fault_above(run):
  """The ground truth (counts in the checkpoint) against the input accounting."""
  run.wait_for_epochs(2)
  run.chief.kill(signal.SIGTERM)  # Saves where it is and exits: the final checkpoint.
  assert run.chief.wait(timeout=60) == 143
  records = run.history()
  accounted = coverage.account(records)
  assert accounted.ok, accounted
  assert sum(r.restored for r in records) >= 6  # The rows' ps and chief faults restored.
  with open(os.path.join(run.model_dir, "checkpoint")) as f:
    latest = os.path.join(run.model_dir, f.readline().split('"')[1])
  assert int(latest.rpartition("-")[2]) == records[-1].step == accounted.kept
  counts = input_experiments.counts_in(latest).astype(np.int64)
  lengths = next(r.shard_lengths for r in records if r.shard_lengths)
  expected = input_experiments.expected_counts(EXAMPLES, BATCH, lengths,
                                               coverage.kept_chunks(records))
  # Every example of every completed epoch was trained on (none never) ...
  assert expected.min() >= accounted.epochs_completed
  assert (counts >= expected).all(), np.flatnonzero(counts < expected)[:10]
  # ... and the only extra applications are the steps TF re-ran in retried
  # closures (a dead worker's partial closure), not restores: those rolled
  # the counts back with the ledger.
  assert (counts - expected).sum() <= accounted.reexecuted * BATCH, (
      (counts - expected).sum(), accounted)
  run.chief.start()  # The rows' chief, for the tests below.


def test_killed_during_a_checkpoint_save_restores_the_last_complete_one(cluster, tmp_path):
  chief_run.stop_chief(cluster)  # The row tests' chief: one chief at a time.
  marker = tmp_path / "saving"
  try:
    blocked = _chief_run(
        cluster, str(tmp_path / "model"), experiment="fault_experiments:blocking_save",
        params=f"{COUNTING},"
               f"block_at_step={2 * chief_run.CHECKPOINT_INTERVAL},marker={marker}")
    blocked.chief.start()
    processes.wait_until(marker.exists, timeout=240, what="the chief to block mid-save")
    blocked.chief.kill(signal.SIGKILL)
    blocked.chief.wait(timeout=10)
    blocked_step = int(marker.read_text())
    # The index still names the last checkpoint that was completely written.
    with open(tmp_path / "model" / "checkpoint") as f:
      latest = f.readline().split('"')[1]
    complete_step = int(latest.rpartition("-")[2])
    assert 0 < complete_step < blocked_step
    assert not os.path.exists(tmp_path / "model" / f"ckpt-{blocked_step}.index")
    resumed = _chief_run(cluster, str(tmp_path / "model"),
                         experiment="fault_experiments:blocking_save",
                         params=f"{COUNTING},block_at_step=0")
    resumed.chief.start()
    resumed.wait_for_step(complete_step, timeout=180)
    assert resumed.restores[-1].step == complete_step
    assert f"restored {tmp_path / 'model'}/ckpt-{complete_step} at step {complete_step}" \
        in resumed.log()
  finally:
    cluster.tasks[chief_run.CHIEF].kill(signal.SIGKILL)


def test_nan_loss_is_permanent_and_not_retried(cluster, tmp_path):
  chief_run.stop_chief(cluster)
  nan = _chief_run(cluster, str(tmp_path / "model"), experiment="fault_experiments:nan_loss")
  nan.chief.start()
  assert nan.chief.wait(timeout=180) == 1
  log = nan.log()
  assert "loss is nan at step" in log and "giving up" in log
  assert log.count("starting coordinator") == 1  # Never restarted.
  assert [e.failure for e in nan.events() if e.kind == "failure"] == [
      policy.FailureKind.NAN_LOSS.value]
