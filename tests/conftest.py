"""The suite's fixtures, in one place (helpers they share: tests/support/).

Tests mirror tfps/: tests/<package>/test_<module>.py tests tfps/<package>/<module>.py;
tests/scripts/ tests scripts/; tests/e2e/ runs the commands on whole clusters.
Three tiers, by marker:

* no marker: pure tests, no TensorFlow in any process (`-m "not tf and not cluster"`);
* `tf`: TensorFlow in one process, the test's own or one child at a time (the
  in-process cluster below counts: its servers are threads of this process);
* `cluster`: a real multi-process cluster; every such test is in tests/e2e/ or
  in a file named test_*_cluster.py (checked at collection).

The cluster tests share two LocalClusters (1 ps, 2 workers) for the whole
session, one on a private loopback and one on virtual hosts: each start
costs a TensorFlow import per task (~10 s on 2 cores). A module takes a
cluster through `loopback_cluster` / `netns_cluster`, which hand it over
(and take it back) with no chief and every ps and worker serving, however
the module's tests left it. Every process ends with the session, or with
this process if it is killed (the tasks die with their parent).

Every test is checked for crashes in whatever its processes wrote
(`_no_crash_in_any_output`, support/crash_check.py).
"""

import os
import sys
import tempfile

import pytest

from tfps.cluster import hosts
from tfps.cluster import local

from tests.support import chief_run
from tests.support import crash_check
from tests.support import inprocess
from tests.support import paths
from tests.support import tfps_command

# As `tfps` does for its own processes: TF's C++ INFO chatter (start-up notes,
# and at exit one line per remote function handle) is not test output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
# The experiments, importable here by the names a chief imports them by
# (`input_experiments:counting`); chiefs get them through `experiments_importable`.
sys.path.insert(0, paths.EXPERIMENTS_DIR)


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "crash_output_expected(*substrings): the test crashes a process on purpose; "
      "crash lines holding one of these do not fail it")


@pytest.hookimpl(tryfirst=True)  # Before pytest-xdist reads the groups.
def pytest_collection_modifyitems(config, items):
  """Every cluster test, and only those, is in tests/e2e/ or a test_*_cluster.py file.

  The cluster tests run one after another on one pytest-xdist worker (one
  group): they share the session's clusters and each needs both cores for
  its processes. The other tests, one process each, run on the other worker
  beside them.
  """
  del config
  misplaced = []
  for item in items:
    path = item.path
    placed = path.name.endswith("_cluster.py") or path.parent.name == "e2e"
    is_cluster = item.get_closest_marker("cluster") is not None
    if placed != is_cluster:
      misplaced.append(item.nodeid)
    if is_cluster:
      item.add_marker(pytest.mark.xdist_group("cluster"))
  if misplaced:
    raise pytest.UsageError("mark cluster tests `cluster` and keep them in tests/e2e/ or a "
                            "test_*_cluster.py file, and no other test there: "
                            + ", ".join(misplaced[:10]))


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
def grpc_server():
  """A bare gRPC server on loopback: it answers the readiness probe as a task does."""
  import concurrent.futures  # pylint: disable=import-outside-toplevel
  import grpc  # pylint: disable=import-outside-toplevel
  import portpicker  # pylint: disable=import-outside-toplevel
  port = portpicker.pick_unused_port()
  server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1))
  server.add_insecure_port(f"127.0.0.1:{port}")
  server.start()
  yield f"127.0.0.1:{port}"
  server.stop(grace=None).wait(5)


@pytest.fixture
def tfps():
  """Runs `tfps ARGS` to completion (support/tfps_command.py)."""
  return tfps_command.run_tfps


@pytest.fixture
def parse_flags():
  """Parses `tfps ARGS` with the real flags, as the command line does; returns the flags.

  The flags are as they were again after the test.
  """
  from absl.testing import flagsaver  # pylint: disable=import-outside-toplevel
  from tfps.commands import cli  # pylint: disable=import-outside-toplevel

  def parse(args):
    cli.FLAGS.unparse_flags()
    cli.FLAGS(["tfps", *args])
    return cli.FLAGS

  with flagsaver.flagsaver():
    yield parse


@pytest.fixture(scope="module")
def experiments_importable():
  """Processes started meanwhile import the experiments of tests/support/experiments/."""
  env = os.environ.get("PYTHONPATH")
  os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [paths.EXPERIMENTS_DIR, env]))
  yield
  if env is None:
    del os.environ["PYTHONPATH"]
  else:
    os.environ["PYTHONPATH"] = env


# --- the in-process cluster (TensorFlow in this process) --------------------------------

@pytest.fixture(scope="session")
def inprocess_cluster():
  """The session's in-process cluster (2 ps, 2 workers; support/inprocess.py): its spec."""
  from tfps.cluster import inprocess as inprocess_lib  # pylint: disable=import-outside-toplevel
  return inprocess_lib.start(inprocess.NUM_PS, inprocess.NUM_WORKERS).cluster


@pytest.fixture(scope="module")
def runtime(inprocess_cluster):
  """This module's connection to the in-process cluster (a strategy and its coordinator)."""
  from tfps.coordinator import strategy as strategy_lib  # pylint: disable=import-outside-toplevel
  return strategy_lib.connect(inprocess_cluster, ready_timeout=30, min_shard_bytes=16 << 10)


# --- the shared LocalClusters (real processes) ------------------------------------------

def _session_cluster(tmp_path_factory, name: str, **config):
  config = local.LocalClusterConfig(num_ps=1, num_workers=2, ready_timeout=180,
                                    work_dir=str(tmp_path_factory.mktemp(name)), **config)
  with local.LocalCluster(config) as running:
    yield running


def _hand_over(cluster: local.LocalCluster) -> None:
  """No chief; every link up, every ps and worker running and answering."""
  chief_run.stop_chief(cluster)
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
  chief_run.stop_chief(_loopback_session_cluster)


@pytest.fixture(scope="module")
def netns_cluster(_netns_session_cluster):
  """The session's 1-ps/2-worker cluster on virtual hosts (netns), for this module."""
  _hand_over(_netns_session_cluster)
  yield _netns_session_cluster
  chief_run.stop_chief(_netns_session_cluster)
