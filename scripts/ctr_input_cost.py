"""What the built-in ctr's file input costs: writing the files, and reading them per closure.

    python scripts/ctr_input_cost.py [--data_dir=DIR] [--steps_per_closure=50]

Writes the default training files (2**20 examples) into a new directory under
DIR (default: a temp dir, removed at the end) and times it, then reads them
as a closure does (`PositionedInput.chunk` inside a `tf.function`, in this
process: no cluster): the time to build a chunk and read its first batch,
for a chunk that starts its shard and for ones that start inside it (a
`skip` of whole batches), and the rate of reading a whole shard. Then the
coordinator's own cost per closure with positioned input: the ledger's `take`
and the two scalar `tf.constant`s that carry the chunk (`PSTrainer`), for the
ledger of these files and for one of the most shards made by default (256).
Prints one JSON line. Run it on an otherwise idle machine.
"""

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import timeit

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

from tfps.examples.ctr import experiment as ctr
from tfps.input import ledger as ledger_lib
from tfps.input import positioned

flags.DEFINE_string("data_dir", "", "Where to write the files (default: a temp dir, removed).")
flags.DEFINE_integer("steps_per_closure", 50, "Batches per shard (the runtime's default).")
flags.DEFINE_integer("batch_size", 512, "Examples per batch.")
flags.DEFINE_integer("repeats", 5, "Timed calls per measurement (the median is printed).")
FLAGS = flags.FLAGS


def _median_seconds(fn, repeats: int) -> float:
  fn()  # Traced (and the files in the page cache) before timing.
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _ledger_micros(num_shards: int, steps_per_closure: int) -> dict:
  """µs per closure on the coordinator: `take` alone, and with the chunk's two constants."""
  ledger = ledger_lib.InputLedger([steps_per_closure] * num_shards)

  def closure():
    chunk = ledger.take(steps_per_closure)
    return tf.constant(chunk.shard, tf.int64), tf.constant(chunk.start, tf.int64)

  closure()
  calls = 20000
  take = min(timeit.repeat(lambda: ledger.take(steps_per_closure), number=calls, repeat=5))
  both = min(timeit.repeat(closure, number=calls, repeat=5))
  return {"take_us": round(1e6 * take / calls, 1),
          "take_and_constants_us": round(1e6 * both / calls, 1)}


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  root = FLAGS.data_dir or tempfile.mkdtemp(prefix="ctr-input-cost-")
  data_dir = os.path.join(root, f"run-{os.getpid()}")  # Always written, never reused.
  try:
    config = ctr.CtrConfig()
    start = time.perf_counter()
    files = ctr.train_files(config, 0, data_dir)
    generate = time.perf_counter() - start
    megabytes = sum(os.path.getsize(p) for p in files.paths) / 1e6

    source = positioned.PositionedInput(files.dataset_fn(FLAGS.batch_size),
                                        num_replicas_in_sync=1, what="ctr")
    ledger = source.measure(num_shards=None, steps_per_closure=FLAGS.steps_per_closure)
    shards = ledger.num_shards

    @tf.function
    def first_batch(shard, start):
      example = next(iter(source.chunk(shards, shard, start)))
      return tf.reduce_sum(example["label"]) + tf.reduce_sum(example["cat"][:, 0])

    @tf.function
    def whole_chunk(shard, start):
      return source.chunk(shards, shard, start).reduce(
          tf.constant(0, tf.int64), lambda n, batch: n + tf.shape(batch["label"], tf.int64)[0])

    shard = tf.constant(shards // 2, tf.int64)  # A shard that starts inside a file.
    length = ledger.lengths[shards // 2]
    first = {}
    for start in sorted({0, 1, length // 2, length - 1}):
      first[start] = _median_seconds(
          lambda: first_batch(shard, tf.constant(start, tf.int64)), FLAGS.repeats)
    read = _median_seconds(lambda: whole_chunk(shard, tf.constant(0, tf.int64)), FLAGS.repeats)
    skips = sorted(first)
    per_skipped = (first[skips[-1]] - first[0]) / skips[-1] if skips[-1] else 0.0
    print(json.dumps({
        "examples": config.train_examples, "files": len(files.paths),
        "megabytes": round(megabytes), "generate_seconds": round(generate, 2),
        "shards": shards, "batches_in_shard": length, "batch_size": FLAGS.batch_size,
        "first_batch_ms_by_start": {str(s): round(1e3 * t, 2) for s, t in first.items()},
        "ms_per_skipped_batch": round(1e3 * per_skipped, 3),
        "shard_read_ms": round(1e3 * read, 1),
        "examples_per_sec": round(length * FLAGS.batch_size / read),
        "ledger_per_closure": {
            str(n): _ledger_micros(n, FLAGS.steps_per_closure) for n in (shards, 256)},
        "cores": os.cpu_count(), "load_average": os.getloadavg()[0]}))
  finally:
    shutil.rmtree(data_dir if FLAGS.data_dir else root, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(app.run(main))
