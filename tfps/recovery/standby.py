"""A warm standby coordinator: the next coordinator process, ready before it is needed.

A coordinator restart (after a ps loss, or to leave a worker out or take it
back) starts a new process, and most of its first seconds go to importing
TensorFlow, tf_keras and Orbit (~5-9 s on 2 cores, measured in the chief's
log between "starting coordinator" and "connected"). The chief's supervisor
therefore keeps the *next* coordinator started and imported ahead of need,
blocked before it does anything else: on a restart it is told to go (with
the workers and ps to leave out) instead of a cold process being started.

The standby is only made once the current coordinator has trained (so it
never takes CPU from a coordinator that is still starting, and a
coordinator that fails at once, e.g. on bad input, is not shadowed by a
process that would fail the same way), one at a time. It waits on its stdin:
one JSON line `{"exclude_tasks": [...], "lease_generation": N}` says go; end of file (the
supervisor is gone) or a stop signal ends it without doing anything.

Every coordinator's stderr passes through the supervisor (`OutputTail`), which
keeps its last lines: a coordinator or standby that dies is recorded with them
(`recovery.deaths`). A standby tells it is ready by creating the file its
`ENV_VAR` names. One that dies before it is ready is reported; after two such
deaths in a row no standby is started again (each would be forked and die the
same way), and restarts start a cold coordinator instead.

A standby chief replica keeps a *hot* standby instead (`prepare(hot=True)`,
`HOT_ENV_VAR`): it also connects to the whole cluster and builds the
coordinator ahead (`commands.coordinate`), marking first that it did so
(`connected_path`): a takeover that must leave a task out gets a cold
coordinator instead. One whose cluster changed (a ps was lost) retires,
exit 0 before any go, which is not a death: the next is started at the next
`prepare` (or, on a host the cluster's tasks share, once the cluster trains
again), and connects only once the cluster trains again.

Pure plumbing, no TensorFlow: the coordinator side (`wait_for_go`, `mark_ready`,
`mark_connected`) is called by `tfps run` after it has imported what a
coordinator needs.
"""

import dataclasses
import json
import os
import select
import subprocess
from typing import Callable, Sequence, TextIO

from absl import logging

from tfps.base import signals
from tfps.cluster import output_tail
from tfps.cluster import processes
from tfps.recovery import deaths
from tfps.recovery import events as events_lib

# Set in a standby's environment: the file to create once it is ready; it
# waits for the go line before coordinating.
ENV_VAR = "TFPS_STANDBY_READY_FILE"
# Set too for a standby chief replica's standby: it also connects and builds
# ahead (`coordinator.run.prepare_ahead`), and creates `connected_path(ready
# file)` first: from then on it can only coordinate the whole cluster.
HOT_ENV_VAR = "TFPS_STANDBY_HOT"
# How often a waiting standby looks at its stop signals.
_WAKE_SECONDS = 0.5
# Standbys that die before they are ready, in a row, before no more are started.
MAX_EARLY_DEATHS = 2


@dataclasses.dataclass(frozen=True)
class Go:
  """What a standby is told when it takes over."""

  exclude_tasks: tuple[str, ...] = ()
  lease_generation: int = 0  # The chief lease it runs under (`chief_lease`; 0: none).


def mark_ready(path: str) -> None:
  """Called by a standby once it has imported what it needs: it is ready."""
  with open(path, "w", encoding="utf-8"):
    pass


def connected_path(ready_path: str) -> str:
  """The file a hot standby creates before it connects to the whole cluster."""
  return ready_path + ".connected"


def mark_connected(ready_path: str) -> None:
  """Called by a hot standby before it connects: it can only coordinate the whole cluster."""
  with open(connected_path(ready_path), "w", encoding="utf-8"):
    pass


def go_pending(stdin: TextIO) -> bool:
  """Whether the supervisor has said something this standby has not read yet."""
  return bool(select.select([stdin], [], [], 0)[0])


