"""Exact evaluation on a real multi-process cluster while a worker is SIGKILLed.

The test process cannot reach the cluster (it lives in a private network), so
the TensorFlow client, a coordinator that trains ctr a little and evaluates it
with `PSEvaluator`, runs as a subprocess inside the cluster's network and
talks to the test over its stdin/stdout:

  client                                        test
  {"event": "clean", metrics...}        ->
  (faulted eval: all shards queued)
  {"event": "first_shard_done"}         ->      SIGKILL worker:1, wait for it
                                        <-      "killed"
  {"event": "after_kill", "done": ...}  ->      restart worker:1 (same address)
  {"event": "faulted", metrics...}      ->      wait until TF re-admitted worker:1
                                        <-      "exit"

The second evaluation must give exactly the first one's AUC, loss and example
count: shards lost with the worker are re-run elsewhere from scratch and their
partial counts never reach the result.
"""

import signal
import textwrap

import pytest

from tfps.cluster import processes

from tests.support import cluster_client

pytestmark = pytest.mark.cluster

EVAL_EXAMPLES = 65536  # 16 shards of 16 batches of 256: ~4 s per evaluation on 2 workers.
NUM_SHARDS = 16
MARKER = "FAULTED EVALUATION STARTS"
READMITTED = "Worker /job:worker/replica:0/task:1 has been recovered."  # TF's log line.

CLIENT = textwrap.dedent(f'''
    import json
    import os
    import sys
    import threading

    from absl import logging
    logging.use_absl_handler()
    logging.set_verbosity(logging.INFO)  # TF's coordinator logs its retries at INFO.

    import orbit
    import tensorflow as tf
    import tf_keras

    from tfps.cluster import spec as spec_lib
    from tfps.examples.ctr import experiment as ctr
    from tfps.coordinator import evaluator as evaluator_lib
    from tfps.coordinator import strategy as strategy_lib
    from tfps.coordinator import trainer as trainer_lib


    def say(**fields):
      print(json.dumps(fields), flush=True)


    cluster = spec_lib.from_json_file(sys.argv[1], job_name="chief", task_index=0).cluster
    runtime = strategy_lib.connect(cluster, ready_timeout=60, min_shard_bytes=16 << 10)
    config = ctr.CtrConfig.from_params({{
        "vocab_sizes": "3000:2000:1000", "embedding_dim": "8", "hidden": "32:16",
        "eval_examples": "{EVAL_EXAMPLES}", "train_examples": "16384"}})
    with runtime.strategy.scope():
      model = ctr.build_model(config, seed=3)
      optimizer = tf_keras.optimizers.Adagrad(0.05)
      step = optimizer.iterations  # CtrTrainer counts steps with the optimizer.
      data_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
      trainer = ctr.CtrTrainer(model, optimizer,
                               ctr.train_dataset_fn(config, 3, 256, data_dir=data_dir))
      evaluator = ctr.CtrEvaluator(model, ctr.eval_dataset_fn(config, 3, 256))
    # Trained a little, so that the metrics are those of a real model.
    ps_trainer = trainer_lib.PSTrainer(trainer, runtime, trainer_lib.LoopOptions(steps_per_closure=10))
    ps_trainer.train(tf.constant(40))
    # Its written-out closures and their warm-ups ran in that loop: the kill
    # below lands on an evaluation closure.
    assert ps_trainer.workers_kept_warm
    ps_evaluator = evaluator_lib.PSEvaluator(evaluator, runtime, num_shards={NUM_SHARDS})


    def evaluate():
      out = ps_evaluator.evaluate(tf.constant(-1))
      return {{"auc": float(out["auc"]), "loss": float(out["loss"]),
              "count": float(evaluator.loss.count.numpy()), "step": int(step.numpy())}}


    say(event="clean", **evaluate())

    # Tell the test when the first shard of the next evaluation has finished:
    # then every worker is busy with the others.
    coordinator = runtime.coordinator
    schedule = coordinator.schedule
    scheduled = []
    first_done = threading.Lock()

    def announce_first(remote):
      try:
        remote.fetch()  # Blocks until this shard has run.
      except tf.errors.OpError:
        # TF publishes a closure's result before copying it to the coordinator:
        # a worker killed in between fails this copy, and TF's own copy, which
        # reruns the shard. Another shard announces.
        return
      if first_done.acquire(blocking=False):
        say(event="first_shard_done")

    def counting_schedule(*args, **kwargs):
      scheduled.append(schedule(*args, **kwargs))
      if len(scheduled) == {NUM_SHARDS}:
        for remote in scheduled:
          threading.Thread(target=announce_first, args=(remote,), daemon=True).start()
      return scheduled[-1]

    coordinator.schedule = counting_schedule
    logging.info("{MARKER}")
    result = {{}}

    def faulted():
      try:
        result.update(evaluate())
      except Exception as e:  # Reported to the test, which fails.
        result["error"] = f"{{type(e).__name__}}: {{e}}"

    thread = threading.Thread(target=faulted, name="faulted-eval", daemon=True)
    thread.start()
    sys.stdin.readline()  # The test has killed a worker.
    say(event="after_kill", done=coordinator.done())
    thread.join(timeout=240)
    say(event="faulted", hung=thread.is_alive(), shards=len(scheduled), **result)
    sys.stdin.readline()  # The test has seen the worker re-admitted.
    sys.stderr.flush()
    # Not a normal exit: at interpreter shutdown TF's ClusterCoordinator.__del__
    # waits for a lock that its worker-recovery thread may hold, and shutdown
    # has frozen that thread (observed: a hang at exit after a worker loss).
    os._exit(0)
''')


@pytest.fixture(scope="module")
def cluster(loopback_cluster):
  return loopback_cluster


def test_exact_eval_is_unchanged_by_a_worker_killed_mid_evaluation(cluster, tmp_path):
  worker = cluster.worker(1)
  client, stderr_path = cluster_client.start(cluster, tmp_path, CLIENT)
  try:
    lines = cluster_client.Lines(client.stdout)
    clean = lines.expect("clean", timeout=180)
    lines.expect("first_shard_done", timeout=60)
    worker.kill(signal.SIGKILL)
    assert worker.wait(timeout=10) == -signal.SIGKILL
    cluster_client.tell(client, "killed")
    after_kill = lines.expect("after_kill", timeout=30)
    worker.restart(timeout=180)  # Back at the same address; TF re-admits it.
    faulted = lines.expect("faulted", timeout=300)
    assert not faulted["hung"] and "error" not in faulted, faulted
    processes.wait_until(lambda: READMITTED in stderr_path.read_text(), timeout=120,
                         what="the client's coordinator to re-admit worker:1")
    cluster_client.tell(client, "exit")
    assert client.wait(timeout=30) == 0
  finally:
    processes.stop_group(client, grace=0)
  log = stderr_path.read_text()
  before, _, during = log.partition(MARKER)
  assert during, f"the client never started the faulted evaluation:\n{log[-3000:]}"

  # The kill landed mid-evaluation: shards were still outstanding after it, and
  # the coordinator put back a closure that was running on the killed worker.
  assert after_kill["done"] is False
  assert "[Worker 1] Putting back a closure after it failed." in during, during[-3000:]
  assert "Putting back a closure" not in before

  assert faulted["shards"] == NUM_SHARDS  # Retries are not new schedules.
  assert clean["count"] == EVAL_EXAMPLES  # Every example once...
  assert 0.55 < clean["auc"] < 1.0  # ...of a model that has learnt something.
  for metric in ("count", "auc", "loss", "step"):
    assert faulted[metric] == clean[metric], (metric, clean, faulted)  # Bit for bit.
