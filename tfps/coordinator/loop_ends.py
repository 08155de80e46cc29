"""Where the chief's train loops end, and which loop ends save a checkpoint.

Loops end on checkpoint boundaries (multiples of `checkpoint_interval`), so
that a save follows the loop that reaches one. With positioned input a loop
may end a few steps short of its boundary: when its planned closures are
scheduled and only a shard's tail is left (the default shards hold 49 or 50
batches of a loop's 4 closures of 50), a fifth closure for those few steps
would cost the loop its dispatch, a new input iterator and the tail of the
join (a few percent of the loop: docs/input.md). The loop ends there instead (`PSTrainer`'s
`loop_slack`), and the boundary counts as reached when the step is within
`slack` of it: the save follows, and the next loop aims at the boundary
after. The steps left over are trained in the next loop; nothing is skipped.

Pure Python (no TensorFlow).
"""

import dataclasses

from tfps.base import errors


def slack_for(steps_per_closure: int, checkpoint_interval: int) -> int:
  """Steps a loop may end short of its boundary: less than half a closure, or an interval."""
  return max(0, min((steps_per_closure - 1) // 2, (checkpoint_interval - 1) // 2))


@dataclasses.dataclass(frozen=True)
class LoopEnds:
  """Loop sizes and saves for `checkpoint_interval`, with loops ending up to `slack` short."""

  steps_per_loop: int
  checkpoint_interval: int
  slack: int = 0

  def __post_init__(self):
    for name in ("steps_per_loop", "checkpoint_interval"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise errors.UsageError(f"{name} ({value!r}) must be a positive integer")
    if not 0 <= self.slack < self.checkpoint_interval:
      raise errors.UsageError(f"loop slack ({self.slack}) must be at least 0 and below "
                              f"checkpoint_interval ({self.checkpoint_interval})")

  def boundaries_reached(self, step: int) -> int:
    """How many boundaries `step` has reached, counting one within `slack` as reached."""
    return (step + self.slack) // self.checkpoint_interval

  def next_loop(self, step: int) -> int:
    """Steps the loop starting at `step` asks for: up to the next boundary not yet reached.

    Where loops that ended short left that boundary only a few steps ahead
    (at most twice the slack), the loop aims at the one after: a loop of a
    few steps would cost a loop's overhead and leave its shards' chunks
    starting mid-shard. It saves all the same, having passed a boundary.
    """
    to_boundary = (self.boundaries_reached(step) + 1) * self.checkpoint_interval - step
    if to_boundary <= 2 * self.slack:
      to_boundary += self.checkpoint_interval
    return max(1, min(self.steps_per_loop, to_boundary))

  def save_due(self, step: int, last_saved: int) -> bool:
    """True when the loop ending at `step` reached a boundary the save at `last_saved` had not."""
    return self.boundaries_reached(step) > self.boundaries_reached(last_saved)
