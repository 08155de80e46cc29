"""A train step traced once per graph and copied in at every further call.

A written-out closure calls the trainer's `train_step` 50 times while it is
traced, and every call runs the step's Python again: the tape, the layers,
the optimizer. That is most of what writing out costs the chief (~0.1 s a
step for the ctr, seconds a closure: docs/recovery.md "Fast start"). The
step's ops are the same at every call, so `StepCopies` traces it once in
each graph it is called in, as a graph of its own, and at each call adds a
copy of that graph's ops to the caller's graph (`tf.graph_util.import_graph_def`):

* the same ops on the same inputs: each captured tensor (the iterator, a
  variable's handle) is bound to the caller's capture of it, and each op's
  colocation with one of them to that capture;
* the same order: the copy's ops come into the caller's graph as a trace
  would make them, one step after the other, so the closure's automatic
  control dependencies order each step's updates after the step before's on
  the same variables and nothing more, as for a step traced in place; an
  enclosing `tf.control_dependencies` holds the copy's first ops;
* the constants once: ops with no side effects that compute from constants
  alone (~40 % of the ctr step's ops, most of them `Const`) come in with the
  first copy in a graph, and every later copy uses that copy's (`_invariant`):
  a smaller closure to trace, place and optimize, the same values;
* not a call: a nested `tf.function` called 50 times traced as fast, but
  TensorFlow inlines a call with all of its side effects done before its
  outputs, which held each step until the one before had ended (~19 %
  slower steps: docs/history/2026-11-27-recovery.md).

A step is traced in place instead (at every call) when it cannot be copied
so: it returns something other than tensors, or takes a value resolved only
when it runs (a per-worker resource); the first call says so in one line.
Like `tf.function`, a copied step runs its Python once per graph, not once
per step.
"""

from typing import Any, Callable
import weakref

from absl import logging
import tensorflow as tf
from tensorflow.python.framework import op_def_registry  # pylint: disable=g-direct-tensorflow-import

from tfps.base import tf_internals

_NAME = "step"


class _Traced:
  """One trace of the step in one graph, ready to be copied into it."""

  def __init__(self, graph):
    self.structure = graph.structured_outputs
    outputs = tf.nest.flatten(self.structure)
    self.captures = list(graph.captures)  # (external, placeholder)
    # Each capture's placeholder op by name: its place in `captures`.
    self.capture_index = {internal.op.name: i for i, (_, internal) in enumerate(self.captures)}
    placeholders = self.capture_index.keys()
    # An output that is a captured tensor itself is that tensor, not a copy.
    self.outputs = [("none", None) if t is None else
                    ("capture", self.capture_index[t.op.name]) if t.op.name in placeholders
                    else ("copy", t.name) for t in outputs]
    full = graph.as_graph_def()
    self.graph_def = tf.compat.v1.GraphDef()
    self.graph_def.versions.CopyFrom(full.versions)
    self.graph_def.library.CopyFrom(full.library)
    kept = {node.name for node in full.node if node.name not in placeholders}
    # Nodes colocated with a capture (or an op outside the step), colocated again
    # once copied.
    self.colocated: list[tuple[str, list[str], list[str]]] = []
    for node in full.node:
      if node.name in placeholders:
        continue
      copied = self.graph_def.node.add()
      copied.CopyFrom(node)
      if "_class" in copied.attr:
        targets = [loc.decode()[len("loc:@"):] for loc in copied.attr["_class"].list.s]
        outside = [t for t in targets if t not in kept]
        if outside:
          self.colocated.append((node.name, [t for t in targets if t in kept], outside))
          del copied.attr["_class"]
    # Nodes whose inputs are all captures (or none): an enclosing control
    # dependency holds them.
    self.roots = self._roots(self.graph_def, given=frozenset())
    # What each copy's import returns: the copied outputs, then the roots' and the
    # colocated ops (the same names at every copy).
    self.wanted = [name for kind, name in self.outputs if kind == "copy"]
    self.return_elements = (self.wanted + [name for name, _ in self.roots]
                            + [name for name, _, _ in self.colocated])
    # Later copies in this graph: the same without the invariant ops, whose outputs
    # they take from the first copy (`shared`, once it is made). Each copy keeps its
    # own outputs, and the ops colocated with others and those others (a colocation
    # names ops of its own copy).
    own = {_source(t) for t in self.wanted}
    for node in full.node:
      if "_class" in node.attr:
        own.add(node.name)
        own.update(loc.decode()[len("loc:@"):] for loc in node.attr["_class"].list.s)
    invariant = _invariant(self.graph_def, keep=own)
    self.later_def = tf.compat.v1.GraphDef()
    self.later_def.versions.CopyFrom(full.versions)
    self.later_def.library.CopyFrom(full.library)
    shared_inputs: set[str] = set()
    for node in self.graph_def.node:
      if node.name in invariant:
        continue
      later = self.later_def.node.add()
      later.CopyFrom(node)
      # A wait for an invariant op waits for nothing: it has no effects, no waits.
      del later.input[:]
      later.input.extend(name for name in node.input
                         if not (name.startswith("^") and name[1:] in invariant))
      shared_inputs.update(_tensor_name(name) for name in node.input
                           if not name.startswith("^") and _source(name) in invariant)
    self.later_roots = self._roots(self.later_def, given=invariant)
    self.shared_names = sorted(shared_inputs)
    self.shared: dict[str, tf.Tensor] | None = None
    self.later_return_elements = (self.wanted + [name for name, _ in self.later_roots]
                                  + [name for name, _, _ in self.colocated])

  def _roots(self, graph_def, given: frozenset | set) -> list[tuple[str, list[int]]]:
    """The nodes of `graph_def` whose inputs all come from captures or from `given`
    (made before the copy), with the captures' places in `captures`."""
    roots = []
    for node in graph_def.node:
      sources = [_source(name) for name in node.input]
      if all(source in self.capture_index or source in given for source in sources):
        roots.append((node.name, sorted({self.capture_index[x] for x in sources
                                         if x in self.capture_index})))
    return roots

  def copy(self, graph) -> Any:
    """A copy of the step's ops in `graph` (the default graph); its outputs."""
    bound = [graph.capture(external) for external, _ in self.captures]
    input_map = {internal.name: bound[i] for i, (_, internal) in enumerate(self.captures)}
    first = self.shared is None
    if first:  # Every op, and the invariant outputs later copies take from this one.
      graph_def, root_names = self.graph_def, self.roots
      return_elements = self.return_elements + self.shared_names
    else:
      graph_def, root_names = self.later_def, self.later_roots
      return_elements = self.later_return_elements
      input_map.update(self.shared)
    # Outside any tf.control_dependencies block: TensorFlow's importer fails in one
    # (it compares ops with tensors); the roots get the block's control inputs below.
    with graph.control_dependencies(None):
      returned = tf.compat.v1.import_graph_def(
          graph_def, input_map=input_map, return_elements=return_elements, name=_NAME)
    if first:
      self.shared = dict(zip(self.shared_names, returned[len(returned) - len(self.shared_names):]))
      returned = returned[:len(returned) - len(self.shared_names)]
    tensors, ops = returned[:len(self.wanted)], returned[len(self.wanted):]
    roots, colocated = ops[:len(root_names)], ops[len(root_names):]
    for op, (_, inputs) in zip(roots, root_names):
      tf_internals.control_inputs_for(op, [bound[i] for i in inputs])
    for op, (name, inside, outside) in zip(colocated, self.colocated):
      scope = op.name[:len(op.name) - len(name)]
      names = [scope + target for target in inside] + [
          bound[self.capture_index[t]].op.name if t in self.capture_index else t
          for t in outside]
      tf_internals.set_colocation(op, names)
    copied = iter(tensors)
    flat = [None if kind == "none" else bound[where] if kind == "capture" else next(copied)
            for kind, where in self.outputs]
    return tf.nest.pack_sequence_as(self.structure, flat)


