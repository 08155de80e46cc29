"""What a Job does with a failed pod, by Kubernetes' `podFailurePolicy` rules: pure.

Kubernetes evaluates a Job's rules in order and applies the first that
matches the failed pod: `FailJob` (the Job fails at once, reason
`PodFailurePolicy`), `Ignore` (a replacement pod, not counted toward the
backoff limit), `FailIndex` (only this index fails), `Count` (counted, as
when no rule matches). An `onExitCodes` rule matches when a container's exit
code is `In` (or `NotIn`) its values, only that container's when the rule
names one; an `onPodConditions` rule when the pod has one of its conditions
with that status. Used to check rendered manifests against tfps's exit codes
and to play a manifest's semantics without a cluster.
"""

import enum
from typing import Mapping, Sequence


class PodFailureAction(str, enum.Enum):
  FAIL_JOB = "FailJob"
  FAIL_INDEX = "FailIndex"
  IGNORE = "Ignore"
  COUNT = "Count"


def action_for(rules: Sequence[Mapping], *, container: str, exit_code: int,
               conditions: Mapping[str, str] | None = None) -> PodFailureAction:
  """The action for a pod whose `container` exited `exit_code`, with pod `conditions`.

  `conditions` maps a pod condition type to its status ("True"/"False").
  """
  conditions = conditions or {}
  for rule in rules:
    if _matches(rule, container, exit_code, conditions):
      return PodFailureAction(rule["action"])
  return PodFailureAction.COUNT


def _matches(rule: Mapping, container: str, exit_code: int,
             conditions: Mapping[str, str]) -> bool:
  on_exit = rule.get("onExitCodes")
  if on_exit is not None:
    # Kubernetes never checks a container that succeeded (exit 0).
    if exit_code == 0 or on_exit.get("containerName") not in (None, container):
      return False
    listed = exit_code in on_exit["values"]
    return listed if on_exit["operator"] == "In" else not listed
  return any(conditions.get(c["type"]) == c.get("status", "True")
             for c in rule.get("onPodConditions", ()))
