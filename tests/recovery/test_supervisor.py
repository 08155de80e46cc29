"""The supervisor against real child processes standing in for the coordinator.

The child is a tiny Python program whose exit code per attempt comes from a
plan, so every branch is exercised with real processes and real signals,
without TensorFlow.
"""

import os
import signal
import subprocess
import sys
import threading

import pytest

from tfps.base import errors
from tfps.recovery import events
from tfps.recovery import exit_report
from tfps.recovery import policy
from tfps.base import signals
from tfps.recovery import supervisor

Kind = policy.FailureKind

# Prints "ready", then exits with its planned code, or waits for SIGTERM and exits 143.
CHILD = """
import signal, sys, time
code = sys.argv[1]
print("ready", flush=True)
if code == "wait":
  signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
  time.sleep(60)
  sys.exit(3)
sys.exit(int(code))
"""


class Harness:
  """The supervisor's launcher and cluster: starts the planned children,
  counts cluster waits; every probe answers `up`."""

  def __init__(self, plan, cluster_up=True, trained=lambda: False, idle=lambda: None,
               up=frozenset(), ps_addresses=None, ps_back_due=lambda: True, workers=()):
    self.plan = list(plan)
    self.ps_back_due = ps_back_due
    self.cluster_up = cluster_up
    self.started = []
    self.cluster_waits = 0
    self.trained, self.idle = trained, idle
    self.up = up
    self.ps_addresses = ps_addresses or {}
    self.workers = tuple(workers)
    self.report = None
    self.closed = False

  def start(self, attempt, excluded=frozenset()):
    assert attempt == len(self.started)
    process = subprocess.Popen([sys.executable, "-c", CHILD, str(self.plan[attempt])],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    self.started.append(process)
    return process

  def exit_report(self):
    return self.report() if self.report else None

  def last_lines(self):
    return ("ready",)  # What every stand-in says.

  def close(self):
    self.closed = True

  def reachable(self):
    return set(self.up() if callable(self.up) else self.up)

  def wait_until_reachable(self, seconds, excluded):
    self.cluster_waits += 1
    if not self.cluster_up:
      raise errors.RetryableError(f"tasks still unreachable after {seconds:.1f}s: ps:0")


def supervise(harness, tmp_path, stop=None, watch=None, clock=None, superseded=None,
              **config):
  log = events.EventLog(str(tmp_path))
  result = supervisor.Supervisor(
      supervisor.SupervisorConfig(**config), launcher=harness, cluster=harness, event_log=log,
      stop=stop or signals.StopSignals(), watch=watch,
      **({"clock": clock} if clock else {}),
      **({"superseded": superseded} if superseded else {})).run()
  assert harness.closed  # The launcher's standby goes with the supervisor.
  return result, log


def run(harness, tmp_path, stop=None, **config):
  result, log = supervise(harness, tmp_path, stop=stop, **config)
  for process in harness.started:
    assert process.poll() is not None
    process.stdout.close()
  return result, log.read()


def test_a_superseded_chief_kills_its_coordinator_and_restarts_nothing(tmp_path):
  # The other chief replica took the lease while this one's coordinator ran.
  harness = Harness(["wait"])
  polls = []
  result, log = supervise(harness, tmp_path, superseded=lambda: polls.append(1) or len(polls) > 2)
  assert result.exit_code == errors.ExitCode.SUPERSEDED and len(harness.started) == 1
  assert harness.started[0].wait(timeout=10) == -signal.SIGKILL  # No grace: no save.
  assert log.read() == []  # Not a failure of this replica's: nothing restarted.


def test_a_coordinator_that_found_itself_fenced_is_not_restarted(tmp_path):
  harness = Harness([errors.ExitCode.SUPERSEDED, 0])
  result, _ = run(harness, tmp_path)
  assert result.exit_code == errors.ExitCode.SUPERSEDED and len(harness.started) == 1


def test_ps_loss_restarts_the_coordinator_after_the_cluster_is_back(tmp_path):
  harness = Harness([170, 170, 0])
  result, log = run(harness, tmp_path)
  assert result == supervisor.SupervisorResult(errors.ExitCode.OK, 2, "finished")
  assert harness.cluster_waits == 2 and len(harness.started) == 3
  assert [e.kind for e in log] == ["failure", "action", "recovered"] * 2
  assert log[1].action == policy.Action.WAIT_AND_RESTART.value
  assert events.summarize(log) == {"faults": 2, "restarts": 2, "steps_lost": 0,
                                   "steps_reexecuted": 0, "deaths": {}}


@pytest.mark.parametrize("code, exit_code", [(1, errors.ExitCode.PERMANENT),
                                              (2, errors.ExitCode.USAGE)])
def test_permanent_exit_is_not_retried(tmp_path, code, exit_code):
  harness = Harness([code, 0])
  result, log = run(harness, tmp_path)
  assert result.exit_code == exit_code and result.restarts == 0
  assert len(harness.started) == 1 and harness.cluster_waits == 0
  assert log[-1].action == policy.Action.GIVE_UP.value


def test_the_coordinators_exit_report_names_the_permanent_failure(tmp_path):
  report_path = str(tmp_path / "exit.json")
  reporter = ("import sys; from tfps.recovery import exit_report; "
              "exit_report.write('nan_loss', 'loss is nan at step 7'); sys.exit(1)")
  started = []
  harness = Harness([])

  def start(attempt, excluded=frozenset()):
    started.append(subprocess.Popen([sys.executable, "-c", reporter],
                                    env={**os.environ, exit_report.ENV_VAR: report_path}))
    return started[-1]

  harness.start = start
  harness.report = lambda: exit_report.take(report_path)
  result, log = supervise(harness, tmp_path)
  assert result.exit_code == errors.ExitCode.PERMANENT and len(started) == 1
  failure, action = log.read()
  assert failure.failure == Kind.NAN_LOSS.value
  assert failure.detail == "coordinator exited with code 1: loss is nan at step 7"
  assert action.action == policy.Action.GIVE_UP.value
  assert not os.path.exists(report_path)  # Taken: a later exit cannot reuse it.


def test_restarts_followed_by_training_do_not_spend_the_budget(tmp_path):
  # Five ps losses in a row, each coordinator having trained before it went:
  # a burst of real faults, not a crash loop.
  harness = Harness([170] * 5 + [0], trained=lambda: True)
  result, _ = run(harness, tmp_path, policy=policy.RestartPolicy(max_restarts=2, window_seconds=600))
  assert result.exit_code == errors.ExitCode.OK and result.restarts == 5


def test_crash_loop_spends_the_budget_and_exits_1(tmp_path):
  harness = Harness([-9] * 10)
  result, _ = run(harness, tmp_path,
                  policy=policy.RestartPolicy(max_restarts=2, window_seconds=600))
  assert result.exit_code == errors.ExitCode.PERMANENT
  assert "restart budget spent: 2 restarts" in result.reason
  assert len(harness.started) == 3


def test_cluster_that_never_returns_exits_retryable(tmp_path):
  harness = Harness([170, 0], cluster_up=False)
  result, log = run(harness, tmp_path)
  assert result.exit_code == errors.ExitCode.CLUSTER_LOST and result.exit_code.retryable
  assert "ps:0" in result.reason and len(harness.started) == 1


def test_sigterm_is_passed_on_and_not_restarted(tmp_path):
  harness = Harness(["wait", 0])
  stop = signals.StopSignals()
  # Deliver the stop as the signal handler would, once the child runs.
  threading.Timer(1.0, stop._handle, args=(signal.SIGTERM, None)).start()
  result, log = run(harness, tmp_path, stop=stop)
  assert result.exit_code == errors.ExitCode.PREEMPTED
  assert harness.started[0].returncode == 143
  assert len(harness.started) == 1 and log == []


def test_the_launcher_idles_while_the_coordinator_runs_and_not_once_it_is_stopping(tmp_path):
  stop = signals.StopSignals()
  polls = []

  def idle():  # Where the chief prepares its warm standby.
    polls.append(stop.requested)

  harness = Harness(["wait", 0], idle=idle)
  # The stop arrives between two polls, as a signal would.
  threading.Timer(1.2, stop._handle, args=(signal.SIGTERM, None)).start()
  result, _ = run(harness, tmp_path, stop=stop)
  assert result.exit_code == errors.ExitCode.PREEMPTED
  assert polls and not any(polls)  # None once the stop was there to pass on.


# A coordinator stuck past its ps deadline: it ignores SIGTERM, writes its
# stacks on SIGUSR1 as `tfps run` does, and never exits by itself.
STUCK = """
import faulthandler, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
print("ready", flush=True)
def waiting_on_the_network():
  time.sleep(60)
waiting_on_the_network()
"""


def test_a_coordinator_past_the_ps_deadline_is_killed_after_its_stacks_as_a_ps_loss(tmp_path):
  from tfps.cluster import spec as spec_lib
  ps0 = spec_lib.TaskId(spec_lib.JobType.PS, 0)
  # ps:0 never answers the first one.
  harness = Harness([None, 0], ps_addresses={ps0: "10.0.0.3:2222"})
  stderr_path = tmp_path / "stuck.stderr"
  start_planned = harness.start

  def start(attempt, excluded):
    if attempt > 0:
      return start_planned(attempt)
    with open(stderr_path, "w") as err:
      process = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE,
                                 stderr=err, text=True)
    assert process.stdout.readline().strip() == "ready"
    harness.started.append(process)
    return process

  harness.start = start
  ticks = iter(range(10_000))
  result, log = supervise(harness, tmp_path, probe_seconds=1.0, ps_deadline_seconds=5.0,
                          clock=lambda: float(next(ticks)))
  assert result == supervisor.SupervisorResult(errors.ExitCode.OK, 1, "finished")
  assert harness.started[0].returncode == -signal.SIGKILL
  assert "in waiting_on_the_network" in stderr_path.read_text()  # Its stacks, first.
  died, failure, action, recovered = log.read()
  assert (died.kind, died.task, died.signal) == ("died", "coordinator", "SIGKILL")
  assert died.detail.endswith("killed by the supervisor: missed its ps deadline")
  assert failure.failure == Kind.PS_LOST.value and failure.task == "chief:0"
  assert failure.detail.startswith(
      "coordinator stopped by the supervisor: lost the cluster: ps:0 (10.0.0.3:2222) did not "
      "answer for 5s (no ps and no worker answers: this chief is cut off from the cluster), and "
      "the coordinator had not exited by itself"), failure.detail
  assert action.action == policy.Action.WAIT_AND_RESTART.value
  assert harness.cluster_waits == 1 and recovered.kind == "recovered"
  harness.started[0].stdout.close()
  harness.started[1].stdout.close()


