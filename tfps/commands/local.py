"""`tfps local`: a whole cluster on this machine, run to completion.

Starts ps and worker processes (a LocalCluster in a private network), then
the chief as one more `tfps run` process, handed the run spec as a file
(`--run_spec`, parsed once here from the flags), and restarts what dies as an
orchestrator would (see `orchestrator`). At the end it prints the chief's
result record (`--result_file`) as one JSON line on stdout, with `restarts`
counting the chief restarts done here too, and tears everything down.

Everything that can be checked before a task starts is checked first: the
flags (the run spec), the cluster and, for a user experiment, that its
module imports and has its factory (`tfps.commands.experiment_check`, in a child
process). Whether the factory returns an `Experiment` needs a running
cluster: the chief's first coordinator exits 2 then, and is not restarted.

SIGTERM/SIGINT to `tfps local` are passed to the chief (which saves), then
everything stops and the exit code is 143/130.
"""

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile

from absl import logging

from tfps.cluster import hosts
from tfps.cluster import local
from tfps.cluster import spec as spec_lib
from tfps.coordinator import api
from tfps.base import errors
from tfps.recovery import deaths
from tfps.recovery import events
from tfps.base import signals
from tfps.recovery import orchestrator
from tfps.commands import chief
from tfps.commands import run_result
from tfps.commands import run_spec

_POLL_SECONDS = 0.5


def prepare_model_dir(model_dir: str | None) -> str:
  """`--model_dir`, or a new temp dir; created now so a bad path fails first."""
  model_dir = model_dir or tempfile.mkdtemp(prefix="tfps-local-model-")
  try:
    os.makedirs(model_dir, exist_ok=True)
  except OSError as e:
    raise errors.UsageError(f"--model_dir: cannot create {model_dir!r} ({e.strerror})") from None
  logging.info("model_dir: %s", model_dir)
  return model_dir


def local_spec(flags) -> run_spec.RunSpec:
  """The run spec from the flags, its model_dir made (a temp dir if not given).

  With room for more workers than start (`--max_workers`), the chief trains
  on those that start (`min_workers`, unless given) and takes in the others
  when they join.
  """
  spec = run_spec.from_flags(flags)
  if (flags.max_workers or 0) > flags.num_workers and spec.min_workers is None:
    spec = dataclasses.replace(spec, min_workers=flags.num_workers)
  return dataclasses.replace(spec, model_dir=prepare_model_dir(spec.model_dir))


def check_hosts(flags) -> None:
  """`--hosts=netns` where namespaces cannot be made: one line, before anything is made."""
  if flags.hosts == "netns" and (reason := hosts.unavailable()) is not None:
    raise errors.UsageError(f"--hosts=netns: {reason}")


def check_spec(spec: run_spec.RunSpec, cluster: local.LocalCluster) -> None:
  """Whatever can be found wrong before any task starts: one line, exit 2.

  The chief would find the same only once the cluster is up and it has
  imported TensorFlow, seconds to minutes later.
  """
  spec.coordinator_config(cluster.spec.for_coordinator())
  chief.supervision(spec)
  chief.check_min_workers(spec, cluster.spec)
  api.check_experiment_findable(spec.experiment)
  check_experiment_loads(spec.experiment, spec.experiment_params)


def check_experiment_loads(experiment: str, params) -> None:
  """The experiment's module imports, has its factory and takes `params`
  (`tfps.commands.experiment_check`, in a child process: the built-in one the same way)."""
  logging.info("checking that experiment %s loads", experiment)
  # Its stderr is the import's chatter (TensorFlow's start-up lines): kept
  # only to explain a check that died without its one line.
  done = subprocess.run([sys.executable, "-m", "tfps.commands.experiment_check", experiment,
                         *(f"{k}={v}" for k, v in params.items())],
                        capture_output=True, stdin=subprocess.DEVNULL, text=True, check=False)
  if done.returncode == errors.ExitCode.USAGE and done.stdout.strip():
    raise errors.UsageError(done.stdout.strip().splitlines()[-1])
  if done.returncode != 0:
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise errors.UsageError(f"experiment {experiment!r}: importing it failed "
                            f"(exit code {done.returncode}: {last})")


