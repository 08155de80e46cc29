"""Checkpoints written by the chief: writable model_dir, validated restore.

Checkpoints are numbered with the global step they contain and written only
between train loops, after `join()`, when no closure is running (see
`trainer.PSTrainer` for how steps are counted under retries). A save that is
killed midway leaves no new `checkpoint` index entry, so a restore always
loads the last complete one.

Asynchronous saves (`Manager(asynchronous=True)`, the default of the
coordinator): a save copies every variable into a snapshot beside it, on its
own ps (a memory copy, no transfer), and returns; a background thread writes
the snapshot while training goes on, and the `checkpoint` index names it only
once it is complete. Training stops for the copy alone (docs/benchmarks.md,
"Checkpoint cost"); the price is a second copy of the variables in each ps's
memory. TensorFlow's next save first waits for the previous write, so a
routine save (a loop end reaching a checkpoint boundary) that finds the last
write still running is skipped instead: training would stand still for the
rest of that write (a model whose write outlasts a loop: hundreds of MB on
slow storage). The boundary stays unsaved, so the next loop end saves; the
interval stretches to the write's time, and each save stops training for
its copy alone. `sync()` waits for the last write, and every save that must
be on disk before the process acts on it (a preemption notice, SIGTERM, the
end of training) is forced and followed by one.
"""

import copy
import os
import tempfile
import time
from typing import Callable, Sequence

from absl import logging
import tensorflow as tf

from tfps.base import messages
from tfps.base import errors
from tfps.base import tf_internals
from tfps.recovery import chief_lease


def check_writable(model_dir: str) -> None:
  """Creates `model_dir` if needed and proves a file can be written in it.

  Raises:
    UsageError: naming the directory and the reason.
  """
  if "://" in model_dir:  # Remote filesystems (gs://...): leave to TensorFlow.
    try:
      tf.io.gfile.makedirs(model_dir)
    except tf.errors.OpError as e:
      raise errors.UsageError(f"model_dir ({model_dir}): cannot create it ({e.message})") from e
    return
  try:
    os.makedirs(model_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=model_dir, prefix=".tfps-write-test-"):
      pass
  except OSError as e:
    reason = e.strerror or type(e).__name__
    raise errors.UsageError(f"model_dir ({model_dir}): cannot write there ({reason})") from e


def restore(manager: tf.train.CheckpointManager, global_step: tf.Variable, *,
            experiment: str, path: str | None = None) -> str | None:
  """Restores `path` (default: the latest checkpoint) and checks it fits the model.

  Every object of the experiment must find its value in the checkpoint;
  values in the checkpoint that the model does not use are tolerated.

  Returns:
    The restored path, or None when `model_dir` has no checkpoint yet.

  Raises:
    BadCheckpointError: the checkpoint is unreadable or from an incompatible model.
  """
  path = path or manager.latest_checkpoint
  if path is None:
    logging.info("no checkpoint in %s; starting at step %d", manager.directory,
                 int(global_step.numpy()))
    return None
  status = None
  try:
    status = manager.checkpoint.restore(path)
    status.assert_existing_objects_matched()
  except (AssertionError, ValueError, tf.errors.OpError) as e:
    if status is not None:
      status.expect_partial()  # Refused on purpose: no "unrestored values" warning later.
    detail = e.message if isinstance(e, tf.errors.OpError) else str(e)
    raise errors.BadCheckpointError(
        f"checkpoint {path} does not fit experiment {experiment!r} "
        f"({type(e).__name__}: {messages.one_line(detail)}); use another model_dir") from e
  status.expect_partial()
  logging.info("restored %s at step %d", path, int(global_step.numpy()))
  return path



