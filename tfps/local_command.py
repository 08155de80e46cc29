"""`tfps local`: a whole cluster on this machine, run to completion.

Starts ps and worker processes (a LocalCluster in a private network), then
the chief as one more `tfps run` process, and acts as an orchestrator would:
a ps or worker that exits is started again at the same address; a chief that
exits with a retryable code (>= 128, or killed by a signal) is started again,
at most `--max_restarts` times; a permanent exit (1, 2) ends the run with
that code. At the end it prints the chief's JSON result line on stdout, with
`restarts` counting the chief restarts done here, and tears everything down.

SIGTERM/SIGINT to `tfps local` are passed to the chief (which saves), then
everything stops and the exit code is 143/130.
"""

import dataclasses
import json
import os
import signal
import sys
import tempfile

from absl import logging

from cluster import local
from recovery import errors
from recovery import signals

_POLL_SECONDS = 0.5
# How long the chief may take to save and exit after we pass on a SIGTERM.
_CHIEF_STOP_GRACE = 60.0

# Flags forwarded unchanged from `tfps local` to the chief's `tfps run`.
CHIEF_FLAGS = ("experiment", "train_steps", "steps_per_loop", "steps_per_closure",
               "checkpoint_interval", "max_to_keep", "mode", "eval_steps",
               "global_batch_size", "seed", "ready_timeout")


@dataclasses.dataclass(frozen=True)
class _Outcome:
  code: errors.ExitCode
  chief_restarts: int
  task_restarts: int


def chief_flags(flags, model_dir: str) -> list[str]:
  out = [f"--model_dir={model_dir}"]
  for name in CHIEF_FLAGS:
    value = getattr(flags, name)
    if value is not None:
      out.append(f"--{name}={value}")
  return out


def run(flags) -> errors.ExitCode:
  stop = signals.StopSignals.install()
  if flags.max_restarts < 0:
    raise errors.UsageError(f"max_restarts ({flags.max_restarts}) must be >= 0")
  model_dir = flags.model_dir or tempfile.mkdtemp(prefix="tfps-local-model-")
  try:
    os.makedirs(model_dir, exist_ok=True)
  except OSError as e:
    raise errors.UsageError(f"--model_dir: cannot create {model_dir!r} ({e.strerror})") from None
  logging.info("model_dir: %s", model_dir)
  config = local.LocalClusterConfig(
      num_ps=flags.num_ps, num_workers=flags.num_workers, work_dir=model_dir,
      isolate_network=flags.isolate_network, ready_timeout=flags.ready_timeout)
  stdout_path = os.path.join(model_dir, "logs", "chief-0.stdout")
  with local.LocalCluster(config) as cluster:
    chief = cluster.add_chief(chief_flags(flags, model_dir), stdout_path=stdout_path,
                              stderr_to_parent=True)
    outcome = _supervise(cluster, chief, stop, flags.max_restarts)
  if outcome.code != errors.ExitCode.OK:
    return outcome.code
  result = _last_json_line(stdout_path)
  result["restarts"] = result.get("restarts", 0) + outcome.chief_restarts
  result["task_restarts"] = outcome.task_restarts
  result["model_dir"] = model_dir
  sys.stdout.write(json.dumps(result) + "\n")
  sys.stdout.flush()
  return errors.ExitCode.OK


def _supervise(cluster: local.LocalCluster, chief: local.TaskHandle,
               stop: signals.StopSignals, max_restarts: int) -> _Outcome:
  """Runs the chief to the end, restarting what dies, as an orchestrator would."""
  chief_restarts = task_restarts = 0
  chief.start()
  while True:
    if stop.wait(_POLL_SECONDS):
      logging.warning("%s: stopping the chief (it saves a checkpoint first)",
                      signal.Signals(stop.signum).name)
      chief.kill(signal.SIGTERM)
      try:
        chief.wait(_CHIEF_STOP_GRACE)
      except TimeoutError:
        logging.error("chief did not stop within %.0fs of SIGTERM", _CHIEF_STOP_GRACE)
      return _Outcome(errors.exit_code_for_signal(stop.signum), chief_restarts, task_restarts)
    for handle in cluster.tasks.values():
      if handle is not chief and not handle.alive:
        logging.warning("%s exited with code %s; starting it again at %s",
                        handle.task, handle.returncode, handle.address)
        handle.start()
        task_restarts += 1
    code = chief.returncode
    if code is None:
      continue
    if code == 0:
      return _Outcome(errors.ExitCode.OK, chief_restarts, task_restarts)
    if 0 < code < 128:
      logging.error("chief failed permanently (exit code %d); not restarting. Logs: %s",
                    code, chief.log_path)
      return _Outcome(errors.ExitCode(code) if code in (1, 2) else errors.ExitCode.PERMANENT,
                      chief_restarts, task_restarts)
    if chief_restarts >= max_restarts:
      logging.error("chief exited with code %d and the restart budget (%d) is spent",
                    code, max_restarts)
      return _Outcome(errors.ExitCode.PERMANENT, chief_restarts, task_restarts)
    chief_restarts += 1
    logging.warning("chief exited with retryable code %d; restart %d of %d",
                    code, chief_restarts, max_restarts)
    chief.start()


def _last_json_line(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      lines = [line for line in f if line.startswith("{")]
  except OSError:
    lines = []
  if not lines:
    raise errors.PermanentError(f"the chief exited 0 but wrote no JSON result to {path}")
  return json.loads(lines[-1])
