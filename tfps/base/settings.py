"""Every setting of a training run: its one default and its help, in one table.

The flags (`tfps.commands.cli`), the run spec (`tfps.commands.run_spec.RunSpec`), the
coordinator's configuration (`CoordinatorConfig`), the supervisor's and the
local cluster's take their defaults from here, so a run gets the same
settings however it is started: `tfps local`, `tfps run` from a rendered
manifest, or the Python API. Values only: each user validates its own.
"""

import dataclasses
import types
from typing import Any


@dataclasses.dataclass(frozen=True)
class Setting:
  """One run setting.

  Attributes:
    name: its flag's and its fields' name.
    section: `training` (what to train) or `supervision` (how the chief
      keeps it running).
    kind: the flag's type: string, integer, float, bool, list or enum.
    default: the default (a list's: a tuple).
    help: the flag's help, for `tfps CMD --help`.
    choices: an enum's values.
  """

  name: str
  section: str
  kind: str
  default: Any
  help: str
  choices: tuple[str, ...] = ()


RUN_SETTINGS = (
    Setting("experiment", "training", "string", 'ctr',
            'Built-in experiment name or package.module:factory.'),
    Setting("experiment_params", "training", "list", (),
            'Experiment settings as key=value, e.g. vocab_sizes=3000:2000,hidden=32:16.'),
    Setting("model_dir", "training", "string", None,
            'Checkpoints, summaries, events. tfps local: default a new temp dir.'),
    Setting("mode", "training", "enum", 'train_and_eval',
            'What to run.',
            choices=('train', 'train_and_eval', 'eval')),
    Setting("train_steps", "training", "integer", 2000,
            'Total training steps (global step to reach).'),
    Setting("train_epochs", "training", "integer", None,
            'Epochs of a finite training dataset to train (instead of --train_steps): ends '
            'when every example has been handed out that many times.'),
    Setting("input_shards", "training", "integer", None,
            'Shards the finite training input is split into to keep its position (default: '
            'about one closure of batches each, at most 256; one per worker for an input '
            'whose shards each read all the data, such as a shard of records).'),
    Setting("steps_per_loop", "training", "integer", 200,
            'Steps per Orbit loop (progress/summary cadence).'),
    Setting("max_closure_seconds", "training", "float", 0.5,
            "Longest a closure should run, in seconds (0: no bound): where steps are slow, "
            "closures hold fewer of them than --steps_per_closure, so that the closure a "
            "lost worker was running costs about this much to run again elsewhere."),
    Setting("steps_per_closure", "training", "integer", 50,
            'Steps in one remote closure on a worker.'),
    Setting("fast_start", "training", "bool", True,
            'Start each coordinator with fast-start closures (5 steps per loop iteration: '
            "ready in seconds, ~9% slower per step) and write the closures out once the run's "
            'training left repays it (with --trace_cache: the write-out outlasts the '
            'coordinator), else once the coordinator has lived long enough to repay it, or '
            "at once when this run's recent coordinators lived that long."),
    Setting("trace_cache", "training", "bool", True,
            'Store the traced train closures in model_dir/traces, so that a restarted '
            'coordinator of the same program and configuration rebuilds them in a fraction '
            'of a second instead of tracing them again.'),
    Setting("rerun_slow_closures", "training", "bool", True,
            'Run a closure again on another worker when its worker holds it far beyond '
            'the time recent closures took and does not answer (paused, live-migrating), '
            'or answers but is 8x slower; the first run, when its worker wakes, stops at '
            'its next check (every 10 steps) and its outcome is dropped.'),
    Setting("checkpoint_interval", "training", "integer", 200,
            'Save a checkpoint every this many steps: the steps a ps or chief loss can roll '
            'back (an asynchronous save stops training for milliseconds).'),
    Setting("async_checkpoint", "training", "bool", True,
            'Save checkpoints in the background: training stops only while each ps copies '
            'its variables into memory (which then holds them twice).'),
    Setting("max_to_keep", "training", "integer", 3,
            'Checkpoints to keep.'),
    Setting("eval_steps", "training", "integer", None,
            'Eval batches per evaluation (default: the whole eval set).'),
    Setting("eval_interval", "training", "integer", None,
            'train_and_eval: steps between evaluations (default: once, at the end).'),
    Setting("eval_shards", "training", "integer", None,
            'Closures per evaluation (default: 4 per worker the cluster spec names).'),
    Setting("global_batch_size", "training", "integer", 512,
            'Examples per training step (each step runs on one worker).'),
    Setting("seed", "training", "integer", 0,
            'Seed of the synthetic data and initialisation.'),
    Setting("ready_timeout", "supervision", "float", 180.0,
            'Seconds the chief waits for every task to answer.'),
    Setting("min_shard_bytes", "training", "integer", 64 << 20,
            'Split variables larger than this across the ps tasks (0: never).'),
    Setting("ps_timeout", "supervision", "float", 60.0,
            'chief: seconds a ps may not answer (a network partition hangs TF rather than '
            'failing it) before the coordinator counts it lost, exits 170 and is restarted '
            'from the latest checkpoint (0: no deadline). The supervisor holds it to the '
            'same deadline 8 s later, from outside.'),
    Setting("max_restarts", "supervision", "integer", 3,
            'Coordinator (chief) restarts allowed within --restart_window.'),
    Setting("restart_window", "supervision", "float", 600.0,
            "Seconds of the restart budget's window."),
    Setting("cluster_wait_seconds", "supervision", "float", 600.0,
            'chief: seconds to wait for lost tasks before exiting 170 (retryable).'),
    Setting("worker_timeout", "supervision", "float", 60.0,
            'chief: seconds a worker may be unreachable before training goes on without it '
            '(it is taken back when it answers again).'),
    Setting("min_workers", "supervision", "integer", None,
            'chief: workers that must answer for training to run (default: every worker of '
            'the cluster spec). The others join when they answer: the coordinator saves and '
            'restarts with them. A worker is never left out if that leaves fewer.'),
    Setting("grace_seconds", "supervision", "float", 15.0,
            'Seconds between SIGTERM and the hard kill (GKE Spot pods ~15, Spot VMs ~30).'),
    Setting("warm_standby", "supervision", "bool", True,
            'chief: once training runs, keep the next coordinator process started and '
            "imported (~0.7 GB), so a restart skips TensorFlow's import."),
    Setting("ps_failover", "supervision", "bool", True,
            'chief: when a ps is lost and does not answer, restart at once on the ps that '
            'do (they then hold every variable: they need the memory) instead of waiting '
            'for it; take it back as --ps_readmit says, or at the next restart.'),
    Setting("failover_graphs", "supervision", "bool", True,
            'chief: with --ps_failover and 2 ps, once the written-out closure runs, have '
            'each worker optimize the one a failover would run (its graph cache keeps it), '
            'so that a failover does not wait ~10 s for that.'),
    Setting("ps_readmit", "supervision", "enum", 'measured',
            'chief: when to restart the coordinator (after a save) to take back a ps left '
            'out by --ps_failover that answers again. measured: once training without it '
            'has lost as much time as the restart costs (~6 s), by the speed measured with '
            'and without it; timed: after --ps_readmit_after.',
            choices=('measured', 'timed')),
    Setting("ps_readmit_after", "supervision", "float", 30.0,
            'chief: seconds a ps left out by --ps_failover must answer before it is taken '
            'back (with --ps_readmit=measured: before it may be).'),
    Setting("chief_lease_seconds", "supervision", "float", 1.0,
            'chief with a standby replica (two chief addresses): seconds without the active '
            "chief's heartbeat before the standby takes over (three times that while the "
            "active chief's host still answers: its process paused or starved)."),
    Setting("lease_generation", "supervision", "integer", 0,
            'chief, internal: the chief lease generation a coordinator runs under.'),
    Setting("exclude_tasks", "supervision", "list", (),
            'chief, internal: workers and ps the supervisor left out (e.g. worker:1).'),
)
DEFAULTS = types.MappingProxyType({s.name: s.default for s in RUN_SETTINGS})


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopSettings:
  """The coordinator's settings that a run spec (`tfps.commands.run_spec.RunSpec`) and a
  `CoordinatorConfig` both hold, the same way, with their defaults from the table.
  Each subclass validates them."""

  input_shards: int | None = DEFAULTS["input_shards"]
  steps_per_loop: int = DEFAULTS["steps_per_loop"]
  steps_per_closure: int = DEFAULTS["steps_per_closure"]
  max_closure_seconds: float = DEFAULTS["max_closure_seconds"]
  fast_start: bool = DEFAULTS["fast_start"]
  trace_cache: bool = DEFAULTS["trace_cache"]
  rerun_slow_closures: bool = DEFAULTS["rerun_slow_closures"]
  checkpoint_interval: int = DEFAULTS["checkpoint_interval"]
  async_checkpoint: bool = DEFAULTS["async_checkpoint"]
  max_to_keep: int = DEFAULTS["max_to_keep"]
  eval_steps: int | None = DEFAULTS["eval_steps"]
  eval_interval: int | None = DEFAULTS["eval_interval"]
  eval_shards: int | None = DEFAULTS["eval_shards"]
  global_batch_size: int = DEFAULTS["global_batch_size"]
  seed: int = DEFAULTS["seed"]
  ready_timeout: float = DEFAULTS["ready_timeout"]
