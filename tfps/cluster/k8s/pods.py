"""The parts every manifest format shares: the tfps container, its pod, the NetworkPolicy.

What a pod must get right whatever runs it:
  * `terminationGracePeriodSeconds` a little longer than tfps's
    `--grace_seconds`, so a preempted pod has time to warn the chief (ps,
    worker) or to save (chief) before SIGKILL;
  * the chief's control channel port (TF port + 1) declared on the chief;
  * a pod on a node that stops answering is evicted after
    `NODE_LOSS_TOLERATION_SECONDS`, not Kubernetes' default 300 s: tfps
    recovers from a replaced pod in seconds, so five minutes of waiting for a
    lost node (the chief's above all: nothing trains without it) is the cost;
  * `model_dir` on storage every restart of the chief sees again: a shared
    ReadWriteMany volume claim, or a bucket path (gs://, s3://) passed as is.
The TF ports are unauthenticated: every format also renders a NetworkPolicy
that admits traffic to the job's pods only from the job's own pods.
"""

from tfps.cluster.k8s import config as config_lib

_JobManifestConfig = config_lib.JobManifestConfig
NODE_LOSS_TOLERATION_SECONDS = 30
_NODE_LOSS_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def job_labels(config: _JobManifestConfig) -> dict:
  """Labels on every pod of the job: what the NetworkPolicy selects."""
  return {"app": "tfps", "tfps-job": config.name}


def container(config: _JobManifestConfig, *, name: str, chief: bool,
              cluster_args: tuple[str, ...] = (), env: tuple[dict, ...] = ()) -> dict:
  """The one container: `tfps run` with the run's every flag."""
  ports = [{"name": "tf", "containerPort": config_lib.TF_PORT, "protocol": "TCP"}]
  if chief:
    ports.append({"name": "tfps-control", "containerPort": config_lib.CONTROL_PORT,
                  "protocol": "TCP"})
  args = ["run", *cluster_args, f"--model_dir={config.model_dir}",
          f"--grace_seconds={config.grace_seconds:g}", *config.extra_flags]
  rendered = {
      "name": name,
      "image": config.image,
      "command": ["tfps"],
      "args": args,
      "ports": ports,
      "resources": {"requests": {"cpu": config.cpu, "memory": config.memory}},
  }
  if env:
    rendered["env"] = list(env)
  if _needs_volume(config):
    rendered["volumeMounts"] = [{"name": "model", "mountPath": config.model_mount}]
  return rendered


def pod_spec(config: _JobManifestConfig, container_spec: dict, **more) -> dict:
  """A pod spec around `container_spec` (`more`: format-specific pod fields)."""
  spec = {
      **more,
      "containers": [container_spec],
      "terminationGracePeriodSeconds":
          int(config.grace_seconds) + config_lib.GRACE_MARGIN_SECONDS,
      "tolerations": [{"key": taint, "operator": "Exists", "effect": "NoExecute",
                       "tolerationSeconds": NODE_LOSS_TOLERATION_SECONDS}
                      for taint in _NODE_LOSS_TAINTS],
  }
  if _needs_volume(config):
    spec["volumes"] = [{"name": "model",
                        "persistentVolumeClaim": {"claimName": config.volume_claim}}]
  return spec


def _needs_volume(config: _JobManifestConfig) -> bool:
  return bool(config.volume_claim) and not config.bucket_model_dir


def network_policy(config: _JobManifestConfig) -> dict:
  job_pods = {"matchLabels": {"tfps-job": config.name}}
  return {
      "apiVersion": "networking.k8s.io/v1",
      "kind": "NetworkPolicy",
      "metadata": {"name": f"{config.name}-private"},
      "spec": {
          "podSelector": job_pods,
          "policyTypes": ["Ingress"],
          # TF servers and the control channel run any request unauthenticated:
          # only the job's own pods may reach them.
          "ingress": [{"from": [{"podSelector": job_pods}],
                       "ports": [{"protocol": "TCP", "port": config_lib.TF_PORT},
                                 {"protocol": "TCP", "port": config_lib.CONTROL_PORT}]}],
      },
  }
