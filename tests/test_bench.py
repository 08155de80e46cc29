"""`tfps bench`: runs end to end and emits its JSON fields (no timing assertions)."""

import json
import os

from absl.testing import flagsaver
import pytest

from tfps.commands import bench as bench_command
from tfps.commands import cli
from tfps.bench import config as config_lib
from tfps.bench import report

VARIANTS = ("single_process", "tutorial", "model_garden", "tfps")


def _raw(rates):
  return {"noop_closure_us": 1234.0, "sizes": {"default": {
      variant: {"examples_per_sec": list(r), "window_seconds": [1.0] * len(r), "steps": 500,
                "eval_auc": 0.8, "cpu_ms_per_step": [{"chief": 1.0, "total": 1.0}] * len(r),
                **({"closures": 9, "schedule_us": 1500.0}
                   if variant != "single_process" else {})}
      for variant, r in rates.items()}}}


def test_summary_takes_medians_and_ratios_against_the_best_stock_pattern():
  summary = report.summarize(_raw({
      "single_process": (300, 100, 200), "tutorial": (40, 50, 60),
      "model_garden": (70, 80, 10), "tfps": (160, 150, 170)}))
  assert summary["examples_per_sec"] == {"single_process": 200, "tutorial": 50,
                                         "model_garden": 70, "tfps": 160}
  assert summary["ratio_vs_best_stock"] == pytest.approx(160 / 70, abs=1e-3)
  assert summary["ratio_vs_single_process"] == pytest.approx(0.8)
  assert summary["closure_overhead_us"] == 1234.0
  text = report.table(summary, repeats=3)
  assert "median of 3" in text and "model_garden" in text and "1,234 us" in text


def test_config_errors_name_field_and_value():
  with pytest.raises(config_lib.errors.UsageError, match=r"repeats \(0\) must be a positive"):
    config_lib.BenchConfig(repeats=0)
  with pytest.raises(config_lib.errors.UsageError, match=r"bench_sizes \('huge'\) must be one of"):
    config_lib.BenchConfig(sizes=("huge",))
  config = config_lib.BenchConfig(variants=("tfps",), sizes=("tiny",))
  assert config_lib.BenchConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize("args, window, warmup", [
    ([], 500, 200),
    (["--quick"], 200, 40),
    (["--quick", "--window_steps=30"], 30, 40),  # An explicit window flag wins.
])
def test_quick_shortens_only_the_windows_not_given(args, window, warmup):
  with flagsaver.flagsaver():
    cli.FLAGS(["tfps", *args])  # The command line's flags, as `tfps bench` parses them.
    config = bench_command.bench_config(cli.FLAGS)
  assert (config.window_steps, config.warmup_steps) == (window, warmup)


@pytest.mark.parametrize("args, expected", [
    (["--bench_sizes=huge"], "bench_sizes ('huge') must be one of default, dense, tiny"),
    (["--window_steps=0"], "window_steps (0) must be a positive integer"),
    (["--bench_variants=tfps,fast"], "bench_variants (tfps,fast) must be among"),
])
def test_bad_bench_flags_exit_2_with_one_line(tfps, args, expected):
  result = tfps(["bench", *args])
  assert result.returncode == 2, result.stderr
  lines = [l for l in result.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and expected in lines[0], result.stderr


@pytest.mark.cluster
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
  assert out["closure_overhead_us"] > 0
  # Each stock pattern places variables as its source does; tfps by its default.
  assert {v: c["min_shard_bytes"] for v, c in out["setup"].items()} == {
      "tutorial": 256 << 10, "model_garden": None, "tfps": 64 << 20}
  assert out["machine"]["cores"] >= 1 and "before" in out["load_average"]
  assert "examples/s" in result.stderr and "model_garden" in result.stderr


def test_the_bench_keeps_a_given_model_dir_and_removes_its_own(tmp_path):
  given = tmp_path / "bench"
  with bench_command.work_dir_for(str(given)) as work_dir:
    assert work_dir == str(given)
  assert given.is_dir()
  with bench_command.work_dir_for(None) as work_dir:
    assert os.path.basename(work_dir).startswith(f"tfps-bench-{os.getpid()}-")
    open(os.path.join(work_dir, "bench_raw.json"), "w").close()
  assert not os.path.exists(work_dir)
