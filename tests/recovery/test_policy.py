"""The restart policy (tfps.recovery.policy) is pure: plain parametrized tests, no TF."""

import pytest

from tfps.base import errors
from tfps.recovery import policy

Kind = policy.FailureKind
Action = policy.Action

Kind = policy.FailureKind
Action = policy.Action


@pytest.mark.parametrize("kind, action", [
    (Kind.WORKER_LOST, Action.CONTINUE),
    (Kind.WORKER_GONE, Action.RESTART_WITHOUT_TASK),
    (Kind.PS_LOST, Action.WAIT_AND_RESTART),
    (Kind.CLUSTER_UNREACHABLE, Action.WAIT_AND_RESTART),
    (Kind.CHIEF_LOST, Action.WAIT_AND_RESTART),
    (Kind.TASK_NOTICE, Action.SAVE_NOW),
    (Kind.CHIEF_NOTICE, Action.SAVE_AND_EXIT),
    (Kind.USER_ERROR, Action.GIVE_UP),
    (Kind.NAN_LOSS, Action.GIVE_UP),
    (Kind.BAD_CONFIG, Action.GIVE_UP),
    (Kind.BAD_CHECKPOINT, Action.GIVE_UP),
])
def test_failure_matrix(kind, action):
  decision = policy.RestartPolicy().decide(kind, policy.RestartHistory(), now=0.0)
  assert decision.action == action
  # Only a decision that ends the run carries an exit code.
  assert (decision.exit_code is not None) == (action == Action.GIVE_UP)


def history(*restarts, progress_at=float("-inf")):
  return policy.RestartHistory(tuple(restarts), progress_at)


@pytest.mark.parametrize("kind, exit_code", [
    (Kind.BAD_CONFIG, errors.ExitCode.USAGE), (Kind.USER_ERROR, errors.ExitCode.PERMANENT),
    (Kind.NAN_LOSS, errors.ExitCode.PERMANENT), (Kind.BAD_CHECKPOINT, errors.ExitCode.PERMANENT)])
def test_permanent_failures_are_never_retried_even_with_budget_left(kind, exit_code):
  decision = policy.RestartPolicy(max_restarts=100).decide(kind, history(), 0.0)
  assert decision.action == Action.GIVE_UP and "permanent" in decision.reason
  assert decision.exit_code == exit_code


def test_restart_budget_stops_a_crash_loop():
  rule = policy.RestartPolicy(max_restarts=3, window_seconds=60)
  assert rule.decide(Kind.PS_LOST, history(10, 20), now=30).action == Action.WAIT_AND_RESTART
  decision = rule.decide(Kind.PS_LOST, history(10, 20, 25), now=30)
  assert decision.action == Action.GIVE_UP and decision.exit_code == errors.ExitCode.PERMANENT
  assert "3 restarts in the last 60s (max 3)" in decision.reason


def test_old_restarts_fall_out_of_the_window():
  rule = policy.RestartPolicy(max_restarts=2, window_seconds=60)
  assert rule.decide(Kind.PS_LOST, history(0, 5), now=70).action == Action.WAIT_AND_RESTART


def test_a_budget_over_the_whole_run_never_forgets():
  rule = policy.RestartPolicy(max_restarts=2, window_seconds=float("inf"))
  decision = rule.decide(Kind.CHIEF_LOST, history(0, 5), now=1e9)
  assert decision.action == Action.GIVE_UP
  assert decision.reason == "restart budget spent: 2 restarts (max 2)"


def test_restarts_followed_by_progress_are_forgiven():
  rule = policy.RestartPolicy(max_restarts=2, window_seconds=600)
  spent = history(10, 20)
  assert rule.decide(Kind.PS_LOST, spent, now=30).action == Action.GIVE_UP
  forgiven = spent.progressed(25)
  assert forgiven.unproductive == () and len(forgiven.restarts) == 2
  assert rule.decide(Kind.PS_LOST, forgiven, now=30).action == Action.WAIT_AND_RESTART
  again = forgiven.restarted(30).restarted(40)
  assert again.unproductive == (30, 40)
  assert rule.decide(Kind.PS_LOST, again, now=50).action == Action.GIVE_UP


P0, P1, P2 = (f"ps:{i}" for i in range(3))
ALL_PS = frozenset({P0, P1, P2})


