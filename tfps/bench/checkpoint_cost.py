"""Checkpoint save and restore time against model size, on the cluster.

Runs in the benchmark driver (connected to the cluster): for each size it
creates, on the parameter servers, an embedding-shaped table of that many
float32 parameters plus its Adagrad accumulator (placed and split as tfps
places them), then times `CheckpointManager.save` (the chief reads every
variable from the ps and writes the files) and `Checkpoint.restore` (reads
the files and assigns the variables on the ps), the median of `repeats`.
"""

import os
import shutil
import statistics
import time

import tensorflow as tf

_DIM = 16


def measure(runtime, sizes: tuple[int, ...], work_dir: str, repeats: int = 3) -> list[dict]:
  rows = []
  for params in sizes:
    with runtime.strategy.scope():
      shape = (max(1, params // _DIM), _DIM)
      table = tf.Variable(tf.random.uniform(shape, -0.05, 0.05, seed=1), name="table")
      accumulator = tf.Variable(tf.fill(shape, 1e-6), name="accumulator")
      step = tf.Variable(0, dtype=tf.int64, name="step")
    checkpoint = tf.train.Checkpoint(table=table, accumulator=accumulator, step=step)
    directory = os.path.join(work_dir, f"checkpoint-cost-{params}")
    manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=1)
    saves, restores = [], []
    for i in range(repeats):
      start = time.perf_counter()
      path = manager.save(checkpoint_number=i)
      saves.append(time.perf_counter() - start)
      start = time.perf_counter()
      checkpoint.restore(path).assert_consumed()
      restores.append(time.perf_counter() - start)
    size_bytes = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
    rows.append({"parameters": params, "variables_bytes": 2 * params * 4,
                 "checkpoint_bytes": size_bytes,
                 "save_seconds": round(statistics.median(saves), 3),
                 "restore_seconds": round(statistics.median(restores), 3)})
    shutil.rmtree(directory, ignore_errors=True)
    del table, accumulator, checkpoint, manager
  return rows
