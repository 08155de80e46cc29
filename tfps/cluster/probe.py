"""`python -m tfps.cluster.probe FILE DEADLINE [TASK ...]`: readiness from inside a network.

A local cluster in a private network namespace cannot be reached from the
parent's namespace, so the parent runs this small program inside it. Exit 0
when every task answers; otherwise the one-line `ClusterUnreachableError`
on stderr, a JSON list of the unreachable tasks on stdout, and its exit code.
"""

import json
import sys

from tfps.cluster import readiness
from tfps.cluster import spec as spec_lib


def main(argv: list[str]) -> int:
  path, deadline, *names = argv[1:]
  cluster = spec_lib.from_json_file(path, job_name="ps", task_index=0).cluster
  tasks = [spec_lib.TaskId.parse(name) for name in names] or None
  try:
    readiness.wait_until_reachable(cluster, float(deadline), tasks=tasks)
  except readiness.ClusterUnreachableError as e:
    sys.stdout.write(json.dumps([str(t) for t in e.unreachable]) + "\n")
    sys.stderr.write(f"{e}\n")
    return int(e.exit_code)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
