"""`tfps run`: resolve this task's role, then serve (ps/worker) or coordinate (chief)."""

import dataclasses
import faulthandler
import importlib
import itertools
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
from tfps.ps_worker import graph_cache
from tfps.recovery import notices
from tfps.base import errors
from tfps.recovery import coverage
from tfps.recovery import events
from tfps.recovery import exit_report
from tfps.recovery import interrupts
from tfps.recovery import policy
from tfps.recovery import progress_log
from tfps.recovery import readmission
from tfps.recovery import standby
from tfps.recovery import supervisor
from tfps.recovery import task_watch

from tfps.base import log_summary
from tfps.base import signals
from tfps import run_result
from tfps import run_spec

# One round of probing the ps and workers (task watch, ps deadline).
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
          control_address=_control_address(config) if flags.preemption_notice else None,
          graph_cache_root=graph_cache_root(flags.graph_cache_dir)))
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
      return _supervise_chief(config, spec, stop, result_file=flags.result_file)
    # A coordinator the supervisor finds stuck is asked for its stacks first.
    # Written by the signal handler in C, straight to the log: it works even
    # while another thread holds the interpreter lock.
    faulthandler.register(signal.SIGUSR1, file=stderr_filter.real_stderr, all_threads=True)
    temp = scratch_lib.use_for_temporary_files("tfps-coordinator-")
    if os.environ.get(standby.ENV_VAR):
      go = _stand_by(stop)
      if go is None:  # Not needed after all: leave as quietly as we came.
        _leave_coordinator(stderr_filter, temp, errors.ExitCode.OK)
      spec = dataclasses.replace(spec, exclude_tasks=go.exclude_tasks)
    _leave_coordinator(stderr_filter, temp,
                       _coordinate(config, spec, stop, result_file=flags.result_file))
  finally:
    stderr_filter.close()


def _stand_by(stop) -> standby.Go | None:
  """A warm standby: imports what a coordinator needs, then waits for its turn."""
  importlib.import_module("tfps.coordinator.run")  # TensorFlow, tf_keras, Orbit: seconds.
  logging.info("warm standby coordinator ready (pid %d)", os.getpid())
  standby.mark_ready(os.environ[standby.ENV_VAR])
  return standby.wait_for_go(stop, sys.stdin)


def _coordinate(config: spec_lib.TaskConfig, spec: run_spec.RunSpec, stop, *,
                result_file: str | None) -> errors.ExitCode:
  """Runs the coordinator; any failure becomes one line and an exit code."""
  try:
    return _run_chief(config, spec, stop, result_file=result_file)
  except errors.TfpsError as e:
    error, code, message = e, e.exit_code, str(e)
  except Exception as e:  # A bug of ours: still one line, the rest in a file.
    error, code = e, errors.ExitCode.PERMANENT
    message = f"internal error: {type(e).__name__}: {e}"
  details = _write_details(spec.model_dir, error)
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


def _leave_coordinator(stderr_filter, temp, code: int) -> None:
  """Ends a coordinator process: output flushed, scratch removed, no destructors.

  TF's ClusterCoordinator destructor can wait forever at interpreter
  shutdown (on a lock of a worker-recovery thread that shutdown froze), and
  a background trace (`trainer.PSTrainer`'s fast start) may still run;
  everything is saved and flushed, so leave without destructors.
  """
  if code != errors.ExitCode.OK:  # When it left, for whoever times a restart from the log.
    logging.info("coordinator exiting with code %d", int(code))
  sys.stdout.flush()
  stderr_filter.close()
  temp.cleanup()
  os._exit(int(code))


def _control_address(config: spec_lib.TaskConfig) -> str | None:
  if not config.cluster.addresses(spec_lib.JobType.CHIEF):
    return None  # No chief listed: nobody to warn.
  return notices.control_address(config.cluster)


def supervision(spec: run_spec.RunSpec
                ) -> tuple[supervisor.SupervisorConfig, task_watch.TaskWatchConfig]:
  """The supervisor's settings from the run spec (which named any bad value's flag)."""
  return (supervisor.SupervisorConfig(
              policy=policy.RestartPolicy(max_restarts=spec.max_restarts,
                                          window_seconds=spec.restart_window,
                                          ps_failover=spec.ps_failover),
              cluster_wait_seconds=spec.cluster_wait_seconds,
              stop_grace_seconds=spec.grace_seconds,
              ps_deadline_seconds=(spec.ps_timeout + _SUPERVISOR_PS_MARGIN_SECONDS
                                   if spec.ps_timeout > 0 else None)),
          task_watch.TaskWatchConfig(timeout=spec.worker_timeout,
                                     ps_readmit_after=spec.ps_readmit_after))


