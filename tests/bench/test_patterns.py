"""The bench's tfps variant trains as users get it by default (no cluster)."""

import pytest

from tfps.base import settings
from tfps.bench import patterns

pytestmark = pytest.mark.tf


def test_the_tfps_variant_keeps_the_chief_s_fence_and_closure_bound_on():
  options = patterns.tfps_loop_options(steps_per_closure=50, unroll=50)
  assert options.rerun_slow_closures == settings.DEFAULTS["rerun_slow_closures"] is True
  assert options.max_closure_seconds == settings.DEFAULTS["max_closure_seconds"] > 0
  assert (options.steps_per_closure, options.unroll, options.looped_seconds) == (50, 50, 0.0)
