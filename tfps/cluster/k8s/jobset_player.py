"""A rendered JobSet played on this machine: what JobSet and the kubelet would do, no API server.

Every pod of the manifest (`jobset_pods`) runs on a virtual host of its own
(`cluster.hosts`) named as JobSet names it (`<pod>.<subdomain>` and
`<pod>`), with the env the pod would get, running the manifest's exact
container command. When a pod ends, `jobset_policy` says what JobSet and the
Job controller do, read from the manifest's own policies, and this carries
it out: a replaced pod comes back on a new host at a new address under the
same name (as a Kubernetes pod does); a restarted JobSet starts every pod
again; a failed or succeeded JobSet stops every pod. The shared volume is the
machine's file system (render with `model_mount` in a directory of yours).
Needs root (network namespaces).
"""

import dataclasses
import os
import signal
import subprocess
import sys
import time

from absl import logging

from tfps.cluster import hosts as hosts_lib
from tfps.cluster import processes
from tfps.cluster.k8s import jobset_policy
from tfps.cluster.k8s import jobset_pods

Outcome = jobset_policy.Outcome
_POLL_SECONDS = 0.25
_STOP_GRACE_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class PlayResult:
  outcome: Outcome  # JOBSET_SUCCEEDED or JOBSET_FAILED.
  restarts: int  # JobSet restarts.
  starts: dict  # Pod hostname -> times its pod was started.


class JobSetPlayer:
  """Plays `manifest` in `work_dir` (logs, the hosts file). Use as a context manager."""

  def __init__(self, manifest: dict, work_dir: str):
    self.policy = jobset_policy.JobSetPolicy.of(manifest)
    self.pods = jobset_pods.planned_pods(manifest)
    self.log_dir = os.path.join(work_dir, "logs")
    os.makedirs(self.log_dir, exist_ok=True)
    self.hosts = hosts_lib.VirtualHosts([f"{p.dns_name} {p.hostname}" for p in self.pods],
                                        os.path.join(work_dir, "hosts"))
    self._processes: list[subprocess.Popen | None] = [None] * len(self.pods)
    self._done: set[int] = set()
    self.starts = {p.hostname: 0 for p in self.pods}
    self.state = jobset_policy.PlayState()

  def __enter__(self) -> "JobSetPlayer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    self._stop_all()
    self.hosts.close()

  def pid(self, hostname: str) -> int | None:
    process = self._processes[self._index(hostname)]
    return process.pid if process is not None and process.poll() is None else None

  def kill(self, hostname: str, sig: int = signal.SIGKILL) -> None:
    """A real signal to the pod's process group (as a node or the OOM killer would)."""
    process = self._processes[self._index(hostname)]
    if process is not None:
      processes.signal_group(process, sig)

  def run(self, timeout: float, on_poll=lambda player: None) -> PlayResult:
    """Starts every pod and plays until the JobSet succeeds or fails, or `timeout`."""
    for i in range(len(self.pods)):
      self._start(i)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      on_poll(self)
      for i, process in enumerate(self._processes):
        if i in self._done or process is None or process.poll() is None:
          continue
        outcome = self._ended(i, _exit_code(process.returncode))
        if outcome in (Outcome.JOBSET_SUCCEEDED, Outcome.JOBSET_FAILED):
          self._stop_all()
          return PlayResult(outcome, self.state.restarts, dict(self.starts))
      time.sleep(_POLL_SECONDS)
    raise TimeoutError(f"the JobSet neither succeeded nor failed within {timeout:.0f}s "
                       f"(pods started: {self.starts}; logs in {self.log_dir})")

  def _ended(self, i: int, code: int) -> Outcome:
    pod = self.pods[i]
    outcome, self.state = jobset_policy.after_exit(
        self.policy, self.state, job=pod.replicated_job, index=pod.index, exit_code=code)
    logging.info("pod %s exited %d: %s", pod.hostname, code, outcome.value)
    if outcome == Outcome.REPLACE_POD:
      self.hosts.move(i)
      self._start(i)
    elif outcome == Outcome.INDEX_DONE:
      self._done.add(i)
    elif outcome == Outcome.RESTART_JOBSET:
      self._stop_all()
      self._done.clear()
      for j in range(len(self.pods)):
        self.hosts.move(j)
        self._start(j)
    return outcome

  def _start(self, i: int) -> None:
    pod = self.pods[i]
    env = dict(os.environ)
    env.update(pod.env)
    # The image's PATH: where this Python's `tfps` is installed.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", os.defpath)
    env.pop("TF_CONFIG", None)
    with open(os.path.join(self.log_dir, f"{pod.hostname}.log"), "a", encoding="utf-8") as log:
      log.write(f"--- start #{self.starts[pod.hostname] + 1}: {' '.join(pod.argv)}\n")
      log.flush()
      self._processes[i] = processes.spawn(
          list(pod.argv), env=env, netns_fd=self.hosts.fd(i), hosts_file=self.hosts.hosts_file,
          stdout=log, stderr=subprocess.STDOUT)
    self.starts[pod.hostname] += 1

  def _stop_all(self) -> None:
    for process in self._processes:
      if process is not None:
        processes.stop_group(process, grace=_STOP_GRACE_SECONDS)

  def _index(self, hostname: str) -> int:
    return next(i for i, p in enumerate(self.pods) if p.hostname == hostname)


def _exit_code(returncode: int) -> int:
  """As the kubelet reports it: a process killed by signal N exited 128 + N."""
  return 128 - returncode if returncode < 0 else returncode
