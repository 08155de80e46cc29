"""Stand-ins the tests share: a clock, the workers and coordinator of TF's ClusterCoordinator,
a trainer taking its input, a run's progress records.

No TensorFlow here (a pure test may use them); what needs it imports it when used.
"""


class FakeClock:
  """Time that moves only when a test moves it (`clock.now += 5`); called, says the time."""

  def __init__(self, now: float = 0.0):
    self.now = now

  def __call__(self) -> float:
    return self.now


class FakeWorker:
  """A ClusterCoordinator worker: runs a resource at once, or queues it (down)."""

  def __init__(self, index: int, *, up: bool = True):
    self.worker_index, self.device_name = index, f"/job:worker/replica:0/task:{index}"
    self.up, self.created = up, []

  def create_resource(self, fn):
    self.created.append(fn)
    if self.up:
      fn()
    return object()


class FakeCoordinator:
  """A ClusterCoordinator over FakeWorkers (or `workers` of them) that runs what is
  scheduled at once, and names in `ran` each tf.function it ran."""

  def __init__(self, workers=2):
    if isinstance(workers, int):
      workers = [FakeWorker(i) for i in range(workers)]
    self._cluster = type("Cluster", (), {"workers": list(workers)})()
    self.ran = []

  def schedule(self, fn, args=()):
    python_function = getattr(fn, "python_function", None)  # None: a ConcreteFunction.
    if python_function is not None:
      from tfps.fast_restart import worker_functions  # pylint: disable=import-outside-toplevel
      self.ran.append(worker_functions.kind(python_function.__name__))  # Less tag and count.
    return fn(*args)


def shard_iterator(shard, start):
  """The closure tests' positioned input: shard `shard` of 2 of range(100), from `start` on."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  return iter(tf.data.Dataset.range(100).shard(2, shard).skip(start))


def take_steps(ledger, num_steps, max_chunk):
  """As the trainer takes a loop's chunks from an InputLedger: at most `max_chunk` each,
  `num_steps` in all."""
  chunks, left = [], num_steps
  while left > 0:
    chunks.append(ledger.take(min(max_chunk, left)))
    left -= chunks[-1].count
  return chunks


def steady_progress(start_time, start_step, loops, seconds_per_loop=1.0, steps_per_loop=100):
  """The progress records of `loops` loops at a steady speed, from `start_step` at `start_time`."""
  from tfps.recovery import progress_log  # pylint: disable=import-outside-toplevel
  return [progress_log.Progress(step=start_step + steps_per_loop * (i + 1),
                                time=start_time + seconds_per_loop * (i + 1))
          for i in range(loops)]
