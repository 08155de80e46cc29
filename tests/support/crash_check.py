"""The suite's one check for crashes in what tfps processes wrote.

Every test is watched (conftest's autouse fixture): the text files under the
session's temporary root (every tmp_path, the shared clusters' logs, and the
scratch directories of every tfps process, whose TMPDIR points there) are
read from where they stood before the test, and output a test captured in
memory is handed to `note`. Any line that reports a crash
(`tfps.base.fatal_output`) fails the test, unless the test is marked
`@pytest.mark.crash_output_expected("substring", ...)` for crashes it makes
on purpose.
"""

import os

from tfps.base import fatal_output

# Text that tfps processes and the tests write (checkpoints and other binary
# files are skipped).
_TEXT_SUFFIXES = (".log", ".stdout", ".stderr", ".jsonl", ".txt", ".out", ".json")
_captured: list[tuple[str, str]] = []  # (where, text) noted during the current test.


def note(text: str | bytes | None, where: str) -> None:
  """Output a test captured in memory (a child's stdout or stderr): checked at its end."""
  if text:
    _captured.append((where, text.decode(errors="replace") if isinstance(text, bytes) else text))


def reset() -> None:
  """Forgets output noted before the test that starts now."""
  _captured.clear()


def sizes(root: str) -> dict[str, int]:
  """The size of every text file under `root`."""
  found = {}
  for directory, _, names in os.walk(root):
    for name in names:
      if name.endswith(_TEXT_SUFFIXES):
        path = os.path.join(directory, name)
        try:
          found[path] = os.path.getsize(path)
        except OSError:
          pass  # Gone since the walk saw it.
  return found


def _new_text(path: str, offset: int) -> str:
  try:
    with open(path, "rb") as f:
      f.seek(offset)
      return f.read().decode("utf-8", errors="replace")
  except OSError:
    return ""


def fatal_since(root: str, before: dict[str, int], allowed: tuple[str, ...]) -> list[str]:
  """Crash lines written under `root` since `before`, and in output noted since; resets notes."""
  found = []
  for path, size in sizes(root).items():
    start = before.get(path, 0)
    if size > start or (size < start and size > 0):  # Grown, or written anew.
      text = _new_text(path, start if size > start else 0)
      lines = fatal_output.fatal_lines(
          text, allowed=allowed, tracebacks_expected=os.path.basename(path) == "errors.log")
      found += [f"{path}: {line}" for line in lines]
  for where, text in _captured:
    found += [f"{where}: {line}" for line in fatal_output.fatal_lines(text, allowed=allowed)]
  _captured.clear()
  return found
