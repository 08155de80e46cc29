"""How many threads a ps or worker server needs (shared by real and in-process servers)."""


def inter_op_threads(num_workers: int) -> int:
  """Inter-op threads a ps or worker needs so that closures cannot starve each other.

  With fewer than `num_workers + 1` inter-op threads, servers on a 2-core
  machine deadlock when closures of several workers run at once: measured
  for workers (docs/tensorflow-behaviour.md; TF's own test helper applies the
  same rule) and for ps tasks (2 threads hang with 2 workers, 3 run).
  """
  return max(2, num_workers + 1)
