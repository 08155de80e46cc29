"""A rendered manifest played on this machine: what its controllers and the kubelet would do.

No API server: every pod of a JobSet (`jobset_pods`) or a TFJob
(`tfjob_pods`) runs on a virtual host of its own (`cluster.hosts`) under the
DNS name the platform gives it, with the env the pod would get, running the
manifest's exact container command. When a pod ends, the manifest's own
policies say what happens (`jobset_policy`, `tfjob_policy`: pure), and this
carries it out: a replaced pod comes back on a new host at a new address
under the same name (as a Kubernetes pod does); a restart starts every pod
again; a failed or succeeded job stops every pod. A JobSet can be changed
while it plays, as `kubectl patch --type=json` changes it (`Player.patch`:
its "replace" operations): pods the changed manifest adds start on new
hosts, pods it drops (a Job scaled down: the top of its index range) are
stopped, as Elastic Indexed Jobs do. The shared volume is the
machine's file system (render with `model_mount` in a directory of yours).
Needs root (network namespaces).
"""

import copy
import dataclasses
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Mapping, Sequence

from absl import logging

from tfps.cluster import hosts as hosts_lib
from tfps.cluster import processes
from tfps.cluster.k8s import jobset_policy
from tfps.cluster.k8s import jobset_pods
from tfps.cluster.k8s import tfjob_policy
from tfps.cluster.k8s.planned_pod import PlannedPod

Outcome = jobset_policy.Outcome
# What happens when `pod` ended with an exit code, as its controller decides.
Decide = Callable[[PlannedPod, int], Outcome]
_POLL_SECONDS = 0.25
_STOP_GRACE_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class PlayResult:
  outcome: Outcome | None  # SUCCEEDED or FAILED; None: stopped watching (`run`'s `until`).
  restarts: int  # Times every pod was started again (a JobSet restart).
  starts: dict  # Pod hostname -> times its pod was started.


def jobset_player(manifest: dict, work_dir: str) -> "Player":
  """A player of a rendered JobSet (JobSet's and the Job controller's rules)."""
  current = [copy.deepcopy(manifest)]
  state = [jobset_policy.PlayState()]

  def decide(pod: PlannedPod, code: int) -> Outcome:
    outcome, state[0] = jobset_policy.after_exit(
        jobset_policy.JobSetPolicy.of(current[0]), state[0], job=pod.replicated_job,
        index=pod.index, exit_code=code)
    return outcome

  def replan(operations: Sequence[Mapping]) -> list[PlannedPod]:
    current[0] = json_patched(current[0], operations)
    return jobset_pods.planned_pods(current[0])
  return Player(jobset_pods.planned_pods(manifest), decide, work_dir, replan=replan)


def json_patched(manifest: Mapping, operations: Sequence[Mapping]) -> dict:
  """`manifest` changed by a JSON patch's "replace" operations (RFC 6902), as
  `kubectl patch --type=json` sends them; a new dict.

  Raises:
    ValueError: an operation other than "replace", or a path the manifest lacks.
  """
  patched = copy.deepcopy(dict(manifest))
  for operation in operations:
    if operation.get("op") != "replace":
      raise ValueError(f"patch op ({operation.get('op')!r}) must be 'replace'")
    *parents, last = [part.replace("~1", "/").replace("~0", "~")
                      for part in operation["path"].lstrip("/").split("/")]
    node: Any = patched
    try:
      for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
      if (isinstance(node, list) and not 0 <= int(last) < len(node)) or (
          isinstance(node, dict) and last not in node):
        raise KeyError(last)
    except (KeyError, IndexError, ValueError, TypeError):
      raise ValueError(f"patch path ({operation['path']!r}) is not in the manifest") from None
    node[int(last) if isinstance(node, list) else last] = operation["value"]
  return patched


def tfjob_player(manifest: dict, work_dir: str) -> "Player":
  """A player of a rendered TFJob (training-operator v1's reconcile rules)."""
  policy = tfjob_policy.TFJobPolicy.of(manifest)
  return Player(tfjob_policy.planned_pods(manifest),
                lambda pod, code: tfjob_policy.after_exit(policy, pod.replicated_job, code),
                work_dir)


