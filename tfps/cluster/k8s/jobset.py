"""The default format: a JobSet (jobset.x-k8s.io/v1alpha2) of plain Indexed Jobs.

One replicated job per role, `chief` (1 pod), `ps` and `worker` (one Indexed
Job each, a pod per task), and no TF_CONFIG: every pod runs
`tfps run --cluster_from=jobset` and derives the cluster from its own name
(`jobset_env`). What JobSet and Kubernetes do with each exit:

  * Pod level (each Job's `podFailurePolicy`, pods `restartPolicy: Never`):
    exit 1 or 2 (a failure tfps will not get past, bad usage) fails the Job
    at once; the retryable codes (130, 143, 170, 171, 172) and a disruption
    (preemption, eviction, node drain: the `DisruptionTarget` condition)
    are ignored, so the Job replaces the pod, under the same name at a new
    address, without counting it; anything else (137 from the OOM killer, a
    crash) counts toward the Job's backoff limit, so a crash loop ends.
  * Replacing a pod restarts only that task: the others keep running and tfps
    recovers (a lost worker's closures run elsewhere; a lost ps is failed
    over; a lost chief's replacement restores against the live ps).
  * Job level (`failurePolicy`): a Job failed by an exit of 1 or 2 fails the
    JobSet (no retries); a Job whose pods crashed past its backoff limit
    restarts the JobSet (every Job recreated, tfps resumes from its
    checkpoint), at most `MAX_JOBSET_RESTARTS` times. JobSet's `RestartJob`
    (recreate only the failed Job) is alpha in JobSet 0.12 and off by
    default, so it is not used. Workers count failures per index
    (`backoffLimitPerIndex`): a worker that keeps crashing is dropped and the
    job trains on with the others, as tfps does with a worker that stays
    away.
  * `successPolicy`: the JobSet succeeds when the chief's Job does; JobSet
    then deletes the ps and worker Jobs, whose servers never exit by
    themselves.

Elastic workers (`max_workers`): the same Jobs; the worker Job starts with
`num_workers` pods, every pod's command names `max_workers` workers
(`--max_workers`) and the chief trains once `--min_workers` answer. Scaling
the worker Job up to `max_workers` (its `completions` with `parallelism`,
which JobSet lets change with its `ElasticJobSet` feature gate) starts the
workers of the next indexes, and the chief takes them in. Per-index backoff
stays as it is: a crash-looping worker is still dropped alone.
"""

from tfps.base import errors
from tfps.cluster import spec as spec_lib
from tfps.cluster.k8s import config as config_lib
from tfps.cluster.k8s import jobset_env
from tfps.cluster.k8s import pods

API_VERSION = "jobset.x-k8s.io/v1alpha2"
CONTAINER = "tfps"
# Kubernetes' own default for a Job, written out: crashes no exit code explains.
BACKOFF_LIMIT = 6
MAX_JOBSET_RESTARTS = 3
PERMANENT_EXIT_CODES = tuple(sorted(
    int(c) for c in errors.ExitCode if c != errors.ExitCode.OK and not c.retryable))
RETRYABLE_EXIT_CODES = tuple(sorted(int(c) for c in errors.ExitCode if c.retryable))


def render(config: config_lib.JobManifestConfig) -> list[dict]:
  """The JobSet and its NetworkPolicy, as plain dicts (dump as YAML or JSON)."""
  jobset = {
      "apiVersion": API_VERSION,
      "kind": "JobSet",
      "metadata": {"name": config.name, "labels": {"app": "tfps"}},
      "spec": {
          "network": {"enableDNSHostnames": True, "subdomain": config.name,
                      # Tasks find each other while starting, before any is ready.
                      "publishNotReadyAddresses": True},
          "successPolicy": {"operator": "All",
                            "targetReplicatedJobs": [spec_lib.JobType.CHIEF.value]},
          "failurePolicy": {
              "maxRestarts": MAX_JOBSET_RESTARTS,
              "rules": [
                  {"name": "PermanentExit", "action": "FailJobSet",
                   "onJobFailureReasons": ["PodFailurePolicy"]},
                  {"name": "CrashLoop", "action": "RestartJobSet",
                   "onJobFailureReasons": ["BackoffLimitExceeded", "FailedIndexes"]},
              ],
          },
          "replicatedJobs": [_replicated_job(config, role) for role in jobset_env.ROLES],
      },
  }
  return [jobset, pods.network_policy(config)]