def wait_for_go(stop: signals.StopSignals, stdin: TextIO,
                idle: Callable[[], None] = lambda: None) -> Go | None:
  """Blocks until the supervisor says go; None: end of file or a stop signal.
  `idle()` between looks (a hot standby checks what it prepared)."""
  while not stop.requested:
    if not select.select([stdin], [], [], _WAKE_SECONDS)[0]:
      idle()
      continue
    line = stdin.readline()
    if not line:
      return None  # The supervisor is gone (or closed us): nothing to do.
    fields = json.loads(line)
    return Go(exclude_tasks=tuple(fields["exclude_tasks"]),
              lease_generation=int(fields.get("lease_generation", 0)))
  return None


@dataclasses.dataclass(frozen=True)
class _Child:
  """A coordinator process of ours: its stdout file and the tail of its stderr."""

  process: subprocess.Popen
  stdout_path: str
  tail: output_tail.OutputTail
  hot: bool = False  # A standby that connects and builds ahead (`HOT_ENV_VAR`).

  @property
  def ready_path(self) -> str:
    return self.stdout_path + ".ready"

  @property
  def connected(self) -> bool:
    """A hot standby tied to the whole cluster (it cannot leave a task out)."""
    return self.hot and os.path.exists(connected_path(self.ready_path))