def test_a_ps_that_answers_again_in_time_is_not_a_loss(tmp_path):
  from tfps.cluster import spec as spec_lib
  ps0 = spec_lib.TaskId(spec_lib.JobType.PS, 0)
  answers = iter([set(), set(), {ps0}, set(), set(), {ps0}])  # Blips, never 5 s long.
  stop = signals.StopSignals()

  def probe():
    reachable = next(answers, None)
    if reachable is None:
      stop._handle(signal.SIGTERM, None)  # Seen every answer: end the run.
      return {ps0}
    return reachable

  harness = Harness(["wait", 0], up=probe, ps_addresses={ps0: "10.0.0.3:2222"})
  ticks = iter(range(10_000))
  result, log = supervise(harness, tmp_path, stop=stop, probe_seconds=1.0,
                          ps_deadline_seconds=5.0, clock=lambda: float(next(ticks)))
  assert result.exit_code == errors.ExitCode.PREEMPTED
  assert harness.started[0].returncode == 143 and log.read() == []
  harness.started[0].stdout.close()


def test_worker_gone_then_back_restarts_the_coordinator_without_then_with_it(tmp_path):
  from tfps.cluster import spec as spec_lib
  from tfps.recovery import task_watch
  w0, w1 = (spec_lib.TaskId(spec_lib.JobType.WORKER, i) for i in range(2))
  exclusions = []
  up = {w0}  # worker:1 is down until the coordinator has been restarted without it.
  harness = Harness(["wait", "wait", 0], up=lambda: up)
  start_planned = harness.start

  def start(attempt, excluded):
    exclusions.append(set(excluded))
    if attempt == 1:
      up.add(w1)  # ...then it returns.
    return start_planned(attempt)

  harness.start = start
  ticks = iter(range(10_000))
  result, log = supervise(
      harness, tmp_path, probe_seconds=1.0, clock=lambda: float(next(ticks)),
      watch=task_watch.TaskWatch([w0, w1], task_watch.TaskWatchConfig(
          timeout=3.0, readmit_after=2.0)))
  assert result.exit_code == errors.ExitCode.OK
  assert exclusions == [set(), {w1}, set()]
  assert [p.returncode for p in harness.started] == [143, 143, 0]  # Asked to save and stop.
  gone = [e for e in log.read() if e.failure == Kind.WORKER_GONE.value]
  assert [(e.kind, e.task) for e in gone] == [("failure", "worker:1"), ("action", "worker:1")]
  assert gone[1].action == policy.Action.RESTART_WITHOUT_TASK.value
  changes = [(e.task, e.task_change, e.tasks_left_out) for e in log.read()
             if e.task_change is not None]
  assert changes == [("worker:1", "gone", ("worker:1",)), ("worker:1", "back", ())]
  assert harness.cluster_waits == 0


