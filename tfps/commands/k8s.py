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
      num_workers=flags.num_workers, max_workers=flags.max_workers,
      chief_standby=flags.chief_standby,
      model_dir=spec.model_dir or f"/model/{flags.job}",
      volume_claim=flags.volume_claim or None, grace_seconds=spec.grace_seconds,
      # Every setting of the run, from its spec's fields: none can be left out.
      extra_flags=tuple(spec.to_flags(leave_out=_MANIFEST_OWN)))
  render = _RENDERERS[config_lib.ManifestFormat(flags.format)]
  # Above the workers every pod names, the chief's pod would exit 2 and fail the job.
  workers, flag = ((config.max_workers, "max_workers") if config.elastic
                   else (config.num_workers, "num_workers"))
  if spec.min_workers is not None and spec.min_workers > workers:
    raise errors.UsageError(f"min_workers ({spec.min_workers}) must be at most {flag} ({workers})")
  yaml.safe_dump_all(render(config), sys.stdout, sort_keys=False)
  return errors.ExitCode.OK
