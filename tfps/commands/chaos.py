"""`tfps chaos`: `tfps local` while a seeded schedule of real faults hits it.

Faults (see `chaos.faults`) are SIGKILL, SIGTERM and SIGSTOP/SIGCONT of
workers, ps and the chief, each target brought back after its delay (or
never, for a worker), link cuts, and workers that join (`--max_workers`
leaves room for them) or leave for good. A fault is injected once training
reaches its step (random schedules place faults by step, so they land while
training runs on any host), or at its time, counted from the first progress
record. A
task taken down by a fault is held down (the orchestrator does not restart
it) until its delay is over; a fault due while its target is still down,
paused or cut off from an earlier one waits for the target's return.

At the end the run is checked: it reached `--train_steps`, the final
checkpoint restores, every example of a completed epoch was trained on
(positioned input), the eval metrics are sane. A check that does not apply
(no eval in a train-only run, endless input) is listed in `skipped_checks`,
not failed. One JSON line on stdout reports faults, recoveries, recovery
seconds (to the first progress), each fault's longest stall (the longest
time without progress until the next fault) and that less an ordinary
loop's time (what the fault added), steps lost, input accounting,
goodput and the timeline picture's path. Exit 0 only if every fault was
recovered and every check passed; otherwise 1.
"""

import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import time

from absl import logging

from tfps.cluster import local
from tfps.cluster import spec as spec_lib
from tfps.chaos import faults as faults_lib
from tfps.chaos import tracker as tracker_lib
from tfps.chaos import goodput
from tfps.chaos import timeline
from tfps.base import errors
from tfps.recovery import chief_lease
from tfps.recovery import events
from tfps.base import log_summary
from tfps.recovery import progress_log as progress_lib
from tfps.base import signals
from tfps.commands import local as local_command
from tfps.recovery import orchestrator
from tfps.recovery import policy

_POLL_SECONDS = 0.25
# How long a SIGTERMed task may take to save and exit once its delay is over.
_EXIT_GRACE_SECONDS = 30.0


@dataclasses.dataclass
class _Restore:
  at: float  # Seconds since the start of training.
  fault: faults_lib.Fault


def schedule(flags, cluster: local.LocalCluster) -> tuple[faults_lib.Fault, ...]:
  if flags.faults:
    faults = faults_lib.parse_faults(flags.faults, cluster.spec,
                                     workers_started=cluster.config.num_workers)
    if cluster.config.hosts != "netns" and any(
        f.action == faults_lib.FaultAction.CUT for f in faults):
      raise errors.UsageError("--faults: 'cut' needs --hosts=netns (a task per virtual host)")
    return faults
  # By step (the run's own progress), unless seconds were asked for or the
  # steps are not known before the run (--train_epochs).
  by_steps = not flags["chaos_duration"].present and flags.train_epochs is None
  return faults_lib.random_schedule(
      seed=flags.seed, count=flags.fault_count, duration=flags.chaos_duration,
      cluster=cluster.spec, never_returns=flags.worker_never_returns,
      back_after=flags.restart_delay, network_faults=cluster.config.hosts == "netns",
      train_steps=flags.train_steps if by_steps else None,
      workers_started=cluster.config.num_workers)


def run(flags) -> errors.ExitCode:
  stop = signals.StopSignals.install()
  local_command.check_hosts(flags)
  spec = local_command.local_spec(flags)
  model_dir = spec.model_dir
  cluster = local.LocalCluster(local_command.cluster_config(flags, model_dir))
  faults = schedule(flags, cluster)  # Bad --faults fail before anything starts.
  local_command.check_spec(spec, cluster)  # So do bad run settings.
  logging.info("chaos schedule: %s", ", ".join(map(str, faults)))
  try:
    local_command.start_cluster(cluster, model_dir)
  except local.TaskExitedError as e:
    _print({"status": "failed", "reason": str(e), "faults_injected": 0,
            "deaths": events.summarize(events.EventLog(model_dir).read())["deaths"]})
    sys.stderr.write(f"tfps: error: {e}\n")
    return e.exit_code
  with contextlib.closing(cluster):
    chief = local_command.add_chief(cluster, spec)
    runner = orchestrator.Orchestrator(cluster, chief, stop, max_restarts=spec.max_restarts,
                                       event_log=events.EventLog(spec.model_dir))
    tracker = tracker_lib.RecoveryTracker()
    runner.start()
    pending = list(faults)
    outcome = _inject_until_done(cluster, runner, stop, pending, tracker,
                                 progress_lib.ProgressLog(model_dir), events.EventLog(model_dir),
                                 model_dir)
  report = tracker_lib.report(tracker.outcomes())
  result = {"status": "failed", **report, "reason": outcome.reason,
            # Every process that died, the faults' victims among them (recovery.deaths).
            "deaths": events.summarize(events.EventLog(model_dir).read())["deaths"],
            **_goodput_and_timeline(model_dir, report)}
  if outcome.code == errors.ExitCode.OK:
    chief_result = local_command.final_result(model_dir, runner)
    # With --train_epochs the step to reach is the chief's (epochs x batches).
    checks = _checks(chief_result, chief_result.get("train_steps") or flags.train_steps,
                     model_dir)
    # A schedule longer than the run proves nothing about the faults left out.
    checks["every_fault_injected"] = not pending
    if pending:
      result["reason"] = (f"training ended before {len(pending)} fault(s): "
                          f"{', '.join(map(str, pending))}; raise --train_steps")
    ok = tracker.all_recovered and all(checks.values())
    result.update(status="ok" if ok else "failed", checks=checks,
                  skipped_checks=skipped_checks(checks),
                  global_step=chief_result.get("global_step"), eval=chief_result.get("eval"),
                  restarts=chief_result.get("restarts"), input=chief_result.get("input"),
                  model_dir=model_dir)
  _print(result)
  if outcome.code != errors.ExitCode.OK and outcome.code.retryable:
    return outcome.code  # Stopped by a signal: say so, not "failed".
  return errors.ExitCode.OK if result["status"] == "ok" else errors.ExitCode.PERMANENT


