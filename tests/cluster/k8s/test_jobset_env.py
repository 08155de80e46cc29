"""A JobSet pod derives the whole cluster and its own role from its name and env."""

import copy

import pytest

from tfps.cluster import spec as spec_lib
from tfps.cluster.k8s import config as config_lib
from tfps.cluster.k8s import jobset
from tfps.cluster.k8s import jobset_env
from tfps.cluster.k8s import jobset_pods
from tfps.commands import run as run_command

LAYOUT = jobset_env.JobSetLayout(num_ps=2, num_workers=3)
ELASTIC = jobset_env.JobSetLayout(num_ps=2, num_workers=2, max_workers=4)


def _env(**overrides):
  env = {"JOBSET_NAME": "ctr", "REPLICATED_JOB_NAME": "worker", "JOB_INDEX": "0",
         "JOB_COMPLETION_INDEX": "1", "JOBSET_SUBDOMAIN": "ctr", "HOSTNAME": "ctr-worker-0-1"}
  env.update(overrides)
  return {k: v for k, v in env.items() if v is not None}


def test_a_worker_pod_finds_every_task_by_name():
  config = jobset_env.task_config(_env(), LAYOUT)
  assert config.task == spec_lib.TaskId(spec_lib.JobType.WORKER, 1)
  assert config.cluster.as_dict() == {
      "chief": ["ctr-chief-0-0.ctr:2222"],
      "ps": ["ctr-ps-0-0.ctr:2222", "ctr-ps-0-1.ctr:2222"],
      "worker": ["ctr-worker-0-0.ctr:2222", "ctr-worker-0-1.ctr:2222",
                 "ctr-worker-0-2.ctr:2222"]}


def test_the_subdomain_defaults_to_the_jobset_name_as_in_jobset():
  config = jobset_env.task_config(_env(JOBSET_SUBDOMAIN=None), LAYOUT)
  assert config.address == "ctr-worker-0-1.ctr:2222"
  other = jobset_env.task_config(_env(JOBSET_SUBDOMAIN="net"), LAYOUT)
  assert other.address == "ctr-worker-0-1.net:2222"


_BAD_FIXED = [
    (dict(JOBSET_NAME=None), "JOBSET_NAME: missing (set from the pod label "
                             "jobset.sigs.k8s.io/jobset-name;"),
    (dict(JOB_COMPLETION_INDEX=None), "JOB_COMPLETION_INDEX: missing (set from Kubernetes"),
    (dict(JOBSET_NAME="Bad_Name"), "JOBSET_NAME ('Bad_Name') must be a DNS label"),
    (dict(REPLICATED_JOB_NAME="evaluator"),
     "REPLICATED_JOB_NAME ('evaluator') is not a tfps role (expected one of chief, ps, worker)"),
    (dict(JOB_INDEX="1"), "JOB_INDEX ('1') must be 0"),
    (dict(JOB_COMPLETION_INDEX="x"), "JOB_COMPLETION_INDEX ('x') must be a task index"),
    (dict(JOB_COMPLETION_INDEX="3", HOSTNAME=None),
     "JOB_COMPLETION_INDEX (3) of worker is not below --num_workers (3)"),
    (dict(HOSTNAME="ctr-worker-0-2"), "HOSTNAME ('ctr-worker-0-2') is not 'ctr-worker-0-1'"),
]
_BAD_ELASTIC = [
    # The worker Job scaled past the room the pods were rendered with.
    (dict(JOB_COMPLETION_INDEX="4", HOSTNAME="ctr-worker-0-4"),
     "JOB_COMPLETION_INDEX (4) of worker is not below --max_workers (4)"),
    # Tasks are pods of job 0, elastic or not (JobSet's replicas stay 1).
    (dict(JOB_INDEX="1"), "JOB_INDEX ('1') must be 0"),
    (dict(REPLICATED_JOB_NAME="ps", JOB_COMPLETION_INDEX="2", HOSTNAME=None),
     "JOB_COMPLETION_INDEX (2) of ps is not below --num_ps (2)"),
    (dict(HOSTNAME="ctr-worker-1-0"), "HOSTNAME ('ctr-worker-1-0') is not 'ctr-worker-0-1'"),
]


