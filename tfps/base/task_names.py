"""Task names as people read them ('worker:1'), from TensorFlow device strings."""

import re

_TASK_IN_DEVICE = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")


def find_task(text: str) -> str | None:
  """The first task `text` names: '/job:worker/replica:0/task:1/device:CPU:0' -> 'worker:1'."""
  named = _TASK_IN_DEVICE.search(text)
  return f"{named.group(1)}:{named.group(2)}" if named else None


def task_or_device(device: str) -> str:
  """The task a device string names, else the string itself (for a log line)."""
  return find_task(device) or device
