"""The run spec: parsed once from the flags, handed on whole (no TF, no cluster).

The every-setting tests give each field of `RunSpec` a value other than its
default and check that it arrives: in the file `tfps local` hands its chief,
in the chief's command line of a `tfps k8s` manifest. A new setting fails
them until it is given a value here, so none can be dropped on the way.
"""

import dataclasses
import json
import os

import pytest
import yaml

from tfps.commands import cli
from tfps.commands import local as local_command
from tfps.commands import run_spec
from tfps.base import errors
from tfps.cluster import local
from tfps.cluster import spec as spec_lib
from tfps.coordinator import api

# A value other than the default for every setting (as flags), but model_dir
# and the steps-or-epochs pair, which the tests give themselves.
EVERY_SETTING = {
    "experiment": "pkg.mod:factory", "experiment_params": "a=1,b=x:y", "mode": "train",
    "input_shards": "9", "steps_per_loop": "33", "steps_per_closure": "11",
    "max_closure_seconds": "1.5",
    "fast_start": "false", "trace_cache": "false", "async_checkpoint": "false",
    "checkpoint_interval": "99", "max_to_keep": "7", "eval_steps": "5", "eval_interval": "88",
    "eval_shards": "3", "global_batch_size": "96", "seed": "4", "ready_timeout": "77.5",
    "min_shard_bytes": "1234", "ps_timeout": "66.5", "max_restarts": "5",
    "restart_window": "333", "cluster_wait_seconds": "444", "worker_timeout": "55",
    "min_workers": "2",
    "grace_seconds": "21", "warm_standby": "false", "ps_failover": "false",
    "failover_graphs": "false", "rerun_slow_closures": "false",
    "ps_readmit": "timed", "ps_readmit_after": "12.5", "exclude_tasks": "worker:1",
    "chief_lease_seconds": "2.5", "lease_generation": "3",
}
STEPS_OR_EPOCHS = ({"train_steps": "777"}, {"train_epochs": "2"})


@pytest.fixture
def parse(parse_flags):
  """Parses `tfps ARGS` with the real flags into a RunSpec, as the command line does."""
  return lambda args: run_spec.from_flags(parse_flags(args))


def _flags(values):
  return [f"--{name}={value}" for name, value in values.items()]


def test_the_table_gives_every_setting_a_value_other_than_its_default(parse):
  given = set(EVERY_SETTING) | {"model_dir", "train_steps", "train_epochs"}
  assert given == set(run_spec.FIELDS), given ^ set(run_spec.FIELDS)
  default = run_spec.RunSpec()
  for steps_or_epochs in STEPS_OR_EPOCHS:
    spec = parse(["run", "--model_dir=/m", *_flags({**EVERY_SETTING, **steps_or_epochs})])
    same = [f for f in run_spec.FIELDS
            if getattr(spec, f) == getattr(default, f) and f not in ("train_steps", "train_epochs")]
    assert not same, same


def test_flag_defaults_are_the_specs_defaults(parse):
  assert parse(["run"]) == run_spec.RunSpec()


@pytest.mark.parametrize("steps_or_epochs", STEPS_OR_EPOCHS, ids=["steps", "epochs"])
def test_every_setting_reaches_the_chief_of_tfps_local(parse, tmp_path, monkeypatch,
                                                       steps_or_epochs):
  model_dir = str(tmp_path / "model")
  parse(["local", f"--model_dir={model_dir}", *_flags({**EVERY_SETTING, **steps_or_epochs})])
  spec = local_command.local_spec(cli.FLAGS)
  cluster = local.LocalCluster(local.LocalClusterConfig(num_ps=1, num_workers=2,
                                                         work_dir=model_dir))  # Starts nothing.
  os.makedirs(cluster.log_dir)
  chief_args = []
  monkeypatch.setattr(cluster, "add_chief", lambda args, **_: chief_args.extend(args))
  local_command.add_chief(cluster, spec)
  assert parse(["run", *chief_args]) == spec  # What the chief's `tfps run` reads.
  assert f"--result_file={local_command.chief_result_path(model_dir)}" in chief_args
  assert spec.train_steps == (777 if "train_steps" in steps_or_epochs else None)


