"""The kinds of op a loop's begin and end run, run once as a coordinator starts.

TensorFlow runs each eager op as a one-op function, which it registers with
every task the first time the coordinator runs that kind of op, and each
registration waits for every task's answer (docs/tensorflow-behaviour.md
"Every op run for the first time waits for a paused worker"). A loop's begin
and end run kinds no step ran: the trainer resets its metrics, they give their
first results, and Orbit writes the loop's first summaries. A worker paused
at a coordinator's first loop end therefore held it for the whole pause,
however its closures were run again elsewhere.

Run once while the coordinator is built, those kinds are registered, and
the loops after register nothing new. Nothing here changes what a loop
computes or writes: a metric is reset before the checkpoint is restored (a
metric of the checkpoint gets its value back), its `result()` only reads it,
and the summaries go to a writer of their own, removed after.
"""

import tempfile

from absl import logging
import numpy as np
import orbit
import tensorflow as tf
import tf_keras

# What a loop's end hands Orbit's summaries: numpy scalars of a tensor's
# dtype, and Python floats (Orbit's own `steps_per_second`). Each is cast to
# float32 by `tf.summary.scalar`, and each dtype is another kind of cast.
_SUMMARY_VALUES = {"float32": np.float32(0), "float64": np.float64(0), "int32": np.int32(0),
                   "int64": np.int64(0), "python_float": 0.0}


def metrics_of(*modules) -> list[tf_keras.metrics.Metric]:
  """The tf_keras metrics that `modules` (trainers, evaluators) hold, each once."""
  found: dict[int, tf_keras.metrics.Metric] = {}
  for module in modules:
    if not isinstance(module, tf.Module):
      continue
    candidates = [module, *module.submodules]
    found.update((id(m), m) for m in candidates if isinstance(m, tf_keras.metrics.Metric))
  return list(found.values())


def run_ahead(global_step: tf.Variable, *modules) -> int:
  """Runs once what a loop's begin and end run for the first time: every metric of
  `modules` reset and asked its `result()`, and Orbit's summaries at `global_step`
  into a writer of their own. Returns how many metrics answered (a user's metric
  that cannot yet is left to its loop)."""
  answered = 0
  for metric in metrics_of(*modules):
    try:
      metric.reset_state()
      metric.result()
      answered += 1
    except Exception as e:  # pylint: disable=broad-except
      # A user's metric may need an update first; its ops are then new at the
      # first loop's end, as before.
      logging.debug("metric %s gave no result before its first loop: %s", metric.name, e)
  with tempfile.TemporaryDirectory(prefix="tfps-first-ops-") as directory:
    summaries = orbit.utils.SummaryManager(directory, tf.summary.scalar, global_step=global_step)
    summaries.write_summaries(dict(_SUMMARY_VALUES))
    summaries.flush()
    summaries.summary_writer().close()
  return answered
