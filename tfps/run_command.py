"""`tfps run`: resolve this task's role, then serve (ps/worker) or coordinate (chief)."""

import json
import os
import sys

from absl import logging

from cluster import spec as spec_lib
from recovery import control
from recovery import errors
from recovery import log_summary
from recovery import signals


def task_config_from_flags(flags) -> spec_lib.TaskConfig:
  """The cluster and role: --cluster_spec, else host flags, else TF_CONFIG."""
  if flags.cluster_spec:
    return spec_lib.from_json_file(
        flags.cluster_spec, job_name=flags.job_name,
        task_index=flags.task_index if flags.job_name else None)
  if flags.ps_hosts or flags.worker_hosts or flags.chief_host:
    return spec_lib.from_host_flags(
        ps_hosts=flags.ps_hosts, worker_hosts=flags.worker_hosts,
        chief_host=flags.chief_host, job_name=flags.job_name, task_index=flags.task_index)
  return spec_lib.from_tf_config(os.environ.get("TF_CONFIG", ""))


def run(flags) -> errors.ExitCode:
  from ps_worker import server  # Installs nothing on import; cheap.

  stop = signals.StopSignals.install()
  config = task_config_from_flags(flags)  # Bad spec: UsageError, before TF loads.
  stderr_filter = log_summary.install_stderr_filter()
  try:
    if config.task.job in (spec_lib.JobType.PS, spec_lib.JobType.WORKER):
      code = server.serve(config, stop, server.ServerOptions(
          inter_op_threads=flags.inter_op_threads, grace_seconds=flags.grace_seconds,
          control_address=_control_address(config) if flags.preemption_notice else None))
      stderr_filter.close()
      # A running TF server cannot be destroyed cleanly; leave without
      # running its destructors.
      os._exit(int(code))
    if config.task.job == spec_lib.JobType.EVALUATOR:
      raise errors.UsageError(
          "task.type: 'evaluator' side-car evaluation is not supported; "
          "run the chief with --mode=train_and_eval instead")
    return _run_chief(config, flags, stop)
  finally:
    stderr_filter.close()


def _control_address(config: spec_lib.TaskConfig) -> str | None:
  if not config.cluster.addresses(spec_lib.JobType.CHIEF):
    return None  # No chief listed: nobody to warn.
  return control.control_address(config.cluster)


def _run_chief(config: spec_lib.TaskConfig, flags, stop) -> errors.ExitCode:
  from coordinator import chief

  chief_config = chief.ChiefConfig(
      cluster=config.cluster.for_coordinator(),
      experiment=flags.experiment,
      model_dir=flags.model_dir,
      train_steps=flags.train_steps,
      steps_per_loop=flags.steps_per_loop,
      steps_per_closure=flags.steps_per_closure,
      checkpoint_interval=flags.checkpoint_interval,
      max_to_keep=flags.max_to_keep,
      mode=flags.mode,
      eval_steps=flags.eval_steps,
      global_batch_size=flags.global_batch_size,
      seed=flags.seed,
      ready_timeout=flags.ready_timeout)
  result = chief.run_chief(chief_config)
  sys.stdout.write(json.dumps(result.as_dict()) + "\n")
  sys.stdout.flush()
  logging.info("chief finished: %s at step %d", result.status, result.global_step)
  return errors.ExitCode.OK
