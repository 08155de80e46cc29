"""`ctr`, the built-in experiment: click-through-rate prediction on synthetic data.

`--experiment=ctr` is short for `--experiment=tfps.examples.ctr:factory`, found
and loaded the way any user's `package.module:factory` is. This module is the
experiment's face and imports no TensorFlow: `check_params` checks
`--experiment_params` before any task starts, and `factory` loads the model
(`experiment`) only when the coordinator calls it. Read `experiment.py` as an
example of an experiment written for tfps; `data.py` writes its training files.
"""

from tfps.examples.ctr import config as _config


def check_params(params) -> None:
  """UsageError naming an unknown or bad `key=value` setting of the ctr."""
  _config.CtrConfig.from_params(params)


def factory(context):
  """The experiment: see `tfps.examples.ctr.experiment.factory`."""
  from tfps.examples.ctr import experiment  # pylint: disable=import-outside-toplevel
  return experiment.factory(context)
