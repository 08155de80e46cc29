"""`tfps k8s` output, checked against the Kubernetes Python client's models.

Each pod template (and the NetworkPolicy) is deserialised into the client's
model classes, which reject missing required fields and wrong types, and then
serialised back: the round trip must give exactly what we rendered, so a
misspelt or misplaced field (which deserialisation would silently drop) fails.
"""

import json

import pytest
import yaml

from tfps.cluster import k8s
from tfps.base import errors

kubernetes = pytest.importorskip("kubernetes")


def assert_valid_model(obj: dict, model: str):
  api = kubernetes.client.ApiClient()
  parsed = api.deserialize(json.dumps(obj), model, "application/json")
  assert api.sanitize_for_serialization(parsed) == obj


def test_the_validator_rejects_broken_templates():
  good = k8s.render(k8s.JobManifestConfig(name="v", image="i"))[0]
  template = good["spec"]["tfReplicaSpecs"]["PS"]["template"]
  assert_valid_model(template, "V1PodTemplateSpec")
  nameless = json.loads(json.dumps(template))
  del nameless["spec"]["containers"][0]["name"]
  with pytest.raises(ValueError, match="name"):
    assert_valid_model(nameless, "V1PodTemplateSpec")
  misplaced = json.loads(json.dumps(template))
  misplaced["spec"]["containers"][0]["terminationGracePeriodSeconds"] = 30  # A pod field.
  with pytest.raises(AssertionError):
    assert_valid_model(misplaced, "V1PodTemplateSpec")


@pytest.fixture
def documents(tfps):
  result = tfps(["k8s", "--job=ctr-spot", "--image=registry.example/tfps:0.1", "--num_ps=2",
                 "--num_workers=3", "--grace_seconds=25", "--train_steps=9000"])
  assert result.returncode == 0, result.stderr
  return list(yaml.safe_load_all(result.stdout))


def test_every_pod_template_is_a_valid_kubernetes_model(documents):
  tfjob, policy = documents
  assert (tfjob["apiVersion"], tfjob["kind"]) == ("kubeflow.org/v1", "TFJob")
  specs = tfjob["spec"]["tfReplicaSpecs"]
  assert {role: spec["replicas"] for role, spec in specs.items()} == {
      "Chief": 1, "PS": 2, "Worker": 3}
  for spec in specs.values():
    assert_valid_model(spec["template"], "V1PodTemplateSpec")
  assert_valid_model(policy, "V1NetworkPolicy")


def test_restart_policy_matches_the_exit_codes(documents):
  tfjob = documents[0]
  for spec in tfjob["spec"]["tfReplicaSpecs"].values():
    # ExitCode: the operator restarts on >= 128 and gives up on 1-127.
    assert spec["restartPolicy"] == "ExitCode"
  retryable = {c for c in errors.ExitCode if c.retryable}
  assert retryable == {errors.ExitCode.INTERRUPTED, errors.ExitCode.PREEMPTED,
                       errors.ExitCode.CLUSTER_LOST, errors.ExitCode.ADDRESS_IN_USE}
  assert all(c >= 128 for c in retryable)
  assert all(1 <= c < 128 for c in set(errors.ExitCode) - retryable - {errors.ExitCode.OK})


def test_every_replica_runs_tfps_run_with_the_grace_and_shared_model_dir(documents):
  for role, spec in documents[0]["spec"]["tfReplicaSpecs"].items():
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "tensorflow"  # What the operator injects TF_CONFIG into.
    assert container["command"] == ["tfps"] and container["args"][0] == "run"
    assert "--grace_seconds=25" in container["args"] and "--train_steps=9000" in container["args"]
    assert "--model_dir=/model/ctr-spot" in container["args"]
    assert pod["terminationGracePeriodSeconds"] > 25
    assert container["volumeMounts"] == [{"name": "model", "mountPath": "/model"}]
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "tfps-model"}
    ports = {p["containerPort"] for p in container["ports"]}
    assert ports == ({2222, 2223} if role == "Chief" else {2222})


