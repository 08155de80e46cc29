"""Notices a ps that lost its variables while the coordinator kept running.

A ps process that dies comes back empty. TensorFlow notices only when a
closure or the chief touches a variable that ps held, and a ps whose
variables no train step uses (an evaluator's metrics; every ps but the one
holding a model that fits on one) can die and come back unnoticed, its
variables gone until something reads them. `PsSentinels` keeps one scalar
variable on every ps and reads them all after every train loop (one small
read per ps, every loop): a read that fails means that ps lost its state (or
is down), and the chief treats it as a ps loss (see `loop_guard`).

A ps that is partitioned rather than dead makes the read wait, as any access
to it would, until the link heals or the ps deadline (`ps_deadline`) ends
the coordinator.
"""

import tensorflow as tf

from tfps.cluster import spec as spec_lib
from tfps.base import messages
from tfps.base import errors


class PsStateLost(errors.RetryableError):
  """A ps no longer holds what the coordinator put there (it restarted, or is down)."""


def _device(task: spec_lib.TaskId) -> str:
  return f"/job:ps/replica:0/task:{task.index}/device:CPU:0"


class PsSentinels:
  """One scalar per ps, created on it, read to tell that it still holds its state."""

  def __init__(self, cluster: spec_lib.ClusterSpec):
    self._ps = [t for t in cluster.tasks() if t.job == spec_lib.JobType.PS]
    self._variables = []
    for task in self._ps:
      with tf.device(_device(task)):
        self._variables.append(tf.Variable(task.index, dtype=tf.int32, trainable=False,
                                           name=f"tfps_ps_sentinel_{task.index}"))

  @property
  def variables(self) -> tuple[tf.Variable, ...]:
    """The sentinels, one per ps in task order."""
    return tuple(self._variables)

  def check(self) -> None:
    """Raises `PsStateLost` naming the first ps whose sentinel cannot be read."""
    for task in self._ps:
      why = self.lost(task)
      if why is not None:
        raise PsStateLost(why)

  def lost(self, task: spec_lib.TaskId) -> str | None:
    """Why `task` no longer holds its state (its sentinel read failed); None if it does.

    Safe from another thread (the ps deadline's, which asks only a ps that
    just answered a probe: a read of a partitioned one would wait).
    """
    variable = self._variables[self._ps.index(task)]
    try:
      variable.read_value()
    except tf.errors.OpError as e:
      return (f"{task} lost its variables (it restarted, or is down): its sentinel read "
              f"failed with {type(e).__name__}: {messages.one_line(e.message)}")
    return None
