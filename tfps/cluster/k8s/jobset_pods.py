"""The pods a JobSet's controllers would create from a rendered manifest: pure.

For each replicated job, JobSet creates `replicas` Jobs named
`<jobset>-<rjob>-<job index>`, labels their pods with the JobSet's name, the
replicated job's name and the job index, and (DNS hostnames on) sets the pods'
subdomain; the Job controller gives pod `i` of an Indexed Job the hostname
`<job name>-<i>` and `JOB_COMPLETION_INDEX=i` in its env. The container's env
entries taken from pod labels (`fieldRef: metadata.labels['...']`) are
resolved as the kubelet would. This is what the manifest's command sees in a
pod: used to check the manifest against `jobset_env`, and to play a JobSet on
this machine without an API server.
"""

import re

from tfps.cluster.k8s import jobset_env
from tfps.cluster.k8s.planned_pod import PlannedPod

_LABEL_REF = re.compile(r"metadata\.labels\['([^']+)'\]")


def planned_pods(manifest: dict) -> list[PlannedPod]:
  """Every pod of a JobSet manifest, in replicated-job order."""
  name = manifest["metadata"]["name"]
  network = manifest["spec"].get("network", {})
  subdomain = network.get("subdomain") or name
  pods = []
  for rjob in manifest["spec"]["replicatedJobs"]:
    for job_index in range(rjob.get("replicas", 1)):
      job = rjob["template"]["spec"]
      labels = {jobset_env.LABELS[jobset_env.JOBSET_NAME]: name,
                jobset_env.LABELS[jobset_env.REPLICATED_JOB_NAME]: rjob["name"],
                jobset_env.LABELS[jobset_env.JOB_INDEX]: str(job_index),
                **job["template"].get("metadata", {}).get("labels", {})}
      (container,) = job["template"]["spec"]["containers"]
      for index in range(job.get("completions", 1)):
        hostname = f"{name}-{rjob['name']}-{job_index}-{index}"
        env = {jobset_env.JOB_COMPLETION_INDEX: str(index), jobset_env.HOSTNAME: hostname}
        for entry in container.get("env", ()):
          env[entry["name"]] = _value(entry, labels)
        pods.append(PlannedPod(
            replicated_job=rjob["name"], index=index, hostname=hostname, subdomain=subdomain,
            argv=tuple(container["command"]) + tuple(container.get("args", ())),
            env=tuple(sorted(env.items()))))
  return pods


def _value(entry: dict, labels: dict) -> str:
  if "value" in entry:
    return entry["value"]
  path = entry["valueFrom"]["fieldRef"]["fieldPath"]
  label = _LABEL_REF.fullmatch(path)
  if not label:
    raise ValueError(f"env {entry['name']}: only pod labels are resolved, not {path!r}")
  return labels.get(label.group(1), "")
