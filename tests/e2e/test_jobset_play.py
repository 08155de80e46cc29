"""The rendered manifests, played here: exact command, env, names and exit policies together.

`player` runs every pod of a `tfps k8s` JobSet (or TFJob) on a virtual host
named as the platform names it, with the env the pod would get, and does
what the controllers would do when a pod ends (read from the manifest). In
the JobSet, rendered with a standby chief (two chief pods), a worker, the ps
and the active chief are SIGKILLed in turn, each once training has gone on
after the previous one: the standby chief pod takes over, each killed pod
comes back as a new pod at a new address under its name (the chief's as the
standby), and the job must train to the end and succeed with both chief pods
done. An elastic JobSet's worker Job patched from 2 pods to 3 (as `kubectl
patch` does) grows the running job: the new pod trains. A bad value of a
flag must end the job at once, without a retry. The
legacy TFJob trains through a worker SIGKILL the same way. Skipped where
network namespaces cannot be made.
"""

import json
import os
import signal

import pytest

from tfps.cluster import hosts
from tfps.cluster.k8s import config as config_lib
from tfps.cluster.k8s import jobset
from tfps.cluster.k8s import jobset_policy
from tfps.cluster.k8s import player as player_lib
from tfps.cluster.k8s import tfjob
from tfps.recovery import progress_log

from tests.support import chief_run

pytestmark = pytest.mark.cluster

TRAIN_STEPS = 1000
# Killed in this order, each once the steps reached since the previous kill
# (recovered) reach STEPS_BETWEEN: far below TRAIN_STEPS, whatever the speed.
KILLS = ("play-worker-0-1", "play-ps-0-0", "play-chief-0-0")
STEPS_BETWEEN = 100
TRAINING = (f"--experiment_params={chief_run.SMALL_CTR}", "--mode=train",
            f"--train_steps={TRAIN_STEPS}", f"--steps_per_loop={chief_run.STEPS_PER_LOOP}",
            f"--steps_per_closure={chief_run.STEPS_PER_CLOSURE}",
            f"--checkpoint_interval={chief_run.CHECKPOINT_INTERVAL}", "--global_batch_size=128",
            # Nothing here restarts a coordinator inside a live chief (a killed
            # chief takes its standby with it): a standby would only take CPU.
            "--nowarm_standby")


@pytest.fixture(autouse=True)
def _needs_virtual_hosts():
  if (reason := hosts.unavailable()) is not None:
    pytest.skip(f"virtual hosts unavailable: {reason}")


def _manifest(volume: str, *flags: str, render=jobset.render, chief_standby=False) -> dict:
  return render(config_lib.JobManifestConfig(
      name="play", image="unused", num_ps=1, num_workers=2, model_mount=volume,
      model_dir=f"{volume}/run", grace_seconds=5, extra_flags=flags,
      chief_standby=chief_standby))[0]


class _KillSchedule:
  """Kills the next of `kills` once training has gone STEPS_BETWEEN steps past the last."""

  def __init__(self, model_dir: str, kills: tuple[str, ...]):
    self._progress = progress_log.ProgressLog(model_dir)
    self._kills = kills
    self._step, self._since = 0, 0
    self.killed: list[tuple[str, int]] = []  # (pod, step)

  def poll(self, player: player_lib.Player) -> None:
    trained = [r.step for r in self._progress.read_new() if not r.restored]
    self._step = max([self._step, *trained])
    if len(self.killed) < len(self._kills) and self._step >= self._since + STEPS_BETWEEN:
      pod = self._kills[len(self.killed)]
      assert player.pid(pod) is not None, f"{pod} is not running"
      player.kill(pod, signal.SIGKILL)
      self.killed.append((pod, self._step))
      self._since = self._step


def test_the_jobset_trains_to_the_end_through_a_worker_a_ps_and_a_chief_sigkill(tmp_path):
  volume = str(tmp_path / "volume")
  os.makedirs(f"{volume}/run")
  schedule = _KillSchedule(f"{volume}/run", KILLS)
  manifest = _manifest(volume, *TRAINING, chief_standby=True)
  with player_lib.jobset_player(manifest, str(tmp_path / "play")) as player:
    result = player.run(timeout=280, on_poll=schedule.poll)
  assert result.outcome == jobset_policy.Outcome.SUCCEEDED, result
  assert [pod for pod, _ in schedule.killed] == list(KILLS)
  # Each killed pod came back once, as a new pod; nothing else restarted.
  assert result.starts == {"play-chief-0-0": 2, "play-chief-0-1": 1, "play-ps-0-0": 2,
                           "play-worker-0-0": 1, "play-worker-0-1": 2}
  with open(f"{volume}/run/events.jsonl", encoding="utf-8") as f:  # The standby took over.
    took = [e["task"] for e in map(json.loads, f) if e.get("action") == "standby_chief_takes_over"]
  assert took == ["chief:1"]
  assert result.restarts == 0
  steps = [r.step for r in progress_log.ProgressLog(f"{volume}/run").read_new()]
  assert max(steps) == TRAIN_STEPS


