"""A hot standby's preparation (tfps.commands.coordinate._Ahead): when it may connect; no TF."""

import json

from tfps.cluster import readiness
from tfps.cluster import spec as spec_lib
from tfps.commands import coordinate
from tfps.commands import run_spec
from tfps.recovery import interrupts
from tfps.recovery import progress_log
from tfps.base import signals


def test_a_hot_standby_looks_at_the_cluster_only_once_the_holder_trained_since_it_started(
    tmp_path, monkeypatch):
  # One that replaces a retired standby starts while the cluster recovers: it
  # must not connect (nor take the workers' CPU) before training goes on.
  config = spec_lib.from_tf_config(json.dumps({
      "cluster": {"chief": ["localhost:1"], "ps": ["localhost:2"], "worker": ["localhost:3"]},
      "task": {"type": "chief", "index": 0}}))
  log = progress_log.ProgressLog(str(tmp_path))
  log.append(0, restored=True, now=0.0)
  log.append(100, now=1.0)  # Trained before the standby started: not since.
  probed = []
  monkeypatch.setattr(readiness, "reachable", lambda cluster, tasks, timeout:
                      probed.append(tasks) or set())  # Nobody answers: nothing more is done.
  ahead = coordinate._Ahead(config, run_spec.RunSpec(model_dir=str(tmp_path)),
                            interrupts.Interrupts(signals.StopSignals()),
                            str(tmp_path / "ready"), leave=lambda code: None)
  ahead.idle()
  log.append(100, restored=True, now=2.0)  # A new coordinator restored: not trained yet.
  ahead.idle()
  assert probed == []
  log.append(200, now=3.0)
  ahead.idle()
  assert len(probed) == 1 and ahead.prepared is None
