"""A stored trace moved to another ps layout (tfps.fast_restart.trace_relocation).

The pure part (which task's variables went where, which ops move) on
hand-made function libraries; then, in a process of its own with an
in-process cluster of 2 ps (TensorFlow connects a process to one cluster),
closures traced with their variables on both ps and run again, untraced, by
a "failover coordinator" whose variables are all on ps:0, as after a ps
failover: the same results, and not one op left on ps:1.
"""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tensorflow.core.framework import function_pb2

from tfps.cluster import processes
from tfps.fast_restart import trace_relocation

pytestmark = pytest.mark.tf

PS0 = "/job:ps/replica:0/task:0/device:CPU:0"
PS1 = "/job:ps/replica:0/task:1/device:CPU:0"


def test_tasks_move_where_their_variables_went():
  moves = trace_relocation.task_moves([(PS0, PS0), (PS1, PS0), (PS1, PS0)])
  assert moves == {("ps", 0, 0): ("ps", 0, 0), ("ps", 0, 1): ("ps", 0, 0)}


def test_a_task_whose_variables_are_now_split_cannot_be_moved():
  with pytest.raises(trace_relocation.NotRelocatable, match="ps:0 held are now on more than"):
    trace_relocation.task_moves([(PS0, PS0), (PS0, PS1)])


def test_a_variable_on_another_device_of_its_task_cannot_be_moved():
  with pytest.raises(trace_relocation.NotRelocatable, match="another device of its task"):
    trace_relocation.task_moves([(PS0, "/job:ps/replica:0/task:0/device:GPU:0")])


def _library(*devices):
  library = function_pb2.FunctionDefLibrary()
  fdef = library.function.add()
  fdef.signature.name = "f"
  for i, device in enumerate(devices):
    node = fdef.node_def.add()
    node.name, node.op, node.device = f"n{i}", "NoOp", device
  return library


def test_ops_on_a_moved_task_follow_their_variables_and_no_other_op_moves():
  library = _library(PS1, "/job:ps/task:1", PS0, "/device:CPU:0", "",
                     "/job:worker/replica:0/task:1/device:CPU:0")
  moves = {("ps", 0, 0): ("ps", 0, 0), ("ps", 0, 1): ("ps", 0, 0)}
  assert trace_relocation.relocate(library, moves) == 2
  assert [n.device for n in library.function[0].node_def] == [
      PS0, "/job:ps/replica:0/task:0", PS0, "/device:CPU:0", "",
      "/job:worker/replica:0/task:1/device:CPU:0"]


def test_an_op_on_a_ps_no_variable_was_on_cannot_be_moved():
  library = _library(PS0, "/job:ps/replica:0/task:2/device:CPU:0")
  with pytest.raises(trace_relocation.NotRelocatable, match="op n1 is placed on ps:2"):
    trace_relocation.relocate(library, {("ps", 0, 0): ("ps", 0, 1)})


# In its own process (below): an in-process cluster of 2 ps, the caller the chief.

