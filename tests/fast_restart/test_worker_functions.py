"""The names of the functions a coordinator runs on workers
(tfps.fast_restart.worker_functions), which make a worker's graph cache safe."""

import inspect
import subprocess
import sys

from tfps.fast_restart import worker_functions


def test_a_traced_function_is_named_for_this_process_only():
  first, second = worker_functions.traced("full_closure"), worker_functions.traced("full_closure")
  assert first.startswith(f"full_closure_{worker_functions.PROCESS_TAG}_")
  # One process may trace two closures of a kind (the bench's sizes, one after the
  # other): a worker's graph cache must not read one's graph for the other.
  assert first != second
  assert worker_functions.kind(first) == worker_functions.kind(second) == "full_closure"
  assert worker_functions.kind("full_closure_1234") == "full_closure_1234"
  other = subprocess.run(
      [sys.executable, "-c", "from tfps.fast_restart import worker_functions as w; "
       "print(w.PROCESS_TAG)"], capture_output=True, text=True, check=True, timeout=60)
  assert other.stdout.strip() not in ("", worker_functions.PROCESS_TAG)

  def run_shard(shard_index, num_batches=-1):
    """One shard."""
    return shard_index, num_batches

  named = worker_functions.named(run_shard, "run_shard")
  assert worker_functions.kind(named.__name__) == "run_shard"
  assert worker_functions.PROCESS_TAG in named.__name__
  assert named(1) == (1, -1) and named.__doc__ == "One shard."
  assert list(inspect.signature(named).parameters) == ["shard_index", "num_batches"]


def test_a_rebuilt_function_is_named_by_what_it_is_and_where_it_runs(monkeypatch):
  monkeypatch.setattr(worker_functions, "_REBUILT", worker_functions.collections.Counter())
  cluster = {"ps": ["a:1", "a:2"], "worker": ["a:3", "a:4"]}
  first = worker_functions.rebuilt_suffix({"library": "L"}, [], cluster, "2.20.0")
  # In this process again: another name (TensorFlow needs them unique).
  again = worker_functions.rebuilt_suffix({"library": "L"}, [], cluster, "2.20.0")
  assert first.endswith("x0") and again == first[:-1] + "1"
  renumbered = {"ps": ["a:1", "a:2"], "worker": ["a:4", "a:3"]}
  others = [worker_functions.rebuilt_suffix({"library": "M"}, [], cluster, "2.20.0"),
            worker_functions.rebuilt_suffix({"library": "L"}, ["ps:1->ps:0"], cluster, "2.20.0"),
            worker_functions.rebuilt_suffix({"library": "L"}, [], renumbered, "2.20.0"),
            worker_functions.rebuilt_suffix({"library": "L"}, [], cluster, "2.21.0")]
  assert all(o.endswith("x0") for o in others)
  assert len({o[:-2] for o in others} | {first[:-2]}) == 5
  # A new process (a new coordinator): the first one's name again.
  monkeypatch.setattr(worker_functions, "_REBUILT", worker_functions.collections.Counter())
  assert worker_functions.rebuilt_suffix({"library": "L"}, [], cluster, "2.20.0") == first
  # TensorFlow keys a stored graph on the name less its last "_" part: the suffix has none.
  assert "_" not in first[1:]


def test_a_placed_graph_depends_on_the_workers_order_and_the_other_jobs_sizes():
  cluster = {"chief": ["a:0"], "ps": ["a:1", "a:2"], "worker": ["a:3", "a:4"]}
  shape = worker_functions.placement(cluster)
  assert shape == {"chief": 1, "ps": 2, "worker": ["a:3", "a:4"]}
  # The one ps left after losing either of two: one graph.
  assert (worker_functions.placement({**cluster, "ps": ["a:1"]})
          == worker_functions.placement({**cluster, "ps": ["a:2"]}))
  assert worker_functions.placement({**cluster, "worker": ["a:4", "a:3"]}) != shape
  assert worker_functions.placement({**cluster, "ps": ["a:1"]}) != shape
