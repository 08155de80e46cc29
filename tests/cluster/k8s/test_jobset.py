"""`tfps k8s` (a JobSet by default): valid against the API, and the exits do what tfps needs."""

import copy
import re

import pytest
import yaml

from tests.support import k8s_schemas
from tfps.base import errors
from tfps.cluster.k8s import config as config_lib
from tfps.cluster.k8s import jobset
from tfps.cluster.k8s import jobset_pods
from tfps.cluster.k8s import player
from tfps.cluster.k8s import pod_failure

Action = pod_failure.PodFailureAction


@pytest.fixture(scope="module")
def documents():
  config = config_lib.JobManifestConfig(
      name="ctr-spot", image="registry.example/tfps:0.1", num_ps=2, num_workers=3,
      grace_seconds=25, extra_flags=("--train_steps=9000",))
  return jobset.render(config)


def _rjobs(manifest: dict) -> dict:
  return {r["name"]: r for r in manifest["spec"]["replicatedJobs"]}


def _pod(rjob: dict) -> dict:
  return rjob["template"]["spec"]["template"]["spec"]


def test_the_cli_prints_a_jobset_by_default(tfps):
  result = tfps(["k8s", "--image=img", "--job=j", "--train_steps=7"])
  assert result.returncode == 0, result.stderr
  manifest, policy = yaml.safe_load_all(result.stdout)
  assert (manifest["apiVersion"], manifest["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
  assert policy["kind"] == "NetworkPolicy"
  k8s_schemas.validate_jobset(manifest)
  k8s_schemas.validate_core(policy)


def test_every_object_is_valid_against_the_api(documents):
  manifest, policy = documents
  k8s_schemas.validate_jobset(manifest)
  k8s_schemas.validate_core(policy)


@pytest.mark.parametrize("break_it", [
    # A misspelt JobSet field (dropped by the API types: the round trip differs).
    lambda m: m["spec"]["failurePolicy"].update(maxRestart=m["spec"]["failurePolicy"].pop(
        "maxRestarts")),
    # A Job field misplaced on the replicated job.
    lambda m: _rjobs(m)["ps"].update(backoffLimit=6),
    # A pod field misplaced on the container.
    lambda m: _pod(_rjobs(m)["worker"])["containers"][0].update(terminationGracePeriodSeconds=9),
    # Not one of Kubernetes' pod failure actions.
    lambda m: _rjobs(m)["chief"]["template"]["spec"]["podFailurePolicy"]["rules"][0].update(
        action="Fail"),
    # Not one of JobSet's failure policy actions.
    lambda m: m["spec"]["failurePolicy"]["rules"][0].update(action="FailJob"),
    # A wrong type.
    lambda m: _rjobs(m)["worker"]["template"]["spec"].update(parallelism="3"),
], ids=["misspelt", "misplaced-job-field", "misplaced-pod-field", "pod-action", "jobset-action",
        "type"])
def test_the_validators_reject_a_broken_jobset(documents, break_it):
  broken = copy.deepcopy(documents[0])
  break_it(broken)
  with pytest.raises(Exception):  # AssertionError, pydantic or schema ValidationError.
    k8s_schemas.validate_jobset(broken)


def _assert_one_indexed_job_each(rjobs, pods: dict) -> None:
  """Each role (in order) is one Indexed Job (`replicas` 1) of `pods[role]` pods."""
  assert list(rjobs) == list(pods)
  for name, count in pods.items():
    job = rjobs[name]["template"]["spec"]
    assert rjobs[name]["replicas"] == 1
    assert (job["completionMode"], job["completions"], job["parallelism"]) == (
        "Indexed", count, count)


def test_one_indexed_job_per_role_with_a_pod_per_task(documents):
  rjobs = _rjobs(documents[0])
  _assert_one_indexed_job_each(rjobs, {"chief": 1, "ps": 2, "worker": 3})
  network = documents[0]["spec"]["network"]
  assert network == {"enableDNSHostnames": True, "subdomain": "ctr-spot",
                     "publishNotReadyAddresses": True}


@pytest.mark.parametrize("code", list(errors.ExitCode))
def test_each_exit_code_gets_the_pod_failure_action_tfps_needs(documents, code):
  for name, rjob in _rjobs(documents[0]).items():
    rules = rjob["template"]["spec"]["podFailurePolicy"]["rules"]
    action = pod_failure.action_for(rules, container="tfps", exit_code=int(code))
    if code == errors.ExitCode.OK:
      assert action == Action.COUNT  # Not a failure: no rule may match it.
    elif code.retryable:
      assert action == Action.IGNORE, (name, code)  # Replaced, not counted.
    else:
      assert action == Action.FAIL_JOB, (name, code)  # 1, 2: no retries.


def test_a_crash_counts_and_a_disruption_is_ignored(documents):
  for rjob in _rjobs(documents[0]).values():
    rules = rjob["template"]["spec"]["podFailurePolicy"]["rules"]
    # 137: the OOM killer (or any SIGKILL): counted, so an OOM loop ends.
    assert pod_failure.action_for(rules, container="tfps", exit_code=137) == Action.COUNT
    assert pod_failure.action_for(rules, container="tfps", exit_code=139) == Action.COUNT
    # Preempted or evicted: the pod carries DisruptionTarget, whatever its exit.
    assert pod_failure.action_for(rules, container="tfps", exit_code=137,
                                  conditions={"DisruptionTarget": "True"}) == Action.IGNORE


def test_a_permanent_exit_fails_the_jobset_and_a_crash_loop_restarts_it(documents):
  policy = documents[0]["spec"]["failurePolicy"]
  by_reason = {reason: rule["action"] for rule in policy["rules"]
               for reason in rule["onJobFailureReasons"]}
  assert by_reason == {"PodFailurePolicy": "FailJobSet", "BackoffLimitExceeded": "RestartJobSet",
                       "FailedIndexes": "RestartJobSet"}
  assert policy["maxRestarts"] == jobset.MAX_JOBSET_RESTARTS
  # Workers fail per index (a crash-looping worker is dropped); the ps and the
  # chief have no such option: their Job fails.
  jobs = {name: r["template"]["spec"] for name, r in _rjobs(documents[0]).items()}
  assert jobs["worker"]["backoffLimitPerIndex"] == jobset.BACKOFF_LIMIT
  assert "backoffLimit" not in jobs["worker"]
  assert jobs["ps"]["backoffLimit"] == jobs["chief"]["backoffLimit"] == jobset.BACKOFF_LIMIT


def test_the_jobset_succeeds_with_its_chief(documents):
  assert documents[0]["spec"]["successPolicy"] == {"operator": "All",
                                                   "targetReplicatedJobs": ["chief"]}


def test_every_pod_runs_tfps_run_deriving_its_cluster(documents):
  for name, rjob in _rjobs(documents[0]).items():
    pod = _pod(rjob)
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy requires it.
    (container,) = pod["containers"]
    assert container["command"] == ["tfps"]
    assert container["args"][:5] == ["run", "--cluster_from=jobset", "--num_ps=2",
                                     "--num_workers=3", "--task_port=2222"]
    assert {"--grace_seconds=25", "--train_steps=9000",
            "--model_dir=/model/run"} <= set(container["args"])
    assert pod["terminationGracePeriodSeconds"] > 25
    ports = {p["containerPort"] for p in container["ports"]}
    assert ports == ({2222, 2223} if name == "chief" else {2222})
    env = {e["name"]: e for e in container["env"]}
    assert env["JOBSET_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['jobset.sigs.k8s.io/jobset-name']")
    assert env["JOBSET_SUBDOMAIN"]["value"] == "ctr-spot"


def test_the_tfjob_format_is_kept(tfps):
  result = tfps(["k8s", "--format=tfjob", "--image=img"])
  assert result.returncode == 0, result.stderr
  assert next(yaml.safe_load_all(result.stdout))["kind"] == "TFJob"


def test_an_unknown_format_is_one_line_exit_2(tfps):
  result = tfps(["k8s", "--format=helm", "--image=img"])
  assert result.returncode == 2 and "helm" in result.stderr
  assert len(result.stderr.strip().splitlines()) == 1


def test_a_pod_on_a_lost_node_is_replaced_after_seconds_not_minutes(documents):
  for rjob in _rjobs(documents[0]).values():
    tolerations = {t["key"]: t for t in _pod(rjob)["tolerations"]}
    for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
      assert tolerations[taint]["effect"] == "NoExecute"
      assert tolerations[taint]["tolerationSeconds"] < 300  # Kubernetes' default.


def test_a_standby_chief_is_a_second_chief_pod_that_derives_the_same_cluster(tfps):
  result = tfps(["k8s", "--image=img", "--job=j", "--chief_standby", "--num_workers=2"])
  assert result.returncode == 0, result.stderr
  manifest, _ = yaml.safe_load_all(result.stdout)
  k8s_schemas.validate_jobset(manifest)
  chief = _rjobs(manifest)["chief"]["template"]["spec"]
  assert (chief["completions"], chief["parallelism"]) == (2, 2)
  (container,) = _pod(_rjobs(manifest)["chief"])["containers"]
  assert "--chief_standby" in container["args"]
  # The two chief pods on two nodes; the ps and workers anywhere.
  (apart,) = _pod(_rjobs(manifest)["chief"])["affinity"]["podAntiAffinity"][
      "requiredDuringSchedulingIgnoredDuringExecution"]
  assert apart["topologyKey"] == "kubernetes.io/hostname"
  assert apart["labelSelector"]["matchLabels"] == {
      "jobset.sigs.k8s.io/jobset-name": "j", "jobset.sigs.k8s.io/replicatedjob-name": "chief"}
  assert "affinity" not in _pod(_rjobs(manifest)["worker"])
  assert not any(a.startswith(("--lease_generation", "--exclude_tasks"))
                 for a in container["args"])  # The supervisor's own, never rendered.
  # What each chief pod derives from its env: two chiefs, this one the second.
  from tfps.cluster.k8s import jobset_env  # pylint: disable=import-outside-toplevel
  layout = jobset_env.JobSetLayout(num_ps=2, num_workers=2, chief_standby=True)
  env = {"JOBSET_NAME": "j", "REPLICATED_JOB_NAME": "chief", "JOB_INDEX": "0",
         "JOB_COMPLETION_INDEX": "1", "HOSTNAME": "j-chief-0-1"}
  config = jobset_env.task_config(env, layout)
  assert config.cluster.addresses(jobset_env.spec_lib.JobType.CHIEF) == (
      "j-chief-0-0.j:2222", "j-chief-0-1.j:2222")
  assert str(config.task) == "chief:1" and config.cluster.chief_standby
  with pytest.raises(jobset_env.JobSetEnvError, match=r"\(--chief_standby: 2\)"):
    jobset_env.task_config({**env, "JOB_COMPLETION_INDEX": "2", "HOSTNAME": ""}, layout)


def test_the_tfjob_format_refuses_a_standby_chief(tfps):
  result = tfps(["k8s", "--format=tfjob", "--image=img", "--chief_standby"])
  assert result.returncode == 2 and "chief_standby" in result.stderr
  assert len(result.stderr.strip().splitlines()) == 1


# --- elastic workers (--max_workers) ------------------------------------------------------


@pytest.fixture(scope="module")
def elastic():
  return jobset.render(config_lib.JobManifestConfig(
      name="ctr", image="img", num_ps=2, num_workers=2, max_workers=5,
      extra_flags=("--train_steps=9000",)))


def _args(rjob: dict) -> list[str]:
  (container,) = _pod(rjob)["containers"]
  return container["args"]


def test_the_scale_patch_grows_and_shrinks_the_worker_job_and_nothing_else(elastic):
  manifest, _ = elastic
  patch = jobset.worker_scale_patch(manifest, 4)
  assert patch == [  # As docs/deployment.md shows it: worker is the third replicated job.
      {"op": "replace", "path": "/spec/replicatedJobs/2/template/spec/parallelism", "value": 4},
      {"op": "replace", "path": "/spec/replicatedJobs/2/template/spec/completions", "value": 4}]
  grown = player.json_patched(manifest, patch)
  k8s_schemas.validate_jobset(grown)
  workers = [p for p in jobset_pods.planned_pods(grown) if p.replicated_job == "worker"]
  assert [p.hostname for p in workers] == [f"ctr-worker-0-{i}" for i in range(4)]
  assert {p.argv for p in workers} == {  # Every new pod runs the same command.
      p.argv for p in jobset_pods.planned_pods(manifest) if p.replicated_job == "worker"}
  others = lambda m: [r for r in m["spec"]["replicatedJobs"] if r["name"] != "worker"]
  assert others(grown) == others(manifest) and manifest != grown  # The input is untouched.
  shrunk = player.json_patched(grown, jobset.worker_scale_patch(grown, 1))
  assert [p.hostname for p in jobset_pods.planned_pods(shrunk)
          if p.replicated_job == "worker"] == ["ctr-worker-0-0"]


@pytest.mark.parametrize("workers, message", [
    (0, "workers (0) must be between 1 and the JobSet's max_workers (5)"),
    (6, "workers (6) must be between 1 and the JobSet's max_workers (5)")])
def test_a_scale_beyond_max_workers_is_a_usage_error(elastic, workers, message):
  with pytest.raises(errors.UsageError, match=re.escape(message)):
    jobset.worker_scale_patch(elastic[0], workers)


def test_a_fixed_jobset_cannot_be_scaled_and_a_patch_must_replace_a_real_path(documents):
  with pytest.raises(errors.UsageError, match="not elastic"):
    jobset.worker_scale_patch(documents[0], 3)
  with pytest.raises(ValueError, match="must be 'replace'"):
    player.json_patched(documents[0], [{"op": "add", "path": "/spec/x", "value": 1}])
  with pytest.raises(ValueError, match="is not in the manifest"):
    player.json_patched(documents[0], [{"op": "replace", "path": "/spec/nope/0", "value": 1}])


def test_without_max_workers_nothing_elastic_is_rendered(documents):
  for rjob in _rjobs(documents[0]).values():
    assert not any(a.startswith(("--max_workers", "--min_workers")) for a in _args(rjob))


def test_elastic_workers_start_at_num_workers_in_the_one_indexed_job(elastic):
  manifest, _ = elastic
  k8s_schemas.validate_jobset(manifest)
  rjobs = _rjobs(manifest)
  # `replicas` stays 1: JobSet refuses to change it on a running JobSet; the
  # worker Job's completions and parallelism are what scaling changes.
  _assert_one_indexed_job_each(rjobs, {"chief": 1, "ps": 2, "worker": 2})
  worker = rjobs["worker"]["template"]["spec"]
  assert worker["backoffLimitPerIndex"] == jobset.BACKOFF_LIMIT and "backoffLimit" not in worker


def test_every_elastic_pod_names_max_workers_and_only_the_chief_min_workers(elastic):
  for name, rjob in _rjobs(elastic[0]).items():
    args = _args(rjob)
    assert args[:6] == ["run", "--cluster_from=jobset", "--num_ps=2", "--num_workers=2",
                        "--max_workers=5", "--task_port=2222"]
    min_workers = [a for a in args if a.startswith("--min_workers")]
    assert min_workers == (["--min_workers=2"] if name == "chief" else []), name
    assert "--train_steps=9000" in args


def test_a_users_min_workers_is_kept_as_given(tfps):
  result = tfps(["k8s", "--image=img", "--job=j", "--num_workers=3", "--max_workers=6",
                 "--min_workers=1"])
  assert result.returncode == 0, result.stderr
  manifest, _ = yaml.safe_load_all(result.stdout)
  k8s_schemas.validate_jobset(manifest)
  for rjob in _rjobs(manifest).values():
    # With every other run flag, on every pod (as without --max_workers); never twice.
    assert [a for a in _args(rjob) if a.startswith("--min_workers")] == ["--min_workers=1"]
  assert "--max_workers=6" in _args(_rjobs(manifest)["worker"])


def test_the_cli_renders_elastic_workers_with_a_standby_chief(tfps):
  result = tfps(["k8s", "--image=img", "--job=j", "--num_workers=2", "--max_workers=4",
                 "--chief_standby"])
  assert result.returncode == 0, result.stderr
  manifest, _ = yaml.safe_load_all(result.stdout)
  k8s_schemas.validate_jobset(manifest)
  chief = _rjobs(manifest)["chief"]
  assert chief["template"]["spec"]["completions"] == 2  # Both chief pods, as before.
  assert {"--chief_standby", "--max_workers=4", "--min_workers=2"} <= set(_args(chief))
  assert _rjobs(manifest)["worker"]["template"]["spec"]["completions"] == 2


@pytest.mark.parametrize("args, message", [
    (["--num_workers=3", "--max_workers=2"],
     "max_workers (2) must be an integer >= num_workers (3)"),
    (["--format=tfjob", "--max_workers=3"],
     "max_workers (3): the TFJob format has a fixed number of workers"),
    (["--num_workers=2", "--max_workers=4", "--min_workers=5"],
     "min_workers (5) must be at most max_workers (4)"),
    (["--num_workers=2", "--min_workers=3"], "min_workers (3) must be at most num_workers (2)"),
])
def test_bad_elastic_flags_are_one_line_exit_2(tfps, args, message):
  result = tfps(["k8s", "--image=img", *args])
  assert result.returncode == 2, result.stderr
  assert result.stderr.startswith(f"tfps: error: {message}")
  assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