def _on_a_cluster_of_two_ps(work_dir: str) -> dict:
  """Traces on both ps, runs moved to ps:0 and refused when split; returns what it saw."""
  import logging  # pylint: disable=import-outside-toplevel
  from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel
  from tfps.cluster import inprocess  # pylint: disable=import-outside-toplevel
  from tfps.coordinator import closures as closures_lib  # pylint: disable=import-outside-toplevel
  from tfps.fast_restart import trace_cache  # pylint: disable=import-outside-toplevel

  cluster = inprocess.start(2, 1).cluster
  tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(cluster.as_dict()),
                                            job_name="chief")
  lines = []

  class Lines(logging.Handler):
    def emit(self, record):
      lines.append(record.getMessage())

  absl_logging.get_absl_logger().addHandler(Lines())
  absl_logging.set_verbosity(absl_logging.INFO)

  class Trainer(tf.Module):
    """A step whose updates sit on their variables' ps, as an optimizer's do under PSS."""

    def __init__(self, steps_on: str, row_on: str):
      super().__init__()
      with tf.device(steps_on):
        self.steps = tf.Variable(0, dtype=tf.int64)
      with tf.device(row_on):
        self.row = tf.Variable(tf.zeros([3]))

    def train_step(self, iterator):
      value = next(iterator)
      with tf.device(self.steps.device):
        self.steps.assign_add(1)
      with tf.device(self.row.device):
        self.row.assign_add(tf.constant([1.0, 2.0, 3.0]) * tf.cast(value, tf.float32))
      return {"value": tf.cast(value, tf.float32)}

  class Local:
    def schedule(self, fn, args=()):
      return fn(*args)

  def placed(fdef, seen=None) -> set:
    """The devices named in `fdef` and every function it calls, as the runtime has them."""
    from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
    seen = set() if seen is None else seen
    devices = set()
    for node in fdef.node_def:
      devices.add(node.device)
      called = [a.func.name for a in node.attr.values() if a.HasField("func")]
      called += [f.name for a in node.attr.values() for f in a.list.func]
      for name in called:
        if name not in seen:
          seen.add(name)
          devices |= placed(context.context().get_function_def(name), seen)
    return devices - {""}

  def make_iterator(shard, start):
    return iter(tf.data.Dataset.range(100).shard(2, shard).skip(start))

  def run(trainer, num_ps, directory=work_dir):
    cache = trace_cache.TraceCache(directory, {"experiment": "relocation", "num_ps": num_ps})
    closures = closures_lib.TrainClosures(
        trainer.train_step, make_iterator, full_size=4, unroll=4, what="Trainer",
        fast_unroll=2, cache=cache, variables_root=tf.train.Checkpoint(trainer=trainer))
    del lines[:]
    stored = closures.write_out_stored()
    source = (tf.constant(1, tf.int64), tf.constant(2, tf.int64))
    out = closures.schedule(Local(), 4, True, source)  # Written out,
    closures.schedule(Local(), 3, True, source)  # and one of another size;
    closures.concrete("fast")  # the fast-start one traced (or rebuilt), not run.
    traced = sum(f.experimental_get_tracing_count() for f in closures._functions.values())  # pylint: disable=protected-access
    devices = sorted(placed(closures.concrete("full").function_def))
    return {"stored": stored, "traced": traced, "value": float(out["value"].numpy()),
            "steps": int(trainer.steps.numpy()), "row": trainer.row.numpy().tolist(),
            "devices": devices, "log": list(lines)}

  def ahead_then_failover() -> dict:
    """A coordinator on 2 ps has the worker build the failover closure ahead; then one
    on ps:0 alone, as after a failover, rebuilds it: the same name (a new process:
    rebuilds counted from 0 again)."""
    from tfps.fast_restart import failover_graphs  # pylint: disable=import-outside-toplevel
    from tfps.fast_restart import worker_functions  # pylint: disable=import-outside-toplevel
    view = failover_graphs.failover_view(cluster)
    trainer = Trainer(PS0, PS1)
    root = tf.train.Checkpoint(trainer=trainer)
    cache = trace_cache.TraceCache(work_dir, {"experiment": "relocation", "num_ps": 2})
    closures = closures_lib.TrainClosures(
        trainer.train_step, make_iterator, full_size=4, unroll=4, what="Trainer",
        fast_unroll=2, cache=cache.in_cluster(cluster.as_dict()), variables_root=root)

    class Worker:
      """A ClusterCoordinator worker, which runs a resource at once in its device scope."""
      worker_index, device_name = 0, "/job:worker/replica:0/task:0"

      def create_resource(self, fn):
        with tf.device(self.device_name):
          fn()
        return object()

    # What warm_up reads of a ClusterCoordinator: its workers.
    cluster_workers = type("Cluster", (), {"workers": [Worker()]})
    coordinator = type("Coordinator", (), {"_cluster": cluster_workers})
    called = []

    def warm_call(cache, variables, kind, with_other):
      calls = closures.failover_warm_calls(cache, variables, kind, with_other=with_other)
      called.append([function.name.decode() for function, _ in calls])
      return calls

    def build_ahead():
      worker_functions._REBUILT.clear()  # pylint: disable=protected-access
      graphs = failover_graphs.FailoverGraphs(warm_call=warm_call, cache=closures.cache,
                                              variables_root=root, cluster=cluster,
                                              coordinator=coordinator)
      graphs.start("fast")  # A young run's loops: the fast-start closure,
      graphs.start("full")  # then the written-out one.

    # The failover coordinator's cache and variables: what it would ask of the record.
    one = Trainer(PS0, PS0)
    one_root = tf.train.Checkpoint(trainer=one)
    one_cache = trace_cache.TraceCache(work_dir, {"experiment": "relocation", "num_ps": 1}
                                       ).in_cluster(view.as_dict())
    holds = lambda: [failover_graphs.held(one_cache, kind, one_root, view)
                     for kind in ("fast", "full")]
    held_before = holds()
    build_ahead()
    held_after = holds()
    record = os.path.join(work_dir, failover_graphs.RECORD)
    with open(record, encoding="utf-8") as f:
      held = json.load(f)
    build_ahead()  # A later coordinator of the same chief: the worker holds it.
    worker_functions._REBUILT.clear()  # pylint: disable=protected-access
    after = closures_lib.TrainClosures(
        one.train_step, make_iterator, full_size=4, unroll=4, what="Trainer", fast_unroll=2,
        cache=one_cache, variables_root=one_root)
    return {"held_before": held_before, "held_after": held_after,
            "stored_here": [one_cache.stored_on_this_layout("full", one_root),
                            closures.cache.stored_on_this_layout("full", root)],
            "called": called,
            "failover": [after.concrete(kind).name.decode()
                         for kind in ("fast", "other", "full")],
            "held": held, "steps": int(trainer.steps.numpy()), "row": trainer.row.numpy().tolist()}

  on_both = run(Trainer(PS0, PS1), num_ps=2)
  ahead = ahead_then_failover()
  on_one = run(Trainer(PS0, PS0), num_ps=1)  # As after ps:1's failover.
  back = run(Trainer(PS0, PS1), num_ps=2)  # Its own layout's entry.
  # A run whose first trace was on one ps: that entry cannot serve 2 ps where
  # ps:0's variables are split.
  other_dir = work_dir + "-first-on-one"
  run(Trainer(PS0, PS0), num_ps=1, directory=other_dir)
  split = run(Trainer(PS0, PS1), num_ps=2, directory=other_dir)
  return {"on_both": on_both, "on_one": on_one, "back": back, "split": split, "ahead": ahead,
          "worker": cluster.as_dict()["worker"][0]}


