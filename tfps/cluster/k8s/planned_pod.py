"""One pod a manifest's controllers would create: what a player starts (`player`)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class PlannedPod:
  """One pod: its DNS name parts, its container's command line and env."""

  replicated_job: str  # Its role: a JobSet's replicated job, a TFJob's replica type.
  index: int  # Its task index in the role.
  hostname: str
  subdomain: str
  argv: tuple[str, ...]
  env: tuple[tuple[str, str], ...]

  @property
  def dns_name(self) -> str:
    return f"{self.hostname}.{self.subdomain}"