def cluster_config(flags, model_dir: str) -> local.LocalClusterConfig:
  return local.LocalClusterConfig(
      num_ps=flags.num_ps, num_workers=flags.num_workers, max_workers=flags.max_workers,
      work_dir=model_dir,
      isolate_network=flags.isolate_network, hosts=flags.hosts,
      new_address_on_restart=flags.new_address_on_restart,
      ready_timeout=flags.ready_timeout, graph_cache_dir=flags.graph_cache_dir,
      chief_standby=flags.chief_standby)


def chief_stdout_path(model_dir: str, replica: int = 0) -> str:
  return os.path.join(model_dir, "logs", f"chief-{replica}.stdout")


def chief_result_path(model_dir: str) -> str:
  return os.path.join(model_dir, "logs", "chief-0.result.json")


def add_chief(cluster: local.LocalCluster, spec: run_spec.RunSpec) -> local.TaskHandle:
  """Registers the chief (and its standby replica, if the cluster has one): `tfps run`
  with the run spec in a file beside its log. Returns chief 0."""
  path = run_spec.write(spec, os.path.join(cluster.log_dir, "run_spec.json"))
  result = chief_result_path(spec.model_dir)
  if os.path.exists(result):
    os.remove(result)  # An earlier run's: only this chief's may be read.
  handles = [cluster.add_chief([f"--run_spec={path}", f"--result_file={result}"],
                               stdout_path=chief_stdout_path(spec.model_dir, replica),
                               stderr_to_parent=True, replica=replica)
             for replica in range(cluster.spec.num_tasks(spec_lib.JobType.CHIEF))]
  return handles[0]


def start_cluster(cluster: local.LocalCluster, model_dir: str) -> local.LocalCluster:
  """Starts the ps and workers; one that dies before it answers is a death in the
  event log (`recovery.deaths`), and the run ends with its one line."""
  try:
    return cluster.start()
  except local.TaskExitedError as e:
    death = deaths.Death(str(e.task), e.pid, e.returncode, e.last_lines,
                         cause="before it answered")
    logging.error("%s", death.describe())
    events.EventLog(model_dir).append(death.event())
    raise


def run(flags) -> errors.ExitCode:
  stop = signals.StopSignals.install()
  check_hosts(flags)
  spec = local_spec(flags)
  cluster = local.LocalCluster(cluster_config(flags, spec.model_dir))  # Starts nothing yet.
  check_spec(spec, cluster)
  with contextlib.closing(start_cluster(cluster, spec.model_dir)):
    runner = orchestrator.Orchestrator(cluster, add_chief(cluster, spec), stop,
                                       max_restarts=spec.max_restarts,
                                       event_log=events.EventLog(spec.model_dir))
    runner.start()
    outcome = None
    while outcome is None:
      outcome = runner.poll()
      stop.wait(_POLL_SECONDS)
  if outcome.code != errors.ExitCode.OK:
    return outcome.code
  result = final_result(spec.model_dir, runner)
  sys.stdout.write(json.dumps(result) + "\n")
  sys.stdout.flush()
  return errors.ExitCode.OK


def final_result(model_dir: str, runner: orchestrator.Orchestrator) -> dict:
  """The chief's result record, plus what happened around it, as the JSON line's dict."""
  result = run_result.read(chief_result_path(model_dir))
  # The deaths the chief counted, and any of the tasks' since (the event log is shared).
  counted = events.summarize(events.EventLog(model_dir).read())["deaths"]
  return dataclasses.replace(result, restarts=result.restarts + runner.chief_restarts,
                             task_restarts=runner.task_restarts, deaths=counted).as_dict()
