"""Files that readers see whole or not at all."""

import json
import os
import tempfile
from typing import Any


def write_json(path: str, record: Any) -> None:
  """Writes `record` as JSON to `path` whole or not at all (a reader never sees half).

  Raises OSError (the temporary file removed) if it cannot be written.
  """
  directory = os.path.dirname(os.path.abspath(path))
  with tempfile.NamedTemporaryFile("w", dir=directory, suffix=".tmp", delete=False,
                                   encoding="utf-8") as f:
    try:
      json.dump(record, f)
    except BaseException:
      f.close()
      os.remove(f.name)
      raise
  try:
    os.replace(f.name, path)
  except OSError:
    os.remove(f.name)
    raise


def last_lines(path: str, count: int, *, max_bytes: int = 65536) -> tuple[str, ...]:
  """The last `count` lines of the file at `path` (from its last `max_bytes`); () if unreadable."""
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - max_bytes))
      text = f.read().decode("utf-8", errors="replace")
  except OSError:
    return ()
  return tuple(text.splitlines()[-count:])
