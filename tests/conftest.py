"""Shared helpers for tests that start real processes.

The cluster tests share two LocalClusters (1 ps, 2 workers) for the whole
session, one on a private loopback and one on virtual hosts: each start
costs a TensorFlow import per task (~10 s on 2 cores). A module takes a
cluster through `loopback_cluster` / `netns_cluster`, which hand it over
(and take it back) with no chief and every ps and worker serving, however
the module's tests left it. Every process ends with the session, or with
this process if it is killed (the tasks die with their parent).
"""

import os
import subprocess
import tempfile
import sys

import pytest

from tfps.cluster import hosts
from tfps.cluster import local

import cluster_helpers
import crash_check

# As `tfps` does for its own processes: TF's C++ INFO chatter (start-up notes,
# and at exit one line per remote function handle) is not test output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

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


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "crash_output_expected(*substrings): the test crashes a process on purpose; "
      "crash lines holding one of these do not fail it")


@pytest.fixture(scope="session")
def _temp_root(tmp_path_factory):
  """The session's temporary root; every tfps process keeps its scratch under it."""
  root = tmp_path_factory.getbasetemp()
  scratch = tmp_path_factory.mktemp("scratch")
  os.environ["TMPDIR"] = str(scratch)  # For the processes the tests start...
  tempfile.tempdir = str(scratch)  # ...and for this one, which sweeps their leftovers.
  return str(root)


@pytest.fixture(autouse=True)
def _no_crash_in_any_output(request, _temp_root):
  """Fails a test whose processes wrote a crash anywhere (`crash_check`)."""
  before = crash_check.sizes(_temp_root)
  crash_check.reset()
  yield
  marker = request.node.get_closest_marker("crash_output_expected")
  found = crash_check.fatal_since(_temp_root, before, tuple(marker.args) if marker else ())
  if found:
    pytest.fail("a process crashed (crash_check):\n" + "\n".join(found[:20]), pytrace=False)


@pytest.fixture
def tfps():
  return run_tfps


def _session_cluster(tmp_path_factory, name: str, **config):
  config = local.LocalClusterConfig(num_ps=1, num_workers=2, ready_timeout=180,
                                    work_dir=str(tmp_path_factory.mktemp(name)), **config)
  with local.LocalCluster(config) as running:
    yield running


def _hand_over(cluster: local.LocalCluster) -> None:
  """No chief; every link up, every ps and worker running and answering."""
  cluster_helpers.stop_chief(cluster)
  for task in cluster.spec.tasks():
    if cluster.virtual_hosts is not None:
      cluster.heal(task)
  for handle in cluster.tasks.values():
    if handle.alive:
      handle.resume()  # In case a test left it paused (SIGSTOP).
    else:
      handle.start()
  cluster.wait_ready()


@pytest.fixture(scope="session")
def _loopback_session_cluster(tmp_path_factory):
  yield from _session_cluster(tmp_path_factory, "loopback-cluster")


@pytest.fixture(scope="session")
def _netns_session_cluster(tmp_path_factory):
  if (reason := hosts.unavailable()) is not None:
    pytest.skip(f"virtual hosts unavailable: {reason}")
  yield from _session_cluster(tmp_path_factory, "netns-cluster", hosts="netns")


@pytest.fixture(scope="module")
def loopback_cluster(_loopback_session_cluster):
  """The session's 1-ps/2-worker cluster on a private loopback, for this module."""
  _hand_over(_loopback_session_cluster)
  yield _loopback_session_cluster
  # Now, not at the end: a chief left training would slow every later test.
  cluster_helpers.stop_chief(_loopback_session_cluster)


@pytest.fixture(scope="module")
def netns_cluster(_netns_session_cluster):
  """The session's 1-ps/2-worker cluster on virtual hosts (netns), for this module."""
  _hand_over(_netns_session_cluster)
  yield _netns_session_cluster
  cluster_helpers.stop_chief(_netns_session_cluster)
