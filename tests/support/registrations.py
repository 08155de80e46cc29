"""Records the functions the eager context registers with (or removes from) every task.

Under `ParameterServerStrategy` each registration and removal waits for every
task, a paused worker's too: tests check that a step makes none where a paused
worker would hold the coordinator.
"""

REGISTER = ("add_c_function", "add_function_def")
REMOVE = ("remove_function",)


def record(monkeypatch, names=REGISTER) -> list[str]:
  """From now on (for the test), the name of each of `names` called, in order."""
  from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
  calls = []
  for name in names:
    original = getattr(context.Context, name)
    monkeypatch.setattr(context.Context, name, lambda self, f, name=name, original=original: (
        calls.append(name), original(self, f))[1])
  return calls
