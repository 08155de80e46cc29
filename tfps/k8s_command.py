"""`tfps k8s`: print the Kubernetes manifests (TFJob + NetworkPolicy) as YAML."""

import sys

import yaml

from tfps.cluster import k8s
from tfps.base import errors

# `tfps run` flags passed through to every replica when set.
_FORWARDED = ("experiment", "train_steps", "steps_per_loop", "steps_per_closure",
              "checkpoint_interval", "max_to_keep", "mode", "global_batch_size", "seed",
              "worker_timeout", "max_restarts")


def run(flags) -> errors.ExitCode:
  extra = tuple(f"--{name}={getattr(flags, name)}" for name in _FORWARDED
                if getattr(flags, name) is not None)
  config = k8s.JobManifestConfig(
      name=flags.job, image=flags.image or "", num_ps=flags.num_ps,
      num_workers=flags.num_workers,
      model_dir=flags.model_dir or f"/model/{flags.job}",
      volume_claim=flags.volume_claim or None, grace_seconds=flags.grace_seconds,
      extra_flags=extra)
  yaml.safe_dump_all(k8s.render(config), sys.stdout, sort_keys=False)
  return errors.ExitCode.OK
