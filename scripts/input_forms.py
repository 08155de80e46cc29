"""Positioned against endless input, for each input form users write.

    python scripts/input_forms.py [--examples=20000000] [--forms=a,b] [--data_dir=DIR]

For each form (a `dataset_fn(input_context)` as TensorFlow's guides write
it, one epoch), in this process (no cluster), with a trivial step (the sum
of a batch) so that reading is all there is:

* endless: the form with `repeat()`, read as tfps reads endless input (one
  iterator per worker, part 0 of `--workers`), in closures of
  `--steps_per_closure` steps;
* positioned: chunks as the runtime reads them: handed out by the input's
  ledger (the shards tfps makes by default: about a closure each, or one
  per worker for a form whose shards each read all the data) in `--workers`
  lanes, each closure a `tf.function` that reads its chunk through its worker's resuming
  reader (`PositionedInput.read`: it reads on where the last chunk ended,
  else builds the chunk's iterator); the workers take turns, as equally fast
  workers do. Timed from the start of the epoch on, so the shards' first
  chunks (built) count too;
* plain skip: chunks as `dataset_fn(ctx).skip(start)` in a new iterator per
  closure (what the runtime did before positioning learned to seek), every
  chunk of `--sampled_shards` shards taken from the middle, at most
  `--chunks_per_shard` of them spread over the shard; unless `--noplain_skip`.

Endless then positioned take `--rounds` turns of about `--endless_seconds`
each (a positioned turn runs on to a shard's end), and the medians are
printed. Prints a markdown
table (steps/s and positioned ÷ endless) and one JSON line.
The file forms write their files first (`--records`, under a temp dir, removed).
"""

import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

from absl import app
from absl import flags
import tensorflow as tf

from tfps.input import positioned

flags.DEFINE_integer("examples", 20_000_000, "Ids in the range forms.")
flags.DEFINE_integer("slices", 2_000_000, "Ids in the from_tensor_slices form (a tensor).")
# A map of one id costs ~0.1 ms here (tf.data runs it on its inter-op pool), so the map
# forms' plain skips, which map every id of every shard, get fewer ids.
flags.DEFINE_integer("map_examples", 400_000, "Ids in the form with a map before the shard.")
flags.DEFINE_integer("records", 1_000_000, "Records in the file forms.")
flags.DEFINE_integer("files", 16, "TFRecord files.")
flags.DEFINE_integer("batch_size", 200, "Examples per batch.")
flags.DEFINE_integer("steps_per_closure", 50, "Steps per closure (the runtime's default).")
flags.DEFINE_integer("workers", 2, "Workers the endless input is split over.")
flags.DEFINE_integer("sampled_shards", 1, "Shards whose chunks are timed.")
flags.DEFINE_integer("chunks_per_shard", 8, "Most chunks timed per sampled shard.")
flags.DEFINE_float("endless_seconds", 1.0, "About how long each turn reads.")
flags.DEFINE_integer("rounds", 3, "Turns of endless then positioned (medians are printed).")
flags.DEFINE_bool("plain_skip", True, "Also time chunks as dataset_fn(ctx).skip(start).")
flags.DEFINE_list("forms", [], "Forms to measure (default: all).")
flags.DEFINE_string("data_dir", "", "Where to write the files (default: a temp dir, removed).")
FLAGS = flags.FLAGS


def _id_of_record(record):
  return tf.strings.to_number(record, tf.int64)


def _id_of_line(line):
  return tf.io.decode_csv(line, [tf.constant(0, tf.int64), tf.constant(0, tf.int64)])[0]


def _forms(data_dir: str) -> dict:
  """name -> dataset_fn(ctx): one epoch of batches of int64 ids."""
  n, b = FLAGS.examples, FLAGS.batch_size
  ids = tf.range(FLAGS.slices, dtype=tf.int64)
  pattern = os.path.join(data_dir, "records-*.tfrecord")
  text = os.path.join(data_dir, "ids.csv")

  def shard(dataset, ctx):
    return dataset.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)

  def record_files():
    return tf.data.Dataset.list_files(pattern, shuffle=False)

  return {
      "range.shard.batch": lambda ctx: shard(tf.data.Dataset.range(n), ctx).batch(b),
      "range.map.shard.batch.map": lambda ctx: shard(
          tf.data.Dataset.range(FLAGS.map_examples).map(lambda x: x * 2), ctx).batch(b).map(lambda x: x + 1),
      "range.batch.shard": lambda ctx: shard(tf.data.Dataset.range(n).batch(b), ctx),
      "slices.shard.batch": lambda ctx: shard(
          tf.data.Dataset.from_tensor_slices(ids), ctx).batch(b),
      "files.shard.interleave(tfrecord).batch.map": lambda ctx: shard(record_files(), ctx)
          .interleave(tf.data.TFRecordDataset, cycle_length=2).batch(b).map(_id_of_record),
      "tfrecord(files).shard.batch.map": lambda ctx: shard(
          tf.data.TFRecordDataset(tf.io.gfile.glob(pattern)), ctx).batch(b).map(_id_of_record),
      "text.shard.batch.map(csv)": lambda ctx: shard(
          tf.data.TextLineDataset(text), ctx).batch(b).map(_id_of_line),
  }


