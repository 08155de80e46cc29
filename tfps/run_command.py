"""`tfps run`: resolve this task's role, then serve (ps/worker) or coordinate (chief)."""

import faulthandler
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback

from absl import logging

from tfps.cluster import readiness
from tfps.cluster import scratch as scratch_lib
from tfps.cluster import spec as spec_lib
from tfps.coordinator import api
from tfps.recovery import notices
from tfps.base import errors
from tfps.recovery import coverage
from tfps.recovery import events
from tfps.recovery import exit_report
from tfps.recovery import interrupts
from tfps.recovery import policy
from tfps.recovery import progress_log
from tfps.recovery import standby
from tfps.recovery import supervisor
from tfps.recovery import worker_watch

from tfps.base import log_summary
from tfps.base import signals

# One round of probing the ps and workers (worker watch, ps deadline).
_PROBE_SECONDS = 1.0
# The supervisor's ps deadline is the coordinator's (--ps_timeout) plus this:
# the coordinator, which notices within --ps_timeout plus one of its probe
# rounds (~3 s), always gets the first word; the supervisor (probing every
# 2 s) acts only when it has not exited by then (see recovery.supervisor).
_SUPERVISOR_PS_MARGIN_SECONDS = 8.0


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
  from tfps.ps_worker import server  # Installs nothing on import; cheap.

  stop = signals.StopSignals.install()
  config = task_config_from_flags(flags)  # Bad spec: UsageError, before TF loads.
  stderr_filter = log_summary.install_stderr_filter()
  try:
    if config.task.job in (spec_lib.JobType.PS, spec_lib.JobType.WORKER):
      code = server.serve(config, stop, server.ServerOptions(
          inter_op_threads=flags.inter_op_threads, intra_op_threads=flags.intra_op_threads,
          thread_spinning=flags.thread_spinning, grace_seconds=flags.grace_seconds,
          control_address=_control_address(config) if flags.preemption_notice else None))
      stderr_filter.close()
      # A running TF server cannot be destroyed cleanly; leave without
      # running its destructors.
      os._exit(int(code))
    if config.task.job == spec_lib.JobType.EVALUATOR:
      raise errors.UsageError(
          "task.type: 'evaluator' side-car evaluation is not supported; "
          "run the chief with --mode=train_and_eval instead")
    if flags.supervise:
      return _supervise_chief(config, flags, stop)
    # A coordinator the supervisor finds stuck is asked for its stacks first.
    # Written by the signal handler in C, straight to the log: it works even
    # while another thread holds the interpreter lock.
    faulthandler.register(signal.SIGUSR1, file=stderr_filter.real_stderr, all_threads=True)
    temp = scratch_lib.use_for_temporary_files("tfps-coordinator-")
    if os.environ.get(standby.ENV_VAR):
      go = _stand_by(stop)
      if go is None:  # Not needed after all: leave as quietly as we came.
        stderr_filter.close()
        temp.cleanup()
        os._exit(0)
      flags.exclude_workers = list(go.exclude_workers)
    code = _coordinate(config, flags, stop)
    sys.stdout.flush()
    stderr_filter.close()
    temp.cleanup()
    # TF's ClusterCoordinator destructor can wait forever at interpreter
    # shutdown (on a lock of a worker-recovery thread that shutdown froze);
    # everything is saved and flushed, so leave without destructors.
    os._exit(int(code))
  finally:
    stderr_filter.close()


def _stand_by(stop) -> standby.Go | None:
  """A warm standby: imports what a coordinator needs, then waits for its turn."""
  importlib.import_module("tfps.coordinator.chief")  # TensorFlow, tf_keras, Orbit: seconds.
  logging.info("warm standby coordinator ready (pid %d)", os.getpid())
  return standby.wait_for_go(stop, sys.stdin)


def _coordinate(config: spec_lib.TaskConfig, flags, stop) -> errors.ExitCode:
  """Runs the coordinator; any failure becomes one line and an exit code."""
  try:
    return _run_chief(config, flags, stop)
  except errors.TfpsError as e:
    error, code, message = e, e.exit_code, str(e)
  except Exception as e:  # A bug of ours: still one line, the rest in a file.
    error, code = e, errors.ExitCode.PERMANENT
    message = f"internal error: {type(e).__name__}: {e}"
  details = _write_details(flags.model_dir, error)
  suffix = f" (details: {details})" if details else ""
  sys.stderr.write(f"tfps: error: {message}{suffix}\n")
  if isinstance(error, errors.PermanentError):
    exit_report.write(error.failure, message + suffix)
  elif code == errors.ExitCode.PERMANENT:
    exit_report.write("user_error", message + suffix)
  return code