class WarmCoordinators:
  """Starts coordinator processes for the supervisor, the next one kept warm.

  `command(excluded)` is the command line of a coordinator that leaves the
  tasks `excluded` out (`tfps run` writes them into the run spec file it
  names); a standby is started with `command(())` and told whom to leave out
  in its go line. Every process writes its
  stdout to its own file in `stdout_dir`; `stdout_path` is the current one's.
  Their temporary files go there too (`TMPDIR`): each coordinator keeps them
  in its own scratch directory, which the next one removes if it was killed
  (`cluster.scratch`), and the chief removes `stdout_dir` when it ends.
  Their stderr goes on to this process's stderr (`OutputTail`). A standby
  that dies is recorded in `event_log`.
  """

  def __init__(self, command: Callable[[tuple[str, ...]], Sequence[str]], *, env: dict,
               stdout_dir: str, warm: bool, event_log: events_lib.EventLog | None = None,
               spawn: Callable[..., subprocess.Popen] = processes.spawn):
    self._command = command
    self._env = env
    self._stdout_dir = stdout_dir
    self._warm = warm
    self._events = event_log
    self._spawn = spawn
    self._count = 0
    self._standby: _Child | None = None
    self._current: _Child | None = None
    self._early_deaths = 0  # Standbys in a row that died before they were ready.
    self.stdout_path: str | None = None

  @property
  def standby(self) -> tuple[subprocess.Popen, str] | None:
    """The prepared standby (its process and stdout file), if there is one."""
    return (self._standby.process, self._standby.stdout_path) if self._standby else None

  @property
  def warm(self) -> bool:
    """Whether standbys are kept (off if asked, or after `MAX_EARLY_DEATHS`)."""
    return self._warm

  def last_lines(self) -> tuple[str, ...]:
    """The end of the current coordinator's stderr."""
    return self._current.tail.last_lines() if self._current else ()

  def _new(self, argv: Sequence[str], env: dict, stdin, name: str, hot: bool = False) -> _Child:
    self._count += 1
    path = os.path.join(self._stdout_dir, f"coordinator-{self._count}.stdout")
    if name == "standby":
      env = {**env, ENV_VAR: path + ".ready", **({HOT_ENV_VAR: "1"} if hot else {})}
    with open(path, "w", encoding="utf-8") as out:
      process = self._spawn(argv, stdout=out, stderr=subprocess.PIPE,
                            env={**env, "TMPDIR": self._stdout_dir}, stdin=stdin)
    return _Child(process, path, output_tail.OutputTail(process.stderr, (2,), name=name), hot)

  def start(self, excluded: Sequence[str], lease_generation: int = 0
            ) -> tuple[subprocess.Popen, bool]:
    """The coordinator that runs next, and whether it was the warm standby.

    `command(excluded)` must give a cold one the same `lease_generation`."""
    excluded = tuple(sorted(excluded))
    if self._standby is not None and excluded and self._standby.connected:
      # Connected to the whole cluster: it cannot leave a task out.
      logging.info("the standby coordinator was prepared for the whole cluster; starting "
                   "one without %s", ", ".join(excluded))
      self._stop_standby()
    if self._standby is not None:
      child, self._standby = self._standby, None
      if child.process.poll() is None:
        try:
          child.process.stdin.write((json.dumps({
              "exclude_tasks": list(excluded), "lease_generation": lease_generation}) + "\n"
                                     ).encode())
          child.process.stdin.close()
          self._current, self.stdout_path = child, child.stdout_path
          return child.process, True
        except (BrokenPipeError, OSError):
          pass  # It died in between: start a cold one instead.
      processes.stop_group(child.process, grace=0)
      self._standby_died(child)
    self._current = self._new(self._command(excluded), self._env, subprocess.DEVNULL,
                              "coordinator")
    self.stdout_path = self._current.stdout_path
    return self._current.process, False

  def prepare(self, hot: bool = False, *, replace_retired: bool = True) -> bool:
    """Starts the standby, if warm standbys are on and there is none (`hot`: one
    that also connects and builds ahead, `HOT_ENV_VAR`; one that is not is
    replaced). A hot standby that retired (its cluster changed) is replaced at
    once if `replace_retired`: the new one imports while the cluster recovers
    and connects once it trains again (`commands.coordinate`), so a takeover
    meanwhile finds at least an imported coordinator. Otherwise none is
    started, and False says so: the caller asks again once the cluster trains."""
    if self._standby is not None and self._standby.hot != hot:
      self._stop_standby()
    if self._standby is not None:
      if self._standby.process.poll() is None:
        if os.path.exists(self._standby.ready_path):
          self._early_deaths = 0
        return True
      child, self._standby = self._standby, None
      if child.hot and child.process.returncode == 0:
        logging.info("the hot standby coordinator (pid %d) retired: its cluster changed",
                     child.process.pid)
        if not replace_retired:
          return False
      else:
        self._standby_died(child)
    if not self._warm:
      return True
    self._standby = self._new(self._command(()), self._env, subprocess.PIPE, "standby", hot)
    logging.info("%s standby coordinator started (pid %d)", "hot" if hot else "warm",
                 self._standby.process.pid)
    return True

  def _standby_died(self, child: _Child) -> None:
    """Records a standby's death; stops making standbys after repeated early ones."""
    ready = os.path.exists(child.ready_path)
    death = deaths.Death("standby", child.process.pid, child.process.wait(),
                         child.tail.last_lines(), cause="" if ready else "before it was ready")
    logging.warning("%s", death.describe())
    self._record(death.event())
    self._early_deaths = 0 if ready else self._early_deaths + 1
    if self._warm and self._early_deaths >= MAX_EARLY_DEATHS:
      self._warm = False
      reason = (f"{self._early_deaths} warm standby coordinators in a row died before they "
                "were ready (see their last lines in the event log): no more are started; "
                "each restart starts a cold coordinator")
      logging.error("%s", reason)
      self._record(events_lib.Event(kind="action", task="standby", detail=reason))

  def _record(self, event: events_lib.Event) -> None:
    if self._events is not None:
      self._events.append(event)

  def close(self) -> None:
    """Ends the standby, if any (`_stop_standby`)."""
    self._stop_standby()

  def _stop_standby(self) -> None:
    """Ends the standby, if any: killed if still importing; if ready, told by the end
    of its stdin (then the signal)."""
    if self._standby is None:
      return
    process, ready = self._standby.process, os.path.exists(self._standby.ready_path)
    self._standby = None
    if not ready:
      # Still importing: it has done nothing, and a signal would only be
      # seen once the import is over (seconds at the end of every run).
      processes.stop_group(process, grace=0.0)
      return
    try:
      process.stdin.close()
      process.wait(timeout=1.0)  # Waiting on its stdin, it leaves at once.
    except (OSError, subprocess.TimeoutExpired):
      pass
    processes.stop_group(process, grace=5.0)
