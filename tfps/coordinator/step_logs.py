"""Per-step logs summed inside a closure instead of written to a ps every step.

A trainer's `train_step` may return its step's logs: a dict of scalars such
as `{"loss": loss}` (Model Garden's tasks do the same). `PSTrainer` sums them
inside each closure as local tensors of the closure's while loop, returns
the sums with the closure, and reports their mean over the loop. The usual
alternative, a `tf_keras.metrics.Mean` updated every step, keeps its total
and count in two variables on a parameter server: two remote writes per
step (docs/benchmarks.md measures what dropping them saves).

Retries: a closure that fails on a worker and runs again elsewhere returns
the sums of its successful attempt only, so the loop's mean is over exactly
the scheduled steps (a ps metric would also count the failed attempt's).
"""

from typing import Any, Mapping, Sequence

import tensorflow as tf

from tfps.base import errors

# Sums in float64: a closure of hundreds of float32 losses loses no digits.
_SUM_DTYPE = tf.float64


def start(logs: Any, what: str) -> dict[str, tf.Tensor]:
  """The running sums after a closure's first step (`{}`: the step returns no logs).

  `what` names the trainer in errors: logs must be a dict of scalars.
  """
  if logs is None:
    return {}
  if not isinstance(logs, (dict, Mapping)):  # dict: also TF's tracked dict wrapper.
    raise errors.UsageError(
        f"{what}.train_step returned {type(logs).__name__}; step logs must be a dict "
        f"of scalars (or None)")
  sums = {}
  for key, value in logs.items():
    tensor = tf.convert_to_tensor(value)
    if not isinstance(key, str) or tensor.shape.rank != 0 or not (
        tensor.dtype.is_floating or tensor.dtype.is_integer):
      raise errors.UsageError(
          f"{what}.train_step returned logs[{key!r}] of shape {tensor.shape} and dtype "
          f"{tensor.dtype.name}; step logs must be numeric scalars under string keys")
    sums[key] = tf.cast(tensor, _SUM_DTYPE)
  return sums


def usage_error_in(error: BaseException) -> errors.UsageError | None:
  """The UsageError `start` raised while a closure was traced, if `error` wraps one.

  AutoGraph re-raises an error from traced code as a multi-line StagingError;
  the original is in its context chain.
  """
  seen = 0
  while error is not None and seen < 20:
    if isinstance(error, errors.UsageError):
      return error
    error, seen = error.__cause__ or error.__context__, seen + 1
  return None


def add(sums: dict[str, tf.Tensor], logs: Mapping[str, Any] | None,
        what: str) -> dict[str, tf.Tensor]:
  """`sums` plus one more step's logs, which must have the first step's keys.

  `what` names the trainer in errors (raised while the closure is traced).
  """
  if not sums:
    return sums
  keys = sorted(logs) if isinstance(logs, (dict, Mapping)) else None
  if keys != sorted(sums):
    raise errors.UsageError(
        f"{what}.train_step returned logs with keys {keys} after {sorted(sums)}; "
        f"every step must return the same keys")
  return {key: total + tf.cast(logs[key], _SUM_DTYPE) for key, total in sums.items()}


def loop_means(closures: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, float]:
  """Mean per step over a loop, from `(steps, sums)` of each closure.

  Pure: `sums` holds numbers (the closures' fetched results).
  """
  steps = sum(size for size, sums in closures if sums)
  if not steps:
    return {}
  keys = next(sums for _, sums in closures if sums).keys()
  return {key: float(sum(float(sums[key]) for _, sums in closures if sums)) / steps
          for key in keys}
