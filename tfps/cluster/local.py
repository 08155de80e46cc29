"""A whole cluster as local OS processes: what `tfps local`, chaos and tests run.

Each task is its own process running `python -m tfps run` — the same path
users run on real machines — on a portpicker port, by default inside a
private network namespace (see `netns`) so no other host can reach it.

Lifecycle: `start()` launches every ps and worker and waits (with a deadline)
until each answers on gRPC; `close()` ends every process it ever started.
Processes also die with their parent: each has a parent-death signal and its
own process group (see `processes`). Use as a context manager.

Guarantees: a restarted task comes back at the **same address**; `kill`,
`pause` and `resume` send real signals; nothing here sleeps without a
deadline.
"""

import atexit
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import Sequence

import portpicker
from absl import logging

from tfps.cluster import hosts as hosts_lib
from tfps.cluster import netns
from tfps.cluster import output_tail
from tfps.cluster import processes
from tfps.cluster import readiness
from tfps.cluster import scratch
from tfps.cluster import server_threads
from tfps.cluster import spec as spec_lib
from tfps.base import errors
from tfps.base import files
from tfps.base import settings

JobType = spec_lib.JobType
# How often a wait for readiness looks whether a task has exited.
_EXIT_CHECK_SECONDS = 0.25
# On virtual hosts every task listens on the same port, as on separate VMs.
_NETNS_PORT = 2222
TaskId = spec_lib.TaskId


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalClusterConfig:
  """Shape and behaviour of a local cluster.

  Attributes:
    num_ps: parameter servers (>= 1).
    num_workers: workers started with the cluster (>= 1).
    max_workers: workers in the cluster spec (default `num_workers`): those
      beyond `num_workers` are places for workers that join later (their
      handles exist, unstarted, until `TaskHandle.start`).
    work_dir: where the spec file and per-task logs go; default a temp dir.
    isolate_network: run in a private network namespace when possible.
    hosts: "loopback" (every task on one private loopback) or "netns" (every
      task on its own virtual host with its own address, see `hosts`; the
      cluster spec names the hosts, `chief-0`, `ps-1`, ..., not addresses).
    new_address_on_restart: on virtual hosts, a task started again comes
      back on a new host at a new address under the same name, as a
      Kubernetes pod does (False: at the same address, as a VM restarted in
      place).
    ready_timeout: seconds to wait for every task to answer after a start.
    task_flags: extra flags for every ps/worker `tfps run`.
    graph_cache_dir: where workers keep the function graphs TensorFlow
      optimized for them (`ps_worker.graph_cache`); None: a scratch directory
      of this cluster's, removed with it; "": they keep none.
    chief_standby: a second chief replica, on a host of its own, that stands
      by and takes over when the first is lost (`recovery.chief_lease`).
  """

  num_ps: int = 2
  num_workers: int = 2
  max_workers: int | None = None
  work_dir: str | None = None
  isolate_network: bool = True
  hosts: str = "loopback"
  new_address_on_restart: bool = True
  ready_timeout: float = settings.DEFAULTS["ready_timeout"]
  task_flags: tuple[str, ...] = ()
  graph_cache_dir: str | None = None
  chief_standby: bool = False

  def __post_init__(self):
    for field in ("num_ps", "num_workers"):
      value = getattr(self, field)
      if not isinstance(value, int) or value < 1:
        raise errors.UsageError(f"{field} ({value!r}) must be a positive integer")
    if self.max_workers is not None and (
        not isinstance(self.max_workers, int) or self.max_workers < self.num_workers):
      raise errors.UsageError(
          f"max_workers ({self.max_workers!r}) must be an integer >= num_workers "
          f"({self.num_workers})")
    if self.hosts not in ("loopback", "netns"):
      raise errors.UsageError(f"hosts ({self.hosts!r}) must be loopback or netns")
    if self.hosts == "netns" and (reason := hosts_lib.unavailable()) is not None:
      raise errors.UsageError(f"hosts (netns): {reason}")
    if self.ready_timeout <= 0:
      raise errors.UsageError(f"ready_timeout ({self.ready_timeout}) must be positive")