def test_a_failover_coordinator_runs_the_closures_traced_on_both_ps_moved_to_one(tmp_path):
  # Spawned tied to this process: its servers never outlive the test.
  child = processes.spawn([sys.executable, __file__, str(tmp_path / "traces")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  try:
    out, err = child.communicate(timeout=180)
  finally:
    processes.stop_group(child, grace=0)
  assert child.returncode == 0, err.decode(errors="replace")[-3000:]
  seen = json.loads(out.decode().strip().splitlines()[-1])
  on_both, on_one = seen["on_both"], seen["on_one"]
  assert not on_both["stored"] and on_both["traced"] > 0
  assert PS1 in on_both["devices"] and PS0 in on_both["devices"]
  # Nothing traced on ps:0 alone: the stored trace, its ps:1 ops moved to ps:0.
  assert on_one["stored"] and on_one["traced"] == 0, on_one["log"]
  assert any("taken from the trace stored on 2 ps" in line for line in on_one["log"])
  assert PS1 not in on_one["devices"] and PS0 in on_one["devices"]
  # The same steps on the same input: shard 1 from its third element is 5, 7, 9, 11
  # in the written-out closure, then 5, 7, 9 in the one of 3 steps.
  for run in (on_both, on_one):
    assert run["value"] == 5 + 7 + 9 + 11 and run["steps"] == 4 + 3
    assert run["row"] == [53.0, 106.0, 159.0]
  assert seen["back"]["stored"] and seen["back"]["traced"] == 0
  split = seen["split"]
  assert not split["stored"] and split["traced"] > 0
  assert any("cannot be moved here: the variables ps:0 held are now on more than one task"
             in line for line in split["log"]), split["log"]
  assert split["row"] == [53.0, 106.0, 159.0]
  # Built ahead once (the second coordinator found the worker recorded), under the
  # name the failover coordinator's closure has, and nothing trained meanwhile.
  ahead = seen["ahead"]
  # Each kind (the closure for other sizes with the first), under the names the
  # failover coordinator's closures have, less TensorFlow's counter: the workers'
  # graph cache keys (ps_worker.graph_cache).
  key = lambda name: name.rsplit("_", 1)[0]
  fast, other, full = map(key, ahead["failover"])
  assert [list(map(key, names)) for names in ahead["called"]] == [[fast, other], [full]], ahead
  assert list(ahead["held"].values()) == [[seen["worker"]]] * 2
  assert ahead["steps"] == 0 and ahead["row"] == [0.0, 0.0, 0.0]
  # What a failover coordinator asks before it writes out (`PSTrainer._write_out_cold`):
  # its written-out trace was stored on 2 ps only, and its workers hold the graphs
  # once built ahead, not before.
  assert ahead["stored_here"] == [False, True]
  assert ahead["held_before"] == [False, False] and ahead["held_after"] == [True, True]

if __name__ == "__main__":
  print(json.dumps(_on_a_cluster_of_two_ps(sys.argv[1])))
