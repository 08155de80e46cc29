"""Workers hold the graphs a ps failover will run, before any ps is lost.

A ps failover restarts the coordinator on the ps that answer, and its
closures are graphs the workers have not placed before: each op of a
variable now on the one ps left. Each worker optimizes them afresh while
training waits: most of what the first failover onto that cluster costs
(docs/recovery.md "Failover graphs built ahead"). (The worker's graph cache,
`ps_worker.graph_cache`, keeps them for later ones.)

So a coordinator of 2 ps, from its second loop of each kind of full-size
closure (`start(kind)`: the fast-start closure early in a run, which a
failover coordinator of a young run starts with too; the written-out one
after), has each worker optimize that kind's graph, and the one for other
sizes, ahead of need: each closure rebuilt from its
stored trace as the failover coordinator will rebuild it (its ps ops moved to
ps:0, named for the failover cluster's shape, which is the same whichever ps
is lost: `worker_functions.placement`), bound to stand-in variable handles
on the device the failover coordinator's variables will be on, and called
with `train` false (`warm_up`). A stand-in is a `VarHandleOp`: a handle to a
variable that is never created, and never read, as the branch that would
read it is not taken. The worker's graph cache stores the optimized graph
under the name that coordinator's closure has, and its workers read it back
(~1-2 s) instead of optimizing it.

It costs what the failover would have (each worker's optimization; here its
closures wait for it), once: the workers that hold the graph are recorded
beside the traces (`RECORD`), under what started them (`workers_epoch`: a new
`tfps local` has new workers' caches), and later coordinators skip them. A
worker that TF takes back later is not asked again.

Only for exactly 2 ps. With more, where a failover coordinator puts each
variable is the strategy's choice there (round robin over the ps left),
which this coordinator cannot foresee; and where a variable is split between
the ps (`min_shard_bytes`), the failover coordinator holds it whole and
traces its closures anew, so there is nothing to build ahead.
"""

import json
import os
import threading
from typing import Any, Callable, Mapping

from absl import logging
import tensorflow as tf

from tfps.base import files
from tfps.base import messages
from tfps.cluster import spec as spec_lib
from tfps.fast_restart import trace_cache as trace_cache_lib
from tfps.fast_restart import warm_up
from tfps.fast_restart import worker_functions

RECORD = "failover-graphs.json"


def failover_view(cluster: spec_lib.ClusterSpec) -> spec_lib.ClusterSpec | None:
  """The cluster a ps failover leaves, as the workers' graphs see it (either ps
  lost: the same shape); None unless `cluster` has exactly 2 ps."""
  if cluster.num_tasks(spec_lib.JobType.PS) != 2:
    return None
  return cluster.without([spec_lib.TaskId(spec_lib.JobType.PS, 1)])


def failover_device(device: str) -> str:
  """Where a variable on `device` is after a failover to one ps: that ps's same device."""
  spec = tf.DeviceSpec.from_string(device)
  return spec.replace(task=0).to_string() if spec.job == "ps" else device


