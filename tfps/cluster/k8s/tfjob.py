"""The legacy format: a Kubeflow TFJob (training-operator v1) running `tfps run` everywhere.

The operator creates one pod per replica and writes `TF_CONFIG` into each.
`restartPolicy: ExitCode` restarts a pod whose container exits with a code
>= 128 (preempted 143, interrupted 130, cluster lost 170, port taken 171) and
fails the job on 1-127 (1 failure, 2 bad usage): tfps's exit codes were
chosen for exactly this.

No `runPolicy.backoffLimit`: the operator (release-1.9, `ReconcileJobs`)
fails the whole job when a pod has newly failed, not every replica is active,
and the job key's requeue count + 1 exceeds the limit. That check runs before
the pod with a retryable code is restarted, so a limit of 0 fails the job at
its first preemption, and any other limit counts controller requeues, not
failures. Unset, retryable codes restart pods and a permanent code (1, 2)
fails the job, which is the contract tfps wants.
"""

from tfps.base import errors
from tfps.cluster.k8s import config as config_lib
from tfps.cluster.k8s import pods

CONTAINER = "tensorflow"  # The container name the training operator writes TF_CONFIG into.


def render(config: config_lib.JobManifestConfig) -> list[dict]:
  """The TFJob and its NetworkPolicy, as plain dicts (dump as YAML or JSON)."""
  if config.chief_standby:
    # The operator writes one TF_CONFIG for a single chief replica.
    raise errors.UsageError("chief_standby: the TFJob format has one chief; "
                            "use --format=jobset for a standby chief")
  if config.elastic:
    # The operator writes each pod's TF_CONFIG from the replica counts: no room to grow.
    raise errors.UsageError(f"max_workers ({config.max_workers}): the TFJob format has a "
                            "fixed number of workers; use --format=jobset for elastic workers")
  replicas = {"Chief": 1, "PS": config.num_ps, "Worker": config.num_workers}
  tfjob = {
      "apiVersion": "kubeflow.org/v1",
      "kind": "TFJob",
      "metadata": {"name": config.name, "labels": {"app": "tfps"}},
      "spec": {
          "runPolicy": {"cleanPodPolicy": "Running"},
          "tfReplicaSpecs": {
              role: {"replicas": count, "restartPolicy": "ExitCode",
                     "template": _pod_template(config, chief=role == "Chief")}
              for role, count in replicas.items()
          },
      },
  }
  return [tfjob, pods.network_policy(config)]


def _pod_template(config: config_lib.JobManifestConfig, *, chief: bool) -> dict:
  container = pods.container(config, name=CONTAINER, chief=chief)
  container["ports"][0]["name"] = "tfjob-port"  # The port name the operator looks for.
  return {"metadata": {"labels": pods.job_labels(config)},
          "spec": pods.pod_spec(config, container)}
