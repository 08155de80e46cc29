"""Shared helpers for tests that start real processes."""

import os
import subprocess
import sys

import pytest

# As `tfps` does for its own processes: TF's C++ INFO chatter (start-up notes,
# and at exit one line per remote function handle) is not test output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

TFPS = [sys.executable, "-m", "tfps"]


def run_tfps(args, *, env=None, timeout=60):
  """Runs `tfps ARGS` to completion; returns the CompletedProcess."""
  full_env = dict(os.environ)
  full_env.pop("TF_CONFIG", None)
  full_env.update(env or {})
  return subprocess.run(TFPS + list(args), env=full_env, capture_output=True, text=True,
                        timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def tfps():
  return run_tfps
