"""A short `tfps chaos` run on virtual hosts: its report, its checks and its picture, through a
worker SIGKILL and a standby chief taking over twice: from a paused chief, which wakes fenced,
and from a chief cut off from the network."""

import json
import os

import pytest

from tests.support import chief_run
from tfps.cluster import hosts

pytestmark = pytest.mark.cluster


def test_short_chaos_run_recovers_a_worker_and_two_chief_takeovers(tfps, tmp_path):
  # What is checked here is chaos's own machinery (the fault, the tracker, the
  # input accounting, goodput, the timeline) and the standby chief's split
  # cases: chief:0 is paused (SIGSTOP) longer than its lease, chief:1 takes
  # over; chief:0 wakes superseded, its coordinator is stopped before it writes,
  # and it stands by. Then chief:1 is cut off from the network: seeing no ps, it
  # lets its lease lapse and chief:0 takes over again; healed, chief:1 stands by.
  # A killed chief that never returns: the orchestrator's and the replica's unit
  # tests, and `tfps chaos --chief_standby` (docs/recovery.md). Every other kind
  # of fault is recovered in e2e/test_failure_matrix.py, on a shared cluster.
  if (reason := hosts.unavailable()) is not None:
    pytest.skip(f"virtual hosts unavailable: {reason}")
  result = tfps([
      "chaos", f"--model_dir={tmp_path}", "--num_ps=1", "--num_workers=2",
      f"--experiment_params={chief_run.SMALL_CTR}", "--global_batch_size=128",
      # Placed by step: each lands while training runs, however fast the host.
      "--hosts=netns", "--chief_standby",
      "--faults=worker:1@step100:kill+2,chief:0@step300:stop+6,chief:1@step600:cut+5",
      "--train_steps=1000", "--steps_per_loop=100", "--checkpoint_interval=200",
      "--steps_per_closure=10",  # Less to trace at each coordinator start.
      "--worker_timeout=60"], timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  (line,) = [l for l in result.stdout.splitlines() if l.strip()]
  report = json.loads(line)
  assert report["status"] == "ok" and all(report["checks"].values()), report
  assert report["skipped_checks"] == [], report
  assert report["faults_injected"] == report["recoveries"] == 3
  assert [f["target"] for f in report["faults"]] == ["worker:1", "chief:0", "chief:1"]
  assert [f["action"] for f in report["faults"]] == ["kill", "stop", "cut"]
  assert all(f["seconds_to_recover"] > 0 for f in report["faults"])
  assert all(f["longest_stall_seconds"] > 0 for f in report["faults"])
  assert report["recovery_seconds"]["max"] >= report["recovery_seconds"]["p50"] > 0
  assert report["global_step"] >= 1000 and report["eval"]["auc"] > 0.5
  # The fault's victim, and no other process, died (a paused or cut chief is no death).
  assert report["deaths"] == {"worker:1": 1}, report["deaths"]
  # The input accounting (the ctr's files, positioned) and the run's picture.
  assert report["checks"]["input_covered"] and report["input"]["never_trained"] == 0, report
  assert report["input"]["trained_twice"] == 0, report["input"]
  assert 0 < report["goodput"]["goodput"] <= 1.0, report["goodput"]
  with open(report["timeline"], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  # Two takeovers, each replica superseded once; the progress records of the
  # three lease generations in that order.
  with open(tmp_path / "events.jsonl") as f:
    events = [json.loads(l) for l in f if l.strip()]
  assert [e["task"] for e in events if e.get("action") == "standby_chief_takes_over"] == [
      "chief:1", "chief:0"], events
  for chief in ("chief:0", "chief:1"):
    assert any(e["task"] == chief and "superseded" in e["detail"] for e in events), events
  with open(tmp_path / "progress.jsonl") as f:
    generations = [json.loads(l).get("generation") for l in f if l.strip()]
  assert sorted(set(generations)) == [1, 2, 3], generations
