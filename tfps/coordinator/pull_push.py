"""A step's parameters in one transfer per ps, its gradients in one transfer back.

Under ParameterServerStrategy each tensor that crosses between a worker and a
ps is one `RecvTensor` RPC, every step, and on a small machine its fixed cost
(gRPC, thread wake-ups, the executor on both ends) dwarfs its bytes. A model
written the usual way pays one such transfer for every variable it reads,
for the ids of every embedding lookup and the rows coming back, and for every
gradient and its indices going out. `pull` and `Pulled.gradients` move the
same values in fewer, larger tensors:

* **pull**: on each ps, the rows of every table shard it holds, gathered at
  the step's *unique* ids, and the value of every dense variable it holds,
  concatenated into one tensor: one transfer per ps (plus the unique ids
  going out, one per shard). Only the rows the step needs, each once.
* **push**: the gradients of everything pulled from a ps, concatenated on the
  worker into one tensor: one transfer per ps. On the ps it is split into a
  dense gradient per variable and an `IndexedSlices` per shard whose indices
  are the ids tensor the pull already sent (TensorFlow sends a tensor to a
  device once per step, however many ops there use it).

Same values, same gradients, same optimizer updates as reading the
variables directly; nothing is cached across steps (a pull reads the
variables when the step starts, as the step's first reads would). The ctr
experiment (`examples.ctr.experiment`) uses it; `docs/benchmarks.md` measures it.

    pulled = pull_push.pull(tables=[(table, ids)], dense=[kernel])
    with tf.GradientTape() as tape:
      tape.watch(pulled.values)
      rows, = pulled.lookups()      # [*ids.shape, dim], as table[ids]
      weights, = pulled.dense()
      loss = ...
    grads_and_vars = pulled.gradients(tape.gradient(loss, pulled.values))
    optimizer.apply_gradients(grads_and_vars, skip_gradients_aggregation=True)

Keep the gradients on the ps until they are applied:

* The sparse gradients have unique indices already. tf_keras optimizers
  deduplicate sparse gradients on the worker, before the update, which
  brings their values back to the worker; mix `DeduplicateOnDevice` into the
  optimizer to deduplicate (only when needed) where the update runs.
* With one replica per worker (CPU workers) there is nothing to aggregate:
  pass `skip_gradients_aggregation=True`. tf_keras's aggregation then sums
  one value, but on some call paths it copies it to the worker and back
  (seen in the partitioned graphs of `tfps bench`'s Model Garden pattern,
  the step inside Orbit's while loop; not in tfps's closures).
* Put variables that are used together on the same ps
  (`strategy.extended.colocate_vars_with`): one pull serves them all.

On the ctr experiment's step, half as many tensors cross to and from its ps
per step as when the same step reads the variables
(tests/coordinator/test_pull_push.py counts them in the partitioned graphs
TensorFlow runs; docs/scaling.md).
"""

import dataclasses
from typing import Sequence

import tensorflow as tf

from tfps.base import errors


def _shards(table) -> list:
  """The variables holding a table's rows, in row order (one if not sharded)."""
  shards = getattr(table, "variables", None)  # A ShardedVariable's shards.
  return list(shards) if isinstance(shards, (list, tuple)) and shards else [table]


def first_shard(table) -> tf.Variable:
  """The variable holding a table's first rows: the table itself if not sharded.

  What to pass to `strategy.extended.colocate_vars_with` to place other
  variables with a table (a `ShardedVariable` cannot be colocated with).
  """
  return _shards(table)[0]


def _device(variable) -> str:
  return tf.DeviceSpec.from_string(variable.device).to_string()


def has_unique_indices(grad: tf.IndexedSlices) -> bool:
  """Whether `grad.indices` are unique by construction: the output of a `Unique` op.

  True for every sparse gradient `Pulled.gradients` returns (in a
  `tf.function`); False when it cannot be told (eager tensors).
  """
  op = getattr(grad.indices, "op", None)
  if op is not None and op.type == "Identity" and op.inputs:
    op = op.inputs[0].op  # A copy (device placement) is still unique.
  return op is not None and op.type in ("Unique", "UniqueV2")


