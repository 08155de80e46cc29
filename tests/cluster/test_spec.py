"""Cluster spec parsing and validation (pure; no TensorFlow, no network)."""

import json

import pytest

from tfps.cluster import spec as spec_lib
from tfps.base import errors

JobType = spec_lib.JobType
TaskId = spec_lib.TaskId

CLUSTER = {"chief": ["c:1000"], "ps": ["p0:2000", "p1:2001"], "worker": ["w0:3000", "w1:3001"]}


def tf_config(cluster=None, task=None, **extra) -> str:
  config = {"cluster": CLUSTER if cluster is None else cluster,
            "task": task if task is not None else {"type": "worker", "index": 1}}
  config.update(extra)
  return json.dumps(config)


def test_tf_config_round_trip():
  config = spec_lib.from_tf_config(tf_config())
  assert config.task == TaskId(JobType.WORKER, 1)
  assert config.address == "w1:3001"
  assert config.cluster.as_dict() == CLUSTER
  assert [str(t) for t in config.cluster.tasks()] == [
      "chief:0", "ps:0", "ps:1", "worker:0", "worker:1"]
  assert spec_lib.from_tf_config(config.to_tf_config()) == config


def test_spec_is_frozen_and_hashable():
  config = spec_lib.from_tf_config(tf_config())
  with pytest.raises(AttributeError):
    config.task = TaskId(JobType.PS, 0)
  assert hash(config.cluster) == hash(spec_lib.from_tf_config(tf_config()).cluster)


def test_evaluator_never_reaches_the_coordinator():
  cluster = dict(CLUSTER, evaluator=["e:4000"])
  config = spec_lib.from_tf_config(tf_config(cluster, {"type": "chief", "index": 0}))
  assert config.cluster.num_tasks(JobType.EVALUATOR) == 1
  view = config.cluster.for_coordinator()
  assert "evaluator" not in view.as_dict()
  assert view.as_dict() == CLUSTER


@pytest.mark.parametrize("text, field, value", [
    ("{not json", "TF_CONFIG: malformed JSON", "{not json"),
    ("", "TF_CONFIG: is empty", ""),
    ("[1, 2]", "TF_CONFIG: expected a JSON object", "[1, 2]"),
    (json.dumps({"task": {"type": "ps"}}), "TF_CONFIG.cluster: missing", ""),
    (json.dumps({"cluster": CLUSTER}), "TF_CONFIG.task: missing", ""),
    (tf_config(dict(CLUSTER, trainer=["t:1"])), "unknown job type", "'trainer'"),
    (tf_config(task={"type": "gpu", "index": 0}), "TF_CONFIG.task.type: unknown job type", "'gpu'"),
    (tf_config(task={"type": "worker", "index": 2}), "task.index: 2 is out of range", "'worker'"),
    (tf_config(task={"type": "worker", "index": -1}), "task.index: -1 is negative", ""),
    (tf_config(task={"type": "worker", "index": "1"}), "task.index: '1' is not an integer", ""),
    (tf_config(task={"index": 0}), "task.type: missing", ""),
    (tf_config(dict(CLUSTER, worker=["w0:3000", "p0:2000"])), "duplicate address", "'p0:2000'"),
    (tf_config(dict(CLUSTER, worker=["w0:http"])), "cluster.worker[0]: port 'http'", "not a number"),
    (tf_config(dict(CLUSTER, worker=["w0:70000"])), "port 70000", "out of range"),
    (tf_config(dict(CLUSTER, worker=["w0:0"])), "port 0", "out of range"),
    (tf_config(dict(CLUSTER, worker=["w0"])), "cluster.worker[0]: address 'w0'", "host:port"),
    (tf_config(dict(CLUSTER, worker=[":3000"])), "has no host", "':3000'"),
    (tf_config({"chief": ["c:1"], "worker": ["w:2"]}), "cluster.ps: a parameter-server cluster", ""),
    (tf_config(dict(CLUSTER, worker=[])), "cluster.worker: the job list is empty", ""),
    (tf_config(dict(CLUSTER, ps=[])), "cluster.ps: the job list is empty", ""),
    (tf_config(dict(CLUSTER, worker="w0:3000")), "cluster.worker: expected a list", ""),
    (tf_config(dict(CLUSTER, chief=["c:1", "c:2", "c:3"])), "at most 2 chief task(s)", "got 3"),
    (tf_config({"ps": ["p:1"], "worker": ["w:2"]}, {"type": "chief", "index": 0}),
     "task.type: job 'chief' is not in the cluster", ""),
])
def test_invalid_tf_config_is_one_line_naming_field_and_value(text, field, value):
  with pytest.raises(spec_lib.ClusterSpecError) as raised:
    spec_lib.from_tf_config(text)
  message = str(raised.value)
  assert field in message and value in message
  assert "\n" not in message
  assert raised.value.exit_code == errors.ExitCode.USAGE == 2


def test_coordinator_view_requires_a_chief():
  cluster = spec_lib.ClusterSpec.from_dict({"ps": ["p:1"], "worker": ["w:2"]})
  with pytest.raises(spec_lib.ClusterSpecError, match="cluster.chief: the coordinator role"):
    cluster.for_coordinator()


def test_json_file_with_cluster_only_and_role_from_flags(tmp_path):
  path = tmp_path / "cluster.json"
  path.write_text(json.dumps(CLUSTER))
  config = spec_lib.from_json_file(str(path), job_name="ps", task_index=1)
  assert config.task == TaskId(JobType.PS, 1) and config.address == "p1:2001"


def test_json_file_in_tf_config_shape(tmp_path):
  path = tmp_path / "tf_config.json"
  path.write_text(tf_config(task={"type": "chief", "index": 0}))
  assert spec_lib.from_json_file(str(path)).task == TaskId(JobType.CHIEF, 0)


