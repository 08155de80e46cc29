"""What the chief does between train loops about failures and preemptions.

`LoopGuard.after_loop` runs after every Orbit train loop, when `join()` has
returned and no closure is running, so a checkpoint written here is
consistent. In order:

  1. append the step to the progress log (watchers measure recovery with it);
  2. every ps still holds its variables (`ps_state`): if one lost them (it
     restarted unnoticed, holding nothing the train step uses), save if the
     checkpoint does not need that ps, then exit retryable: the supervisor
     restarts the coordinator, which restores the latest checkpoint;
  3. a ps/worker preemption notice is waiting (`recovery.interrupts`): save
     now and answer it. For a *ps* notice the coordinator then waits (within
     the notice's deadline) until that ps is gone and exits retryable, so the
     supervisor restarts it once the ps is back and it restores exactly this
     checkpoint: zero steps lost. A worker notice needs nothing more: TF
     re-runs the worker's closures elsewhere. A notice from a task this
     coordinator was started without (ps failover) is answered at once,
     with no save;
  4. the chief itself got SIGTERM: save and raise `Preempted` (exit 143).

The trainer stops scheduling new closures as soon as an interrupt is pending
(`pending`), so these happen at most one closure per worker late.

`account_restore` compares the restored step with the last step the
previous coordinator reached (from the progress log) and records the steps
lost in the event log.
"""

import os
import time

from absl import logging
import tensorflow as tf

from tfps.cluster import readiness
from tfps.cluster import spec as spec_lib
from tfps.base import messages
from tfps.coordinator import checkpoints
from tfps.coordinator import ps_state
from tfps.base import errors
from tfps.recovery import chief_lease
from tfps.recovery import events as events_lib
from tfps.recovery import interrupts as interrupts_lib
from tfps.recovery import policy
from tfps.recovery import progress_log as progress_lib

_GONE_PROBE_SECONDS = 0.5


