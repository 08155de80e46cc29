"""The ps/worker server (tfps.ps_worker.server): its thread settings (no server
started), and a port that is taken: one line, a retryable exit code (real sockets)."""

import socket

import portpicker
import pytest
import tensorflow as tf

from tfps.base import errors
from tfps.cluster import server_threads
from tfps.cluster import spec as spec_lib
from tfps.ps_worker import server

from tests.support import tfps_command

pytestmark = pytest.mark.tf

CONFIG_PROTO = tf.compat.v1.ConfigProto  # What a server's session config is made of.
CLUSTER = spec_lib.ClusterSpec.from_dict({
    "chief": ["localhost:1001"], "ps": ["localhost:1002"],
    "worker": ["localhost:1003", "localhost:1004"]})


def test_ps_gets_one_intra_op_thread_and_nobody_spins():
  options = server.ServerOptions()
  ps = server.session_config_for(spec_lib.JobType.PS, CLUSTER, options, CONFIG_PROTO)
  worker = server.session_config_for(spec_lib.JobType.WORKER, CLUSTER, options, CONFIG_PROTO)
  assert ps.intra_op_parallelism_threads == 1
  # The cores this process may use, a container's CPU limit included (not TF's 0).
  assert worker.intra_op_parallelism_threads == server_threads.usable_cores() >= 1
  assert ps.inter_op_parallelism_threads == worker.inter_op_parallelism_threads == 3
  assert ps.experimental.disable_thread_spinning and worker.experimental.disable_thread_spinning


def test_explicit_thread_settings_win():
  options = server.ServerOptions(inter_op_threads=8, intra_op_threads=4, thread_spinning=True)
  ps = server.session_config_for(spec_lib.JobType.PS, CLUSTER, options, CONFIG_PROTO)
  assert (ps.inter_op_parallelism_threads, ps.intra_op_parallelism_threads) == (8, 4)
  assert not ps.experimental.disable_thread_spinning


def test_bad_thread_counts_name_field_and_value():
  with pytest.raises(errors.UsageError, match=r"intra_op_threads \(0\) must be a positive"):
    server.ServerOptions(intra_op_threads=0)


def test_a_port_held_by_another_process_is_one_line_and_retryable():
  port, other = portpicker.pick_unused_port(), portpicker.pick_unused_port()
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
    holder.bind(("0.0.0.0", port))
    holder.listen()
    assert server.port_in_use(port)
    result = tfps_command.run_tfps(["run", "--job_name=ps", "--task_index=0",
                       f"--ps_hosts=localhost:{port}", f"--worker_hosts=localhost:{other}",
                       "--nopreemption_notice"], timeout=120)
  assert result.returncode == errors.ExitCode.ADDRESS_IN_USE == 171, result.stderr[-2000:]
  assert errors.ExitCode(result.returncode).retryable
  lines = [l for l in result.stderr.splitlines() if l.startswith("tfps: error: ")]
  assert lines == [f"tfps: error: ps:0: address localhost:{port} is in use (port {port} is "
                   "held by another process, often the previous one of this task still "
                   "exiting); free it or wait, then start again"], result.stderr[-2000:]
  assert "Traceback" not in result.stderr and "Could not start gRPC server" not in result.stderr
  assert not server.port_in_use(port)  # Free again once its holder closed it.
