"""`tfps k8s`: print the Kubernetes manifests (TFJob + NetworkPolicy) as YAML."""

import sys

import yaml

from tfps.cluster import k8s
from tfps.base import errors
from tfps.commands import run_spec

# Settings the manifest renders itself (the model volume, the pods' grace).
_MANIFEST_OWN = frozenset({"model_dir", "grace_seconds"})


def run(flags) -> errors.ExitCode:
  spec = run_spec.from_flags(flags)
  config = k8s.JobManifestConfig(
      name=flags.job, image=flags.image or "", num_ps=flags.num_ps,
      num_workers=flags.num_workers,
      model_dir=spec.model_dir or f"/model/{flags.job}",
      volume_claim=flags.volume_claim or None, grace_seconds=spec.grace_seconds,
      # Every setting of the run, from its spec's fields: none can be left out.
      extra_flags=tuple(spec.to_flags(leave_out=_MANIFEST_OWN)))
  yaml.safe_dump_all(k8s.render(config), sys.stdout, sort_keys=False)
  return errors.ExitCode.OK