class _CoordinatorLauncher:
  """The chief's coordinators (`supervisor.CoordinatorLauncher`).

  Each coordinator is `tfps run --nosupervise` with the run spec in a file
  (its left-out tasks written in), the cluster in TF_CONFIG, an exit
  report and a result file in the chief's scratch directory. Whether it
  trained is read from the progress log; once it has, the next coordinator
  is started and imported ahead of need (`standby.WarmCoordinators`).
  """

  def __init__(self, config: spec_lib.TaskConfig, spec: run_spec.RunSpec, scratch: str,
               event_log: events.EventLog):
    self.report_path = os.path.join(scratch, "coordinator.exit.json")
    self.result_path = os.path.join(scratch, "coordinator.result.json")
    self._spec, self._scratch = spec, scratch
    self._spec_files = itertools.count(1)
    self._progress = progress_log.ProgressLog(spec.model_dir)
    self._loops = progress_log.CoordinatorLoops()  # The run's, read so far.
    self._trained = False  # Whether the current coordinator has ended a loop.
    self._coordinators = standby.WarmCoordinators(
        self._command,
        env={**os.environ, exit_report.ENV_VAR: self.report_path,
             "TF_CONFIG": config.to_tf_config()},
        stdout_dir=scratch, warm=spec.warm_standby, event_log=event_log)

  def _command(self, excluded: tuple[str, ...]) -> list[str]:
    path = os.path.join(self._scratch, f"run_spec-{next(self._spec_files)}.json")
    run_spec.write(dataclasses.replace(self._spec, exclude_tasks=excluded), path)
    return [sys.executable, "-m", "tfps", "run", "--nosupervise", f"--run_spec={path}",
            f"--result_file={self.result_path}"]

  def start(self, attempt: int, excluded: frozenset) -> subprocess.Popen:
    self._read()
    self._trained = False  # Only what the new coordinator does counts.
    process, warm = self._coordinators.start([str(t) for t in excluded])
    logging.info("starting coordinator (attempt %d%s)%s", attempt + 1,
                 ", warm standby" if warm else "",
                 f" without {', '.join(sorted(map(str, excluded)))}" if excluded else "")
    return process

  def _read(self) -> None:
    records = self._progress.read_new()
    self._loops.extend(records)
    self._trained = self._trained or any(not record.restored for record in records)

  def trained(self) -> bool:
    self._read()
    return self._trained

  def ps_back_due(self) -> bool:
    if self._spec.ps_readmit == readmission.Readmit.TIMED:
      return True
    self._read()
    return readmission.judge(self._loops.coordinators)

  def idle(self) -> None:
    if self.trained():  # Only once this one trains: never slow down a start.
      self._coordinators.prepare()

  def exit_report(self) -> exit_report.ExitReport | None:
    return exit_report.take(self.report_path)

  def last_lines(self) -> tuple[str, ...]:
    return self._coordinators.last_lines()

  def close(self) -> None:
    self._coordinators.close()


@dataclasses.dataclass(frozen=True)
class _ClusterProbes:
  """The chief's view of its ps and workers (`supervisor.ClusterProbes`)."""

  cluster: spec_lib.ClusterSpec
  servers: tuple[spec_lib.TaskId, ...]

  @property
  def ps_addresses(self) -> dict:
    return {t: self.cluster.address(t) for t in self.servers if t.job == spec_lib.JobType.PS}

  def reachable(self) -> set:
    return readiness.reachable(self.cluster, self.servers, _PROBE_SECONDS)

  def wait_until_reachable(self, seconds: float, excluded: frozenset) -> None:
    readiness.wait_until_reachable(self.cluster, seconds,
                                   tasks=[t for t in self.servers if t not in excluded])


def _supervise_chief(config: spec_lib.TaskConfig, spec: run_spec.RunSpec, stop, *,
                     result_file: str | None) -> errors.ExitCode:
  """The chief as a supervisor of coordinator processes (recovery.supervisor)."""
  supervisor_config, watch_config = supervision(spec)
  spec = dataclasses.replace(spec, model_dir=ensure_model_dir(spec.model_dir))
  api.check_experiment_findable(spec.experiment, spec.experiment_params)
  probes = _ClusterProbes(config.cluster, tuple(
      t for t in config.cluster.for_coordinator().tasks() if t.job != spec_lib.JobType.CHIEF))
  workers = [t for t in probes.servers if t.job == spec_lib.JobType.WORKER]
  event_log = events.EventLog(spec.model_dir)
  # Removed when the chief ends, or by the next chief's sweep if it is killed.
  with scratch_lib.ScratchDir("tfps-chief-") as scratch:
    launcher = _CoordinatorLauncher(config, spec, scratch, event_log)
    result = supervisor.Supervisor(
        supervisor_config, launcher=launcher, cluster=probes, event_log=event_log, stop=stop,
        # The ps are probed too: a chief that sees no ps is itself cut off,
        # and then no worker is to blame; and a ps left out is taken back (task_watch).
        watch=task_watch.TaskWatch(workers, watch_config, ps=list(probes.ps_addresses)),
    ).run()
    if result.exit_code != errors.ExitCode.OK:
      return result.exit_code
    finished = run_result.read_coordinator(launcher.result_path)
  counts = events.summarize(event_log.read())
  record = run_result.RunResult(
      coordinator=finished, faults=counts["faults"], restarts=counts["restarts"],
      steps_lost=counts["steps_lost"], steps_reexecuted=counts["steps_reexecuted"],
      deaths=counts["deaths"],
      # The input over the whole run (every coordinator), replayed from the
      # progress log: what the last coordinator knows plus the accounting.
      input={**finished.input, **coverage.account(
          progress_log.ProgressLog(spec.model_dir).read_new()).as_dict(spec.global_batch_size)})
  if result_file:
    run_result.write(record, result_file)
  sys.stdout.write(json.dumps(record.as_dict()) + "\n")
  sys.stdout.flush()
  return errors.ExitCode.OK


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


def _run_chief(config: spec_lib.TaskConfig, spec: run_spec.RunSpec, stop, *,
               result_file: str | None) -> errors.ExitCode:
  settings = spec.coordinator_config(config.cluster.for_coordinator())  # Before TF loads.
  api.check_experiment_findable(spec.experiment, spec.experiment_params)
  from tfps.coordinator import run as coordinator_run  # Imports TensorFlow (seconds).

  result = coordinator_run.run_coordinator(settings, interrupts=interrupts.Interrupts(stop))
  if result_file:  # The supervisor's (run_result); else a person's.
    run_result.write_coordinator(result, result_file)
  else:
    sys.stdout.write(json.dumps(result.as_dict()) + "\n")
    sys.stdout.flush()
  logging.info("chief finished: %s at step %d", result.status, result.global_step)
  return errors.ExitCode.OK
