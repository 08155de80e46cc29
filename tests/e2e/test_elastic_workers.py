"""Elastic workers: a chief with `--min_workers` trains on the workers that answer,
takes in one that joins while it trains, and goes on without one that leaves.

On the session's loopback cluster (1 ps, 2 workers): worker:1 is paused
(SIGSTOP) before the chief starts, so it does not answer and the chief's
cluster spec has room for it, as a job launched with fewer workers than
`--max_workers` has; resumed, it answers, as a worker that has just started
does (the chief cannot tell them apart, and the pause spares the test a
TensorFlow import; `tfps chaos` joins new processes). Every wait is for an
event (a restore record, a loop, CPU spent by the joined worker, an evaluation).
Between the join and the leave the chief is SIGKILLed and started again.

The chief also evaluates (a `CountingEvaluator`, which sums the ids it reads)
every few loops, a part of the eval set only (--eval_steps): on each cluster
the job has, the same batches, each once.
"""

import glob
import os
import signal

import numpy as np
import pytest
import tensorflow as tf

from tests.support import chief_run
from tfps.recovery import coverage

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("experiments_importable")]

EXAMPLES, BATCH = 20000, 128  # About 160 steps an epoch.
# A worker that left is left out this long after it went (the supervisor's probes).
WORKER_TIMEOUT = 6
EVAL_EXAMPLES, EVAL_STEPS = 2048, 10  # 10 of the 16 batches, over 8 shards (4 per worker).
EVAL_INTERVAL = 2 * chief_run.STEPS_PER_LOOP
SUMS = ("seen", "id_sum", "id_square_sum")  # A CountingEvaluator's output.


