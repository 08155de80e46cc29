"""The coordinator's program: connect, build the experiment, run Orbit, checkpoint.

On the chief task, `tfps run` is a supervisor (`recovery.supervisor`) whose
child process, the *coordinator*, runs this; `tfps run --nosupervise` runs it
in the chief's own process. `run_coordinator(CoordinatorConfig(...))` does:

  1. check that `model_dir` is writable and the experiment can be found (fast
     failures, before touching the cluster);
  2. wait for the ps and workers, build ParameterServerStrategy + coordinator;
  3. call the experiment factory in the strategy's scope, make its trainer
     and evaluator parameter-server aware;
  4. restore the latest checkpoint of `model_dir` ("restored <path> at step N");
  5. run `orbit.Controller` in the chosen mode, checkpointing every
     `checkpoint_interval` steps and at the end, with TensorBoard summaries in
     `model_dir` (eval summaries in `model_dir/eval`), a progress line per
     train loop on stderr (absl logging) and a record per loop in
     `model_dir/progress.jsonl` (recovery.progress_log; one `restored` record at
     start);
  6. return a `CoordinatorResult`.

Running again with the same `model_dir` and a larger `train_steps` resumes
from the checkpoint. Errors are raised by type (base.errors): bad input
is a UsageError, user code failing or an incompatible checkpoint a
PermanentError, losing the cluster a RetryableError. The library prints
nothing: orbit.Controller's own stdout lines are discarded (they are also
logged), since stdout carries the command line's JSON result.
"""

import contextlib
import dataclasses
import io
import logging as py_logging
import os
from typing import Any, Callable, Mapping

from absl import logging
import numpy as np
import orbit
import tensorflow as tf

from tfps.cluster import readiness
from tfps.cluster import spec as spec_lib
from tfps.coordinator import api
from tfps.coordinator import checkpoints
from tfps.recovery import closure_plan
from tfps.input import datasets
from tfps.input import positioned as positioned_lib
from tfps.coordinator import evaluator as evaluator_lib
from tfps.coordinator import experiment as experiment_lib
from tfps.coordinator import first_ops
from tfps.coordinator import loop_ends
from tfps.coordinator import loop_guard
from tfps.base import messages
from tfps.coordinator import progress
from tfps.coordinator import ps_deadline
from tfps.coordinator import ps_state
from tfps.coordinator import strategy as strategy_lib
from tfps.fast_restart import trace_cache
from tfps.coordinator import trainer as trainer_lib
from tfps.recovery import notices
from tfps.base import errors
from tfps.recovery import interrupts as interrupts_lib
from tfps.recovery import events as events_lib
from tfps.recovery import chief_lease
from tfps.recovery import progress_log


# The value types live in coordinator.api; these names are the coordinator's API.
Mode = api.Mode
RunStatus = api.RunStatus
CoordinatorConfig = api.CoordinatorConfig
CoordinatorResult = api.CoordinatorResult


class _Discard(io.TextIOBase):
  def write(self, text: str) -> int:
    return len(text)


class _RoutineLines(py_logging.Filter):
  """Drops lines that say nothing to a person watching the chief.

  Orbit's "did not update `global_step` by N" warning: the global step
  counts each scheduled step once (`trainer.PSTrainer` takes back the steps
  TensorFlow re-ran in retried closures, and reports them), so it can only
  mean a loop cut short by an interrupt, which the trainer logs itself before
  the chief saves, or one that ended at a shard's end a few steps short
  (`coordinator.loop_ends`), trained in the next loop. TensorFlow's
  asynchronous checkpoint writer says three lines per save (started, synced,
  its counter); Orbit's "saved checkpoint" line stays. TensorFlow's warning
  that a strategy method runs outside `ClusterCoordinator.schedule` comes
  once per traced step (dozens at every coordinator start), also when the
  trace is schedule()'s own: it is kept once, since a user's own call outside
  schedule() would say the same.
  """

  _DROPPED = ("did not update `global_step`", "Starting async checkpoint save",
              "Sync on ongoing save/restore", "Initializing async checkpoint's save_counter",
              "Sync on async checkpoint saving")
  _ONCE = ("is invoked without using `ClusterCoordinator.schedule`",)

  def __init__(self):
    super().__init__()
    self._seen: set[str] = set()

  def filter(self, record: py_logging.LogRecord) -> bool:
    message = str(record.msg)
    for part in self._ONCE:
      if part in message:
        if part in self._seen:
          return False
        self._seen.add(part)
    return not any(part in message for part in self._DROPPED)


