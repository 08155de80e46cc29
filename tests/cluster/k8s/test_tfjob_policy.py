"""The rendered TFJob as training-operator v1 runs it: its pods' TF_CONFIG and every exit."""

import json

import pytest

from tfps.base import errors
from tfps.cluster import spec as spec_lib
from tfps.cluster.k8s import config as config_lib
from tfps.cluster.k8s import tfjob
from tfps.cluster.k8s import tfjob_policy

Outcome = tfjob_policy.Outcome
MANIFEST = tfjob.render(config_lib.JobManifestConfig(name="j", image="i", num_ps=2,
                                                      num_workers=2))[0]
POLICY = tfjob_policy.TFJobPolicy.of(MANIFEST)


def test_every_pod_gets_the_operators_tf_config_and_tfps_reads_it():
  pods = tfjob_policy.planned_pods(MANIFEST)
  assert [p.hostname for p in pods] == ["j-chief-0", "j-ps-0", "j-ps-1", "j-worker-0",
                                        "j-worker-1"]
  for pod in pods:
    config = spec_lib.from_tf_config(dict(pod.env)["TF_CONFIG"])
    assert str(config.task) == f"{pod.replicated_job}:{pod.index}"
    assert config.address == f"{pod.dns_name}:2222"  # What the others dial: its service.
  assert json.loads(dict(pods[0].env)["TF_CONFIG"])["cluster"]["ps"] == [
      "j-ps-0.default.svc:2222", "j-ps-1.default.svc:2222"]


@pytest.mark.parametrize("role", ["chief", "ps", "worker"])
@pytest.mark.parametrize("code", [c for c in errors.ExitCode if c != errors.ExitCode.OK])
def test_exit_code_restarts_the_retryable_and_fails_on_the_rest(role, code):
  expected = Outcome.REPLACE_POD if code.retryable else Outcome.FAILED
  assert tfjob_policy.after_exit(POLICY, role, int(code)) == expected


def test_the_job_succeeds_with_its_chief():
  assert tfjob_policy.after_exit(POLICY, "chief", 0) == Outcome.SUCCEEDED
  assert tfjob_policy.after_exit(POLICY, "worker", 0) == Outcome.INDEX_DONE
