"""The chief's `tfps run`: a supervisor of coordinator processes (`recovery.supervisor`).

Here the supervisor gets what it runs with: its settings from the run spec,
a launcher that starts each coordinator as `tfps run --nosupervise` with the
next one kept warm (`recovery.standby`), and probes of the ps and workers.
At the end it writes the run's result record (`run_result.RunResult`).
"""

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile

from absl import logging

from tfps.base import errors
from tfps.cluster import readiness
from tfps.cluster import scratch as scratch_lib
from tfps.cluster import spec as spec_lib
from tfps.commands import run_result
from tfps.commands import run_spec
from tfps.coordinator import api
from tfps.recovery import chief_lease
from tfps.recovery import chief_replica
from tfps.recovery import coverage
from tfps.recovery import events
from tfps.recovery import exit_report
from tfps.recovery import policy
from tfps.recovery import progress_log
from tfps.recovery import readmission
from tfps.recovery import standby
from tfps.recovery import supervisor
from tfps.recovery import task_watch

# One round of probing the ps and workers (task watch, ps deadline).
_PROBE_SECONDS = 1.0


# The supervisor's ps deadline is the coordinator's (--ps_timeout) plus this:
# the coordinator, which notices within --ps_timeout plus one of its probe
# rounds (~3 s), always gets the first word; the supervisor (probing every
# 2 s) acts only when it has not exited by then (see recovery.supervisor).
_SUPERVISOR_PS_MARGIN_SECONDS = 8.0


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
                                   if spec.ps_timeout > 0 else None),
              min_workers=spec.min_workers),
          task_watch.TaskWatchConfig(timeout=spec.worker_timeout,
                                     ps_readmit_after=spec.ps_readmit_after,
                                     min_workers=spec.min_workers or 1))


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
    self.lease_generation = 0  # With two chief replicas: the one held (chief_lease).
    self._shares_host = spec_lib.shares_host(config.cluster, config.task)
    self._coordinators = standby.WarmCoordinators(
        self._command,
        env={**os.environ, exit_report.ENV_VAR: self.report_path,
             "TF_CONFIG": config.to_tf_config()},
        stdout_dir=scratch, warm=spec.warm_standby, event_log=event_log)

  def _command(self, excluded: tuple[str, ...]) -> list[str]:
    path = os.path.join(self._scratch, f"run_spec-{next(self._spec_files)}.json")
    run_spec.write(dataclasses.replace(self._spec, exclude_tasks=excluded,
                                       lease_generation=self.lease_generation), path)
    return [sys.executable, "-m", "tfps", "run", "--nosupervise", f"--run_spec={path}",
            f"--result_file={self.result_path}"]

  def start(self, attempt: int, excluded: frozenset) -> subprocess.Popen:
    self._read()
    self._trained = False  # Only what the new coordinator does counts.
    process, warm = self._coordinators.start([str(t) for t in excluded],
                                             lease_generation=self.lease_generation)
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
    """Prepares the warm standby once a coordinator trains: never slow down a start.

    (A standby chief replica's waits for the holder's coordinator the same way,
    `stand_by`: on a shared host, the import would slow its start.)"""
    if self.trained():
      self._coordinators.prepare()

  def stand_by(self) -> None:
    """What a standby chief replica does while it waits: once the holder's coordinator
    trains, keeps a hot standby (connected, built and its closures instantiated
    ahead: `coordinator.run.prepare_ahead`). One that retired (a ps was lost) is
    replaced at once: the new one imports while the cluster recovers, and
    connects once it trains again (`commands.coordinate`), so a takeover in
    between finds at least an imported coordinator. On a host that ps or workers
    share (`tfps local`) its import would slow that recovery: it is replaced
    once the cluster trains again."""
    if self.trained() and not self._coordinators.prepare(
        hot=True, replace_retired=not self._shares_host):
      self._trained = False

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

  @property
  def workers(self) -> tuple[spec_lib.TaskId, ...]:
    return tuple(t for t in self.servers if t.job == spec_lib.JobType.WORKER)

  def reachable(self) -> set:
    return readiness.reachable(self.cluster, self.servers, _PROBE_SECONDS)

  def wait_until_reachable(self, seconds: float, excluded: frozenset) -> None:
    readiness.wait_until_reachable(self.cluster, seconds,
                                   tasks=[t for t in self.servers if t not in excluded])