def test_elastic_workers_start_on_those_that_answer_and_take_in_one_that_joins(tmp_path):
  from tfps.cluster import spec as spec_lib
  from tfps.recovery import task_watch
  w0, w1, w2 = (spec_lib.TaskId(spec_lib.JobType.WORKER, i) for i in range(3))
  exclusions = []
  up = set()  # No worker answers at first: the supervisor waits for min_workers.
  harness = Harness(["wait", 0], up=lambda: up, workers=(w0, w1, w2))
  start_planned = harness.start

  def start(attempt, excluded):
    exclusions.append(set(excluded))
    if attempt == 0:
      up.add(w2)  # A worker joins the running job.
    return start_planned(attempt)

  harness.start = start
  ticks = iter(range(10_000))

  def clock():
    now = float(next(ticks))
    if now >= 3:
      up.update({w0, w1})  # The launched workers answer.
    return now

  stop = signals.StopSignals()
  stop.wait = lambda timeout=None: False  # The fake clock moves on each call instead.
  result, log = supervise(
      harness, tmp_path, stop=stop, probe_seconds=1.0, clock=clock, min_workers=2,
      watch=task_watch.TaskWatch([w0, w1, w2], task_watch.TaskWatchConfig(
          timeout=3.0, readmit_after=2.0, min_workers=2)))
  assert result.exit_code == errors.ExitCode.OK
  assert exclusions == [{w2}, set()]  # Started on w0 and w1; w2 taken in when it answered.
  changes = [(e.task, e.task_change) for e in log.read() if e.task_change is not None]
  assert changes == [("worker:2", "back")]
  assert harness.cluster_waits == 0  # Every ps answered (there is none here).


