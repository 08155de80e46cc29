"""A ps/worker's TensorFlow (tfps.ps_worker.tf_runtime): the runtime without the Python
API, in a fresh process each (a process can hold one or the other)."""

import json
import subprocess
import sys

import portpicker
import pytest

pytestmark = pytest.mark.tf

# Loads the runtime as a ps/worker does, starts a server on a port, reads back what was
# imported, and tries the API; prints one JSON line.
_CHILD = r"""
import json, sys
from tfps.cluster import readiness, spec as spec_lib
from tfps.ps_worker import tf_runtime
from absl import logging
logging.set_verbosity(logging.INFO)  # As `tfps run` logs: its one line on a fallback.
moved = sys.argv[2] == "moved"
if moved:  # A release that moved a module the runtime is loaded through.
  import importlib
  real_import = importlib.import_module
  def import_module(name, *args):
    if name == "tensorflow.python.framework.versions":
      raise ModuleNotFoundError(f"No module named {name!r}")
    return real_import(name, *args)
  importlib.import_module = import_module
runtime = tf_runtime.load(runtime_only=True)
if moved:
  importlib.import_module = real_import
  # Now that TensorFlow is imported whole, a second load keeps it (an in-process cluster).
  assert tf_runtime.load(runtime_only=True).api_loaded
address = f"localhost:{sys.argv[1]}"
cluster = spec_lib.ClusterSpec.from_dict({"ps": [address], "worker": ["localhost:1"]})
server = runtime.Server(runtime.ClusterSpec({"ps": [address]}), job_name="ps",
                        task_index=0, protocol="grpc",
                        config=runtime.ConfigProto(inter_op_parallelism_threads=2), start=True)
answer = readiness.answers(cluster, [spec_lib.TaskId(spec_lib.JobType.PS, 0)], 10.0)
try:
  import tensorflow as tf
  tf.constant(1)
  api = "usable"
except AttributeError as e:
  api = str(e)
try:
  runtime.Server(runtime.ClusterSpec({"ps": [address]}), job_name="ps", task_index=0,
                 protocol="grpc", start=True)
  taken = "started twice"
except runtime.OpError as e:
  taken = type(e).__name__
print(json.dumps({"api_loaded": runtime.api_loaded, "version": runtime.version,
                  "answered": [a.name for a in answer.values()], "api": api, "taken": taken,
                  "keras": sorted(m for m in sys.modules
                                  if m.split(".")[0] in ("keras", "tf_keras"))}))
"""


def _child(mode: str) -> dict:
  run = subprocess.run([sys.executable, "-c", _CHILD, str(portpicker.pick_unused_port()), mode],
                       capture_output=True, timeout=120, check=False)
  assert run.returncode == 0, run.stderr.decode(errors="replace")[-3000:]
  return {**json.loads(run.stdout.decode().strip().splitlines()[-1]),
          "stderr": run.stderr.decode(errors="replace")}


def test_the_runtime_alone_serves_without_the_api_and_says_so_when_asked_for_it():
  seen = _child("runtime_only")
  assert seen["api_loaded"] is False and seen["answered"] == ["READY"], seen
  assert seen["keras"] == []  # Neither Keras was loaded.
  assert seen["api"].startswith("tensorflow.constant: this process loaded TensorFlow's runtime "
                                "only"), seen["api"]
  assert seen["taken"] == "UnknownError"  # The port in use: TensorFlow's own error type.
  # Where a release moved what the runtime is loaded through, the full import serves, one
  # line says so, and a process that imported TensorFlow already keeps it: the full server,
  # the same version (the graph cache's key is the same either way).
  full = _child("moved")
  assert full["api_loaded"] is True and full["api"] == "usable" and full["answered"] == ["READY"]
  assert full["version"] == seen["version"]
  assert "could not be loaded on its own (ModuleNotFoundError" in full["stderr"], full["stderr"]
