"""Children never outlive their parent: real processes, real SIGKILL."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tfps.cluster import launcher
from tfps.cluster import processes

from tests.support import procs

PARENT = textwrap.dedent("""
    import sys, time
    from tfps.cluster import processes
    child = processes.spawn([sys.executable, "-c", "import time; time.sleep(300)"])
    print(child.pid, flush=True)
    time.sleep(300)
""")


def test_child_dies_when_parent_is_sigkilled():
  parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
  try:
    child_pid = int(parent.stdout.readline())
    assert procs.alive(child_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    processes.wait_until(lambda: not procs.alive(child_pid), timeout=10,
                         what=f"child {child_pid} to die with its parent")
  finally:
    parent.kill()
    parent.wait(10)


def test_stop_group_ends_a_stopped_process_and_its_children():
  process = processes.spawn(
      ["sh", "-c", "sleep 300 & sleep 300"], stdout=subprocess.DEVNULL)
  processes.signal_group(process, signal.SIGSTOP)
  code = processes.stop_group(process, grace=1.0)
  assert code is not None and code != 0
  # No process of its group is left (a SIGKILLed one can take a moment to go).
  group_empty = lambda: subprocess.run(
      ["pgrep", "-g", str(process.pid)], capture_output=True, text=True).stdout.strip() == ""
  processes.wait_until(group_empty, timeout=5, what=f"process group {process.pid} to be empty")


def test_wait_until_names_what_it_waited_for():
  with pytest.raises(TimeoutError, match=r"0\.2s waiting for the moon"):
    processes.wait_until(lambda: False, timeout=0.2, what="the moon")


def test_signal_tree_freezes_children_in_their_own_sessions():
  # As the chief's supervisor does with its coordinator: the child is in its
  # own session, out of reach of a signal to the parent's process group.
  parent = processes.spawn([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
  try:
    child_pid = int(parent.stdout.readline())
    assert os.getpgid(child_pid) != os.getpgid(parent.pid)
    processes.signal_tree(parent, signal.SIGSTOP)
    processes.wait_until(lambda: procs.state(parent.pid) == "T" and procs.state(child_pid) == "T",
                         timeout=10, what="parent and child to be stopped")
    processes.signal_tree(parent, signal.SIGCONT)
    processes.wait_until(lambda: procs.state(parent.pid) != "T" and procs.state(child_pid) != "T",
                         timeout=10, what="parent and child to run again")
  finally:
    processes.stop_group(parent, grace=1.0)


def test_no_python_runs_between_fork_and_exec(monkeypatch):
  # subprocess runs a preexec_fn in the forked child, before exec: unsafe in a
  # process with threads (every tfps process has gRPC's). spawn must give none.
  seen = {}
  real = subprocess.Popen.__init__

  def record(self, *args, **kwargs):
    seen.update(kwargs)
    real(self, *args, **kwargs)

  monkeypatch.setattr(subprocess.Popen, "__init__", record)
  processes.spawn(["true"]).wait(10)
  assert seen.get("preexec_fn") is None and seen["start_new_session"]


def test_a_child_whose_parent_died_before_it_started_leaves_at_once():
  # The window between fork and the child's parent-death signal: the launcher
  # finds its parent gone (here: a pid that is not its parent) and never runs
  # the command.
  argv = processes.launch_argv(["echo", "ran"], parent_pid=1, netns_fd=None)
  done = subprocess.run(argv, capture_output=True, timeout=30)
  assert done.returncode == launcher.PARENT_GONE and not done.stdout


def test_the_launcher_execs_the_command_in_place_in_its_own_group():
  child = processes.spawn(["sh", "-c", "echo $$; exec sleep 300"], stdout=subprocess.PIPE)
  try:
    assert int(child.stdout.readline()) == child.pid  # The pid the caller holds.
    assert os.getpgid(child.pid) == child.pid
  finally:
    processes.stop_group(child, grace=0)


def test_a_missing_program_fails_at_spawn():
  with pytest.raises(FileNotFoundError, match="no-such-program"):
    processes.spawn(["no-such-program-tfps"])


def test_no_tfps_module_hands_subprocess_a_pre_exec_hook():
  root = os.path.dirname(os.path.dirname(os.path.abspath(processes.__file__)))
  offenders = []
  for directory, _, names in os.walk(root):
    for name in names:
      if name.endswith(".py"):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
          if "preexec_fn" in f.read():
            offenders.append(os.path.join(directory, name))
  assert offenders == []