class Manager(tf.train.CheckpointManager):
  """A `CheckpointManager` that saves asynchronously (see the module docstring).

  `before_save` runs before every save, synchronous or not: state kept in
  Python (the input ledger) is captured into variables there, so the
  snapshot holds it as of the same step as the model.
  """

  def __init__(self, checkpoint: tf.train.Checkpoint, directory: str, *, asynchronous: bool,
               before_save: Sequence[Callable[[], None]] = (),
               save_due: Callable[[int, int], bool] | None = None,
               skip_while_writing: bool = True,
               fence: chief_lease.Fence | None = None, **kwargs):
    """`save_due(step, last_saved_step)`: whether a `save(check_interval=True)` at
    `step` saves (default: TensorFlow's, `checkpoint_interval` steps after the last);
    `skip_while_writing` False waits for the write in flight instead (the bench's
    side-by-side). `fence`: with two chief replicas, no save once the other
    took the lease; checkpoints are then named by generation (`ckpt-g3-1200`),
    so that no two generations write the same files."""
    if fence is not None and fence.generation:
      kwargs.setdefault("checkpoint_name", f"ckpt-g{fence.generation}")
    super().__init__(checkpoint, directory, **kwargs)
    self._fence = fence
    self._steps = kwargs.get("step_counter")
    self.asynchronous = asynchronous
    self._skip_while_writing = skip_while_writing
    self._before_save = tuple(before_save)
    self._save_due = save_due
    self.saves = 0
    self.saves_skipped = 0  # Due, but the previous write was still running.
    self.stall_seconds = 0.0  # Time the caller stood still in save() and sync().

  def save(self, checkpoint_number=None, check_interval: bool = True, options=None):
    last = tf_internals.last_saved_step(self)
    if check_interval and self._save_due is not None and last is not None:
      step = int(self._steps.numpy())
      if not self._save_due(step, last):
        return None
      if self.asynchronous and self._skip_while_writing and self.writing():
        if not self.saves_skipped:
          logging.info("checkpoint at step %d skipped: the write of step %d is still running "
                       "(saves follow the writes; counted in checkpoint_saves_skipped)",
                       step, last)
        self.saves_skipped += 1
        return None
      check_interval = False  # Due: TensorFlow's own check would count from `last`.
    if self._fence is not None:  # The step is read from the ps only if it is not written.
      self._fence.check(lambda: f"the checkpoint of step {int(self._steps.numpy())}"
                        if self._steps is not None else "a checkpoint")
    start = time.perf_counter()
    # Again at every save: closing the writer drops it, and a later save makes a new one.
    tf_internals.write_with_one_function(self.checkpoint, asynchronous=self.asynchronous)
    for capture in self._before_save:
      capture()
    # Whatever the caller's options say (Orbit passes its own), this manager decides.
    options = copy.copy(options) if options else tf.train.CheckpointOptions()
    options.experimental_enable_async_checkpoint = self.asynchronous
    path = super().save(checkpoint_number=checkpoint_number, check_interval=check_interval,
                        options=options)
    if path is not None:
      if self.asynchronous:
        tf_internals.trace_async_copy(self.checkpoint)
      self.saves += 1
      self.stall_seconds += time.perf_counter() - start
    return path

  def prepare_writes(self) -> None:
    """Makes the write of the checkpoint's objects as they are now, before its next
    save: the objects a trace made (an optimizer's slots) would otherwise have
    their write registered at that save, which waits for a paused worker with
    the whole coordinator (`tf_internals.prepare_writes`). A failure is left to
    the save, which reports it as a save."""
    try:
      tf_internals.prepare_writes(self.checkpoint)
    except (tf.errors.OpError, ValueError, TypeError) as e:
      logging.warning("checkpoint write not prepared ahead (the next save makes it): %s",
                      messages.one_line(str(e)))

  def writing(self) -> bool:
    """Whether a background write is still running (TensorFlow's next save would wait)."""
    return tf_internals.async_write_running(self.checkpoint)

  def sync(self) -> None:
    """Waits for the background write, if one runs; raises its error if it failed."""
    start = time.perf_counter()
    super().sync()
    self.stall_seconds += time.perf_counter() - start
    # TensorFlow keeps a failed write's error for the next save to raise; a
    # caller of sync() must hear it now.
    tf_internals.raise_async_write_error(self.checkpoint)

  def close(self, *, worker_silent: bool = False) -> None:
    """Waits for the last write, then ends TensorFlow's writer thread and lets it go.

    TensorFlow's asynchronous writer registers an exit hook that keeps it, and
    the function it traced on the cluster, alive until the process ends. By
    then that cluster is gone or another one is connected (one test process
    runs many), and removing the function fails with a gRPC error per task.
    Closed, the writer goes now, while its cluster still answers; a later
    save would start a new one. `worker_silent`: a worker does not answer
    (paused): the removal, and the end of the writer's thread, would wait for
    it, so the writer and its thread are kept with the process instead (a run
    that ends before the worker wakes ends at once).
    """
    try:
      self.sync()  # Raises a failed write's error (TensorFlow then forgets it).
    finally:
      tf_internals.close_async_writer(self.checkpoint, keep=worker_silent)

  def save_now(self, checkpoint_number: int) -> str:
    """Saves and returns once the checkpoint is complete on disk."""
    path = self.save(checkpoint_number=checkpoint_number, check_interval=False)
    self.sync()
    return path
