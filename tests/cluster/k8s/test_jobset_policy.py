"""The rendered JobSet's semantics, played without a cluster: every exit's outcome."""

import pytest

from tfps.base import errors
from tfps.cluster.k8s import config as config_lib
from tfps.cluster.k8s import jobset
from tfps.cluster.k8s import jobset_policy

Outcome = jobset_policy.Outcome
POLICY = jobset_policy.JobSetPolicy.of(jobset.render(config_lib.JobManifestConfig(
    name="j", image="i", num_ps=2, num_workers=2))[0])


def _exit(state, job, index, code, **conditions):
  return jobset_policy.after_exit(POLICY, state, job=job, index=index, exit_code=code,
                                  conditions=conditions)


@pytest.mark.parametrize("job", ["chief", "ps", "worker"])
@pytest.mark.parametrize("code", [c for c in errors.ExitCode if c.retryable])
def test_a_retryable_exit_replaces_the_pod_and_counts_nothing(job, code):
  state = jobset_policy.PlayState()
  for _ in range(20):  # Far past any backoff limit.
    outcome, state = _exit(state, job, 0, int(code))
    assert outcome == Outcome.REPLACE_POD
  assert state == jobset_policy.PlayState()


@pytest.mark.parametrize("job", ["chief", "ps", "worker"])
@pytest.mark.parametrize("code", [1, 2])
def test_a_permanent_exit_fails_the_jobset_at_once(job, code):
  outcome, _ = _exit(jobset_policy.PlayState(), job, 0, code)
  assert outcome == Outcome.FAILED


def test_a_crash_loop_of_the_ps_restarts_the_jobset_until_max_restarts():
  state = jobset_policy.PlayState()
  for restart in range(jobset.MAX_JOBSET_RESTARTS + 1):
    for _ in range(jobset.BACKOFF_LIMIT):
      outcome, state = _exit(state, "ps", 1, 137)
      assert outcome == Outcome.REPLACE_POD
    outcome, state = _exit(state, "ps", 0, 139)
    if restart < jobset.MAX_JOBSET_RESTARTS:
      assert outcome == Outcome.RESTART_ALL and state.restarts == restart + 1
  assert outcome == Outcome.FAILED


def test_a_crash_looping_worker_is_dropped_and_the_others_go_on():
  state = jobset_policy.PlayState()
  for _ in range(jobset.BACKOFF_LIMIT):
    outcome, state = _exit(state, "worker", 1, 137)
    assert outcome == Outcome.REPLACE_POD
  outcome, state = _exit(state, "worker", 1, 137)
  assert outcome == Outcome.INDEX_DONE  # Worker 1 is gone; worker 0 still runs.
  outcome, state = _exit(state, "worker", 0, 143)
  assert outcome == Outcome.REPLACE_POD
  for _ in range(jobset.BACKOFF_LIMIT + 1):
    outcome, state = _exit(state, "worker", 0, 137)
  assert outcome == Outcome.RESTART_ALL  # Every worker index failed: the Job failed.


def test_a_disruption_is_ignored_whatever_the_exit():
  outcome, state = _exit(jobset_policy.PlayState(), "chief", 0, 137, DisruptionTarget="True")
  assert outcome == Outcome.REPLACE_POD and state == jobset_policy.PlayState()


def test_the_jobset_succeeds_with_its_chief_alone():
  outcome, _ = _exit(jobset_policy.PlayState(), "chief", 0, 0)
  assert outcome == Outcome.SUCCEEDED
  outcome, _ = _exit(jobset_policy.PlayState(), "worker", 0, 0)
  assert outcome == Outcome.INDEX_DONE


def test_elastic_workers_keep_the_per_index_backoff_after_scaling():
  manifest, _ = jobset.render(config_lib.JobManifestConfig(
      name="j", image="i", num_ps=2, num_workers=2, max_workers=4))
  # Scaled up to 4 as docs/deployment.md says: the worker Job's completions and parallelism.
  manifest["spec"]["replicatedJobs"][2]["template"]["spec"].update(completions=4, parallelism=4)
  policy = jobset_policy.JobSetPolicy.of(manifest)
  assert policy.job("worker").backoff_limit_per_index == jobset.BACKOFF_LIMIT
  state = jobset_policy.PlayState()
  for index in (3, 2, 1):  # Three crash-looping workers, the new ones first: each dropped.
    for _ in range(jobset.BACKOFF_LIMIT):
      outcome, state = jobset_policy.after_exit(policy, state, job="worker", index=index,
                                                exit_code=137)
      assert outcome == Outcome.REPLACE_POD
    outcome, state = jobset_policy.after_exit(policy, state, job="worker", index=index,
                                              exit_code=137)
    assert outcome == Outcome.INDEX_DONE  # Worker 0 still runs: the job goes on.
  for _ in range(jobset.BACKOFF_LIMIT + 1):
    outcome, state = jobset_policy.after_exit(policy, state, job="worker", index=0,
                                              exit_code=137)
  assert outcome == Outcome.RESTART_ALL  # Every worker index failed: the Job failed.