class Player:
  """Plays `pods` in `work_dir` (logs, the hosts file). Use as a context manager."""

  def __init__(self, pods: Sequence[PlannedPod], decide: Decide, work_dir: str, *,
               replan: Callable[[Sequence[Mapping]], list[PlannedPod]] | None = None):
    """`replan(operations)`: the pods of the manifest once patched (`patch`)."""
    self.pods = list(pods)
    self._decide = decide
    self._replan = replan
    self._dropped: set[int] = set()  # Pods a patch took away (stopped, not ended).
    self.restarts = 0
    self.log_dir = os.path.join(work_dir, "logs")
    os.makedirs(self.log_dir, exist_ok=True)
    self.hosts = hosts_lib.VirtualHosts([f"{p.dns_name} {p.hostname}" for p in self.pods],
                                        os.path.join(work_dir, "hosts"))
    self._processes: list[subprocess.Popen | None] = [None] * len(self.pods)
    self._done: set[int] = set()
    self.starts = {p.hostname: 0 for p in self.pods}

  def __enter__(self) -> "Player":
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

  def patch(self, operations: Sequence[Mapping]) -> tuple[list[str], list[str]]:
    """Changes the playing JobSet as `kubectl patch --type=json -p OPERATIONS` would:
    the pods it adds start, the pods it drops stop. Returns (added, dropped) hostnames."""
    if self._replan is None:
      raise ValueError("only a JobSet's player can be patched")
    wanted = {p.hostname: p for p in self._replan(operations)}
    dropped = [p.hostname for i, p in enumerate(self.pods)
               if p.hostname not in wanted and i not in self._dropped]
    for hostname in dropped:
      i = self._index(hostname)
      self._dropped.add(i)
      if self._processes[i] is not None:
        processes.stop_group(self._processes[i], grace=_STOP_GRACE_SECONDS)
    known = {p.hostname for p in self.pods}
    added = []
    for pod in wanted.values():
      if pod.hostname not in known:
        self.hosts.add(f"{pod.dns_name} {pod.hostname}")
        self.pods.append(pod)
        self._processes.append(None)
        self.starts[pod.hostname] = 0
        self._start(len(self.pods) - 1)
      elif (i := self._index(pod.hostname)) in self._dropped:  # Down, then up again.
        self._dropped.discard(i)
        self.hosts.move(i)  # A new pod under its name.
        self._start(i)
      else:
        continue
      added.append(pod.hostname)
    return added, dropped

  def run(self, timeout: float, on_poll=lambda player: None,
          until: Callable[["Player"], bool] = lambda player: False) -> PlayResult:
    """Starts every pod and plays until the job succeeds or fails, or `until(self)`
    says it has seen enough (outcome None; the pods play on until `close`), or `timeout`."""
    for i in range(len(self.pods)):
      self._start(i)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      on_poll(self)
      if until(self):
        return PlayResult(None, self.restarts, dict(self.starts))
      for i, process in enumerate(self._processes):
        if i in self._done or i in self._dropped or process is None or process.poll() is None:
          continue
        outcome = self._ended(i, _exit_code(process.returncode))
        if outcome in (Outcome.SUCCEEDED, Outcome.FAILED):
          self._stop_all()
          return PlayResult(outcome, self.restarts, dict(self.starts))
      time.sleep(_POLL_SECONDS)
    raise TimeoutError(f"the job neither succeeded nor failed within {timeout:.0f}s "
                       f"(pods started: {self.starts}; logs in {self.log_dir})")

  def _ended(self, i: int, code: int) -> Outcome:
    pod = self.pods[i]
    outcome = self._decide(pod, code)
    logging.info("pod %s exited %d: %s", pod.hostname, code, outcome.value)
    if outcome == Outcome.REPLACE_POD:
      self.hosts.move(i)
      self._start(i)
    elif outcome == Outcome.INDEX_DONE:
      self._done.add(i)
    elif outcome == Outcome.RESTART_ALL:
      self.restarts += 1
      self._stop_all()
      self._done.clear()
      for j in range(len(self.pods)):
        if j not in self._dropped:
          self.hosts.move(j)
          self._start(j)
    return outcome

  def _start(self, i: int) -> None:
    pod = self.pods[i]
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}  # Only the pod's own.
    env.update(pod.env)
    # The image's PATH: where this Python's `tfps` is installed.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", os.defpath)
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
