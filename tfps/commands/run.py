"""`tfps run`: resolve this task's role, then serve (ps/worker) or coordinate (chief).

The same command on every task. A ps or worker serves until told to stop
(`ps_worker.server`); the chief supervises its coordinator (`commands.chief`),
or, with `--nosupervise` (how the supervisor starts each coordinator), is
the coordinator itself (`commands.coordinate`).
"""

import os

from tfps.base import errors
from tfps.base import log_summary
from tfps.base import signals
from tfps.cluster import spec as spec_lib
from tfps.cluster.k8s import jobset_env
from tfps.commands import chief
from tfps.commands import coordinate
from tfps.commands import run_spec
from tfps.ps_worker import graph_cache
from tfps.recovery import notices


def task_config_from_flags(flags) -> spec_lib.TaskConfig:
  """The cluster and role: a JobSet pod's env, --cluster_spec, host flags, or TF_CONFIG."""
  if flags.cluster_from == "jobset":
    if flags.cluster_spec or flags.ps_hosts or flags.worker_hosts or flags.chief_host:
      raise spec_lib.ClusterSpecError(
          "--cluster_from=jobset: derives the cluster itself; drop --cluster_spec and host flags")
    layout = jobset_env.JobSetLayout(num_ps=flags.num_ps, num_workers=flags.num_workers,
                                     port=flags.task_port, chief_standby=flags.chief_standby,
                                     max_workers=flags.max_workers)
    return jobset_env.task_config(os.environ, layout)
  if flags.cluster_spec:
    return spec_lib.from_json_file(
        flags.cluster_spec, job_name=flags.job_name,
        task_index=flags.task_index if flags.job_name else None)
  if flags.ps_hosts or flags.worker_hosts or flags.chief_host:
    return spec_lib.from_host_flags(
        ps_hosts=flags.ps_hosts, worker_hosts=flags.worker_hosts,
        chief_host=flags.chief_host, job_name=flags.job_name, task_index=flags.task_index)
  return spec_lib.from_tf_config(os.environ.get("TF_CONFIG", ""))


def graph_cache_root(flag: str | None) -> str | None:
  """Where a worker keeps optimized graphs, from `--graph_cache_dir`; None: nowhere."""
  return graph_cache.default_root() if flag is None else flag or None


def run(flags) -> errors.ExitCode:
  from tfps.ps_worker import server  # Installs nothing on import; cheap.

  stop = signals.StopSignals.install()
  config = task_config_from_flags(flags)  # Bad spec: UsageError, before TF loads.
  stderr_filter = log_summary.install_stderr_filter()
  try:
    if config.task.job in (spec_lib.JobType.PS, spec_lib.JobType.WORKER):
      code = server.serve(config, stop, server.ServerOptions(
          inter_op_threads=flags.inter_op_threads, intra_op_threads=flags.intra_op_threads,
          thread_spinning=flags.thread_spinning, grace_seconds=flags.grace_seconds,
          control_addresses=_control_addresses(config) if flags.preemption_notice else (),
          graph_cache_root=graph_cache_root(flags.graph_cache_dir),
          tf_runtime_only=flags.tf_runtime_only))
      stderr_filter.close()
      # A running TF server cannot be destroyed cleanly; leave without
      # running its destructors.
      os._exit(int(code))
    if config.task.job == spec_lib.JobType.EVALUATOR:
      raise errors.UsageError(
          "task.type: 'evaluator' side-car evaluation is not supported; "
          "run the chief with --mode=train_and_eval instead")
    spec = run_spec.from_flags(flags)  # Bad settings: one line, before TF loads.
    if flags.supervise:
      return chief.supervise(config, spec, stop, result_file=flags.result_file)
    coordinate.run_process(config, spec, stop, stderr_filter, result_file=flags.result_file)
  finally:
    stderr_filter.close()


def _control_addresses(config: spec_lib.TaskConfig) -> tuple[str, ...]:
  """Every chief replica's (none listed: nobody to warn)."""
  return notices.control_addresses(config.cluster)
