"""The long-running side of a ps or worker task.

`serve` starts a `tf.distribute.Server` for this task (loading TensorFlow's
runtime only, `tf_runtime`) and blocks until the
process is asked to stop (SIGTERM or SIGINT), then returns the exit code the
orchestrator should see: 143 for SIGTERM (preempted: restart me), 130 for
SIGINT. On SIGTERM it first warns the chief over the control channel and
waits, within the grace period, until the chief has saved (see
`recovery.notices`). A TF server cannot be shut down in-process, so the caller ends the
process with `os._exit` after flushing its logs.

Stop signals must be trapped before TensorFlow is imported (a SIGTERM during
the seconds-long import would otherwise kill the process with -15 instead of 143):
call `base.signals.StopSignals.install()` first, then `serve`.
"""

import dataclasses
import errno
import os
import signal
import socket
import time

import grpc
from absl import logging

from tfps.cluster import server_threads
from tfps.cluster import spec as spec_lib
from tfps.ps_worker import graph_cache
from tfps.ps_worker import tf_runtime
from tfps.recovery import notices
from tfps.base import errors
from tfps.base.signals import StopSignals

# Left of the grace period after the notice, to flush logs and exit.
_GRACE_MARGIN_SECONDS = 2.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerOptions:
  """How a ps/worker server is configured.

  Attributes:
    inter_op_threads: TF inter-op threads; None picks a safe default (enough
      that concurrent closures cannot deadlock on 2 cores).
    intra_op_threads: TF intra-op threads; None picks 1 on a ps and, on a
      worker, the cores it may use, a container's CPU limit included
      (`server_threads.intra_op_threads`).
    thread_spinning: let idle TF threads spin waiting for work. Off by
      default: spinning threads of several tasks on the same cores take CPU
      from the tasks with work to do (measured: `tfps bench`, README).
    grace_seconds: time between SIGTERM and the hard kill (GKE Spot pods
      ~15 s, Spot VMs ~30 s). On SIGTERM the task warns the chief and stays
      up, at most this long less a safety margin, while the chief saves.
    control_addresses: the control channel of each chief replica (the one that
      coordinates answers); none disables the notice.
    graph_cache_root: a worker keeps the function graphs TensorFlow optimized
      for it in a directory of its own under this one, for the next
      coordinator (`graph_cache`); None: it does not.
    tf_runtime_only: load TensorFlow's runtime without its Python API
      (`tf_runtime`); False: `import tensorflow`.
  """

  inter_op_threads: int | None = None
  intra_op_threads: int | None = None
  thread_spinning: bool = False
  grace_seconds: float = 15.0
  control_addresses: tuple[str, ...] = ()
  graph_cache_root: str | None = None
  tf_runtime_only: bool = True

  def __post_init__(self):
    for name in ("inter_op_threads", "intra_op_threads"):
      value = getattr(self, name)
      if value is not None and value < 1:
        raise errors.UsageError(f"{name} ({value}) must be a positive integer")
    if self.grace_seconds <= _GRACE_MARGIN_SECONDS:
      raise errors.UsageError(
          f"grace_seconds ({self.grace_seconds}) must be more than {_GRACE_MARGIN_SECONDS}")

  @property
  def notice_deadline(self) -> float:
    return self.grace_seconds - _GRACE_MARGIN_SECONDS


def _server_cluster(cluster: spec_lib.ClusterSpec) -> dict[str, list[str]]:
  """The cluster as servers see it. The evaluator is a client, never served to."""
  return {job: hosts for job, hosts in cluster.as_dict().items()
          if job != spec_lib.JobType.EVALUATOR.value}


def session_config_for(job: spec_lib.JobType, cluster: spec_lib.ClusterSpec,
                       options: ServerOptions, config_proto):
  """The server's ConfigProto (of class `config_proto`): thread pools sized for a
  shared, small machine."""
  threads = options.inter_op_threads or server_threads.inter_op_threads(
      cluster.num_tasks(spec_lib.JobType.WORKER))
  intra = options.intra_op_threads or server_threads.intra_op_threads(
      job, server_threads.usable_cores())
  session_config = config_proto(inter_op_parallelism_threads=threads,
                                intra_op_parallelism_threads=intra)
  session_config.experimental.disable_thread_spinning = not options.thread_spinning
  return session_config


def serve(config: spec_lib.TaskConfig, stop: StopSignals,
          options: ServerOptions = ServerOptions()) -> errors.ExitCode:
  """Serves this ps/worker task until a stop signal; returns the exit code."""
  if config.task.job not in (spec_lib.JobType.PS, spec_lib.JobType.WORKER):
    raise errors.UsageError(f"task.type: {config.task.job.value!r} is not a ps or worker role")
  # Late: start-up cost and log noise only for servers.
  runtime = tf_runtime.load(options.tf_runtime_only)
  session_config = session_config_for(config.task.job, config.cluster, options,
                                      runtime.ConfigProto)
  cache = None
  if options.graph_cache_root and config.task.job == spec_lib.JobType.WORKER:
    cache = graph_cache.task_directory(
        options.graph_cache_root, config.task, config.address,
        session_config.SerializeToString(deterministic=True), runtime.version)
    cache = cache if graph_cache.enable(cache) else None
  if stop.requested:  # Told to stop while TF was importing: do not start.
    return errors.exit_code_for_signal(stop.signum)
  try:
    runtime.Server(runtime.ClusterSpec(_server_cluster(config.cluster)),
                   job_name=config.task.job.value, task_index=config.task.index,
                   protocol="grpc", config=session_config, start=True)
  except runtime.OpError as e:
    port = int(config.address.rpartition(":")[2])
    if not port_in_use(port):
      raise
    raise errors.AddressInUseError(
        f"{config.task}: address {config.address} is in use (port {port} is held by another "
        "process, often the previous one of this task still exiting); free it or wait, "
        "then start again") from e
  logging.info("serving %s at %s (pid %d); SIGTERM stops it with exit code %d",
               config.task, config.address, os.getpid(), errors.ExitCode.PREEMPTED)
  if cache:
    logging.info("%s keeps its optimized function graphs in %s", config.task, cache)
    while not stop.wait(graph_cache.PRUNE_SECONDS):
      graph_cache.prune(cache)
  else:
    stop.wait()
  if stop.signum == signal.SIGTERM and options.control_addresses:
    _warn_chief(config.task, options)
  code = errors.exit_code_for_signal(stop.signum)
  logging.info("%s stopping on %s: exit code %d", config.task,
               signal.Signals(stop.signum).name, code)
  return code


def port_in_use(port: int) -> bool:
  """True if another process listens on `port` (TF servers listen on every interface)."""
  with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "in use".
    try:
      probe.bind(("", port))
    except OSError as e:
      return e.errno == errno.EADDRINUSE
  return False


def _warn_chief(task: spec_lib.TaskId, options: ServerOptions) -> None:
  """Tells the chief we are going and waits (bounded) until it has saved."""
  notice = notices.Notice(task=str(task), deadline_seconds=options.notice_deadline)
  start = time.monotonic()
  try:
    _, reply = notices.send_to_chiefs(options.control_addresses, notice)
  except grpc.RpcError as e:  # No chief, or it did not answer in time: go anyway.
    logging.warning("%s: preemption notice to the chief at %s not answered (%s) after %.1fs",
                    task, " or ".join(options.control_addresses), e.code().name,
                    time.monotonic() - start)
    return
  logging.info("%s: chief %s after %.1fs (%s)", task,
               "saved a checkpoint" if reply.saved else "did not save",
               time.monotonic() - start, reply.detail)
