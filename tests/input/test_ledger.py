"""The input ledger (tfps.input.ledger): pure, no TensorFlow."""

import pytest

from tfps.base import errors
from tfps.input import ledger as ledger_lib

from tests.support import fakes

Chunk = ledger_lib.Chunk


def _hand_out_all(ledger, max_count):
  seen = {}
  while ledger.epoch == 0 and not all(p >= n for p, n in zip(ledger.positions, ledger.lengths)):
    chunk = ledger.take(max_count)
    for batch in range(chunk.start, chunk.start + chunk.count):
      seen[(chunk.shard, batch)] = seen.get((chunk.shard, batch), 0) + 1
  return seen


@pytest.mark.parametrize("lengths,max_count", [
    ((5, 5, 5), 5), ((7, 3, 0, 4), 2), ((1,), 10), ((50, 49, 50), 50), ((3, 8), 3)])
def test_an_epoch_hands_out_every_batch_once(lengths, max_count):
  ledger = ledger_lib.InputLedger(lengths)
  seen = _hand_out_all(ledger, max_count)
  assert seen == {(s, b): 1 for s, n in enumerate(lengths) for b in range(n)}
  assert ledger.taken == sum(lengths) and ledger.epochs_completed == 1


def test_a_lane_reads_its_shard_to_the_end_and_lanes_take_turns():
  ledger = ledger_lib.InputLedger((4, 4, 4))
  chunks = [ledger.take(3, lanes=2) for _ in range(6)]
  # Lane 0 reads shard 0, lane 1 shard 1; then lane 0 starts shard 2, and lane 1, with no
  # shard left to start, reads on in the one lane 0 holds.
  assert chunks == [Chunk(0, 0, 3, 0), Chunk(1, 0, 3, 0), Chunk(0, 3, 1, 0),
                    Chunk(1, 3, 1, 0), Chunk(2, 0, 3, 0), Chunk(2, 3, 1, 0)]
  assert ledger.take(2, lanes=2) == Chunk(0, 0, 2, 1)  # The next epoch starts every shard again.


def test_one_lane_reads_shard_after_shard():
  ledger = ledger_lib.InputLedger((3, 0, 2))
  assert [ledger.take(2) for _ in range(4)] == [
      Chunk(0, 0, 2, 0), Chunk(0, 2, 1, 0), Chunk(2, 0, 2, 0), Chunk(0, 0, 2, 1)]


def test_lanes_follow_the_workers_and_a_shard_let_go_waits_for_the_epoch_end():
  ledger = ledger_lib.InputLedger((6, 6, 6, 6))
  assert [ledger.take(2, lanes=3) for _ in range(3)] == [
      Chunk(0, 0, 2, 0), Chunk(1, 0, 2, 0), Chunk(2, 0, 2, 0)]
  # A worker left: the third lane's shard is let go; the lanes read the shards not
  # started first, and the rest of shard 2 at the end of the epoch.
  assert [ledger.take(2, lanes=2) for _ in range(9)] == [
      Chunk(0, 2, 2, 0), Chunk(1, 2, 2, 0), Chunk(0, 4, 2, 0), Chunk(1, 4, 2, 0),
      Chunk(3, 0, 2, 0), Chunk(2, 2, 2, 0), Chunk(3, 2, 2, 0), Chunk(2, 4, 2, 0),
      Chunk(3, 4, 2, 0)]


def test_a_loops_tail_takes_a_fresh_shards_head_and_keeps_the_lanes_aligned():
  ledger = ledger_lib.InputLedger((8, 8, 8, 8))
  # A loop of 10 steps in chunks of 4: 4 + 4 + a tail of 2, which would cut lane 0's shard.
  assert [ledger.take(4, lanes=2), ledger.take(4, lanes=2), ledger.take(2, lanes=2, tail=True)
          ] == [Chunk(0, 0, 4, 0), Chunk(1, 0, 4, 0), Chunk(2, 0, 2, 0)]
  # The lanes read on, whole chunks to their shards' ends; shard 2's rest comes last.
  assert [ledger.take(4, lanes=2) for _ in range(7)] == [
      Chunk(1, 4, 4, 0), Chunk(0, 4, 4, 0), Chunk(3, 0, 4, 0), Chunk(2, 2, 4, 0),
      Chunk(3, 4, 4, 0), Chunk(2, 6, 2, 0), Chunk(0, 0, 4, 1)]
  # A tail that ends its lane's shard reads on in it.
  ledger = ledger_lib.InputLedger((3, 4))
  ledger.take(2)
  assert ledger.take(1, tail=True) == Chunk(0, 2, 1, 0)
  # A tail after a lane's shard ended does not give the lane the shard it starts, nor
  # take the one the lane's reader reads on into (1).
  ledger = ledger_lib.InputLedger((4, 4, 4))
  assert [ledger.take(4), ledger.take(2, tail=True), ledger.take(4), ledger.take(4)] == [
      Chunk(0, 0, 4, 0), Chunk(2, 0, 2, 0), Chunk(1, 0, 4, 0), Chunk(2, 2, 2, 0)]


