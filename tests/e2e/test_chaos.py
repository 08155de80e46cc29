"""A short `tfps chaos` run: its report, its checks and its picture, through a worker SIGKILL."""

import json
import os

import pytest

from tests.support import chief_run

pytestmark = pytest.mark.cluster


def test_short_chaos_run_recovers_every_fault(tfps, tmp_path):
  # One worker kill: what is checked here is chaos's own machinery (the fault, the
  # tracker, the input accounting, goodput, the timeline). Every kind of fault is
  # recovered in e2e/test_failure_matrix.py, on a shared cluster; a chief kill
  # here would cost a cold coordinator start (~20 s) for nothing more. Nothing
  # restarts the coordinator, so no warm standby is made.
  result = tfps([
      "chaos", f"--model_dir={tmp_path}", "--num_ps=1", "--num_workers=2",
      f"--experiment_params={chief_run.SMALL_CTR}", "--global_batch_size=128",
      # Placed by step: each lands while training runs, however fast the host.
      "--faults=worker:1@step100:kill+2", "--nowarm_standby",
      "--train_steps=1000", "--steps_per_loop=100", "--checkpoint_interval=200",
      "--steps_per_closure=10",  # Less to trace at each coordinator start.
      "--worker_timeout=60"], timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  (line,) = [l for l in result.stdout.splitlines() if l.strip()]
  report = json.loads(line)
  assert report["status"] == "ok" and all(report["checks"].values()), report
  assert report["skipped_checks"] == [], report
  assert report["faults_injected"] == report["recoveries"] == 1
  assert [f["target"] for f in report["faults"]] == ["worker:1"]
  assert [f["signal"] for f in report["faults"]] == ["SIGKILL"]
  assert all(f["seconds_to_recover"] > 0 for f in report["faults"])
  assert all(f["longest_stall_seconds"] > 0 for f in report["faults"])
  assert report["recovery_seconds"]["max"] >= report["recovery_seconds"]["p50"] > 0
  assert report["global_step"] >= 1000 and report["eval"]["auc"] > 0.5
  # The fault's victim, and no other process, died.
  assert report["deaths"] == {"worker:1": 1}, report["deaths"]
  assert os.path.exists(tmp_path / "events.jsonl")
  # The input accounting (the ctr's files, positioned) and the run's picture.
  assert report["checks"]["input_covered"] and report["input"]["never_trained"] == 0, report
  assert 0 < report["goodput"]["goodput"] <= 1.0, report["goodput"]
  with open(report["timeline"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