def _write_details(model_dir: str | None, error: BaseException) -> str | None:
  """Appends the full error chain to model_dir/errors.log; returns its path."""
  if error.__cause__ is None and isinstance(error, errors.UsageError):
    return None  # Bad input: the one line says everything.
  if not model_dir or not os.path.isdir(model_dir):
    return None
  path = os.path.join(model_dir, "errors.log")
  try:
    with open(path, "a", encoding="utf-8") as f:
      f.write("".join(traceback.format_exception(error)) + "\n")
  except OSError:
    return None
  return path


def _control_address(config: spec_lib.TaskConfig) -> str | None:
  if not config.cluster.addresses(spec_lib.JobType.CHIEF):
    return None  # No chief listed: nobody to warn.
  return notices.control_address(config.cluster)


def supervision(flags) -> tuple[supervisor.SupervisorConfig, worker_watch.WorkerWatchConfig]:
  """The supervisor's settings from its flags, validated before anything starts.

  The flags whose config fields have other names are checked here, so that
  the one-line error names the flag; `SupervisorConfig` checks the rest.
  """
  if flags.max_restarts < 0:
    raise errors.UsageError(f"max_restarts ({flags.max_restarts}) must be >= 0")
  for name in ("restart_window", "worker_timeout", "grace_seconds"):
    if not getattr(flags, name) > 0:
      raise errors.UsageError(f"{name} ({getattr(flags, name)}) must be positive")
  return (supervisor.SupervisorConfig(
              policy=policy.RestartPolicy(max_restarts=flags.max_restarts,
                                          window_seconds=flags.restart_window),
              cluster_wait_seconds=flags.cluster_wait_seconds,
              stop_grace_seconds=flags.grace_seconds,
              ps_deadline_seconds=(flags.ps_timeout + _SUPERVISOR_PS_MARGIN_SECONDS
                                   if flags.ps_timeout > 0 else None)),
          worker_watch.WorkerWatchConfig(timeout=flags.worker_timeout))


class _CoordinatorProgress:
  """Whether the running coordinator has ended a train loop (from the progress log)."""

  def __init__(self, model_dir: str):
    self._log = progress_log.ProgressLog(model_dir)
    self._trained = False

  def restart(self) -> None:
    """A new coordinator starts: only what it does from here on counts."""
    self._log.read_new()
    self._trained = False

  def trained(self) -> bool:
    if not self._trained:
      self._trained = any(not record.restored for record in self._log.read_new())
    return self._trained


def _supervise_chief(config: spec_lib.TaskConfig, flags, stop) -> errors.ExitCode:
  """The chief as a supervisor of coordinator processes (recovery.supervisor)."""
  supervisor_config, watch_config = supervision(flags)  # Bad flags: before anything is made.
  model_dir = ensure_model_dir(flags.model_dir)
  servers = [t for t in config.cluster.for_coordinator().tasks()
             if t.job != spec_lib.JobType.CHIEF]
  event_log = events.EventLog(model_dir)
  # Removed when the chief ends, or by the next chief's sweep if it is killed.
  with scratch_lib.ScratchDir("tfps-chief-") as scratch:
    report_path = os.path.join(scratch, "coordinator.exit.json")
    coordinators = standby.WarmCoordinators(
        [sys.executable, "-m", "tfps", *sys.argv[1:], "--nosupervise"],
        env={**os.environ, exit_report.ENV_VAR: report_path}, stdout_dir=scratch,
        warm=flags.warm_standby)

    current = _CoordinatorProgress(model_dir)

    def start_coordinator(attempt: int, excluded: frozenset) -> subprocess.Popen:
      current.restart()
      process, warm = coordinators.start([str(t) for t in excluded])
      logging.info("starting coordinator (attempt %d%s)%s", attempt + 1,
                   ", warm standby" if warm else "",
                   f" without {', '.join(sorted(map(str, excluded)))}" if excluded else "")
      return process

    def prepare_next() -> None:
      if current.trained():  # Only once this one trains: never slow down a start.
        coordinators.prepare()

    def wait_for_cluster(seconds: float) -> None:
      # Left-out workers are not waited for: the watch takes them back.
      readiness.wait_until_reachable(config.cluster, seconds, tasks=[
          t for t in servers if t not in sup.excluded])

    workers = [t for t in servers if t.job == spec_lib.JobType.WORKER]
    ps = [t for t in servers if t.job == spec_lib.JobType.PS]

    sup = supervisor.Supervisor(
        supervisor_config,
        start_coordinator=start_coordinator, wait_for_cluster=wait_for_cluster,
        event_log=event_log, stop=stop,
        # The ps are probed too: a chief that sees no ps is itself cut off,
        # and then no worker is to blame (see worker_watch).
        watch=worker_watch.WorkerWatch(workers, watch_config, anchors=ps),
        probe_servers=lambda: readiness.reachable(config.cluster, servers, _PROBE_SECONDS),
        ps_addresses={t: config.cluster.address(t) for t in ps},
        exit_report=lambda: exit_report.take(report_path), trained=current.trained,
        on_poll=prepare_next)
    try:
      result = sup.run()
    finally:
      coordinators.close()
    if result.exit_code != errors.ExitCode.OK:
      return result.exit_code
    with open(coordinators.stdout_path, encoding="utf-8") as f:
      lines = [line for line in f if line.startswith("{")]
  if not lines:
    raise errors.PermanentError("the coordinator exited 0 without its JSON result line")
  summary = json.loads(lines[-1])
  summary.update(events.summarize(event_log.read()))
  # The input over the whole run (every coordinator), replayed from the
  # progress log: what the last coordinator knows plus the accounting.
  summary["input"] = {**summary.get("input", {}), **coverage.account(
      progress_log.ProgressLog(model_dir).read_new()).as_dict(flags.global_batch_size)}
  sys.stdout.write(json.dumps(summary) + "\n")
  sys.stdout.flush()
  return errors.ExitCode.OK


