"""`tfps local`: a whole cluster on this machine, run to completion.

Starts ps and worker processes (a LocalCluster in a private network), then
the chief as one more `tfps run` process, and restarts what dies as an
orchestrator would (see `orchestrator`). At the end it prints the chief's JSON result line on stdout, with
`restarts` counting the chief restarts done here, and tears everything down.

SIGTERM/SIGINT to `tfps local` are passed to the chief (which saves), then
everything stops and the exit code is 143/130.
"""

import json
import os
import sys
import tempfile

from absl import logging

from tfps.cluster import hosts
from tfps.cluster import local
from tfps.base import errors
from tfps.base import signals
from tfps import orchestrator
from tfps import run_command

_POLL_SECONDS = 0.5

# Flags forwarded unchanged from `tfps local` to the chief's `tfps run`.
CHIEF_FLAGS = ("experiment", "train_steps", "steps_per_loop", "steps_per_closure",
               "checkpoint_interval", "max_to_keep", "mode", "eval_steps",
               "global_batch_size", "seed", "ready_timeout", "max_restarts", "restart_window",
               "cluster_wait_seconds", "grace_seconds", "worker_timeout", "ps_timeout",
               "eval_interval",
               "eval_shards", "min_shard_bytes", "warm_standby", "train_epochs",
               "input_shards")


def chief_flags(flags, model_dir: str) -> list[str]:
  out = [f"--model_dir={model_dir}"]
  if flags.experiment_params:
    out.append(f"--experiment_params={','.join(flags.experiment_params)}")
  for name in CHIEF_FLAGS:
    value = getattr(flags, name)
    if name == "train_steps" and flags.train_epochs is not None:
      continue  # Epochs decide; the chief refuses both.
    if value is not None:
      out.append(f"--{name}={value}")
  return out


def prepare_model_dir(flags) -> str:
  """`--model_dir`, or a new temp dir; created now so a bad path fails first."""
  model_dir = flags.model_dir or tempfile.mkdtemp(prefix="tfps-local-model-")
  try:
    os.makedirs(model_dir, exist_ok=True)
  except OSError as e:
    raise errors.UsageError(f"--model_dir: cannot create {model_dir!r} ({e.strerror})") from None
  logging.info("model_dir: %s", model_dir)
  return model_dir


def check_hosts(flags) -> None:
  """`--hosts=netns` where namespaces cannot be made: one line, before anything is made."""
  if flags.hosts == "netns" and (reason := hosts.unavailable()) is not None:
    raise errors.UsageError(f"--hosts=netns: {reason}")


def check_chief_flags(flags, cluster: local.LocalCluster, model_dir: str) -> None:
  """Bad chief flags: the chief's own one-line UsageError, before anything starts.

  The chief would find them only once the cluster is up and it has imported
  TensorFlow (seconds on a busy machine); the validation needs neither.
  """
  run_command.chief_config(flags, cluster.spec.for_coordinator(), model_dir)
  run_command.supervision(flags)


def cluster_config(flags, model_dir: str) -> local.LocalClusterConfig:
  return local.LocalClusterConfig(
      num_ps=flags.num_ps, num_workers=flags.num_workers, work_dir=model_dir,
      isolate_network=flags.isolate_network, hosts=flags.hosts,
      ready_timeout=flags.ready_timeout)


def chief_stdout_path(model_dir: str) -> str:
  return os.path.join(model_dir, "logs", "chief-0.stdout")


def run(flags) -> errors.ExitCode:
  stop = signals.StopSignals.install()
  check_hosts(flags)
  model_dir = prepare_model_dir(flags)
  cluster = local.LocalCluster(cluster_config(flags, model_dir))  # Starts nothing yet.
  check_chief_flags(flags, cluster, model_dir)
  with cluster:
    chief = cluster.add_chief(chief_flags(flags, model_dir),
                              stdout_path=chief_stdout_path(model_dir), stderr_to_parent=True)
    runner = orchestrator.Orchestrator(cluster, chief, stop, max_restarts=flags.max_restarts)
    runner.start()
    outcome = None
    while outcome is None:
      outcome = runner.poll()
      stop.wait(_POLL_SECONDS)
  if outcome.code != errors.ExitCode.OK:
    return outcome.code
  result = final_result(model_dir, runner)
  sys.stdout.write(json.dumps(result) + "\n")
  sys.stdout.flush()
  return errors.ExitCode.OK


def final_result(model_dir: str, runner: orchestrator.Orchestrator) -> dict:
  """The chief's JSON line, plus what happened around it."""
  result = _last_json_line(chief_stdout_path(model_dir))
  result["restarts"] = result.get("restarts", 0) + runner.chief_restarts
  result["task_restarts"] = runner.task_restarts
  result["model_dir"] = model_dir
  return result


def _last_json_line(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      lines = [line for line in f if line.startswith("{")]
  except OSError:
    lines = []
  if not lines:
    raise errors.PermanentError(f"the chief exited 0 but wrote no JSON result to {path}")
  return json.loads(lines[-1])