def test_too_few_workers_for_min_workers_end_the_run_retryable(tmp_path):
  from tfps.cluster import spec as spec_lib
  workers = [spec_lib.TaskId(spec_lib.JobType.WORKER, i) for i in range(2)]
  harness = Harness([0], up={workers[0]}, workers=workers)
  ticks = iter(range(10_000))
  stop = signals.StopSignals()
  stop.wait = lambda timeout=None: False
  result, log = supervise(harness, tmp_path, stop=stop, clock=lambda: float(next(ticks)),
                          min_workers=2, cluster_wait_seconds=30.0)
  assert result.exit_code == errors.ExitCode.CLUSTER_LOST
  assert "fewer workers than --min_workers=2 answered for 30s (1 of 2)" in result.reason
  assert harness.started == []  # Nothing trains below min_workers.
  assert [e.action for e in log.read()] == [policy.Action.GIVE_UP.value]


@pytest.mark.parametrize("due_from_probe", [0, 20])
def test_ps_failover_restarts_at_once_without_the_lost_ps_and_takes_it_back(
    tmp_path, due_from_probe):
  from tfps.cluster import spec as spec_lib
  from tfps.recovery import task_watch
  p0, p1 = (spec_lib.TaskId(spec_lib.JobType.PS, i) for i in range(2))
  w0 = spec_lib.TaskId(spec_lib.JobType.WORKER, 0)
  exclusions, waited_for, probes = [], [], []
  # The first coordinator loses ps:0 (exit 170) while ps:0 is down; the
  # second runs without it, ps:0 silent for longer than the ps deadline,
  # until the watch has seen ps:0 answer again for ps_readmit_after.

  def probe():
    probes.append(len(exclusions))
    back = len(exclusions) == 2 and probes.count(2) > 8
    return {p0, p1, w0} if len(exclusions) != 1 and (len(exclusions) != 2 or back) \
        else {p1, w0}

  due_calls = []

  def ps_back_due():  # The launcher's judgement (recovery.readmission).
    due_calls.append(probes.count(2))
    return probes.count(2) >= due_from_probe

  harness = Harness([170, "wait", 0], up=probe, ps_back_due=ps_back_due,
                    ps_addresses={p0: "10.0.0.2:2222", p1: "10.0.0.3:2222"})
  start_planned = harness.start
  wait_planned = harness.wait_until_reachable

  def start(attempt, excluded):
    exclusions.append(set(excluded))
    started_at.append(probes.count(2))
    return start_planned(attempt)

  def wait_until_reachable(seconds, excluded):
    waited_for.append(set(excluded))
    return wait_planned(seconds, excluded)

  started_at = []
  harness.start, harness.wait_until_reachable = start, wait_until_reachable
  ticks = iter(range(10_000))
  result, log = supervise(
      harness, tmp_path, probe_seconds=1.0, clock=lambda: float(next(ticks)),
      ps_deadline_seconds=5.0,  # ps:0 is silent while left out: no concern of the deadline.
      policy=policy.RestartPolicy(ps_failover=True),
      watch=task_watch.TaskWatch([w0], task_watch.TaskWatchConfig(ps_readmit_after=4.0),
                                 ps=[p0, p1]))
  assert result.exit_code == errors.ExitCode.OK
  assert exclusions == [set(), {p0}, set()]
  assert waited_for == [{p0}]  # The restart did not wait for the lost ps.
  assert [p.returncode for p in harness.started] == [170, 143, 0]  # Saved, then taken back.
  entries = log.read()
  action = [e for e in entries if e.kind == "action"][0]
  assert action.action == policy.Action.RESTART_WITHOUT_TASK.value and "ps:0" in action.detail
  assert "without ps:0" in [e for e in entries if e.kind == "recovered"][0].detail
  assert [(e.task, e.task_change, e.tasks_left_out) for e in entries
          if e.task_change is not None] == [("ps:0", "back", ())]
  assert events.summarize(entries)["restarts"] == 1
  # Asked only while a ps is left out; taken back once it has answered for
  # ps_readmit_after (4 probes after it answers again at probe 9) and is due.
  assert due_calls and all(n > 0 for n in due_calls)
  assert started_at[2] == max(13, due_from_probe)


