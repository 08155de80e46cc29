"""One of two chief replicas: stand by until the lease is ours, then supervise.

The decisions are `chief_lease.judge`'s; this is the loop that acts on them
(`ChiefReplica.run`):

  standing by   a hot coordinator kept ready once the holder trains
                (`stand_by`), the lease read every `_POLL_SECONDS` and the
                holder's presence port watched (`presence`); TAKE: take the
                next generation and supervise; ENDED: leave with the run's code.
  holding       `supervise(generation, superseded)` runs the usual supervisor
                while a `LeaseKeeper` beats; superseded (the other replica
                took over while this one was paused or cut off): its
                coordinator is killed, and this replica stands by again.

A replica takes and beats only while it sees the cluster (`ClusterSight`:
some ps answered lately; the chief gives it two leases): a holder cut off
from the ps and workers lets the lease lapse to one that is not; when no
replica sees a ps, nobody takes the lease, and the holder beats again once
they answer.

Replica 0 takes the first generation at once; replica 1 only once nobody
has for `_FIRST_TAKE_LEASES` leases, so that with both up the run starts where it
is expected to (`tfps chaos` faults name `chief:0`), and without replica 0
it still starts.
"""

import dataclasses
import threading
import time
from typing import Callable, Sequence

from absl import logging

from tfps.base import errors
from tfps.base import signals
from tfps.cluster import readiness
from tfps.cluster import spec as spec_lib
from tfps.recovery import chief_lease
from tfps.recovery import events as events_lib
from tfps.recovery import policy
from tfps.recovery import presence as presence_lib
from tfps.recovery import supervisor as supervisor_lib

# How often a standby reads the lease: its share of a takeover's time.
_POLL_SECONDS = 0.05
_FIRST_TAKE_LEASES = 10  # Replica 1 waits this many leases for replica 0 to start the run.
# How long a probe of a silent holder's host waits, and how often it is made.
_PROBE_SECONDS = 0.25


class ClusterSight:
  """Whether some ps answered this process within `within` seconds: probed in a
  thread every `within / 2` seconds (each probe bounded by that too)."""

  def __init__(self, cluster: spec_lib.ClusterSpec, ps: Sequence[spec_lib.TaskId],
               within: float, clock: Callable[[], float] = time.monotonic):
    self._cluster, self._ps, self._within, self._clock = cluster, list(ps), within, clock
    self._seen = clock()  # Until the first probe says otherwise.
    self.rounds = 0  # Probe rounds done.
    self._stopped = threading.Event()
    self._thread = threading.Thread(target=self._run, name="tfps-cluster-sight", daemon=True)

  def start(self) -> "ClusterSight":
    self._thread.start()
    return self

  def __call__(self) -> bool:
    return self._clock() - self._seen < self._within

  def _run(self) -> None:
    period = self._within / 2
    while not self._stopped.is_set():
      began = self._clock()
      if readiness.reachable(self._cluster, self._ps, period):
        self._seen = self._clock()
      self.rounds += 1
      self._stopped.wait(max(0.0, period - (self._clock() - began)))

  def stop(self) -> None:
    self._stopped.set()


class _Watched:
  """The presence port of the holder a standby reads (`presence.PresenceWatch`)."""

  def __init__(self):
    self._key: tuple[int, str] | None = None
    self._watch: presence_lib.PresenceWatch | None = None
    self._probed: tuple[float, bool] | None = None  # (when, answered) of the last probe.

  def gone(self) -> bool:
    return self._watch is not None and self._watch.gone.is_set()

  def present(self, now: float) -> bool:
    """Whether the watched holder's process lives as far as can be seen: connected to its
    presence port, not ended, and its host accepted a new connection lately (probed at
    most every `_PROBE_SECONDS`: a paused holder's kernel queues each probe)."""
    if (self._watch is None or not self._watch.watching.is_set()
        or self._watch.gone.is_set()):
      return False
    if self._probed is None or now - self._probed[0] >= _PROBE_SECONDS:
      self._probed = (now, self._watch.answers(timeout=_PROBE_SECONDS))
    return self._probed[1]

  def follow(self, view: chief_lease.LeaseView) -> bool:
    """Watches `view`'s holder; whether it is the one watched before this reading."""
    key = (view.generation, view.presence) if view.presence else None
    if key == self._key:
      return key is not None
    self.stop()
    self._key, self._probed = key, None
    if key is not None:
      self._watch = presence_lib.PresenceWatch(view.presence).start()
    return False

  def stop(self) -> None:
    if self._watch is not None:
      self._watch.stop()
    self._watch, self._key = None, None


