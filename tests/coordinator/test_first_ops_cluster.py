"""A first loop's edges go on while a worker is paused (SIGSTOP), on a real cluster.

TensorFlow registers each kind of eager op the coordinator runs for the first
time with every task, and waits for each (docs/tensorflow-behaviour.md). A
coordinator (a subprocess in the cluster's network, as a chief would be) runs
`first_ops.run_ahead` as it starts; then worker:1 is paused, and the
coordinator's first loop's begin and end, as Orbit runs them (the trainer's
metrics reset, their results, its summaries), must end while the worker stays
paused. A kind of op the coordinator never ran, run then, waits for the
worker: the pause is real.
"""

import textwrap

import pytest

from tfps.cluster import processes

from tests.support import cluster_client
from tests.support import procs

pytestmark = pytest.mark.cluster

LOOP_END_SECONDS = 20  # What the client waits for the loop end, paused worker or not.
STILL_WAITING_AFTER = 3  # An op never run before, with the worker paused this long.

CLIENT = textwrap.dedent(f'''
    import json
    import os
    import sys
    import tempfile
    import threading
    import time

    import orbit
    import tensorflow as tf
    import tf_keras

    from tfps.cluster import spec as spec_lib
    from tfps.coordinator import first_ops
    from tfps.coordinator import strategy as strategy_lib


    def say(**fields):
      print(json.dumps(fields), flush=True)


    class Trainer(tf.Module):
      def __init__(self):
        self.loss = tf_keras.metrics.Mean()
        self.accuracy = tf_keras.metrics.Accuracy()


    cluster = spec_lib.from_json_file(sys.argv[1], job_name="chief", task_index=0).cluster
    runtime = strategy_lib.connect(cluster, ready_timeout=60)
    with runtime.strategy.scope():
      step = orbit.utils.create_global_step()
      trainer = Trainer()
    # The kinds of op a loop's steps run (in its closures, in a tfps loop).
    trainer.loss.update_state(3.0)
    trainer.accuracy.update_state([1], [1])
    first_ops.run_ahead(step, trainer)
    say(event="ready")
    sys.stdin.readline()  # The test has paused worker:1.


    def loop_end():  # With its begin: the metrics reset, and the steps' updates.
      for metric in (trainer.loss, trainer.accuracy):
        metric.reset_state()
      trainer.loss.update_state(2.0)
      trainer.accuracy.update_state([1], [0])
      outputs = {{"loss": trainer.loss.result().numpy(),
                 "accuracy": trainer.accuracy.result().numpy(), "steps_per_second": 12.5}}
      summaries = orbit.utils.SummaryManager(tempfile.mkdtemp(), tf.summary.scalar,
                                             global_step=step)
      summaries.write_summaries(outputs)
      summaries.flush()


    def never_run_before():
      tf.math.cumsum(tf.constant([1.0, 2.0]))


    def timed(fn, timeout):
      start = time.monotonic()
      thread = threading.Thread(target=fn, daemon=True)
      thread.start()
      thread.join(timeout)
      return thread.is_alive(), time.monotonic() - start


    waiting, seconds = timed(loop_end, {LOOP_END_SECONDS})
    say(event="loop_end", waiting=waiting, seconds=seconds)
    waiting, seconds = timed(never_run_before, {STILL_WAITING_AFTER})
    say(event="new_op", waiting=waiting, seconds=seconds)
    sys.stdin.readline()  # The test has resumed worker:1.
    sys.stderr.flush()
    os._exit(0)  # As test_evaluator_cluster's client: no destructors waiting on TF threads.
''')


def test_a_first_loop_begins_and_ends_while_a_worker_is_paused(loopback_cluster, tmp_path):
  cluster = loopback_cluster
  worker = cluster.worker(1)
  client, _ = cluster_client.start(cluster, tmp_path, CLIENT)
  try:
    lines = cluster_client.Lines(client.stdout)
    lines.expect("ready", timeout=180)
    worker.pause()
    try:
      cluster_client.tell(client, "paused")
      loop_end = lines.expect("loop_end", timeout=LOOP_END_SECONDS + 30)
      new_op = lines.expect("new_op", timeout=STILL_WAITING_AFTER + 30)
      assert procs.state(worker.pid) == "T"  # Paused throughout.
    finally:
      worker.resume()
    cluster_client.tell(client, "resumed")
    assert client.wait(timeout=60) == 0
  finally:
    processes.stop_group(client, grace=0)
  assert not loop_end["waiting"], loop_end
  assert new_op["waiting"], new_op  # TensorFlow's wait: what the loop end no longer meets.
