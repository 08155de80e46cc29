"""Which queued closure a worker runs (tfps.input.affinity): pure decisions, no TensorFlow."""

import random

from tfps.input import affinity
from tfps.input import ledger as ledger_lib

At = affinity.At


def _read(positions, worker, chunk, count, stride):
  resumed = positions.started(worker, chunk, count, stride)
  positions.succeeded(worker)
  return resumed


def test_a_reader_stands_after_its_chunk_and_at_its_lanes_next_shard_after_a_shards_end():
  positions = affinity.ReaderPositions([10, 10, 0, 10, 0, 10])
  assert not _read(positions, 0, At(1, 0), 4, stride=2)
  assert positions.stands_at(0) == At(1, 4)
  assert _read(positions, 0, At(1, 4), 6, stride=2)
  assert positions.stands_at(0) == At(3, 0)  # 1 -> 3: its lane of 2.
  assert _read(positions, 0, At(3, 0), 10, stride=2)
  assert positions.stands_at(0) == At(5, 0)  # 3 -> 5: shard 5 is next of that lane.
  _read(positions, 0, At(5, 0), 10, stride=2)
  assert positions.stands_at(0) is None  # The lane's last shard: nothing after it.


def test_a_resumed_reader_keeps_the_stride_it_was_built_with():
  positions = affinity.ReaderPositions([5] * 6)
  _read(positions, 1, At(0, 0), 3, stride=3)
  assert _read(positions, 1, At(0, 3), 2, stride=1)  # A graph of one lane read on.
  assert positions.stands_at(1) == At(3, 0)
  assert not _read(positions, 1, At(2, 0), 5, stride=1)  # Built by that graph: stride 1.
  assert positions.stands_at(1) == At(3, 0)


def test_a_running_closure_clears_its_workers_position_and_shows_where_it_will_stand():
  positions = affinity.ReaderPositions([5, 5])
  _read(positions, 0, At(0, 0), 2, stride=1)
  positions.started(0, At(0, 2), 3, stride=1)
  assert positions.stands_at(0) is None  # A failed run leaves none, as the worker's table.
  assert positions.others(1) == {At(1, 0)} and positions.others(0) == set()
  positions.succeeded(0)
  assert positions.stands_at(0) == At(1, 0)


def test_a_worker_takes_the_queued_chunk_its_reader_stands_at():
  assert affinity.pick(At(3, 50), At(4, 0), [At(5, 0), None, At(3, 50), At(3, 50)]) == 2
  assert affinity.pick(At(3, 50), At(3, 50), [At(3, 50)]) is None  # Already its own.
  assert affinity.pick(None, At(4, 0), [At(4, 0)]) is None  # Nothing to resume.
  assert affinity.pick(At(3, 50), At(4, 0), [At(5, 0), None]) is None  # Not queued.


def test_a_worker_leaves_another_workers_next_chunk_to_it():
  others = {At(4, 0), At(7, 0)}
  # Its own is not queued; the one it took is another's: it builds one that is nobody's.
  assert affinity.pick(At(3, 50), At(4, 0), [At(7, 0), None, At(6, 0)], others) == 2
  assert affinity.pick(None, At(4, 0), [At(7, 0), At(6, 0)], others) == 1
  assert affinity.pick(None, At(4, 0), [At(7, 0)], others) is None  # Nobody's is queued.
  assert affinity.pick(None, At(5, 0), [At(6, 0)], others) is None  # Took nobody's.


def _simulate(lanes: int, lengths: list[int], count: int, per_loop: int, seed: int,
              swap: bool):
  """Workers of random speeds take closures from one queue as they become free
  (TensorFlow's worker threads), a loop's chunks queued at a time and joined; returns
  (closures that resumed their worker's reader, closures, the batches read per shard)."""
  rng = random.Random(seed)
  ledger = ledger_lib.InputLedger(lengths)
  positions = affinity.ReaderPositions(lengths)
  reads = [[] for _ in lengths]
  resumed = closures = 0
  now = 0.0
  target = 3 * ledger.batches_per_epoch  # Three epochs.
  while ledger.taken < target:
    queue = []
    while len(queue) < per_loop and ledger.taken < target:
      queue.append(ledger.take(min(count, target - ledger.taken), lanes=lanes))
    ends = {}  # Worker -> when its running closure ends.
    free = {w: now for w in range(lanes)}
    while queue:
      worker, now = min(free.items(), key=lambda item: item[1])
      del free[worker]
      if worker in ends:
        positions.succeeded(worker)
      chunk = queue.pop(0)
      if swap:
        index = affinity.pick(positions.stands_at(worker), At(chunk.shard, chunk.start),
                              [At(c.shard, c.start) for c in queue], positions.others(worker))
        if index is not None:
          chunk, queue[index] = queue[index], chunk
      resumed += positions.started(worker, At(chunk.shard, chunk.start), chunk.count, lanes)
      closures += 1
      reads[chunk.shard].extend(range(chunk.start, chunk.start + chunk.count))
      ends[worker] = free[worker] = now + chunk.count * rng.uniform(0.8, 1.25)
    for worker in ends:  # join()
      positions.succeeded(worker)
    now = max(free.values())
  return resumed, closures, reads


def test_swapping_makes_most_closures_resume_and_every_batch_is_still_read_once_an_epoch():
  lengths = [49, 50, 50, 49, 0, 50] * 7
  for lanes, per_loop in [(2, 4), (2, 5), (3, 6), (3, 9), (4, 8), (3, 4)]:
    plain, closures, _ = _simulate(lanes, lengths, 50, per_loop, seed=lanes, swap=False)
    swapped, closures_swapped, reads = _simulate(lanes, lengths, 50, per_loop, seed=lanes,
                                                 swap=True)
    assert closures == closures_swapped
    print(lanes, per_loop, plain, swapped, closures)
    assert swapped > plain, (lanes, plain, swapped, closures)
    for shard, batches in enumerate(reads):
      # Three epochs: every batch of every shard three times.
      assert sorted(batches) == sorted(list(range(lengths[shard])) * 3), shard