@contextlib.contextmanager
def routine_lines_dropped():
  """Filters `_RoutineLines` out of the absl and TensorFlow loggers while it is open."""
  routine = _RoutineLines()
  loggers = [py_logging.getLogger(name) for name in ("absl", "tensorflow")]
  for logger in loggers:
    logger.addFilter(routine)
  try:
    yield
  finally:
    for logger in loggers:
      logger.removeFilter(routine)


class _Controller(orbit.Controller):
  """orbit.Controller whose restore checks the checkpoint fits the model."""

  def __init__(self, *, experiment_name: str, **kwargs):
    self._experiment_name = experiment_name
    self.restored = None
    super().__init__(**kwargs)

  def restore_checkpoint(self, checkpoint_path: str | None = None) -> str | None:
    with self.strategy.scope():
      self.restored = checkpoints.restore(
          self.checkpoint_manager, self.global_step, experiment=self._experiment_name,
          path=checkpoint_path)
    return self.restored


def _looped_seconds(config: CoordinatorConfig, runtime) -> closure_plan.Plans:
  """How long this coordinator trains looped before writing out (`closure_plan`), by
  what its write-out costs: traced here (and its failover graph built ahead, as
  `PSTrainer` has it built), stored by an earlier coordinator, or stored but cold on
  the workers."""
  if not config.fast_start:
    return closure_plan.Plans(0.0, 0.0, 0.0)
  records = progress_log.ProgressLog(config.model_dir).read_new()  # This run's, so far.
  events = events_lib.EventLog(config.model_dir).read()
  return closure_plan.plans(records, events, trace_cache=config.trace_cache,
                            replaced_soon=bool(config.tasks_expected_back),
                            train_steps=config.train_steps,
                            failover_graph=trainer_lib.builds_failover_graphs(
                                runtime.cluster, config.trace_cache, config.failover_graphs))


def _learn_step_seconds(trainer: "trainer_lib.PSTrainer", config: CoordinatorConfig,
                        runtime) -> None:
  """Gives `trainer` the run's recent step time if it knows none yet."""
  if trainer.step_seconds is None:
    trainer.step_seconds = _recent_step_seconds(config, runtime)


def _recent_step_seconds(config: CoordinatorConfig, runtime) -> float | None:
  """A worker's seconds per step in the run's latest loops, for this one's first closures."""
  records = progress_log.ProgressLog(config.model_dir).read_new()
  return closure_plan.recent_step_seconds(records, runtime.num_workers)


def _trace_cache(config: CoordinatorConfig) -> trace_cache.TraceCache | None:
  """Where the train closures' traces are kept, for what shapes them (`trace_cache`)."""
  if not config.trace_cache:
    return None
  return trace_cache.TraceCache(
      os.path.join(config.model_dir, "traces"),
      {"experiment": config.experiment, "experiment_params": dict(config.experiment_params),
       "global_batch_size": config.global_batch_size, "seed": config.seed,
       "min_shard_bytes": config.min_shard_bytes})


def _adapt_trainer(experiment: experiment_lib.Experiment, runtime: strategy_lib.PSRuntime,
                   config: CoordinatorConfig, pause, ends: loop_ends.LoopEnds, saved_ledger):
  """The experiment's trainer made PS-aware; None where the mode needs none.
  `saved_ledger`: the input ledger of the checkpoint it restores, if any."""
  trainer = experiment.trainer if config.mode != Mode.EVAL else None
  if isinstance(trainer, orbit.StandardTrainer) and not isinstance(trainer, trainer_lib.PSTrainer):
    looped = _looped_seconds(config, runtime)
    options = trainer_lib.LoopOptions(
        steps_per_closure=config.steps_per_closure,
        max_closure_seconds=config.max_closure_seconds,
        step_seconds=_recent_step_seconds(config, runtime), input_shards=config.input_shards,
        loop_slack=ends.slack, looped_seconds=looped.traced, looped_seconds_stored=looped.stored,
        looped_seconds_cold=looped.cold,
        trace_cache=_trace_cache(config), failover_graphs=config.failover_graphs,
        rerun_slow_closures=config.rerun_slow_closures)
    trainer = trainer_lib.PSTrainer(trainer, runtime, options, pause=pause,
                                    global_step=experiment.global_step,
                                    saved_ledger=saved_ledger)
  return trainer


