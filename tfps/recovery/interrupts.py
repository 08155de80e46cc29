"""Interrupts of a running coordinator: stop now, or save now.

Two things may ask a training coordinator to break off:
  * a stop signal to the chief itself (SIGTERM: preemption) — stop
    scheduling, let in-flight closures finish, save, exit 143;
  * a preemption notice from a ps or worker over the control channel — save
    a checkpoint at once and tell the task it is safe to go (at once, with no
    save, for a task training does not use).

Both arrive on other threads (signal handler, gRPC server threads). The
training loop polls `pending` between closures (cheap) and calls `serve`
between loops, where no closure is running and a checkpoint is consistent.
A notice waits for the loop's answer at most its deadline; a loop that does
not answer in time is reported to the task as "not saved".

Which lock is held: `_lock` only guards the request list; no callback runs
under it.
"""

import dataclasses
import threading
from typing import Callable

from tfps.recovery import notices
from tfps.base import signals


@dataclasses.dataclass
class _SaveRequest:
  notice: notices.Notice
  done: threading.Event = dataclasses.field(default_factory=threading.Event)
  reply: notices.Reply | None = None


class Interrupts:
  def __init__(self, stop: signals.StopSignals | None = None):
    self._stop = stop or signals.StopSignals()
    self._lock = threading.Lock()
    self._requests: list[_SaveRequest] = []

  @property
  def stop_requested(self) -> bool:
    return self._stop.requested

  @property
  def stop_signal(self) -> int | None:
    return self._stop.signum

  @property
  def pending(self) -> bool:
    """True when the loop should stop scheduling and call `serve` soon."""
    return self._stop.requested or bool(self._requests)

  def notice(self, notice: notices.Notice) -> notices.Reply:
    """Control-channel handler: blocks until the loop has saved (or the deadline)."""
    request = _SaveRequest(notice)
    with self._lock:
      self._requests.append(request)
    if request.done.wait(notice.deadline_seconds):
      return request.reply
    return notices.Reply(saved=False, detail="the chief did not save within the deadline")

  def serve(self, save: Callable[[], tuple[int, str]],
            unused: Callable[[notices.Notice], bool] = lambda notice: False,
            ) -> list[notices.Notice]:
    """Called by the loop between loops: saves once for all waiting notices.

    Args:
      save: writes a checkpoint, returns (step, path).
      unused: true for a notice from a task training does not use (a ps left
        out by a failover): it is answered at once, without a save.

    Returns:
      The notices answered (empty when none was waiting).
    """
    with self._lock:
      requests, self._requests = self._requests, []
    if not requests:
      return []
    needed = []
    for request in requests:
      if unused(request.notice):
        request.reply = notices.Reply(saved=False, detail="not in use: nothing to save for it")
        request.done.set()
      else:
        needed.append(request)
    if not needed:
      return [r.notice for r in requests]
    try:
      step, path = save()
      reply = notices.Reply(saved=True, step=step, detail=f"saved {path}")
    except Exception as e:  # Answer the tasks either way, then let it propagate.
      reply = notices.Reply(saved=False, detail=f"save failed: {type(e).__name__}: {e}")
      raise
    finally:
      for request in needed:
        request.reply = reply
        request.done.set()
    return [r.notice for r in requests]
