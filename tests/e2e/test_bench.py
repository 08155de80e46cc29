"""`tfps bench`: runs end to end and emits its JSON fields (no timing assertions)."""

import json

import pytest

pytestmark = pytest.mark.cluster

VARIANTS = ("single_process", "tutorial", "model_garden", "tfps")


def test_bench_runs_every_variant_and_prints_the_json_fields(tfps, tmp_path):
  # A test-sized run: the tiny model, short windows (not --quick, whose own
  # 200-step windows would override these), one worker (one TF import less);
  # two ps, so that the tutorial's table is split.
  result = tfps(["bench", "--bench_sizes=tiny", "--window_steps=40", "--num_workers=1",
                 "--warmup_steps=10", "--steps_per_loop=20", "--steps_per_closure=10",
                 "--global_batch_size=64", f"--model_dir={tmp_path}"], timeout=240)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [l for l in result.stdout.splitlines() if l.strip()]
  assert len(lines) == 1
  out = json.loads(lines[0])
  assert set(out["examples_per_sec"]) == set(VARIANTS)
  assert all(rate > 0 for rate in out["examples_per_sec"].values())
  assert out["ratio_vs_best_stock"] > 0 and out["ratio_vs_single_process"] > 0
  tiny = out["sizes"]["tiny"]
  assert len(set(tiny["steps"].values())) == 1  # AUC at equal steps.
  assert all(0.5 < auc <= 1.0 for auc in out["eval_auc"].values())
  assert out["closure_overhead_us"] > 0 and out["closure_overhead_us_stock"] > 0
  # Each stock pattern places variables as its source does; tfps by its default.
  assert {v: c["min_shard_bytes"] for v, c in out["setup"].items()} == {
      "tutorial": 256 << 10, "model_garden": None, "tfps": 64 << 20}
  assert out["machine"]["cores"] >= 1 and "before" in out["load_average"]
  assert "examples/s" in result.stderr and "model_garden" in result.stderr
