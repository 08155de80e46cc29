"""Which running closures are run again elsewhere (tfps.recovery.slow_closures): pure."""

import pytest

from tfps.recovery import slow_closures as slow
from tfps.recovery.slow_closures import Verdict

TIMED = [0.20] * 9 + [0.30]  # p90 0.20 s: overdue after max(0.40, 0.95) = 0.95 s.


def test_the_90th_percentile_is_a_nearest_rank():
  assert slow.percentile_90([0.1 * i for i in range(1, 11)]) == pytest.approx(0.9)
  assert slow.percentile_90([5.0]) == 5.0


def test_before_enough_closures_are_timed_only_a_silent_worker_loses_its_closure():
  few = TIMED[:7]
  assert slow.overdue_after(few) is None
  assert slow.judge(1.9, few, other_workers=1, answers=None) is Verdict.WAIT
  assert slow.judge(2.0, few, other_workers=1, answers=None) is Verdict.PROBE
  # A worker that answers keeps it, however long (it may be building its functions).
  assert slow.judge(100.0, few, other_workers=1, answers=True) is Verdict.WAIT
  # One silence is asked again; two in a row lose it.
  assert slow.judge(2.0, few, other_workers=1, answers=False, silent_probes=1) is Verdict.PROBE
  assert slow.judge(2.1, few, other_workers=1, answers=False, silent_probes=2) is Verdict.RERUN
  assert slow.judge(9.0, few, other_workers=0, answers=False, silent_probes=5) is Verdict.WAIT


def test_an_answer_is_asked_again_only_while_too_few_closures_are_timed():
  assert not slow.probe_again(1.9, TIMED[:7])
  assert slow.probe_again(2.0, TIMED[:7])
  assert not slow.probe_again(100.0, TIMED)  # Then patience bounds a worker that answers.


def test_overdue_after_twice_the_percentile_and_at_least_the_margin_beyond():
  assert slow.overdue_after(TIMED) == pytest.approx(0.95)  # The margin wins for fast ones.
  assert slow.overdue_after([2.0] * 10) == pytest.approx(4.0)  # Twice wins for slow ones.


def test_a_silent_worker_loses_an_overdue_closure_at_once():
  assert slow.judge(0.9, TIMED, other_workers=1, answers=None) is Verdict.WAIT
  assert slow.judge(1.0, TIMED, other_workers=1, answers=None) is Verdict.PROBE
  assert slow.judge(1.0, TIMED, other_workers=1, answers=False) is Verdict.RERUN


def test_a_worker_that_answers_keeps_its_closure_for_patience_times_the_expected():
  assert slow.judge(1.5, TIMED, other_workers=1, answers=True) is Verdict.WAIT
  assert slow.judge(1.59, [0.2] * 10, other_workers=1, answers=True) is Verdict.WAIT
  assert slow.judge(1.6, [0.2] * 10, other_workers=1, answers=True) is Verdict.RERUN


def test_no_rerun_without_another_worker():
  assert slow.judge(60.0, TIMED, other_workers=0, answers=False) is Verdict.WAIT


@pytest.mark.parametrize("rules", [dict(min_samples=0), dict(factor=0.5), dict(margin=-1),
                                   dict(patience=1.0), dict(cold_probe=0), dict(cold_silences=0)])
def test_rules_out_of_range_are_refused(rules):
  with pytest.raises(ValueError, match="slow-closure rules"):
    slow.Rules(**rules)
