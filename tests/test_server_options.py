"""ps/worker server thread settings (no servers started)."""

import pytest
import tensorflow as tf

from tfps.cluster import spec as spec_lib
from tfps.ps_worker import server
from tfps.base import errors

CLUSTER = spec_lib.ClusterSpec.from_dict({
    "chief": ["localhost:1001"], "ps": ["localhost:1002"],
    "worker": ["localhost:1003", "localhost:1004"]})


def test_ps_gets_one_intra_op_thread_and_nobody_spins():
  options = server.ServerOptions()
  ps = server.session_config_for(spec_lib.JobType.PS, CLUSTER, options, tf)
  worker = server.session_config_for(spec_lib.JobType.WORKER, CLUSTER, options, tf)
  assert ps.intra_op_parallelism_threads == 1
  assert worker.intra_op_parallelism_threads == 0  # TF's default: one per core.
  assert ps.inter_op_parallelism_threads == worker.inter_op_parallelism_threads == 3
  assert ps.experimental.disable_thread_spinning and worker.experimental.disable_thread_spinning


def test_explicit_thread_settings_win():
  options = server.ServerOptions(inter_op_threads=8, intra_op_threads=4, thread_spinning=True)
  ps = server.session_config_for(spec_lib.JobType.PS, CLUSTER, options, tf)
  assert (ps.inter_op_parallelism_threads, ps.intra_op_parallelism_threads) == (8, 4)
  assert not ps.experimental.disable_thread_spinning


def test_bad_thread_counts_name_field_and_value():
  with pytest.raises(errors.UsageError, match=r"intra_op_threads \(0\) must be a positive"):
    server.ServerOptions(intra_op_threads=0)
