"""Names for the functions a coordinator runs on workers, safe for their graph cache.

A worker keeps the graphs TensorFlow optimized for it on disk and reads one
back by the function's name, without TensorFlow's per-process counter at its
end (`ps_worker.graph_cache`), whatever the graph and the cluster it was
placed for. So each name tfps schedules under stands for one graph in one
cluster:

* a function this coordinator traces is named with this process's own random
  tag and a count (`traced`): the next coordinator traces its own, maybe for
  another cluster, and never reads this one's; and one process that builds
  several trainers (the bench's sizes, one after the other on one cluster)
  gives each its own name. Each name is traced once (its arguments' specs are
  fixed), so no two traces share a name. Before the count, the bench's second
  size read back the first size's optimized graph (same name, same node count)
  and failed on a shape;
* a function rebuilt from a stored trace (`trace_cache`) is named after what
  decides its optimized graph (`rebuilt_suffix`): the stored graph, where its
  ops were moved, the cluster's shape as a placed graph sees it (`placement`)
  and the TensorFlow version. The next coordinator of the same shape gives it
  the same name, and its workers read the graph they optimized for the last
  one instead of optimizing it again.

A placed graph names devices (`/job:ps/replica:0/task:0`), never addresses,
so the shape is each worker's address in order (a renumbered worker would
otherwise read a graph placed for another) and how many tasks each other job
has. A ps's address is not in it: the coordinators after losing ps:0 and
after losing ps:1 of two run the same graph on the one ps left, and their
workers read back the graph either one optimized.
"""

import collections
import functools
import hashlib
import itertools
import json
import secrets
from typing import Any, Callable, Mapping, Sequence

PROCESS_TAG = secrets.token_hex(6)
_REBUILT: collections.Counter = collections.Counter()
_TRACED = itertools.count()


def traced(name: str) -> str:
  """`name` for a function traced in this process: a new name at every call."""
  return f"{name}_{PROCESS_TAG}_{next(_TRACED)}"


def kind(name: str) -> str:
  """The `name` a function's name made by `traced` was made from (else `name` itself)."""
  return name.partition(f"_{PROCESS_TAG}_")[0]


def named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
  """`fn` (e.g. a bound method) as a function `tf.function` names `traced(name)`."""
  @functools.wraps(fn)  # Its signature too.
  def call(*args, **kwargs):
    return fn(*args, **kwargs)
  call.__name__ = call.__qualname__ = traced(name)
  return call


def placement(cluster: Mapping[str, Sequence[str]]) -> dict[str, Any]:
  """What of `cluster` ({job: [address]}) a worker's placed graph depends on:
  the workers' addresses in order, and the other jobs' sizes."""
  return {job: list(addresses) if job == "worker" else len(addresses)
          for job, addresses in cluster.items()}


def rebuilt_tag(*what: Any) -> str:
  """A hash of everything in `what` (JSON-able): the same in every process."""
  return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def rebuilt_suffix(*what: Any) -> str:
  """The suffix for a rebuilt function's names, from everything in `what` (JSON-able).

  The same `what` gets the same suffix in every process, told apart within
  one by a count (the first is the same everywhere).
  """
  tag = rebuilt_tag(*what)
  count = _REBUILT[tag]
  _REBUILT[tag] += 1
  return f"_{tag}x{count}"