def _print(result: dict) -> None:
  sys.stdout.write(json.dumps(result) + "\n")
  sys.stdout.flush()


def _inject_until_done(cluster, runner, stop, pending, tracker, progress,
                       event_log: events.EventLog, model_dir: str) -> orchestrator.Outcome:
  restores: list[_Restore] = []
  began = time.time()
  started = None  # Monotonic time of the first progress record.
  step = 0  # The furthest step a loop reached (faults placed by step wait for it).
  while True:
    outcome = runner.poll()
    if outcome is not None:
      return outcome
    records = progress.read_new()
    if started is None and records:
      started = time.monotonic()
      logging.info("chaos: training is running; fault clock starts")
    tracker.observe(records)
    step = max([step] + [r.step for r in records if not r.restored])
    if started is not None:
      elapsed = time.monotonic() - started
      for fault in list(pending):
        if not fault.due(elapsed, step, fault.at_standby
                         and _standby_prepared(event_log, since=began)):
          break  # In order: a later one is not due either (or waits for this one).
        aimed = fault.aimed_at(_lease_holder(model_dir)) if fault.active_chief else fault
        if aimed.target in {r.fault.target for r in restores}:
          # Its target is still down (or paused, or cut off) from an earlier fault:
          # it waits for the target's return; the faults on other tasks go on.
          continue
        pending.remove(fault)
        _inject(cluster, runner, aimed)
        tracker.injected(aimed, wall_time=time.time(), since_start=elapsed)
        if aimed.back_after is not faults_lib.NEVER:
          restores.append(_Restore(elapsed + aimed.back_after, aimed))
      for restore in [r for r in restores if r.at <= elapsed]:
        if _bring_back(cluster, runner, restore.fault, overdue=elapsed - restore.at):
          restores.remove(restore)
    stop.wait(_POLL_SECONDS)


def _standby_prepared(event_log: events.EventLog, since: float) -> bool:
  """Whether a standby chief has a coordinator prepared ahead: one was, since
  `since`, and has neither run (a takeover) nor retired since."""
  latest = {}
  for event in event_log.read():
    if event.time >= since and event.action in (policy.Action.STANDBY_PREPARED.value,
                                                policy.Action.PREPARED_RUNS.value,
                                                policy.Action.STANDBY_RETIRED.value):
      latest[event.task] = event.action
  return policy.Action.STANDBY_PREPARED.value in latest.values()


def _lease_holder(model_dir: str) -> spec_lib.TaskId:
  """The chief replica holding the lease now (chief:0 before any took it)."""
  holder = chief_lease.LeaseStore(model_dir).holder()
  return spec_lib.TaskId.parse(chief_lease.holder_task(holder)) if holder else (
      spec_lib.TaskId(spec_lib.JobType.CHIEF, 0))


def _inject(cluster, runner, fault: faults_lib.Fault) -> None:
  handle = cluster.tasks[fault.target]
  logging.warning("chaos: %s %s (pid %s)", fault.action.name_of_fault, fault.target, handle.pid)
  if fault.action == faults_lib.FaultAction.CUT:
    cluster.partition(fault.target)
    return
  if fault.action == faults_lib.FaultAction.STOP:
    handle.pause()  # The whole task: the chief's coordinator runs in its own session.
    return
  if fault.action == faults_lib.FaultAction.JOIN:
    handle.start()  # The chief takes it in once it answers (its task watch).
    return
  runner.held.add(fault.target)  # Down until its delay is over (for good: a leave).
  handle.kill(fault.action.signal)


