"""tfps: fault-tolerant parameter-server training for TensorFlow.

The user API, importable from `tfps` itself:

    from tfps import Experiment, ExperimentContext

* `Experiment`, `ExperimentContext`: what an experiment factory returns and receives
  (`tfps.coordinator.experiment`).
* `pull`, `Pulled`, `DeduplicateOnDevice`: one transfer per ps for a step's rows and
  weights (`tfps.coordinator.pull_push`).
* `TfpsError`, `UsageError`, `PermanentError`, `NonFiniteLossError`,
  `BadCheckpointError`, `RetryableError`, `Preempted`, `ExitCode`: the error types and
  exit codes (`tfps.base.errors`).

The parts, one package per concern (docs/architecture.md): `tfps.base` (the ground
floor), `tfps.cluster` (who is in the job and where, local processes), `tfps.recovery`
(what happens when something fails), `tfps.chaos` (faults on purpose, and how a run is
judged), `tfps.ps_worker` (the server side of a ps or worker), `tfps.fast_restart`,
`tfps.input` and `tfps.coordinator` (the chief's training program), `tfps.examples`
(the built-in experiments), `tfps.bench` and `tfps.commands` (the command line). The names
above are loaded on first use: `import tfps` alone does not import TensorFlow, so the
command line stays quick to answer.
"""

import importlib
from typing import Any

# Exported name -> the module that defines it.
_EXPORTS = {
    "Experiment": "tfps.coordinator.experiment",
    "ExperimentContext": "tfps.coordinator.experiment",
    "pull": "tfps.coordinator.pull_push",
    "Pulled": "tfps.coordinator.pull_push",
    "DeduplicateOnDevice": "tfps.coordinator.pull_push",
    "TfpsError": "tfps.base.errors",
    "UsageError": "tfps.base.errors",
    "PermanentError": "tfps.base.errors",
    "NonFiniteLossError": "tfps.base.errors",
    "BadCheckpointError": "tfps.base.errors",
    "RetryableError": "tfps.base.errors",
    "Preempted": "tfps.base.errors",
    "ExitCode": "tfps.base.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
  module = _EXPORTS.get(name)
  if module is None:
    raise AttributeError(f"module 'tfps' has no attribute {name!r}")
  value = getattr(importlib.import_module(module), name)
  globals()[name] = value  # Looked up once.
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_EXPORTS))