def _adapt_evaluator(experiment: experiment_lib.Experiment, runtime: strategy_lib.PSRuntime,
                     config: CoordinatorConfig):
  """The experiment's evaluator made PS-aware; None where the mode needs none."""
  evaluator = experiment.evaluator if config.mode != Mode.TRAIN else None
  if isinstance(evaluator, orbit.StandardEvaluator):
    evaluator = evaluator_lib.PSEvaluator(evaluator, runtime,
                                          num_shards=_eval_shards(config, runtime))
  return evaluator


def _eval_shards(config: CoordinatorConfig, runtime: strategy_lib.PSRuntime) -> int:
  """--eval_shards, else 4 for every worker of the job's spec, those left out too.

  Not per worker present: a resize would then change the shards, and with them
  which batches a partial evaluation (--eval_steps) reads, so the same model
  would score differently on 2 workers and on 3.
  """
  left_out = sum(spec_lib.TaskId.parse(task).job == spec_lib.JobType.WORKER
                 for task in config.tasks_left_out)
  return config.eval_shards or 4 * (runtime.num_workers + left_out)


def _loop_ends(config: CoordinatorConfig) -> loop_ends.LoopEnds:
  """Loops end on checkpoint boundaries, up to less than half a closure short."""
  return loop_ends.LoopEnds(
      config.steps_per_loop, config.checkpoint_interval,
      slack=loop_ends.slack_for(config.steps_per_closure, config.checkpoint_interval))


def _train_steps(config: CoordinatorConfig, ledger) -> int:
  """The step to train to: `train_steps`, or `train_epochs` whole epochs of the input."""
  epochs = getattr(config, "train_epochs", None)
  if not epochs:
    return config.train_steps
  if ledger is None:
    raise errors.UsageError(
        f"train_epochs ({epochs}) needs a finite train dataset (one epoch, no repeat()) "
        "read by the runtime; use --train_steps for endless input")
  return epochs * ledger.batches_per_epoch


def _input_summary(trainer, ledger) -> dict[str, Any]:
  """What this coordinator knows of the input, for the result (the run's is in coverage)."""
  summary = {"positioned": ledger is not None,
             "reexecuted_steps": getattr(trainer, "reexecuted_steps", 0)}
  if ledger is not None:
    summary.update(shards=ledger.num_shards, batches_per_epoch=ledger.batches_per_epoch,
                   epoch=ledger.epoch, epochs_completed=ledger.epochs_completed)
  return summary


def _require_parts(config: CoordinatorConfig, experiment: experiment_lib.Experiment) -> None:
  if config.mode != Mode.EVAL and experiment.trainer is None:
    raise errors.UsageError(
        f"mode ({config.mode.value}) needs a trainer; experiment {config.experiment!r} has none")
  if config.mode != Mode.TRAIN and experiment.evaluator is None:
    raise errors.UsageError(
        f"mode ({config.mode.value}) needs an evaluator; "
        f"experiment {config.experiment!r} has none")


def _floats(output: Mapping[str, Any] | None) -> dict[str, float]:
  result = {}
  for key, value in (output or {}).items():
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if array.size == 1 and np.issubdtype(array.dtype, np.number):
      result[key] = float(array)
  return result


def input_cannot_end(train_dataset, *, num_workers: int, num_replicas_in_sync: int,
                     steps: int) -> bool:
  """True if one worker's share of `train_dataset` provably holds >= `steps` batches.

  Then an OutOfRangeError in training is not input that ran out but a broken
  iterator. Seen on virtual hosts (docs/partitions.md): after a ps cut healed,
  connection resets failed the new coordinator's first closures and a
  worker's iterator of an endless stream then reported "End of sequence",
  which TF raises as OutOfRangeError. A new coordinator builds new
  iterators, so that is a retryable failure.
  Known only from the dataset's cardinality (INFINITE after `repeat()`, or
  a count); anything else (unknown cardinality, a structure of datasets, a
  dataset_fn that fails here) cannot be proved and stays a permanent error.
  """
  try:
    if isinstance(train_dataset, tf.data.Dataset):
      dataset = train_dataset.shard(num_workers, 0)
    elif callable(train_dataset):
      dataset = (train_dataset(tf.distribute.InputContext(
          num_input_pipelines=num_workers, input_pipeline_id=0,
          num_replicas_in_sync=num_replicas_in_sync))
                 if datasets.takes_input_context(train_dataset)
                 else train_dataset().shard(num_workers, 0))
    else:
      return False
    cardinality = int(dataset.cardinality())
  except Exception:  # pylint: disable=broad-except  (user code: cannot prove anything)
    return False
  return cardinality == tf.data.INFINITE_CARDINALITY or cardinality >= steps


