"""A closure taken off a slow worker stops when that worker wakes.

When a paused worker's closure is run again elsewhere (`coordinator.speculation`),
the first run is still in the paused worker's memory: woken, it would go on
training its chunk, which the second run trains too. Each positioned closure
has a ticket, made of its arguments (its shard, coded with the epoch and
the attempt, and its first batch: unique in a run). Before its first step and then every
`CHECK_EVERY` steps, the closure reads its ticket's slot of a small variable
on a ps and fails if the coordinator wrote the ticket there (`revoke`): a
woken run trains at most that many steps more, counted as re-executed as a
killed worker's partial run is. Each check runs after the steps before it
and before those after it, so no read taken before the pause can pass it.

The variable is not checkpointed: each coordinator makes its own, all clear.
Closures of endless input have no chunk and no ticket: their first run, woken,
trains on its own iterator, and its steps are counted re-executed.
"""

from typing import Any, Callable, Sequence

import tensorflow as tf

from tfps.base import tf_internals

SLOTS = 4096
CHECK_EVERY = 10
_START_BITS = 32  # A shard's batches fit in 2**32.


ATTEMPTS = 8  # Tickets per closure: its first run's and those of the runs that replace it.


def shard_code(shard: int, epoch: int, num_shards: int, attempt: int = 0) -> int:
  """The shard argument a closure gets: its shard, epoch and attempt in one (the
  shard is the code modulo `num_shards`)."""
  return shard + num_shards * (epoch * ATTEMPTS + attempt)


def ticket(code, start):
  """(slot, value) of the closure of shard code `code` from batch `start`: Python
  ints on the coordinator, int64 tensors in a closure (the same formula)."""
  return (code * 7919 + start) % SLOTS, code * (1 << _START_BITS) + start + 1


class ClosureFence:
  """The ticket variable, on a ps; `check` is called inside a closure, the rest by
  the coordinator."""

  def __init__(self, strategy, beside: tf.Variable | None = None):
    """`beside`: a scalar variable to place it with (the global step): on the same ps in
    every coordinator of the run, as stored traces need; else a new one's ps."""
    with strategy.scope():
      # Beside a scalar (never split): a variable partitioner must not shard it.
      if beside is None:
        beside = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfps_closure_fence_at")
      with strategy.extended.colocate_vars_with(beside):
        self.variable = tf.Variable(tf.zeros([SLOTS], tf.int64), trainable=False,
                                    name="tfps_closure_fence")
    self._revoked: dict[int, int] = {}  # slot: value, while a taken run may still wake.

  def revoke(self, code: int, start: int) -> None:
    """The closure (`code`, `start`)'s runs begun so far fail at their next check."""
    slot, value = ticket(code, start)
    self.variable.scatter_nd_update([[slot]], [value])
    self._revoked[slot] = value

  def release(self, code: int, start: int) -> None:
    """The taken run has ended: its slot may serve another closure."""
    slot, value = ticket(code, start)
    if self._revoked.get(slot) == value:
      del self._revoked[slot]
      self.variable.scatter_nd_update([[slot]], [0])

  def check(self, code: tf.Tensor, start: tf.Tensor, after: Sequence[Any] = ()) -> tf.Operation:
    """In a closure: fails it if its ticket was revoked; runs after `after`'s ops."""
    with tf.control_dependencies(list(after)):
      slot, value = ticket(tf.cast(code, tf.int64), tf.cast(start, tf.int64))
      held = self.variable.sparse_read(slot)
      return tf.debugging.Assert(
          tf.not_equal(held, value),
          ["this closure was run again on another worker while this one did not answer"])


class Checks:
  """Where a closure being traced checks its ticket: before its first step, then
  before every `CHECK_EVERY`th (`step`), and at each loop iteration's first.

  Each check runs after the stateful ops made since the last (the steps
  before it: their updates) and after `after` (the running sums, which tie a
  loop iteration to the one before), and the step after it runs after it.
  """

  def __init__(self, fence: "ClosureFence | None", source: Sequence[Any]):
    self._fence = fence if len(source) == 2 else None  # Positioned: (shard code, start).
    self._source = tuple(source)
    self._graph, self._mark, self._count = None, 0, 0

  def step(self, run: Callable[[], Any], after: Any = ()) -> Any:
    if self._fence is None:
      return run()
    graph = tf.compat.v1.get_default_graph()
    if graph is not self._graph:  # A loop body: its first step is checked.
      self._graph, self._mark, self._count = graph, 0, 0
    if self._count % CHECK_EVERY:
      self._count += 1
      return run()
    since = tf_internals.stateful_ops_since(graph, self._mark)
    gate = self._fence.check(*self._source, after=since + [
        t for t in tf.nest.flatten(after) if isinstance(t, tf.Tensor)])
    self._mark = len(graph.get_operations())
    with tf.control_dependencies([gate]):
      out = run()
    self._count += 1
    return out
