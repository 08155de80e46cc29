"""A supervised chief training on a LocalCluster, as the fault tests watch it.

Shared by the fault tests of tests/e2e/ (the failure matrix, partitions, ps
failover): each starts one chief, injects a fault, and judges the recovery
from what the chief wrote (the progress log, one record per loop and a
`restored` one per coordinator start; the event log; its own log). Every
wait is bounded and names what it waited for.
"""

import os
from typing import Callable, Sequence

from tfps.cluster import local
from tfps.cluster import processes
from tfps.cluster import spec as spec_lib
from tfps.recovery import coverage
from tfps.recovery import events as events_lib
from tfps.recovery import progress_log as progress_lib

from tests.support import procs

# The small ctr the fault tests train.
# 131,072 training examples (16 MB of files per model_dir, not the default 175 MB).
SMALL_CTR = ("vocab_sizes=3000:2000:1000,embedding_dim=8,hidden=32:16,eval_examples=2048,"
             "train_examples=131072")
CHIEF = spec_lib.TaskId(spec_lib.JobType.CHIEF, 0)
# How the fault tests' chiefs train and save.
CHECKPOINT_INTERVAL = 200
STEPS_PER_LOOP = 50
# Every coordinator start traces its closure, ~0.1 s per step written out
# (docs/benchmarks.md), and these tests start ~20 coordinators: closures of 10
# steps save ~2 minutes of the suite. The default (50) is what the e2e, bench
# and coordinator tests run.
STEPS_PER_CLOSURE = 10
# Most steps a ps or chief loss can roll back: a loop can end (and be
# recorded) on a checkpoint step and the fault land before its save is
# complete, and a retried closure can carry a loop a few steps further.
MAX_STEPS_LOST = CHECKPOINT_INTERVAL + STEPS_PER_LOOP


def stop_chief(cluster: local.LocalCluster) -> None:
  """Stops and forgets the cluster's chief, if any (a cluster has one chief at a time)."""
  chief = cluster.tasks.pop(CHIEF, None)
  if chief is not None:
    chief.stop(grace=30)  # Time to save, as a chief gets everywhere in the tests.


class ChiefRun:
  """A supervised chief (`tfps run`) on `cluster`, and what it has written since.

  Registers (does not start) the cluster's chief with `chief_flags`; only
  what this chief writes counts, even where an earlier chief used the same
  model_dir or log.
  """

  def __init__(self, cluster: local.LocalCluster, model_dir: str, chief_flags: Sequence[str],
               replica: int = 0):
    os.makedirs(model_dir, exist_ok=True)
    self.cluster = cluster
    self.model_dir = model_dir
    self.chief = cluster.add_chief([f"--model_dir={model_dir}", *chief_flags],
                                   stdout_path=os.path.join(model_dir, f"chief-{replica}.stdout"),
                                   replica=replica)
    # Every chief of the cluster appends to one log: read only from here on.
    self._log_offset = (os.path.getsize(self.chief.log_path)
                        if os.path.exists(self.chief.log_path) else 0)
    self._progress = progress_lib.ProgressLog(model_dir)
    self._progress.read_new()
    self.records: list[progress_lib.Progress] = []

  def start_training(self, timeout: float = 180) -> "ChiefRun":
    """Starts the chief and waits for its first loop (a module's shared chief)."""
    self.chief.start()
    self.wait_for_step(0, timeout=timeout)
    return self

  def history(self) -> list[progress_lib.Progress]:
    """model_dir's whole progress log (every coordinator's), as the input accounting reads it."""
    return progress_lib.ProgressLog(self.model_dir).read_new()

  def wait_for_epochs(self, epochs: int, timeout: float = 240) -> None:
    """Waits until `epochs` whole epochs are in the kept history (`history`)."""
    log = progress_lib.ProgressLog(self.model_dir)
    history: list[progress_lib.Progress] = []

    def enough():
      history.extend(log.read_new())  # Only what is new: the log grows all the while.
      return coverage.account(history).epochs_completed >= epochs

    self.wait_for(enough, timeout=timeout, what=f"{epochs} whole epoch(s) in the kept history")

  def poll(self) -> list[progress_lib.Progress]:
    new = self._progress.read_new()
    self.records += new
    return new

  @property
  def step(self) -> int:
    """The last step a loop reached (restores not counted)."""
    self.poll()
    trained = [r.step for r in self.records if not r.restored]
    return trained[-1] if trained else 0

  @property
  def restores(self) -> list[progress_lib.Progress]:
    return self.restores_after(0)

  def restores_after(self, index: int) -> list[progress_lib.Progress]:
    """The coordinator starts recorded after record `index`."""
    self.poll()
    return [r for r in self.records[index:] if r.restored]

  def wait_for(self, predicate: Callable[[], object], *, timeout: float, what: str) -> None:
    """Waits for `predicate`; fails at once if the chief itself exited.

    Either failure carries the chief's last words (`last_words`).
    """
    def check():
      if not self.chief.alive:
        raise AssertionError(f"chief exited with {self.chief.returncode} while waiting for "
                             f"{what}; see {self.chief.log_path}\n{self.last_words()}")
      return predicate()
    try:
      processes.wait_until(check, timeout=timeout, what=what)
    except TimeoutError as e:
      raise TimeoutError(f"{e}\n{self.last_words()}") from None

  def last_words(self, lines: int = 25, events: int = 6) -> str:
    """The end of the chief's log and event log: why it ended, even where CI keeps no files."""
    try:
      log_tail = [l[:300] for l in self.log().splitlines()[-lines:]]
      event_tail = [str(e) for e in self.events()[-events:]]
    except OSError as e:  # Never hide the failure being reported.
      return f"(no last words: {e})"
    return "\n".join(["--- chief log (end):", *log_tail, "--- events (last):", *event_tail])

  def wait_for_step(self, step: int, timeout: float = 120) -> int:
    """Waits until a loop ends past `step`; returns the step reached."""
    self.wait_for(lambda: self.step > step, timeout=timeout, what=f"training past step {step}")
    return self.step

  def wait_for_restart_and_progress(self, since: int, timeout: float) -> progress_lib.Progress:
    """Waits for a coordinator restart after record `since`, then a loop past it."""
    self.wait_for(lambda: self.restores_after(since), timeout=timeout,
                  what="a coordinator restart (a 'restored' progress record)")
    restored = self.restores_after(since)[-1]
    self.wait_for(lambda: self.step > restored.step and not self.records[-1].restored,
                  timeout=timeout, what=f"training past the restored step {restored.step}")
    return restored

  def wait_for_work(self, handles: Sequence[local.TaskHandle], timeout: float = 120) -> None:
    """Waits until each of `handles` (workers) runs closures again.

    Measured as 0.5 s more CPU than now: an idle server uses next to none, so
    this is proof of work, and it ends as soon as there is that proof.
    """
    start = {h.task: procs.cpu_seconds(h.pid) for h in handles}
    self.wait_for(lambda: all(procs.cpu_seconds(h.pid) - start[h.task] > 0.5 for h in handles),
                  timeout=timeout, what=f"{', '.join(str(h.task) for h in handles)} to run "
                  "closures (0.5 s more CPU)")

  def events(self) -> list[events_lib.Event]:
    return events_lib.EventLog(self.model_dir).read()

  def log(self) -> str:
    """The chief's log since this run's chief was registered."""
    with open(self.chief.log_path, "rb") as f:
      f.seek(self._log_offset)
      return f.read().decode("utf-8", errors="replace")
