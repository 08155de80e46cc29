"""Shared helpers for tests that start real processes."""

import os
import subprocess
import sys

import pytest

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
