"""Kubernetes' podFailurePolicy, as `pod_failure` evaluates it."""

from tfps.cluster.k8s import pod_failure

Action = pod_failure.PodFailureAction
RULES = [
    {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In",
                                          "values": [1, 2]}},
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    {"action": "FailIndex", "onExitCodes": {"operator": "NotIn", "values": [1, 2, 143]}},
]


def _action(code, container="main", **conditions):
  return pod_failure.action_for(RULES, container=container, exit_code=code,
                                conditions=conditions)


def test_the_first_matching_rule_decides():
  assert _action(2, DisruptionTarget="True") == Action.FAIL_JOB
  assert _action(143, DisruptionTarget="True") == Action.IGNORE


def test_a_rule_naming_a_container_ignores_the_others():
  assert _action(1) == Action.FAIL_JOB
  assert _action(1, container="sidecar") == Action.COUNT  # The FailJob rule is main's.


def test_not_in_and_no_match():
  assert _action(137) == Action.FAIL_INDEX
  assert _action(143) == Action.COUNT  # Listed by NotIn, no other rule: counted.
  assert _action(143, DisruptionTarget="False") == Action.COUNT


def test_a_container_that_succeeded_matches_no_exit_code_rule():
  assert _action(0) == Action.COUNT
