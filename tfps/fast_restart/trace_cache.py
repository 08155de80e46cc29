"""Traced closures kept beside the checkpoints, for the next coordinator of the run.

Every coordinator traced the same train closures again: for a written-out
closure that is seconds of Python on the chief (thousands of ops), most of
what a write-out costs, on every restart (docs/recovery.md "Stored traces"). The first coordinator that traces a
closure stores its graph in `model_dir/traces/`; a later one with the same
program, configuration and variable layout rebuilds the function from it in
a fraction of a second and binds it to its own variables. What remains is
each worker's instantiation of it, which TensorFlow does per coordinator.

An entry is used only when all of this holds, else the closure is traced as
before (and the entry replaced):

* its key: what shapes the trace (experiment and its parameters, batch,
  seed, closure sizes, input shards, cluster size) and the TensorFlow and
  Python versions; an entry of another number of ps (`LAYOUT`) serves too,
  its ops moved to where their variables are now (`trace_relocation`):
  after a failover, the trace stored on every ps;
* the program: every Python module loaded when it was traced is unchanged
  (size and modification time), the trainer's code included;
* its captures: each variable the function captured is at the same path
  among the objects the trainer tracks (as a checkpoint names them), with
  the same name, dtype, shape and device (or, on another task, one that
  every variable of its old task moved to as well); other captured tensors
  are constants stored by value. A function that captures anything else (a
  lookup table, a callable) is not stored.

As with `tf.function`'s own cache, a function not traced again runs none of
its Python: a trainer whose first step creates variables never matches,
since those do not exist yet when the entry is checked, and is traced every
time, as before. Except a tf_keras optimizer's slots, the common case: an
entry records how each optimizer was built, and a coordinator builds its own
the same way before it checks the entry (`optimizer_builds`).

The rebuild uses TensorFlow internals (the pieces its SavedModel loader
uses, reached through `base.tf_internals`); any failure there is logged in
one line and the closure is traced.
"""

import base64
import dataclasses
import functools
import hashlib
import json
import os
import sys
from typing import Any, Mapping, Sequence

from absl import logging
import tensorflow as tf

from tensorflow.core.framework import function_pb2
from tensorflow.core.framework import tensor_pb2

from tfps.base import files
from tfps.base import tf_internals
from tfps.fast_restart import optimizer_builds
from tfps.fast_restart import trace_relocation
from tfps.fast_restart import worker_functions

# 2: a captured variable is found by its path among the objects the trainer tracks,
# not by its place in their walk (which an optimizer's slots made later shift).
FORMAT = 2
# The key field an entry may differ in: its ops are moved to the variables' tasks.
LAYOUT = "num_ps"


class NotStorable(Exception):
  """A traced function this cache cannot store (says what it captures or returns)."""


def module_files() -> list[tuple[str, int, int]]:
  """(path, size, mtime_ns) of every Python source file loaded in this process.

  AutoGraph's generated modules (temporary files, one set per process) are
  left out: they are made from the others.
  """
  files = set()
  for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py") or "__autograph_generated" in name:
      continue
    try:
      status = os.stat(path)
    except OSError:
      continue
    files.add((path, status.st_size, status.st_mtime_ns))
  return sorted(files)


def changed_file(files: Sequence[Sequence[Any]]) -> str | None:
  """The first of `files` (as `module_files` lists them) that changed or is gone."""
  for path, size, mtime_ns in files:
    try:
      status = os.stat(path)
    except OSError:
      return path
    if (status.st_size, status.st_mtime_ns) != (size, mtime_ns):
      return path
  return None


def tracked_variables(root) -> dict[tuple[str, int], tf.Variable]:
  """Each variable `root` tracks, by (its path as a checkpoint names it, its shard)."""
  return optimizer_builds.tracked_variables(root)


def _encode_outputs(structure) -> Any:
  """The structure of a function's outputs as JSON, its tensors as leaves."""
  if isinstance(structure, tf.Tensor):
    return "tensor"
  if isinstance(structure, dict) and all(isinstance(k, str) for k in structure):
    return {"dict": {key: _encode_outputs(value) for key, value in structure.items()}}
  if type(structure) in (list, tuple):  # Not a namedtuple: its fields would be lost.
    return {type(structure).__name__: [_encode_outputs(value) for value in structure]}
  raise NotStorable(f"it returns a {type(structure).__name__}")


