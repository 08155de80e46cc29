"""How long a ps or worker takes to serve, with TensorFlow's runtime only and with all of it.

  python scripts/server_start.py --starts=5

Starts `tfps run` as a ps of a one-ps cluster, over and over, taking turns between
`--tf_runtime_only` and `--notf_runtime_only`, and times each from the process start to
its port answering a gRPC handshake; also the CPU seconds it used until then (from
/proc). Prints one JSON line with each mode's times and their medians. Nothing else
should run on the host meanwhile: the figures are for side-by-side comparison.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import portpicker

from tfps.cluster import processes
from tfps.cluster import readiness
from tfps.cluster import spec as spec_lib

_STARTS = flags.DEFINE_integer("starts", 5, "starts of each mode")
_DEADLINE_SECONDS = 120.0  # A start that takes longer is reported as failed.


def _cpu_seconds(pid: int) -> float:
  """User + system CPU seconds of `pid` so far (its threads included)."""
  with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _one_start(runtime_only: bool, work_dir: str) -> dict:
  address = f"localhost:{portpicker.pick_unused_port()}"
  cluster = spec_lib.ClusterSpec.from_dict({"ps": [address], "worker": ["localhost:1"]})
  spec_path = os.path.join(work_dir, "cluster.json")
  with open(spec_path, "w", encoding="utf-8") as f:
    json.dump(cluster.as_dict(), f)
  flag = "--tf_runtime_only" if runtime_only else "--notf_runtime_only"
  began = time.monotonic()
  child = processes.spawn([sys.executable, "-m", "tfps", "run", f"--cluster_spec={spec_path}",
                           "--job_name=ps", "--task_index=0", "--nopreemption_notice", flag],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    ps = spec_lib.TaskId(spec_lib.JobType.PS, 0)
    while time.monotonic() - began < _DEADLINE_SECONDS:
      answer = readiness.answers(cluster, [ps], 1.0)[ps]
      if answer == readiness.Answer.READY:
        return {"seconds": round(time.monotonic() - began, 2),
                "cpu_seconds": round(_cpu_seconds(child.pid), 2)}
      if child.poll() is not None:
        return {"failed": f"exited with {child.returncode}"}
      time.sleep(0.05)
    return {"failed": f"no answer in {_DEADLINE_SECONDS:.0f}s"}
  finally:
    processes.stop_group(child, grace=0)


def main(argv):
  del argv
  runs = {"runtime_only": [], "full_import": []}
  with tempfile.TemporaryDirectory(prefix="tfps-server-start-") as work_dir:
    for _ in range(_STARTS.value):
      for mode in runs:  # Taking turns: drift on the host touches both alike.
        runs[mode].append(_one_start(mode == "runtime_only", work_dir))
  summary = {}
  for mode, results in runs.items():
    ok = [r for r in results if "seconds" in r]
    summary[mode] = {
        "starts": results,
        "median_seconds": statistics.median(r["seconds"] for r in ok) if ok else None,
        "median_cpu_seconds": statistics.median(r["cpu_seconds"] for r in ok) if ok else None}
  print(json.dumps(summary))


if __name__ == "__main__":
  app.run(main)
