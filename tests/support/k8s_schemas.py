"""Rendered Kubernetes objects checked against published schemas and API types.

* Core objects (a Job, a NetworkPolicy): `kubernetes-validate`'s strict
  schemas of the Kubernetes API, which reject any field the API does not
  have; checked against the oldest version whose GA fields we use and the
  newest the validator knows.
* A JobSet: the generated models of its API types (`kubeflow-trainer-api`
  embeds JobSet v1alpha2 with the Kubernetes types). They check types and
  Kubernetes' enums but drop a field they do not know, so the object must
  also come back unchanged from a round trip: a misspelt or misplaced field
  does not. JobSet's own enums are not in the models' types, only in their
  field descriptions, and are read from there.
* A TFJob's pod templates: the `kubernetes` client's models, round-tripped.
"""

import json
import re

import kubernetes_validate
from kubeflow_trainer_api import models as trainer_models

# backoffLimitPerIndex and podFailurePolicy are GA from Kubernetes 1.33.
KUBERNETES_VERSIONS = ("1.33", kubernetes_validate.latest_version())


def validate_core(obj: dict) -> None:
  for version in KUBERNETES_VERSIONS:
    kubernetes_validate.validate(obj, version, strict=True)


def validate_jobset(obj: dict) -> None:
  parsed = trainer_models.JobsetV1alpha2JobSet.from_dict(obj)
  round_trip = parsed.to_dict()
  assert round_trip == obj, _first_difference(obj, round_trip)
  spec = obj["spec"]
  actions = _valid_values(trainer_models.JobsetV1alpha2FailurePolicyRule, "action")
  for rule in spec.get("failurePolicy", {}).get("rules", ()):
    assert rule["action"] in actions, (rule["action"], actions)
  if "successPolicy" in spec:
    assert spec["successPolicy"]["operator"] in {"All", "Any"}  # Its description's two values.
  for rjob in spec["replicatedJobs"]:
    validate_core({"apiVersion": "batch/v1", "kind": "Job",
                   "metadata": {"name": f"{obj['metadata']['name']}-{rjob['name']}-0"},
                   "spec": rjob["template"]["spec"]})


def validate_client_model(obj: dict, model: str) -> None:
  import kubernetes  # pylint: disable=import-outside-toplevel
  api = kubernetes.client.ApiClient()
  parsed = api.deserialize(json.dumps(obj), model, "application/json")
  assert api.sanitize_for_serialization(parsed) == obj


def _valid_values(model, field: str) -> set[str]:
  description = model.model_fields[field].description
  listed = re.search(r"Valid values are ([A-Za-z, ]+)\.", description)
  assert listed, f"{model.__name__}.{field}: no valid values in {description!r}"
  return {v.strip() for v in listed.group(1).split(",")}


def _first_difference(expected, got, path="") -> str:
  if isinstance(expected, dict) and isinstance(got, dict):
    for key in sorted(set(expected) | set(got)):
      if expected.get(key) != got.get(key):
        return _first_difference(expected.get(key), got.get(key), f"{path}.{key}")
  if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
    for i, (a, b) in enumerate(zip(expected, got)):
      if a != b:
        return _first_difference(a, b, f"{path}[{i}]")
  return f"{path or '.'}: rendered {expected!r}, the API types give {got!r}"