# What a task answers to a request it cannot parse (an InternalError).
_UNPARSED_REQUEST = "Unable to parse request"


@contextlib.contextmanager
def _classified_errors(phase: str, input_cannot_end: Callable[[], bool] = lambda: False):
  """Turns TensorFlow and user-code failures into typed tfps errors.

  `input_cannot_end` tells an OutOfRangeError of a broken iterator from
  training input that really ran out (see `input_cannot_end`).
  """
  try:
    yield
  except errors.TfpsError:
    raise
  except (tf.errors.UnavailableError, tf.errors.AbortedError,
          tf.errors.DeadlineExceededError, tf.errors.CancelledError) as e:
    raise errors.RetryableError(
        f"lost the cluster during {phase}: {type(e).__name__}: "
        f"{messages.one_line(e.message)}") from e
  except tf.errors.OutOfRangeError as e:
    if input_cannot_end():
      raise errors.RetryableError(
          f"{phase}: a worker's input iterator ended although its input cannot run out "
          f"(broken by a transient network failure); restarting with new iterators: "
          f"{messages.one_line(e.message)}") from e
    raise errors.PermanentError(
        f"{phase}: a dataset ran out ({messages.one_line(e.message)}); a finite training "
        "dataset ran out before the length measured at this model_dir's first start: did "
        "the data change? (use a new model_dir)") from e
  except tf.errors.OpError as e:
    if isinstance(e, tf.errors.InternalError) and _UNPARSED_REQUEST in e.message:
      # A request TensorFlow's eager client garbled on its way to a task (seen once: an
      # op's device string corrupted while two threads sent ops), not the program's
      # fault: a new coordinator restores and goes on.
      raise errors.RetryableError(
          f"{phase}: a task could not parse a request TensorFlow sent it: "
          f"{messages.one_line(e.message)}") from e
    raise errors.PermanentError(
        f"{phase} failed: {type(e).__name__}: {messages.one_line(e.message)}") from e
  except Exception as e:  # User code (trainer, evaluator) raising.
    raise errors.PermanentError(
        f"{phase} failed: {type(e).__name__}: {messages.one_line(e)}") from e


@contextlib.contextmanager
def _control_channel(cluster: spec_lib.ClusterSpec, interrupts: interrupts_lib.Interrupts):
  """Serves preemption notices of ps/workers for as long as the coordinator runs."""
  address = notices.control_address(cluster)
  try:
    server = notices.ControlServer(address, interrupts.notice).start()
  except (OSError, RuntimeError) as e:  # Not fatal: training works without notices.
    logging.warning("control channel unavailable at %s (%s): preemption notices off", address, e)
    yield
    return
  try:
    yield
  finally:
    server.stop()


def run_coordinator(config: CoordinatorConfig, *,
              interrupts: interrupts_lib.Interrupts | None = None) -> CoordinatorResult:
  """Runs the coordinator to completion; see the module docstring.

  Args:
    config: what to run.
    interrupts: where stop signals and ps/worker preemption notices arrive;
      with them the coordinator serves the control channel, saves on a notice, and
      on SIGTERM saves and raises `Preempted` (see `loop_guard`).

  Raises:
    UsageError: bad configuration, experiment or model_dir.
    PermanentError: user code failed, NaN loss, incompatible checkpoint.
    RetryableError: the cluster is unreachable or was lost.
    Preempted: stopped by a signal after saving.
  """
  interrupts = interrupts or interrupts_lib.Interrupts()
  with _control_channel(config.cluster, interrupts):
    return _run_chief(config, interrupts)


def _run_chief(config: CoordinatorConfig, interrupts: interrupts_lib.Interrupts) -> CoordinatorResult:
  factory, runtime, sentinels = _connect(config)
  with _ps_deadline(config, runtime, sentinels), routine_lines_dropped():
    return _run_connected(config, interrupts, factory, runtime, sentinels)


