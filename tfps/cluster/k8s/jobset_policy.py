"""What JobSet and the Job controller do when a pod of a rendered JobSet ends: pure.

Read from the manifest itself (`JobSetPolicy.of`), so a change to the
rendered policies changes what is played:

  * a pod that succeeds completes its index; the JobSet succeeds when every
    Job named by `successPolicy` (operator All) has completed every index;
  * a pod that fails is judged by its Job's `podFailurePolicy`
    (`pod_failure.action_for`): Ignore replaces it; FailJob fails its Job;
    FailIndex fails its index; Count counts it against `backoffLimit` (the
    Job fails past it) or, with `backoffLimitPerIndex`, against its index
    (the index fails past it; the Job fails once every index has ended and
    one failed);
  * a failed Job is judged by the JobSet's `failurePolicy`: the first rule
    whose `onJobFailureReasons` holds the Job's reason; none: RestartJobSet.
    RestartJobSet recreates every Job (counters reset) while restarts stay
    below `maxRestarts`, else the JobSet fails.
Used to play a rendered JobSet on this machine without an API server.
"""

import dataclasses
import enum
from typing import Mapping

from tfps.cluster.k8s import pod_failure


class Outcome(str, enum.Enum):
  """What happens after a pod ended (of a JobSet, or of a TFJob: `tfjob_policy`)."""

  REPLACE_POD = "replace_pod"  # A new pod for the same index (new address).
  INDEX_DONE = "index_done"  # Nothing runs for this index any more.
  RESTART_ALL = "restart_all"  # Every pod stopped and started again (a JobSet restart).
  FAILED = "failed"  # The whole job.
  SUCCEEDED = "succeeded"


class JobFailureReason(str, enum.Enum):
  BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
  POD_FAILURE_POLICY = "PodFailurePolicy"
  FAILED_INDEXES = "FailedIndexes"


@dataclasses.dataclass(frozen=True)
class JobPolicy:
  """One replicated job's Job: its size, limits and pod failure rules."""

  name: str
  container: str
  completions: int
  backoff_limit: int | None
  backoff_limit_per_index: int | None
  pod_failure_rules: tuple[Mapping, ...]


@dataclasses.dataclass(frozen=True)
class JobSetPolicy:
  jobs: tuple[JobPolicy, ...]
  failure_rules: tuple[Mapping, ...]
  max_restarts: int
  success_targets: tuple[str, ...]

  @classmethod
  def of(cls, manifest: Mapping) -> "JobSetPolicy":
    spec = manifest["spec"]
    jobs = []
    for rjob in spec["replicatedJobs"]:
      job = rjob["template"]["spec"]
      (container,) = job["template"]["spec"]["containers"]
      jobs.append(JobPolicy(
          name=rjob["name"], container=container["name"], completions=job.get("completions", 1),
          backoff_limit=job.get("backoffLimit"),
          backoff_limit_per_index=job.get("backoffLimitPerIndex"),
          pod_failure_rules=tuple(job.get("podFailurePolicy", {}).get("rules", ()))))
    failure = spec.get("failurePolicy", {})
    success = spec.get("successPolicy", {})
    return cls(jobs=tuple(jobs), failure_rules=tuple(failure.get("rules", ())),
               max_restarts=failure.get("maxRestarts", 0),
               success_targets=tuple(success.get("targetReplicatedJobs", ())) or tuple(
                   j.name for j in jobs))

  def job(self, name: str) -> JobPolicy:
    return next(j for j in self.jobs if j.name == name)


@dataclasses.dataclass(frozen=True)
class PlayState:
  """Counters since the JobSet's last (re)start; `restarts` over its life."""

  restarts: int = 0
  failures: Mapping[str, int] = dataclasses.field(default_factory=dict)
  index_failures: Mapping[tuple[str, int], int] = dataclasses.field(default_factory=dict)
  succeeded: frozenset = frozenset()  # (job, index)
  failed_indexes: frozenset = frozenset()  # (job, index)


def after_exit(policy: JobSetPolicy, state: PlayState, *, job: str, index: int, exit_code: int,
               conditions: Mapping[str, str] | None = None) -> tuple[Outcome, PlayState]:
  """The outcome of pod `index` of `job` ending with `exit_code`, and the state after it."""
  job_policy = policy.job(job)
  if exit_code == 0:
    state = dataclasses.replace(state, succeeded=state.succeeded | {(job, index)})
    done = all((target, i) in state.succeeded for target in policy.success_targets
               for i in range(policy.job(target).completions))
    return (Outcome.SUCCEEDED if done else Outcome.INDEX_DONE), state
  action = pod_failure.action_for(job_policy.pod_failure_rules, container=job_policy.container,
                                  exit_code=exit_code, conditions=conditions)
  if action == pod_failure.PodFailureAction.IGNORE:
    return Outcome.REPLACE_POD, state
  if action == pod_failure.PodFailureAction.FAIL_JOB:
    return _job_failed(policy, state, job, JobFailureReason.POD_FAILURE_POLICY)
  if job_policy.backoff_limit_per_index is not None:
    key = (job, index)
    count = state.index_failures.get(key, 0) + 1
    state = dataclasses.replace(state, index_failures={**state.index_failures, key: count})
    if action == pod_failure.PodFailureAction.COUNT and count <= job_policy.backoff_limit_per_index:
      return Outcome.REPLACE_POD, state
    state = dataclasses.replace(state, failed_indexes=state.failed_indexes | {key})
    ended = {i for (j, i) in state.failed_indexes | state.succeeded if j == job}
    if len(ended) == job_policy.completions:
      return _job_failed(policy, state, job, JobFailureReason.FAILED_INDEXES)
    return Outcome.INDEX_DONE, state
  count = state.failures.get(job, 0) + 1
  state = dataclasses.replace(state, failures={**state.failures, job: count})
  if job_policy.backoff_limit is None or count <= job_policy.backoff_limit:
    return Outcome.REPLACE_POD, state
  return _job_failed(policy, state, job, JobFailureReason.BACKOFF_LIMIT_EXCEEDED)


def _job_failed(policy: JobSetPolicy, state: PlayState, job: str,
                reason: JobFailureReason) -> tuple[Outcome, PlayState]:
  def applies(rule: Mapping) -> bool:
    return ((not rule.get("onJobFailureReasons") or reason.value in rule["onJobFailureReasons"])
            and (not rule.get("targetReplicatedJobs") or job in rule["targetReplicatedJobs"]))
  rule = next((r for r in policy.failure_rules if applies(r)), {"action": "RestartJobSet"})
  if rule["action"] == "FailJobSet":
    return Outcome.FAILED, state
  if rule["action"] == "RestartJobSetAndIgnoreMaxRestarts" or state.restarts < policy.max_restarts:
    return Outcome.RESTART_ALL, PlayState(restarts=state.restarts + 1)
  return Outcome.FAILED, state
