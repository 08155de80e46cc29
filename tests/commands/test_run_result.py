"""The run's result records (tfps.commands.run_result), through their files."""

import dataclasses
import json

import pytest

from tfps.base import errors
from tfps.commands import run_result
from tfps.coordinator import api


def _chief_result(**overrides):
  values = dict(status=api.RunStatus.FINISHED, experiment="ctr", mode=api.Mode.TRAIN,
                global_step=12, start_step=0, train_steps=10, examples_per_sec=1.5,
                steps_per_sec=0.5, train_seconds=2.0, eval={"auc": 0.8}, checkpoint=None,
                model_dir="/m", input={"positioned": True})
  values.update(overrides)
  return api.CoordinatorResult(**values)


def test_result_records_round_trip_through_their_files(tmp_path):
  chief = _chief_result()
  run_result.write_coordinator(chief, str(tmp_path / "c.json"))
  assert run_result.read_coordinator(str(tmp_path / "c.json")) == chief
  record = run_result.RunResult(coordinator=chief, faults=2, restarts=1, steps_lost=3,
                                input={"positioned": True, "kept": 12})
  run_result.write(record, str(tmp_path / "r.json"))
  assert run_result.read(str(tmp_path / "r.json")) == record
  line = dataclasses.replace(record, task_restarts=4).as_dict()
  assert (line["global_step"], line["restarts"], line["task_restarts"]) == (12, 1, 4)
  assert line["input"] == {"positioned": True, "kept": 12} and line["status"] == "finished"
  assert "task_restarts" not in record.as_dict()  # Only where tfps local counted them.


def test_a_missing_or_foreign_result_is_a_permanent_error(tmp_path):
  with pytest.raises(errors.PermanentError, match="exited 0 but wrote no result"):
    run_result.read_coordinator(str(tmp_path / "none.json"))
  (tmp_path / "odd.json").write_text(json.dumps({"status": "finished", "colour": 1}))
  with pytest.raises(errors.PermanentError, match="not a coordinator result"):
    run_result.read_coordinator(str(tmp_path / "odd.json"))