def _connect(config: CoordinatorConfig, *, every_worker: bool = False):
  """The fast checks, then the cluster: (experiment factory, runtime, ps sentinels).
  `every_worker`: wait for every worker as long as for the ps."""
  checkpoints.check_writable(config.model_dir)
  factory = experiment_lib.load_factory(config.experiment)
  experiment_lib.check_params(config.experiment, config.experiment_params)
  watch = None
  if config.ps_timeout:  # Every task held to it while TF connects (it would wait for each).
    watch = lambda cluster: ps_deadline.PsDeadline(cluster, config.ps_timeout, connecting=True)
  runtime = strategy_lib.connect(config.cluster, ready_timeout=config.ready_timeout,
                                 min_shard_bytes=config.min_shard_bytes,
                                 workers_ready_timeout=None if every_worker
                                 else config.workers_ready_timeout, watch=watch)
  with _classified_errors("connecting"):
    sentinels = ps_state.PsSentinels(runtime.cluster)  # What each ps must keep holding.
  return factory, runtime, sentinels


def _ps_deadline(config: CoordinatorConfig, runtime: strategy_lib.PSRuntime,
                 sentinels: ps_state.PsSentinels):
  """From here on every ps must keep answering, and holding its state: a partition
  hangs TF, not fails it, and a ps back empty fails only what reads it."""
  return (ps_deadline.PsDeadline(runtime.cluster, config.ps_timeout, state_lost=sentinels.lost)
          if config.ps_timeout else contextlib.nullcontext())


@dataclasses.dataclass
class Prepared:
  """A coordinator connected and built before it is needed: a standby chief's
  (`prepare_ahead`, then `run_prepared` when it takes over)."""

  config: CoordinatorConfig
  factory: Any
  runtime: strategy_lib.PSRuntime
  sentinels: ps_state.PsSentinels
  built: "_Built"
  input_shards: int | None  # The input shards its closures were built for (positioned).
  workers_warm: int  # Workers that instantiated its train closures ahead.
  _refused: int = 0  # Checks in a row in which some ps refused connections.

  def stale(self) -> str | None:
    """Why it can no longer take over, else None: a ps no longer holds what it
    created there. Its cluster is fixed (TensorFlow connects a process once): a
    new one must be prepared. A ps whose process is gone (it refused
    connections twice in a row) or that came back empty (its sentinel read
    fails) has lost it. A silent one (paused, cut off) is looked at again: it
    comes back with its variables, and a takeover that must leave it out
    starts a cold coordinator anyway (`recovery.standby`)."""
    ps = [t for t in self.runtime.cluster.tasks() if t.job == spec_lib.JobType.PS]
    answers = readiness.answers(self.runtime.cluster, ps, _STALE_PROBE_SECONDS)
    refused = [t for t in ps if answers[t] == readiness.Answer.REFUSED]
    self._refused = self._refused + 1 if refused else 0
    if self._refused >= 2:
      return f"{refused[0]} refused connections (its process is gone)"
    # Only a ps that answered is read: a read of a silent one would wait.
    return next(filter(None, (self.sentinels.lost(t) for t in ps
                              if answers[t] == readiness.Answer.READY)), None)


# A prepared coordinator's check of its ps waits this long for each.
_STALE_PROBE_SECONDS = 1.0


def prepare_ahead(config: CoordinatorConfig, interrupts: interrupts_lib.Interrupts, *,
                  warm_timeout: float) -> Prepared:
  """Everything a coordinator does before its restore, done before it is needed.

  Connects to the whole cluster, builds the experiment and its variables on the
  ps (this coordinator's own: a coordinator's variables live in its context),
  reads the latest checkpoint's input ledger, builds the train closures and
  has every worker instantiate them (`PSTrainer.build_ahead`; up to
  `warm_timeout` seconds). Nothing is trained, saved or read from the input:
  `run_prepared` restores the latest checkpoint when it takes over.
  """
  # No ps deadline here: its loss would end this process as a coordinator's
  # failure; the caller bounds this call and retires the standby instead.
  factory, runtime, sentinels = _connect(config, every_worker=True)
  with routine_lines_dropped():  # The closures are traced here.
    built = _build(config, interrupts, factory, runtime)
    shards, warm = None, 0
    if isinstance(built.trainer, trainer_lib.PSTrainer):
      if built.trainer.positioned:
        shards = built.trainer.ensure_ledger().num_shards
      with _classified_errors("building the train closures ahead"):
        warm = built.trainer.build_ahead(warm_timeout)
  return Prepared(config=config, factory=factory, runtime=runtime, sentinels=sentinels,
                  built=built, input_shards=shards, workers_warm=warm)


