"""The bench's settings (tfps.bench.config)."""

import pytest

from tfps.bench import config as config_lib


def test_config_errors_name_field_and_value():
  with pytest.raises(config_lib.errors.UsageError, match=r"repeats \(0\) must be a positive"):
    config_lib.BenchConfig(repeats=0)
  with pytest.raises(config_lib.errors.UsageError, match=r"bench_sizes \('huge'\) must be one of"):
    config_lib.BenchConfig(sizes=("huge",))
  config = config_lib.BenchConfig(variants=("tfps",), sizes=("tiny",))
  assert config_lib.BenchConfig.from_json(config.to_json()) == config
