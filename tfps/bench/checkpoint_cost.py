"""Checkpoint cost against model size, on the cluster: synchronous beside asynchronous.

Runs in the benchmark driver (connected to the cluster): for each size it
creates, on the parameter servers, an embedding-shaped table of that many
float32 parameters plus its Adagrad accumulator (placed and split as tfps
places them, each ps initializing its own part), then, the median of
`repeats` each:

* `save_seconds`: a synchronous save (every ps writes its part; training
  would stop for all of it);
* `async_stall_seconds`: what an asynchronous save (`checkpoints.Manager`)
  stops training for: the save's return (each ps has copied its variables
  into a snapshot) plus the extra time of the first sparse update of every
  variable after it, against the same update once more
  (`async_first_update_extra_seconds`). Were the snapshot to share the
  variables' memory copy-on-write, that update would pay the copy instead;
  measured ~0 with TensorFlow 2.20, which copies at the save;
  `async_write_seconds`: from that save's start until it is complete on
  disk (training runs meanwhile). The first asynchronous save, which also
  creates the snapshot variables, is timed apart (`async_first_seconds`);
* `restore_seconds`: reading the files back into the variables;
* `every_loop`: saves at every loop end, as training makes them: `loops`
  loops of `loop_steps` sparse updates each, a save due at each loop end,
  once as the coordinator saves (a due save is skipped while the last write
  still runs, `checkpoints.Manager`) and once waiting for that write as
  TensorFlow's next save would (`waiting`): the seconds training stood
  still per loop end, the saves made and skipped, and a loop's seconds.
"""

import os
import shutil
import statistics
import time

import tensorflow as tf

from tfps.coordinator import checkpoints
from tfps.coordinator import loop_ends
from tfps.coordinator import run as coordinator_run

_DIM = 16


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def _filled(shape, fill):
  """An initial value each ps computes for its own shard (no tensor leaves the chief)."""

  def initial_value(shard_info=None):
    return fill(shard_info.shape if shard_info is not None else shape)

  return initial_value


def _sparse_update(variables):
  """A step's kind of update: one row of every part of every variable (as Adagrad's)."""
  parts = [p for v in variables for p in getattr(v, "variables", [v])]

  @tf.function
  def update():
    for part in parts:
      part.scatter_add(tf.IndexedSlices(tf.fill([1, _DIM], 1e-3), tf.constant([0])))

  return update


def measure(runtime, sizes: tuple[int, ...], work_dir: str, repeats: int = 3,
            loops: int = 8, loop_steps: int = 200) -> list[dict]:
  # Without TF's three lines per asynchronous save, as in the chief's log.
  with coordinator_run.routine_lines_dropped():
    return _measure(runtime, sizes, work_dir, repeats, loops, loop_steps)


def _every_loop(items: dict, update, step: tf.Variable, directory: str, *, skip: bool,
                loops: int, loop_steps: int) -> dict:
  """Saves due at every loop end of `loops` loops of `loop_steps` updates (module doc)."""
  manager = checkpoints.Manager(tf.train.Checkpoint(**items), directory, asynchronous=True,
                                max_to_keep=1, step_counter=step, checkpoint_interval=loop_steps,
                                save_due=loop_ends.LoopEnds(loop_steps, loop_steps).save_due,
                                skip_while_writing=skip)
  manager.save_now(int(step.numpy()))  # Builds the snapshots, as a coordinator's first save.
  manager.stall_seconds = 0.0
  loop_seconds = []
  for _ in range(loops):
    start = time.perf_counter()
    for _ in range(loop_steps):
      update()
    step.assign_add(loop_steps)
    loop_seconds.append(time.perf_counter() - start)
    manager.save(checkpoint_number=int(step.numpy()))
  stall, saves, skipped = manager.stall_seconds, manager.saves - 1, manager.saves_skipped
  manager.close()
  shutil.rmtree(directory, ignore_errors=True)
  return {"stall_per_loop_end_seconds": round(stall / loops, 3), "saves": saves,
          "skipped": skipped, "loop_seconds": round(statistics.median(loop_seconds), 3)}


def _measure(runtime, sizes: tuple[int, ...], work_dir: str, repeats: int, loops: int,
             loop_steps: int) -> list[dict]:
  rows = []
  for params in sizes:
    shape = (max(1, params // _DIM), _DIM)
    with runtime.strategy.scope():
      table = tf.Variable(_filled(shape, lambda s: tf.random.uniform(s, -0.05, 0.05, seed=1)),
                          shape=shape, dtype=tf.float32, name="table")
      accumulator = tf.Variable(_filled(shape, lambda s: tf.fill(s, 1e-6)),
                                shape=shape, dtype=tf.float32, name="accumulator")
      step = tf.Variable(0, dtype=tf.int64, name="step")
    items = dict(table=table, accumulator=accumulator, step=step)
    row = {"parameters": params, "variables_bytes": 2 * params * 4}

    directory = os.path.join(work_dir, f"checkpoint-cost-{params}")
    manager = checkpoints.Manager(tf.train.Checkpoint(**items), directory, asynchronous=False,
                                  max_to_keep=1)
    saves, restores = [], []
    for i in range(repeats):
      saves.append(_timed(lambda: manager.save_now(i)))
      restores.append(_timed(lambda: manager.checkpoint.restore(
          manager.latest_checkpoint).assert_consumed()))
    row["checkpoint_bytes"] = sum(os.path.getsize(os.path.join(directory, f))
                                  for f in os.listdir(directory))
    shutil.rmtree(directory, ignore_errors=True)

    directory = os.path.join(work_dir, f"checkpoint-cost-async-{params}")
    manager = checkpoints.Manager(tf.train.Checkpoint(**items), directory, asynchronous=True,
                                  max_to_keep=1)
    row["async_first_seconds"] = round(_timed(lambda: manager.save_now(0)), 3)
    update = _sparse_update([table, accumulator])
    update()
    returns, copies, writes = [], [], []
    for i in range(1, repeats + 1):
      start = time.perf_counter()
      manager.save(checkpoint_number=i, check_interval=False)
      returns.append(time.perf_counter() - start)
      copies.append(_timed(update) - _timed(update))  # The first would pay a copy-on-write.
      manager.sync()
      writes.append(time.perf_counter() - start)
    manager.close()
    shutil.rmtree(directory, ignore_errors=True)
    # Taking turns would leave one a host busy with the other's write: one, then the other.
    row["every_loop"] = {
        mode: _every_loop(items, update, step, os.path.join(work_dir, f"every-loop-{params}"),
                          skip=mode == "skipping", loops=loops, loop_steps=loop_steps)
        for mode in ("waiting", "skipping")}

    row.update(save_seconds=round(statistics.median(saves), 3),
               async_stall_seconds=round(statistics.median(
                   [r + c for r, c in zip(returns, copies)]), 3),
               async_return_seconds=round(statistics.median(returns), 3),
               async_first_update_extra_seconds=round(statistics.median(copies), 3),
               async_write_seconds=round(statistics.median(writes), 3),
               restore_seconds=round(statistics.median(restores), 3))
    rows.append(row)
    del table, accumulator, step, items, manager
  return rows
