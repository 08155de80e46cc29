"""Exact evaluation on parameter servers for an ordinary Orbit `StandardEvaluator`.

`PSEvaluator` wraps a single-machine `StandardEvaluator` that keeps its
results in tf_keras metrics (attributes of the evaluator, directly or in a
list/tuple/dict attribute) and computes them in `eval_end()`. Evaluation is
scheduled as `num_shards` closures. Each closure

  1. builds its own iterator over its shard of the eval dataset
     (`datasets.EvalShards`), inside the closure;
  2. gives each of the evaluator's metrics *local* state: while the closure
     is traced, the metric's state attributes (Mean's `total` and `count`,
     AUC's confusion counts, ...) point at variables that live only for that
     one execution of the closure on its worker (no metric is rebuilt, so
     any tf_keras metric works, whatever its constructor takes);
  3. runs the evaluator's own `eval_step` over the shard, which updates the
     local state (`self.auc.update_state(...)` reaches it);
  4. returns that state.

The chief then resets the evaluator's metrics, adds up the returned states
and calls the evaluator's `eval_end()`. A closure that dies with its worker
leaves nothing behind, so the ClusterCoordinator's retry of it (at-least-once)
cannot double-count: every example is counted exactly once. This relies on
metric state being additive (sums and counts), as it is for tf_keras's Mean,
Sum, AUC, accuracy, precision/recall and similar metrics.

Requirements on the wrapped evaluator, checked where possible: `eval_begin()`
returns None (Orbit's state/`eval_reduce` style cannot be split into shards);
`eval_step` takes one element from its iterator per call (it is handed an
iterator over one batch); `eval_step` is not itself a `tf.function` (it would
keep updating the original metrics: detected after the evaluation,
UsageError). The eval dataset must be finite (`datasets.EvalShards`).
"""

import contextlib
from typing import Any, Iterator

import numpy as np
import orbit
import tensorflow as tf
import tf_keras

from tfps.input import datasets
from tfps.coordinator import strategy as strategy_lib
from tfps.fast_restart import worker_functions
from tfps.base import errors


class _OneBatch:
  """An iterator over a single element: what `eval_step` sees in a shard loop."""

  def __init__(self, element):
    self._element = element

  def __iter__(self):
    return self

  def __next__(self):
    return self._element

  def get_next(self):
    return self._element


def find_metrics(evaluator: Any) -> dict[str, list[tf_keras.metrics.Metric]]:
  """Maps attribute name → tf_keras metrics held in it (directly or in a container).

  Attributes named `_self_*` are TensorFlow's own object tracking, not the
  evaluator's, and are skipped.
  """
  found = {}
  for name, value in vars(evaluator).items():
    if name.startswith("_self_"):
      continue
    if isinstance(value, tf_keras.metrics.Metric):
      candidates = [value]
    elif isinstance(value, (list, tuple)):
      candidates = list(value)
    elif isinstance(value, dict):
      candidates = list(value.values())
    else:
      continue
    metrics = [m for m in candidates if isinstance(m, tf_keras.metrics.Metric)]
    if metrics:
      found[name] = metrics
  return found


def _state_attributes(metric: tf_keras.metrics.Metric) -> list[str]:
  """The metric's attributes that hold its state variables (e.g. Mean's total, count)."""
  state = {id(v) for v in metric.variables}
  return [name for name, value in vars(metric).items()
          if not name.startswith("_self_") and id(value) in state]


def check_copyable(metric: tf_keras.metrics.Metric, what: str) -> None:
  """UsageError unless every state variable of `metric` is held in one of its attributes.

  Exact evaluation gives each shard its own state by pointing those
  attributes at fresh variables while the shard is traced (below): that
  needs no constructor call, so a metric whose `__init__` does not take its
  own `get_config()` works, with every setting it has; but it needs to find
  the state where `update_state` reads it.
  """
  if not metric.variables:
    raise errors.UsageError(
        f"{what}: metric {metric.name!r} ({type(metric).__name__}) has no state before its "
        "first update (it builds it lazily); build it when you create it, e.g. with "
        "self.add_weight(...) in __init__")
  attributes = _state_attributes(metric)
  if len(attributes) != len(metric.variables):
    held = {id(getattr(metric, a)) for a in attributes}
    missing = [v.name for v in metric.variables if id(v) not in held]
    raise errors.UsageError(
        f"{what}: metric {metric.name!r} ({type(metric).__name__}) keeps state variables "
        f"{missing} outside its own attributes, so exact evaluation cannot give each shard "
        "its own copy; create them with self.add_weight(...) and keep each in an attribute")