def run_prepared(prepared: Prepared, interrupts: interrupts_lib.Interrupts, *,
                 lease_generation: int) -> CoordinatorResult:
  """Runs a prepared coordinator under `lease_generation`: restore, then train."""
  config = dataclasses.replace(prepared.config, lease_generation=lease_generation)
  if isinstance(prepared.built.trainer, trainer_lib.PSTrainer):
    # Prepared before the run timed a loop: its first loop need not measure a step.
    _learn_step_seconds(prepared.built.trainer, config, prepared.runtime)
  with _control_channel(config.cluster, interrupts):
    with _ps_deadline(config, prepared.runtime, prepared.sentinels), routine_lines_dropped():
      return _run_connected(config, interrupts, prepared.factory, prepared.runtime,
                            prepared.sentinels, built=prepared.built,
                            built_for_shards=prepared.input_shards)


@dataclasses.dataclass(frozen=True)
class _Parts:
  """What a connected coordinator runs: the experiment made PS-aware, and around it."""

  experiment: experiment_lib.Experiment
  trainer: Any  # A PSTrainer (or the experiment's own AbstractTrainer), None in eval mode.
  evaluator: Any
  positioned: bool  # The trainer's input keeps its position (input.ledger).
  ends: loop_ends.LoopEnds
  manager: checkpoints.Manager
  guard: loop_guard.LoopGuard
  measured: progress.MeasuredTrainer | None

  @property
  def ledger(self):
    """The input ledger (restored, else measured now); None for endless input."""
    return self.trainer.ensure_ledger() if self.positioned else None


# Kept until the process ends (`_run_connected`): a coordinator leaves with
# `os._exit`, without destructors.
_KEPT_WHILE_A_WORKER_IS_SILENT = []


def _run_connected(config: CoordinatorConfig, interrupts: interrupts_lib.Interrupts, factory,
                   runtime: strategy_lib.PSRuntime, sentinels: ps_state.PsSentinels, *,
                   built: "_Built | None" = None,
                   built_for_shards: int | None = None) -> CoordinatorResult:
  if built is None:
    built = _build(config, interrupts, factory, runtime, warm_ahead=True)
    built_for_shards = built.warmed_for_shards
  parts = _prepare(config, interrupts, runtime, sentinels, built)
  global_step = parts.experiment.global_step
  eval_output = None
  # orbit.Controller prints its log lines on stdout as well as logging them.
  with contextlib.redirect_stdout(_Discard()):
    controller = _Controller(
        experiment_name=config.experiment, global_step=global_step, trainer=parts.measured,
        evaluator=parts.evaluator, strategy=runtime.strategy,
        steps_per_loop=lambda step: parts.ends.next_loop(int(step)),
        checkpoint_manager=parts.manager, enable_async_checkpointing=config.async_checkpoint,
        summary_dir=config.model_dir,
        eval_summary_dir=os.path.join(config.model_dir, "eval"))
    start_step = int(global_step.numpy())
    ledger = parts.ledger
    if built_for_shards is not None and ledger.num_shards != built_for_shards:
      # Its closures read shards of another plan: a new coordinator builds them.
      raise errors.RetryableError(
          f"the input was re-planned into {ledger.num_shards} shards after this "
          f"coordinator built its closures for {built_for_shards}")
    if isinstance(parts.trainer, trainer_lib.PSTrainer):
      parts.trainer.start_training()
    train_steps = _start(config, parts, controller, start_step, ledger)
    eval_output = _run_mode(config, parts, controller, runtime, start_step, train_steps)
    with _classified_errors("writing the last checkpoint"):
      # Training's last save is on disk before the result says so.
      worker_silent = (isinstance(parts.trainer, trainer_lib.PSTrainer)
                       and parts.trainer.workers_silent())
      parts.manager.close(worker_silent=worker_silent)
  if worker_silent:
    # What this coordinator made on a silent worker (its input iterators) would be
    # destroyed as this returns, each destruction waiting for that worker: the
    # run would not end before the worker wakes. Kept, they go with the process.
    _KEPT_WHILE_A_WORKER_IS_SILENT.append((built, parts, controller, runtime))
  measured, manager = parts.measured, parts.manager
  return CoordinatorResult(
      status=RunStatus.FINISHED, experiment=config.experiment, mode=config.mode,
      global_step=int(global_step.numpy()), start_step=start_step,
      train_steps=train_steps,
      examples_per_sec=measured.examples_per_sec if measured else 0.0,
      steps_per_sec=measured.steps_per_sec if measured else 0.0,
      train_seconds=measured.seconds if measured else 0.0,
      eval=_floats(eval_output), checkpoint=manager.latest_checkpoint,
      model_dir=config.model_dir, input=_input_summary(parts.trainer, ledger),
      checkpoint_saves=manager.saves,
      checkpoint_stall_seconds=round(manager.stall_seconds, 3),
      checkpoint_saves_skipped=manager.saves_skipped)


