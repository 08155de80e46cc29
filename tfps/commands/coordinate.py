"""The coordinator's process: `tfps run --nosupervise` (what the supervisor starts).

Runs `coordinator.run` once, turns any failure into one line, an exit code and
an exit report for the supervisor, and leaves without destructors. A warm
standby (`recovery.standby`) imports what it needs first and waits for its go.
"""

import dataclasses
import faulthandler
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Callable

from absl import logging

from tfps.base import errors
from tfps.base import log_summary
from tfps.base import messages
from tfps.cluster import readiness
from tfps.cluster import scratch as scratch_lib
from tfps.cluster import spec as spec_lib
from tfps.commands import run_result
from tfps.commands import run_spec
from tfps.coordinator import api
from tfps.recovery import events
from tfps.recovery import exit_report
from tfps.recovery import interrupts
from tfps.recovery import policy
from tfps.recovery import progress_log
from tfps.recovery import standby

# A hot standby (`_Ahead`): how long its preparation may take, how long it waits
# for the workers to instantiate its closures within that, how often it tries
# while some task does not answer, and how long each task's probe waits.
_PREPARE_SECONDS = 180.0
_WARM_SECONDS = 60.0
_RETRY_SECONDS = 5.0
_PROBE_SECONDS = 1.0


def run_process(config: spec_lib.TaskConfig, spec: run_spec.RunSpec, stop,
                stderr_filter: log_summary.StderrFilter, *, result_file: str | None) -> None:
  """This process is a coordinator (a warm standby first, if asked): runs it and exits."""
  # A coordinator the supervisor finds stuck is asked for its stacks first.
  # Written by the signal handler in C, straight to the log: it works even
  # while another thread holds the interpreter lock.
  faulthandler.register(signal.SIGUSR1, file=stderr_filter.real_stderr, all_threads=True)
  temp = scratch_lib.use_for_temporary_files("tfps-coordinator-")
  leave = lambda code: _leave_coordinator(stderr_filter, temp, code)
  signalled = interrupts.Interrupts(stop)
  prepared = None
  if os.environ.get(standby.ENV_VAR):
    go, prepared = _stand_by(config, spec, stop, signalled, leave)
    if go is None:  # Not needed after all: leave as quietly as we came.
      leave(errors.ExitCode.OK)
    if prepared is not None and go.exclude_tasks:  # The supervisor's check raced ours.
      _cluster_changed(f"this standby coordinator connected to the whole cluster; a new one "
                       f"must leave {', '.join(go.exclude_tasks)} out", leave)
    spec = dataclasses.replace(spec, exclude_tasks=go.exclude_tasks,
                               lease_generation=go.lease_generation)
  leave(_coordinate(config, spec, signalled, result_file=result_file, prepared=prepared))


def _stand_by(config: spec_lib.TaskConfig, spec: run_spec.RunSpec, stop, signalled,
              leave: Callable[[int], None]):
  """A warm standby: imports what a coordinator needs, then waits for its turn.

  Returns (its go, None if it is to leave; what it prepared ahead, if hot)."""
  importlib.import_module("tfps.coordinator.run")  # TensorFlow, tf_keras, Orbit: seconds.
  logging.info("warm standby coordinator ready (pid %d)", os.getpid())
  ready_path = os.environ[standby.ENV_VAR]
  standby.mark_ready(ready_path)
  if not os.environ.get(standby.HOT_ENV_VAR):
    return standby.wait_for_go(stop, sys.stdin), None
  ahead = _Ahead(config, spec, signalled, ready_path, leave)
  return standby.wait_for_go(stop, sys.stdin, idle=ahead.idle), ahead.prepared


