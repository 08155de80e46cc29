"""Connects the chief to its cluster: ParameterServerStrategy + ClusterCoordinator.

`connect` waits (with a deadline) until every ps and worker answers on gRPC,
then builds the strategy and its `ClusterCoordinator`. Waiting first matters:
TensorFlow's own first connection retries for minutes with unreadable gRPC
noise, while `cluster.readiness` fails after the deadline naming the tasks
that never answered (`ClusterUnreachableError`, retryable).

Large variables are split across the ps tasks when `min_shard_bytes` is set
(a `MinSizePartitioner` with at most one shard per ps): a variable becomes a
`ShardedVariable` once it is larger than `min_shard_bytes`. Only tf_keras
(Keras 2) layers work with such variables (docs/tensorflow-behaviour.md). Smaller
variables are placed whole, round-robin over the ps tasks.

Every shard costs a lookup and an update on its ps and a partition/stitch
on the worker, every step, whatever its size: per step, a ps's work is
mostly a fixed cost per tensor it serves, not per byte (docs/scaling.md).
So the default splits only variables larger than 64 MiB: big tables are
still spread over the ps (memory, bytes per step), while a table that one ps
holds easily stays whole and costs one lookup and one update per step. The
built-in ctr's tables (8-16 MB) stay whole and the model's variables spread
round-robin over the ps, which took about a sixth less CPU per step than the
table split over 2 ps at TF's tutorial size, 256 KiB (docs/benchmarks.md).
Lower `--min_shard_bytes` to split smaller tables (e.g. to spread one hot
table over the ps).

Nothing here reads or sets environment variables. TensorFlow's own knobs for
PS training are environment variables read inside TensorFlow; the process
edge (`tfps.commands.cli`) sets them before TensorFlow starts (GRPC_FAIL_FAST=use_caller,
as TF's PS tutorial asks, so RPCs to a dead task fail instead of waiting).
"""

import contextlib
import dataclasses
from typing import Any, Callable, ContextManager

from absl import logging
import tensorflow as tf

from tfps.cluster import readiness
from tfps.cluster import spec as spec_lib
from tfps.coordinator import api
from tfps.base import messages
from tfps.base import errors
from tfps.base import tf_internals

DEFAULT_MIN_SHARD_BYTES = api.DEFAULT_MIN_SHARD_BYTES


@dataclasses.dataclass(frozen=True)
class PSRuntime:
  """A connected ParameterServerStrategy and its ClusterCoordinator.

  Attributes:
    strategy: the `tf.distribute.experimental.ParameterServerStrategy`.
    coordinator: its `ClusterCoordinator` (one per strategy).
    cluster: the coordinator's view of the cluster (no evaluator).
    partitioned: whether large variables are sharded across the ps tasks.
  """

  strategy: tf.distribute.Strategy
  coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator
  cluster: spec_lib.ClusterSpec
  partitioned: bool

  @property
  def num_workers(self) -> int:
    return self.cluster.num_tasks(spec_lib.JobType.WORKER)

  @property
  def num_ps(self) -> int:
    return self.cluster.num_tasks(spec_lib.JobType.PS)


def connect(cluster: spec_lib.ClusterSpec, *, ready_timeout: float,
            min_shard_bytes: int | None = DEFAULT_MIN_SHARD_BYTES,
            workers_ready_timeout: float | None = None,
            watch: Callable[[spec_lib.ClusterSpec], ContextManager[Any]] | None = None
            ) -> PSRuntime:
  """Waits for the cluster, then builds the strategy and its coordinator.

  Args:
    cluster: the whole cluster; evaluators are dropped (tensorflow#46169).
    ready_timeout: seconds to wait for every ps and worker to answer.
    workers_ready_timeout: seconds to wait for the workers, if less (elastic
      workers: one that does not answer is left out by the next start).
    min_shard_bytes: split variables larger than this across the ps tasks
      (at most one shard per ps); None or 0 disables partitioning.
    watch: `watch(cluster)` is held around TensorFlow's connect, once every task
      answered (it waits for each with no deadline): `ps_deadline.PsDeadline`.

  Returns:
    The connected runtime. TensorFlow allows one cluster per process: calling
    this again with the same cluster works (a new strategy on the same
    servers), with another cluster it does not.

  Raises:
    UsageError: the cluster has no worker or no chief.
    ClusterUnreachableError: a ps or worker did not answer in time (retryable).
    RetryableError: TensorFlow could not connect although the tasks answered.
  """
  cluster = cluster.for_coordinator()
  if cluster.num_tasks(spec_lib.JobType.WORKER) == 0:
    raise spec_lib.ClusterSpecError(
        "cluster.worker: parameter-server training needs at least one worker")
  # The chief's own address is served by this process once connected.
  remote = [t for t in cluster.tasks() if t.job != spec_lib.JobType.CHIEF]
  if workers_ready_timeout is None:
    readiness.wait_until_reachable(cluster, ready_timeout, tasks=remote)
  else:
    readiness.wait_until_reachable(
        cluster, ready_timeout, tasks=[t for t in remote if t.job == spec_lib.JobType.PS])
    readiness.wait_until_reachable(
        cluster, min(ready_timeout, workers_ready_timeout),
        tasks=[t for t in remote if t.job == spec_lib.JobType.WORKER])

  num_ps = cluster.num_tasks(spec_lib.JobType.PS)
  partitioner = None
  if min_shard_bytes:
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=min_shard_bytes, max_shards=num_ps)
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster.as_dict()), rpc_layer="grpc")
  try:
    with watch(cluster) if watch is not None else contextlib.nullcontext():
      strategy = tf.distribute.experimental.ParameterServerStrategy(
          resolver, variable_partitioner=partitioner)
      coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError) as e:
    raise errors.RetryableError(
        f"could not connect to the cluster: {type(e).__name__}: "
        f"{messages.one_line(e.message)}") from e
  # A closure a lost worker was running is the one the loop waits for: it runs
  # next, not after every closure queued behind it.
  tf_internals.put_back_failed_closures_first(coordinator)
  logging.info("connected to %d ps and %d workers (variables %s)", num_ps,
               cluster.num_tasks(spec_lib.JobType.WORKER),
               f"sharded above {min_shard_bytes} bytes" if partitioner else "not sharded")
  return PSRuntime(strategy=strategy, coordinator=coordinator, cluster=cluster,
                   partitioned=partitioner is not None)