def _warm_ahead(trainer, restarting: bool) -> int | None:
  """A restarted coordinator's first closures, built before its evaluator and restore
  and handed to the workers (`PSTrainer.warm_ahead`): each instantiates them on its own
  thread (seconds) meanwhile, instead of after. Returns the input shards they were
  built for (read ahead from the checkpoint it restores), else None.

  Only with a checkpoint (a first start restores nothing), its input ledger if the
  input is positioned (else it is measured, after the restore) and, for endless
  input, a known step time (else its first loop times closures first).
  """
  if not isinstance(trainer, trainer_lib.PSTrainer) or not restarting:
    return None
  if trainer.positioned:
    if trainer.input_state.ledger is None:
      return None
  elif trainer.times_a_step_first:
    return None
  with _classified_errors("building the train closures"):
    trainer.warm_ahead()
  return trainer.input_state.ledger.num_shards if trainer.positioned else None


@dataclasses.dataclass(frozen=True)
class _Built:
  """The experiment built in the strategy's scope, its trainer and evaluator made
  PS-aware, and where its loops end."""

  experiment: experiment_lib.Experiment
  trainer: Any
  evaluator: Any
  ends: loop_ends.LoopEnds
  # The input shards its closures were handed to the workers for (`_warm_ahead`), if so.
  warmed_for_shards: int | None = None


def _build(config: CoordinatorConfig, interrupts: interrupts_lib.Interrupts, factory,
           runtime: strategy_lib.PSRuntime, *, warm_ahead: bool = False) -> _Built:
  """`warm_ahead`: hand the first loop's closures to the workers as soon as they are
  built (`_warm_ahead`)."""
  context = experiment_lib.ExperimentContext(
      strategy=runtime.strategy, coordinator=runtime.coordinator,
      model_dir=config.model_dir, global_batch_size=config.global_batch_size,
      seed=config.seed, num_workers=runtime.num_workers, num_ps=runtime.num_ps,
      params=config.experiment_params)
  experiment = experiment_lib.build(factory, context, name=config.experiment,
                                    partitioned=runtime.partitioned)
  _require_parts(config, experiment)
  ends = _loop_ends(config)  # Where loops end and which saves (trainer, manager, controller).
  # The checkpoint to restore, read ahead: its input ledger shapes the closures.
  latest = tf.train.latest_checkpoint(config.model_dir)
  saved = positioned_lib.saved_ledger(latest, experiment_lib.INPUT_LEDGER_KEY) if latest else None
  with _classified_errors("preparing the experiment"):
    trainer = _adapt_trainer(experiment, runtime, config, pause=lambda: interrupts.pending,
                             ends=ends, saved_ledger=saved)
  # The workers instantiate meanwhile: the evaluator's build and the restore.
  warmed_for = _warm_ahead(trainer, restarting=latest is not None) if warm_ahead else None
  with _classified_errors("preparing the experiment"):
    evaluator = _adapt_evaluator(experiment, runtime, config)
  # So that no loop end runs a kind of op for the first time (`first_ops`).
  first_ops.run_ahead(experiment.global_step, experiment.trainer, experiment.evaluator)
  return _Built(experiment=experiment, trainer=trainer, evaluator=evaluator, ends=ends,
                warmed_for_shards=warmed_for)


