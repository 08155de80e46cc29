"""Turns the driver's raw measurements into ratios, a table and the JSON line.

Pure functions (no TensorFlow): medians, the two ratios the issue asks for,
and the human-readable table.
"""

import statistics
from typing import Any, Mapping

from tfps.bench import config as config_lib

Variant = config_lib.Variant


def _ratio(num: float | None, den: float | None) -> float | None:
  if num is None or not den:
    return None
  return round(num / den, 3)


def _median_cpu(windows: list[Mapping[str, float]]) -> dict[str, float]:
  roles = sorted({role for w in windows for role in w})
  return {role: round(statistics.median(w.get(role, 0.0) for w in windows), 2)
          for role in roles}


def summarize_size(raw: Mapping[str, Any]) -> dict[str, Any]:
  """Medians and ratios of one model size (raw: variant -> measurements)."""
  eps = {v: round(statistics.median(m["examples_per_sec"])) for v, m in raw.items()}
  stock = [eps[v.value] for v in config_lib.STOCK if v.value in eps]
  tfps = eps.get(Variant.TFPS.value)
  return {
      "examples_per_sec": eps,
      "ratio_vs_best_stock": _ratio(tfps, max(stock) if stock else None),
      "ratio_vs_single_process": _ratio(tfps, eps.get(Variant.SINGLE_PROCESS.value)),
      "eval_auc": {v: round(m["eval_auc"], 4) for v, m in raw.items()},
      "steps": {v: m["steps"] for v, m in raw.items()},
      "repeats_examples_per_sec": {v: [round(x) for x in m["examples_per_sec"]]
                                   for v, m in raw.items()},
      "cpu_ms_per_step": {v: _median_cpu(m["cpu_ms_per_step"]) for v, m in raw.items()
                          if m.get("cpu_ms_per_step")},
      "schedule_us": {v: round(m["schedule_us"], 1) for v, m in raw.items()
                      if "schedule_us" in m},
      "closures": {v: m["closures"] for v, m in raw.items() if "closures" in m},
  }


def summarize(raw: Mapping[str, Any]) -> dict[str, Any]:
  """The JSON document: per size, with the first size's figures at top level."""
  sizes = {size: summarize_size(r) for size, r in raw["sizes"].items()}
  first = sizes[next(iter(sizes))]
  out = {key: first[key] for key in ("examples_per_sec", "ratio_vs_best_stock",
                                     "ratio_vs_single_process", "eval_auc")}
  out["size"] = next(iter(sizes))
  out["sizes"] = sizes
  if "setup" in raw:
    out["setup"] = raw["setup"]
  if "noop_closure_us" in raw:
    out["closure_overhead_us"] = round(raw["noop_closure_us"], 1)
  if "noop_closure_us_stock" in raw:
    out["closure_overhead_us_stock"] = round(raw["noop_closure_us_stock"], 1)
  return out


def _fmt(value, spec: str, missing: str = "-") -> str:
  return missing if value is None else format(value, spec)


def table(summary: Mapping[str, Any], *, repeats: int) -> str:
  """A readable table of every size and variant."""
  header = (f"{'size':<8} {'variant':<15} {'examples/s':>11} {'min..max':>17} "
            f"{'x single':>8} {'x stock':>8} {'AUC':>7} {'steps':>6} {'us/schedule':>11} "
            f"{'CPU ms/step':>11}")
  lines = [f"examples/s: median of {repeats} timed windows; AUC: exact, whole eval set, "
           "after the same number of steps", header, "-" * len(header)]
  for size, s in summary["sizes"].items():
    eps = s["examples_per_sec"]
    single = eps.get(Variant.SINGLE_PROCESS.value)
    stock = max((eps[v.value] for v in config_lib.STOCK if v.value in eps), default=None)
    for variant, rate in eps.items():
      runs = s["repeats_examples_per_sec"][variant]
      lines.append(
          f"{size:<8} {variant:<15} {rate:>11,} {min(runs):>8,}..{max(runs):<8,} "
          f"{_fmt(_ratio(rate, single), '.2f'):>8} {_fmt(_ratio(rate, stock), '.2f'):>8} "
          f"{s['eval_auc'][variant]:>7.4f} {s['steps'][variant]:>6} "
          f"{_fmt(s['schedule_us'].get(variant), ',.0f'):>11} "
          f"{_fmt(s['cpu_ms_per_step'].get(variant, {}).get('total'), '.1f'):>11}")
  lines.append("CPU ms/step: CPU time of every process of the run (chief, ps, workers) "
               "per training step")
  if "closure_overhead_us" in summary:
    stock = summary.get("closure_overhead_us_stock")
    beside = "" if stock is None else f"; a stock ClusterCoordinator {stock:,.0f} us"
    lines.append(f"empty closure, dispatch to done: {summary['closure_overhead_us']:,.0f} us "
                 f"(coordinator + RPC, all workers{beside})")
  return "\n".join(lines)