def _stat(pid: int) -> list[str]:
  """/proc/PID/stat's fields from the 3rd on (after the name); [] if unreadable."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()
  except (OSError, IndexError):
    return []


def workers_epoch() -> str:
  """What started the workers whose graph caches a record speaks of, as near as a
  coordinator can tell: its chief's parent (`tfps local`, an orchestrator), by pid
  and start time, on this boot. A chief restarted by the same parent keeps it; a
  new `tfps local` (whose workers' caches are new) does not."""
  chief = _stat(os.getppid())
  parent = chief[1] if len(chief) > 1 else "?"  # Field 4: the parent's pid.
  started = _stat(int(parent)) if parent.isdigit() else []
  try:
    with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:
      boot = f.read().strip()[:8]
  except OSError:
    boot = "?"
  return f"{boot}:{parent}@{started[19] if len(started) > 19 else '?'}"  # Field 22: start.


def record_key(graph: str) -> str:
  """The record's key for `graph` on the workers started as this coordinator's were."""
  return f"{graph}@{workers_epoch()}"


def to_ask(held: Mapping[str, Any], key: str, workers: Mapping[int, str]) -> dict[int, str]:
  """Those of `workers` ({index: address}) not recorded in `held` as holding `key`."""
  have = set(held.get(key, ()))
  return {index: address for index, address in workers.items() if address not in have}


def held(cache: trace_cache_lib.TraceCache, kind: str, root: Any,
         cluster: spec_lib.ClusterSpec) -> bool:
  """Whether every worker of `cluster` holds `kind`'s graph for it, built ahead by a
  coordinator before the ps failover that left `cluster` (as recorded, `RECORD`).

  `cache` is a coordinator's of `cluster`, `root` tracks its variables: the
  closure it would rebuild is named as the one built ahead was."""
  graph = cache.rebuilt_tag(str(kind), trace_cache_lib.tracked_variables(root))
  if graph is None:
    return False
  workers = dict(enumerate(cluster.addresses(spec_lib.JobType.WORKER)))
  return not to_ask(Record(os.path.join(cache.directory, RECORD)).read(),
                    record_key(graph), workers)


class Record:
  """Which workers hold which graph, in a JSON file: {key: [address]}."""

  def __init__(self, path: str):
    self.path = path
    self._lock = threading.Lock()

  def read(self) -> dict[str, list[str]]:
    try:
      with open(self.path, encoding="utf-8") as f:
        held = json.load(f)
    except (OSError, ValueError):
      return {}  # None yet, or damaged: ask every worker again.
    return held if isinstance(held, dict) else {}

  def add(self, key: str, address: str) -> None:
    with self._lock:
      held = self.read()
      held[key] = sorted(set(held.get(key, [])) | {address})
      try:
        files.write_json(self.path, held)
      except OSError as e:
        logging.warning("failover graphs: could not record %s in %s: %s", address, self.path, e)


class StandIn:
  """A variable as a failover coordinator will hold it: its name, dtype and shape,
  and a handle on its device to a variable that is never created."""

  def __init__(self, variable: tf.Variable, device: str, shared_name: str):
    self.name, self.dtype, self.shape = variable.name, variable.dtype, variable.shape
    with tf.device(device):
      self.handle = tf.raw_ops.VarHandleOp(dtype=variable.dtype, shape=variable.shape,
                                           shared_name=shared_name)


def stand_ins(variables: Mapping[tuple[str, int], tf.Variable], tag: str
              ) -> dict[tuple[str, int], StandIn] | None:
  """A stand-in for each of `variables` (`trace_cache.tracked_variables`) on its
  failover device; None if one is split between the ps (see the module doc)."""
  if any(shard > 0 for _, shard in variables):
    return None
  return {place: StandIn(variable, failover_device(variable.handle.device),
                         f"tfps_failover_stand_in_{tag}_{place[0]}")
          for place, variable in variables.items()}


class FailoverGraphs:
  """Has the workers optimize the failover cluster's written-out closure, once (`start`)."""

  def __init__(self, *, warm_call: Callable[..., Any], cache: trace_cache_lib.TraceCache,
               variables_root: Any, cluster: spec_lib.ClusterSpec, coordinator: Any):
    """`warm_call(cache, variables, kind, with_other=...)`: the full-size closure of
    `kind` (and, `with_other`, the one for other sizes) for `cache`'s cluster bound to
    `variables`, called to run nothing (`closures.TrainClosures.failover_warm_calls`);
    None if no stored trace fits."""
    self._warm_call = warm_call
    self._cache, self._root = cache, variables_root
    self._cluster, self._coordinator = cluster, coordinator
    self._started: set[str] = set()
    self._resources = {}  # Kept: TF forgets a per-worker resource nobody holds.
    self._other_asked = False  # The closure for other sizes rides with the first kind asked.
    self._activity = warm_up.Activity()

  def ran_since(self, moment: float) -> bool:
    """Whether a worker optimized a failover graph at some time since `moment`
    (`time.monotonic`): the loops it held up, which may come after `start`'s."""
    return self._activity.since(moment)

  def started(self, kind: str) -> bool:
    """Whether `start` was asked for `kind` already (it then makes nothing new)."""
    return str(kind) in self._started

  def start(self, kind: str = "full") -> bool:
    """Asks each worker that does not hold `kind`'s graphs yet, before its next closure;
    whether any was asked (the loop then waits for their optimization).

    `kind`: the full-size closure's ("full": written out; "fast": fast-start).
    Building ahead is an optimization: whatever fails is logged in one line
    and training goes on (a failover then optimizes the graph, as without).
    """
    kind = str(kind)
    if kind in self._started:
      return False
    self._started.add(kind)
    try:
      self._resources[kind] = self._start(kind)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("failover graphs: the %s closures not built ahead (%s: %s)", kind,
                      type(e).__name__, messages.one_line(e))
      return False
    return self._resources[kind] is not None

  def _start(self, kind: str):
    view = failover_view(self._cluster)
    if view is None:
      return None
    variables = stand_ins(trace_cache_lib.tracked_variables(self._root),
                          worker_functions.PROCESS_TAG)
    if variables is None:
      logging.info("failover graphs: a variable is split between the ps, so a failover "
                   "coordinator traces its closures anew: nothing to build ahead")
      return None
    cache = self._cache.in_cluster(view.as_dict()).extended(
        num_ps=view.num_tasks(spec_lib.JobType.PS))
    graph = cache.rebuilt_tag(kind, variables)  # That closure's trace.
    if graph is None:
      return None  # No stored trace fits: the failover coordinator traces too.
    record = Record(os.path.join(self._cache.directory, RECORD))
    key = record_key(graph)
    workers = dict(enumerate(view.addresses(spec_lib.JobType.WORKER)))
    asked = to_ask(record.read(), key, workers)
    if not asked:
      return None
    calls = self._warm_call(cache, variables, kind, with_other=not self._other_asked)
    if not calls:
      return None
    self._other_asked = self._other_asked or len(calls) > 1
    logging.info("failover graphs: %d worker(s) optimize the %s closures for the cluster a "
                 "ps failover would leave, ahead of need", len(asked), kind)
    return warm_up.warm_once(self._coordinator, calls, sorted(asked),
                             done=lambda index: record.add(key, asked[index]),
                             what=f"the failover cluster's {kind} closures",
                             activity=self._activity)
