"""The chief's lease: which of two chief replicas coordinates, and fencing the other.

A cluster spec may list two chief addresses: two replicas of the chief run
the same `tfps run`; one holds the lease and supervises coordinators, the
other stands by with a coordinator imported and waiting (`recovery.standby`)
and takes over when the holder is lost, without anything being restarted.

The lease lives in `model_dir/chief_lease/`, the directory both already
share for checkpoints:

    generation-000003   taken by one replica (created exclusively: one taker)
    beat-000003         the holder's heartbeat count, rewritten every
                        `renew_seconds` by a thread of its supervisor
    presence-000003     `host:port` of the holder's presence port (`presence`)
    end-000003          how the holder's run ended, `{"code": N}`

A standby takes generation N+1 when beat-N has not changed for
`lease_seconds` by its own clock (no two hosts' clocks are compared), at once
when end-N says the holder let go (a retryable exit: 143, 170) or when the
holder's process is known to be gone (its presence connection closed), and
exits with the holder's code when the run is over (0, 1, 2, 130). A holder
whose beat is silent while its process is known to live (`holder_present`:
its presence connection open and its host answering, `presence`) is
paused, or starved by a loaded host (a 2-core host under load has starved
one for 1.1 s): the standby then waits `PRESENT_LEASES` leases, so that a
slow holder is not taken from and the replicas do not take the lease back
and forth; a lost or cut off host answers nothing, and one lease decides.

Fencing: whoever holds generation N stops the moment generation N+1
exists. Its supervisor kills its coordinator; the coordinator itself checks
(`Fence`, one `stat`) before every checkpoint save and progress record, so
a paused one that wakes after a takeover writes nothing; checkpoints are
named by generation (`ckpt-g3-1200`), so two generations never write the
same file; progress records carry the generation and readers drop those of
an older one once a newer one has written (`progress_log`). Steps it
applies touch only its own variables: each coordinator's variables live in
its own TensorFlow context on the ps, and a new coordinator restores the
checkpoint into its own. What it cannot stop: a checkpoint write it had
started before the takeover finishing afterwards (a complete checkpoint of
its own lineage; see docs/recovery.md).

A replica cut off from the cluster (no ps answers it) neither beats nor
takes: the lease goes to a replica that can train, and when neither can,
nobody takes it from a holder that will beat again once the cluster is back
(`chief_replica`).

`judge` decides, a pure function of what was read; `LeaseStore` reads and
writes the files; `LeaseKeeper` renews the lease in a thread.
"""

import dataclasses
import enum
import json
import os
import re
import threading
from typing import Callable

from tfps.base import errors

DIR_NAME = "chief_lease"
# A run that ended this way is over for every replica; other ends let go.
_FINAL_CODES = frozenset({errors.ExitCode.OK, errors.ExitCode.PERMANENT, errors.ExitCode.USAGE,
                          errors.ExitCode.INTERRUPTED})
_GENERATION = re.compile(r"generation-(\d+)$")
# Leases a standby waits out while the holder's process is known to live
# (`LeaseView.holder_present`).
PRESENT_LEASES = 3


def holder_named(task: str, address: str, pid: int) -> str:
  """How a replica names itself as the lease's holder: its task first, for people
  and for `holder_task` ('chief:1 (host:2222, pid 12)')."""
  return f"{task} ({address}, pid {pid})"


def holder_task(holder: str) -> str:
  """The task a holder's name (`holder_named`) starts with: 'chief:1'."""
  return holder.split(" ", 1)[0]


@dataclasses.dataclass(frozen=True)
class LeaseConfig:
  """Attributes:
    lease_seconds: a holder whose beat has not changed this long has lost the lease.
    renew_seconds: how often the holder beats (well under `lease_seconds`).
  """

  lease_seconds: float = 1.0
  renew_seconds: float = 0.1

  def __post_init__(self):
    if not self.lease_seconds > 0:
      raise errors.UsageError(f"chief_lease_seconds ({self.lease_seconds}) must be positive")
    if not 0 < self.renew_seconds <= self.lease_seconds / 4:
      raise errors.UsageError(
          f"renew_seconds ({self.renew_seconds}) must be positive and at most a quarter of "
          f"chief_lease_seconds ({self.lease_seconds})")


class Verdict(str, enum.Enum):
  HOLD = "hold"  # Ours: keep beating.
  TAKE = "take"  # Free, let go, or its holder silent too long: take the next generation.
  WAIT = "wait"  # Another replica holds it and beats: stand by.
  SUPERSEDED = "superseded"  # We held an older generation: stop, write nothing, stand by.
  ENDED = "ended"  # The run is over: leave with its code.


@dataclasses.dataclass(frozen=True)
class LeaseView:
  """The lease as one replica read it.

  `generation` 0: nobody ever took it. `silent_seconds`: how long the
  holder's beat has not changed, by the reader's clock. `presence`: the
  holder's presence port; `holder_gone`: its process is known to be gone
  (`presence.PresenceWatch`, seen before the files were read);
  `holder_present`: its process is known to live (its presence connection open
  and its host answering a new one).
  """

  generation: int
  holder: str | None = None
  end_code: int | None = None
  silent_seconds: float = 0.0
  presence: str | None = None
  holder_gone: bool = False
  holder_present: bool = False


def judge(view: LeaseView, *, mine: int | None, lease_seconds: float) -> Verdict:
  """What a replica holding generation `mine` (None: none) does about `view`."""
  if mine is not None:
    return Verdict.SUPERSEDED if view.generation > mine else Verdict.HOLD
  if view.generation == 0:
    return Verdict.TAKE
  if view.end_code is not None:
    return Verdict.ENDED if view.end_code in _FINAL_CODES else Verdict.TAKE
  if view.holder_gone:  # Its process died: no beat will come, and no end.
    return Verdict.TAKE
  if view.holder_present:  # Its process lives: paused or starved.
    lease_seconds *= PRESENT_LEASES
  return Verdict.TAKE if view.silent_seconds >= lease_seconds else Verdict.WAIT