class LoopGuard:
  def __init__(self, *, interrupts: interrupts_lib.Interrupts,
               manager: checkpoints.Manager, global_step: tf.Variable,
               cluster: spec_lib.ClusterSpec, model_dir: str,
               sentinels: ps_state.PsSentinels | None = None,
               left_out: tuple[str, ...] = (), fence: chief_lease.Fence | None = None):
    self._interrupts = interrupts
    self._sentinels = sentinels
    self._manager = manager
    self._global_step = global_step
    self._cluster = cluster
    self._left_out = tuple(left_out)  # Tasks the supervisor left out (progress records).
    self._left_out_ids = tuple(map(spec_lib.TaskId.parse, self._left_out))
    self._progress = progress_lib.ProgressLog(model_dir, fence)
    self._events = events_lib.EventLog(model_dir)
    self._epochs_logged = 0  # Set from the restored ledger (account_restore).

  def pending(self) -> bool:
    return self._interrupts.pending

  def account_restore(self, start_step: int, shard_lengths=None,
                      epochs_completed: int = 0) -> int:
    """Records where this coordinator starts; returns the steps lost (>= 0).

    `shard_lengths`: the positioned input's shards (recovery.coverage);
    `epochs_completed`: the restored ledger's (epochs already in the event log).
    """
    self._epochs_logged = epochs_completed
    previous = [r for r in self._progress.read_new() if not r.restored]
    self._progress.append(start_step, restored=True, shard_lengths=shard_lengths,
                          left_out=self._left_out, pid=os.getpid())
    lost = max(0, previous[-1].step - start_step) if previous else 0
    if lost:
      logging.warning("restarted at step %d; the previous coordinator had reached %d: "
                      "%d steps lost", start_step, previous[-1].step, lost)
      self._events.append(events_lib.Event(
          kind="recovered", task="chief:0", step=start_step, steps_lost=lost,
          detail=f"restored at step {start_step}, {lost} steps after the last checkpoint lost"))
    return lost

  def after_loop(self, step: int, loop_input=None, ledger=None) -> None:
    """`loop_input`: what the loop read (trainer.LoopInput), for the progress log;
    `ledger`: the input ledger, whose completed epochs go to the event log."""
    chunks = reexecuted = None
    if loop_input is not None:
      chunks = [c.as_list() for c in loop_input.chunks] if loop_input.chunks else None
      reexecuted = loop_input.reexecuted
    self._progress.append(step, chunks=chunks, reexecuted=reexecuted or 0,
                          looped=loop_input is not None and loop_input.looped,
                          warming=loop_input is not None and loop_input.warming,
                          closures=getattr(loop_input, "closures", ()))
    if ledger is not None and ledger.epochs_completed > self._epochs_logged:
      self._epochs_logged = ledger.epochs_completed
      self._events.append(events_lib.Event(
          kind="epoch", step=step, detail=f"epoch {ledger.epochs_completed} trained: "
          f"{ledger.batches_per_epoch} batches in {ledger.num_shards} shards"))
    if reexecuted:
      self._events.append(events_lib.Event(
          kind="recovered", step=step, steps_reexecuted=reexecuted,
          detail=f"{reexecuted} steps re-executed by closures retried after a worker failure "
                 "(the failed attempts' partial updates stay applied)"))
    if self._sentinels is not None:
      self._check_ps_state(step)
    notices = self._interrupts.serve(self._save, unused=self._is_left_out)
    left_out = {notice.task for notice in notices if self._is_left_out(notice)}
    for notice in notices:
      unused = notice.task in left_out
      if unused:
        logging.info("%s is being preempted; this coordinator runs without it: training "
                     "goes on", notice.task)
      self._events.append(events_lib.Event(
          kind="action", task=notice.task, failure=policy.FailureKind.TASK_NOTICE.value,
          action=(policy.Action.CONTINUE if unused else policy.Action.SAVE_NOW).value,
          step=step, detail=f"{notice.task} preempted with notice; " + (
              "not in use, training goes on" if unused else "checkpoint saved")))
    if self._interrupts.stop_requested:
      _, path = self._save()
      self._events.append(events_lib.Event(
          kind="action", task="chief:0", failure=policy.FailureKind.CHIEF_NOTICE.value,
          action=policy.Action.SAVE_AND_EXIT.value, step=step, steps_lost=0,
          detail=f"saved {path}"))
      raise errors.Preempted(self._interrupts.stop_signal, detail=f"saved {path} at step {step}")
    for notice in notices:
      task = spec_lib.TaskId.parse(notice.task)
      if task.job != spec_lib.JobType.PS or notice.task in left_out:
        continue
      # The notice names the ps by the whole cluster; this coordinator's
      # cluster may be renumbered after a failover.
      self._wait_until_gone(spec_lib.renumbered(task, self._left_out_ids),
                            notice.deadline_seconds)
      raise errors.RetryableError(
          f"{task} is being preempted; saved at step {step}, restart once it is back")

  def _is_left_out(self, notice) -> bool:
    """A notice from a task this coordinator was started without: nothing to save."""
    return spec_lib.TaskId.parse(notice.task) in self._left_out_ids

  def _check_ps_state(self, step: int) -> None:
    """Raises `PsStateLost` if a ps lost its variables; saves first if it still can."""
    try:
      self._sentinels.check()
    except ps_state.PsStateLost as lost:
      try:  # Training just ran, so its variables are intact elsewhere.
        _, path = self._save()
        saved = f"saved {path} first"
      except tf.errors.OpError as e:  # The checkpoint needs that ps too.
        saved = f"could not save ({type(e).__name__}: {messages.one_line(e.message)})"
      raise ps_state.PsStateLost(f"{lost} at step {step}; {saved}") from lost

  def _save(self) -> tuple[int, str]:
    """Saves the current step, unless the latest checkpoint already holds it; returns
    once it is on disk (the caller acts on it: answers a notice, exits)."""
    self._manager.sync()  # A background write of this very step may be under way.
    step = int(self._global_step.numpy())
    latest = self._manager.latest_checkpoint
    if latest is not None and latest.endswith(f"-{step}"):
      return step, latest
    path = self._manager.save_now(step)
    logging.info("saved %s (interrupt)", path)
    return step, path

  def _wait_until_gone(self, task: spec_lib.TaskId, deadline: float) -> None:
    """Waits (bounded) until `task` stops answering, so a restart waits for its return."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
      if not readiness.reachable(self._cluster, [task], _GONE_PROBE_SECONDS):
        return
      time.sleep(_GONE_PROBE_SECONDS)
    logging.warning("%s still answers %.0fs after its notice; restarting anyway", task, deadline)
