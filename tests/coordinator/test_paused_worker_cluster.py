"""A paused worker does not hold the coordinator's first run of an op.

TensorFlow registers each new kind of eager op with every task, and under
ParameterServerStrategy that waits for each task's answer: a SIGSTOPped
worker held a coordinator at its first loop end (Orbit's first summaries)
for as long as it slept. `strategy.connect` has the coordinator run eager ops
as kernels (`tf_internals.run_eager_ops_as_kernels`), which involves no other
task. The client below (a coordinator in the cluster's network) runs ops of
kinds it never ran, with worker:1 paused, and says how long they took.
"""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tfps.cluster import processes

from tests.support import client_lines

pytestmark = pytest.mark.cluster

# The ops take well under a second; without the fix they wait for the pause,
# which lasts until the test has its answer or gives up at this deadline.
DEADLINE = 30

CLIENT = textwrap.dedent('''
    import json
    import os
    import sys
    import time

    import tensorflow as tf

    from tfps.cluster import spec as spec_lib
    from tfps.coordinator import strategy as strategy_lib


    def say(**fields):
      print(json.dumps(fields), flush=True)


    cluster = spec_lib.from_json_file(sys.argv[1], job_name="chief", task_index=0).cluster
    runtime = strategy_lib.connect(cluster, ready_timeout=60)
    with runtime.strategy.scope():
      total = tf.Variable(0.0)

    @tf.function
    def step():
      total.assign_add(1.0)

    for _ in range(4):
      runtime.coordinator.schedule(step)
    runtime.coordinator.join()
    say(event="trained", total=float(total.numpy()))
    sys.stdin.readline()  # The test has paused worker:1.

    timings = {}
    start = time.monotonic()
    tf.math.logical_and(tf.constant([True, False]), tf.constant([True, True]))
    timings["new op on the coordinator"] = time.monotonic() - start
    start = time.monotonic()
    writer = tf.summary.create_file_writer(sys.argv[2])
    with writer.as_default(step=1):
      tf.summary.scalar("loss", tf.constant(0.5))
    writer.flush()
    timings["first summary"] = time.monotonic() - start
    start = time.monotonic()
    total.assign_sub(0.5)
    timings["new op on a ps variable"] = time.monotonic() - start
    say(event="ran", timings=timings, total=float(total.numpy()))
    sys.stdin.readline()
    os._exit(0)  # TF's ClusterCoordinator may hang in __del__ at shutdown.
''')


@pytest.fixture(scope="module")
def cluster(loopback_cluster):
  return loopback_cluster


def test_ops_the_coordinator_never_ran_do_not_wait_for_a_paused_worker(cluster, tmp_path):
  script = tmp_path / "client.py"
  script.write_text(CLIENT)
  (tmp_path / "tmp").mkdir()
  env = dict(os.environ, GRPC_FAIL_FAST="use_caller", TF_CPP_MIN_LOG_LEVEL="1",
             TMPDIR=str(tmp_path / "tmp"))
  worker = cluster.worker(1)
  with open(tmp_path / "client.stderr", "w") as stderr:
    client = cluster.spawn(
        [sys.executable, str(script), cluster.spec_file, str(tmp_path / "summaries")],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
  try:
    lines = client_lines.Lines(client.stdout)
    assert lines.expect("trained", timeout=180)["total"] == 4.0
    worker.pause()
    try:
      client.stdin.write(b"paused\n")
      client.stdin.flush()
      ran = lines.expect("ran", timeout=DEADLINE)
    finally:
      worker.resume()
    assert all(seconds < 5 for seconds in ran["timings"].values()), ran
    assert ran["total"] == 3.5
    client.stdin.write(b"exit\n")
    client.stdin.flush()
    assert client.wait(timeout=30) == 0
  finally:
    processes.stop_group(client, grace=0)
