"""A ps/worker whose port is taken: one line, a retryable exit code (real sockets)."""

import socket

import portpicker

from tfps.base import errors
from tfps.ps_worker import server

from conftest import run_tfps


def test_a_port_held_by_another_process_is_one_line_and_retryable():
  port, other = portpicker.pick_unused_port(), portpicker.pick_unused_port()
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
    holder.bind(("0.0.0.0", port))
    holder.listen()
    assert server.port_in_use(port)
    result = run_tfps(["run", "--job_name=ps", "--task_index=0",
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