def _manifest_args(tfps, values, manifest_format):
  result = tfps(["k8s", f"--format={manifest_format}", "--job=every-flag", "--image=i",
                 *_flags(values)])
  assert result.returncode == 0, result.stderr
  spec = list(yaml.safe_load_all(result.stdout))[0]["spec"]
  if manifest_format == "tfjob":
    pods = {role.lower(): r["template"] for role, r in spec["tfReplicaSpecs"].items()}
  else:
    pods = {r["name"]: r["template"]["spec"]["template"] for r in spec["replicatedJobs"]}
  return {role: pod["spec"]["containers"][0]["args"] for role, pod in pods.items()}


@pytest.mark.parametrize("manifest_format", ["jobset", "tfjob"])
@pytest.mark.parametrize("steps_or_epochs", STEPS_OR_EPOCHS, ids=["steps", "epochs"])
def test_every_setting_reaches_the_chief_of_a_k8s_manifest(tfps, parse, steps_or_epochs,
                                                          manifest_format):
  values = {"model_dir": "/model/every-flag", **EVERY_SETTING, **steps_or_epochs}
  args = _manifest_args(tfps, values, manifest_format)
  assert args["chief"][0] == "run"
  assert parse(args["chief"]) == parse(["k8s", *_flags(values)])
  # Every pod runs the same command line; the servers read their grace from it.
  for role in ("ps", "worker"):
    assert args[role] == args["chief"]
  assert parse(args["ps"]).grace_seconds == 21.0


def test_spec_file_round_trip(tmp_path):
  spec = run_spec.RunSpec(experiment_params={"a": "1"}, train_steps=None, train_epochs=3,
                          exclude_tasks=("worker:0",), model_dir="/m", warm_standby=False)
  path = run_spec.write(spec, str(tmp_path / "spec.json"))
  assert run_spec.read(path) == spec
  assert json.loads(open(path).read())["train_epochs"] == 3


@pytest.mark.parametrize("overrides, message", [
    ({"train_steps": 0}, "train_steps (0) must be a positive integer"),
    ({"train_epochs": 2}, "train_epochs (2) and train_steps (2000): give one of the two"),
    ({"train_steps": None}, "train_epochs (None) and train_steps (None): give one of the two"),
    ({"input_shards": 0}, "input_shards (0) must be a positive integer"),
    ({"steps_per_loop": True}, "steps_per_loop (True) must be a positive integer"),
    ({"max_restarts": -1}, "max_restarts (-1) must be >= 0"),
    ({"min_shard_bytes": -1}, "min_shard_bytes (-1) must be >= 0"),
    ({"worker_timeout": 0.0}, "worker_timeout (0.0) must be positive"),
    ({"min_workers": 0}, "min_workers (0) must be a positive integer"),
    ({"ps_timeout": -1.0}, "ps_timeout (-1.0) must be >= 0"),
    ({"ready_timeout": float("inf")}, "ready_timeout (inf) must be positive"),
    ({"mode": "sideways"}, "mode ('sideways') must be one of train, train_and_eval, eval"),
    ({"experiment": "nope"}, "experiment 'nope' is unknown"),
    ({"exclude_tasks": ("chief:0",)}, "exclude_tasks ('chief:0') must name workers or ps (worker:N, ps:N)"),
    ({"warm_standby": "yes"}, "warm_standby ('yes') must be true or false"),
])
def test_bad_settings_are_one_line_naming_flag_and_value(overrides, message):
  with pytest.raises(errors.UsageError) as raised:
    run_spec.RunSpec(**overrides)
  assert str(raised.value).startswith(message)