def _prepare(config: CoordinatorConfig, interrupts: interrupts_lib.Interrupts,
             runtime: strategy_lib.PSRuntime, sentinels: ps_state.PsSentinels,
             built: _Built) -> _Parts:
  """Around the built experiment: its checkpoint, manager, loop guard and measured trainer."""
  experiment, trainer, evaluator, ends = (built.experiment, built.trainer, built.evaluator,
                                          built.ends)
  global_step = experiment.global_step
  positioned = isinstance(trainer, trainer_lib.PSTrainer) and trainer.positioned
  # The input's position is saved and restored with the model (input.ledger).
  input_items = {experiment_lib.INPUT_LEDGER_KEY: trainer.input_state} if positioned else {}
  with runtime.strategy.scope():
    checkpoint = tf.train.Checkpoint(global_step=global_step, **experiment.checkpoint_items,
                                     **input_items)
  # With two chief replicas: nothing written once the other took the lease.
  fence = chief_lease.Fence(config.model_dir, config.lease_generation)
  manager = checkpoints.Manager(
      checkpoint, config.model_dir, asynchronous=config.async_checkpoint, fence=fence,
      before_save=[trainer.input_state.capture] if positioned else [],
      max_to_keep=config.max_to_keep, step_counter=global_step,
      checkpoint_interval=config.checkpoint_interval, save_due=ends.save_due)
  if isinstance(trainer, trainer_lib.PSTrainer):
    trainer.on_traced.append(manager.prepare_writes)
  guard = loop_guard.LoopGuard(interrupts=interrupts, manager=manager,
                               global_step=global_step, cluster=runtime.cluster,
                               model_dir=config.model_dir, sentinels=sentinels,
                               left_out=config.tasks_left_out, fence=fence)
  measured = None
  if trainer is not None:
    measured = progress.MeasuredTrainer(
        trainer, global_step, target=config.train_steps or 0,
        batch_size=config.global_batch_size,
        on_loop=lambda step: guard.after_loop(step, getattr(trainer, "last_loop", None),
                                              trainer.ledger if positioned else None))
  return _Parts(experiment=experiment, trainer=trainer, evaluator=evaluator,
                positioned=positioned, ends=ends, manager=manager, guard=guard,
                measured=measured)


def _start(config: CoordinatorConfig, parts: _Parts, controller, start_step: int,
           ledger) -> int:
  """Where this coordinator starts, told to everyone; returns the step to train to."""
  train_steps = _train_steps(config, ledger)
  if parts.measured is not None:
    parts.measured.target = train_steps
  if isinstance(parts.trainer, trainer_lib.PSTrainer):
    parts.trainer.target = train_steps
  if controller.restored is None and config.mode != Mode.EVAL:
    # A first checkpoint at the start: later saves then follow the loops
    # that reach checkpoint boundaries (CheckpointManager always saves its first).
    parts.manager.save(checkpoint_number=start_step, check_interval=False)
  # For watchers (tfps chaos/bench) and the event log: a coordinator started
  # here, at this step (from a checkpoint, or from scratch at 0).
  parts.guard.account_restore(start_step, ledger.lengths if ledger else None,
                              ledger.epochs_completed if ledger else 0)
  if config.mode == Mode.EVAL and controller.restored is None:
    raise errors.UsageError(
        f"mode (eval) needs a checkpoint; model_dir ({config.model_dir}) has none")
  return train_steps


def _run_mode(config: CoordinatorConfig, parts: _Parts, controller,
              runtime: strategy_lib.PSRuntime, start_step: int, train_steps: int):
  """Trains and evaluates as the mode says; returns the last evaluation's output."""
  eval_output = None
  eval_steps = config.eval_steps or -1
  train_dataset = parts.experiment.trainer.train_dataset if parts.experiment.trainer else None
  # Positioned input never reads past a shard's measured end; endless input
  # can only end when its iterator broke (see `input_cannot_end`).
  cannot_end = lambda: not parts.positioned and train_dataset is not None and input_cannot_end(
      train_dataset, num_workers=runtime.num_workers,
      num_replicas_in_sync=runtime.strategy.num_replicas_in_sync, steps=train_steps)
  if config.mode != Mode.EVAL:
    if start_step >= train_steps:
      logging.info("already at step %d >= train_steps (%d); nothing to train",
                   start_step, train_steps)
    elif config.mode == Mode.TRAIN:
      with _classified_errors("training", cannot_end):
        controller.train(steps=train_steps)
    else:
      with _classified_errors("training and evaluation", cannot_end):
        eval_output = controller.train_and_evaluate(
            train_steps=train_steps, eval_steps=eval_steps,
            eval_interval=config.eval_interval)
  if config.mode != Mode.TRAIN and eval_output is None:
    with _classified_errors("evaluation"):
      eval_output = controller.evaluate(steps=eval_steps)
  return eval_output