@dataclasses.dataclass(frozen=True)
class _Piece:
  """One part of a device's pulled tensor: a dense variable, or a shard's rows."""

  variable: tf.Variable
  ids: tf.Tensor | None  # The shard's unique ids (a `Unique` op's); None if dense.

  def size(self) -> tf.Tensor | int:
    """Elements this piece takes in its device's tensor (from tensors local to the caller)."""
    if self.ids is None:
      return self.variable.shape.num_elements()
    return tf.size(self.ids) * self.variable.shape[1]


@dataclasses.dataclass(frozen=True)
class _Table:
  """Where a table's ids went: per shard, its piece and how to put its rows back in order."""

  dim: int
  ids_shape: tf.Tensor
  pieces: tuple     # Per shard: (device index, piece index).
  inverse: tuple    # Per shard: for each of its ids, its row among the shard's pulled rows.
  positions: tuple  # Per shard: where its ids are among all the ids (empty if one shard).


class Pulled:
  """What `pull` fetched, and how to send the gradients back. Build with `pull`."""

  def __init__(self, groups, tables, dense_at, rows, dense_values):
    self._groups = groups      # [(device, [_Piece])], in device order.
    self._tables = tables      # [_Table]
    self._dense_at = dense_at  # Per dense variable: (device index, piece index).
    self._rows = rows          # Per table, per shard: its unique rows (on the worker).
    self._dense = dense_values

  @property
  def values(self) -> list[tf.Tensor]:
    """The tensors to watch and differentiate: every table shard's rows, then the dense values."""
    return [*(r for rows in self._rows for r in rows), *self._dense]

  def lookups(self) -> list[tf.Tensor]:
    """Per table, its rows at the ids given to `pull`: shape `[*ids.shape, dim]`."""
    out = []
    for table, rows in zip(self._tables, self._rows):
      per_shard = [tf.gather(r, inverse) for r, inverse in zip(rows, table.inverse)]
      looked_up = (per_shard[0] if len(per_shard) == 1
                   else tf.dynamic_stitch(list(table.positions), per_shard))
      out.append(tf.reshape(looked_up, tf.concat([table.ids_shape, [table.dim]], axis=0)))
    return out

  def dense(self) -> list[tf.Tensor]:
    """The dense variables' values, in the order given to `pull`."""
    return list(self._dense)

  def gradients(self, grads: Sequence) -> list[tuple]:
    """`(gradient, variable)` pairs for the optimizer, from the gradients of `values`.

    One pair per value, in the same order. The gradients of everything
    pulled from one ps travel to it as one tensor and are split there: every
    gradient returned lives on its variable's ps. A value the loss did not
    depend on gets a zero gradient.
    """
    values = self.values
    grads = list(grads)
    if len(grads) != len(values):
      raise errors.UsageError(
          f"gradients: got {len(grads)} gradients for {len(values)} pulled values")
    # The gradient of a gather is IndexedSlices; summed into dense rows here, on the worker.
    grads = iter([tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                  for g, v in zip(grads, values)])
    per_piece = [[None] * len(pieces) for _, pieces in self._groups]
    for table in self._tables:
      for device_index, piece_index in table.pieces:
        per_piece[device_index][piece_index] = next(grads)
    for device_index, piece_index in self._dense_at:
      per_piece[device_index][piece_index] = next(grads)
    applied = {}
    for device_index, ((device, pieces), piece_grads) in enumerate(zip(self._groups, per_piece)):
      flat = tf.concat([tf.reshape(g, [-1]) for g in piece_grads], axis=0)  # On the worker.
      with tf.device(device):  # One transfer. The split's sizes come from the ids already there.
        parts = tf.split(flat, [p.size() for p in pieces]) if len(pieces) > 1 else [flat]
        for piece_index, (piece, part) in enumerate(zip(pieces, parts)):
          variable = piece.variable
          if piece.ids is None:
            grad = tf.reshape(part, variable.shape)
          else:
            grad = tf.IndexedSlices(tf.reshape(part, [-1, variable.shape[1]]), piece.ids,
                                    tf.constant(variable.shape.as_list(), tf.int64))
          applied[device_index, piece_index] = (grad, variable)
    # In the order of `values`: every table's shards, then the dense variables.
    return [applied[at] for table in self._tables for at in table.pieces] + [
        applied[at] for at in self._dense_at]


