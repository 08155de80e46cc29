"""The ctr experiment's settings (`--experiment_params`), without TensorFlow.

Kept apart from `ctr` so that `tfps local`/`tfps run` can refuse a bad
setting in one line before they start any task or import TensorFlow.
"""

import dataclasses
import math
from typing import Mapping

from tfps.base import errors


@dataclasses.dataclass(frozen=True)
class CtrConfig:
  """Model and data sizes of the ctr experiment."""

  vocab_sizes: tuple[int, ...] = (60000, 30000, 20000, 10000, 5000)
  embedding_dim: int = 16
  num_dense: int = 8
  hidden: tuple[int, ...] = (64, 32)
  learning_rate: float = 0.05
  eval_examples: int = 16384
  train_examples: int = 2**20
  # Examples per tf.train.Example: batches are read as B / 16 records (see
  # ctr_data). 16 divides every batch size of the tests and the bench.
  examples_per_record: int = 16
  records_per_file: int = 1024
  data_dir: str = ""  # "": <model_dir>/data.

  def __post_init__(self):
    for field in ("vocab_sizes", "hidden"):
      values = getattr(self, field)
      if not values or any(not isinstance(v, int) or v < 1 for v in values):
        raise errors.UsageError(
            f"ctr {field} ({':'.join(map(str, values))}) must be positive integers")
    for field in ("embedding_dim", "num_dense", "eval_examples", "train_examples",
                  "examples_per_record", "records_per_file"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise errors.UsageError(f"ctr {field} ({value!r}) must be a positive integer")
    if not (isinstance(self.learning_rate, float) and 0 < self.learning_rate < math.inf):
      raise errors.UsageError(
          f"ctr learning_rate ({self.learning_rate!r}) must be a positive number")
    if not isinstance(self.data_dir, str):
      raise errors.UsageError(f"ctr data_dir ({self.data_dir!r}) must be a path")

  @classmethod
  def from_params(cls, params: Mapping[str, str]) -> "CtrConfig":
    """Parses `key=value` strings; unknown keys and bad values are UsageErrors."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - known)
    if unknown:
      raise errors.UsageError(
          f"ctr: unknown setting(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    kwargs = {}
    for key, text in params.items():
      try:
        if key in ("vocab_sizes", "hidden"):
          kwargs[key] = tuple(int(v) for v in text.split(":"))
        elif key == "learning_rate":
          kwargs[key] = float(text)
        elif key == "data_dir":
          kwargs[key] = text
        else:
          kwargs[key] = int(text)
      except ValueError:
        raise errors.UsageError(f"ctr {key} ({text!r}) is not a valid value") from None
    return cls(**kwargs)
