"""The README's set-up commands are what CI runs (they must stay true)."""

import os
import re

from tests.support.paths import REPO as ROOT


def _read(*path):
  with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
    return f.read()


def test_ci_runs_the_readme_test_command():
  blocks = re.findall(r"```sh\n(.*?)\n```", _read("README.md"), flags=re.S)
  test_commands = [b for b in blocks if "pytest" in b]
  assert len(test_commands) == 1, test_commands
  assert test_commands[0] in _read(".ci", "run").splitlines()


def test_readme_main_command_runs_tfps_local():
  blocks = re.findall(r"```sh\n(.*?)\n```", _read("README.md"), flags=re.S)
  assert any(b.startswith("python3 -m venv .venv") and "tfps local" in b for b in blocks)