@pytest.mark.parametrize("layout, overrides, message",
                         [(LAYOUT, *case) for case in _BAD_FIXED]
                         + [(ELASTIC, *case) for case in _BAD_ELASTIC])
def test_a_bad_or_missing_value_is_one_line_naming_it(layout, overrides, message):
  with pytest.raises(jobset_env.JobSetEnvError) as raised:
    jobset_env.task_config(_env(**overrides), layout)
  assert message in str(raised.value) and "\n" not in str(raised.value)
  assert raised.value.exit_code == 2


@pytest.mark.parametrize("layout, message", [
    (dict(num_ps=0, num_workers=1), "--num_ps (0) must be a positive integer"),
    (dict(num_ps=1, num_workers=1, port=70000), "--task_port (70000) is out of range"),
])
def test_bad_replica_flags(layout, message):
  with pytest.raises(jobset_env.JobSetEnvError, match=message.replace("(", r"\(").replace(
      ")", r"\)")):
    jobset_env.JobSetLayout(**layout)


def test_every_pod_of_the_rendered_manifest_derives_the_same_cluster(parse_flags, monkeypatch):
  manifest, _ = jobset.render(config_lib.JobManifestConfig(
      name="ctr", image="i", num_ps=2, num_workers=3))
  pods = jobset_pods.planned_pods(manifest)
  assert [p.hostname for p in pods] == [
      "ctr-chief-0-0", "ctr-ps-0-0", "ctr-ps-0-1",
      "ctr-worker-0-0", "ctr-worker-0-1", "ctr-worker-0-2"]
  clusters, tasks = set(), []
  for pod in pods:
    for name in ("TF_CONFIG", *jobset_env.LABELS, jobset_env.JOBSET_SUBDOMAIN):
      monkeypatch.delenv(name, raising=False)
    for name, value in pod.env:
      monkeypatch.setenv(name, value)
    assert pod.argv[:2] == ("tfps", "run")
    # The pod's own command line, parsed by the real flags, then `tfps run`'s derivation.
    config = run_command.task_config_from_flags(parse_flags(list(pod.argv[1:])))
    assert config.address == f"{pod.dns_name}:2222"  # Its own name: what the others dial.
    clusters.add(config.cluster)
    tasks.append(str(config.task))
  assert len(clusters) == 1
  assert tasks == ["chief:0", "ps:0", "ps:1", "worker:0", "worker:1", "worker:2"]


def test_cluster_from_jobset_refuses_a_second_source(parse_flags, monkeypatch):
  for name, value in _env().items():
    monkeypatch.setenv(name, value)
  flags = parse_flags(["run", "--cluster_from=jobset", "--ps_hosts=a:1"])
  with pytest.raises(spec_lib.ClusterSpecError, match="drop --cluster_spec and host flags"):
    run_command.task_config_from_flags(flags)


def test_tfps_run_with_a_broken_pod_env_is_one_line_exit_2(tfps):
  result = tfps(["run", "--cluster_from=jobset", "--num_ps=1", "--num_workers=1"],
                env={"JOBSET_NAME": "ctr", "REPLICATED_JOB_NAME": "ps", "JOB_INDEX": "0",
                     "JOB_COMPLETION_INDEX": "1"})
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip() == (
      "tfps: error: JOB_COMPLETION_INDEX (1) of ps is not below --num_ps (1)")


# --- elastic workers: --max_workers on the pod's command line ------------------------------



def test_an_elastic_pod_names_max_workers_workers_the_same_way():
  config = jobset_env.task_config(_env(JOB_COMPLETION_INDEX="3", HOSTNAME="ctr-worker-0-3"),
                                  ELASTIC)
  assert config.task == spec_lib.TaskId(spec_lib.JobType.WORKER, 3)  # Above --num_workers.
  assert config.cluster.addresses(spec_lib.JobType.WORKER) == tuple(
      f"ctr-worker-0-{i}.ctr:2222" for i in range(4))
  # A ps or chief pod derives the very same cluster: every pod must.
  ps = jobset_env.task_config(_env(REPLICATED_JOB_NAME="ps", HOSTNAME="ctr-ps-0-1"), ELASTIC)
  assert ps.cluster == config.cluster and str(ps.task) == "ps:1"