@pytest.mark.parametrize("kind", [Kind.PS_LOST, Kind.CLUSTER_UNREACHABLE, Kind.CHIEF_LOST])
@pytest.mark.parametrize("failover, down, action, leave_out", [
    (True, {P0}, Action.RESTART_WITHOUT_TASK, {P0}),
    (True, {P0, P2}, Action.RESTART_WITHOUT_TASK, {P0, P2}),
    (True, set(), Action.WAIT_AND_RESTART, set()),  # Back already: with every ps.
    (True, {P0, P1, P2}, Action.WAIT_AND_RESTART, set()),  # None answers: wait for them.
    (False, {P0}, Action.WAIT_AND_RESTART, set()),
])
def test_ps_failover_restarts_without_the_ps_that_do_not_answer(kind, failover, down, action,
                                                                leave_out):
  decision = policy.RestartPolicy(ps_failover=failover).decide(
      kind, history(), 0.0, ps=ALL_PS, ps_down=frozenset(down))
  assert (decision.action, decision.leave_out) == (action, frozenset(leave_out))
  if leave_out:
    assert "ps failover" in decision.reason and sorted(leave_out)[0] in decision.reason


def test_ps_failover_spends_the_restart_budget_like_any_restart():
  rule = policy.RestartPolicy(max_restarts=2, window_seconds=60, ps_failover=True)
  decision = rule.decide(Kind.PS_LOST, history(10, 20), now=30, ps=ALL_PS,
                         ps_down=frozenset({P0}))
  assert decision.action == Action.GIVE_UP and not decision.leave_out


def test_ps_failover_is_not_for_failures_that_restart_nothing():
  rule = policy.RestartPolicy(ps_failover=True)
  for kind in (Kind.WORKER_LOST, Kind.TASK_NOTICE, Kind.USER_ERROR):
    assert not rule.decide(kind, history(), 0.0, ps=ALL_PS, ps_down=frozenset({P0})).leave_out


def test_budget_does_not_apply_to_actions_without_restart():
  rule = policy.RestartPolicy(max_restarts=0)
  assert rule.decide(Kind.WORKER_LOST, history(1, 2, 3), now=4).action == Action.CONTINUE
  assert rule.decide(Kind.TASK_NOTICE, history(1, 2, 3), now=4).action == Action.SAVE_NOW


@pytest.mark.parametrize("code, kind", [
    (0, None), (2, Kind.BAD_CONFIG), (1, Kind.USER_ERROR), (3, Kind.USER_ERROR),
    (170, Kind.PS_LOST), (-9, Kind.CHIEF_LOST), (143, Kind.CHIEF_LOST), (137, Kind.CHIEF_LOST),
])
def test_classify_exit(code, kind):
  assert policy.classify_exit(code) == kind


@pytest.mark.parametrize("code, reported, kind", [
    (1, "nan_loss", Kind.NAN_LOSS), (1, "bad_checkpoint", Kind.BAD_CHECKPOINT),
    (1, "ps_lost", Kind.USER_ERROR),  # A report never turns exit 1 into a restart.
    (170, "bad_checkpoint", Kind.PS_LOST), (2, "nan_loss", Kind.BAD_CONFIG)])
def test_an_exit_report_refines_only_a_permanent_exit(code, reported, kind):
  assert policy.classify_exit(code, reported) == kind


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_restarts=-1), r"max_restarts \(-1\)"),
    (dict(window_seconds=0), r"window_seconds \(0\)"),
])
def test_policy_validation_names_field_and_value(kwargs, message):
  with pytest.raises(ValueError, match=message):
    policy.RestartPolicy(**kwargs)


def test_a_standby_chief_takes_over_without_the_ps_that_do_not_answer_if_others_do():
  ps = frozenset({"ps:0", "ps:1"})
  failover = policy.RestartPolicy(ps_failover=True)
  assert failover.left_out_at_takeover(ps, frozenset({"ps:1"})) == {"ps:1"}
  assert failover.left_out_at_takeover(ps, ps) == frozenset()  # None answers: wait for all.
  assert failover.left_out_at_takeover(ps, frozenset()) == frozenset()
  assert policy.RestartPolicy(ps_failover=False).left_out_at_takeover(
      ps, frozenset({"ps:1"})) == frozenset()
