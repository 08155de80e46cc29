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
import traceback

from absl import logging

from tfps.base import errors
from tfps.base import log_summary
from tfps.cluster import scratch as scratch_lib
from tfps.cluster import spec as spec_lib
from tfps.commands import run_result
from tfps.commands import run_spec
from tfps.coordinator import api
from tfps.recovery import exit_report
from tfps.recovery import interrupts
from tfps.recovery import standby


def run_process(config: spec_lib.TaskConfig, spec: run_spec.RunSpec, stop,
                stderr_filter: log_summary.StderrFilter, *, result_file: str | None) -> None:
  """This process is a coordinator (a warm standby first, if asked): runs it and exits."""
  # A coordinator the supervisor finds stuck is asked for its stacks first.
  # Written by the signal handler in C, straight to the log: it works even
  # while another thread holds the interpreter lock.
  faulthandler.register(signal.SIGUSR1, file=stderr_filter.real_stderr, all_threads=True)
  temp = scratch_lib.use_for_temporary_files("tfps-coordinator-")
  if os.environ.get(standby.ENV_VAR):
    go = _stand_by(stop)
    if go is None:  # Not needed after all: leave as quietly as we came.
      _leave_coordinator(stderr_filter, temp, errors.ExitCode.OK)
    spec = dataclasses.replace(spec, exclude_tasks=go.exclude_tasks,
                               lease_generation=go.lease_generation)
  _leave_coordinator(stderr_filter, temp,
                     _coordinate(config, spec, stop, result_file=result_file))


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


def _run_chief(config: spec_lib.TaskConfig, spec: run_spec.RunSpec, stop, *,
               result_file: str | None) -> errors.ExitCode:
  # Before TF loads. A chief replica coordinates as the one chief TF knows.
  settings = spec.coordinator_config(config.cluster.for_coordinator(config.task.index))
  api.check_experiment_findable(spec.experiment)
  from tfps.coordinator import run as coordinator_run  # Imports TensorFlow (seconds).

  result = coordinator_run.run_coordinator(settings, interrupts=interrupts.Interrupts(stop))
  if result_file:  # The supervisor's (run_result); else a person's.
    run_result.write_coordinator(result, result_file)
  else:
    sys.stdout.write(json.dumps(result.as_dict()) + "\n")
    sys.stdout.flush()
  logging.info("chief finished: %s at step %d", result.status, result.global_step)
  return errors.ExitCode.OK