def check_min_workers(spec: run_spec.RunSpec, cluster: spec_lib.ClusterSpec) -> None:
  """`min_workers` no larger than the cluster spec's workers: one line, exit 2."""
  workers = cluster.num_tasks(spec_lib.JobType.WORKER)
  if spec.min_workers is not None and spec.min_workers > workers:
    raise errors.UsageError(
        f"min_workers ({spec.min_workers}) must be at most the cluster spec's {workers} workers")


def supervise(config: spec_lib.TaskConfig, spec: run_spec.RunSpec, stop, *,
                     result_file: str | None) -> errors.ExitCode:
  """The chief as a supervisor of coordinator processes (recovery.supervisor)."""
  supervisor_config, watch_config = supervision(spec)
  spec = dataclasses.replace(spec, model_dir=ensure_model_dir(spec.model_dir))
  api.check_experiment_findable(spec.experiment)
  probes = _ClusterProbes(config.cluster, tuple(
      t for t in config.cluster.for_coordinator().tasks() if t.job != spec_lib.JobType.CHIEF))
  check_min_workers(spec, config.cluster)
  workers = list(probes.workers)
  event_log = events.EventLog(spec.model_dir)
  # Removed when the chief ends, or by the next chief's sweep if it is killed.
  with scratch_lib.ScratchDir("tfps-chief-") as scratch:
    launcher = _CoordinatorLauncher(config, spec, scratch, event_log)

    def run_supervisor(superseded=lambda: False, left_out=frozenset()
                       ) -> supervisor.SupervisorResult:
      made = supervisor.Supervisor(
          supervisor_config, launcher=launcher, cluster=probes, event_log=event_log,
          stop=stop, superseded=superseded,
          # The ps are probed too: a chief that sees no ps is itself cut off, and
          # then no worker is to blame; and a ps left out is taken back (task_watch).
          watch=task_watch.TaskWatch(workers, watch_config, ps=list(probes.ps_addresses)))
      made.excluded = set(left_out)
      return made.run()

    replica = sight = None
    if config.cluster.chief_standby:
      sight = chief_replica.ClusterSight(config.cluster, list(probes.ps_addresses),
                                         within=2 * spec.chief_lease_seconds).start()
      replica = chief_replica.ChiefReplica(
          chief_lease.LeaseStore(spec.model_dir),
          chief_lease.LeaseConfig(lease_seconds=spec.chief_lease_seconds,
                                  renew_seconds=min(0.1, spec.chief_lease_seconds / 4)),
          replica=config.task.index, stop=stop, event_log=event_log, sees_cluster=sight,
          me=chief_lease.holder_named(str(config.task), config.address, os.getpid()),
          presence_host=spec_lib.host_of(config.address))

      def hold(generation: int, superseded) -> supervisor.SupervisorResult:
        launcher.lease_generation = generation
        # A takeover finds the cluster as the last holder left it: a ps it ran
        # without (failed over) is not waited for, the task watch takes it back.
        ps = frozenset(probes.ps_addresses)
        left_out = (supervisor_config.policy.left_out_at_takeover(ps, ps - probes.reachable())
                    if generation > 1 else frozenset())
        if left_out:
          logging.warning("taking over without %s: not answering (ps failover)",
                          ", ".join(sorted(map(str, left_out))))
        return run_supervisor(superseded, left_out)

      result = replica.run(hold, stand_by=launcher.stand_by)
      launcher.close()
      sight.stop()
    else:
      result = run_supervisor()
    code = result.exit_code
    try:
      if code != errors.ExitCode.OK or (replica is not None and replica.ended_elsewhere):
        return code  # The other replica wrote the result of a run that ended there.
      finished = run_result.read_coordinator(launcher.result_path)
      _write_result(spec, event_log, finished, result_file)
      return code
    finally:
      if replica is not None:
        replica.release(code)  # After the result: the standby then leaves.


def _write_result(spec: run_spec.RunSpec, event_log: events.EventLog,
                  finished: api.CoordinatorResult, result_file: str | None) -> None:
  """The run's result record (in `result_file`) and its JSON line on stdout."""
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