def _evaluations(model_dir: str) -> list[tuple[int, dict[str, float]]]:
  """(step, output) of every evaluation the chiefs wrote to model_dir/eval so far."""
  found = []
  for path in sorted(glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*"))):
    outputs: dict[int, dict[str, float]] = {}
    try:
      for record in tf.data.TFRecordDataset(path):
        event = tf.compat.v1.Event.FromString(record.numpy())
        for value in event.summary.value:
          if value.tag in SUMS:  # Orbit adds steps_per_second.
            outputs.setdefault(event.step, {})[value.tag] = float(tf.make_ndarray(value.tensor))
    except tf.errors.DataLossError:
      pass  # A record still being written: read again on the next poll.
    found += sorted(outputs.items())
  return found


def _partial_eval_sums(shards: int) -> dict[str, float]:
  """What a CountingEvaluator sums over EVAL_STEPS batches spread over `shards`."""
  base, extra = divmod(EVAL_STEPS, shards)
  ids = np.concatenate([np.arange(i, EVAL_EXAMPLES, shards)[:(base + (i < extra)) * BATCH]
                        for i in range(shards)]).astype(np.float64)
  return dict(zip(SUMS, (float(ids.size), float(ids.sum()), float((ids * ids).sum()))))


@pytest.fixture(scope="module")
def cluster(loopback_cluster):
  return loopback_cluster


def _restart_with(run: chief_run.ChiefRun, since: int, left_out: tuple[str, ...]):
  """Waits for a coordinator restart after record `since` whose cluster leaves out exactly
  `left_out`, then for a loop after it."""
  run.wait_for(lambda: any(r.left_out == left_out for r in run.restores_after(since)),
               timeout=180, what=f"a coordinator restart leaving out {left_out or 'nothing'}")
  restored = [r for r in run.restores_after(since) if r.left_out == left_out][-1]
  run.wait_for(lambda: run.step > restored.step and not run.records[-1].restored,
               timeout=120, what=f"training past the restored step {restored.step}")
  # ... and an evaluation on that cluster.
  run.wait_for(lambda: any(step > restored.step for step, _ in _evaluations(run.model_dir)),
               timeout=120, what=f"an evaluation after the restored step {restored.step}")


def test_a_worker_joins_a_running_job_and_one_leaves_and_every_example_is_trained_once(
    cluster, tmp_path):
  joining = cluster.worker(1)
  joining.pause()  # Not answering when the job starts: room in the spec.
  run = chief_run.ChiefRun(cluster, str(tmp_path / "model"), [
      "--experiment=input_experiments:counting",
      f"--experiment_params=examples={EXAMPLES},work=256,eval_examples={EVAL_EXAMPLES}",
      "--mode=train_and_eval", f"--eval_interval={EVAL_INTERVAL}", f"--eval_steps={EVAL_STEPS}",
      "--train_steps=10000000", f"--global_batch_size={BATCH}",
      f"--steps_per_loop={chief_run.STEPS_PER_LOOP}",
      f"--steps_per_closure={chief_run.STEPS_PER_CLOSURE}",
      f"--checkpoint_interval={chief_run.CHECKPOINT_INTERVAL}",
      "--min_workers=1", f"--worker_timeout={WORKER_TIMEOUT}", "--grace_seconds=20"])
  run.start_training()
  # The first coordinator started on the worker that answered, without waiting.
  assert [r.left_out for r in run.restores] == [("worker:1",)], run.last_words()
  run.wait_for(lambda: _evaluations(run.model_dir), timeout=120, what="a first evaluation")

  since = len(run.records)
  joining.resume()  # Joins: the chief takes it in once it answers steadily.
  _restart_with(run, since, left_out=())
  run.wait_for_work([joining])  # The joined worker runs closures ...
  # ... and the progress log counts them: before the join none, after it some.
  run.wait_for(lambda: run.poll() is not None and any(
      dict(r.closures).get("worker:1") for r in run.records[since:]),
               timeout=60, what="closures of worker:1 in the progress log")
  assert not any(dict(r.closures).get("worker:1") for r in run.records[:since])
  assert any(dict(r.closures).get("worker:0") for r in run.records[:since])
  changes = [(e.task, e.task_change) for e in run.events() if e.task_change]
  assert changes == [("worker:1", "back")], changes

  # The chief killed with the joined worker in, and started again (as an
  # orchestrator would): its first coordinator takes every worker that answers.
  since = len(run.records)
  run.chief.kill(signal.SIGKILL)
  assert run.chief.wait(timeout=10) == -signal.SIGKILL
  run.chief.start()
  _restart_with(run, since, left_out=())

  since = len(run.records)
  joining.kill(signal.SIGTERM)  # Leaves: nobody starts it again.
  assert joining.wait(timeout=30) is not None
  _restart_with(run, since, left_out=("worker:1",))

  # A new worker process joins and is SIGKILLed the moment the chief takes it
  # in: the coordinator starting with it does not wait for it (no more than
  # --worker_timeout), and the job goes on without it.
  since = len(run.records)
  joining.start()
  run.wait_for(lambda: sum(e.task_change == "back" for e in run.events()) == 2,
               timeout=120, what="the chief to take worker:1 in again")
  joining.kill(signal.SIGKILL)
  assert joining.wait(timeout=10) == -signal.SIGKILL
  _restart_with(run, since, left_out=("worker:1",))

  run.wait_for_epochs(1)
  run.chief.kill(signal.SIGTERM)  # Saves where it is and exits.
  assert run.chief.wait(timeout=60) == 143
  accounted = coverage.account(run.history())
  # Through the join and the leave (two restarts from a save), every example
  # of the completed epochs once: the input position moved with the workers.
  assert accounted.ok and accounted.epochs_completed >= 1, accounted
  assert accounted.trained_twice == 0 and accounted.never_trained == 0, accounted
  # Every evaluation, on 1 worker of 2 and on 2, read the same batches once each:
  # 4 shards per worker of the spec, not per worker present.
  evaluations = _evaluations(run.model_dir)
  assert len(evaluations) >= 4, evaluations
  assert _partial_eval_sums(4) != _partial_eval_sums(8)  # The shards decide which batches.
  for step, output in evaluations:
    assert output == _partial_eval_sums(8), (step, output)
  chief_run.stop_chief(cluster)
