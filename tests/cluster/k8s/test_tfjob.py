"""`tfps k8s --format=tfjob` (the legacy Kubeflow TFJob), checked against the API's models.

Each pod template is deserialised into the Kubernetes client's model classes,
which reject missing required fields and wrong types, and then serialised
back: the round trip must give exactly what we rendered, so a misspelt or
misplaced field (which deserialisation would silently drop) fails. The
NetworkPolicy is checked against the API's strict schema.
"""

import json

import pytest
import yaml

from tests.support import k8s_schemas
from tfps.base import errors
from tfps.cluster.k8s import config as config_lib
from tfps.cluster.k8s import tfjob

assert_valid_model = k8s_schemas.validate_client_model


def test_the_validator_rejects_broken_templates():
  good = tfjob.render(config_lib.JobManifestConfig(name="v", image="i"))[0]
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
  result = tfps(["k8s", "--format=tfjob", "--job=ctr-spot", "--image=registry.example/tfps:0.1", "--num_ps=2",
                 "--num_workers=3", "--grace_seconds=25", "--train_steps=9000"])
  assert result.returncode == 0, result.stderr
  return list(yaml.safe_load_all(result.stdout))


def test_every_pod_template_is_a_valid_kubernetes_model(documents):
  job, policy = documents
  assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "TFJob")
  specs = job["spec"]["tfReplicaSpecs"]
  assert {role: spec["replicas"] for role, spec in specs.items()} == {
      "Chief": 1, "PS": 2, "Worker": 3}
  for spec in specs.values():
    assert_valid_model(spec["template"], "V1PodTemplateSpec")
  k8s_schemas.validate_core(policy)


def test_no_backoff_limit_so_a_preempted_pod_does_not_fail_the_job(documents):
  # training-operator v1 fails a job with a newly failed pod once its requeues
  # + 1 exceed backoffLimit, before restarting a pod with a retryable code: a
  # limit of 0 failed the job at its first preemption (tfjob.py says more).
  assert "backoffLimit" not in documents[0]["spec"]["runPolicy"]


def test_restart_policy_matches_the_exit_codes(documents):
  for spec in documents[0]["spec"]["tfReplicaSpecs"].values():
    # ExitCode: the operator restarts on >= 128 and gives up on 1-127.
    assert spec["restartPolicy"] == "ExitCode"
  retryable = {c for c in errors.ExitCode if c.retryable}
  assert retryable == {errors.ExitCode.INTERRUPTED, errors.ExitCode.PREEMPTED,
                       errors.ExitCode.CLUSTER_LOST, errors.ExitCode.ADDRESS_IN_USE,
                       errors.ExitCode.SUPERSEDED}
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
  job, _ = tfjob.render(config_lib.JobManifestConfig(
      name="b", image="i", model_dir="gs://bucket/run", volume_claim=None))
  pod = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]
  assert "volumes" not in pod["spec"]
  assert "--model_dir=gs://bucket/run" in pod["spec"]["containers"][0]["args"]
  assert_valid_model(pod, "V1PodTemplateSpec")


def test_cli_bad_input_is_one_line_exit_2(tfps):
  result = tfps(["k8s", "--image="])
  assert result.returncode == 2 and "image: required" in result.stderr


# Every run setting arriving in the manifest: tests/commands/test_run_spec.py.
