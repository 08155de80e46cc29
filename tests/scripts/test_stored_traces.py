"""scripts/stored_traces.py reads a coordinator's first loop from the progress log."""

import json
import os
import subprocess
import sys

from tests.support import paths


def test_the_measuring_script_reads_the_last_coordinators_first_loop(tmp_path):
  script = os.path.join(paths.SCRIPTS_DIR, "stored_traces.py")
  records = [{"step": 0, "time": 10.0, "restored": True}, {"step": 200, "time": 19.0},
             {"step": 200, "time": 30.0, "restored": True}, {"step": 400, "time": 32.5},
             {"step": 600, "time": 33.0}]
  (tmp_path / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  # In its own process: the script defines absl flags.
  result = subprocess.run(
      [sys.executable, "-c", "import runpy, sys; "
       "print(runpy.run_path(sys.argv[1])['first_loop'](sys.argv[2]))", script, str(tmp_path)],
      capture_output=True, text=True, timeout=60, check=True)
  assert result.stdout.strip() == "2.5"
