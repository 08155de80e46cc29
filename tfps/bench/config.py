"""What a benchmark run measures: frozen, validated value types.

`BenchConfig` describes one run of the driver (`tfps.bench.driver`) against
one cluster; it travels to the driver as JSON. Model sizes are named sets of
`ctr` experiment params (`SIZES`), so every variant trains the same model on
the same data.
"""

import dataclasses
import enum
import json
from typing import Any, Mapping

from tfps.base import errors


class Variant(str, enum.Enum):
  """The training patterns compared, in table order."""

  # One process, no parameter servers: the limit on one machine.
  SINGLE_PROCESS = "single_process"
  # TF's PS tutorial: one step per `schedule`, join at the end of each loop.
  TUTORIAL = "tutorial"
  # Model Garden: one closure of steps_per_loop steps per Orbit loop, then join.
  MODEL_GARDEN = "model_garden"
  # tfps's own PSTrainer, as the chief runs it.
  TFPS = "tfps"

  def __str__(self) -> str:
    return self.value


STOCK = (Variant.TUTORIAL, Variant.MODEL_GARDEN)

# Named ctr model sizes (experiment params). `default` is the ctr default;
# `dense` has wider embeddings and a deeper MLP: ~10x the compute per example
# for about the same number of parameter-server lookups; `tiny` is for tests
# (its training files take a fraction of a second to write).
SIZES: Mapping[str, Mapping[str, str]] = {
    "default": {},
    "dense": {"embedding_dim": "32", "num_dense": "32", "hidden": "512:256:128"},
    "tiny": {"vocab_sizes": "3000:2000:1000", "embedding_dim": "8", "hidden": "32:16",
             "eval_examples": "2048", "train_examples": "65536"},
}


def _positive_int(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise errors.UsageError(f"{name} ({value!r}) must be a positive integer")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchConfig:
  """One driver run: every size x variant, `repeats` timed windows each.

  Attributes:
    sizes: model sizes to run (keys of `SIZES`).
    variants: patterns to run, all on the same model and data.
    repeats: timed windows per variant (the median is reported).
    window_steps: steps in one timed window.
    warmup_steps: untimed steps before the first window (tracing, datasets);
      the driver runs at least one whole loop (`steps_per_loop`).
    steps_per_loop: steps per Orbit loop (and per tutorial join).
    steps_per_closure: tfps: at most this many steps in one closure.
    global_batch_size: examples per step.
    seed: data and initialisation seed (the same for every variant).
    noop_closures: empty closures scheduled to time dispatch overhead.
    checkpoint_params: model sizes (parameters) whose checkpoint save and
      restore are timed (`checkpoint_cost`); () for none.
    work_dir: where the checkpoint timing writes (driver side).
    tfps_min_shard_bytes: the tfps variant's `--min_shard_bytes` (0: no
      splitting); the stock patterns place variables as their sources do
      (`patterns.stock_runtime`).
  """

  sizes: tuple[str, ...] = ("default", "dense")
  variants: tuple[Variant, ...] = tuple(Variant)
  repeats: int = 3
  window_steps: int = 500
  warmup_steps: int = 200
  steps_per_loop: int = 200
  steps_per_closure: int = 50
  global_batch_size: int = 512
  seed: int = 0
  noop_closures: int = 400
  checkpoint_params: tuple[int, ...] = ()
  work_dir: str = ""
  tfps_min_shard_bytes: int = 256 << 10

  def __post_init__(self):
    object.__setattr__(self, "checkpoint_params", tuple(self.checkpoint_params))
    if not self.sizes and not self.checkpoint_params:
      raise errors.UsageError("bench_sizes () must name at least one size")
    if any(isinstance(p, bool) or not isinstance(p, int) or p < 1
           for p in self.checkpoint_params):
      raise errors.UsageError(
          f"checkpoint_params ({self.checkpoint_params!r}) must be positive integers")
    for size in self.sizes:
      if size not in SIZES:
        raise errors.UsageError(
            f"bench_sizes ({size!r}) must be one of {', '.join(SIZES)}")
    try:
      variants = tuple(Variant(v) for v in self.variants)
    except ValueError:
      raise errors.UsageError(
          f"bench_variants ({','.join(map(str, self.variants))}) must be among "
          f"{', '.join(v.value for v in Variant)}") from None
    if not variants:
      raise errors.UsageError("bench_variants () must name at least one variant")
    object.__setattr__(self, "variants", variants)
    object.__setattr__(self, "sizes", tuple(self.sizes))
    for name in ("repeats", "window_steps", "warmup_steps", "steps_per_loop",
                 "steps_per_closure", "global_batch_size", "noop_closures"):
      _positive_int(name, getattr(self, name))
    if isinstance(self.tfps_min_shard_bytes, bool) or not isinstance(
        self.tfps_min_shard_bytes, int) or self.tfps_min_shard_bytes < 0:
      raise errors.UsageError(
          f"min_shard_bytes ({self.tfps_min_shard_bytes!r}) must be a non-negative integer")
    if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
      raise errors.UsageError(f"seed ({self.seed!r}) must be a non-negative integer")

  def to_json(self) -> str:
    d = dataclasses.asdict(self)
    d["variants"] = [v.value for v in self.variants]
    return json.dumps(d)

  @classmethod
  def from_json(cls, text: str) -> "BenchConfig":
    d = json.loads(text)
    d["sizes"], d["variants"] = tuple(d["sizes"]), tuple(d["variants"])
    d["checkpoint_params"] = tuple(d.get("checkpoint_params", ()))
    return cls(**d)
