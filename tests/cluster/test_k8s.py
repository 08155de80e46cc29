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


# Every run setting arriving in the manifest: tests/commands/test_run_spec.py.