class TaskExitedError(errors.TfpsError):
  """A ps or worker exited before it answered.

  Its exit code is the run's: a task that exits 1 or 2 at start would do so
  again (bad flags, a bug); any other end (a signal, a lost port) may not.
  """

  def __init__(self, task: TaskId, pid: int | None, returncode: int,
               last_lines: Sequence[str], log_path: str):
    how = (f"killed by {signal.Signals(-returncode).name}" if returncode < 0
           and -returncode in signal.valid_signals() else f"exited with code {returncode}")
    last = f": {last_lines[-1].strip()[:200]}" if last_lines else ""
    super().__init__(f"{task} {how} before it answered{last} (log: {log_path})")
    self.task, self.pid, self.returncode = task, pid, returncode
    self.last_lines = tuple(last_lines)
    self.exit_code = (errors.ExitCode(returncode) if returncode in (errors.ExitCode.PERMANENT,
                                                                    errors.ExitCode.USAGE)
                      else errors.ExitCode.CLUSTER_LOST)


class TaskHandle:
  """One task's process. Its name in the cluster spec never changes across restarts."""

  def __init__(self, cluster: "LocalCluster", task: TaskId, argv: Sequence[str],
               stdout_path: str | None = None, stderr_to_parent: bool = False):
    self.task = task
    self._cluster = cluster
    self._argv = list(argv)
    self._stdout_path = stdout_path
    self._stderr_to_parent = stderr_to_parent
    self._process: subprocess.Popen | None = None
    self._tail: output_tail.OutputTail | None = None
    self.starts = 0

  @property
  def address(self) -> str:
    return self._cluster.spec.address(self.task)

  @property
  def log_path(self) -> str:
    return os.path.join(self._cluster.log_dir, f"{self.task.job.value}-{self.task.index}.log")

  @property
  def pid(self) -> int | None:
    return self._process.pid if self._process else None

  @property
  def alive(self) -> bool:
    return self._process is not None and self._process.poll() is None

  @property
  def returncode(self) -> int | None:
    return self._process.poll() if self._process else None

  def start(self) -> None:
    if self.alive:
      raise RuntimeError(f"{self.task} is already running (pid {self.pid})")
    if self.starts:
      self._cluster.host_restarting(self.task)
    with open(self.log_path, "a", encoding="utf-8") as log, (
        open(self._stdout_path, "a", encoding="utf-8") if self._stdout_path
        else contextlib.nullcontext()) as out:
      log.write(f"--- start #{self.starts + 1} of {self.task}: {' '.join(self._argv)}\n")
      log.flush()
      self._process = self._cluster.spawn(
          self._argv, task=self.task, stdout=out if out is not None else log,
          stderr=subprocess.PIPE if self._stderr_to_parent else log)
    if self._stderr_to_parent:
      # Shown as it comes, and kept in the log too: its last lines say why it died.
      log_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND)
      self._tail = output_tail.OutputTail(self._process.stderr, (2, log_fd),
                                          name=str(self.task), close_sinks=(log_fd,))
    self.starts += 1

  def last_lines(self, count: int = 200) -> tuple[str, ...]:
    """The end of the task's output (after it exited: why)."""
    if self._tail is not None:
      return self._tail.last_lines()[-count:]
    return files.last_lines(self.log_path, count)

  def kill(self, sig: int = signal.SIGKILL) -> None:
    """Sends `sig` to the task's process group (a real signal)."""
    if self._process is not None:
      processes.signal_group(self._process, sig)

  def pause(self) -> None:
    """Freezes the whole task, children in their own sessions included."""
    if self._process is not None:
      processes.signal_tree(self._process, signal.SIGSTOP)

  def resume(self) -> None:
    if self._process is not None:
      processes.signal_tree(self._process, signal.SIGCONT)

  def wait(self, timeout: float) -> int:
    """Waits for the process to exit; returns its exit code (-N: signal N)."""
    if self._process is None:
      raise RuntimeError(f"{self.task} was never started")
    try:
      return processes.wait_for_exit(self._process, timeout)
    except TimeoutError as e:
      raise TimeoutError(f"{self.task}: {e}; see {self.log_path}") from None

  def stop(self, grace: float = 5.0) -> int | None:
    """SIGTERM, then SIGKILL after `grace` s; returns the exit code."""
    if self._process is None:
      return None
    return processes.stop_group(self._process, grace=grace)

  def restart(self, *, wait_ready: bool = True, timeout: float | None = None) -> None:
    """Kills the task if it runs (SIGKILL), starts it again under the same name."""
    if self.alive:
      self.kill(signal.SIGKILL)
      self.wait(timeout=10.0)
    self.start()
    if wait_ready:
      self._cluster.wait_ready([self.task], timeout)


