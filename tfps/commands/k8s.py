"""`tfps k8s`: print the Kubernetes manifests as YAML (a JobSet by default, or a TFJob)."""

import sys

import yaml

from tfps.base import errors
from tfps.cluster.k8s import config as config_lib
from tfps.cluster.k8s import jobset
from tfps.cluster.k8s import tfjob
from tfps.commands import run_spec

# Settings the manifest renders itself (the model volume, the pods' grace).
_MANIFEST_OWN = frozenset({"model_dir", "grace_seconds"})
_RENDERERS = {config_lib.ManifestFormat.JOBSET: jobset.render,
              config_lib.ManifestFormat.TFJOB: tfjob.render}


def run(flags) -> errors.ExitCode:
  spec = run_spec.from_flags(flags)
  config = config_lib.JobManifestConfig(
      name=flags.job, image=flags.image or "", num_ps=flags.num_ps,
      num_workers=flags.num_workers, chief_standby=flags.chief_standby,
      model_dir=spec.model_dir or f"/model/{flags.job}",
      volume_claim=flags.volume_claim or None, grace_seconds=spec.grace_seconds,
      # Every setting of the run, from its spec's fields: none can be left out.
      extra_flags=tuple(spec.to_flags(leave_out=_MANIFEST_OWN)))
  render = _RENDERERS[config_lib.ManifestFormat(flags.format)]
  yaml.safe_dump_all(render(config), sys.stdout, sort_keys=False)
  return errors.ExitCode.OK
