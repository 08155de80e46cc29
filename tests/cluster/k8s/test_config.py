"""What `tfps k8s` deploys is checked once, whatever the format: one line naming the field."""

import pytest

from tfps.base import errors
from tfps.cluster.k8s import config as config_lib


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="Bad_Name"), "name ('Bad_Name') must be a DNS label"),
    (dict(image=""), "image: required"),
    (dict(num_workers=0), "num_workers (0) must be a positive integer"),
    (dict(num_workers=3, max_workers=2), "max_workers (2) must be an integer >= num_workers (3)"),
    (dict(model_dir="/model/x", volume_claim=None), "volume_claim is required"),
    (dict(model_dir="/elsewhere"), "must be under /model/"),
])
def test_bad_manifest_config(kwargs, message):
  args = dict(name="job", image="img")
  args.update(kwargs)
  with pytest.raises(errors.UsageError) as raised:
    config_lib.JobManifestConfig(**args)
  assert message in str(raised.value)
