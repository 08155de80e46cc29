"""Where a faulty run's time went, from its progress log: the goodput's lost time, by part.

  python scripts/goodput_breakdown.py /tmp/soak/run-*/model

For each model_dir (a `tfps chaos` or soak run), and summed over all of
them: the wall time and what the kept steps would have taken at the run's
full speed (`chaos.goodput`), and the difference split into

* the run's start: up to the last loop before its first fault (the first
  event that is a failure or a death in the run's event log), less that
  time's steps at full speed: the first coordinator's start, its looped
  loops, its write-out, the failover graphs and the standbys built ahead;
  every fresh run pays it, whatever its faults (the parts below count what
  comes after it);
* between coordinators: from the last loop before a coordinator start to
  that start's `restored` record (the fault, waiting, the new process,
  connecting, building, restoring);
* first loops: from each `restored` record to the coordinator's first loop,
  less that loop's steps at full speed (tracing and instantiating);
* fast-start loops: loops marked `looped`, less their steps at full speed;
* rolled back: steps a restore took back, at full speed;
* the rest: worker faults, pauses, loops slower than the full speed.
"""

import sys

from tfps.chaos import goodput as goodput_lib
from tfps.recovery import events as events_lib
from tfps.recovery import progress_log

PARTS = ("the run's start", "between coordinators", "first loops", "fast-start loops",
         "rolled back", "the rest")
# Not a part: the seconds from the run's first record to the end of its start.
STARTED = "started"


def first_fault(events: list[events_lib.Event]) -> float | None:
  """When the run's first fault showed: its first failure or death; None if none."""
  times = [e.time for e in events if e.kind in ("failure", "died") or e.failure]
  return min(times) if times else None


def breakdown(records: list[progress_log.Progress],
              fault_at: float | None = None) -> dict[str, float]:
  """Seconds per part of one run's lost time, plus `wall` and `lost`; `fault_at`:
  when its first fault showed (`first_fault`)."""
  measured = goodput_lib.measure(records)
  speed = measured.fault_free_steps_per_sec
  parts = dict.fromkeys((*PARTS, STARTED), 0.0)
  previous = None
  first_after_restore = False
  if records and fault_at is not None:
    before = [r for r in records if r.time < fault_at]
    start, last = records[0], before[-1] if before else records[0]
    parts["the run's start"] = (last.time - start.time) - (last.step - start.step) / speed
    parts[STARTED] = last.time - start.time
    records = records[len(before) - 1:] if before else records
  for record in records:
    if previous is None:
      previous, first_after_restore = record, record.restored
      continue
    seconds = record.time - previous.time
    if record.restored:
      if not previous.restored:
        parts["between coordinators"] += seconds
      parts["rolled back"] += max(0, previous.step - record.step) / speed
      first_after_restore = True
    elif first_after_restore:
      parts["first loops"] += seconds - (record.step - previous.step) / speed
      first_after_restore = False
    elif record.looped:
      parts["fast-start loops"] += seconds - (record.step - previous.step) / speed
    previous = record
  lost = measured.wall_seconds - measured.kept_steps / speed
  parts["the rest"] = lost - sum(parts[part] for part in PARTS[:-1])
  return {**parts, "wall": measured.wall_seconds, "lost": lost}


def main(model_dirs: list[str]) -> int:
  if not model_dirs:
    print(__doc__, file=sys.stderr)
    return 2
  total = dict.fromkeys((*PARTS, STARTED, "wall", "lost"), 0.0)
  for model_dir in model_dirs:
    parts = breakdown(progress_log.ProgressLog(model_dir).read_new(),
                      first_fault(events_lib.EventLog(model_dir).read()))
    for key, value in parts.items():
      total[key] += value
    print(f"{model_dir}: wall {parts['wall']:.0f} s, lost {parts['lost']:.0f} s")
  print(f"all: wall {total['wall']:.0f} s, lost {total['lost']:.0f} s "
        f"(goodput {1 - total['lost'] / total['wall']:.1%})")
  for part in PARTS:
    print(f"  {part:22s} {total[part]:7.0f} s  {total[part] / total['lost']:6.1%}")
  after = total["wall"] - total[STARTED]
  if total[STARTED] and after > 0:
    lost_after = total["lost"] - total["the run's start"]
    print(f"after each run's start (from the last loop before its first fault): wall "
          f"{after:.0f} s, lost {lost_after:.0f} s (goodput {1 - lost_after / after:.1%})")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
