"""`tfps bench`: throughput of tfps beside the stock PS patterns, in one run.

Starts a local cluster (`--num_ps`, `--num_workers`) and runs the measuring
driver (`tfps.bench.driver`) inside its private network, where the chief
would run. Prints a table on stderr and one JSON line on stdout. With
`--scaling`, runs tfps alone on clusters of 1, 2 and 4 workers with 1 and 2
ps. Everything started is ended before it returns.

The machine is shared: the load average is recorded before and after, and
a warning says when it was too high for the numbers to mean much.
"""

import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from absl import logging

from cluster import local
from cluster import processes
from recovery import errors
from recovery import signals
from tfps.bench import config as config_lib
from tfps.bench import report

_QUIET_LOAD = 1.5
# --quick: shorter windows; still the median of 3.
_QUICK = {"window_steps": 300, "warmup_steps": 60, "noop_closures": 200}
SCALING = ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4))  # (ps, workers)


def bench_config(flags, **overrides) -> config_lib.BenchConfig:
  values = dict(
      sizes=tuple(flags.bench_sizes), variants=tuple(flags.bench_variants),
      repeats=flags.repeats, window_steps=flags.window_steps,
      warmup_steps=flags.warmup_steps, steps_per_loop=flags.steps_per_loop,
      steps_per_closure=flags.steps_per_closure, global_batch_size=flags.global_batch_size,
      seed=flags.seed)
  if flags.quick:
    values.update(_QUICK)
  values.update(overrides)
  return config_lib.BenchConfig(**values)


def load_average() -> float:
  with open("/proc/loadavg", encoding="utf-8") as f:
    return float(f.read().split()[0])


def machine() -> dict:
  model = "unknown"
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      model = next((line.split(":", 1)[1].strip() for line in f
                    if line.startswith("model name")), model)
  except OSError:
    pass
  return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version()}


def run_driver(config: config_lib.BenchConfig, *, num_ps: int, num_workers: int,
               work_dir: str, isolate_network: bool, ready_timeout: float) -> dict:
  """One local cluster, one driver run; returns the driver's raw JSON."""
  cluster_config = local.LocalClusterConfig(
      num_ps=num_ps, num_workers=num_workers, work_dir=work_dir,
      isolate_network=isolate_network, ready_timeout=ready_timeout)
  config_path = os.path.join(work_dir, "bench_config.json")
  out_path = os.path.join(work_dir, "bench_raw.json")
  with open(config_path, "w", encoding="utf-8") as f:
    f.write(config.to_json())
  with local.LocalCluster(cluster_config) as cluster:
    driver = cluster.spawn(
        [sys.executable, "-m", "tfps.bench.driver", cluster.spec_file, config_path, out_path],
        stdout=subprocess.DEVNULL)
    try:
      code = driver.wait()
    finally:
      processes.stop_group(driver, grace=3.0)
  if code != 0 or not os.path.exists(out_path):
    raise errors.PermanentError(f"benchmark driver exited {code}; see the lines above")
  with open(out_path, encoding="utf-8") as f:
    return json.load(f)


def _scaling(flags, work_dir: str) -> list[dict]:
  config = bench_config(flags, sizes=(flags.bench_sizes[0],), variants=(config_lib.Variant.TFPS,))
  rows = []
  for num_ps, num_workers in SCALING:
    logging.info("scaling: %d ps, %d workers", num_ps, num_workers)
    run_dir = os.path.join(work_dir, f"ps{num_ps}-w{num_workers}")
    os.makedirs(run_dir, exist_ok=True)
    raw = run_driver(config, num_ps=num_ps, num_workers=num_workers, work_dir=run_dir,
                     isolate_network=flags.isolate_network, ready_timeout=flags.ready_timeout)
    size = report.summarize(raw)
    rows.append({"num_ps": num_ps, "num_workers": num_workers,
                 "examples_per_sec": size["examples_per_sec"]["tfps"],
                 "closure_overhead_us": size.get("closure_overhead_us"),
                 "eval_auc": size["eval_auc"]["tfps"]})
    logging.info("scaling: %d ps, %d workers: %s examples/s", num_ps, num_workers,
                 f"{rows[-1]['examples_per_sec']:,}")
  return rows


def run(flags) -> errors.ExitCode:
  signals.StopSignals.install()
  config = bench_config(flags)  # Bad flags fail here, before anything starts.
  work_dir = flags.model_dir or tempfile.mkdtemp(prefix="tfps-bench-")
  os.makedirs(work_dir, exist_ok=True)
  load_before = load_average()
  if load_before > _QUIET_LOAD:
    logging.warning("load average %.2f > %.1f: other work shares this machine; the "
                    "ratios are side by side, absolute numbers will be low", load_before,
                    _QUIET_LOAD)
  start = time.monotonic()
  if flags.scaling:
    result = {"scaling": _scaling(flags, work_dir)}
    lines = [f"{'ps':>3} {'workers':>7} {'examples/s':>11} {'AUC':>7}"]
    lines += [f"{r['num_ps']:>3} {r['num_workers']:>7} {r['examples_per_sec']:>11,} "
              f"{r['eval_auc']:>7.4f}" for r in result["scaling"]]
  else:
    raw = run_driver(config, num_ps=flags.num_ps, num_workers=flags.num_workers,
                     work_dir=work_dir, isolate_network=flags.isolate_network,
                     ready_timeout=flags.ready_timeout)
    result = report.summarize(raw)
    lines = [report.table(result, repeats=config.repeats)]
  result.update(
      num_ps=flags.num_ps, num_workers=flags.num_workers,
      global_batch_size=config.global_batch_size, steps_per_loop=config.steps_per_loop,
      steps_per_closure=config.steps_per_closure, window_steps=config.window_steps,
      repeats=config.repeats, quick=flags.quick, machine=machine(),
      load_average={"before": load_before, "after": load_average()},
      seconds=round(time.monotonic() - start, 1), command=" ".join(["tfps", *sys.argv[1:]]))
  sys.stderr.write("\n".join(lines) + "\n")
  sys.stderr.flush()
  sys.stdout.write(json.dumps(result) + "\n")
  sys.stdout.flush()
  return errors.ExitCode.OK
