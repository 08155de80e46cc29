"""`tfps` bad input: a one-line error naming field and value, exit code 2, fast."""

import json
import os
import shutil
import subprocess

import pytest

from tests.support.tfps_command import TFPS
from tfps.commands import cli

CLUSTER = {"chief": ["localhost:1001"], "ps": ["localhost:1002"], "worker": ["localhost:1003"]}


def one_error_line(result) -> str:
  lines = [l for l in result.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith("tfps: error: ")
  return lines[0]


def test_malformed_tf_config_exits_2_with_one_line(tfps):
  result = tfps(["run"], env={"TF_CONFIG": "{not json"})
  assert result.returncode == 2
  assert "TF_CONFIG: malformed JSON '{not json'" in one_error_line(result)
  assert result.stdout == ""


@pytest.mark.parametrize("args, env, expected", [
    (["run"], {}, "TF_CONFIG: is empty"),
    (["run"], {"TF_CONFIG": json.dumps({"cluster": CLUSTER})}, "TF_CONFIG.task: missing"),
    (["run"], {"TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": {"type": "ps", "index": 4}})},
     "task.index: 4 is out of range"),
    (["run", "--ps_hosts=localhost:1", "--worker_hosts=localhost:1", "--job_name=ps"], {},
     "--worker_hosts[0]: duplicate address 'localhost:1'"),
    (["run", "--cluster_spec=/nonexistent/spec.json", "--job_name=ps"], {},
     "--cluster_spec: cannot read '/nonexistent/spec.json'"),
    (["run", "--task_index=x"], {}, "flag --task_index=x"),
    (["run", "--no_such_flag"], {}, "Unknown command line flag 'no_such_flag'"),
    (["fly"], {}, "command: expected one of run, local, chaos, k8s, bench, got 'fly'"),
    (["run", "--mode=sideways"], {}, "flag --mode=sideways"),
    (["local", "--hosts=vm"], {}, "flag --hosts=vm: value should be one of <loopback|netns>"),
    (["chaos", "--hosts=vm"], {}, "flag --hosts=vm: value should be one of <loopback|netns>"),
])
def test_bad_usage(tfps, args, env, expected):
  result = tfps(args, env=env)
  assert result.returncode == 2, result.stderr
  assert expected in one_error_line(result)


def test_evaluator_role_is_refused_with_a_reason(tfps):
  config = {"cluster": dict(CLUSTER, evaluator=["localhost:1004"]),
            "task": {"type": "evaluator", "index": 0}}
  result = tfps(["run"], env={"TF_CONFIG": json.dumps(config)})
  assert result.returncode == 2
  assert "evaluator" in one_error_line(result)


@pytest.mark.parametrize("faults, expected", [
    ("worker:9@1:kill", "--faults: 'worker:9@1:kill': no task worker:9 in this cluster"),
    ("ps:0@1:zap", "action 'zap' is not kill, term, stop, cut, join or leave"),
    ("ps:0@1:cut+3", "'cut' needs --hosts=netns"),
])
def test_chaos_bad_fault_spec_fails_before_starting_anything(tfps, tmp_path, faults, expected):
  result = tfps(["chaos", f"--faults={faults}", f"--model_dir={tmp_path}"])
  assert result.returncode == 2, result.stderr
  assert expected in result.stderr.splitlines()[-1]
  assert not (tmp_path / "logs").exists()  # No cluster was started.


def _chief_env():
  return {"TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": {"type": "chief", "index": 0}})}


def test_chief_needs_a_model_dir(tfps):
  result = tfps(["run"], env=_chief_env())
  assert result.returncode == 2
  assert "--model_dir: required for the chief" in one_error_line(result)