def test_scaling_the_worker_job_up_grows_the_running_job(tmp_path):
  # Rendered elastic (`--max_workers=3`, 2 workers at start); once it trains,
  # the worker Job is patched to 3 pods as docs/deployment.md says
  # (`kubectl patch --type=json`, `jobset.worker_scale_patch`). The new pod
  # starts under its name; the chief takes it in and it runs closures.
  volume, model_dir = str(tmp_path / "volume"), str(tmp_path / "volume" / "run")
  os.makedirs(model_dir)
  training = [f for f in TRAINING if not f.startswith("--train_steps")] + [
      "--train_steps=10000000"]  # Watched until the new worker trains; then stopped.
  manifest = jobset.render(config_lib.JobManifestConfig(
      name="play", image="unused", num_ps=1, num_workers=2, max_workers=3,
      model_mount=volume, model_dir=model_dir, grace_seconds=5, extra_flags=tuple(training)))[0]
  progress = progress_log.ProgressLog(model_dir)
  records: list = []
  scaled: list = []

  def scale_once_training(player: player_lib.Player) -> None:
    records.extend(progress.read_new())
    if not scaled and any(r.step >= STEPS_BETWEEN for r in records if not r.restored):
      scaled.append((len(records), player.patch(jobset.worker_scale_patch(manifest, 3))))

  def new_worker_trains(_) -> bool:
    return bool(scaled) and any(dict(r.closures).get("worker:2")
                                for r in records[scaled[0][0]:])

  with player_lib.jobset_player(manifest, str(tmp_path / "play")) as player:
    result = player.run(timeout=280, on_poll=scale_once_training, until=new_worker_trains)
    assert result.outcome is None, result  # Still training, with the new worker.
    assert scaled[0][1] == (["play-worker-0-2"], [])
    assert result.starts == {"play-chief-0-0": 1, "play-ps-0-0": 1, "play-worker-0-0": 1,
                             "play-worker-0-1": 1, "play-worker-0-2": 1}
  before = records[:scaled[0][0]]
  assert not any(dict(r.closures).get("worker:2") for r in before)
  assert any(dict(r.closures).get("worker:1") for r in before)


def test_a_bad_flag_value_fails_the_jobset_without_a_retry(tmp_path):
  volume = str(tmp_path / "volume")
  os.makedirs(volume)
  manifest = _manifest(volume, "--train_steps=0")  # The chief refuses it: exit 2.
  with player_lib.jobset_player(manifest, str(tmp_path / "play")) as player:
    result = player.run(timeout=120)
  assert result.outcome == jobset_policy.Outcome.FAILED
  assert result.starts["play-chief-0-0"] == 1 and result.restarts == 0
  with open(tmp_path / "play" / "logs" / "play-chief-0-0.log", encoding="utf-8") as log:
    assert "tfps: error: train_steps (0) must be a positive integer" in log.read()


# The legacy format: its TF_CONFIG and exit-code rules are tested on their own
# (tests/cluster/k8s/test_tfjob*.py); the JobSet play above runs the same player.
@pytest.mark.soak
def test_the_legacy_tfjob_trains_to_the_end_through_a_worker_sigkill(tmp_path):
  volume = str(tmp_path / "volume")
  os.makedirs(f"{volume}/run")
  manifest = _manifest(volume, *TRAINING, render=tfjob.render)
  schedule = _KillSchedule(f"{volume}/run", ("play-worker-1",))
  with player_lib.tfjob_player(manifest, str(tmp_path / "play")) as player:
    result = player.run(timeout=280, on_poll=schedule.poll)
  assert result.outcome == jobset_policy.Outcome.SUCCEEDED, result
  assert schedule.killed and result.starts["play-worker-1"] == 2
  steps = [r.step for r in progress_log.ProgressLog(f"{volume}/run").read_new()]
  assert max(steps) == TRAIN_STEPS
