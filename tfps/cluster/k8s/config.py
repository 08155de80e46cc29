"""What `tfps k8s` deploys: one validated configuration for every manifest format."""

import dataclasses
import enum
import re

from tfps.base import errors
from tfps.base import settings

TF_PORT = 2222  # Every task's TF server (the training operator's default `tfjob-port`).
CONTROL_PORT = TF_PORT + 1  # recovery.notices: the chief's TF port + 1.
MODEL_MOUNT = "/model"
# Time left after tfps's own grace period, for the process to exit.
GRACE_MARGIN_SECONDS = 5
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class ManifestFormat(str, enum.Enum):
  """Which controller runs the job."""

  JOBSET = "jobset"  # JobSet (jobset.x-k8s.io/v1alpha2): plain Jobs, no operator of its own.
  TFJOB = "tfjob"  # Kubeflow training-operator v1 (in maintenance): the legacy path.


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobManifestConfig:
  """What to deploy.

  Attributes:
    name: the job's name (a DNS label; JobSet pod names are built from it).
    image: container image with tfps installed.
    num_ps, num_workers: replica counts (the workers the job starts with).
    max_workers: elastic workers (JobSet only): every pod's cluster spec
      names this many workers, so the worker Job can be scaled up to it while
      the job runs; None renders a fixed number of workers.
    model_dir: a bucket path (`gs://...`, `s3://...`), or a path under the
      shared volume claim `volume_claim` mounted at /model.
    volume_claim: name of a ReadWriteMany PersistentVolumeClaim, or None
      when `model_dir` is a bucket path.
    model_mount: where the claim is mounted in every pod.
    grace_seconds: tfps `--grace_seconds` (Spot pods get about 15).
    extra_flags: more `tfps run` flags (experiment, steps, ...).
    cpu, memory: resource requests per pod.
    chief_standby: a second chief pod stands by and takes over when the
      first is lost (`recovery.chief_lease`; JobSet only).
  """

  name: str
  image: str
  num_ps: int = 2
  num_workers: int = 2
  max_workers: int | None = None
  model_dir: str = f"{MODEL_MOUNT}/run"
  volume_claim: str | None = "tfps-model"
  model_mount: str = MODEL_MOUNT
  grace_seconds: float = settings.DEFAULTS["grace_seconds"]
  extra_flags: tuple[str, ...] = ()
  cpu: str = "1"
  memory: str = "2Gi"
  chief_standby: bool = False

  def __post_init__(self):
    if not _DNS_LABEL.fullmatch(self.name):
      raise errors.UsageError(f"name ({self.name!r}) must be a DNS label (a-z, 0-9, -)")
    if not self.image:
      raise errors.UsageError("image: required (an image with tfps installed)")
    for field in ("num_ps", "num_workers"):
      if getattr(self, field) < 1:
        raise errors.UsageError(f"{field} ({getattr(self, field)}) must be a positive integer")
    if self.max_workers is not None and not (
        isinstance(self.max_workers, int) and self.max_workers >= self.num_workers):
      raise errors.UsageError(f"max_workers ({self.max_workers!r}) must be an integer >= "
                              f"num_workers ({self.num_workers})")
    if not self.bucket_model_dir and not self.volume_claim:
      raise errors.UsageError(
          f"model_dir ({self.model_dir!r}) is not a bucket path, so volume_claim is required")
    if not self.bucket_model_dir and not self.model_dir.startswith(self.model_mount + "/"):
      raise errors.UsageError(f"model_dir ({self.model_dir!r}) must be under "
                              f"{self.model_mount}/ (the shared volume)")
    if self.grace_seconds <= 2:
      raise errors.UsageError(f"grace_seconds ({self.grace_seconds}) must be more than 2")

  @property
  def elastic(self) -> bool:
    return self.max_workers is not None

  @property
  def bucket_model_dir(self) -> bool:
    return self.model_dir.startswith(("gs://", "s3://"))
