"""Where train loops end and which loop ends save (tfps.coordinator.loop_ends), no TensorFlow."""

import pytest

from tfps.base import errors
from tfps.coordinator import loop_ends


def test_slack_is_under_half_a_closure_and_half_an_interval():
  assert loop_ends.slack_for(50, 200) == 24
  assert loop_ends.slack_for(50, 20) == 9
  assert loop_ends.slack_for(1, 200) == 0
  assert loop_ends.slack_for(5, 1) == 0


def test_without_slack_loops_end_exactly_on_boundaries():
  ends = loop_ends.LoopEnds(steps_per_loop=40, checkpoint_interval=100)
  assert [ends.next_loop(step) for step in (0, 40, 80, 90, 100, 199)] == [40, 40, 20, 10, 40, 1]
  assert ends.save_due(100, 0) and not ends.save_due(99, 0) and ends.save_due(250, 100)


def test_a_loop_short_of_its_boundary_by_the_slack_reached_it():
  ends = loop_ends.LoopEnds(steps_per_loop=200, checkpoint_interval=200, slack=24)
  assert ends.next_loop(0) == 200
  # The loop ended one step short: it saves, and the next aims at 400, not at 200.
  assert ends.save_due(199, 0)
  assert ends.next_loop(199) == 200
  assert ends.save_due(398, 199) and ends.next_loop(398) == 200
  # Further short than the slack: the boundary is still ahead.
  assert not ends.save_due(151, 0) and ends.next_loop(151) == 49
  assert ends.save_due(176, 0) and ends.next_loop(176) == 200


def test_no_loop_of_a_few_steps_to_reach_a_boundary_left_just_ahead():
  ends = loop_ends.LoopEnds(steps_per_loop=200, checkpoint_interval=200, slack=24)
  # 25 short of 200 (not reached): a loop of 200 passes it and saves, no loop of 25.
  assert ends.next_loop(175) == 200 and ends.save_due(375, 175 - 1)
  assert min(ends.next_loop(step) for step in range(2000)) == 49
  exact = loop_ends.LoopEnds(steps_per_loop=200, checkpoint_interval=200)
  assert exact.next_loop(190) == 10  # Without slack loops land on boundaries.


def test_a_run_of_loops_ending_short_saves_once_per_boundary():
  ends = loop_ends.LoopEnds(steps_per_loop=200, checkpoint_interval=200, slack=24)
  step, last_saved, saves = 0, 0, []
  for shortfall in (1, 0, 3, 24, 0, 1, 2):
    step += ends.next_loop(step) - shortfall
    if ends.save_due(step, last_saved):
      last_saved = step
      saves.append(step)
  # 24 short of a 200-step loop is 28 short of its boundary (772): the next loop passes it.
  assert saves == [199, 399, 596, 972, 1171, 1369]
  assert [ends.boundaries_reached(step) for step in saves] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("kwargs,message", [
    (dict(steps_per_loop=0, checkpoint_interval=10), "steps_per_loop (0) must be a positive"),
    (dict(steps_per_loop=5, checkpoint_interval=True), "checkpoint_interval (True) must be"),
    (dict(steps_per_loop=5, checkpoint_interval=10, slack=10), "loop slack (10) must be"),
    (dict(steps_per_loop=5, checkpoint_interval=10, slack=-1), "loop slack (-1) must be"),
])
def test_bad_settings_name_the_field(kwargs, message):
  with pytest.raises(errors.UsageError) as e:
    loop_ends.LoopEnds(**kwargs)
  assert str(e.value).startswith(message)