@pytest.mark.parametrize("args, message", [
    (["--train_epochs=2", "--train_steps=100"],
     "train_epochs (2) and train_steps (100): give one of the two"),
    (["--experiment_params=oops"], "--experiment_params: 'oops' must look like key=value"),
])
def test_bad_flags(parse, args, message):
  with pytest.raises(errors.UsageError) as raised:
    parse(["run", *args])
  assert str(raised.value).startswith(message)


def test_epochs_alone_leave_the_steps_unset(parse):
  spec = parse(["run", "--train_epochs=2"])
  assert (spec.train_steps, spec.train_epochs) == (None, 2)


def test_a_spec_file_and_run_flags_together_are_refused(parse, tmp_path):
  path = run_spec.write(run_spec.RunSpec(), str(tmp_path / "spec.json"))
  assert parse(["run", f"--run_spec={path}"]) == run_spec.RunSpec()
  with pytest.raises(errors.UsageError, match="do not also give --seed"):
    parse(["run", f"--run_spec={path}", "--seed=3"])


def test_a_spec_file_with_an_unknown_setting_is_refused(tmp_path):
  path = tmp_path / "spec.json"
  path.write_text(json.dumps({"train_stepz": 5}))
  with pytest.raises(errors.UsageError, match="unknown setting\\(s\\) train_stepz"):
    run_spec.read(str(path))


def test_chief_config_carries_the_coordinators_settings():
  cluster = spec_lib.ClusterSpec.from_dict(
      {"chief": ["h:1"], "ps": ["h:2"], "worker": ["h:3", "h:4"]})
  spec = run_spec.RunSpec(model_dir="/m", train_steps=None, train_epochs=2, input_shards=5,
                          ps_timeout=0.0, min_shard_bytes=0, exclude_tasks=("worker:0",))
  config = spec.coordinator_config(cluster)
  assert (config.train_steps, config.train_epochs, config.input_shards) == (None, 2, 5)
  assert config.ps_timeout is None and config.min_shard_bytes is None  # 0: off, as the flags.
  assert config.cluster.addresses(spec_lib.JobType.WORKER) == ("h:4",)
  assert config.tasks_left_out == ("worker:0",)
  assert config.tasks_expected_back == ("worker:0",)  # Taken back 5 s after it answers.


@pytest.mark.parametrize("failover, graphs, expected", [
    (True, True, True), (True, False, False), (False, True, False)])
def test_failover_graphs_are_built_ahead_only_where_the_supervisor_fails_over(
    failover, graphs, expected):
  cluster = spec_lib.ClusterSpec.from_dict(
      {"chief": ["h:1"], "ps": ["h:2", "h:5"], "worker": ["h:3"]})
  spec = run_spec.RunSpec(model_dir="/m", ps_failover=failover, failover_graphs=graphs)
  assert spec.coordinator_config(cluster).failover_graphs is expected
  assert api.CoordinatorConfig(cluster=cluster, model_dir="/m").failover_graphs is False


@pytest.mark.parametrize("readmit, expected", [("measured", ("worker:1",)),
                                               ("timed", ("ps:0", "worker:1"))])
def test_a_ps_left_out_is_expected_back_soon_only_when_taken_back_by_time(readmit, expected):
  cluster = spec_lib.ClusterSpec.from_dict(
      {"chief": ["h:1"], "ps": ["h:2", "h:5"], "worker": ["h:3", "h:4"]})
  spec = run_spec.RunSpec(model_dir="/m", exclude_tasks=("ps:0", "worker:1"), ps_readmit=readmit)
  config = spec.coordinator_config(cluster)
  assert config.tasks_left_out == ("ps:0", "worker:1")
  assert config.tasks_expected_back == expected


def test_an_elastic_coordinator_waits_for_its_workers_no_longer_than_worker_timeout():
  cluster = spec_lib.ClusterSpec.from_dict({"chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1"]})
  fixed = run_spec.RunSpec(model_dir="/m", worker_timeout=30.0)
  assert fixed.coordinator_config(cluster).workers_ready_timeout is None
  elastic = dataclasses.replace(fixed, min_workers=1)
  assert elastic.coordinator_config(cluster).workers_ready_timeout == 30.0
