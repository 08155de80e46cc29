"""`tfps bench`: throughput of tfps beside the stock PS patterns, in one run.

Starts a local cluster (`--num_ps`, `--num_workers`) and runs the measuring
driver (`tfps.bench.driver`) inside its private network, where the chief
would run. Prints a table on stderr and one JSON line on stdout. With
`--scaling`, runs tfps alone on clusters of 1, 2 and 4 workers with 1 and 2
ps. With `--recovery`, times checkpoints at 1M, 10M, 100M and 500M
parameters (a synchronous save, an asynchronous save's stall and write, a
restore) and runs `tfps chaos` with one worker, one ps and one chief kill
(`--faults` to change them; seconds from each fault until training
progresses again). Everything
started is ended before it returns.

The machine is shared: the load average is recorded before and after, and
a warning says when it was too high for the numbers to mean much.
"""

import contextlib
import json
import os
import platform
import subprocess
import sys
import time

from absl import logging

from tfps.cluster import local
from tfps.cluster import processes
from tfps.cluster import scratch as scratch_lib
from tfps.base import errors
from tfps.base import signals
from tfps.bench import config as config_lib
from tfps.bench import report

_QUIET_LOAD = 1.5
# --quick: shorter windows; still the median of 3.
_QUICK = {"window_steps": 200, "warmup_steps": 40, "noop_closures": 200}
SCALING = ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4))  # (ps, workers)
# --recovery: one fault of each kind, placed by training step (so on any
# host's speed each lands while training runs, after the previous recovered).
RECOVERY_FAULTS = "worker:0@step2000:kill+5,ps:0@step8000:kill+5,chief:0@step16000:kill+3"
RECOVERY_TRAIN_STEPS = 24000
# The largest holds 4 GB of variables, its snapshot as much again (in the ps).
CHECKPOINT_PARAMS = (1_000_000, 10_000_000, 100_000_000, 500_000_000)


def bench_config(flags, **overrides) -> config_lib.BenchConfig:
  values = dict(
      sizes=tuple(flags.bench_sizes), variants=tuple(flags.bench_variants),
      repeats=flags.repeats, window_steps=flags.window_steps,
      warmup_steps=flags.warmup_steps, steps_per_loop=flags.steps_per_loop,
      steps_per_closure=flags.steps_per_closure, global_batch_size=flags.global_batch_size,
      seed=flags.seed, tfps_min_shard_bytes=flags.min_shard_bytes)
  if flags.quick:
    # Shorter windows, but a window flag given on the command line wins.
    values.update({name: value for name, value in _QUICK.items()
                   if name not in values or not flags[name].present})
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


_POLL_SECONDS = 0.5


def _wait(process: subprocess.Popen, stop: signals.StopSignals) -> int:
  """Waits for `process`; a stop signal to us raises Preempted (callers clean up)."""
  while process.poll() is None:
    if stop.wait(_POLL_SECONDS):
      raise errors.Preempted(stop.signum, detail="benchmark stopped")
  return process.returncode


def run_driver(config: config_lib.BenchConfig, *, num_ps: int, num_workers: int,
               work_dir: str, isolate_network: bool, ready_timeout: float,
               stop: signals.StopSignals) -> dict:
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
      code = _wait(driver, stop)
    finally:
      processes.stop_group(driver, grace=3.0)
  if code != 0 or not os.path.exists(out_path):
    raise errors.PermanentError(f"benchmark driver exited {code}; see the lines above")
  with open(out_path, encoding="utf-8") as f:
    return json.load(f)


def _scaling(flags, work_dir: str, stop: signals.StopSignals) -> list[dict]:
  config = bench_config(flags, sizes=(flags.bench_sizes[0],), variants=(config_lib.Variant.TFPS,))
  rows = []
  for num_ps, num_workers in SCALING:
    logging.info("scaling: %d ps, %d workers", num_ps, num_workers)
    run_dir = os.path.join(work_dir, f"ps{num_ps}-w{num_workers}")
    os.makedirs(run_dir, exist_ok=True)
    raw = run_driver(config, num_ps=num_ps, num_workers=num_workers, work_dir=run_dir,
                     isolate_network=flags.isolate_network, ready_timeout=flags.ready_timeout,
                     stop=stop)
    size = report.summarize(raw)
    rows.append({"num_ps": num_ps, "num_workers": num_workers,
                 "examples_per_sec": size["examples_per_sec"]["tfps"],
                 "closure_overhead_us": size.get("closure_overhead_us"),
                 "cpu_ms_per_step": size["sizes"][config.sizes[0]]["cpu_ms_per_step"]["tfps"],
                 "eval_auc": size["eval_auc"]["tfps"]})
    logging.info("scaling: %d ps, %d workers: %s examples/s", num_ps, num_workers,
                 f"{rows[-1]['examples_per_sec']:,}")
  return rows