class StepCopies:
  """`step()` traced once per graph it is called in, then copied (module docstring)."""

  def __init__(self, step: Callable[[], Any], what: str = "train_step"):
    self._step, self._what = step, what
    # Per graph: its trace, or None where the step is traced in place.
    self._traced: "weakref.WeakKeyDictionary[tf.Graph, _Traced | None]" = (
        weakref.WeakKeyDictionary())
    self._said = False

  @tf.autograph.experimental.do_not_convert
  def __call__(self) -> Any:
    graph = tf.compat.v1.get_default_graph()
    if graph not in self._traced:
      traced, returned = tf_internals.trace_graph(_NAME, self._step)
      reason = _not_copyable(traced, returned)
      if reason:
        if not self._said:
          logging.info("%s is traced at every step of a closure: %s", self._what, reason)
          self._said = True
        self._traced[graph] = None
      else:
        self._traced[graph] = _Traced(traced)
    traced = self._traced[graph]
    if traced is None:
      with tf_internals.autograph_on():  # As a step called from the converted closure is.
        return self._step()
    return traced.copy(graph)


def _source(name: str) -> str:
  """The op a GraphDef input names ('op', 'op:1', '^op')."""
  return name.lstrip("^").split(":")[0]


def _tensor_name(name: str) -> str:
  """A GraphDef input's tensor name (`op` is its output 0)."""
  return name if ":" in name else f"{name}:0"


def _invariant(graph_def, keep: set[str]) -> set[str]:
  """The nodes of `graph_def` every copy computes alike: no side effects, no control
  inputs, inputs only from such nodes (so constants, and what is computed from
  them alone). Not those in `keep`, nor TensorFlow functions (a call's effects are
  its body's)."""
  invariant: set[str] = set()
  for node in graph_def.node:  # A GraphDef from a trace lists a node after its inputs.
    op_def = op_def_registry.get(node.op)
    if (node.name in keep or op_def is None or op_def.is_stateful
        or any(name.startswith("^") for name in node.input)):
      continue
    if all(_source(name) in invariant for name in node.input):
      invariant.add(node.name)
  return invariant


def _not_copyable(graph, returned: Any) -> str | None:
  """Why `graph`, the step's trace, which returned `returned`, cannot be copied; None
  if it can."""
  if tf_internals.has_deferred_captures(graph):
    return "it takes a value resolved only when it runs (a per-worker resource)"
  if not all(t is None or isinstance(t, tf.Tensor) for t in tf.nest.flatten(returned)):
    return "it returns something other than tensors"
  return None
