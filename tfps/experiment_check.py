"""`python -m tfps.experiment_check NAME`: does the experiment's factory load?

`tfps local` and `tfps chaos` run this before they start any task, so a user
module that does not import, or lacks its factory, is one line and exit 2
in the time an import takes, not after a whole cluster has started. A child
process, because the user's module usually imports TensorFlow, which the
command's own process (it lives as long as the run) should not hold.
Prints the one-line reason on stdout and exits 2, or exits 0.
"""

import sys

from tfps.base import errors
from tfps.coordinator import api


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    sys.stdout.write("usage: python -m tfps.experiment_check NAME\n")
    return int(errors.ExitCode.USAGE)
  try:
    api.load_factory(argv[1])
  except errors.UsageError as e:
    sys.stdout.write(f"{e}\n")
    return int(errors.ExitCode.USAGE)
  return int(errors.ExitCode.OK)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
