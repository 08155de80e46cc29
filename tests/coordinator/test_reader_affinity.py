"""Train closures swap chunks so that each runs where its worker's reader stands
(tfps.coordinator.reader_affinity), over TensorFlow's own closure queue."""

import weakref

import pytest
from tensorflow.python.distribute.coordinator import cluster_coordinator as cc

from tfps.base import tf_internals
from tfps.coordinator import reader_affinity

_FULL = 50


class _Output:
  """A `schedule` output (only its identity matters here)."""


class _Closure:
  """A queued closure as TensorFlow's: its function, arguments and output."""

  tag = None

  def __init__(self, function, shard, start, output, count=None):
    self._concrete_function = function
    self._args = (True, shard, start) if count is None else (True, count, shard, start)
    self._output_remote_value_ref = weakref.ref(output)

  def mark_cancelled(self):
    raise AssertionError("not cancelled")


class _Worker:
  def __init__(self, index):
    self.worker_index = index
    self.device_name = f"/job:worker/replica:0/task:{index}/device:CPU:0"


@pytest.fixture(name="queue_attempts")
def _queue_attempts():
  """TensorFlow's closure queue and `tf_internals.ClosureAttempts` over it, its workers'
  threads played by the test."""
  queue = cc._CoordinatedClosureQueue()  # pylint: disable=protected-access
  coordinator = type("Coordinator", (), {})()
  coordinator._cluster = type("Cluster", (), {"closure_queue": queue, "workers": []})()  # pylint: disable=protected-access
  tf_internals.put_back_failed_closures_first(coordinator)  # As the runtime's coordinators.
  attempts = tf_internals.ClosureAttempts(coordinator, clock=lambda: 0.0)
  yield queue, attempts
  attempts.close()


def _run(attempts, queue, worker, succeeded=True):
  """Worker `worker`'s thread takes the next closure and runs it (TF's `_process_closure`
  played here): returns the (shard, start) it ran."""
  closure = queue.get(timeout=10)
  for listener in attempts.on_start:
    listener(worker, closure, closure not in attempts._ran)  # pylint: disable=protected-access
  attempts._ran.add(closure)  # pylint: disable=protected-access
  ran = tf_internals.closure_arguments(closure)[-2:]
  attempt = tf_internals.ClosureAttempt(closure, worker, worker, 0.0)
  if succeeded:
    queue.mark_finished()
    for listener in attempts.on_done:
      listener(attempt, 0.1)
  return ran


def test_a_worker_takes_the_closure_whose_chunk_its_reader_stands_at(queue_attempts):
  queue, attempts = queue_attempts
  # Shards of 100 batches: a chunk of 50 from batch 0 leaves its reader at batch 50.
  affinity = reader_affinity.ReaderAffinity(attempts, lengths=[100] * 4,
                                            full_size=lambda: _FULL, lanes=lambda: 2)
  full, other = object(), object()
  outputs = [_Output() for _ in range(8)]
  scheduled = [_Closure(full, 0, 0, outputs[0]), _Closure(full, 1, 0, outputs[1])]
  for closure, output in zip(scheduled, outputs):
    affinity.ours(output)
    queue.put(closure)
  assert _run(attempts, queue, 0) == (0, 0) and _run(attempts, queue, 1) == (1, 0)
  # The next loop: lane 0's chunk first; but worker 1 is free first.
  scheduled = [_Closure(full, 0, 50, outputs[2]), _Closure(full, 1, 50, outputs[3]),
               _Closure(other, 1, 50, outputs[4], count=20)]
  for closure, output in zip(scheduled, outputs[2:]):
    affinity.ours(output)
  for closure in scheduled:
    queue.put(closure)
  assert _run(attempts, queue, 1) == (1, 50)  # Swapped with the one its reader stands at.
  assert tf_internals.closure_arguments(scheduled[1])[-2:] == (0, 50)  # Left for worker 0.
  assert _run(attempts, queue, 0) == (0, 50)
  # Of another function (or count): never swapped, whoever's chunk it is.
  assert _run(attempts, queue, 0) == (1, 50)
  assert affinity.swapped == 1
  assert (affinity.closures, affinity.resumed) == (5, 2)


def test_a_closure_run_before_keeps_its_chunk_and_a_failed_run_leaves_no_position(
    queue_attempts):
  queue, attempts = queue_attempts
  affinity = reader_affinity.ReaderAffinity(attempts, lengths=[100] * 4,
                                            full_size=lambda: _FULL, lanes=lambda: 2)
  full = object()
  outputs = [_Output() for _ in range(4)]
  for output in outputs:
    affinity.ours(output)
  queue.put(_Closure(full, 0, 0, outputs[0]))
  _run(attempts, queue, 0)  # Worker 0 stands at (0, 50).
  failing = _Closure(full, 2, 0, outputs[1])
  queue.put(failing)
  queue.put(_Closure(full, 0, 50, outputs[2]))
  # Worker 0 took (2, 0) and swapped: it runs (0, 50), and fails part way.
  assert _run(attempts, queue, 0, succeeded=False) == (0, 50)
  queue.put_back(failing)  # TF's worker thread puts a failed run back.
  # Its retry keeps its chunk, wherever it runs; worker 0's reader stands nowhere now.
  assert _run(attempts, queue, 0) == (0, 50)
  assert affinity.resumed == 0
  assert _run(attempts, queue, 1) == (2, 0)
