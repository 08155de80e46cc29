"""`tfps chaos`: the checks of a run's result, and how its faults are injected and undone
(tfps.commands.chaos)."""

import pytest

from tfps.base import errors

pytestmark = pytest.mark.tf


def test_a_train_only_run_skips_the_eval_check_instead_of_failing_it(tmp_path):
  from tfps.commands import chaos as chaos_command  # pylint: disable=import-outside-toplevel
  result = {"global_step": 100, "eval": {}, "input": {"positioned": False}}
  checks = chaos_command._checks(result, 100, str(tmp_path))
  assert "eval_sane" not in checks and "input_covered" not in checks
  assert chaos_command.skipped_checks(checks) == ["input_covered", "eval_sane"]
  # Any experiment's metrics are judged, not the ctr's: finite numbers.
  assert chaos_command._checks(dict(result, eval={"accuracy": 0.3, "loss": 1.2}), 100,
                               str(tmp_path))["eval_sane"] is True
  bad_eval = dict(result, eval={"accuracy": 0.9, "loss": float("nan")})
  assert chaos_command._checks(bad_eval, 100, str(tmp_path))["eval_sane"] is False


class _Clock:
  """Stands in for the `time` module the injection loop reads; `wait` moves it on."""

  def __init__(self):
    self.now = 0.0

  def monotonic(self) -> float:
    return self.now

  def time(self) -> float:
    return 1000.0 + self.now


class _Handle:
  """A task's process as the injection loop drives it; `log` is what was done to it."""

  def __init__(self, name: str, log: list, clock: _Clock, exits_after: float = 0.0):
    self.name, self.log, self.clock = name, log, clock
    self.pid, self.alive, self.paused, self.returncode = 1, True, False, None
    self.exits_after, self._exits_at = exits_after, None

  def _do(self, what: str) -> None:
    self.log.append((round(self.clock.now, 2), self.name, what))

  def kill(self, sig) -> None:
    self._do(sig.name)
    if self.exits_after and sig.name == "SIGTERM":
      self._exits_at = self.clock.now + self.exits_after  # Saves first.
    else:
      self.alive, self.returncode = False, -sig.value

  def tick(self) -> None:
    if self._exits_at is not None and self.clock.now >= self._exits_at:
      self.alive, self.returncode, self._exits_at = False, 143, None

  def pause(self) -> None:
    self._do("SIGSTOP")

  def resume(self) -> None:
    self._do("SIGCONT")

  def start(self) -> None:
    assert not self.alive, f"{self.name} started while its process still runs"
    self._do("start")
    self.alive, self.pid = True, self.pid + 1

  def wait(self, timeout) -> None:
    self.alive = False


def _inject(faults: str, until: float, exits_after: float = 0.0) -> list:
  """`faults` (seconds from the start of training) injected into fake tasks until
  `until` seconds; what was done to each task, when."""
  from tfps.chaos import faults as faults_lib  # pylint: disable=import-outside-toplevel
  from tfps.chaos import tracker as tracker_lib  # pylint: disable=import-outside-toplevel
  from tfps.cluster import spec as spec_lib  # pylint: disable=import-outside-toplevel
  from tfps.commands import chaos as chaos_command  # pylint: disable=import-outside-toplevel
  from tfps.recovery import orchestrator  # pylint: disable=import-outside-toplevel
  from tfps.recovery import progress_log  # pylint: disable=import-outside-toplevel
  spec = spec_lib.ClusterSpec.from_dict({"chief": ["h:1"], "ps": ["h:2", "h:3"],
                                         "worker": ["h:4", "h:5"]})
  clock, log = _Clock(), []
  handles = {t: _Handle(str(t), log, clock, exits_after) for t in spec.tasks()}

  class Cluster:
    tasks = handles

  class Runner:
    held = set()

    def poll(self):
      for handle in handles.values():
        handle.tick()
      return orchestrator.Outcome(errors.ExitCode.OK, "done") if clock.now >= until else None

  class Stop:
    def wait(self, seconds):
      clock.now += seconds

  class Progress:  # Training runs from the start, one loop every second.
    def read_new(self):
      return [progress_log.Progress(step=int(clock.now) * 100, time=clock.time())]

  class Events:
    def read(self):
      return []

  pending = list(faults_lib.parse_faults(faults, spec))
  monkey = pytest.MonkeyPatch()
  monkey.setattr(chaos_command, "time", clock)
  try:
    chaos_command._inject_until_done(Cluster(), Runner(), Stop(), pending,
                                     tracker_lib.RecoveryTracker(), Progress(), Events(), "")
  finally:
    monkey.undo()
  assert not pending
  return log


def test_a_fault_on_a_task_still_down_waits_for_its_return_and_the_others_do_not():
  # worker:0 is killed twice 1 s apart, each back after 5 s. The second kill used to
  # find no process, and its return waited 30 s for the process the first's return
  # had started, then killed it; meanwhile ps:0, paused for 3 s, was not resumed.
  log = _inject("worker:0@1:kill+5,worker:0@2:kill+5,ps:0@3:stop+3", until=20)
  assert [(what, name) for _, name, what in log] == [
      ("SIGKILL", "worker:0"), ("SIGSTOP", "ps:0"), ("start", "worker:0"),
      ("SIGCONT", "ps:0"), ("SIGKILL", "worker:0"), ("start", "worker:0")]
  at = {(name, what, i): t for i, (t, name, what) in enumerate(log)}
  assert at[("ps:0", "SIGCONT", 3)] - at[("ps:0", "SIGSTOP", 1)] == pytest.approx(3, abs=0.3)
  assert at[("worker:0", "start", 2)] - at[("worker:0", "SIGKILL", 0)] == pytest.approx(5, abs=0.3)
  # The second kill once the first's return is in (at the next look), back 5 s later.
  assert at[("worker:0", "SIGKILL", 4)] - at[("worker:0", "start", 2)] == pytest.approx(
      0, abs=0.3)
  assert at[("worker:0", "start", 5)] - at[("worker:0", "SIGKILL", 4)] == pytest.approx(5, abs=0.3)


def test_a_sigtermed_task_still_saving_is_waited_for_without_holding_the_other_faults():
  log = _inject("chief:0@1:term+2,ps:1@2:stop+2", until=20, exits_after=6)
  assert [(what, name) for _, name, what in log] == [
      ("SIGTERM", "chief:0"), ("SIGSTOP", "ps:1"), ("SIGCONT", "ps:1"), ("start", "chief:0")]
  times = [t for t, _, _ in log]
  assert times[2] - times[1] == pytest.approx(2, abs=0.3)  # Not held by the chief's save.
  assert times[3] - times[0] == pytest.approx(6, abs=0.3)  # Started once it had exited.
