"""The trace-ahead process's plumbing, with real processes (no TF).

What it stores, and that a coordinator runs it, is in test_positioned_input.py.
"""

import json
import os
import sys
import textwrap
import time

from tfps import run_command
from tfps import run_spec
from tfps.cluster import spec as spec_lib
from tfps.recovery import progress_log
from tfps.recovery import trace_ahead

# Stands in for `tfps run` in trace-ahead mode: says its layout and its priority.
_TRACER = textwrap.dedent("""
    import json, os, sys, time
    from tfps.recovery import trace_ahead
    print(json.dumps({"num_ps": os.environ[trace_ahead.ENV_VAR],
                      "idle": os.sched_getscheduler(0) == os.SCHED_IDLE,
                      "tmpdir": os.environ["TMPDIR"]}))
    sys.stdout.flush()
    if len(sys.argv) > 1:
      time.sleep(float(sys.argv[1]))
    sys.exit(int(os.environ.get("EXIT_CODE", "0")))
""")
_DEADLINE = 30.0


def _tracer(tmp_path, *args, env=None):
  return trace_ahead.TraceAhead(lambda: [sys.executable, "-c", _TRACER, *args],
                                env={**os.environ, **(env or {})}, num_ps=(2, 1),
                                stdout_dir=str(tmp_path))


def _advance_until_done(tracer):
  deadline = time.monotonic() + _DEADLINE
  while not tracer.done:
    assert time.monotonic() < deadline, f"trace-ahead processes not done in {_DEADLINE}s"
    tracer.advance()
    time.sleep(0.05)


def _said(tmp_path, num_ps):
  with open(tmp_path / f"trace-ahead-{num_ps}ps.stdout") as f:
    return json.loads(f.read())


def test_layouts_are_every_ps_and_one_less_where_a_ps_fails_over():
  assert trace_ahead.layouts(2, ps_failover=True) == (2, 1)
  assert trace_ahead.layouts(3, ps_failover=False) == (3,)
  assert trace_ahead.layouts(1, ps_failover=True) == (1,)  # No failover from the last ps.


def test_one_process_per_layout_one_after_the_other_at_idle_priority(tmp_path):
  tracer = _tracer(tmp_path, "0.5")
  tracer.advance()
  first = tracer._running[0]  # pylint: disable=protected-access
  tracer.advance()  # Still running: no second process beside it.
  assert tracer._running[0] is first  # pylint: disable=protected-access
  assert not (tmp_path / "trace-ahead-1ps.stdout").exists()
  _advance_until_done(tracer)
  assert first.returncode == 0
  for num_ps in (2, 1):
    assert _said(tmp_path, num_ps) == {"num_ps": str(num_ps), "idle": True,
                                       "tmpdir": str(tmp_path)}


def test_a_failed_layout_is_logged_and_the_next_one_still_runs(tmp_path, caplog):
  caplog.set_level("WARNING", logger="absl")
  tracer = _tracer(tmp_path, env={"EXIT_CODE": "3"})
  _advance_until_done(tracer)
  assert _said(tmp_path, 1)["num_ps"] == "1"
  assert "trace ahead for 2 ps exited with code 3" in caplog.text
  assert "trace ahead for 1 ps exited with code 3" in caplog.text


def test_close_ends_the_running_process_and_starts_no_more(tmp_path):
  tracer = _tracer(tmp_path, "600")
  tracer.advance()
  process = tracer._running[0]  # pylint: disable=protected-access
  started = time.monotonic()
  tracer.close()
  assert process.poll() is not None and time.monotonic() - started < 10
  assert tracer.done
  tracer.advance()
  assert tracer.done and not (tmp_path / "trace-ahead-1ps.stdout").exists()


class _Ended:
  pid, returncode = 1, 0

  def poll(self):
    return 0


def _launcher(model_dir, **spec):
  """The chief's launcher (run_command) over 2 ps, starting no coordinator process."""
  config = spec_lib.from_tf_config(json.dumps({
      "cluster": {"chief": ["localhost:1"], "ps": ["localhost:2", "localhost:3"],
                  "worker": ["localhost:4"]}, "task": {"type": "chief", "index": 0}}))
  made = run_command._CoordinatorLauncher(  # pylint: disable=protected-access
      config, run_spec.RunSpec(model_dir=str(model_dir), warm_standby=False, **spec),
      str(model_dir))
  made._coordinators.start = lambda excluded: (None, False)  # pylint: disable=protected-access
  return made


def test_a_new_run_traces_ahead_from_its_first_coordinators_start(tmp_path):
  launcher = _launcher(tmp_path)
  spawned = []
  launcher._trace_ahead._spawn = (  # pylint: disable=protected-access
      lambda argv, **kwargs: spawned.append((argv, kwargs)) or _Ended())
  launcher.start(0, frozenset())
  assert [kw["env"][trace_ahead.ENV_VAR] for _, kw in spawned] == ["2"]
  argv, kwargs = spawned[0]
  assert "--nosupervise" in argv and any(a.startswith("--run_spec=") for a in argv)
  assert kwargs["idle_priority"] and run_command.exit_report.ENV_VAR not in kwargs["env"]
  launcher.idle()  # Not trained yet: still the next layout once the first has ended.
  assert [kw["env"][trace_ahead.ENV_VAR] for _, kw in spawned] == ["2", "1"]
  launcher.idle()
  assert len(spawned) == 2 and launcher._trace_ahead.done  # pylint: disable=protected-access


def test_a_resumed_run_and_the_flags_leave_trace_ahead_out(tmp_path):
  progress_log.ProgressLog(str(tmp_path)).append(0, restored=True, now=0.0)
  assert _launcher(tmp_path)._trace_ahead is None  # pylint: disable=protected-access
  for flags in ({"trace_ahead": False}, {"trace_cache": False}, {"fast_start": False},
                {"mode": "eval"}):
    fresh = tmp_path / "-".join(flags)
    fresh.mkdir()
    assert _launcher(fresh, **flags)._trace_ahead is None, flags  # pylint: disable=protected-access
  fresh = tmp_path / "no-failover"
  fresh.mkdir()
  launcher = _launcher(fresh, ps_failover=False)
  assert launcher._trace_ahead._pending == [2]  # pylint: disable=protected-access