def test_a_launcher_is_closed_even_when_starting_a_coordinator_raises(tmp_path):
  harness = Harness([])

  def start(attempt, excluded):
    raise OSError("no such file: python")

  harness.start = start
  with pytest.raises(OSError):
    supervise(harness, tmp_path)


def test_a_missing_or_garbled_exit_report_says_nothing(tmp_path):
  path = tmp_path / "exit.json"
  assert exit_report.take(str(path)) is None
  path.write_text("{not json")
  assert exit_report.take(str(path)) is None
  exit_report.write("bad_checkpoint", "checkpoint x does not fit", path=str(path))
  assert exit_report.take(str(path)) == exit_report.ExitReport(
      "bad_checkpoint", "checkpoint x does not fit")


def test_a_worker_silent_for_a_while_is_said_once_and_again_when_it_answers(tmp_path, caplog):
  from tfps.cluster import spec as spec_lib
  from tfps.recovery import task_watch
  w0, w1 = (spec_lib.TaskId(spec_lib.JobType.WORKER, i) for i in range(2))
  stop = signals.StopSignals()
  stop.wait = lambda timeout=None: False  # The fake clock moves on each call instead.
  ticks = iter(range(10_000))

  def clock():
    now = float(next(ticks))
    if now >= 10:
      stop.signum = signal.SIGTERM  # Ends the run: the coordinator saves and exits.
    return now

  # worker:1 answers, is silent for the 2nd to 6th probes (a pause), then answers again.
  probes = iter(range(10_000))
  harness = Harness(["wait"], up=lambda: {w0} if 1 <= next(probes) < 6 else {w0, w1})
  result, log = supervise(
      harness, tmp_path, stop=stop, probe_seconds=1.0, clock=clock,
      watch=task_watch.TaskWatch([w0, w1], task_watch.TaskWatchConfig(
          timeout=60.0, notice_after=4.0)))
  assert result.exit_code == errors.exit_code_for_signal(signal.SIGTERM)
  said = [r.getMessage() for r in caplog.records if "worker:1" in r.getMessage()]
  assert len(said) == 2, said
  assert said[0].startswith("worker:1 has not answered for 4s") and "left out after 60s" in said[0]
  assert said[1].startswith("worker:1 answers again after 5s"), said
  assert not [e for e in log.read() if e.failure == Kind.WORKER_GONE.value]  # Not left out.