def _write_files(data_dir: str) -> None:
  per_file = math.ceil(FLAGS.records / FLAGS.files)
  for f in range(FLAGS.files):
    ids = tf.range(f * per_file, min(FLAGS.records, (f + 1) * per_file), dtype=tf.int64)
    records = tf.data.Dataset.from_tensor_slices(ids).map(tf.strings.as_string)
    tf.data.experimental.TFRecordWriter(
        os.path.join(data_dir, f"records-{f:03d}.tfrecord")).write(records)
  lines = tf.data.Dataset.range(FLAGS.records).map(
      lambda x: tf.strings.format("{},{}", (x, 2 * x)))
  with open(os.path.join(data_dir, "ids.csv"), "w") as out:
    for line in lines.batch(100_000):
      out.write("\n".join(s.decode() for s in line.numpy()) + "\n")


def _context(num: int, index) -> tf.distribute.InputContext:
  return tf.distribute.InputContext(num_input_pipelines=num, input_pipeline_id=index)


def _length(dataset: tf.data.Dataset) -> int:
  cardinality = int(dataset.cardinality())
  if cardinality >= 0:
    return cardinality
  return int(dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def _endless_runner(dataset_fn):
  """A callable timing the endless form (its iterator and trace made once): steps/s."""
  steps = FLAGS.steps_per_closure
  iterator = iter(dataset_fn(_context(FLAGS.workers, 0)).repeat())

  @tf.function
  def closure(iterator):
    total = tf.constant(0, tf.int64)
    for _ in tf.range(steps):
      total += tf.reduce_sum(next(iterator))
    return total

  closure(iterator)  # Traced, and the files in the page cache.

  def steps_per_second() -> float:
    closures, start = 0, time.perf_counter()
    while time.perf_counter() - start < FLAGS.endless_seconds or closures < 3:
      closure(iterator).numpy()
      closures += 1
    return closures * steps / (time.perf_counter() - start)
  return steps_per_second


def _chunk_runner(make_chunk, chunks):
  """A callable timing `make_chunk(shard, start)` read from a new iterator per closure, for
  `chunks` (shard, start, count): steps/s."""

  @tf.function
  def closure(shard, start, count):
    iterator = iter(make_chunk(shard, start))
    total = tf.constant(0, tf.int64)
    for _ in tf.range(count):
      total += tf.reduce_sum(next(iterator))
    return total

  def run(shard, start, count):
    return closure(tf.constant(shard, tf.int64), tf.constant(start, tf.int64),
                   tf.constant(count, tf.int32)).numpy()

  run(*chunks[0])  # Traced.

  def steps_per_second() -> float:
    start = time.perf_counter()
    for chunk in chunks:
      run(*chunk)
    return sum(count for _, _, count in chunks) / (time.perf_counter() - start)
  return steps_per_second


def _positioned_runner(dataset_fn, name: str, num_shards: int):
  """A callable timing positioned closures as the runtime runs them: chunks from the
  input's ledger, handed out in `--workers` lanes, each worker's closure reading through
  its own resuming reader (`PositionedInput.read`); the workers take turns, as equally
  fast workers do. Each call reads on from where the last stopped: steps/s."""
  workers = [positioned.PositionedInput(dataset_fn, num_replicas_in_sync=1, what=name)
             for _ in range(FLAGS.workers)]
  ledger = workers[0].measure(num_shards=num_shards, steps_per_closure=FLAGS.steps_per_closure)

  def closure_of(source):
    @tf.function
    def closure(shard, start, count):
      reading = source.read(ledger.lengths, shard, start, lanes=FLAGS.workers)
      total = tf.constant(0, tf.int64)
      for _ in tf.range(count):
        total += tf.reduce_sum(next(reading.iterator))
      with tf.control_dependencies(reading.close(count, [total])):
        return tf.identity(total)
    return closure

  closures = [closure_of(source) for source in workers]
  taken = [0]

  def run_next() -> tuple[int, bool]:
    """Runs the next chunk: (its steps, whether it ended its shard)."""
    chunk = ledger.take(FLAGS.steps_per_closure, lanes=len(closures))
    closure = closures[taken[0] % len(closures)]
    taken[0] += 1
    closure(tf.constant(chunk.shard, tf.int64), tf.constant(chunk.start, tf.int64),
            tf.constant(chunk.count, tf.int32)).numpy()
    return chunk.count, chunk.start + chunk.count == ledger.lengths[chunk.shard]

  for _ in range(2 * len(closures)):  # Traced, and each reader made.
    run_next()

  def steps_per_second() -> float:
    # Whole shards: a turn ends at a shard's end, so that it holds its share of builds.
    steps, closures_run, start, shard_ended = 0, 0, time.perf_counter(), False
    while (time.perf_counter() - start < FLAGS.endless_seconds or closures_run < 3
           or not shard_ended):
      count, shard_ended = run_next()
      steps += count
      closures_run += 1
    return steps / (time.perf_counter() - start)
  return steps_per_second


def _sampled_chunks(dataset_fn, num_shards: int) -> list[tuple[int, int, int]]:
  """Chunks of the first `--sampled_shards` non-empty shards from the middle on."""
  steps, chunks, sampled = FLAGS.steps_per_closure, [], 0
  middle = num_shards // 2
  for shard in [*range(middle, num_shards), *range(middle)]:
    length = _length(dataset_fn(_context(num_shards, shard)))
    if not length:
      continue
    starts = list(range(0, length, steps))
    every = max(1, math.ceil(len(starts) / FLAGS.chunks_per_shard))
    chunks += [(shard, s, min(steps, length - s)) for s in starts[::every]]
    sampled += 1
    if sampled == FLAGS.sampled_shards:
      break
  return chunks


def measure(name: str, dataset_fn) -> dict:
  source = positioned.PositionedInput(dataset_fn, num_replicas_in_sync=1, what=name)
  num_shards = source.measure(num_shards=None, steps_per_closure=FLAGS.steps_per_closure,
                              num_workers=FLAGS.workers).num_shards  # As the runtime's.
  chunks = _sampled_chunks(dataset_fn, num_shards)
  rounds = FLAGS.rounds
  # Endless turns first, then positioned ones, not taking turns: a positioned closure that
  # builds its chunk right after the endless reader's closure ran in this process took
  # ~1.8 s, as long as its first trace (2026-11-29: cause not found; a worker runs one
  # reader's closures one after another).
  endless = _endless_runner(dataset_fn)
  endless_turns = [endless() for _ in range(rounds)]
  positioned_ = _positioned_runner(dataset_fn, name, num_shards)
  turns = list(zip(endless_turns, [positioned_() for _ in range(rounds)]))
  row = {"form": name, "shards": num_shards, "chunks": len(chunks),
         "endless": statistics.median(e for e, _ in turns),
         "positioned": statistics.median(p for _, p in turns)}
  if FLAGS.plain_skip:  # Once: it reads the other shards, seconds a chunk.
    row["plain_skip"] = _chunk_runner(
        lambda s, start: dataset_fn(_context(num_shards, s)).skip(start), chunks)()
  row["warning"] = source.cost_warning or ""
  return row


def _table(rows: list[dict]) -> str:
  plain = FLAGS.plain_skip
  head = "| form | shards | endless steps/s | positioned steps/s | ratio |"
  rule = "|---|---:|---:|---:|---:|"
  if plain:
    head += " plain skip steps/s | ratio |"
    rule += "---:|---:|"
  lines = [head + " warned |", rule + "---|"]
  for r in rows:
    line = (f"| `{r['form']}` | {r['shards']} | {r['endless']:,.0f} | {r['positioned']:,.0f} "
            f"| {r['positioned'] / r['endless']:.2f} |")
    if plain:
      line += f" {r['plain_skip']:,.0f} | {r['plain_skip'] / r['endless']:.2f} |"
    lines.append(line + (" yes |" if r["warning"] else " |"))
  return "\n".join(lines)


def main(argv):
  del argv
  root = FLAGS.data_dir or tempfile.mkdtemp(prefix="input-forms-")
  data_dir = os.path.join(root, f"run-{os.getpid()}")
  os.makedirs(data_dir)
  try:
    forms = _forms(data_dir)
    chosen = FLAGS.forms or list(forms)
    if any("tfrecord" in f or "text" in f for f in chosen):
      _write_files(data_dir)
    rows = []
    for name in chosen:
      rows.append(measure(name, forms[name]))
      print(json.dumps({k: round(v, 1) if isinstance(v, float) else v
                        for k, v in rows[-1].items()}), file=sys.stderr, flush=True)
    print(_table(rows))
    print(json.dumps({"rows": rows, "examples": FLAGS.examples, "records": FLAGS.records,
                      "batch_size": FLAGS.batch_size, "cores": os.cpu_count(),
                      "load_average": os.getloadavg()[0]}))
  finally:
    shutil.rmtree(data_dir if FLAGS.data_dir else root, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(app.run(main))
