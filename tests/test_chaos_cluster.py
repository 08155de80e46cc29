"""A short `tfps chaos` run: a worker, a ps and the chief hit by real signals."""

import json
import os

import pytest

pytestmark = pytest.mark.cluster

SMALL_CTR = "vocab_sizes=3000:2000:1000,embedding_dim=8,hidden=32:16,eval_examples=2048"


def test_short_chaos_run_recovers_every_fault(tfps, tmp_path):
  result = tfps([
      "chaos", f"--model_dir={tmp_path}", "--num_ps=1", "--num_workers=2",
      f"--experiment_params={SMALL_CTR}", "--global_batch_size=128",
      # Faults count from the coordinator's start; training begins ~5 s later
      # and runs ~250 steps/s here. By the last fault it has lost >= 5 s to
      # the ps restart, so at most ~1500 steps are done: 4000 outlasts every
      # fault even on a machine twice as fast (tfps chaos fails otherwise).
      "--faults=worker:1@3:kill+2,ps:0@8:term+2,chief:0@14:kill+2",
      "--train_steps=4000", "--steps_per_loop=100", "--checkpoint_interval=500",
      "--worker_timeout=60"], timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  (line,) = [l for l in result.stdout.splitlines() if l.strip()]
  report = json.loads(line)
  assert report["status"] == "ok" and all(report["checks"].values()), report
  assert report["faults_injected"] == report["recoveries"] == 3
  assert [f["target"] for f in report["faults"]] == ["worker:1", "ps:0", "chief:0"]
  assert [f["signal"] for f in report["faults"]] == ["SIGKILL", "SIGTERM", "SIGKILL"]
  assert all(f["seconds_to_recover"] > 0 for f in report["faults"])
  assert report["recovery_seconds"]["max"] >= report["recovery_seconds"]["p50"] > 0
  assert report["faults"][1]["steps_lost"] == 0  # A ps preempted with notice loses nothing.
  assert report["global_step"] >= 4000 and report["eval"]["auc"] > 0.5
  assert os.path.exists(tmp_path / "events.jsonl")
