"""Optimizers built as a first step builds them, before a stored trace is looked up.

A tf_keras optimizer makes its slot variables (Adam's `m` and `v`, RMSprop's
`velocity`, ...) in its first `apply_gradients`, inside the first traced step:
that is how Orbit's `SingleTaskTrainer` and TensorFlow's PS tutorial write a
trainer. A stored trace captured those slots, and they do not exist yet when a
restarted coordinator looks it up, so every coordinator traced its closures
again (seconds; docs/recovery.md "Stored traces").

So each stored trace also records how every optimizer the trainer tracks was
built (`record`): the variables, by their paths among the objects the trainer
tracks (as a checkpoint names them: a slot made later moves no path), in the
order `apply_gradients` gave them, and the name scope its slots were made in
(the traced step's). A later coordinator of the same program builds each of its
optimizers not built yet the same way (`replay`) before it looks the trace up:
the same slots, with the same names and on the same ps, as its first step would
have made. Only tf_keras optimizers (`tf_keras.optimizers.Optimizer`) are
recorded; another kind is left to its first step, and the closure is traced.
"""

from typing import Any, Callable, Mapping, Sequence

from absl import logging
import tensorflow as tf

from tfps.base import tf_internals

# Where a variable is: (its path among the objects a root tracks, its shard).
Place = tuple[str, int]


def _parts(obj: Any) -> list[tf.Variable]:
  parts = tf_internals.shards_of(obj)
  if parts is None and isinstance(obj, tf.Variable):
    parts = [obj]
  return parts or []


def tracked_variables(root) -> dict[Place, tf.Variable]:
  """Each variable `root` tracks, by its place."""
  return _variables_in(tf_internals.tracked_paths(root))


def _variables_in(walk: Sequence[tuple[str, Any]]) -> dict[Place, tf.Variable]:
  return {(path, shard): part for path, obj in walk for shard, part in enumerate(_parts(obj))}


def _optimizer_type():
  import tf_keras  # pylint: disable=g-import-not-at-top  # The experiment's, loaded by now.
  return tf_keras.optimizers.Optimizer


def _slot_scope(optimizer, first: tf.Variable) -> str:
  """The name scope the optimizer's slots were made in (e.g. "cond/Adam/"): a slot is
  named by that scope, the slot's own name and its model variable's."""
  suffix = "/" + first._shared_name  # pylint: disable=protected-access
  for variable in optimizer.variables:
    name = variable.name.rsplit(":", 1)[0]
    if name.endswith(suffix):
      return name[:-len(suffix)].rsplit("/", 1)[0] + "/"
  return ""  # No slots (plain SGD): the scope names nothing.


def record(root) -> list[dict[str, Any]]:
  """How each built tf_keras optimizer `root` tracks was built (JSON-serializable)."""
  optimizer_type = _optimizer_type()
  walk = tf_internals.tracked_paths(root)
  variables = _variables_in(walk)
  builds = []
  for path, optimizer in walk:
    if not isinstance(optimizer, optimizer_type) or not getattr(optimizer, "_built", False):
      continue
    places = {}
    for place, variable in variables.items():
      places.setdefault(optimizer._var_key(variable), place)  # pylint: disable=protected-access
    order = sorted((getattr(optimizer, "_index_dict", None) or {}).items(),
                   key=lambda item: item[1])
    if any(key not in places for key, _ in order):
      continue  # It trains a variable the trainer does not track: left to its first step.
    built_for = [places[key] for key, _ in order]
    builds.append({"optimizer": path, "variables": [list(place) for place in built_for],
                   "scope": _slot_scope(optimizer, variables[built_for[0]]) if built_for else ""})
  return builds


def replay(root, builds: Sequence[Mapping[str, Any]],
           same_program: Callable[[], bool] = lambda: True) -> int:
  """Builds each optimizer of `builds` (`record`'s) that `root` tracks and that is not
  built yet, as recorded, if `same_program()` (asked only then: it may cost); returns
  how many it built. One it cannot find, or whose variables are not all there, is left
  to its first step."""
  if not builds:
    return 0
  optimizer_type = _optimizer_type()
  walk = tf_internals.tracked_paths(root)
  objects = dict(walk)
  unbuilt = [b for b in builds if isinstance(objects.get(b["optimizer"]), optimizer_type)
             and not getattr(objects[b["optimizer"]], "_built", False)]
  if not unbuilt or not same_program():
    return 0
  variables = _variables_in(walk)  # The model variables: there before any build.
  built = 0
  for build in unbuilt:
    optimizer = objects[build["optimizer"]]
    var_list = [variables.get(tuple(place)) for place in build["variables"]]
    if any(v is None for v in var_list):
      logging.info("trace cache: optimizer %s not built ahead: its variables are not all "
                   "tracked as when it was traced", build["optimizer"])
      continue
    strategy = getattr(optimizer, "_distribution_strategy", None) or tf.distribute.get_strategy()
    # As `apply_gradients` builds it: in the strategy's scope (slots beside their
    # variables), out of any function, in the name scope its first step's trace had.
    with strategy.scope(), tf.init_scope(), tf.name_scope(build["scope"]):
      optimizer.build(var_list)
    built += 1
  return built
