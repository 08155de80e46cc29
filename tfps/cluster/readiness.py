"""Readiness: does every task of a cluster answer on gRPC?

A task is *reachable* when a gRPC channel to its address becomes READY (TCP
connect plus the HTTP/2 handshake). A SIGSTOPped server accepts the TCP
connection in the kernel but never completes the handshake, so it correctly
counts as unreachable.

Every wait here has a deadline; on timeout the error names the tasks that
never answered.
"""

import enum
import threading
import time
from typing import Iterable

import grpc
import tenacity

from tfps.cluster import spec as spec_lib
from tfps.base import errors

# First probe waits this long for one task; the backoff grows to the maximum.
_PROBE_MIN_SECONDS = 0.25
_PROBE_MAX_SECONDS = 2.0


class ClusterUnreachableError(errors.RetryableError):
  """Some tasks did not answer before the deadline; `.unreachable` lists them."""

  def __init__(self, unreachable: Iterable[spec_lib.TaskId], waited: float,
               cluster: spec_lib.ClusterSpec):
    self.unreachable = tuple(sorted(unreachable))
    names = ", ".join(f"{t} ({cluster.address(t)})" for t in self.unreachable)
    super().__init__(f"tasks still unreachable after {waited:.1f}s: {names}")


def is_reachable(address: str, timeout: float) -> bool:
  """True if a gRPC channel to `address` becomes READY within `timeout` s."""
  cluster = spec_lib.ClusterSpec.from_dict({"ps": [address]})
  return bool(reachable(cluster, [spec_lib.TaskId(spec_lib.JobType.PS, 0)], timeout))


_FRESH_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)


class Answer(str, enum.Enum):
  """What a task's port said to one probe."""

  READY = "ready"  # Its gRPC server answered.
  REFUSED = "refused"  # The connection failed at once: nothing listens (the process is gone).
  SILENT = "silent"  # Neither, within the timeout: paused, cut off, or not up yet.


def reachable(cluster: spec_lib.ClusterSpec, tasks: list[spec_lib.TaskId],
              timeout: float) -> set[spec_lib.TaskId]:
  """Probes `tasks` in parallel; returns those READY within `timeout` s (one round)."""
  return {task for task, answer in answers(cluster, tasks, timeout).items()
          if answer == Answer.READY}


def answers(cluster: spec_lib.ClusterSpec, tasks: list[spec_lib.TaskId],
            timeout: float) -> dict[spec_lib.TaskId, Answer]:
  """Probes `tasks` in parallel; what each said within `timeout` s (one round).

  Returns as soon as every task has answered or refused: a task whose
  connection fails at once (TRANSIENT_FAILURE: nothing listens, the process
  is gone) is REFUSED without waiting out the timeout; only a task that
  neither answers nor refuses (paused, or cut off) costs the whole timeout.
  """
  # A channel of its own subchannel pool connects afresh: from the global
  # pool it could pick up a connection a previous probe left open, which
  # stays READY across a partition (dropped packets close nothing).
  channels = {t: grpc.insecure_channel(cluster.address(t), options=_FRESH_CONNECTION)
              for t in tasks}
  settled: dict[spec_lib.TaskId, bool] = {}
  changed = threading.Condition()

  def watcher(task):
    def on_state(state):
      if state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE):
        with changed:
          settled.setdefault(task, state == grpc.ChannelConnectivity.READY)
          changed.notify_all()
    return on_state

  callbacks = {t: watcher(t) for t in tasks}
  try:
    for task, channel in channels.items():
      channel.subscribe(callbacks[task], try_to_connect=True)
    end = time.monotonic() + timeout
    with changed:
      while len(settled) < len(channels) and (left := end - time.monotonic()) > 0:
        changed.wait(left)
      return {task: (Answer.SILENT if task not in settled
                     else Answer.READY if settled[task] else Answer.REFUSED) for task in tasks}
  finally:
    # Closing a channel waits out grpc's connectivity poll (a 0.2 s deadline
    # per watch), so closing here made every probe cost 0.2 s a task even
    # when each answered in milliseconds: on the path from a coordinator's
    # exit to the next one's start that was two probes. The answer is in;
    # the channels are closed off the caller's thread.
    threading.Thread(target=_close, args=(channels, callbacks), daemon=True,
                     name="tfps-probe-close").start()


def _close(channels: dict, callbacks: dict) -> None:
  for task, channel in channels.items():
    channel.unsubscribe(callbacks[task])
    channel.close()


def wait_until_reachable(cluster: spec_lib.ClusterSpec, deadline: float, *,
                         tasks: Iterable[spec_lib.TaskId] | None = None) -> None:
  """Blocks until every task (default: all of `cluster`) is reachable.

  Args:
    cluster: the cluster to probe.
    deadline: seconds to wait in total.
    tasks: a subset of tasks to probe instead of all.

  Raises:
    ClusterUnreachableError: naming each task still unreachable at the deadline.
  """
  pending = set(cluster.tasks() if tasks is None else tasks)
  start = time.monotonic()
  # Probe lengths grow with tenacity's exponential backoff (retry_state is
  # tenacity's count of attempts), so a cluster still booting is not hammered.
  backoff = tenacity.wait_exponential(multiplier=_PROBE_MIN_SECONDS, max=_PROBE_MAX_SECONDS)

  def probe_round(retry_state: tenacity.RetryCallState) -> None:
    round_start = time.monotonic()
    remaining = deadline - (round_start - start)
    budget = max(0.05, min(backoff(retry_state), remaining))
    pending.difference_update(reachable(cluster, sorted(pending), budget))
    if pending:
      # A refusal ends a probe at once; the next round still waits its turn.
      time.sleep(max(0.0, budget - (time.monotonic() - round_start)))
      raise _StillPending()

  retrying = tenacity.Retrying(
      retry=tenacity.retry_if_exception_type(_StillPending),
      stop=tenacity.stop_after_delay(deadline),
      wait=tenacity.wait_none(),
      reraise=True)
  try:
    for attempt in retrying:
      with attempt:
        probe_round(attempt.retry_state)
  except _StillPending:
    raise ClusterUnreachableError(pending, time.monotonic() - start, cluster) from None


class _StillPending(Exception):
  """Internal: some tasks have not answered yet."""
