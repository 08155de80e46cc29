"""`tfps local`'s orchestrator restarts a chief by the same policy as the supervisor.

The cluster and the chief are fakes (an exit code per start), so each
decision is checked without processes or TensorFlow.
"""

import pytest

from tfps.recovery import orchestrator
from tfps.recovery import events
from tfps.base import errors
from tfps.base import signals
from tfps.cluster import spec as spec_lib


class FakeTask:
  """A task whose successive starts end with the planned exit codes."""

  def __init__(self, task, plan):
    self.task, self.plan = task, list(plan)
    self.starts = 0
    self.returncode = None
    self.log_path = f"/logs/{task}.log"
    self.address = "127.0.0.1:1"
    self.pid = 1000

  def last_lines(self):
    return (f"{self.task}'s last words",)

  @property
  def alive(self):
    return self.returncode is None

  def start(self):
    self.returncode = self.plan[self.starts]
    self.starts += 1
    self.pid += 1


class FakeCluster:
  def __init__(self, *handles):
    self.tasks = {h.task: h for h in handles}


def run_to_outcome(chief_plan, max_restarts, worker_plan=(None,), event_log=None):
  chief = FakeTask(spec_lib.TaskId(spec_lib.JobType.CHIEF, 0), chief_plan)
  worker = FakeTask(spec_lib.TaskId(spec_lib.JobType.WORKER, 0), worker_plan)
  worker.start()
  runner = orchestrator.Orchestrator(FakeCluster(chief, worker), chief, signals.StopSignals(),
                                     max_restarts=max_restarts, event_log=event_log)
  runner.start()
  for _ in range(len(chief_plan) + len(worker_plan)):
    outcome = runner.poll()
    if outcome is not None:
      return outcome, runner, worker
  raise AssertionError(f"no outcome after {chief.starts} chief starts")


@pytest.mark.parametrize("plan, code", [
    ([0], errors.ExitCode.OK),
    ([143, 170, -9, 0], errors.ExitCode.OK),  # Retryable: restarted each time.
    ([1], errors.ExitCode.PERMANENT),
    ([2], errors.ExitCode.USAGE),
    ([143, 2], errors.ExitCode.USAGE),
])
def test_the_chief_is_restarted_only_on_retryable_codes(plan, code):
  outcome, runner, _ = run_to_outcome(plan, max_restarts=5)
  assert outcome.code == code and runner.chief_restarts == len(plan) - 1


def test_the_chiefs_restart_budget_counts_the_whole_run():
  outcome, runner, _ = run_to_outcome([143, 143, 143, 0], max_restarts=2)
  assert outcome.code == errors.ExitCode.PERMANENT and runner.chief_restarts == 2
  assert outcome.reason == ("chief:0 exited with code 143: restart budget spent: "
                            "2 restarts (max 2)")


def test_both_chief_replicas_are_run_and_restarted_and_either_ends_the_run():
  # chief:0 is killed for good (held by a chaos fault); chief:1, its standby,
  # exits 143 once (restarted), then finishes the run.
  c0 = FakeTask(spec_lib.TaskId(spec_lib.JobType.CHIEF, 0), [-9])
  c1 = FakeTask(spec_lib.TaskId(spec_lib.JobType.CHIEF, 1), [143, 0])
  runner = orchestrator.Orchestrator(FakeCluster(c0, c1), c0, signals.StopSignals(),
                                     max_restarts=3)
  runner.held.add(c0.task)
  runner.start()
  assert (c0.starts, c1.starts) == (1, 1)
  assert runner.poll() is None and c1.starts == 2 and runner.chief_restarts == 1
  outcome = runner.poll()
  assert outcome.code == errors.ExitCode.OK and c0.starts == 1


def test_a_ps_or_worker_that_exits_is_started_again_and_a_held_one_is_not():
  chief = FakeTask(spec_lib.TaskId(spec_lib.JobType.CHIEF, 0), [None])  # Runs on.
  w0, w1 = (FakeTask(spec_lib.TaskId(spec_lib.JobType.WORKER, i), [143, None]) for i in range(2))
  runner = orchestrator.Orchestrator(FakeCluster(chief, w0, w1), chief, signals.StopSignals(),
                                     max_restarts=0)
  runner.start()
  w0.start(), w1.start()
  runner.held.add(w1.task)  # A chaos fault holds it down.
  assert runner.poll() is None and runner.poll() is None
  assert (w0.starts, w1.starts, runner.task_restarts) == (2, 1, 1)


def test_every_death_is_an_event_once_and_a_permanent_task_exit_ends_the_run(tmp_path):
  log = events.EventLog(str(tmp_path))
  # The chief: killed by SIGSEGV, then 170 (a decision, not a death), then runs on;
  # the worker: killed, restarted, then exits 2 (bad flags: not retried).
  outcome, runner, worker = run_to_outcome([-11, 170, None], max_restarts=5,
                                           worker_plan=(-9, 2), event_log=log)
  assert outcome.code == errors.ExitCode.USAGE
  assert outcome.reason == "worker:0 exited with code 2 (permanent)"
  died = [e for e in log.read() if e.kind == "died"]
  assert [(e.task, e.signal, e.exit_code) for e in died] == [
      ("worker:0", "SIGKILL", None), ("chief:0", "SIGSEGV", None), ("worker:0", None, 2)]
  assert died[0].last_lines == ("worker:0's last words",) and died[0].pid == 1001
  assert events.summarize(log.read())["deaths"] == {"chief:0": 1, "worker:0": 2}
