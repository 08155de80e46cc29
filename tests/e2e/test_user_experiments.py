"""A worker SIGKILL costs little for experiments written as users write them.

The session's loopback cluster (1 ps, 2 workers) trains, one after the other,
the user-shaped experiments of support/experiments/user_experiments.py:
TensorFlow's parameter-server tutorial (a 16384-column embedding pulled from
the ps every step: slow steps, an endless dataset, lookup layers in the
dataset_fn) and Orbit's `SingleTaskTrainer` unmodified, each first for one
fault-free loop (its first loop's time: a coordinator's first loop also
traces and starts what later loops reuse), then without end: worker 0 is
SIGKILLed in the coordinator's first loop (as soon as it has restored) and
worker 1 later, once training is well under way; each is started again at
once, as an orchestrator would. What each fault adds stays within 2 s: to the
fault-free first loop, and to an ordinary loop (`chaos.tracker`'s stall
beyond a loop): closures are short (`--max_closure_seconds`) and the lost
one runs next. And a run of the tutorial's shape that reaches its end while a
worker is paused (SIGSTOP) ends then, with its last checkpoint, without
waiting for the worker to wake.
"""

import signal
import time

import pytest

from tfps.chaos import faults as faults_lib
from tfps.chaos import tracker as tracker_lib
from tfps.cluster import local

from tests.support import chief_run
from tests.support import procs

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("experiments_importable")]

STEPS_PER_LOOP = 50
# Loops after each fault: its recovery, and ordinary loops to compare the next with.
LOOPS = 2
# TensorFlow's own line when it has taken a restarted worker back.
READMITTED = "Worker /job:worker/replica:0/task:0 has been recovered"
# The stall a fault may add to an ordinary loop (issue bar: a worker kill costs
# at most 2 s for any experiment whose step takes under a second).
MAX_STALL_BEYOND_A_LOOP = 2.0


@pytest.fixture(scope="module")
def cluster(loopback_cluster):
  return loopback_cluster


class _Faults:
  """Injects worker kills into a chief's run and follows them through its progress
  log, as `tfps chaos` does (`chaos.tracker`)."""

  def __init__(self, run: chief_run.ChiefRun):
    self.run = run
    self.tracker = tracker_lib.RecoveryTracker()
    self._seen = 0

  def observe(self) -> None:
    self.run.poll()
    self.tracker.observe(self.run.records[self._seen:])
    self._seen = len(self.run.records)

  def kill_and_restart(self, handle: local.TaskHandle) -> int:
    """SIGKILLs `handle`'s task and starts it again at once; returns the records so far."""
    self.observe()  # Everything before the fault, first.
    fault = faults_lib.parse_faults(f"{handle.task}@0:kill+0", self.run.cluster.spec)[0]
    handle.kill(signal.SIGKILL)
    now = time.time()
    self.tracker.injected(fault, wall_time=now, since_start=now - self.run.records[0].time)
    assert handle.wait(timeout=10) == -signal.SIGKILL
    handle.start()
    return self._seen

  def loops_since(self, index: int) -> int:
    self.observe()
    return sum(not r.restored for r in self.run.records[index:])


def _flags(experiment: str, params: str, batch: int, steps: int) -> list[str]:
  return [f"--experiment={experiment}", f"--experiment_params={params}", "--mode=train",
          f"--train_steps={steps}", f"--steps_per_loop={STEPS_PER_LOOP}",
          f"--global_batch_size={batch}", "--worker_timeout=60",
          # No chief fault here: a standby coordinator would only take CPU
          # from the loops being timed.
          "--nowarm_standby"]


def _first_loop_seconds(run: chief_run.ChiefRun) -> float:
  run.poll()
  start, first = run.restores[0], next(r for r in run.records if not r.restored)
  return first.time - start.time


