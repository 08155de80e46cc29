"""The bench's summary and table (tfps.bench.report), no timing assertions."""

import pytest

from tfps.bench import report


def _raw(rates):
  return {"noop_closure_us": 1234.0, "noop_closure_us_stock": 1111.0, "sizes": {"default": {
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
  assert summary["closure_overhead_us_stock"] == 1111.0
  text = report.table(summary, repeats=3)
  assert "median of 3" in text and "model_garden" in text and "1,234 us" in text
  assert "a stock ClusterCoordinator 1,111 us" in text