def _decode_outputs(encoded) -> Any:
  """A structure like the one encoded, with 0 for each tensor (for `tf.nest`)."""
  if encoded == "tensor":
    return 0
  if "dict" in encoded:
    return {key: _decode_outputs(value) for key, value in encoded["dict"].items()}
  if "list" in encoded:
    return [_decode_outputs(value) for value in encoded["list"]]
  return tuple(_decode_outputs(value) for value in encoded["tuple"])


def _describe(variable, handle) -> dict[str, Any]:
  return {"name": variable.name, "dtype": variable.dtype.name,
          "shape": variable.shape.as_list(), "device": handle.device}


def _renamed(library: function_pb2.FunctionDefLibrary, suffix: str) -> dict[str, str]:
  """Renames every function of `library` and each reference to one, in place."""
  names = {fdef.signature.name: fdef.signature.name + suffix for fdef in library.function}

  def rename_in(attr) -> None:
    if attr.HasField("func"):
      attr.func.name = names.get(attr.func.name, attr.func.name)
      for nested in attr.func.attr.values():
        rename_in(nested)
    for func in attr.list.func:
      func.name = names.get(func.name, func.name)

  for fdef in library.function:
    fdef.signature.name = names[fdef.signature.name]
    for node in fdef.node_def:
      node.op = names.get(node.op, node.op)
      for attr in node.attr.values():
        rename_in(attr)
  return names


