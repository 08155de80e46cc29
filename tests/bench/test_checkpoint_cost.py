"""The checkpoint cost bench (tfps.bench.checkpoint_cost) on the in-process cluster."""

import os

import pytest

pytestmark = pytest.mark.tf


def test_the_checkpoint_cost_bench_times_both_kinds_of_save(runtime, tmp_path, caplog):
  from tfps.bench import checkpoint_cost
  with caplog.at_level("INFO"):
    row, = checkpoint_cost.measure(runtime, (200_000,), str(tmp_path), repeats=1, loops=3,
                                   loop_steps=4)
  assert "async checkpoint" not in caplog.text  # TF's per-save lines, as in the chief's log.
  assert row["parameters"] == 200_000 and row["checkpoint_bytes"] >= 2 * 200_000 * 4
  for key in ("save_seconds", "async_first_seconds", "async_return_seconds",
              "async_write_seconds", "restore_seconds"):
    assert 0 < row[key] < 60, (key, row)
  assert row["async_return_seconds"] <= row["async_write_seconds"]
  waiting, skipping = row["every_loop"]["waiting"], row["every_loop"]["skipping"]
  assert (waiting["saves"], waiting["skipped"]) == (3, 0)
  # Whether a write outlasts a loop is the host's business; every loop end is one or the other.
  assert skipping["saves"] >= 1 and skipping["saves"] + skipping["skipped"] == 3
  assert not os.listdir(tmp_path)  # Its checkpoints are removed.
