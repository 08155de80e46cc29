"""The kinds of op a loop's begin and end run are run once as a coordinator is built
(`first_ops`)."""

import json
import os
import subprocess
import sys
import textwrap

import tensorflow as tf
import tf_keras

from tfps.coordinator import first_ops

# In a process of its own: the eager context is the process's, and another test
# may have run these kinds of op already.
LOOP_END = textwrap.dedent('''
    import json
    import tempfile

    import numpy as np
    import orbit
    import tensorflow as tf
    import tf_keras
    from tensorflow.python.eager import context

    from tfps.coordinator import first_ops


    class Trainer(tf.Module):  # What an Orbit trainer holds.
      def __init__(self):
        self.loss = tf_keras.metrics.Mean()
        self.accuracy = tf_keras.metrics.Accuracy()


    def functions():
      return set(context.context().list_function_names())


    step = orbit.utils.create_global_step()
    trainer = Trainer()
    # The kinds of op a loop's steps run (in its closures, on a cluster): not a loop's edges.
    trainer.loss.update_state(3.0)
    trainer.accuracy.update_state([1], [1])
    before = functions()
    answered = first_ops.run_ahead(step, trainer)
    warmed = functions()
    # A first loop as Orbit's Controller runs it: the trainer resets its metrics, its
    # steps update them, it gives their results, and the Controller writes them.
    for metric in (trainer.loss, trainer.accuracy):
      metric.reset_state()
    trainer.loss.update_state(2.0)
    trainer.accuracy.update_state([1], [0])
    outputs = {"loss": trainer.loss.result(), "accuracy": trainer.accuracy.result()}
    outputs = {name: value.numpy() for name, value in outputs.items()}
    outputs["steps_per_second"] = 12.5
    summaries = orbit.utils.SummaryManager(tempfile.mkdtemp(), tf.summary.scalar,
                                           global_step=step)
    summaries.write_summaries(outputs)
    summaries.flush()
    print(json.dumps({"answered": answered, "warmed": sorted(warmed - before),
                      "new_at_loop_end": sorted(functions() - warmed)}))
''')


def test_a_first_loop_runs_no_kind_of_op_for_the_first_time_at_its_edges(tmp_path):
  script = tmp_path / "loop_end.py"
  script.write_text(LOOP_END)
  env = dict(os.environ, TMPDIR=str(tmp_path))  # Where its summaries go.
  done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        timeout=120, check=False, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["answered"] == 2
  # Each kind is a function TensorFlow registers with every task: made here...
  assert any("WriteSummary" in name for name in result["warmed"]), result
  assert any("DivNoNan" in name for name in result["warmed"]), result  # A Mean's result.
  # ...and none at the loop's begin or end.
  assert result["new_at_loop_end"] == [], result


class _Holder(tf.Module):

  def __init__(self, metric, inner=None):
    self.metric, self.inner, self.plain = metric, inner, object()


def test_metrics_are_found_in_nested_modules_once_each():
  shared = tf_keras.metrics.Mean()
  other = tf_keras.metrics.AUC()
  outer = _Holder(shared, inner=_Holder(other))
  found = first_ops.metrics_of(outer, _Holder(shared), None, "not a module")
  assert sorted(map(id, found)) == sorted([id(shared), id(other)])


def test_a_metric_without_a_result_yet_is_left_to_its_loop():

  class NeedsAnUpdate(tf_keras.metrics.Metric):

    def update_state(self, value):
      self.value = tf.constant(value)

    def result(self):
      return self.value  # An attribute its first update makes.

  step = tf.Variable(0, dtype=tf.int64)
  assert first_ops.run_ahead(step, _Holder(NeedsAnUpdate()), _Holder(
      tf_keras.metrics.Mean())) == 1