def test_a_lane_takes_the_shard_its_reader_reads_on_into():
  ledger = ledger_lib.InputLedger((4, 2, 2, 2, 2))
  # Lane 1 ends shard 1 first: it takes shard 3 (where a reader built for shard 1 of a
  # lane of 2 reads on), not the lowest not started (2), which lane 0 then reads on into.
  assert [ledger.take(2, lanes=2) for _ in range(5)] == [
      Chunk(0, 0, 2, 0), Chunk(1, 0, 2, 0), Chunk(0, 2, 2, 0), Chunk(3, 0, 2, 0),
      Chunk(2, 0, 2, 0)]
  # A loop's tail takes a fresh head that no lane reads on into next (4, not 2 or 3).
  ledger = ledger_lib.InputLedger((8, 8, 8, 8, 8))
  assert [ledger.take(4, lanes=2), ledger.take(4, lanes=2), ledger.take(2, lanes=2, tail=True)
          ] == [Chunk(0, 0, 4, 0), Chunk(1, 0, 4, 0), Chunk(4, 0, 2, 0)]


@pytest.mark.parametrize("lanes", [1, 2, 3, 5])
def test_every_batch_once_in_any_number_of_lanes(lanes):
  ledger = ledger_lib.InputLedger((7, 3, 0, 4, 9))
  seen = {}
  while ledger.taken < ledger.batches_per_epoch:
    chunk = ledger.take(2 if ledger.taken % 5 else 1, lanes=lanes, tail=ledger.taken % 5 == 0)
    for batch in range(chunk.start, chunk.start + chunk.count):
      seen[(chunk.shard, batch)] = seen.get((chunk.shard, batch), 0) + 1
  assert seen == {(s, b): 1 for s, n in enumerate(ledger.lengths) for b in range(n)}


def test_a_loop_takes_exactly_its_steps_across_shard_ends():
  ledger = ledger_lib.InputLedger((5, 5))
  chunks = fakes.take_steps(ledger, 8, max_chunk=4)
  assert chunks == [Chunk(0, 0, 4, 0), Chunk(0, 4, 1, 0), Chunk(1, 0, 3, 0)]
  assert fakes.take_steps(ledger, 3, max_chunk=4) == [Chunk(1, 3, 2, 0), Chunk(0, 0, 1, 1)]


def test_state_round_trips_and_resumes_where_it_was():
  ledger = ledger_lib.InputLedger((6, 2, 9))
  fakes.take_steps(ledger, 10, max_chunk=4)
  ledger.reexecuted = 3
  copy = ledger_lib.InputLedger((1,))
  copy.load_json(ledger.to_json())
  assert [copy.take(4) for _ in range(3)] == [ledger.take(4) for _ in range(3)]
  assert copy.reexecuted == 3 and copy.taken == ledger.taken


@pytest.mark.parametrize("text", ["", "{}", '{"version": 1, "lengths": [2], "epoch": 0, '
                                  '"positions": [5], "taken": 0, "reexecuted": 0}'])
def test_unreadable_state_is_a_bad_checkpoint(text):
  with pytest.raises(errors.BadCheckpointError, match="input ledger state"):
    ledger_lib.InputLedger.from_json(text)


@pytest.mark.parametrize("lengths", [(), (0, 0), (-1, 3), (2.5,)])
def test_bad_lengths_are_refused(lengths):
  with pytest.raises(errors.UsageError):
    ledger_lib.InputLedger(lengths)


@pytest.mark.parametrize("max_count,lanes", [(0, 1), (1, 0)])
def test_a_count_or_lanes_below_one_is_refused(max_count, lanes):
  with pytest.raises(ValueError, match="must be positive"):
    ledger_lib.InputLedger((3,)).take(max_count, lanes=lanes)
