"""`python -m tfps.commands.experiment_check NAME [KEY=VALUE ...]`: does the experiment load?

Its factory must import and be callable, and its settings (`--experiment_params`)
pass its module's `check_params`, if it has one (`coordinator.api.check_params`).

`tfps local` and `tfps chaos` run this before they start any task, so a user
module that does not import, or lacks its factory, is one line and exit 2
in the time an import takes, not after a whole cluster has started. A child
process, because the user's module usually imports TensorFlow, which the
command's own process (it lives as long as the run) should not hold.
Prints the one-line reason on stdout and exits 2, or exits 0.
"""

import sys

from tfps.base import errors
from tfps.commands import run_spec
from tfps.coordinator import api


def main(argv: list[str]) -> int:
  if len(argv) < 2:
    sys.stdout.write("usage: python -m tfps.commands.experiment_check NAME [KEY=VALUE ...]\n")
    return int(errors.ExitCode.USAGE)
  try:
    api.load_factory(argv[1])
    api.check_params(argv[1], run_spec.parse_params(argv[2:]))
  except errors.UsageError as e:
    sys.stdout.write(f"{e}\n")
    return int(errors.ExitCode.USAGE)
  return int(errors.ExitCode.OK)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