def test_json_file_errors(tmp_path):
  missing = tmp_path / "nope.json"
  with pytest.raises(spec_lib.ClusterSpecError, match="--cluster_spec: cannot read .*nope.json"):
    spec_lib.from_json_file(str(missing))
  bad = tmp_path / "bad.json"
  bad.write_text("{oops")
  with pytest.raises(spec_lib.ClusterSpecError, match="bad.json: malformed JSON"):
    spec_lib.from_json_file(str(bad))
  no_task = tmp_path / "no_task.json"
  no_task.write_text(json.dumps(CLUSTER))
  with pytest.raises(spec_lib.ClusterSpecError, match="no task in the file"):
    spec_lib.from_json_file(str(no_task))


def test_host_flags():
  config = spec_lib.from_host_flags(ps_hosts=["p:1"], worker_hosts=["w:2", "w:3"],
                                    chief_host="c:4", job_name="worker", task_index=1)
  assert config.address == "w:3"
  assert config.cluster.as_dict() == {"chief": ["c:4"], "ps": ["p:1"], "worker": ["w:2", "w:3"]}


@pytest.mark.parametrize("kwargs, message", [
    (dict(ps_hosts=[], job_name="worker"), "--ps_hosts: the job list is empty"),
    (dict(ps_hosts=["p:x"], job_name="worker"), "--ps_hosts[0]: port 'x'"),
    (dict(ps_hosts=["p:1"], job_name=None), "--job_name: missing"),
    (dict(ps_hosts=["p:1"], job_name="boss"), "--job_name: unknown job type 'boss'"),
    (dict(ps_hosts=["p:1"], job_name="worker", task_index=3), "task.index: 3 is out of range"),
    (dict(ps_hosts=["p:1"], job_name="ps", task_index=-1), "--task_index: -1 is negative"),
    (dict(ps_hosts=["p:1"], job_name="chief"), "task.type: job 'chief' is not in the cluster"),
])
def test_host_flag_errors(kwargs, message):
  args = dict(ps_hosts=[], worker_hosts=["w:2"], chief_host=None, job_name=None, task_index=0)
  args.update(kwargs)
  with pytest.raises(spec_lib.ClusterSpecError) as raised:
    spec_lib.from_host_flags(**args)
  assert message in str(raised.value)


def test_task_id_parse():
  assert TaskId.parse("ps:3") == TaskId(JobType.PS, 3)
  assert str(TaskId.parse("worker:0")) == "worker:0"
  assert TaskId(JobType.WORKER, 2).device == "/job:worker/replica:0/task:2"
  for bad in ("ps", "ps:x", "boss:1"):
    with pytest.raises(spec_lib.ClusterSpecError):
      TaskId.parse(bad)


def test_exit_codes_follow_the_design():
  assert errors.ExitCode.PREEMPTED == 143 and errors.ExitCode.PREEMPTED.retryable
  assert errors.ExitCode.CLUSTER_LOST.retryable
  assert not errors.ExitCode.PERMANENT.retryable and not errors.ExitCode.USAGE.retryable
  assert errors.Preempted(2).exit_code == errors.ExitCode.INTERRUPTED == 130


def test_without_renumbers_the_rest_of_each_job():
  cluster = spec_lib.ClusterSpec.from_dict(dict(CLUSTER, worker=["w0:1", "w1:1", "w2:1"],
                                                ps=["p0:1", "p1:1", "p2:1"]))
  reduced = cluster.without([TaskId(JobType.WORKER, 1), TaskId(JobType.PS, 0)])
  assert reduced.as_dict()["worker"] == ["w0:1", "w2:1"]
  assert reduced.as_dict()["ps"] == ["p1:1", "p2:1"]
  assert reduced.as_dict()["chief"] == CLUSTER["chief"]
  with pytest.raises(spec_lib.ClusterSpecError, match="cannot leave out every worker"):
    cluster.without([TaskId(JobType.WORKER, i) for i in range(3)])
  with pytest.raises(spec_lib.ClusterSpecError, match="cannot leave out every ps"):
    cluster.without([TaskId(JobType.PS, i) for i in range(3)])
  with pytest.raises(spec_lib.ClusterSpecError, match="only workers and ps"):
    cluster.without([TaskId(JobType.CHIEF, 0)])
  # A task named by the whole cluster (as its notices name it), in the reduced one.
  left_out = [TaskId(JobType.WORKER, 1), TaskId(JobType.PS, 0)]
  for task in (TaskId(JobType.PS, 1), TaskId(JobType.PS, 2), TaskId(JobType.WORKER, 2),
               TaskId(JobType.WORKER, 0), TaskId(JobType.CHIEF, 0)):
    assert reduced.address(spec_lib.renumbered(task, left_out)) == cluster.address(task)
  assert spec_lib.renumbered(TaskId(JobType.PS, 0), left_out) is None


def test_a_chief_shares_a_host_when_a_ps_or_worker_has_its_host_part():
  local = spec_lib.ClusterSpec.from_dict({"chief": ["localhost:1", "localhost:2"],
                                      "ps": ["localhost:3"], "worker": ["localhost:4"]})
  apart = spec_lib.ClusterSpec.from_dict({"chief": ["c0:1", "c1:1"], "ps": ["p0:1"],
                                      "worker": ["w0:1", "c0:2"]})
  chief = lambda i: spec_lib.TaskId(spec_lib.JobType.CHIEF, i)
  assert spec_lib.shares_host(local, chief(1))
  assert spec_lib.shares_host(apart, chief(0))  # A worker runs beside it.
  assert not spec_lib.shares_host(apart, chief(1))  # Only the other chief on another host.
