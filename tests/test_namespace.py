"""Installed, tfps is one import namespace: nothing else at the top level.

A user's own `cluster/` or `recovery.py` (common names) must not shadow
tfps's parts, and the user API is importable from `tfps` itself.
"""

import subprocess
import sys
import zipfile

import pytest

from tests.support.paths import REPO


def _python(code, cwd, **env):
  return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                        timeout=120, env={"PATH": "/usr/bin:/bin", **env})


def test_the_wheel_holds_only_tfps(tmp_path):
  build = subprocess.run(
      [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
       "-w", str(tmp_path), REPO], capture_output=True, text=True, timeout=300)
  assert build.returncode == 0, build.stderr[-2000:]
  (wheel,) = tmp_path.glob("tfps-*.whl")
  top = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
  (metadata,) = top - {"tfps"}
  assert metadata.endswith(".dist-info"), top


@pytest.mark.parametrize("name", ["cluster", "coordinator", "recovery", "ps_worker"])
def test_no_generic_top_level_module_is_installed(tmp_path, name):
  result = _python(f"import {name}", cwd=tmp_path)
  assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, result.stderr


@pytest.mark.tf
def test_a_users_own_cluster_and_recovery_do_not_shadow_tfps(tmp_path):
  (tmp_path / "cluster").mkdir()
  (tmp_path / "cluster" / "__init__.py").write_text("raise ImportError('the user cluster')\n")
  (tmp_path / "recovery.py").write_text("raise ImportError('the user recovery')\n")
  result = _python(
      "from tfps.cluster import spec; from tfps.recovery import policy; import tfps; "
      "from tfps import Experiment; "  # Loads TensorFlow and every part of tfps.
      "print(sorted(tfps.__all__)[:2], spec.ClusterSpec.__module__)",
      cwd=tmp_path, PYTHONPATH=str(tmp_path))
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ["['BadCheckpointError',", "'DeduplicateOnDevice']",
                                   "tfps.cluster.spec"]


def test_the_user_api_is_exported_from_tfps_without_loading_tensorflow(tmp_path):
  result = _python("import sys, tfps; from tfps import UsageError, ExitCode; "
                   "print('tensorflow' in sys.modules, ExitCode.PREEMPTED.value)", cwd=tmp_path)
  assert result.returncode == 0 and result.stdout.split() == ["False", "143"], result.stderr