@contextlib.contextmanager
def _local_state(metrics: list[tf_keras.metrics.Metric]) -> Iterator[dict[int, tf.Variable]]:
  """Points each metric's state attributes at fresh, function-local variables.

  For the trace of one shard's closure: `update_state` then adds to variables
  that live only for one execution of the closure on its worker (not lifted
  out of the function: tf_keras's own exact evaluation does the same), and
  the metric objects, their settings and the evaluator are left as they
  were. `object.__setattr__` bypasses tf.Module's tracking, so the swap does
  not touch checkpoint dependencies. Yields id(original variable) -> local.
  """
  saved, local = [], {}
  try:
    for metric in metrics:
      for name in _state_attributes(metric):
        original = getattr(metric, name)
        shape, dtype = original.shape, original.dtype
        copy = tf.Variable(lambda shape=shape, dtype=dtype: tf.zeros(shape, dtype),
                           dtype=dtype, shape=shape, trainable=False,
                           experimental_enable_variable_lifting=False,
                           name=f"local_{original.name.split(':')[0].split('/')[-1]}")
        saved.append((metric, name, original))
        local[id(original)] = copy
        object.__setattr__(metric, name, copy)
    yield local
  finally:
    for metric, name, original in reversed(saved):
      object.__setattr__(metric, name, original)


class PSEvaluator(orbit.AbstractEvaluator):
  """Exact, shard-by-shard evaluation of a single-machine `StandardEvaluator`."""

  def __init__(self, evaluator: orbit.StandardEvaluator, runtime: strategy_lib.PSRuntime, *,
               num_shards: int | None = None):
    if not isinstance(evaluator, orbit.StandardEvaluator):
      raise errors.UsageError(
          f"PSEvaluator wraps an orbit.StandardEvaluator, got {type(evaluator).__name__}")
    self._evaluator = evaluator
    self._runtime = runtime
    what = f"{type(evaluator).__name__}"
    held = find_metrics(evaluator)
    unique = {id(m): m for metrics in held.values() for m in metrics}
    self._metrics = list(unique.values())
    if not self._metrics:
      raise errors.UsageError(
          f"{what}: exact evaluation needs the evaluator's results in tf_keras "
          "metrics held as attributes; found none")
    for metric in self._metrics:
      check_copyable(metric, what)
    num_shards = num_shards or 4 * runtime.num_workers
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
      raise errors.UsageError(f"num_shards ({num_shards!r}) must be a positive integer")
    self._shards = datasets.EvalShards(
        evaluator.eval_dataset, num_shards,
        num_replicas_in_sync=runtime.strategy.num_replicas_in_sync,
        what=f"{what}.eval_dataset")
    self._shard_fn = tf.function(worker_functions.named(self._run_shard, "run_shard"))

  @property
  def evaluator(self) -> orbit.StandardEvaluator:
    """The wrapped single-machine evaluator."""
    return self._evaluator

  @property
  def num_shards(self) -> int:
    return self._shards.num_shards

  def _run_shard(self, shard_index, num_batches):
    """One shard, on a worker: fresh local metric state in, that state out.

    Traced outside `strategy.scope()`: inside it, ParameterServerStrategy would
    place even these function-local variables on a ps.
    """
    with _local_state(self._metrics) as local:
      dataset = self._shards.build(shard_index).take(num_batches)  # -1: all.
      # Over an iterator (not the dataset) AutoGraph builds a while loop;
      # over a dataset it would run eval_step inside a tf.data function.
      for element in iter(dataset):
        self._evaluator.eval_step(_OneBatch(element))
      return [[tf.convert_to_tensor(local[id(v)]) for v in m.variables]
              for m in self._metrics]

  def evaluate(self, num_steps: tf.Tensor) -> dict[str, Any] | None:
    """Evaluates every batch once (num_steps == -1) or `num_steps` batches in total.

    With `num_steps > 0` the budget is split evenly over the shards, so which
    batches are used depends on the number of shards; -1 gives a result that
    does not depend on the cluster.
    """
    num_steps = int(num_steps)
    state = self._evaluator.eval_begin()
    if state is not None:
      raise errors.UsageError(
          f"{type(self._evaluator).__name__}.eval_begin returned state; exact evaluation "
          "supports evaluators that keep their results in tf_keras metrics")
    for metric in self._metrics:
      metric.reset_state()
    before = [[v.numpy() for v in m.variables] for m in self._metrics]
    if num_steps == -1:
      budgets = [-1] * self.num_shards
    else:
      budgets = datasets.split_steps(num_steps, self.num_shards)
    coordinator = self._runtime.coordinator
    results = [coordinator.schedule(self._shard_fn, args=(
                   tf.constant(i, tf.int64), tf.constant(b, tf.int64)))
               for i, b in enumerate(budgets) if b != 0]
    coordinator.join()
    shard_states = [r.fetch() for r in results]
    self._check_untouched(before)
    for j, metric in enumerate(self._metrics):
      for k, variable in enumerate(metric.variables):
        total = np.sum([np.asarray(s[j][k]) for s in shard_states], axis=0)
        variable.assign_add(total.astype(variable.dtype.as_numpy_dtype))
    return self._evaluator.eval_end()

  def _check_untouched(self, before: list[list[np.ndarray]]) -> None:
    for metric, values in zip(self._metrics, before):
      for variable, value in zip(metric.variables, values):
        if not np.array_equal(variable.numpy(), value):
          raise errors.UsageError(
              f"{type(self._evaluator).__name__}: eval_step updated metric "
              f"{metric.name!r} directly instead of through the evaluator's attribute "
              "(is eval_step a tf.function?); exact evaluation cannot count it")
