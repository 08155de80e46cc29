"""`tfps chaos`'s checks of a run's result (tfps.commands.chaos)."""

import pytest

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
