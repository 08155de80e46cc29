"""Progress of training: throughput, ETA, and the lines a person reads on stderr.

`MeasuredTrainer` wraps the trainer the Controller drives. After every train
loop it measures what the loop achieved from the global step, logs one
progress line with the scalars the trainer's `train_loop_end` returned
(whatever their names: `loss`, Orbit's `training_loss`, `accuracy`, ...),
adds `examples_per_second` to the loop's output (so it is also a TensorBoard
summary), and stops the run when a loss is NaN or infinite: any scalar
output whose name contains `loss`.
"""

import dataclasses
import datetime
import math
import time
from typing import Any, Callable, Mapping

from absl import logging
import numpy as np
import orbit
import tensorflow as tf

from tfps.base import errors


@dataclasses.dataclass(frozen=True)
class LoopReport:
  """What one train loop achieved."""

  step: int
  target: int
  steps: int
  seconds: float
  batch_size: int
  outputs: dict[str, float] = dataclasses.field(default_factory=dict)

  @property
  def steps_per_sec(self) -> float:
    return self.steps / self.seconds if self.seconds > 0 else 0.0

  @property
  def examples_per_sec(self) -> float:
    return self.steps_per_sec * self.batch_size

  @property
  def eta_seconds(self) -> float | None:
    remaining = max(0, self.target - self.step)
    if remaining == 0:
      return 0.0
    return remaining / self.steps_per_sec if self.steps_per_sec > 0 else None

  def line(self) -> str:
    eta = self.eta_seconds
    parts = [f"step {self.step}/{self.target}",
             f"{self.steps_per_sec:.1f} steps/s",
             f"{self.examples_per_sec:,.0f} examples/s",
             *([" ".join(f"{k} {v:.4g}" for k, v in list(self.outputs.items())[:_MAX_SHOWN])]
               if self.outputs else []),
             f"ETA {datetime.timedelta(seconds=round(eta))}" if eta is not None else "ETA n/a"]
    return " | ".join(parts)

  def non_finite_loss(self) -> tuple[str, float] | None:
    """The first output named like a loss whose value is NaN or infinite."""
    return next(((k, v) for k, v in self.outputs.items()
                 if "loss" in k.lower() and not math.isfinite(v)), None)


# Outputs shown on the progress line: the first few scalars, in the trainer's order.
_MAX_SHOWN = 6


def _scalars(output: Any) -> dict[str, float]:
  """The scalar numbers among a loop's outputs (a dict, maybe nested one level)."""
  if not isinstance(output, (dict, Mapping)):  # dict: also TF's tracked dict wrapper.
    return {}
  found = {}
  for key, value in output.items():
    if isinstance(value, (dict, Mapping)):  # e.g. {"metrics": {...}}: one level down.
      found.update({f"{key}/{k}": v for k, v in _scalars(value).items()})
    elif (number := _scalar(value)) is not None:
      found[str(key)] = number
  return found


def _scalar(value: Any) -> float | None:
  try:
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value, dtype=float)
  except (TypeError, ValueError):
    return None
  return float(array) if array.size == 1 else None


class MeasuredTrainer(orbit.AbstractTrainer):
  """Delegates to `trainer`; measures, logs and checks every loop."""

  def __init__(self, trainer: orbit.AbstractTrainer, global_step: tf.Variable, *,
               target: int, batch_size: int, clock: Callable[[], float] = time.monotonic,
               on_loop: Callable[[int], None] | None = None):
    """`on_loop(step)` is called after every loop (e.g. to append a progress log)."""
    self._trainer = trainer
    self._on_loop = on_loop
    self._global_step = global_step
    self.target = target  # Public: with --train_epochs it is known only after the restore.
    self._batch_size = batch_size
    self._clock = clock
    self.steps = 0
    self.seconds = 0.0

  @property
  def examples_per_sec(self) -> float:
    """Over every loop so far (time inside train loops only)."""
    return self.steps * self._batch_size / self.seconds if self.seconds > 0 else 0.0

  @property
  def steps_per_sec(self) -> float:
    return self.steps / self.seconds if self.seconds > 0 else 0.0

  def train(self, num_steps: tf.Tensor) -> dict[str, Any]:
    start_step = int(self._global_step.numpy())
    start = self._clock()
    output = self._trainer.train(num_steps) or {}
    seconds = self._clock() - start
    step = int(self._global_step.numpy())
    self.steps += step - start_step
    self.seconds += seconds
    report = LoopReport(step=step, target=self.target, steps=step - start_step,
                        seconds=seconds, batch_size=self._batch_size,
                        outputs=_scalars(output))
    logging.info("%s", report.line())
    if self._on_loop is not None:
      self._on_loop(step)
    if (bad := report.non_finite_loss()) is not None:
      raise errors.NonFiniteLossError(
          f"{bad[0]} is {bad[1]} at step {step}; stopping (not retryable)")
    if isinstance(output, dict):
      output = dict(output, examples_per_second=report.examples_per_sec)
    return output
