"""One source of defaults: a run gets the documented defaults however it is started.

The documented defaults are `tfps.base.settings` (what `tfps CMD --help`
prints). A run started with `tfps local`, with `tfps run` from a rendered
manifest, or through the Python API (`CoordinatorConfig`, the supervisor's
and the local cluster's configs built with no arguments) must run with them.
"""

import dataclasses


from tfps.commands import local as local_command
from tfps.commands import chief
from tfps.commands import run_spec
from tfps.base import settings
from tfps.cluster.k8s import config as k8s_config
from tfps.cluster.k8s import jobset
from tfps.cluster.k8s import tfjob
from tfps.cluster import local
from tfps.cluster import spec as spec_lib
from tfps.coordinator import api
from tfps.recovery import policy
from tfps.recovery import supervisor

D = settings.DEFAULTS
CLUSTER = spec_lib.ClusterSpec.from_dict(
    {"chief": ["h:1"], "ps": ["h:2", "h:3"], "worker": ["h:4", "h:5"]})
# The coordinator's settings named as the flags are (0 turns ps_timeout and
# min_shard_bytes off on the command line, None in the config).
_COORDINATOR = ("experiment", "mode", "train_steps", "train_epochs", "input_shards",
                "steps_per_loop", "steps_per_closure", "fast_start", "trace_cache",
                "checkpoint_interval", "async_checkpoint", "max_to_keep", "eval_steps",
                "eval_interval", "eval_shards", "global_batch_size", "seed", "ready_timeout",
                "min_shard_bytes", "ps_timeout")


def _coordinator_defaults(config: api.CoordinatorConfig):
  got = {name: getattr(config, name) for name in _COORDINATOR}
  got["mode"] = got["mode"].value
  assert got == {name: D[name] for name in _COORDINATOR}
  assert dict(config.experiment_params) == {}


def _supervision_defaults(spec: run_spec.RunSpec):
  supervisor_config, watch = chief.supervision(spec)
  assert supervisor_config.policy == policy.RestartPolicy(
      max_restarts=D["max_restarts"], window_seconds=D["restart_window"],
      ps_failover=D["ps_failover"])
  assert supervisor_config.cluster_wait_seconds == D["cluster_wait_seconds"]
  assert supervisor_config.stop_grace_seconds == D["grace_seconds"]
  assert (watch.timeout, watch.ps_readmit_after) == (D["worker_timeout"], D["ps_readmit_after"])


def test_every_setting_has_one_flag_and_one_spec_field_with_its_default(parse_flags):
  assert {s.name for s in settings.RUN_SETTINGS} == set(run_spec.FIELDS)
  flags = parse_flags(["run"])
  for setting in settings.RUN_SETTINGS:
    default = flags[setting.name].default
    assert (tuple(default) if setting.kind == "list" else default) == setting.default
    assert flags[setting.name].help.endswith(setting.help), setting.name


def test_tfps_local_runs_with_the_documented_defaults(parse_flags, tmp_path):
  flags = parse_flags(["local", f"--model_dir={tmp_path}"])
  spec = local_command.local_spec(flags)
  assert dataclasses.replace(spec, model_dir=None) == run_spec.RunSpec()
  _coordinator_defaults(spec.coordinator_config(CLUSTER))
  _supervision_defaults(spec)
  assert local_command.cluster_config(flags, str(tmp_path)).ready_timeout == D["ready_timeout"]


def test_tfps_run_from_a_rendered_manifest_runs_with_the_documented_defaults(parse_flags):
  config = k8s_config.JobManifestConfig(
      name="j", image="i", extra_flags=tuple(run_spec.RunSpec().to_flags(
          leave_out=frozenset({"model_dir", "grace_seconds"}))))
  legacy = tfjob.render(config)[0]["spec"]["tfReplicaSpecs"].values()
  current = [r["template"]["spec"] for r in jobset.render(config)[0]["spec"]["replicatedJobs"]]
  for replica in [*legacy, *current]:
    args = replica["template"]["spec"]["containers"][0]["args"]
    spec = run_spec.from_flags(parse_flags(args))
    assert dataclasses.replace(spec, model_dir=None) == run_spec.RunSpec()
    _coordinator_defaults(spec.coordinator_config(CLUSTER))
    _supervision_defaults(spec)


def test_the_python_api_runs_with_the_documented_defaults():
  _coordinator_defaults(api.CoordinatorConfig(cluster=CLUSTER, model_dir="/m"))
  assert policy.RestartPolicy() == policy.RestartPolicy(
      max_restarts=D["max_restarts"], window_seconds=D["restart_window"],
      ps_failover=D["ps_failover"])
  assert supervisor.SupervisorConfig().cluster_wait_seconds == D["cluster_wait_seconds"]
  assert supervisor.SupervisorConfig().stop_grace_seconds == D["grace_seconds"]
  assert local.LocalClusterConfig().ready_timeout == D["ready_timeout"]
  assert k8s_config.JobManifestConfig(name="j", image="i").grace_seconds == D["grace_seconds"]
