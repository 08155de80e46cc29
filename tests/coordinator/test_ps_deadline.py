"""The coordinator's ps deadline (tfps.coordinator.ps_deadline): the thread, with a fake
probe and clock; its counter: recovery/test_overdue.py."""

import threading

import pytest

from tfps.cluster import spec as spec_lib
from tfps.cluster.readiness import Answer
from tfps.cluster import processes
from tfps.coordinator import ps_deadline

from tests.support import fakes

CLUSTER = spec_lib.ClusterSpec.from_dict({
    "chief": ["10.213.0.2:2222"], "ps": ["10.213.0.3:2222", "10.213.0.4:2222"],
    "worker": ["10.213.0.5:2222"]})
PS0, PS1 = (spec_lib.TaskId(spec_lib.JobType.PS, i) for i in range(2))
W0 = spec_lib.TaskId(spec_lib.JobType.WORKER, 0)


def _answers(reachable, refused=frozenset()):
  """A probe round: `reachable` answered, `refused` refused, the rest silent."""
  return {t: (Answer.READY if t in reachable else Answer.REFUSED if t in refused
              else Answer.SILENT) for t in (PS0, PS1, W0)}


def _run_until_overdue(answers, state_lost=None, interval=0.01, connecting=False):
  """Runs the thread against `answers` (one reachable set, or answers, per probe round)."""
  clock = fakes.FakeClock()
  fired = threading.Event()
  messages = []
  rounds = iter(answers)

  def probe(tasks):
    assert set(tasks) == {PS0, PS1, W0}
    clock.now += 5
    answer = next(rounds)
    return answer if isinstance(answer, dict) else _answers(answer)

  def on_overdue(message):
    messages.append(message)
    fired.set()

  with ps_deadline.PsDeadline(CLUSTER, 12, interval=interval, probe=probe, on_overdue=on_overdue,
                              clock=clock, state_lost=state_lost, connecting=connecting):
    assert fired.wait(timeout=10), "the deadline never fired"
  return messages


def test_a_silent_ps_ends_the_run_naming_it():
  (message,) = _run_until_overdue([{PS0, PS1, W0}, {PS0, W0}, {PS0, W0}, {PS0, W0}, {PS0, W0}])
  assert "ps:1 (10.213.0.4:2222) did not answer for 12s" in message
  assert "partitioned or hung" in message


def test_a_chief_that_sees_nobody_says_it_is_cut_off():
  (message,) = _run_until_overdue([set()] * 5)
  assert "ps:0 (10.213.0.3:2222), ps:1 (10.213.0.4:2222) did not answer" in message
  assert "this chief is cut off from the cluster" in message


def test_stopping_before_the_deadline_fires_nothing():
  probed = threading.Event()

  def probe(tasks):
    probed.set()
    return _answers(set())

  with ps_deadline.PsDeadline(CLUSTER, 1000, interval=0.01, probe=probe,
                              on_overdue=lambda m: pytest.fail(m)) as deadline:
    assert probed.wait(timeout=10), "never probed"
  assert not deadline._thread.is_alive()


def test_a_ps_that_refuses_twice_in_a_row_is_gone_long_before_the_timeout():
  # Its process is gone: no server listens. One refusal is a blip; two are a loss.
  rounds = [_answers({PS0, W0}, refused={PS1}), _answers({PS0, PS1, W0}),
            _answers({PS0, W0}, refused={PS1}), _answers({PS0, W0}, refused={PS1})]
  (message,) = _run_until_overdue(rounds)
  assert message.startswith("lost the cluster: ps:1 (10.213.0.4:2222) refused connections "
                            "2 times in a row (its process is gone"), message


def test_a_refusal_is_probed_again_at_once_not_after_the_interval():
  # An hour between rounds: only the first round (at once) and a quick second
  # one after the refusal can end this within the wait's 10 s.
  rounds = [_answers({PS0, W0}, refused={PS1})] * 2
  (message,) = _run_until_overdue(rounds, interval=3600)
  assert "ps:1 (10.213.0.4:2222) refused connections 2 times in a row" in message


def test_a_chief_whose_link_is_down_is_cut_off_not_a_ps_gone():
  # With its own link down every connection fails at once (no route), the
  # workers' too: that is the chief cut off, said as such, and without waiting.
  everyone = {PS0, PS1, W0}
  (message,) = _run_until_overdue([_answers(set(), refused=everyone)] * 2)
  assert "refused connections 2 times in a row" in message
  assert "this chief is cut off from the cluster" in message, message


def test_a_ps_back_at_once_but_empty_is_lost_at_the_next_probe():
  # Killed and started again between two probes: it answers, but holds nothing.
  lost = lambda task: "ps:0 lost its variables (it restarted, or is down)" if task == PS0 else None
  (message,) = _run_until_overdue([{PS0, PS1, W0}] * 3, state_lost=lost)
  assert message.startswith("lost the cluster: ps:0 lost its variables"), message


def test_while_connecting_a_worker_that_went_away_ends_the_connect_naming_it():
  """TF's connect waits for every task with no deadline: a worker killed during it."""
  (message,) = _run_until_overdue([_answers({PS0, PS1}, refused={W0})] * 3, connecting=True)
  assert "worker:0 (10.213.0.5:2222) refused connections 2 times in a row" in message
  assert "TensorFlow's connect would wait for it" in message


def test_after_the_connect_a_worker_that_went_away_is_not_the_deadlines_business():
  fired = []
  clock = fakes.FakeClock()
  rounds = []

  def probe(tasks):
    rounds.append(1)
    clock.now += 5
    return _answers({PS0, PS1}, refused={W0})

  with ps_deadline.PsDeadline(CLUSTER, 12, interval=0.01, probe=probe, on_overdue=fired.append,
                              clock=clock):
    processes.wait_until(lambda: len(rounds) >= 5, timeout=10, what="5 probe rounds")
  assert not fired  # TF puts its closures back; the loop goes on.
