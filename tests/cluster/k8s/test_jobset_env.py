"""A JobSet pod derives the whole cluster and its own role from its name and env."""

import pytest

from tfps.cluster import spec as spec_lib
from tfps.cluster.k8s import config as config_lib
from tfps.cluster.k8s import jobset
from tfps.cluster.k8s import jobset_env
from tfps.cluster.k8s import jobset_pods
from tfps.commands import run as run_command

LAYOUT = jobset_env.JobSetLayout(num_ps=2, num_workers=3)


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


@pytest.mark.parametrize("overrides, message", [
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
])
def test_a_bad_or_missing_value_is_one_line_naming_it(overrides, message):
  with pytest.raises(jobset_env.JobSetEnvError) as raised:
    jobset_env.task_config(_env(**overrides), LAYOUT)
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