class LocalCluster:
  """ps + worker processes on loopback (see the module docstring)."""

  def __init__(self, config: LocalClusterConfig = LocalClusterConfig()):
    self.config = config
    self._temp_dir = None
    if config.work_dir is None:
      # Removed by close(), or by a later cluster's sweep if this process is killed.
      self._temp_dir = scratch.ScratchDir("tfps-local-")
    self.work_dir = config.work_dir or self._temp_dir.path
    self._graph_cache: scratch.ScratchDir | None = None  # Made by start().
    self.log_dir = os.path.join(self.work_dir, "logs")
    self.network: netns.PrivateNetwork | None = None
    self.virtual_hosts: hosts_lib.VirtualHosts | None = None
    num_workers = config.max_workers or config.num_workers
    chiefs = 2 if config.chief_standby else 1
    if config.hosts == "netns":
      # Like separate VMs: every task on its own named host, all on the same port.
      counts = {"chief": chiefs, "ps": config.num_ps, "worker": num_workers}
      jobs = {job: [f"{host_name(TaskId(JobType(job), i))}:{_NETNS_PORT}" for i in range(n)]
              for job, n in counts.items()}
    else:
      jobs = {"chief": [_chief_address() for _ in range(chiefs)],
              "ps": _addresses(config.num_ps),
              "worker": _addresses(num_workers)}
    self.spec = spec_lib.ClusterSpec.from_dict(jobs)
    self._host_of = {task: i for i, task in enumerate(self.spec.tasks())}
    self.spec_file = os.path.join(self.work_dir, "cluster.json")
    self.tasks: dict[TaskId, TaskHandle] = {}
    self._closed = False

  # -- lifecycle -----------------------------------------------------------------

  def start(self) -> "LocalCluster":
    os.makedirs(self.log_dir, exist_ok=True)
    with open(self.spec_file, "w", encoding="utf-8") as f:
      json.dump({"cluster": self.spec.as_dict()}, f)
    atexit.register(self.close)
    if self.config.hosts == "netns":
      self.virtual_hosts = hosts_lib.VirtualHosts(
          [host_name(task) for task in self._host_of], os.path.join(self.log_dir, "hosts"))
    elif self.config.isolate_network:
      self.network = netns.PrivateNetwork.create()
    try:
      graph_cache_dir = self.config.graph_cache_dir
      if graph_cache_dir is None:
        # Outlives worker restarts, not the cluster (a later sweep, if we are killed).
        self._graph_cache = scratch.ScratchDir("tfps-graph-cache-")
        graph_cache_dir = self._graph_cache.path
      for task in self.spec.tasks():
        if task.job == JobType.CHIEF:
          continue
        own = self._worker_flags(graph_cache_dir) if task.job == JobType.WORKER else ()
        handle = TaskHandle(self, task, self.task_argv(task, (*own, *self.config.task_flags)))
        self.tasks[task] = handle
        if task.job == JobType.PS or task.index < self.config.num_workers:
          handle.start()  # The others join later.
      self.wait_ready()
    except BaseException:
      self.close()
      raise
    room = self.spec.num_tasks(JobType.WORKER)
    logging.info("local cluster up: %d ps, %d workers%s (%s); logs in %s",
                 self.config.num_ps, self.config.num_workers,
                 f" (room for {room})" if room > self.config.num_workers else "",
                 "private network" if self.isolated else "HOST network", self.log_dir)
    return self

  def __enter__(self) -> "LocalCluster":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Ends every process this cluster started; idempotent."""
    if self._closed:
      return
    self._closed = True
    atexit.unregister(self.close)
    # The chief first: ps/workers stopped under a live chief would warn it and
    # wait for a checkpoint save.
    for handle in sorted(self.tasks.values(), key=lambda h: h.task.job != JobType.CHIEF):
      handle.stop(grace=3.0)
    if self.network is not None:
      self.network.close()
    if self.virtual_hosts is not None:
      self.virtual_hosts.close()
    for directory in (self._temp_dir, self._graph_cache):
      if directory is not None:
        directory.cleanup()

  # -- tasks --------------------------------------------------------------------

  @property
  def isolated(self) -> bool:
    return self.network is not None or self.virtual_hosts is not None

  def _netns_fd(self, task: TaskId | None) -> int | None:
    """The network a process of `task` runs in (None: the host's own)."""
    if self.virtual_hosts is not None:
      # Helpers (probes, tools) run on the chief's host, like a login shell.
      return self.virtual_hosts.fd(self._host_of[task or TaskId(JobType.CHIEF, 0)])
    return self.network.fd if self.network is not None else None

  def host_restarting(self, task: TaskId) -> None:
    """`task` is about to start again: on virtual hosts, on a new host at a new address."""
    if self.virtual_hosts is not None and self.config.new_address_on_restart:
      address = self.virtual_hosts.move(self._host_of[task])
      logging.info("%s comes back at a new address: %s is %s now", task, host_name(task), address)

  def partition(self, task: TaskId) -> None:
    """Cuts `task`'s host off the network (netns hosts only)."""
    self._require_hosts("partition").partition(self._host_of[task])

  def heal(self, task: TaskId) -> None:
    self._require_hosts("heal").heal(self._host_of[task])

  def _require_hosts(self, what: str) -> hosts_lib.VirtualHosts:
    if self.virtual_hosts is None:
      raise RuntimeError(f"{what} needs hosts='netns'")
    return self.virtual_hosts

  def _worker_flags(self, graph_cache_dir: str) -> tuple[str, ...]:
    """A worker's own flags: its graph cache and, unless `task_flags` set them, its
    share of this machine's cores for its kernels (every worker of the spec runs
    here; `server_threads.intra_op_threads`)."""
    own = (f"--graph_cache_dir={graph_cache_dir}",)
    if any(f.startswith("--intra_op_threads") for f in self.config.task_flags):
      return own
    threads = server_threads.intra_op_threads(
        JobType.WORKER, server_threads.usable_cores(), self.spec.num_tasks(JobType.WORKER))
    return (*own, f"--intra_op_threads={threads}")

  def task_argv(self, task: TaskId, extra_flags: Sequence[str] = ()) -> list[str]:
    """The `tfps run` command line of `task` (what a user would run)."""
    return [sys.executable, "-m", "tfps", "run", f"--cluster_spec={self.spec_file}",
            f"--job_name={task.job.value}", f"--task_index={task.index}", *extra_flags]

  def ps(self, index: int) -> TaskHandle:
    return self.tasks[TaskId(JobType.PS, index)]

  def worker(self, index: int) -> TaskHandle:
    return self.tasks[TaskId(JobType.WORKER, index)]

  def add_chief(self, chief_flags: Sequence[str], *, stdout_path: str,
                stderr_to_parent: bool = False, replica: int = 0) -> TaskHandle:
    """Registers (does not start) chief replica `replica`: `tfps run` with `chief_flags`."""
    chief = TaskId(JobType.CHIEF, replica)
    handle = TaskHandle(self, chief, self.task_argv(chief, chief_flags),
                        stdout_path=stdout_path, stderr_to_parent=stderr_to_parent)
    self.tasks[chief] = handle
    return handle

  def spawn(self, argv: Sequence[str], *, task: TaskId | None = None,
            **kwargs) -> subprocess.Popen:
    """Starts a process in the cluster's network (on `task`'s host), tied to our life."""
    if self._closed:
      raise RuntimeError("the local cluster is closed")
    hosts_file = self.virtual_hosts.hosts_file if self.virtual_hosts is not None else None
    return processes.spawn(argv, netns_fd=self._netns_fd(task), hosts_file=hosts_file, **kwargs)

  def wait_ready(self, tasks: Sequence[TaskId] | None = None,
                 timeout: float | None = None) -> None:
    """Blocks until `tasks` (default: every ps and worker started) answer on gRPC.

    Raises:
      readiness.ClusterUnreachableError: naming the tasks that did not answer.
      TaskExitedError: a task's process exited before it answered.
    """
    timeout = timeout or self.config.ready_timeout
    tasks = list(tasks) if tasks is not None else [
        t for t, handle in self.tasks.items() if t.job != JobType.CHIEF and handle.starts]
    self._raise_if_exited(tasks)
    # Probed from a process of its own (inside the cluster's network, if it has
    # one) while we watch the tasks: one that dies is reported at once, not
    # after the probe's deadline.
    probe = self.spawn([sys.executable, "-m", "tfps.cluster.probe", self.spec_file, str(timeout),
                        *map(str, tasks)], stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    deadline = time.monotonic() + timeout + 30
    try:
      while True:
        try:
          out, err = probe.communicate(timeout=_EXIT_CHECK_SECONDS)
          break
        except subprocess.TimeoutExpired:
          self._raise_if_exited(tasks)
          if time.monotonic() > deadline:
            raise TimeoutError(f"readiness probe for {', '.join(map(str, tasks))} "
                               f"ran over {timeout + 30:.0f}s") from None
    finally:
      processes.stop_group(probe, grace=0)
    if probe.returncode != 0:
      self._raise_if_exited(tasks)
      try:
        unreachable = [TaskId.parse(name) for name in json.loads(out)]
      except ValueError:  # The probe itself failed; say how.
        raise RuntimeError(f"readiness probe failed: {err.decode().strip()}") from None
      raise readiness.ClusterUnreachableError(unreachable, timeout, self.spec)

  def _raise_if_exited(self, tasks: Sequence[TaskId]) -> None:
    for task in tasks:
      handle = self.tasks[task]
      if not handle.alive:
        raise TaskExitedError(task, handle.pid, handle.returncode, handle.last_lines(),
                              handle.log_path)

  def run_tool(self, argv: Sequence[str], *, task: TaskId | None = None,
               timeout: float = 10.0) -> str:
    """Runs a short command in the cluster's network (on `task`'s host); its stdout."""
    return processes.output_of(
        self.spawn(argv, task=task, stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
        argv, timeout)

  def resolve(self, name: str, task: TaskId | None = None) -> str:
    """The IP address `name` has in the cluster's network (as `task`'s host sees it)."""
    return self.run_tool(["getent", "hosts", name], task=task).split()[0]

  def listening_ports(self, task: TaskId | None = None) -> set[int]:
    """TCP ports listening in the cluster's network (on `task`'s host)."""
    out = self.run_tool(["ss", "-ltnH"], task=task)
    return {int(line.split()[3].rpartition(":")[2]) for line in out.splitlines() if line.strip()}


def host_name(task: TaskId) -> str:
  """A task's host name on virtual hosts (`ps-1`): what the cluster spec lists."""
  return f"{task.job.value}-{task.index}"


def _chief_address() -> str:
  """A free port for the chief whose next port (its control channel) is free too."""
  for _ in range(100):
    port = portpicker.pick_unused_port()
    if port < 65535 and portpicker.is_port_free(port + 1):
      return f"localhost:{port}"
  raise OSError("no free port pair for the chief and its control channel")


def _addresses(count: int) -> list[str]:
  return [f"localhost:{portpicker.pick_unused_port()}" for _ in range(count)]
