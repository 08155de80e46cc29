"""Moving a stored trace to another ps layout: its ops go where their variables went.

A trace stored by a coordinator on 2 ps places some of its ops on the ps by
name (those created under a variable's device: reads, gathers, updates). A
coordinator after a ps failover holds the same variables on the ps that
answer, and one that takes the ps back holds them on every ps again: the same
program, placed differently. So instead of tracing again (seconds: see
docs/recovery.md "Stored traces"), it can take the
stored graph and move each op placed on a ps task to the task its variables
are on now. The graph is otherwise the one traced, so it runs the same.

It works where every task's variables went to one task: always after a
failover (many ps to fewer), and after a take-back only if no task's
variables were split between tasks. Otherwise `NotRelocatable` says why and
the closure is traced, as before. Pure functions of protos and device names.
"""

from typing import Iterable

import tensorflow as tf

from tensorflow.core.framework import function_pb2

# (job, replica, task): where a variable lives, without the device in the task.
Task = tuple[str, int, int]


class NotRelocatable(Exception):
  """A stored trace that cannot be moved to the variables' current layout (says why)."""


def task_of(device: str) -> Task | None:
  """The task a device name is in; None for a device with no job (the caller's own)."""
  spec = tf.DeviceSpec.from_string(device)
  if spec.job is None:
    return None
  return spec.job, spec.replica or 0, spec.task or 0


def _task_name(task: Task) -> str:
  return f"{task[0]}:{task[2]}"


def task_moves(devices: Iterable[tuple[str, str]]) -> dict[Task, Task]:
  """Where each task's variables are now, from (device then, device now) per variable.

  Raises `NotRelocatable` if a task's variables are now on more than one task,
  or a variable moved within its task (another device of it).
  """
  moves: dict[Task, Task] = {}
  for then, now in devices:
    then_spec, now_spec = tf.DeviceSpec.from_string(then), tf.DeviceSpec.from_string(now)
    old, new = task_of(then), task_of(now)
    if old is None or new is None:
      if then_spec != now_spec:
        raise NotRelocatable(f"a variable moved from {then or 'no device'} to "
                             f"{now or 'no device'}")
      continue
    if (then_spec.device_type, then_spec.device_index) != (now_spec.device_type,
                                                            now_spec.device_index):
      raise NotRelocatable(f"a variable moved from {then} to {now}, another device of its task")
    if moves.setdefault(old, new) != new:
      raise NotRelocatable(f"the variables {_task_name(old)} held are now on more than one "
                           f"task ({_task_name(moves[old])}, {_task_name(new)})")
  return moves


def relocate(library: function_pb2.FunctionDefLibrary, moves: dict[Task, Task]) -> int:
  """Moves every op on a task of `moves` to that task's new place, in place; how many moved.

  An op on another task of the same job as the variables (a ps none of the
  captured variables was on) cannot be placed by them: `NotRelocatable`. Ops
  on the caller's own device or on other jobs stay where they are.
  """
  jobs = {task[0] for task in moves}
  moved = 0
  for fdef in library.function:
    for node in fdef.node_def:
      if not node.device:
        continue
      old = task_of(node.device)
      if old is None or old[0] not in jobs:
        continue
      new = moves.get(old)
      if new is None:
        raise NotRelocatable(f"op {node.name} is placed on {_task_name(old)}, where none of "
                             "the variables it was traced with was")
      if new != old:
        spec = tf.DeviceSpec.from_string(node.device)
        node.device = spec.replace(job=new[0], replica=new[1], task=new[2]).to_string()
        moved += 1
  return moved
