"""What ends a loop between loops (tfps.coordinator.loop_guard, .ps_state): a ps that
lost its variables, a notice; on the in-process cluster."""

import threading

import pytest
import tensorflow as tf

from tfps.base import errors
from tfps.cluster import processes
from tfps.cluster import spec as spec_lib
from tfps.coordinator import checkpoints
from tfps.coordinator import loop_guard
from tfps.coordinator import ps_state
from tfps.recovery import interrupts as interrupts_lib
from tfps.recovery import notices

from tests.support import inprocess

pytestmark = pytest.mark.tf


class _LostPs:
  """Sentinels of a ps that restarted: what `PsSentinels.check` raises then."""

  def check(self):
    raise ps_state.PsStateLost("ps:1 lost its variables (it restarted, or is down): ...")


def _guard(runtime, tmp_path, sentinels, step_on_lost_ps=False, interrupts=None, left_out=()):
  with runtime.strategy.scope():
    step = tf.Variable(7, dtype=tf.int64)
  items = {"step": step}
  if step_on_lost_ps:  # A checkpointed variable that cannot be read any more.
    items["gone"] = _Unreadable()
  manager = checkpoints.Manager(tf.train.Checkpoint(**items), str(tmp_path),
                                asynchronous=True, max_to_keep=2)
  return manager, loop_guard.LoopGuard(
      interrupts=interrupts or interrupts_lib.Interrupts(), manager=manager, global_step=step,
      cluster=runtime.cluster, model_dir=str(tmp_path), sentinels=sentinels, left_out=left_out)


class _Unreadable(tf.Module):
  """Saves like a variable whose ps lost it: the read fails with TensorFlow's error."""

  def __init__(self):
    super().__init__()
    self.value = tf.Variable(0.0)

  def _serialize_to_tensors(self):
    raise tf.errors.FailedPreconditionError(None, None, "Resource gone/N10tensorflow3VarE "
                                            "does not exist.")


def test_a_ps_that_lost_its_variables_ends_the_loop_retryable_after_a_save(runtime, tmp_path):
  sentinels = ps_state.PsSentinels(runtime.cluster)
  sentinels.check()  # Every ps of a healthy cluster holds its sentinel.
  assert [v.device for v in sentinels.variables] == [
      f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(inprocess.NUM_PS)]
  (tmp_path / "saved").mkdir()
  manager, guard = _guard(runtime, tmp_path / "saved", _LostPs())
  with pytest.raises(ps_state.PsStateLost) as e:
    guard.after_loop(7)
  # Training just ran without that ps: the checkpoint is saved first, nothing lost.
  assert str(e.value).startswith("ps:1 lost its variables (it restarted, or is down)")
  assert str(e.value).endswith(f"at step 7; saved {tmp_path}/saved/ckpt-7 first")
  assert manager.latest_checkpoint == f"{tmp_path}/saved/ckpt-7"
  assert e.value.exit_code == errors.ExitCode.CLUSTER_LOST
  manager.close()

  # The checkpoint needs that ps: no save (and no partial checkpoint), still retryable.
  (tmp_path / "unsaved").mkdir()
  manager, guard = _guard(runtime, tmp_path / "unsaved", _LostPs(), step_on_lost_ps=True)
  with pytest.raises(ps_state.PsStateLost, match=r"at step 7; could not save "
                                                 r"\(FailedPreconditionError: Resource gone"):
    guard.after_loop(7)
  assert manager.latest_checkpoint is None
  manager.close()


def test_a_ps_notice_after_a_failover_is_matched_to_the_renumbered_cluster(
    runtime, tmp_path, monkeypatch):
  # Measured (soak of 2026-11-26, run 3): a coordinator running without ps:0
  # got ps:0's notice, waited 13 s for its own ps:0 (the whole cluster's ps:1)
  # to go, and restarted: a 26 s stall for a ps it did not use.
  probed = []
  monkeypatch.setattr(loop_guard.readiness, "reachable",
                      lambda cluster, tasks, timeout: probed.extend(tasks) or set())
  inbox = interrupts_lib.Interrupts()
  manager, guard = _guard(runtime, tmp_path, None, interrupts=inbox, left_out=("ps:0",))

  def after_a_notice_from(task):
    waiter = threading.Thread(target=inbox.notice,
                              args=(notices.Notice(task=task, deadline_seconds=10),))
    waiter.start()
    processes.wait_until(lambda: inbox.pending, timeout=10, what=f"{task}'s notice")
    try:
      guard.after_loop(7)
    finally:
      waiter.join(10)

  # The ps this coordinator runs without: answered at once, no save, training goes on.
  after_a_notice_from("ps:0")
  assert probed == [] and manager.latest_checkpoint is None
  # ps:1 is this coordinator's ps:0: save, wait for it to go, then restart.
  with pytest.raises(errors.RetryableError, match="ps:1 is being preempted; saved at step 7"):
    after_a_notice_from("ps:1")
  assert probed == [spec_lib.TaskId.parse("ps:0")]
  assert manager.latest_checkpoint == f"{tmp_path}/ckpt-7"
  manager.close()
