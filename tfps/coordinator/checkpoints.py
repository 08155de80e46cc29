"""Checkpoints written by the chief: writable model_dir, validated restore.

Checkpoints are numbered with the global step they contain and written only
between train loops, after `join()`, when no closure is running (see
`trainer.PSTrainer` for how steps are counted under retries). A save that is
killed midway leaves no new `checkpoint` index entry, so a restore always
loads the last complete one.
"""

import os
import tempfile

from absl import logging
import tensorflow as tf

from tfps.base import messages
from tfps.base import errors


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

