"""`tfps k8s`: print the Kubernetes manifests (TFJob + NetworkPolicy) as YAML."""

import sys

import yaml

from tfps.cluster import k8s
from tfps.base import errors
from tfps import local_command


def run(flags) -> errors.ExitCode:
  model_dir = flags.model_dir or f"/model/{flags.job}"
  # The chief's flags exactly as `tfps local` hands them to its chief: one
  # list, so no setting can be left out here (model_dir and grace_seconds
  # are the manifest's own).
  extra = tuple(f for f in local_command.chief_flags(flags, model_dir)
                if not f.startswith(("--model_dir=", "--grace_seconds=")))
  config = k8s.JobManifestConfig(
      name=flags.job, image=flags.image or "", num_ps=flags.num_ps,
      num_workers=flags.num_workers,
      model_dir=model_dir,
      volume_claim=flags.volume_claim or None, grace_seconds=flags.grace_seconds,
      extra_flags=extra)
  yaml.safe_dump_all(k8s.render(config), sys.stdout, sort_keys=False)
  return errors.ExitCode.OK
