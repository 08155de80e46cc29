"""A worker's graph cache (tfps.ps_worker.graph_cache); the names that make it safe:
fast_restart/test_worker_functions.py; the coordinator's side with TensorFlow:
fast_restart/test_trace_cache.py."""

import os

import pytest

from tfps.cluster import spec as spec_lib
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


@pytest.mark.parametrize("value,expected", [("", None), ("/somewhere", "/somewhere")])
def test_the_flag_chooses_the_root_or_turns_it_off(value, expected):
  from tfps.commands import cli  # pylint: disable=import-outside-toplevel
  from tfps.commands import run as run_command  # pylint: disable=import-outside-toplevel
  assert "graph_cache_dir" in cli.COMMAND_FLAGS["run"]
  assert "graph_cache_dir" in cli.COMMAND_FLAGS["local"]
  assert run_command.graph_cache_root(value) == expected
  assert run_command.graph_cache_root(None) == graph_cache.default_root()