def worker_scale_patch(manifest: dict, workers: int) -> list[dict]:
  """The JSON patch (`kubectl patch jobset NAME --type=json -p ...`) that resizes an
  elastic JobSet's worker Job to `workers` pods: its `parallelism` and `completions`
  together, the only change JobSet's `ElasticJobSet` gate lets through.

  Raises:
    UsageError: not an elastic manifest of tfps's, or `workers` outside 1..max_workers.
  """
  names = [rjob["name"] for rjob in manifest["spec"]["replicatedJobs"]]
  worker = spec_lib.JobType.WORKER.value
  if worker not in names:
    raise errors.UsageError(f"the JobSet {manifest['metadata']['name']} has no {worker} job")
  rjob = manifest["spec"]["replicatedJobs"][names.index(worker)]
  (container,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
  most = next((int(a.split("=", 1)[1]) for a in container.get("args", ())
               if a.startswith("--max_workers=")), None)
  if most is None or not 1 <= workers <= most:
    raise errors.UsageError(f"workers ({workers}) must be between 1 and the JobSet's "
                            f"max_workers ({most if most is not None else 'none: not elastic'})")
  path = f"/spec/replicatedJobs/{names.index(worker)}/template/spec"
  return [{"op": "replace", "path": f"{path}/parallelism", "value": workers},
          {"op": "replace", "path": f"{path}/completions", "value": workers}]


def _replicated_job(config: config_lib.JobManifestConfig,
                    role: spec_lib.JobType) -> dict:
  count = _pods_at_start(config, role)
  job_spec = {
      "completionMode": "Indexed",
      "completions": count,
      "parallelism": count,
      "podFailurePolicy": {"rules": _pod_failure_rules()},
      "template": {
          "metadata": {"labels": pods.job_labels(config)},
          "spec": pods.pod_spec(config, _container(config, role), restartPolicy="Never",
                                **_apart(config, role)),
      },
  }
  if role == spec_lib.JobType.WORKER:
    job_spec["backoffLimitPerIndex"] = BACKOFF_LIMIT
  else:
    job_spec["backoffLimit"] = BACKOFF_LIMIT
  return {"name": role.value, "replicas": 1, "template": {"spec": job_spec}}


def _apart(config: config_lib.JobManifestConfig, role: spec_lib.JobType) -> dict:
  """A standby chief on another node than the chief: one node loss cannot take both."""
  if role != spec_lib.JobType.CHIEF or not config.chief_standby:
    return {}
  chiefs = {"matchLabels": {jobset_env.LABELS[jobset_env.JOBSET_NAME]: config.name,
                            jobset_env.LABELS[jobset_env.REPLICATED_JOB_NAME]: role.value}}
  return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
      {"labelSelector": chiefs, "topologyKey": "kubernetes.io/hostname"}]}}}


def _layout(config: config_lib.JobManifestConfig) -> jobset_env.JobSetLayout:
  """What the pods are told on their command line: the tasks of each role they name."""
  return jobset_env.JobSetLayout(num_ps=config.num_ps, num_workers=config.num_workers,
                                 port=config_lib.TF_PORT, chief_standby=config.chief_standby,
                                 max_workers=config.max_workers)


def _pods_at_start(config: config_lib.JobManifestConfig, role: spec_lib.JobType) -> int:
  """The Job's pods as rendered: elastic workers start at `num_workers`, with room for more."""
  if role == spec_lib.JobType.WORKER:
    return config.num_workers
  return _layout(config).count(role)


def _container(config: config_lib.JobManifestConfig, role: spec_lib.JobType) -> dict:
  layout = _layout(config)
  cluster_args = ("--cluster_from=jobset", f"--num_ps={layout.num_ps}",
                  f"--num_workers={layout.num_workers}",
                  *((f"--max_workers={layout.max_workers}",) if config.elastic else ()),
                  f"--task_port={layout.port}",
                  *(("--chief_standby",) if layout.chief_standby else ()),
                  *_min_workers(config, role))
  env = tuple(
      {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}
      for name, label in jobset_env.LABELS.items())
  env += ({"name": jobset_env.JOBSET_SUBDOMAIN, "value": config.name},)
  return pods.container(config, name=CONTAINER, chief=role == spec_lib.JobType.CHIEF,
                        cluster_args=cluster_args, env=env)


def _min_workers(config: config_lib.JobManifestConfig, role: spec_lib.JobType) -> tuple:
  """Elastic: the chief trains once the workers the Job starts with answer, not all
  `max_workers` (it would wait for pods that do not exist). A `--min_workers` of the
  user's, rendered on every pod with the other run flags, is left as it is."""
  given = any(flag.startswith("--min_workers=") for flag in config.extra_flags)
  if not config.elastic or role != spec_lib.JobType.CHIEF or given:
    return ()
  return (f"--min_workers={config.num_workers}",)


def _pod_failure_rules() -> list[dict]:
  def on_exit(action: str, codes: tuple[int, ...]) -> dict:
    return {"action": action, "onExitCodes": {
        "containerName": CONTAINER, "operator": "In", "values": list(codes)}}
  return [
      on_exit("FailJob", PERMANENT_EXIT_CODES),
      on_exit("Ignore", RETRYABLE_EXIT_CODES),
      {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
  ]