def parse_params(items: list[str]) -> dict[str, str]:
  """`--experiment_params` items `key=value` as a dict."""
  params = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
      raise errors.UsageError(f"--experiment_params: {item!r} must look like key=value")
    params[key.strip()] = value.strip()
  return params


def ensure_model_dir(model_dir: str | None) -> str:
  """Creates `model_dir`; a missing or unwritable one is a usage error."""
  if not model_dir:
    raise errors.UsageError("--model_dir: required for the chief (checkpoints and events go there)")
  try:
    os.makedirs(model_dir, exist_ok=True)
    with tempfile.TemporaryFile(dir=model_dir):
      pass
  except OSError as e:
    raise errors.UsageError(f"--model_dir: {model_dir!r} is not writable ({e.strerror})") from None
  return model_dir


def chief_config(flags, cluster: spec_lib.ClusterSpec, model_dir: str) -> api.ChiefConfig:
  """The chief's flags as a validated ChiefConfig (UsageError naming field and value).

  TensorFlow-free, so `tfps local` checks the flags it forwards to its chief
  before it starts any process.
  """
  api.check_experiment_findable(flags.experiment, parse_params(flags.experiment_params))
  if flags.train_epochs is not None and flags["train_steps"].present:
    raise errors.UsageError(
        f"train_epochs ({flags.train_epochs}) and train_steps ({flags.train_steps}): "
        "give one of the two")
  return api.ChiefConfig(
      cluster=cluster,
      experiment=flags.experiment,
      model_dir=model_dir,
      train_steps=flags.train_steps,
      train_epochs=flags.train_epochs,
      input_shards=flags.input_shards,
      steps_per_loop=flags.steps_per_loop,
      steps_per_closure=flags.steps_per_closure,
      checkpoint_interval=flags.checkpoint_interval,
      max_to_keep=flags.max_to_keep,
      mode=flags.mode,
      eval_steps=flags.eval_steps,
      global_batch_size=flags.global_batch_size,
      seed=flags.seed,
      ready_timeout=flags.ready_timeout,
      experiment_params=parse_params(flags.experiment_params),
      eval_interval=flags.eval_interval,
      eval_shards=flags.eval_shards,
      min_shard_bytes=flags.min_shard_bytes or None,
      ps_timeout=flags.ps_timeout or None)


def _run_chief(config: spec_lib.TaskConfig, flags, stop) -> errors.ExitCode:
  cluster = config.cluster.for_coordinator().without_workers(
      spec_lib.TaskId.parse(name) for name in flags.exclude_workers)
  settings = chief_config(flags, cluster, flags.model_dir)  # Bad flags: before TF loads.
  from tfps.coordinator import chief  # Imports TensorFlow (seconds).

  result = chief.run_chief(settings, interrupts=interrupts.Interrupts(stop))
  sys.stdout.write(json.dumps(result.as_dict()) + "\n")
  sys.stdout.flush()
  logging.info("chief finished: %s at step %d", result.status, result.global_step)
  return errors.ExitCode.OK
