"""The benchmark's measuring process: `python -m tfps.bench.driver SPEC CONFIG OUT`.

It runs where the chief would (inside the local cluster's private network,
started by `tfps bench`), connects once, and for every model size:

  1. builds every variant (`patterns`) from the same seed: same initial
     model, same data;
  2. warms each up (`warmup_steps`, and at least one whole Orbit loop, so
     that every closure a timed window runs is traced already; per-worker
     datasets);
  3. runs `repeats` rounds; in each round every variant trains one window of
     `window_steps` steps, timed from the first dispatch to the moment the
     last step has finished (join). The variants take turns, in a rotating
     order, so that any change in machine load hits all of them alike;
  4. evaluates every variant (exact AUC over the whole eval set), after the
     same number of steps;
then times empty closures (dispatch overhead) and writes one JSON document
to OUT. Every PS variant shares one ParameterServerStrategy and its
ClusterCoordinator (TensorFlow allows one cluster per process).
"""

import json
import os
import statistics
import sys
import time

from absl import logging

from tfps.cluster import scratch
from tfps.cluster import spec as spec_lib
from tfps.bench import config as config_lib
from tfps.bench import cpu as cpu_lib

Variant = config_lib.Variant


def _build(variant, runtimes, params, config):
  from tfps.bench import patterns
  common = dict(batch_size=config.global_batch_size, seed=config.seed,
                steps_per_loop=config.steps_per_loop)
  if variant == Variant.SINGLE_PROCESS:
    return patterns.SingleProcess(params, **common)
  if variant == Variant.TUTORIAL:
    return patterns.Tutorial(runtimes[Variant.TUTORIAL], params, **common)
  if variant == Variant.MODEL_GARDEN:
    return patterns.ModelGarden(runtimes[Variant.MODEL_GARDEN], params, **common)
  return patterns.Tfps(runtimes[Variant.TFPS], params, steps_per_closure=config.steps_per_closure,
                       **common)


def _window(run, steps: int, meter: cpu_lib.CpuMeter) -> tuple[int, float, dict]:
  """Trains `steps` steps; returns (steps that ran, seconds, CPU ms per step by role)."""
  before = int(run.global_step.numpy())
  cpu_before = meter.read()
  start = time.perf_counter()
  run.train(steps)
  seconds = time.perf_counter() - start
  ran = int(run.global_step.numpy()) - before
  return ran, seconds, meter.per_step_ms(cpu_before, meter.read(), ran)


def measure_size(size: str, runtimes, config: config_lib.BenchConfig,
                 meter: cpu_lib.CpuMeter, data_dir: str) -> dict:
  # Every variant reads the same training files (written by the first).
  params = dict(config_lib.SIZES[size], data_dir=data_dir)
  runs = {}
  # A whole loop traces the closures of a whole loop (a shorter one may not).
  warmup = max(config.warmup_steps, config.steps_per_loop)
  for variant in config.variants:
    logging.info("%s/%s: building and warming up (%d steps)", size, variant, warmup)
    runs[variant] = _build(variant, runtimes, params, config)
    runs[variant].train(warmup)
    if runs[variant].timer is not None:
      runs[variant].timer.reset()  # Tracing is not dispatch.
  results = {v.value: {"examples_per_sec": [], "window_seconds": [], "cpu_ms_per_step": []}
             for v in runs}
  order = list(runs)
  for repeat in range(config.repeats):
    for variant in order[repeat % len(order):] + order[:repeat % len(order)]:
      steps, seconds, cpu = _window(runs[variant], config.window_steps, meter)
      rate = steps * config.global_batch_size / seconds
      results[variant.value]["examples_per_sec"].append(rate)
      results[variant.value]["window_seconds"].append(seconds)
      results[variant.value]["cpu_ms_per_step"].append(cpu)
      logging.info("%s/%s window %d/%d: %d steps in %.2fs, %s examples/s, CPU ms/step %s "
                   "(load %s)", size, variant, repeat + 1, config.repeats, steps, seconds,
                   f"{rate:,.0f}", cpu, _load())
  for variant, run in runs.items():
    result = results[variant.value]
    result["steps"] = int(run.global_step.numpy())
    result["eval_auc"] = run.evaluate()
    if run.timer is not None:
      result["closures"] = run.timer.calls
      result["schedule_us"] = run.timer.micros_per_call
    logging.info("%s/%s: AUC %.4f after %d steps", size, variant, result["eval_auc"],
                 result["steps"])
  return results


