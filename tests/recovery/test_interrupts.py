"""Interrupts: notices from other threads meet the training loop (no TF)."""

import signal
import threading

import pytest

from tfps.cluster import processes

from tfps.recovery import notices
from tfps.recovery import interrupts
from tfps.base import signals


def test_a_notice_waits_for_the_loop_to_save_and_gets_the_step():
  inbox = interrupts.Interrupts()
  replies = []
  waiter = threading.Thread(target=lambda: replies.append(
      inbox.notice(notices.Notice(task="ps:0", deadline_seconds=10))))
  waiter.start()
  processes.wait_until(lambda: inbox.pending, timeout=10, what="the notice to be queued")
  assert not inbox.stop_requested
  saves = []
  answered = inbox.serve(lambda: saves.append(1) or (120, "/m/ckpt-120"))
  waiter.join(10)
  assert [n.task for n in answered] == ["ps:0"] and saves == [1]
  assert replies == [notices.Reply(saved=True, step=120, detail="saved /m/ckpt-120")]
  assert not inbox.pending
  assert inbox.serve(lambda: pytest.fail("no notice: no save")) == []


def test_a_notice_from_a_task_not_in_use_is_answered_without_a_save():
  inbox = interrupts.Interrupts()
  replies = {}

  def send(task):
    replies[task] = inbox.notice(notices.Notice(task=task, deadline_seconds=10))

  waiters = [threading.Thread(target=send, args=(task,)) for task in ("ps:0", "ps:1")]
  waiters[0].start()
  processes.wait_until(lambda: inbox.pending, timeout=10, what="ps:0's notice")
  answered = inbox.serve(lambda: pytest.fail("ps:0 is not in use: no save"),
                         unused=lambda notice: notice.task == "ps:0")
  waiters[0].join(10)
  assert [n.task for n in answered] == ["ps:0"]
  assert replies["ps:0"] == notices.Reply(saved=False, detail="not in use: nothing to save for it")
  # One in use beside one not: one save, each answered for what it is.
  waiters[0] = threading.Thread(target=send, args=("ps:0",))
  for waiter in waiters:
    waiter.start()
  processes.wait_until(lambda: len(inbox._requests) == 2, timeout=10, what="both notices")
  saves = []
  inbox.serve(lambda: saves.append(1) or (40, "/m/ckpt-40"),
              unused=lambda notice: notice.task == "ps:0")
  for waiter in waiters:
    waiter.join(10)
  assert saves == [1] and replies["ps:1"].saved and replies["ps:1"].step == 40
  assert not replies["ps:0"].saved


def test_a_loop_that_never_serves_answers_not_saved_at_the_deadline():
  reply = interrupts.Interrupts().notice(notices.Notice(task="worker:1", deadline_seconds=0.2))
  assert reply.saved is False and "deadline" in reply.detail


def test_a_failed_save_is_reported_to_the_task_and_raised():
  inbox = interrupts.Interrupts()
  replies = []
  waiter = threading.Thread(target=lambda: replies.append(
      inbox.notice(notices.Notice(task="ps:1", deadline_seconds=10))))
  waiter.start()
  processes.wait_until(lambda: inbox.pending, timeout=10, what="the notice to be queued")

  def broken_save():
    raise OSError("disk full")

  with pytest.raises(OSError, match="disk full"):
    inbox.serve(broken_save)
  waiter.join(10)
  assert replies[0].saved is False and "disk full" in replies[0].detail


def test_stop_signal_is_pending():
  stop = signals.StopSignals()
  inbox = interrupts.Interrupts(stop)
  assert not inbox.pending
  stop._handle(signal.SIGTERM, None)
  assert inbox.pending and inbox.stop_requested and inbox.stop_signal == signal.SIGTERM