def test_chief_model_dir_must_be_writable(tfps, tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  result = tfps(["run", f"--model_dir={blocker}/model"], env=_chief_env())
  assert result.returncode == 2
  assert f"--model_dir: '{blocker}/model' is not writable" in one_error_line(result)


@pytest.mark.parametrize("command", ["local", "chaos"])
def test_netns_hosts_without_root_is_refused_in_one_line(tfps, tmp_path, command):
  if os.geteuid() != 0 or shutil.which("setpriv") is None:
    pytest.skip("needs root (to drop it) and setpriv")
  result = subprocess.run(
      ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *TFPS, command,
       "--hosts=netns", f"--model_dir={tmp_path}/model"],
      capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
  assert result.returncode == 2, result.stderr
  assert result.stderr.splitlines()[-1] == "tfps: error: --hosts=netns: network namespaces need root"
  assert not (tmp_path / "model").exists()  # Refused before anything was made.


def test_chief_flags_are_checked_without_tensorflow():
  # `tfps local` validates its chief's flags before starting anything; that
  # stays fast only while the config types do not pull in TensorFlow.
  code = ("import sys; import tfps.coordinator.api, tfps.commands.cli, tfps.commands.local, tfps.commands.run, "
          "tfps.commands.run_spec, tfps.commands.run_result, tfps.commands.experiment_check, tfps.commands.k8s; "
          "print(sorted(m for m in sys.modules if m.split('.')[0] in "
          "('tensorflow', 'tf_keras', 'orbit')))")
  result = subprocess.run(TFPS[:1] + ["-c", code], capture_output=True, text=True, timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "[]"


def _catches(pid: int, signum: int) -> bool:
  """Whether `pid` has a handler installed for `signum` (/proc SigCgt)."""
  with open(f"/proc/{pid}/status") as f:
    caught = next(int(l.split()[1], 16) for l in f if l.startswith("SigCgt:"))
  return bool(caught >> (signum - 1) & 1)


def test_a_coordinator_writes_its_thread_stacks_to_its_log_on_sigusr1(tmp_path):
  # What the supervisor asks of a coordinator that missed its ps deadline
  # before it kills it (recovery.supervisor). This one waits for a cluster
  # that is not there.
  import signal
  from tfps.cluster import processes
  stderr_path = tmp_path / "coordinator.stderr"
  with open(stderr_path, "w") as err:
    process = processes.spawn(
        [*TFPS, "run", "--nosupervise", f"--model_dir={tmp_path}", "--ready_timeout=60"],
        env={**os.environ, **_chief_env()}, stderr=err)
  try:
    processes.wait_until(lambda: _catches(process.pid, signal.SIGUSR1), timeout=30,
                         what="tfps run to install its SIGUSR1 handler")
    process.send_signal(signal.SIGUSR1)
    processes.wait_until(lambda: "most recent call first" in stderr_path.read_text(),
                         timeout=10, what="the thread stacks on its stderr")
    assert process.poll() is None  # Asked, not ended: the supervisor kills it after.
  finally:
    processes.stop_group(process, grace=1)
  assert 'File "' in stderr_path.read_text()


def test_help_lists_the_commands_and_each_commands_own_flags(tfps):
  top = tfps(["--help"])
  assert top.returncode == 0
  for command in ("run", "local", "chaos", "k8s", "bench"):
    assert f"\n  {command} " in top.stdout, top.stdout
  chaos = tfps(["chaos", "--help"])
  assert chaos.returncode == 0 and "--faults (default: none)" in chaos.stdout
  assert "--train_steps (default: 2000)" in chaos.stdout
  assert "--window_steps" not in chaos.stdout and "--image" not in chaos.stdout
  bench = tfps(["bench", "--help"])
  assert "--window_steps" in bench.stdout and "--image" not in bench.stdout


@pytest.mark.parametrize("user, expected", [
    (None, "grpc.dns_min_time_between_resolutions_ms=1000"),
    ("grpc.keepalive_time_ms=60000",
     "grpc.keepalive_time_ms=60000,grpc.dns_min_time_between_resolutions_ms=1000"),
    ("grpc.dns_min_time_between_resolutions_ms=5000", "grpc.dns_min_time_between_resolutions_ms=5000"),
])
def test_grpc_looks_names_up_again_within_a_second_unless_the_user_says(user, expected):
  # A task restarted under its name at a new address is found in about a second.
  assert cli.grpc_options(user) == expected
