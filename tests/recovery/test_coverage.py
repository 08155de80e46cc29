"""The coverage accounting (tfps.recovery.coverage): the progress log replayed, every
batch trained once per epoch; pure, no TensorFlow."""

from tfps.input import ledger as ledger_lib
from tfps.recovery import coverage
from tfps.recovery import progress_log as progress_lib

from tests.support import fakes


def _loop(ledger, log, steps, max_chunk=3, reexecuted=0):
  chunks = fakes.take_steps(ledger, steps, max_chunk)
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
