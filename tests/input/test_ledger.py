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


def test_chunks_stay_in_one_shard_and_shards_advance_together():
  ledger = ledger_lib.InputLedger((4, 4, 4))
  chunks = [ledger.take(3) for _ in range(6)]
  assert chunks == [Chunk(0, 0, 3, 0), Chunk(1, 0, 3, 0), Chunk(2, 0, 3, 0),
                    Chunk(0, 3, 1, 0), Chunk(1, 3, 1, 0), Chunk(2, 3, 1, 0)]
  assert ledger.take(2) == Chunk(0, 0, 2, 1)  # The next epoch starts every shard again.


def test_a_loop_takes_exactly_its_steps_across_shard_ends():
  ledger = ledger_lib.InputLedger((5, 5))
  chunks = fakes.take_steps(ledger, 8, max_chunk=4)
  assert chunks == [Chunk(0, 0, 4, 0), Chunk(1, 0, 4, 0)]
  assert fakes.take_steps(ledger, 3, max_chunk=4) == [Chunk(0, 4, 1, 0), Chunk(1, 4, 1, 0),
                                                 Chunk(0, 0, 1, 1)]


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