@pytest.mark.parametrize("experiment, params, batch", [
    ("user_experiments:tutorial", "examples=200", 32),
    ("user_experiments:single_task", "examples=65536,repeat=1", 256),
], ids=["tf_ps_tutorial", "orbit_single_task_trainer"])
def test_a_worker_kill_in_the_first_loop_and_later_stalls_training_briefly(
    cluster, tmp_path, experiment, params, batch):
  reference = chief_run.ChiefRun(cluster, str(tmp_path / "fault-free"),
                                 _flags(experiment, params, batch, STEPS_PER_LOOP))
  reference.chief.start()
  assert reference.chief.wait(timeout=300) == 0, reference.last_words()
  fault_free_first_loop = _first_loop_seconds(reference)
  chief_run.stop_chief(cluster)

  run = chief_run.ChiefRun(cluster, str(tmp_path / "model"),
                           _flags(experiment, params, batch, 10000000))
  faults = _Faults(run)
  run.chief.start()
  run.wait_for(lambda: run.restores, timeout=180, what="the coordinator's restore record")
  # At once: in its first loop (its calibration, its closures' first traces).
  first = faults.kill_and_restart(cluster.worker(0))
  run.wait_for(lambda: faults.loops_since(first) >= LOOPS, timeout=300,
               what=f"{LOOPS} loops after the first-loop fault")
  # One worker down at a time: worker 0 back in service (TensorFlow re-admitted
  # it), and loops with both workers to compare the next fault with.
  run.wait_for(lambda: READMITTED in run.log(), timeout=300,
               what="TensorFlow to re-admit worker:0")
  readmitted = faults.loops_since(0)
  run.wait_for(lambda: faults.loops_since(0) >= readmitted + LOOPS, timeout=300,
               what=f"{LOOPS} loops with worker:0 back")
  later = faults.kill_and_restart(cluster.worker(1))
  run.wait_for(lambda: faults.loops_since(later) >= LOOPS, timeout=300,
               what=f"{LOOPS} loops after the later fault")
  chief_run.stop_chief(cluster)
  faults.observe()
  assert len(run.restores) == 1, run.last_words()  # No coordinator restart for a worker.
  in_first_loop, later_fault = faults.tracker.outcomes()
  assert in_first_loop.recovered and later_fault.recovered
  added = _first_loop_seconds(run) - fault_free_first_loop
  assert added <= MAX_STALL_BEYOND_A_LOOP, (added, fault_free_first_loop, run.last_words())
  assert later_fault.stall_beyond_loop is not None, later_fault
  assert later_fault.stall_beyond_loop <= MAX_STALL_BEYOND_A_LOOP, (later_fault,
                                                                    run.last_words())


def test_a_run_that_ends_while_a_worker_is_paused_ends_with_its_last_checkpoint(
    cluster, tmp_path):
  # A worker paused near a run's end holds a closure that runs again elsewhere,
  # and the run reaches its last step without it. Before, the chief then waited
  # for the worker to wake: the last checkpoint's writer and the input iterators
  # on that worker are removed with calls that wait for its answer.
  steps = 400
  run = chief_run.ChiefRun(cluster, str(tmp_path / "model"),
                           _flags("user_experiments:tutorial", "examples=200", 32, steps))
  worker = cluster.worker(1)
  run.chief.start()
  try:
    run.wait_for_step(2 * STEPS_PER_LOOP, timeout=180)  # Past the first loops' new functions.
    worker.pause()
    if run.step >= steps:  # Ended before the pause landed (0.1 s polls): nothing to test.
      pytest.skip(f"the run reached step {steps} before worker:1 was paused; a host this "
                  "fast needs a longer run")
    assert run.chief.wait(timeout=120) == 0, run.last_words()
    assert procs.state(worker.pid) == "T"  # It ended with the worker still paused.
  finally:
    worker.resume()
    chief_run.stop_chief(cluster)
  assert run.step == steps
  with open(tmp_path / "model" / "checkpoint") as f:
    assert f'model_checkpoint_path: "ckpt-{steps}"' in f.read()