def _load() -> str:
  try:
    with open("/proc/loadavg", encoding="utf-8") as f:
      return f.read().split()[0]
  except OSError:
    return "?"


def run(spec_path: str, config: config_lib.BenchConfig, data_dir: str) -> dict:
  """The measurements of `config`; the ctr's training files go to `data_dir`."""
  from tfps.coordinator import strategy as strategy_lib
  from tfps.bench import patterns
  cluster = spec_lib.from_json_file(spec_path, job_name="chief", task_index=0).cluster
  tfps_runtime = strategy_lib.connect(cluster, ready_timeout=120.0,
                                      min_shard_bytes=config.tfps_min_shard_bytes or None)
  shard_bytes = {Variant.TUTORIAL: patterns.TUTORIAL_MIN_SHARD_BYTES,
                 Variant.MODEL_GARDEN: patterns.MODEL_GARDEN_MIN_SHARD_BYTES}
  runtimes = {Variant.TFPS: tfps_runtime,
              **{v: patterns.stock_runtime(cluster, b) for v, b in shard_bytes.items()}}
  meter = cpu_lib.CpuMeter(spec_path)
  from tfps.coordinator import trainer as trainer_lib
  out = {"sizes": {}, "setup": {
      **{v.value: {"min_shard_bytes": b} for v, b in shard_bytes.items()},
      "tfps": {"min_shard_bytes": config.tfps_min_shard_bytes,
               "unroll": trainer_lib.DEFAULT_UNROLL,
               "steps_per_closure": config.steps_per_closure}}}
  if config.checkpoint_params:
    from tfps.bench import checkpoint_cost
    out["checkpoint"] = checkpoint_cost.measure(tfps_runtime, config.checkpoint_params,
                                                config.work_dir)
    for row in out["checkpoint"]:
      logging.info("checkpoint of %s parameters: save %.2fs; asynchronous save: stall "
                   "%.3fs, written in %.2fs; restore %.2fs", f"{row['parameters']:,}",
                   row["save_seconds"], row["async_stall_seconds"],
                   row["async_write_seconds"], row["restore_seconds"])
  if config.sizes and any(v != Variant.SINGLE_PROCESS for v in config.variants):
    # Side by side with a stock ClusterCoordinator on the same cluster, taking
    # turns: what TF's own dispatch costs on this host is the floor.
    stock = runtimes[Variant.TUTORIAL].coordinator
    turns = [(patterns.noop_closure_micros(tfps_runtime.coordinator, config.noop_closures),
              patterns.noop_closure_micros(stock, config.noop_closures)) for _ in range(2)]
    out["noop_closure_us"] = statistics.median(ours for ours, _ in turns)
    out["noop_closure_us_stock"] = statistics.median(theirs for _, theirs in turns)
    logging.info("empty closure: %.0f µs each (a stock ClusterCoordinator: %.0f µs)",
                 out["noop_closure_us"], out["noop_closure_us_stock"])
  for size in config.sizes:
    out["sizes"][size] = measure_size(size, runtimes, config, meter, data_dir)
  return out


def main(argv: list[str]) -> int:
  if len(argv) != 4:
    sys.stderr.write("usage: python -m tfps.bench.driver SPEC_FILE CONFIG_FILE OUT_FILE\n")
    return 2
  from tfps.base import log_summary
  logging.use_absl_handler()
  logging.set_verbosity(logging.INFO)
  log_summary.install_stderr_filter()
  temp = scratch.use_for_temporary_files("tfps-bench-driver-")
  with open(argv[2], encoding="utf-8") as f:
    config = config_lib.BenchConfig.from_json(f.read())
  # The ctr's training files go beside the config, in the run's work directory.
  result = run(argv[1], config, os.path.join(os.path.dirname(os.path.abspath(argv[2])), "data"))
  with open(argv[3], "w", encoding="utf-8") as f:
    json.dump(result, f)
  sys.stderr.flush()
  temp.cleanup()
  # Open gRPC channels to the cluster make a normal exit slow and noisy.
  os._exit(0)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
