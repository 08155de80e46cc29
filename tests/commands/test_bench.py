"""`tfps bench` (tfps.commands.bench): its flags and work directory; a whole run:
e2e/test_bench.py."""

import os

import pytest

from tfps.commands import bench as bench_command


@pytest.mark.parametrize("args, window, warmup", [
    ([], 500, 200),
    (["--quick"], 200, 40),
    (["--quick", "--window_steps=30"], 30, 40),  # An explicit window flag wins.
])
def test_quick_shortens_only_the_windows_not_given(parse_flags, args, window, warmup):
  config = bench_command.bench_config(parse_flags(["bench", *args]))
  assert (config.window_steps, config.warmup_steps) == (window, warmup)


@pytest.mark.parametrize("args, expected", [
    (["--bench_sizes=huge"], "bench_sizes ('huge') must be one of default, dense, tiny"),
    (["--window_steps=0"], "window_steps (0) must be a positive integer"),
    (["--bench_variants=tfps,fast"], "bench_variants (tfps,fast) must be among"),
])
def test_bad_bench_flags_exit_2_with_one_line(tfps, args, expected):
  result = tfps(["bench", *args])
  assert result.returncode == 2, result.stderr
  lines = [l for l in result.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and expected in lines[0], result.stderr


def test_the_bench_keeps_a_given_model_dir_and_removes_its_own(tmp_path):
  given = tmp_path / "bench"
  with bench_command.work_dir_for(str(given)) as work_dir:
    assert work_dir == str(given)
  assert given.is_dir()
  with bench_command.work_dir_for(None) as work_dir:
    assert os.path.basename(work_dir).startswith(f"tfps-bench-{os.getpid()}-")
    open(os.path.join(work_dir, "bench_raw.json"), "w").close()
  assert not os.path.exists(work_dir)