def test_the_layout_is_the_pods_flags_not_a_guess():
  # The same pod env: a fixed layout of 3 refuses worker 3; an elastic one takes it.
  env = _env(JOB_COMPLETION_INDEX="3", HOSTNAME="ctr-worker-0-3")
  with pytest.raises(jobset_env.JobSetEnvError, match=r"not below --num_workers \(3\)"):
    jobset_env.task_config(env, LAYOUT)
  elastic = jobset_env.JobSetLayout(num_ps=2, num_workers=3, max_workers=4)
  assert str(jobset_env.task_config(env, elastic).task) == "worker:3"


def test_max_workers_below_num_workers_is_refused():
  with pytest.raises(jobset_env.JobSetEnvError,
                     match=r"--max_workers \(1\) must be at least --num_workers \(2\)"):
    jobset_env.JobSetLayout(num_ps=1, num_workers=2, max_workers=1)


def _scaled(manifest: dict, workers: int) -> dict:
  """The manifest after scaling the worker Job as docs/deployment.md says (completions and
  parallelism of replicated job 2, together)."""
  scaled = copy.deepcopy(manifest)
  rjob = scaled["spec"]["replicatedJobs"][2]
  assert rjob["name"] == "worker"  # The index the documented patch names.
  rjob["template"]["spec"].update(completions=workers, parallelism=workers)
  return scaled


def _derive(pod, parse_flags, monkeypatch) -> spec_lib.TaskConfig:
  """What `tfps run` derives in `pod`: its own env and command line, the real flags."""
  for name in ("TF_CONFIG", *jobset_env.LABELS, jobset_env.JOBSET_SUBDOMAIN):
    monkeypatch.delenv(name, raising=False)
  for name, value in pod.env:
    monkeypatch.setenv(name, value)
  assert pod.argv[:2] == ("tfps", "run")
  return run_command.task_config_from_flags(parse_flags(list(pod.argv[1:])))


def test_pods_added_by_scaling_derive_the_cluster_the_others_have(parse_flags, monkeypatch):
  manifest, _ = jobset.render(config_lib.JobManifestConfig(
      name="ctr", image="i", num_ps=1, num_workers=2, max_workers=4))
  before = jobset_pods.planned_pods(manifest)
  assert [p.hostname for p in before if p.replicated_job == "worker"] == [
      "ctr-worker-0-0", "ctr-worker-0-1"]
  after = jobset_pods.planned_pods(_scaled(manifest, 4))
  assert [p.hostname for p in after if p.replicated_job == "worker"] == [
      f"ctr-worker-0-{i}" for i in range(4)]
  clusters, tasks = set(), []
  for pod in after:
    config = _derive(pod, parse_flags, monkeypatch)
    assert config.address == f"{pod.dns_name}:2222"
    clusters.add(config.cluster)
    tasks.append(str(config.task))
  (cluster,) = clusters  # The running pods' cluster: nothing to re-render or restart.
  assert cluster.num_tasks(spec_lib.JobType.WORKER) == 4
  assert tasks == ["chief:0", "ps:0", "worker:0", "worker:1", "worker:2", "worker:3"]


def test_a_worker_scaled_past_max_workers_is_one_line_exit_2(parse_flags, monkeypatch):
  manifest, _ = jobset.render(config_lib.JobManifestConfig(
      name="ctr", image="i", num_ps=1, num_workers=2, max_workers=4))
  extra = jobset_pods.planned_pods(_scaled(manifest, 5))[-1]
  assert extra.hostname == "ctr-worker-0-4"
  with pytest.raises(jobset_env.JobSetEnvError) as raised:
    _derive(extra, parse_flags, monkeypatch)
  assert str(raised.value) == (
      "JOB_COMPLETION_INDEX (4) of worker is not below --max_workers (4)")


def test_tfps_run_with_a_worker_past_max_workers_is_one_line_exit_2(tfps):
  result = tfps(["run", "--cluster_from=jobset", "--num_ps=1", "--num_workers=1",
                 "--max_workers=2"],
                env={"JOBSET_NAME": "ctr", "REPLICATED_JOB_NAME": "worker", "JOB_INDEX": "0",
                     "JOB_COMPLETION_INDEX": "2"})
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip() == (
      "tfps: error: JOB_COMPLETION_INDEX (2) of worker is not below --max_workers (2)")
