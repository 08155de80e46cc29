"""The `tfps` command line, run as a user runs it; its output checked for crashes."""

import dataclasses
import os
import subprocess
import sys

from tests.support import crash_check

TFPS = [sys.executable, "-m", "tfps"]


def run_tfps(args, *, env=None, timeout=60):
  """Runs `tfps ARGS` to completion; returns the CompletedProcess."""
  full_env = dict(os.environ)
  full_env.pop("TF_CONFIG", None)
  full_env.update(env or {})
  done = subprocess.run(TFPS + list(args), env=full_env, capture_output=True, text=True,
                        timeout=timeout, stdin=subprocess.DEVNULL)
  crash_check.note(done.stdout, f"stdout of tfps {args[0] if args else ''}")
  crash_check.note(done.stderr, f"stderr of tfps {args[0] if args else ''}")
  return done


@dataclasses.dataclass
class Finished:
  """A `tfps` command that has ended (the e2e tests run it themselves)."""

  code: int
  stdout: str
  stderr: str
  seconds: float


def error_line(run: Finished) -> str:
  """The run's one error line, less its `tfps: error: `; no traceback, no JSON result."""
  errors = [line for line in run.stderr.splitlines() if line.startswith("tfps: error: ")]
  assert len(errors) == 1, run.stderr[-3000:]
  assert "Traceback" not in run.stderr, run.stderr[-3000:]
  assert run.stdout == ""
  return errors[0][len("tfps: error: "):]