@dataclasses.dataclass(frozen=True)
class TraceCache:
  """Stored traces under `directory`, valid for `key` (JSON-serializable).

  `cluster` ({job: [address]}, the coordinator's) names the rebuilt functions
  (`worker_functions`); it does not choose the entry.
  """

  directory: str
  key: Mapping[str, Any]
  cluster: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)

  def extended(self, **more: Any) -> "TraceCache":
    """The same cache for a narrower key (e.g. the trainer's own settings)."""
    return dataclasses.replace(self, key={**self.key, **more})

  def in_cluster(self, cluster: Mapping[str, Sequence[str]]) -> "TraceCache":
    """The same cache, for a coordinator of `cluster`."""
    return dataclasses.replace(self, cluster=dict(cluster))

  def path(self, name: str) -> str:
    full_key = {**self.key, "function": name, "tensorflow": tf.__version__,
                "python": sys.version.split()[0]}
    digest = hashlib.sha256(json.dumps(full_key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(self.directory, f"{name}-{digest}.json")

  def save(self, name: str, function, root) -> bool:
    """Stores traced `function` (a `ConcreteFunction`); False (logged) if it cannot be."""
    try:
      entry = self._entry(function, root)
    except NotStorable as e:
      logging.info("trace cache: %s is traced by every coordinator: %s", name, e)
      return False
    except Exception as e:  # pylint: disable=broad-except
      # Storing is an optimization: whatever TensorFlow raises here, training goes on.
      logging.warning("trace cache: %s not stored (%s: %s)", name, type(e).__name__,
                      str(e).splitlines()[0][:200] if str(e) else "")
      return False
    entry["key"] = json.loads(json.dumps(self.key))
    try:
      os.makedirs(self.directory, exist_ok=True)
      files.write_json(self.path(name), entry)
    except OSError as e:
      logging.warning("trace cache: could not store %s in %s: %s", name, self.directory, e)
      return False
    return True

  def _entry(self, function, root) -> dict[str, Any]:
    by_place = tracked_variables(root)
    places = {id(variable.handle): place for place, variable in by_place.items()}
    captures = []
    for tensor in function.captured_inputs:
      if not isinstance(tensor, tf.Tensor):
        raise NotStorable(f"it captures a {type(tensor).__name__}")
      if tensor.dtype == tf.resource:
        place = places.get(id(tensor))
        if place is None:
          raise NotStorable("it captures a resource that is not a variable the trainer tracks")
        captures.append({"variable": list(place), **_describe(by_place[place], tensor)})
      else:
        proto = tf.make_tensor_proto(tensor.numpy())
        captures.append({"constant": base64.b64encode(proto.SerializeToString()).decode()})
    library = function_pb2.FunctionDefLibrary()
    library.function.add().CopyFrom(function.function_def)
    library.function.extend(function.graph.as_graph_def().library.function)
    return {"format": FORMAT, "function": function.function_def.signature.name,
            "library": base64.b64encode(library.SerializeToString()).decode(),
            "captures": captures, "outputs": _encode_outputs(function.structured_outputs),
            "modules": module_files(), "optimizer_builds": _builds_of(root)}

  def load(self, name: str, input_specs: Sequence[tf.TensorSpec], root, variables=None):
    """The function stored for `name`, bound to `root`'s variables; None if there is
    none that is valid (the reason is logged).

    The entry of this very key first, then those of another number of ps
    (`LAYOUT`), newest first, moved to where the variables are now.
    `variables` ({place: variable}, as `tracked_variables` finds them) stands in for
    `root`'s: anything with a name, dtype, shape and handle.
    """
    reasons = []
    for entry, moves, found in self._fitting(name, root, variables, reasons):
      try:
        function, moved = _rebuild(entry, input_specs, found, moves, self.cluster)
      except trace_relocation.NotRelocatable as e:
        reasons.append(_not_movable(entry, e))
        continue
      except Exception as e:  # pylint: disable=broad-except
        # A TensorFlow that rebuilds differently: trace instead.
        logging.warning("trace cache: %s: its stored trace did not load (%s: %s)", name,
                        type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
        continue
      stored_on = entry["key"].get(LAYOUT)
      if stored_on != self.key.get(LAYOUT) or moved:
        logging.info("trace cache: %s closure taken from the trace stored on %s ps, %d ops "
                     "moved to where their variables are now", name, stored_on, moved)
      return function
    _say_traced_again(name, reasons)
    return None

  def fits(self, name: str, root) -> bool:
    """Whether `load(name, ..., root)` would find a stored trace that fits `root`'s
    variables, from the entries alone: nothing rebuilt (the reason is logged if not)."""
    reasons = []
    if next(iter(self._fitting(name, root, None, reasons)), None) is not None:
      return True
    _say_traced_again(name, reasons)
    return False

  def stored_on_this_layout(self, name: str, root) -> bool:
    """Whether a trace of `name` stored on this very number of ps fits `root`'s
    variables: run as traced, not moved from another layout (a failover's)."""
    return any(entry["key"].get(LAYOUT) == self.key.get(LAYOUT)
               for entry, _, _ in self._fitting(name, root, None, []))

  def stored(self, name: str) -> bool:
    """Whether a trace of `name` is stored for this key, on this number of ps or
    another (`load` would try it), without reading what it captured."""
    for path in self._candidates(name):
      try:
        if self._same_but_layout(_read_entry(path)):
          return True
      except (OSError, ValueError):
        continue
    return False

  def rebuilt_tag(self, name: str, variables) -> str | None:
    """What `load(name, ..., variables=variables)` would name its function by
    (`worker_functions.rebuilt_tag`), without rebuilding it; None: nothing fits."""
    for entry, moves, _ in self._fitting(name, None, variables, []):
      return worker_functions.rebuilt_tag(*_naming(entry, moves, self.cluster))
    return None

  def _fitting(self, name: str, root, variables, reasons: list[str]):
    """(entry, moves, variables) of each stored entry for `name` that fits, in the
    order `load` tries them; why the others do not is added to `reasons`."""
    exact = self.path(name)
    for path in self._candidates(name):
      try:
        entry = _read_entry(path)
        if not self._same_but_layout(entry):
          if path == exact:
            reasons.append("stored by another version or configuration")
          continue  # Another layout's file of another configuration: not ours to judge.
        if root is not None and _built_as_traced(entry, root):
          variables = None  # Its optimizers' slots are new: walk the variables again.
        variables = tracked_variables(root) if variables is None else variables
        reason, moves = self._fit(entry, variables)
      except Exception as e:  # pylint: disable=broad-except
        # A damaged entry: trace instead.
        logging.warning("trace cache: %s: its stored trace in %s did not load (%s: %s)", name,
                        path, type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
        continue
      if reason:
        reasons.append(reason)
        continue
      yield entry, moves, variables

  def _candidates(self, name: str) -> list[str]:
    """This key's entry for `name` if stored, then other layouts' entries, newest first."""
    exact = self.path(name)
    found = [exact] if os.path.exists(exact) else []
    if LAYOUT not in self.key:
      return found
    try:
      names = os.listdir(self.directory)
    except OSError:
      return found
    others = [os.path.join(self.directory, f) for f in names
              if f.startswith(f"{name}-") and f.endswith(".json")]
    others = [p for p in others if p != exact]
    others.sort(key=_modified, reverse=True)
    return found + others

  def _fit(self, entry: Mapping[str, Any], variables: Mapping[tuple[str, int], tf.Variable]
           ) -> tuple[str | None, dict]:
    """Why `entry` does not fit this coordinator, whose variables are `variables`
    (`tracked_variables`), and else (None) where each task's variables are now. Its key
    is this one's but for the layout (`_same_but_layout`)."""
    changed = changed_file(entry["modules"])
    if changed:
      return f"{changed} changed since it was traced", {}
    devices = []
    for capture in entry["captures"]:
      if "variable" not in capture:
        continue
      variable = variables.get(tuple(capture["variable"]))
      if variable is None:
        return f"variable {capture['name']} is not where it was", {}
      now = _describe(variable, variable.handle)
      if any(now[k] != capture[k] for k in now if k != "device"):
        return f"variable {capture['name']} is now {now}", {}
      devices.append((capture["device"], now["device"]))
    try:
      return None, trace_relocation.task_moves(devices)
    except trace_relocation.NotRelocatable as e:
      return _not_movable(entry, e), {}

  def _same_but_layout(self, entry: Mapping[str, Any]) -> bool:
    """Whether `entry` is of this format and key, but for the number of ps."""
    ours = json.loads(json.dumps(self.key))
    theirs = entry.get("key")
    return (entry.get("format") == FORMAT and isinstance(theirs, dict)
            and {k: v for k, v in theirs.items() if k != LAYOUT}
            == {k: v for k, v in ours.items() if k != LAYOUT})


def _builds_of(root) -> list[dict[str, Any]]:
  """`optimizer_builds.record(root)`; none if it fails (the trace is stored all the same)."""
  try:
    return optimizer_builds.record(root)
  except Exception as e:  # pylint: disable=broad-except
    logging.info("trace cache: how the optimizers were built is not stored (%s: %s)",
                 type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
    return []


def _built_as_traced(entry: Mapping[str, Any], root) -> bool:
  """Builds `root`'s optimizers not built yet as they were when `entry` was traced, if
  the program is the same; whether any was built."""
  same_program = lambda: changed_file(entry["modules"]) is None
  return optimizer_builds.replay(root, entry.get("optimizer_builds") or (), same_program) > 0


def _say_traced_again(name: str, reasons: Sequence[str]) -> None:
  if reasons:
    logging.info("trace cache: %s traced again: %s", name, "; ".join(reasons))


def _read_entry(path: str) -> dict[str, Any]:
  """The stored entry at `path`, parsed once per version of the file in this process:
  a coordinator's start asks `stored` for several closure sizes, then `load`s one,
  and an entry is megabytes of JSON."""
  status = os.stat(path)
  return _parsed(path, status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _parsed(path: str, size: int, mtime_ns: int) -> dict[str, Any]:
  del size, mtime_ns  # The cache key: a rewritten file is read again.
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _modified(path: str) -> int:
  """When `path` was last written (0 if it is gone meanwhile)."""
  try:
    return os.stat(path).st_mtime_ns
  except OSError:
    return 0


def _not_movable(entry: Mapping[str, Any], error: Exception) -> str:
  return f"the trace stored on {entry['key'].get(LAYOUT)} ps cannot be moved here: {error}"


def _naming(entry: Mapping[str, Any], moves: dict, cluster: Mapping[str, Sequence[str]]
            ) -> tuple[Any, ...]:
  """What a rebuilt function is named by: the entry, its moves, the cluster's shape."""
  return (entry, sorted(map(str, moves.items())), worker_functions.placement(cluster),
          tf.__version__)


def _rebuild(entry: Mapping[str, Any], input_specs: Sequence[tf.TensorSpec],
             variables: Mapping[tuple[str, int], tf.Variable], moves: dict,
             cluster: Mapping[str, Sequence[str]]):
  """A `ConcreteFunction` from a stored entry, capturing `variables` (`tracked_variables`),
  its ops on a task moved as `moves` says (`trace_relocation`); and how many moved.

  Its names stand for the entry, the moves and `cluster`'s shape (`worker_functions`).
  """
  library = function_pb2.FunctionDefLibrary.FromString(base64.b64decode(entry["library"]))
  moved = trace_relocation.relocate(library, moves)
  names = _renamed(library, worker_functions.rebuilt_suffix(*_naming(entry, moves, cluster)))
  outer_name = names[entry["function"]]
  outer = None
  for fdef in library.function:
    if fdef.signature.name == outer_name:
      outer = fdef
    else:
      tf_internals.register_function_def(fdef)  # Called from the outer one.
  captures = []
  for capture in entry["captures"]:
    if "variable" in capture:
      captures.append(variables[tuple(capture["variable"])].handle)
    else:
      proto = tensor_pb2.TensorProto.FromString(base64.b64decode(capture["constant"]))
      captures.append(tf.constant(tf.make_ndarray(proto)))
  function = tf_internals.function_from_def(outer, input_specs, _decode_outputs(entry["outputs"]),
                                            captures)
  return function, moved
