"""A train step traced once per graph and copied at every call (tfps.coordinator.step_copies),
in one process: the copies must run what calls traced in place would."""

import pytest
import tensorflow as tf

from tfps.coordinator import step_copies

pytestmark = pytest.mark.tf

STEPS = 6


class _Model:
  """A step with dense and sparse updates of variables, reading an iterator."""

  def __init__(self):
    self.table = tf.Variable(tf.reshape(tf.range(40, dtype=tf.float32), [10, 4]) / 40.0)
    self.dense = tf.Variable(tf.ones([4]))
    self.steps = tf.Variable(0, dtype=tf.int64)
    self.python_calls = 0

  def train_step(self, iterator):
    self.python_calls += 1
    ids = next(iterator)
    with tf.GradientTape() as tape:
      rows = tf.gather(self.table, ids)
      loss = tf.reduce_sum(tf.square(rows * self.dense - 1.0))
    table_grad, dense_grad = tape.gradient(loss, [self.table, self.dense])
    self.table.scatter_sub(tf.IndexedSlices(0.1 * table_grad.values, table_grad.indices))
    self.dense.assign_sub(0.1 * dense_grad)
    if loss > 1.0:  # Python control flow on a tensor: AutoGraph converts it.
      self.steps.assign_add(1)
    else:
      self.steps.assign_add(2)
    return {"loss": loss}


def _dataset():
  return tf.data.Dataset.range(1000).map(lambda i: tf.stack([i % 10, (i * 3) % 10])).repeat()


def _closure(model, copied: bool, looped: bool = False):
  @tf.function
  def closure(iterator):
    step = (step_copies.StepCopies(lambda: model.train_step(iterator)) if copied
            else lambda: model.train_step(iterator))
    total = tf.constant(0.0)
    for _ in range(STEPS // 2 if looped else STEPS):  # Python: written out.
      total += step()["loss"]
    if looped:
      for _ in tf.range(STEPS // 2 // 3):  # A while loop: its body is another graph.
        for _ in range(3):
          total += step()["loss"]
    return total
  return closure


def _trained(copied: bool, looped: bool = False):
  model = _Model()
  iterator = iter(_dataset())
  closure = _closure(model, copied, looped)
  total = [float(closure(iterator)) for _ in range(3)]
  return model, total


@pytest.mark.parametrize("looped", [False, True])
def test_copies_train_what_steps_traced_in_place_train(looped):
  traced, traced_losses = _trained(copied=False, looped=looped)
  copied, copied_losses = _trained(copied=True, looped=looped)
  assert copied_losses == traced_losses
  for a, b in ((copied.table, traced.table), (copied.dense, traced.dense),
               (copied.steps, traced.steps)):
    assert a.numpy().tolist() == b.numpy().tolist()
  # Traced once per graph: the closure's (and the loop body's), not once per step.
  assert copied.python_calls == (2 if looped else 1)
  assert traced.python_calls == STEPS


def test_a_copy_inside_control_dependencies_waits_for_them():
  model = _Model()
  gate_value = tf.Variable(0)

  @tf.function
  def closure(iterator):
    step = step_copies.StepCopies(lambda: model.train_step(iterator))
    step()
    gate = gate_value.assign_add(1, read_value=False, name="gate")
    with tf.control_dependencies([gate]):
      step()

  graph = closure.get_concrete_function(iter(_dataset())).graph
  gate = graph.get_operation_by_name("gate")
  second = [op for op in graph.get_operations() if op.name.startswith("step_1/")]
  roots = [op for op in second if not any(t.op.name.startswith("step_1/") for t in op.inputs)
           and not any(c.name.startswith("step_1/") for c in op.control_inputs)]
  # Each op of the second copy that waits for nothing else of it waits for the gate,
  # as a step traced in the block would; the first copy's do not.
  assert roots and all(gate in op.control_inputs for op in roots)
  assert not any(gate in op.control_inputs for op in graph.get_operations()
                 if op.name.startswith("step/"))


def test_later_copies_take_their_constants_from_the_first():
  model = _Model()

  @tf.function
  def closure(iterator):
    step = step_copies.StepCopies(lambda: model.train_step(iterator))
    return step()["loss"] + step()["loss"] + step()["loss"]

  graph = closure.get_concrete_function(iter(_dataset())).graph
  first, second, third = ([op for op in graph.get_operations() if op.name.startswith(f"{p}/")]
                          for p in ("step", "step_1", "step_2"))
  consts = [op for op in first if op.type == "Const" and not op.control_inputs]
  assert consts
  # A later copy makes none of the constants the first made; it reads the first's.
  names = {op.name.split("/", 1)[1] for op in consts}
  assert not names & {op.name.split("/", 1)[1] for op in second + third}
  assert len(second) == len(third) <= len(first) - len(consts)
  read_from_first = {t.op for op in second for t in op.inputs if t.op.name.startswith("step/")}
  assert set(consts) & read_from_first


def test_an_op_colocated_with_a_captured_variable_stays_colocated_with_it():
  variable = tf.Variable(1.0)

  def step():
    with tf.compat.v1.colocate_with(variable.handle.op if hasattr(variable.handle, "op")
                                    else variable):
      return {"x": tf.identity(variable.read_value()) * 2.0}

  @tf.function
  def closure():
    copies = step_copies.StepCopies(step)
    return copies()["x"] + copies()["x"]

  graph = closure.get_concrete_function().graph
  handle = next(internal for external, internal in graph.captures
                if external is variable.handle)
  colocated = [op for op in graph.get_operations()
               if op.name.startswith("step") and op.colocation_groups() != [
                   f"loc:@{op.name}".encode()]]
  assert colocated
  assert all(f"loc:@{handle.op.name}".encode() in op.colocation_groups() for op in colocated)
  assert float(closure()) == 4.0


def test_a_constant_an_op_is_colocated_with_is_made_by_each_copy():
  variable = tf.Variable(1.0)

  def step():
    value = variable.read_value()
    two = tf.constant(2.0, name="two")
    with tf.compat.v1.colocate_with(two.op):
      return {"x": tf.multiply(value, two, name="times")}

  @tf.function
  def closure():
    copies = step_copies.StepCopies(step)
    return copies()["x"] + copies()["x"]

  graph = closure.get_concrete_function().graph
  for scope in ("step", "step_1"):
    times = graph.get_operation_by_name(f"{scope}/times")
    assert times.colocation_groups() == [f"loc:@{scope}/two".encode()]
  assert float(closure()) == 4.0


def test_a_step_returning_python_values_is_traced_at_every_call(caplog):
  model = _Model()

  def step(iterator):
    out = model.train_step(iterator)
    return {"loss": out["loss"], "kind": "dense"}

  @tf.function
  def closure(iterator):
    copies = step_copies.StepCopies(lambda: step(iterator), "Model.train_step")
    return copies()["loss"] + copies()["loss"]

  caplog.set_level("INFO", logger="absl")
  closure(iter(_dataset()))
  # One trace to find it out, then one per call.
  assert model.python_calls == 3
  assert int(model.steps.numpy()) >= 2
  assert sum("Model.train_step is traced at every step" in r.getMessage()
             for r in caplog.records) == 1
