"""Lines that say a process crashed, found in any output or log.

A crash can hide in a run that finished: a standby that segfaulted and was
replaced, a thread that died with a traceback while training went on. The
test suite (every test's logs and outputs) and `scripts/crash_hunt.py` look
for these lines with `fatal_lines`. Display only: no decision of the runtime
reads them.
"""

import re
from typing import Iterable

# What a crash writes: CPython's fatal-error report (faulthandler), the
# shell's and the kernel's words for a signal, absl's C++ failure-signal
# handler, a CHECK failure of TensorFlow's C++ code, and an uncaught Python
# exception.
_FATAL = re.compile(
    r"Fatal Python error"
    r"|Segmentation fault"
    r"|core dumped"
    r"|(?:^|\s)Aborted(?:\s|$)"
    r"|\*\*\* SIG[A-Z]+ received"
    r"|Check failed: "
    r"|^Traceback \(most recent call last\):")
# A traceback is what a details file (model_dir/errors.log) is for: there it is
# a record, not a crash.
TRACEBACK = "Traceback (most recent call last):"


def fatal_lines(text: str, *, tracebacks_expected: bool = False,
                allowed: Iterable[str] = ()) -> list[str]:
  """The lines of `text` that report a crash.

  Args:
    tracebacks_expected: the text is a file of tracebacks (errors.log).
    allowed: substrings that make a line expected (a test that kills on purpose).

  A traceback is reported as one line with the exception it ends in.
  """
  allowed = tuple(allowed)
  lines = text.splitlines()
  found = []
  for i, line in enumerate(lines):
    if not _FATAL.search(line):
      continue
    if line.startswith(TRACEBACK):
      if tracebacks_expected:
        continue
      line = f"{line} ... {_raised(lines[i + 1:])}"
    if not any(a in line for a in allowed):
      found.append(line)
  return found


def _raised(after: list[str]) -> str:
  """What a traceback raised: its first line that is not a frame (frames are indented)."""
  for line in after:
    if line and not line[0].isspace():
      return line
  return "(cut off)"