class _Ahead:
  """A hot standby's preparation (`coordinator.run.prepare_ahead`), done between looks
  for its go: once the holder's coordinator has trained since this process started
  (one that replaces a retired standby starts while the cluster recovers, and
  must not take CPU or the workers from the coordinator that is restarting)
  and every ps and worker answers, then checked on every look.

  A preparation that fails, takes longer than `_PREPARE_SECONDS`, or whose ps
  was lost since (`Prepared.stale`) retires the process (exit 0, quietly): TensorFlow
  connects a process to one cluster once, so its supervisor starts another.
  """

  def __init__(self, config: spec_lib.TaskConfig, spec: run_spec.RunSpec, signalled,
               ready_path: str, leave: Callable[[int], None]):
    self._settings = spec.coordinator_config(config.cluster.for_coordinator(config.task.index))
    self._spec, self._task = spec, str(config.task)
    self._signalled, self._ready_path, self._leave = signalled, ready_path, leave
    self._next_try = 0.0
    self._waiting_said = False
    self.prepared = None
    self._progress = progress_log.ProgressLog(spec.model_dir)
    self._progress.read_new()  # What was trained before this process started.
    self._trained = False  # Whether the holder's coordinator has trained since.

  def idle(self) -> None:
    if self.prepared is not None:
      why = self.prepared.stale()
      if why is not None:
        self._retire(f"its cluster changed: {why}")
      return
    self._trained = self._trained or any(not r.restored for r in self._progress.read_new())
    if not self._trained or time.monotonic() < self._next_try:
      return
    self._next_try = time.monotonic() + _RETRY_SECONDS
    cluster = self._settings.cluster
    tasks = [t for t in cluster.tasks() if t.job != spec_lib.JobType.CHIEF]
    silent = sorted(set(tasks) - readiness.reachable(cluster, tasks, _PROBE_SECONDS), key=str)
    if silent:
      if not self._waiting_said:
        logging.info("standby coordinator: prepared ahead once every task answers (%s does "
                     "not)", silent[0])
        self._waiting_said = True
      return
    standby.mark_connected(self._ready_path)
    if standby.go_pending(sys.stdin):
      return  # Taking over already: the go says whom to leave out.
    from tfps.coordinator import run as coordinator_run  # Imported already.
    began = time.monotonic()
    watchdog = threading.Timer(_PREPARE_SECONDS, lambda: self._retire(
        f"preparing took over {_PREPARE_SECONDS:.0f}s"))
    watchdog.daemon = True
    watchdog.start()
    try:
      self.prepared = coordinator_run.prepare_ahead(self._settings, self._signalled,
                                                    warm_timeout=_WARM_SECONDS)
    except Exception as e:  # pylint: disable=broad-except  (any failure: a new standby)
      self._retire(f"preparing failed: {type(e).__name__}: {messages.one_line(str(e))}")
    finally:
      watchdog.cancel()
    detail = (f"standby coordinator prepared ahead in {time.monotonic() - began:.1f}s: "
              f"connected, experiment built, train closures instantiated on "
              f"{self.prepared.workers_warm} of {self.prepared.runtime.num_workers} workers")
    logging.info("%s", detail)
    _record(self._spec.model_dir, self._task, policy.Action.STANDBY_PREPARED, detail)

  def _retire(self, why: str) -> None:
    """Ends this process: quietly (exit 0), or, if its go has come meanwhile, as a
    coordinator whose cluster changed (exit 170: its supervisor starts a cold one)."""
    detail = f"standby coordinator retired ({why}); its supervisor starts another"
    logging.info("%s", detail)
    _record(self._spec.model_dir, self._task, policy.Action.STANDBY_RETIRED, detail)
    if standby.go_pending(sys.stdin):
      _cluster_changed(f"the standby coordinator told to go could not: {why}", self._leave)
    self._leave(errors.ExitCode.OK)


def _cluster_changed(message: str, leave: Callable[[int], None]) -> None:
  """Ends a coordinator that cannot run on the cluster it prepared for (exit 170)."""
  exit_report.write(policy.FailureKind.PS_LOST.value, message)
  sys.stderr.write(f"tfps: error: {message}\n")
  leave(errors.ExitCode.CLUSTER_LOST)


def _record(model_dir: str, task: str, action: policy.Action, detail: str) -> None:
  events.EventLog(model_dir).append(
      events.Event(kind="action", task=task, action=action.value, detail=detail))


def _coordinate(config: spec_lib.TaskConfig, spec: run_spec.RunSpec, signalled, *,
                result_file: str | None, prepared=None) -> errors.ExitCode:
  """Runs the coordinator; any failure becomes one line and an exit code."""
  try:
    return _run_chief(config, spec, signalled, result_file=result_file, prepared=prepared)
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


def _run_chief(config: spec_lib.TaskConfig, spec: run_spec.RunSpec, signalled, *,
               result_file: str | None, prepared=None) -> errors.ExitCode:
  # Before TF loads. A chief replica coordinates as the one chief TF knows.
  settings = spec.coordinator_config(config.cluster.for_coordinator(config.task.index))
  api.check_experiment_findable(spec.experiment)
  from tfps.coordinator import run as coordinator_run  # Imports TensorFlow (seconds).

  if prepared is not None:
    detail = "taking over with the coordinator prepared ahead"
    logging.info("%s", detail)
    _record(spec.model_dir, str(config.task), policy.Action.PREPARED_RUNS, detail)
    result = coordinator_run.run_prepared(prepared, signalled,
                                          lease_generation=spec.lease_generation)
  else:
    result = coordinator_run.run_coordinator(settings, interrupts=signalled)
  if result_file:  # The supervisor's (run_result); else a person's.
    run_result.write_coordinator(result, result_file)
  else:
    sys.stdout.write(json.dumps(result.as_dict()) + "\n")
    sys.stdout.flush()
  logging.info("chief finished: %s at step %d", result.status, result.global_step)
  return errors.ExitCode.OK
