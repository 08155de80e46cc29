"""An in-process cluster for fast unit tests of coordinator code.

All ps and worker servers run as `tf.distribute.Server`s inside the calling
process, and the caller is the chief. Cheap (no process starts, no second
TensorFlow import), but nothing can be killed: fault tests use
`local.LocalCluster`, which runs real processes.

Caveat: TF servers listen on all interfaces and cannot be stopped; these live
until the test process exits. Use only in test processes.
"""

import dataclasses

import portpicker

from tfps.cluster import server_threads
from tfps.cluster import spec as spec_lib


@dataclasses.dataclass(frozen=True)
class InProcessCluster:
  cluster: spec_lib.ClusterSpec
  servers: tuple  # tf.distribute.Server, kept referenced so they keep serving.


def start(num_ps: int, num_workers: int) -> InProcessCluster:
  """Starts `num_ps` ps and `num_workers` worker servers in this process."""
  import tensorflow as tf  # Imported late: the cluster package works without TF.

  def addresses(n):
    return [f"localhost:{portpicker.pick_unused_port()}" for _ in range(n)]

  cluster = spec_lib.ClusterSpec.from_dict({
      "chief": addresses(1), "ps": addresses(num_ps), "worker": addresses(num_workers)})
  tf_spec = tf.train.ClusterSpec(cluster.as_dict())
  server_config = tf.compat.v1.ConfigProto(
      inter_op_parallelism_threads=server_threads.inter_op_threads(num_workers))
  servers = []
  for task in cluster.tasks():
    if task.job == spec_lib.JobType.CHIEF:
      continue  # The calling process is the chief.
    servers.append(tf.distribute.Server(
        tf_spec, job_name=task.job.value, task_index=task.index, protocol="grpc",
        config=server_config,
        start=True))
  return InProcessCluster(cluster=cluster, servers=tuple(servers))
