"""Kubernetes manifests: a Kubeflow TFJob running `tfps run` on every replica.

The training operator creates one pod per replica and writes `TF_CONFIG`
into each, so every pod runs the same command, `tfps run`, and learns its
role from `TF_CONFIG` (docs/architecture.md). What the manifest must get right:

  * `restartPolicy: ExitCode`: the operator restarts a pod whose container
    exits with a code >= 128 (preempted 143, interrupted 130, cluster lost
    170) and treats 1-127 as permanent (1 failure, 2 bad usage); tfps's exit
    codes were chosen for exactly this;
  * `terminationGracePeriodSeconds` a little longer than tfps's
    `--grace_seconds`, so a preempted pod has time to warn the chief (ps,
    worker) or to save (chief) before SIGKILL;
  * the chief's control channel port (TF port + 1) declared on the chief;
  * `model_dir` on storage every restart of the chief sees again: a shared
    ReadWriteMany volume claim, or a bucket path (gs://, s3://) passed as is.

The TF ports are unauthenticated: the manifest also renders a NetworkPolicy
that admits traffic to the job's pods only from the job's own pods.
"""

import dataclasses

from tfps.base import errors
from tfps.base import settings

TF_PORT = 2222  # The training operator's default `tfjob-port`.
CONTROL_PORT = TF_PORT + 1  # recovery.notices: the chief's TF port + 1.
_CONTAINER = "tensorflow"  # The container name the training operator expects.
_MODEL_MOUNT = "/model"
# Time left after tfps's own grace period, for the process to exit.
_GRACE_MARGIN_SECONDS = 5


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobManifestConfig:
  """What to deploy.

  Attributes:
    name: the TFJob's name (a DNS label).
    image: container image with tfps installed.
    num_ps, num_workers: replica counts.
    model_dir: a bucket path (`gs://...`, `s3://...`), or a path under the
      shared volume claim `volume_claim` mounted at /model.
    volume_claim: name of a ReadWriteMany PersistentVolumeClaim, or None
      when `model_dir` is a bucket path.
    grace_seconds: tfps `--grace_seconds` (Spot pods get about 15).
    extra_flags: more `tfps run` flags (experiment, steps, ...).
    cpu, memory: resource requests per pod.
  """

  name: str
  image: str
  num_ps: int = 2
  num_workers: int = 2
  model_dir: str = f"{_MODEL_MOUNT}/run"
  volume_claim: str | None = "tfps-model"
  grace_seconds: float = settings.DEFAULTS["grace_seconds"]
  extra_flags: tuple[str, ...] = ()
  cpu: str = "1"
  memory: str = "2Gi"

  def __post_init__(self):
    import re
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", self.name):
      raise errors.UsageError(f"name ({self.name!r}) must be a DNS label (a-z, 0-9, -)")
    if not self.image:
      raise errors.UsageError("image: required (an image with tfps installed)")
    for field in ("num_ps", "num_workers"):
      if getattr(self, field) < 1:
        raise errors.UsageError(f"{field} ({getattr(self, field)}) must be a positive integer")
    bucket = self.model_dir.startswith(("gs://", "s3://"))
    if not bucket and not self.volume_claim:
      raise errors.UsageError(
          f"model_dir ({self.model_dir!r}) is not a bucket path, so volume_claim is required")
    if not bucket and not self.model_dir.startswith(_MODEL_MOUNT + "/"):
      raise errors.UsageError(
          f"model_dir ({self.model_dir!r}) must be under {_MODEL_MOUNT}/ (the shared volume)")
    if self.grace_seconds <= 2:
      raise errors.UsageError(f"grace_seconds ({self.grace_seconds}) must be more than 2")


def _pod_template(config: JobManifestConfig, role: str) -> dict:
  ports = [{"name": "tfjob-port", "containerPort": TF_PORT}]
  if role == "Chief":
    ports.append({"name": "tfps-control", "containerPort": CONTROL_PORT})
  args = ["run", f"--model_dir={config.model_dir}", f"--grace_seconds={config.grace_seconds:g}",
          *config.extra_flags]
  container = {
      "name": _CONTAINER,
      "image": config.image,
      "command": ["tfps"],
      "args": args,
      "ports": ports,
      "resources": {"requests": {"cpu": config.cpu, "memory": config.memory}},
  }
  spec = {
      "containers": [container],
      "terminationGracePeriodSeconds": int(config.grace_seconds) + _GRACE_MARGIN_SECONDS,
  }
  if config.volume_claim and not config.model_dir.startswith(("gs://", "s3://")):
    container["volumeMounts"] = [{"name": "model", "mountPath": _MODEL_MOUNT}]
    spec["volumes"] = [{"name": "model",
                        "persistentVolumeClaim": {"claimName": config.volume_claim}}]
  return {"metadata": {"labels": {"app": "tfps", "tfps-job": config.name}}, "spec": spec}


def render(config: JobManifestConfig) -> list[dict]:
  """The TFJob and its NetworkPolicy, as plain dicts (dump as YAML or JSON)."""
  replicas = {"Chief": 1, "PS": config.num_ps, "Worker": config.num_workers}
  tfjob = {
      "apiVersion": "kubeflow.org/v1",
      "kind": "TFJob",
      "metadata": {"name": config.name, "labels": {"app": "tfps"}},
      "spec": {
          # Pods are restarted in place by ExitCode; the job as a whole is
          # never retried by the operator (tfps's own budget decides).
          "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0},
          "tfReplicaSpecs": {
              role: {"replicas": count, "restartPolicy": "ExitCode",
                     "template": _pod_template(config, role)}
              for role, count in replicas.items()
          },
      },
  }
  job_pods = {"matchLabels": {"tfps-job": config.name}}
  policy = {
      "apiVersion": "networking.k8s.io/v1",
      "kind": "NetworkPolicy",
      "metadata": {"name": f"{config.name}-private"},
      "spec": {
          "podSelector": job_pods,
          "policyTypes": ["Ingress"],
          # TF servers and the control channel run any request unauthenticated:
          # only the job's own pods may reach them.
          "ingress": [{"from": [{"podSelector": job_pods}],
                       "ports": [{"protocol": "TCP", "port": TF_PORT},
                                 {"protocol": "TCP", "port": CONTROL_PORT}]}],
      },
  }
  return [tfjob, policy]