def test_network_policy_admits_only_the_jobs_own_pods(documents):
  policy = documents[1]["spec"]
  assert policy["podSelector"] == {"matchLabels": {"tfps-job": "ctr-spot"}}
  (rule,) = policy["ingress"]
  assert rule["from"] == [{"podSelector": {"matchLabels": {"tfps-job": "ctr-spot"}}}]


def test_bucket_model_dir_needs_no_volume():
  tfjob, _ = k8s.render(k8s.JobManifestConfig(
      name="b", image="i", model_dir="gs://bucket/run", volume_claim=None))
  pod = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]
  assert "volumes" not in pod["spec"]
  assert "--model_dir=gs://bucket/run" in pod["spec"]["containers"][0]["args"]
  assert_valid_model(pod, "V1PodTemplateSpec")


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="Bad_Name"), "name ('Bad_Name') must be a DNS label"),
    (dict(image=""), "image: required"),
    (dict(num_workers=0), "num_workers (0) must be a positive integer"),
    (dict(model_dir="/model/x", volume_claim=None), "volume_claim is required"),
    (dict(model_dir="/elsewhere"), "must be under /model/"),
])
def test_bad_manifest_config(kwargs, message):
  args = dict(name="job", image="img")
  args.update(kwargs)
  with pytest.raises(errors.UsageError) as raised:
    k8s.JobManifestConfig(**args)
  assert message in str(raised.value)


def test_cli_bad_input_is_one_line_exit_2(tfps):
  result = tfps(["k8s", "--image="])
  assert result.returncode == 2 and "image: required" in result.stderr


# A value other than the default for every setting the chief reads: every
# field of ChiefConfig (but the cluster and model_dir, which the manifest
# gives) and every supervisor flag. A new setting the manifests would drop
# fails here until it is given a value (and forwarded).
_SUPERVISOR_FLAGS = {"max_restarts": "5", "restart_window": "333", "worker_timeout": "55",
                     "cluster_wait_seconds": "444", "warm_standby": "false"}
_CHIEF_VALUES = {"experiment": "pkg.mod:factory", "experiment_params": "a=1,b=2",
                 "mode": "train", "train_steps": "777", "steps_per_loop": "33",
                 "steps_per_closure": "11", "checkpoint_interval": "99", "max_to_keep": "7",
                 "eval_steps": "5", "eval_interval": "88", "eval_shards": "3",
                 "global_batch_size": "96", "seed": "4", "ready_timeout": "77",
                 "min_shard_bytes": "1234", "ps_timeout": "66", "input_shards": "9",
                 "train_epochs": "2"}


def _same(got: str, want: str) -> bool:
  """The same flag value, as absl writes it back (77 -> 77.0, false -> False)."""
  try:
    return float(got) == float(want)
  except ValueError:
    return got.lower() == want.lower()


def _chief_args(tfps, values):
  result = tfps(["k8s", "--job=every-flag", "--image=i", *(f"--{k}={v}" for k, v in values.items())])
  assert result.returncode == 0, result.stderr
  tfjob = list(yaml.safe_load_all(result.stdout))[0]
  return tfjob["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]["args"]


def test_every_run_setting_reaches_the_chief_of_the_manifest(tfps):
  import dataclasses  # pylint: disable=import-outside-toplevel
  from tfps.coordinator import api  # pylint: disable=import-outside-toplevel
  fields = {f.name for f in dataclasses.fields(api.ChiefConfig)} - {"cluster", "model_dir"}
  assert fields == set(_CHIEF_VALUES), fields ^ set(_CHIEF_VALUES)
  values = {**_CHIEF_VALUES, **_SUPERVISOR_FLAGS}
  by_epochs = _chief_args(tfps, {k: v for k, v in values.items() if k != "train_steps"})
  by_steps = _chief_args(tfps, {k: v for k, v in values.items() if k != "train_epochs"})
  for args, left_out in ((by_epochs, "train_steps"), (by_steps, "train_epochs")):
    given = dict(a[2:].split("=", 1) for a in args if a.startswith("--"))
    for name, value in values.items():
      if name != left_out:
        assert name in given and _same(given[name], value), (name, args)
    assert not any(a.startswith(f"--{left_out}=") for a in args), args