def pull(*, tables: Sequence[tuple] = (), dense: Sequence = ()) -> Pulled:
  """Reads what a step needs: one transfer from each ps (see the module docstring).

  Args:
    tables: `(table, ids)` pairs: a 2-D variable or `ShardedVariable` (rows
      split along axis 0, as TensorFlow's partitioners split them) and
      integer ids of any shape. The rows of the unique ids are fetched, each
      once, from the shard that holds them.
    dense: variables read whole.

  Returns:
    A `Pulled`: its `values` to watch, `lookups()` and `dense()` to compute
    with, `gradients()` to apply.
  """
  groups: dict[str, list[_Piece]] = {}

  def add(variable, ids) -> tuple[int, int]:
    pieces = groups.setdefault(_device(variable), [])
    pieces.append(_Piece(variable, ids))
    return list(groups).index(_device(variable)), len(pieces) - 1

  table_plans = []
  for table, ids in tables:
    shards = _shards(table)
    if any(s.shape.rank != 2 for s in shards):
      raise errors.UsageError(f"pull: table {table.name} must be 2-D, got shape {table.shape}")
    ids = tf.convert_to_tensor(ids)
    flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
    if len(shards) == 1:
      per_shard_ids, positions = [flat], ()
    else:
      sizes = [s.shape[0] for s in shards]
      starts = [sum(sizes[:i]) for i in range(len(sizes))]
      # Shard p holds rows [starts[p], starts[p] + sizes[p]).
      shard_of = tf.cast(tf.searchsorted(tf.constant(starts[1:], tf.int64), flat,
                                         side="right"), tf.int32)
      per_shard_ids = [part - start for part, start in
                       zip(tf.dynamic_partition(flat, shard_of, len(shards)), starts)]
      positions = tuple(tf.dynamic_partition(tf.range(tf.size(flat)), shard_of, len(shards)))
    pieces, inverse = [], []
    for shard, shard_ids in zip(shards, per_shard_ids):
      unique, where = tf.unique(shard_ids)
      pieces.append(add(shard, unique))
      inverse.append(where)
    table_plans.append(_Table(dim=int(shards[0].shape[1]), ids_shape=tf.shape(ids, tf.int32),
                              pieces=tuple(pieces), inverse=tuple(inverse),
                              positions=positions))
  dense_at = [add(variable, None) for variable in dense]

  # One tensor per device, made there; split on the worker (sizes from worker-side ids).
  pulled = []
  for device, pieces in groups.items():
    with tf.device(device):
      parts = [tf.reshape(tf.gather(p.variable, p.ids) if p.ids is not None
                          else tf.convert_to_tensor(p.variable), [-1]) for p in pieces]
      flat = tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]
    values = tf.split(flat, [p.size() for p in pieces]) if len(parts) > 1 else [flat]
    pulled.append([tf.reshape(v, [-1, p.variable.shape[1]]) if p.ids is not None
                   else tf.reshape(v, p.variable.shape) for p, v in zip(pieces, values)])

  rows = [[pulled[d][i] for d, i in plan.pieces] for plan in table_plans]
  dense_values = [pulled[d][i] for d, i in dense_at]
  return Pulled(list(groups.items()), table_plans, dense_at, rows, dense_values)


class DeduplicateOnDevice:
  """Mix into a tf_keras optimizer: sparse gradients deduplicated where they are applied.

  tf_keras sums the duplicate rows of every sparse gradient before the update,
  on the worker; for a gradient that already lives on its ps (`Pulled`) that
  moves its values back to the worker and out again. With this mixin the
  deduplication runs inside the update, on the variable's device, and is
  skipped for indices that are unique by construction (`has_unique_indices`).

      class Adagrad(pull_push.DeduplicateOnDevice, tf_keras.optimizers.Adagrad):
        pass
  """

  def _deduplicate_sparse_grad(self, grads):
    return grads  # Done in `_update_step`, on the variable's device.

  def _update_step(self, gradient, variable):
    if isinstance(gradient, tf.IndexedSlices) and not has_unique_indices(gradient):
      unique, positions = tf.unique(gradient.indices)
      gradient = tf.IndexedSlices(
          tf.math.unsorted_segment_sum(gradient.values, positions, tf.size(unique)),
          unique, gradient.dense_shape)
    return super()._update_step(gradient, variable)
