"""The chief: strategy + ClusterCoordinator, PS-aware Orbit trainer/evaluator, experiments."""
