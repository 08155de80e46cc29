"""The timeline picture (tfps.chaos.timeline), drawn from progress records (no cluster)."""

import pytest

from tfps.chaos import timeline
from tfps.recovery import progress_log as progress_lib

from tests.support import fakes

P = progress_lib.Progress


@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_the_timeline_is_drawn_from_the_records(tmp_path, suffix):
  records = [P(step=0, time=0.0, restored=True), *fakes.steady_progress(0.0, 0, 10),
             P(step=800, time=30.0, restored=True), *fakes.steady_progress(30.0, 800, 5)]
  path = timeline.plot(str(tmp_path / f"run.{suffix}"), records,
                       [timeline.Mark(10.5, "ps:0 SIGKILL")], "steps lost 200, goodput 0.6")
  with open(path, "rb") as f:
    head = f.read(512)
  assert head.startswith(b"\x89PNG") if suffix == "png" else b"<svg" in head
  if suffix == "svg":
    with open(path, encoding="utf-8") as f:
      text = f.read()
    assert "ps:0 SIGKILL" in text and "goodput 0.6" in text