def _bring_back(cluster, runner, fault: faults_lib.Fault, overdue: float = 0.0) -> bool:
  """Brings `fault`'s target back, `overdue` seconds after its delay ended; False
  while a SIGTERMed one is still saving and exiting (asked again at the next poll,
  while the other faults go on), for up to `_EXIT_GRACE_SECONDS`."""
  handle = cluster.tasks[fault.target]
  if fault.action == faults_lib.FaultAction.CUT:
    logging.warning("chaos: link of %s up again", fault.target)
    cluster.heal(fault.target)
    return True
  if fault.action == faults_lib.FaultAction.STOP:
    logging.warning("chaos: SIGCONT %s", fault.target)
    handle.resume()
    return True
  if handle.alive:  # SIGTERM: it may still be saving and exiting; let it finish.
    if overdue < _EXIT_GRACE_SECONDS:
      return False
    logging.warning("chaos: %s still running %.0fs after its SIGTERM's delay: SIGKILL",
                    fault.target, overdue)
    handle.kill(signal.SIGKILL)
    handle.wait(timeout=10)
  logging.warning("chaos: starting %s again (exited %s)", fault.target, handle.returncode)
  runner.held.discard(fault.target)
  handle.start()
  return True


def _goodput_and_timeline(model_dir: str, report: dict) -> dict:
  """The run's goodput and its picture (`model_dir/timeline.png`), from the progress log."""
  records = progress_lib.ProgressLog(model_dir).read_new()
  if not records:
    return {}
  measured = goodput.measure(records)
  # Fault times count from the first progress record, as the records' do.
  marks = [timeline.Mark(f["time"], f"{f['target']} {f['signal']}") for f in report["faults"]]
  value = measured.value
  title = (f"tfps chaos: {report['faults_injected']} faults, {report['recoveries']} recovered, "
           f"{report['steps_lost']} steps lost, goodput "
           f"{'n/a' if value is None else f'{100 * value:.1f} %'}")
  path = os.path.join(model_dir, "timeline.png")
  try:
    timeline.plot(path, records, marks, title)
  except (OSError, ValueError) as e:  # The picture is a convenience, never the verdict.
    logging.warning("timeline not drawn: %s", e)
    path = None
  return {"goodput": measured.as_dict(), "timeline": path,
          "closures_per_worker": tracker_lib.closures_per_worker(records)}


def _checks(result: dict, train_steps: int, model_dir: str) -> dict[str, bool]:
  metrics = result.get("eval") or {}
  accounting = result.get("input") or {}
  if accounting.get("positioned"):
    # Every example of a completed epoch trained on (none lost to a fault).
    covered = {"input_covered": bool(accounting.get("consistent")) and
               accounting.get("never_trained") == 0 and accounting.get("trained_twice") == 0}
  else:
    covered = {}  # Endless input: no epochs to account for.
  checks = {
      **covered,
      "reached_train_steps": (result.get("global_step") or 0) >= train_steps,
      "checkpoint_restores": _checkpoint_restores(model_dir, result.get("global_step")),
  }
  if metrics:  # A train-only run (no evaluator, --mode=train) has none to judge.
    # Any experiment's metrics: each a finite number (a fault must not leave
    # the model or its metrics broken). What value is good is the experiment's.
    checks["eval_sane"] = all(isinstance(v, (int, float)) and math.isfinite(v)
                              for v in metrics.values())
  return checks


def skipped_checks(checks: dict[str, bool]) -> list[str]:
  """The checks that do not apply to this run (reported, not failed)."""
  return [name for name in ("input_covered", "eval_sane") if name not in checks]


def _checkpoint_restores(model_dir: str, global_step) -> bool:
  """The latest checkpoint loads and holds the final global step."""
  quiet = log_summary.install_stderr_filter()  # TF's start-up chatter, summarised.
  try:
    return _global_step_matches(model_dir, global_step)
  finally:
    quiet.close()


def _global_step_matches(model_dir: str, global_step) -> bool:
  import tensorflow as tf  # Only here: the rest of chaos needs no TF.
  path = tf.train.latest_checkpoint(model_dir)
  if path is None:
    return False
  try:
    reader = tf.train.load_checkpoint(path)
  except (tf.errors.OpError, ValueError) as e:
    logging.error("latest checkpoint %s does not load: %s", path, e)
    return False
  steps = [reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
           if name.startswith("global_step")]
  return bool(steps) and int(steps[0]) == int(global_step)
