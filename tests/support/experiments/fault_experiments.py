"""Experiments that misbehave on purpose, for the multi-process recovery tests.

Loaded by a real chief as `--experiment=fault_experiments:NAME` with this
directory on PYTHONPATH. Both are the `counting` experiment
(input_experiments.py; cheap to build and trace) plus one fault:

* `blocking_save`: a checkpoint save at or after step `block_at_step` writes
  the file `marker` and then blocks, so a test can kill the chief exactly in
  the middle of saving (no timing guesses);
* `nan_loss`: user code whose loss is NaN, a permanent failure.
"""

import dataclasses
import time

import tensorflow as tf

from tfps.coordinator import experiment as experiment_lib

import input_experiments


def _split(context, *keys):
  """Our own params out of the context, the rest left for the counting experiment."""
  params = dict(context.params)
  ours = {k: params.pop(k) for k in keys if k in params}
  return dataclasses.replace(context, params=params), ours


class _BlockingSave(tf.train.experimental.PythonState):
  """Checkpointed Python state whose save blocks from a given step on."""

  def __init__(self, global_step, block_at_step: int, marker: str):
    self._global_step = global_step
    self._block_at_step = block_at_step
    self._marker = marker

  def serialize(self):
    step = int(self._global_step.numpy())
    if self._block_at_step and step >= self._block_at_step:
      with open(self._marker, "w") as f:
        f.write(str(step))
      time.sleep(600)  # Until the test kills us, mid-save.
    return str(step)

  def deserialize(self, string_value):
    del string_value


def blocking_save(context):
  context, ours = _split(context, "block_at_step", "marker")
  experiment = input_experiments.counting(context)
  items = dict(experiment.checkpoint_items, blocker=_BlockingSave(
      experiment.global_step, int(ours.get("block_at_step", 0)), ours.get("marker", "")))
  return dataclasses.replace(experiment, checkpoint_items=items)


class _NanTrainer(input_experiments.CountingTrainer):
  def train_step(self, iterator):
    logs = super().train_step(iterator)
    return {"loss": logs["loss"] + tf.math.log(-1.0)}  # Real NaN, computed on a worker.


def nan_loss(context):
  experiment = input_experiments.counting(context)
  t = experiment.trainer
  trainer = _NanTrainer(t.counts, t.global_step, t.train_dataset)
  return experiment_lib.Experiment(
      trainer=trainer, evaluator=experiment.evaluator,
      checkpoint_items=experiment.checkpoint_items, global_step=experiment.global_step)
