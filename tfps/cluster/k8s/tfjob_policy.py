"""A rendered TFJob as training-operator v1 (release-1.9) runs it: its pods and exits, pure.

The operator names pod and headless service `i` of replica type `R`
`<tfjob>-<r>-<i>` (`r` lower case) and writes into every pod
`TF_CONFIG` = {"cluster": {r: ["<tfjob>-<r>-<i>.<namespace>.svc:<port>", ...]},
"task": {"type": r, "index": i}}. When a pod fails, `restartPolicy` decides:
`ExitCode` deletes and recreates the pod when its exit code is retryable (>=
128) and fails the job otherwise; `OnFailure`/`Always` restart it; `Never`
fails the job. The job succeeds when its chief succeeds (with no chief: when
every worker has). `runPolicy.backoffLimit` is left out of what tfps renders
(`tfjob.py` says why), so it is not played.
"""

import dataclasses
import json
from typing import Mapping

from tfps.cluster.k8s import config as config_lib
from tfps.cluster.k8s import jobset_policy
from tfps.cluster.k8s.planned_pod import PlannedPod

Outcome = jobset_policy.Outcome
NAMESPACE = "default"


@dataclasses.dataclass(frozen=True)
class TFJobPolicy:
  restart_policies: Mapping[str, str]  # Replica type (lower case) -> restartPolicy.
  has_chief: bool

  @classmethod
  def of(cls, manifest: Mapping) -> "TFJobPolicy":
    specs = manifest["spec"]["tfReplicaSpecs"]
    return cls({rtype.lower(): spec.get("restartPolicy", "Never") for rtype, spec in specs.items()},
               has_chief="chief" in {r.lower() for r in specs})


def planned_pods(manifest: Mapping) -> list[PlannedPod]:
  """Every pod of the TFJob, with the TF_CONFIG the operator writes into it."""
  name = manifest["metadata"]["name"]
  specs = manifest["spec"]["tfReplicaSpecs"]
  cluster = {rtype.lower(): [f"{name}-{rtype.lower()}-{i}.{NAMESPACE}.svc:{config_lib.TF_PORT}"
                             for i in range(spec["replicas"])]
             for rtype, spec in specs.items()}
  pods = []
  for rtype, spec in specs.items():
    (container,) = spec["template"]["spec"]["containers"]
    for i in range(spec["replicas"]):
      role = rtype.lower()
      tf_config = json.dumps({"cluster": cluster, "task": {"type": role, "index": i},
                              "environment": "cloud"})
      pods.append(PlannedPod(
          replicated_job=role, index=i, hostname=f"{name}-{role}-{i}",
          subdomain=f"{NAMESPACE}.svc",
          argv=tuple(container["command"]) + tuple(container.get("args", ())),
          env=(("TF_CONFIG", tf_config),)))
  return pods


def after_exit(policy: TFJobPolicy, role: str, exit_code: int) -> Outcome:
  """What the operator does when a pod of `role` ends with `exit_code`."""
  if exit_code == 0:
    done = role == "chief" or (not policy.has_chief and role == "worker")
    return Outcome.SUCCEEDED if done else Outcome.INDEX_DONE
  restart = policy.restart_policies[role]
  if restart in ("OnFailure", "Always") or (restart == "ExitCode" and exit_code >= 128):
    return Outcome.REPLACE_POD
  return Outcome.FAILED