class ChiefReplica:
  def __init__(self, store: chief_lease.LeaseStore, config: chief_lease.LeaseConfig, *,
               replica: int, me: str, stop: signals.StopSignals,
               event_log: events_lib.EventLog, clock: Callable[[], float] = time.monotonic,
               sees_cluster: Callable[[], bool] = lambda: True,
               presence_host: str | None = None):
    """`presence_host`: this replica's host name, where a standby reaches its presence
    port while it holds the lease (None: none served; the lease alone decides)."""
    self._store, self._config, self._replica, self._me = store, config, replica, me
    self._presence_host = presence_host
    self._presence: presence_lib.PresenceServer | None = None  # Served once it first holds.
    self._sees_cluster = sees_cluster
    self._stop, self._events, self._clock = stop, event_log, clock
    self.generation: int | None = None  # The one this replica holds or held last.
    # An end written before this replica started is an earlier run's (this
    # model_dir trained before, and is resumed now): not this run's end. One
    # written later, even for the generation held when it started (it was
    # restarted while the other replica held the lease), is this run's.
    self._started_after = store.latest()
    self._start_ended = store.ended(self._started_after)
    self.ended_elsewhere = False  # The run ended on the other replica.

  def run(self, supervise: Callable[[int, Callable[[], bool]], supervisor_lib.SupervisorResult],
          stand_by: Callable[[], None]) -> supervisor_lib.SupervisorResult:
    """Until the run ends here or on the other replica: the last supervisor's result,
    the other replica's end, or a stop signal's."""
    while True:
      taken = self._wait_for_lease(stand_by)
      if isinstance(taken, supervisor_lib.SupervisorResult):
        return taken
      self.generation = taken
      keeper = chief_lease.LeaseKeeper(self._store, taken, self._config,
                                       sees_cluster=self._sees_cluster).start()
      try:
        result = supervise(taken, keeper.superseded.is_set)
      finally:
        keeper.stop()
      if result.exit_code != errors.ExitCode.SUPERSEDED:
        return result
      self._events.append(events_lib.Event(
          kind="action", task=f"chief:{self._replica}",
          detail=f"lease generation {taken} superseded: coordinator stopped, standing by"))

  def release(self, code: int) -> None:
    """The run ended here with `code`: the standby leaves (0, 1, 2, 130) or takes over."""
    if self.generation is not None and not self._store.superseded(self.generation):
      self._store.end(self.generation, code)

  def _wait_for_lease(self, stand_by: Callable[[], None]
                      ) -> int | supervisor_lib.SupervisorResult:
    watch, announced, watched = chief_lease.BeatWatch(), None, _Watched()
    blind = None  # The generation a take was held back from (no ps in sight), said once.
    while not self._stop.requested:
      # Gone before the files are read: a holder that wrote its end and then
      # exited is seen ending, not gone.
      gone, now = watched.gone(), self._clock()
      view = self._store.view(watch, now)
      view = dataclasses.replace(view, holder_gone=watched.follow(view) and gone)
      if view.silent_seconds >= self._config.lease_seconds and not view.holder_gone:
        # Silent a lease: is its process there (paused or starved), or its host lost?
        view = dataclasses.replace(view, holder_present=watched.present(now))
      verdict = chief_lease.judge(view, mine=None, lease_seconds=self._config.lease_seconds)
      fresh = self._fresh(view)
      if verdict == chief_lease.Verdict.ENDED and fresh:
        verdict = chief_lease.Verdict.TAKE
      if (verdict == chief_lease.Verdict.TAKE and fresh and self._replica > 0
          and view.silent_seconds < _FIRST_TAKE_LEASES * self._config.lease_seconds):
        verdict = chief_lease.Verdict.WAIT
      if verdict == chief_lease.Verdict.TAKE and not self._sees_cluster():
        verdict = chief_lease.Verdict.WAIT  # Cut off too: taking it would help nobody.
        if blind != view.generation:
          blind = view.generation
          logging.warning("not taking the chief lease from %s yet: no ps answered this "
                          "replica lately", view.holder)
      if verdict == chief_lease.Verdict.TAKE:
        if self._store.take(view.generation + 1, self._me):
          watched.stop()
          self._serve_presence(view.generation + 1)
          self._took(view)
          return view.generation + 1
        continue  # The other replica was first: read again.
      if verdict == chief_lease.Verdict.ENDED:
        watched.stop()
        logging.info("the run ended on the other chief replica (exit code %d)", view.end_code)
        self.ended_elsewhere = True
        return supervisor_lib.SupervisorResult(errors.ExitCode(view.end_code), 0,
                                               "the run ended on the other chief replica")
      if announced != view.generation and view.generation:
        announced = view.generation
        logging.info("standing by: %s holds the chief lease (generation %d)",
                     view.holder, view.generation)
      stand_by()
      self._stop.wait(_POLL_SECONDS)
    watched.stop()
    return supervisor_lib.SupervisorResult(
        errors.exit_code_for_signal(self._stop.signum), 0, "stopped while standing by")

  def _serve_presence(self, generation: int) -> None:
    """Tells where this holder's presence port is (served from the first hold on)."""
    if self._presence_host is None:
      return
    try:
      if self._presence is None:
        self._presence = presence_lib.PresenceServer().start()
      self._store.set_presence(generation, f"{self._presence_host}:{self._presence.port}")
    except OSError as e:  # Not fatal: the lease alone decides.
      logging.warning("chief presence port not served (%s): a takeover waits for the lease", e)

  def _fresh(self, view: chief_lease.LeaseView) -> bool:
    """Whether taking the lease now starts this run: never taken, or last ended by an
    earlier run in this model_dir (before this replica started)."""
    return view.generation == 0 or (view.end_code is not None and (
        view.generation < self._started_after
        or view.generation == self._started_after and self._start_ended))

  def _took(self, view: chief_lease.LeaseView) -> None:
    generation = view.generation + 1
    if self._fresh(view):  # This run's start: nobody is replaced.
      logging.info("chief lease taken (generation %d): this replica coordinates", generation)
      return
    why = (f"it let go (exit code {view.end_code})" if view.end_code is not None
           else "its process is gone (its presence port closed)" if view.holder_gone
           else f"its heartbeat stopped {view.silent_seconds:.1f}s ago"
           + (" (its process lives: paused or starved)" if view.holder_present else ""))
    logging.warning("taking over from %s: %s; lease generation %d", view.holder, why,
                    generation)
    task = f"chief:{self._replica}"
    self._events.append(events_lib.Event(
        kind="failure", task=task, failure=policy.FailureKind.CHIEF_LOST.value,
        detail=f"the active chief ({view.holder}) is gone: {why}"))
    self._events.append(events_lib.Event(
        kind="action", task=task, failure=policy.FailureKind.CHIEF_LOST.value,
        action=policy.Action.TAKE_OVER.value, detail=f"standby chief takes lease generation {generation}"))