def _recovery(flags, work_dir: str, stop: signals.StopSignals) -> dict:
  """Seconds from fault to progress (via `tfps chaos`) and checkpoint cost by size."""
  config = bench_config(flags, sizes=(), checkpoint_params=CHECKPOINT_PARAMS,
                        work_dir=work_dir)
  checkpoint = run_driver(config, num_ps=flags.num_ps, num_workers=flags.num_workers,
                          work_dir=work_dir, isolate_network=flags.isolate_network,
                          ready_timeout=flags.ready_timeout, stop=stop)["checkpoint"]
  chaos_dir = os.path.join(work_dir, "chaos")
  argv = [sys.executable, "-m", "tfps", "chaos", f"--faults={flags.faults or RECOVERY_FAULTS}",
          f"--train_steps={max(flags.train_steps, RECOVERY_TRAIN_STEPS)}",
          f"--model_dir={chaos_dir}",
          f"--num_ps={flags.num_ps}", f"--num_workers={flags.num_workers}",
          f"--checkpoint_interval={flags.checkpoint_interval}"]
  logging.info("recovery: %s (log in %s)", " ".join(argv[2:]), chaos_dir)
  os.makedirs(chaos_dir, exist_ok=True)
  with open(os.path.join(chaos_dir, "chaos.log"), "w", encoding="utf-8") as log:
    result_path = os.path.join(chaos_dir, "chaos.json")
    with open(result_path, "w", encoding="utf-8") as out:
      chaos = processes.spawn(argv, stdout=out, stderr=log)
      try:
        _wait(chaos, stop)
      finally:
        processes.stop_group(chaos, grace=10.0)
  with open(result_path, encoding="utf-8") as f:
    lines = [l for l in f if l.startswith("{")]
  if not lines:
    raise errors.PermanentError(f"tfps chaos exited {chaos.returncode} without a result; "
                                f"see {chaos_dir}/chaos.log")
  report_ = json.loads(lines[-1])
  return {"faults": report_.get("faults", []), "chaos_status": report_.get("status"),
          "steps_lost": report_.get("steps_lost"), "checkpoint_interval":
          flags.checkpoint_interval, "checkpoint": checkpoint}


def _recovery_lines(result: dict) -> list[str]:
  lines = [f"{'fault':<24} {'recovered':>9} {'s to recover':>12} {'longest stall s':>15} "
           f"{'beyond a loop s':>15} {'steps lost':>10}"]
  shown = lambda seconds: "-" if seconds is None else f"{seconds:.1f}"
  for f in result["faults"]:
    lines.append(f"{f.get('target', '?') + ' ' + str(f.get('action', '')):<24} "
                 f"{str(f.get('recovered')):>9} "
                 f"{shown(f.get('seconds_to_recover')):>12} "
                 f"{shown(f.get('longest_stall_seconds')):>15} "
                 f"{shown(f.get('stall_beyond_loop_seconds')):>15} "
                 f"{f.get('steps_lost', 0):>10}")
  lines.append(f"{'parameters':>12} {'checkpoint MB':>13} {'save s':>7} "
               f"{'async: stall s':>14} {'write s':>7} {'restore s':>9} "
               f"{'every loop: stall s, saves (waiting | skipping)':>50}")
  for row in result["checkpoint"]:
    every = row.get("every_loop", {})
    every_loop = " | ".join(f"{e['stall_per_loop_end_seconds']:.3f}, {e['saves']}"
                            for e in (every.get("waiting"), every.get("skipping")) if e)
    lines.append(f"{row['parameters']:>12,} {row['checkpoint_bytes'] / 1e6:>13.1f} "
                 f"{row['save_seconds']:>7.2f} {row['async_stall_seconds']:>14.3f} "
                 f"{row['async_write_seconds']:>7.2f} {row['restore_seconds']:>9.2f} "
                 f"{every_loop:>50}")
  return lines


def work_dir_for(model_dir: str | None):
  """The bench's files: in `--model_dir` (kept), else a scratch directory removed at the
  end (its training files are tens of MB a run; a killed bench's goes with the next)."""
  if model_dir:
    os.makedirs(model_dir, exist_ok=True)
    return contextlib.nullcontext(model_dir)
  return scratch_lib.ScratchDir("tfps-bench-")


def run(flags) -> errors.ExitCode:
  stop = signals.StopSignals.install()
  config = bench_config(flags)  # Bad flags fail here, before anything starts.
  with work_dir_for(flags.model_dir) as work_dir:
    return _run_in(flags, config, work_dir, stop)


def _run_in(flags, config, work_dir: str, stop: signals.StopSignals) -> errors.ExitCode:
  load_before = load_average()
  if load_before > _QUIET_LOAD:
    logging.warning("load average %.2f > %.1f: other work shares this machine; the "
                    "ratios are side by side, absolute numbers will be low", load_before,
                    _QUIET_LOAD)
  start = time.monotonic()
  if flags.recovery:
    result = {"recovery": _recovery(flags, work_dir, stop)}
    lines = _recovery_lines(result["recovery"])
  elif flags.scaling:
    result = {"scaling": _scaling(flags, work_dir, stop)}
    lines = [f"{'ps':>3} {'workers':>7} {'examples/s':>11} {'AUC':>7} "
             f"{'CPU ms/step: ps':>15} {'workers':>7} {'chief':>5}"]
    lines += [f"{r['num_ps']:>3} {r['num_workers']:>7} {r['examples_per_sec']:>11,} "
              f"{r['eval_auc']:>7.4f} {r['cpu_ms_per_step'].get('ps', 0):>15.2f} "
              f"{r['cpu_ms_per_step'].get('worker', 0):>7.2f} "
              f"{r['cpu_ms_per_step'].get('chief', 0):>5.2f}" for r in result["scaling"]]
  else:
    raw = run_driver(config, num_ps=flags.num_ps, num_workers=flags.num_workers,
                     work_dir=work_dir, isolate_network=flags.isolate_network,
                     ready_timeout=flags.ready_timeout, stop=stop)
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
