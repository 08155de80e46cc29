"""scripts/first_loops.py reads coordinator starts and first loops from chaos logs."""

import os
import subprocess
import sys

from tests.support import paths

SCRIPT = os.path.join(paths.SCRIPTS_DIR, "first_loops.py")

LOG = """\
I1123 16:36:41.244651 1 checkpoints.py:56] no checkpoint in /m; starting at step 0
I1123 16:36:41.530616 1 controller.py:278] train | step:      0 | training until step 45000...
I1123 16:36:58.742413 1 progress.py:104] step 50/45000 | 2.9 steps/s
I1123 16:36:59.742413 1 progress.py:104] step 250/45000 | 200.0 steps/s
I1123 16:37:07.452430 2 strategy.py:115] connected to 2 ps and 2 workers
I1123 16:37:08.000000 2 checkpoints.py:71] restored /m/ckpt-50 at step 50
W1123 16:37:08.674741 9 chaos_command.py:124] chaos: SIGKILL chief:0 (pid 13826)
I1123 16:37:24.243632 3 checkpoints.py:71] restored /m/ckpt-50 at step 50
I1123 16:37:41.476762 3 progress.py:104] step 100/45000 | 2.9 steps/s
"""


def test_each_start_to_its_first_progress_line_and_killed_starts_left_out(tmp_path):
  log = tmp_path / "chaos.log"
  log.write_text(LOG)
  result = subprocess.run([sys.executable, SCRIPT, str(log)], capture_output=True, text=True,
                          timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == ["2 starts, p50 17.4 s, min 17.2 s, max 17.5 s",
                                        "17.2 17.5"]


def test_logs_without_a_start_say_so(tmp_path):
  log = tmp_path / "chaos.log"
  log.write_text("I1123 16:36:59.742413 1 progress.py:104] step 250/45000\n")
  result = subprocess.run([sys.executable, SCRIPT, str(log)], capture_output=True, text=True,
                          timeout=60)
  assert result.returncode == 1 and "no coordinator start" in result.stderr