class BeatWatch:
  """How long a generation's beat has stood still, by this reader's clock."""

  def __init__(self):
    self._seen: tuple[int, int | None] | None = None
    self._since = 0.0

  def silent_for(self, generation: int, beat: int | None, now: float) -> float:
    if self._seen != (generation, beat):
      self._seen, self._since = (generation, beat), now
    return now - self._since


class LeaseStore:
  """The lease's files in `model_dir/chief_lease/` (see the module docstring)."""

  def __init__(self, model_dir: str):
    if "://" in model_dir:
      raise errors.UsageError(
          f"model_dir ({model_dir}): two chief replicas need a shared filesystem path "
          "for their lease (model_dir/chief_lease), not a remote URL")
    self.dir = os.path.join(model_dir, DIR_NAME)
    os.makedirs(self.dir, exist_ok=True)

  def _path(self, kind: str, generation: int) -> str:
    return os.path.join(self.dir, f"{kind}-{generation:06d}")

  def latest(self) -> int:
    """The newest generation taken (0: none)."""
    found = [int(m.group(1)) for name in os.listdir(self.dir)
             if (m := _GENERATION.match(name))]
    return max(found, default=0)

  def view(self, watch: BeatWatch, now: float) -> LeaseView:
    generation = self.latest()
    if generation == 0:  # Nobody took it yet, for this long (as seen from here).
      return LeaseView(0, silent_seconds=watch.silent_for(0, None, now))
    holder = _read(self._path("generation", generation))
    end = _read(self._path("end", generation))
    beat = _read(self._path("beat", generation))
    return LeaseView(generation, holder=holder,
                     end_code=json.loads(end)["code"] if end else None,
                     silent_seconds=watch.silent_for(generation, _int(beat), now),
                     presence=_read(self._path("presence", generation)))

  def holder(self) -> str | None:
    """Who took the newest generation (as `take` was told), None if nobody has."""
    generation = self.latest()
    return _read(self._path("generation", generation)) if generation else None

  def take(self, generation: int, holder: str) -> bool:
    """Takes `generation` for `holder`; False if another replica took it first."""
    try:
      fd = os.open(self._path("generation", generation), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(holder)
    return True

  def set_presence(self, generation: int, address: str) -> None:
    """Where the holder of `generation` serves its presence port (`presence`)."""
    _replace(self._path("presence", generation), address)

  def beat(self, generation: int, count: int) -> None:
    _replace(self._path("beat", generation), str(count))

  def end(self, generation: int, code: int) -> None:
    _replace(self._path("end", generation), json.dumps({"code": int(code)}))

  def ended(self, generation: int) -> bool:
    """Whether the holder of `generation` wrote its end (False for 0: nobody held it)."""
    return generation > 0 and os.path.exists(self._path("end", generation))

  def superseded(self, generation: int) -> bool:
    return os.path.exists(self._path("generation", generation + 1))


@dataclasses.dataclass(frozen=True)
class Fence:
  """A coordinator's check that its generation still holds the lease (0: no lease)."""

  model_dir: str
  generation: int = 0

  def check(self, what: str | Callable[[], str]) -> None:
    """Raises `Superseded` if another replica took the lease: `what` (or what it
    returns, asked only then) is not written."""
    if self.generation and os.path.exists(os.path.join(
        self.model_dir, DIR_NAME, f"generation-{self.generation + 1:06d}")):
      what = what() if callable(what) else what
      raise errors.Superseded(
          f"the other chief replica took the lease (generation {self.generation + 1}) from "
          f"this coordinator's {self.generation}; {what} not written, stopping")


class LeaseKeeper:
  """Beats for `generation` every `renew_seconds` in a thread, until superseded or stopped.

  A thread, not the supervisor's loop: that loop blocks for whole seconds
  (waiting for the cluster), and a beat missed for `lease_seconds` hands
  the run to the standby.
  """

  def __init__(self, store: LeaseStore, generation: int, config: LeaseConfig,
               on_superseded: Callable[[], None] = lambda: None,
               sees_cluster: Callable[[], bool] = lambda: True):
    """`sees_cluster`: whether this replica reaches the cluster now; a holder cut
    off from it skips its beats, so that a replica that reaches it takes over."""
    self.generation = generation
    self._sees_cluster = sees_cluster
    self.superseded = threading.Event()
    self._store, self._config, self._on_superseded = store, config, on_superseded
    self._stopped = threading.Event()
    self._thread = threading.Thread(target=self._run, name="tfps-chief-lease", daemon=True)

  def start(self) -> "LeaseKeeper":
    self._store.beat(self.generation, 0)
    self._thread.start()
    return self

  def _run(self) -> None:
    count = 1
    while not self._stopped.wait(self._config.renew_seconds):
      if self._store.superseded(self.generation):
        self.superseded.set()
        self._on_superseded()
        return
      if self._sees_cluster():
        self._store.beat(self.generation, count)
        count += 1

  def stop(self) -> None:
    self._stopped.set()
    self._thread.join(timeout=5.0)


def _read(path: str) -> str | None:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except FileNotFoundError:
    return None


def _int(text: str | None) -> int | None:
  try:
    return int(text) if text else None
  except ValueError:
    return None  # Read while being replaced on a filesystem without atomic rename.


def _replace(path: str, text: str) -> None:
  """Writes `path` whole: readers see the old text or the new, never half."""
  temp = f"{path}.{os.getpid()}.tmp"
  with open(temp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(temp, path)
