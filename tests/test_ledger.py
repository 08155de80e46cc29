"""The input ledger and the coverage accounting: pure, no TensorFlow."""

import pytest

from tfps.input import ledger as ledger_lib
from tfps.recovery import coverage
from tfps.base import errors
from tfps.recovery import progress_log as progress_lib

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


def _take_steps(ledger, num_steps, max_chunk):
  """As the trainer takes a loop's chunks: at most `max_chunk` each, `num_steps` in all."""
  chunks, left = [], num_steps
  while left > 0:
    chunks.append(ledger.take(min(max_chunk, left)))
    left -= chunks[-1].count
  return chunks


def test_a_loop_takes_exactly_its_steps_across_shard_ends():
  ledger = ledger_lib.InputLedger((5, 5))
  chunks = _take_steps(ledger, 8, max_chunk=4)
  assert chunks == [Chunk(0, 0, 4, 0), Chunk(1, 0, 4, 0)]
  assert _take_steps(ledger, 3, max_chunk=4) == [Chunk(0, 4, 1, 0), Chunk(1, 4, 1, 0),
                                                 Chunk(0, 0, 1, 1)]


def test_state_round_trips_and_resumes_where_it_was():
  ledger = ledger_lib.InputLedger((6, 2, 9))
  _take_steps(ledger, 10, max_chunk=4)
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


# Coverage: the progress log replayed --------------------------------------------

def _loop(ledger, log, steps, max_chunk=3, reexecuted=0):
  chunks = _take_steps(ledger, steps, max_chunk)
  log.append(progress_lib.Progress(step=ledger.taken, time=0.0,
                                   chunks=tuple(tuple(c.as_list()) for c in chunks),
                                   reexecuted=reexecuted))


def _restore(ledger_at_checkpoint, log):
  log.append(progress_lib.Progress(step=ledger_at_checkpoint.taken, time=0.0, restored=True,
                                   shard_lengths=ledger_at_checkpoint.lengths))
  copy = ledger_lib.InputLedger((1,))
  copy.load_json(ledger_at_checkpoint.to_json())
  return copy


def test_coverage_of_a_run_without_faults_is_exactly_once():
  ledger, log = ledger_lib.InputLedger((4, 4, 3)), []
  _restore(ledger, log)
  for _ in range(11):
    _loop(ledger, log, 2)
  result = coverage.account(log)
  assert result.ok and result.epochs_completed == 2
  assert (result.handed_out, result.kept, result.retrained_after_restore) == (22, 22, 0)
  assert result.never_trained == 0 and result.trained_twice == 0


def test_coverage_after_restores_counts_what_was_handed_out_again():
  ledger, log = ledger_lib.InputLedger((5, 5)), []
  ledger = _restore(ledger, log)
  _loop(ledger, log, 4)
  checkpoint = ledger_lib.InputLedger((1,))
  checkpoint.load_json(ledger.to_json())  # Saved at step 4.
  _loop(ledger, log, 3, reexecuted=2)  # Trained, then lost with its coordinator.
  ledger = _restore(checkpoint, log)
  for _ in range(4):
    _loop(ledger, log, 4)
  result = coverage.account(log)
  assert result.ok and result.epochs_completed == 2
  assert result.retrained_after_restore == 3 and result.reexecuted == 2
  assert result.handed_out == 4 + 3 + 16


def test_coverage_finds_a_batch_never_trained_and_one_trained_twice():
  log = [progress_lib.Progress(step=0, time=0.0, restored=True, shard_lengths=(2, 2)),
         # Shard 1's batch 1 is missing from epoch 0; shard 0's batch 0 comes twice.
         progress_lib.Progress(step=4, time=0.0, chunks=((0, 0, 2, 0), (1, 0, 1, 0),
                                                         (0, 0, 1, 0))),
         progress_lib.Progress(step=5, time=0.0, chunks=((0, 0, 1, 1),))]
  result = coverage.account(log)
  assert not result.ok and result.never_trained == 1 and result.trained_twice == 1


def test_coverage_of_endless_input_says_so():
  log = [progress_lib.Progress(step=0, time=0.0, restored=True),
         progress_lib.Progress(step=10, time=0.0)]
  assert coverage.account(log).as_dict() == {"positioned": False}
