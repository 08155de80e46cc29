"""A worker's graph cache (tfps.ps_worker.graph_cache) and the names that make it safe
(tfps.fast_restart.worker_functions); the coordinator's side with TensorFlow is in
test_trace_cache.py."""

import inspect
import os
import subprocess
import sys

import pytest

from tfps.cluster import spec as spec_lib
from tfps.fast_restart import worker_functions
from tfps.ps_worker import graph_cache

WORKER_0 = spec_lib.TaskId.parse("worker:0")


def test_each_task_address_configuration_and_version_has_a_directory_of_its_own():
  base = ("/c", WORKER_0, "127.0.0.1:2222", b"config", "2.20.0")
  directory = graph_cache.task_directory(*base)
  assert directory.startswith("/c/worker-0-")
  assert graph_cache.task_directory(*base) == directory  # The same after a restart.
  others = {graph_cache.task_directory(*base[:1], spec_lib.TaskId.parse("worker:1"), *base[2:]),
            graph_cache.task_directory(*base[:2], "127.0.0.1:2223", *base[3:]),
            graph_cache.task_directory(*base[:3], b"other config", base[4]),
            graph_cache.task_directory(*base[:4], "2.21.0")}
  assert len(others) == 4 and directory not in others


def test_pruning_keeps_the_newest_within_the_limits():
  files = [graph_cache.StoredGraph(f"/c/{i}", size=10, modified_ns=i) for i in range(6)]
  assert graph_cache.to_remove(files, max_files=4, max_bytes=100) == ["/c/1", "/c/0"]
  assert graph_cache.to_remove(files, max_files=10, max_bytes=25) == [f"/c/{i}" for i in (3, 2, 1, 0)]
  big = graph_cache.StoredGraph("/c/big", size=50, modified_ns=9)
  assert graph_cache.to_remove([big, *files], max_files=10, max_bytes=40) == ["/c/big"] + [
      f"/c/{i}" for i in (1, 0)]


def test_prune_removes_the_oldest_files_on_disk(tmp_path):
  for i in range(5):
    path = tmp_path / f"graph-{i}"
    path.write_bytes(b"x" * 10)
    os.utime(path, ns=(i * 10**9, i * 10**9))
  removed = graph_cache.prune(str(tmp_path), max_files=3, max_bytes=1000)
  assert sorted(os.path.basename(p) for p in removed) == ["graph-0", "graph-1"]
  assert sorted(os.listdir(tmp_path)) == ["graph-2", "graph-3", "graph-4"]
  assert graph_cache.prune(str(tmp_path / "missing")) == []


def test_enable_points_tensorflow_at_the_directory_or_runs_without(tmp_path, monkeypatch):
  monkeypatch.delenv(graph_cache.ENV, raising=False)
  blocker = tmp_path / "a-file"
  blocker.write_text("")
  assert not graph_cache.enable(str(blocker / "cache"))
  assert graph_cache.ENV not in os.environ
  assert graph_cache.enable(str(tmp_path / "cache"))
  assert os.environ[graph_cache.ENV] == str(tmp_path / "cache")
  assert os.path.isdir(tmp_path / "cache")


def test_a_traced_function_is_named_for_this_process_only():
  first, second = worker_functions.traced("full_closure"), worker_functions.traced("full_closure")
  assert first.startswith(f"full_closure_{worker_functions.PROCESS_TAG}_")
  # One process may trace two closures of a kind (the bench's sizes, one after the
  # other): a worker's graph cache must not read one's graph for the other.
  assert first != second
  assert worker_functions.kind(first) == worker_functions.kind(second) == "full_closure"
  assert worker_functions.kind("full_closure_1234") == "full_closure_1234"
  other = subprocess.run(
      [sys.executable, "-c", "from tfps.coordinator import worker_functions as w; "
       "print(w.PROCESS_TAG)"], capture_output=True, text=True, check=True, timeout=60)
  assert other.stdout.strip() not in ("", worker_functions.PROCESS_TAG)

  def run_shard(shard_index, num_batches=-1):
    """One shard."""
    return shard_index, num_batches

  named = worker_functions.named(run_shard, "run_shard")
  assert worker_functions.kind(named.__name__) == "run_shard"
  assert worker_functions.PROCESS_TAG in named.__name__
  assert named(1) == (1, -1) and named.__doc__ == "One shard."
  assert list(inspect.signature(named).parameters) == ["shard_index", "num_batches"]


def test_a_rebuilt_function_is_named_by_what_it_is_and_where_it_runs(monkeypatch):
  monkeypatch.setattr(worker_functions, "_REBUILT", worker_functions.collections.Counter())
  cluster = {"ps": ["a:1", "a:2"], "worker": ["a:3", "a:4"]}
  first = worker_functions.rebuilt_suffix({"library": "L"}, [], cluster, "2.20.0")
  # In this process again: another name (TensorFlow needs them unique).
  again = worker_functions.rebuilt_suffix({"library": "L"}, [], cluster, "2.20.0")
  assert first.endswith("x0") and again == first[:-1] + "1"
  renumbered = {"ps": ["a:1", "a:2"], "worker": ["a:4", "a:3"]}
  others = [worker_functions.rebuilt_suffix({"library": "M"}, [], cluster, "2.20.0"),
            worker_functions.rebuilt_suffix({"library": "L"}, ["ps:1->ps:0"], cluster, "2.20.0"),
            worker_functions.rebuilt_suffix({"library": "L"}, [], renumbered, "2.20.0"),
            worker_functions.rebuilt_suffix({"library": "L"}, [], cluster, "2.21.0")]
  assert all(o.endswith("x0") for o in others)
  assert len({o[:-2] for o in others} | {first[:-2]}) == 5
  # A new process (a new coordinator): the first one's name again.
  monkeypatch.setattr(worker_functions, "_REBUILT", worker_functions.collections.Counter())
  assert worker_functions.rebuilt_suffix({"library": "L"}, [], cluster, "2.20.0") == first
  # TensorFlow keys a stored graph on the name less its last "_" part: the suffix has none.
  assert "_" not in first[1:]


def test_a_placed_graph_depends_on_the_workers_order_and_the_other_jobs_sizes():
  cluster = {"chief": ["a:0"], "ps": ["a:1", "a:2"], "worker": ["a:3", "a:4"]}
  shape = worker_functions.placement(cluster)
  assert shape == {"chief": 1, "ps": 2, "worker": ["a:3", "a:4"]}
  # The one ps left after losing either of two: one graph.
  assert (worker_functions.placement({**cluster, "ps": ["a:1"]})
          == worker_functions.placement({**cluster, "ps": ["a:2"]}))
  assert worker_functions.placement({**cluster, "worker": ["a:4", "a:3"]}) != shape
  assert worker_functions.placement({**cluster, "ps": ["a:1"]}) != shape


@pytest.mark.parametrize("value,expected", [("", None), ("/somewhere", "/somewhere")])
def test_the_flag_chooses_the_root_or_turns_it_off(value, expected):
  from tfps.commands import cli  # pylint: disable=import-outside-toplevel
  from tfps.commands import run as run_command  # pylint: disable=import-outside-toplevel
  assert "graph_cache_dir" in cli.COMMAND_FLAGS["run"]
  assert "graph_cache_dir" in cli.COMMAND_FLAGS["local"]
  assert run_command.graph_cache_root(value) == expected
  assert run_command.graph_cache_root(None) == graph_cache.default_root()
