"""A worker's on-disk cache of the function graphs TensorFlow optimized for it.

Every new coordinator (a chief restart, a ps failover) registers its train
closures with the workers again, and each worker places and optimizes the
written-out closure again: seconds per worker, most of what a ps or chief
fault costs (docs/recovery.md "Workers keep their optimized graphs"). TensorFlow can keep a worker's optimized
function graphs on disk and read them back instead (`TF_GRAPH_CACHING`, a
directory; read by the worker at every instantiation).

What TensorFlow does, and why this module and `fast_restart.worker_functions`
are careful with it:

* it stores a graph only when optimizing it took 3 s or more (fixed in
  TensorFlow), so only large closures are ever stored;
* its key is the function's name without its last `_` part (TensorFlow's
  per-process counter), the function's node count and `TF_JOB_NAME`: not
  its content, nor the cluster it was placed for;
* the stored graph keeps the devices it was placed on and is used as is.

So two functions of one name must never differ, in graph or in the cluster
they run in: the coordinator names every function it schedules so
(`fast_restart.worker_functions`), and each task has a directory of its own
(`task_directory`), as a graph placed for one worker would run its ops on
another if read by a third.

Files are pruned, oldest first, to `MAX_FILES` and `MAX_BYTES` per task
(checked at start and every `PRUNE_SECONDS`): a graph not stored is only
optimized again.
"""

import dataclasses
import hashlib
import os
import tempfile

from absl import logging

from tfps.cluster import spec as spec_lib

ENV = "TF_GRAPH_CACHING"
MAX_FILES = 16
MAX_BYTES = 1 << 30
PRUNE_SECONDS = 60.0


def default_root() -> str:
  return os.path.join(tempfile.gettempdir(), "tfps-graph-cache")


def task_directory(root: str, task: spec_lib.TaskId, address: str, server_config: bytes,
                   tf_version: str) -> str:
  """This task's own directory under `root`.

  Another address, server configuration or TensorFlow version (each may
  change what the worker makes of a graph) gets another directory.
  """
  digest = hashlib.sha256(b"\0".join(
      [address.encode(), server_config, tf_version.encode()])).hexdigest()[:12]
  return os.path.join(root, f"{task.job.value}-{task.index}-{digest}")


@dataclasses.dataclass(frozen=True)
class StoredGraph:
  path: str
  size: int
  modified_ns: int


def to_remove(files: list[StoredGraph], max_files: int = MAX_FILES,
              max_bytes: int = MAX_BYTES) -> list[str]:
  """The oldest of `files` beyond `max_files` or `max_bytes` in all."""
  kept, total, remove = 0, 0, []
  for stored in sorted(files, key=lambda f: f.modified_ns, reverse=True):
    if kept < max_files and total + stored.size <= max_bytes:
      kept, total = kept + 1, total + stored.size
    else:
      remove.append(stored.path)
  return remove


def prune(directory: str, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES) -> list[str]:
  """Removes the oldest stored graphs beyond the limits; returns their paths."""
  files = []
  try:
    with os.scandir(directory) as entries:
      for entry in entries:
        try:
          stat = entry.stat(follow_symlinks=False)
        except OSError:
          continue  # Gone meanwhile.
        if entry.is_file(follow_symlinks=False):
          files.append(StoredGraph(entry.path, stat.st_size, stat.st_mtime_ns))
  except OSError:
    return []
  removed = []
  for path in to_remove(files, max_files, max_bytes):
    try:
      os.remove(path)
      removed.append(path)
    except OSError:
      pass  # Gone meanwhile, or not ours to remove: the next prune tries again.
  return removed


def enable(directory: str) -> bool:
  """Makes TensorFlow in this process store and read optimized graphs in `directory`.

  False (logged) if the directory cannot be made: the task runs without.
  """
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError as e:
    logging.warning("graph cache: cannot use %s (%s); functions are optimized every time",
                    directory, e)
    return False
  prune(directory)
  os.environ[ENV] = directory
  return True
