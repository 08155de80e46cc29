"""Task names for log lines (tfps.base.task_names)."""

import pytest

from tfps.base import task_names


@pytest.mark.parametrize("text, task", [
    ("/job:worker/replica:0/task:1/device:CPU:0", "worker:1"),
    ("/job:worker/replica:0/task:12", "worker:12"),
    ("/job:ps/task:0", "ps:0"),
    ("lost remote target /job:chief/replica:0/task:0 at 1.2.3.4:5", "chief:0"),
])
def test_the_first_task_a_text_names(text, task):
  assert task_names.find_task(text) == task
  assert task_names.task_or_device(text) == task


@pytest.mark.parametrize("text", ["every worker", "/job:worker", ""])
def test_a_text_without_a_task_names_none_and_is_shown_as_it_is(text):
  assert task_names.find_task(text) is None
  assert task_names.task_or_device(text) == text
