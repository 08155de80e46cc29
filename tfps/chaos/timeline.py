"""A picture of a run under faults: training step over wall time.

`plot(path, records, faults, title)` draws, from the progress log, the global
step of every train loop over the run's seconds; each coordinator start as
a marker at the step it restored (a drop in the line is work rolled back by a
restore); and each injected fault as a vertical line labelled with its target
and signal. The title carries what the caller measured (steps lost, goodput).
Written as PNG or SVG by the file's extension, with matplotlib's non-interactive
backend (no display needed).
"""

import dataclasses
from typing import Sequence

from tfps.recovery import progress_log as progress_lib


@dataclasses.dataclass(frozen=True)
class Mark:
  """A fault to draw: `seconds` since the run's first record, and its label."""

  seconds: float
  label: str


def plot(path: str, records: Sequence[progress_lib.Progress], marks: Sequence[Mark],
         title: str) -> str:
  """Writes the timeline to `path` (.png or .svg); returns `path`."""
  import matplotlib  # pylint: disable=import-outside-toplevel  (heavy; only when drawing)
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

  if not records:
    raise ValueError("no progress records to draw")
  start = records[0].time
  figure, axes = pyplot.subplots(figsize=(10, 4.5), dpi=110)
  try:
    segment: list[tuple[float, int]] = []
    segments = []
    for record in records:
      if record.restored and segment:
        segments.append(segment)
        segment = []
      segment.append((record.time - start, record.step))
    segments.append(segment)
    for i, points in enumerate(segments):
      xs, ys = zip(*points)
      axes.plot(xs, ys, color="tab:blue", linewidth=1.4,
                label="global step (each line: one coordinator)" if i == 0 else None)
    restores = [(r.time - start, r.step) for r in records if r.restored]
    if restores:
      xs, ys = zip(*restores)
      axes.scatter(xs, ys, marker="o", color="tab:green", zorder=3, s=22,
                   label="coordinator started (restored step)")
    top = max(r.step for r in records) or 1
    for i, mark in enumerate(marks):
      axes.axvline(mark.seconds, color="tab:red", linewidth=1.0, alpha=0.7,
                   label="fault injected" if i == 0 else None)
      axes.text(mark.seconds, top * (0.97 - 0.07 * (i % 4)), f" {mark.label}", color="tab:red",
                fontsize=8, va="top")
    axes.set_xlabel("seconds since the run started")
    axes.set_ylabel("global step")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
  finally:
    pyplot.close(figure)
  return path
