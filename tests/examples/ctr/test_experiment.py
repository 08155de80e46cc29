"""The ctr experiment's settings and synthetic data, without a cluster."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tfps.examples.ctr import experiment as ctr
from tfps.base import errors

pytestmark = pytest.mark.tf


def test_params_parse_and_validate():
  config = ctr.CtrConfig.from_params(
      {"vocab_sizes": "100:50", "hidden": "8", "learning_rate": "0.1", "eval_examples": "64"})
  assert config.vocab_sizes == (100, 50) and config.hidden == (8,)
  assert config.learning_rate == 0.1 and config.eval_examples == 64
  assert sum(ctr.CtrConfig().vocab_sizes) >= 100_000  # The default is "large".


def test_data_params_parse_and_the_data_dir_defaults_to_the_model_dir(tmp_path):
  config = ctr.CtrConfig.from_params(
      {"train_examples": "5000", "examples_per_record": "8", "records_per_file": "100",
       "data_dir": "/shared/ctr"})
  assert (config.train_examples, config.examples_per_record, config.records_per_file) == \
      (5000, 8, 100)
  assert ctr.training_data_dir(config, "/model") == "/shared/ctr"
  assert ctr.CtrConfig().train_examples == 2048 * 512  # One epoch: about `tfps local`'s steps.
  assert ctr.training_data_dir(ctr.CtrConfig(), "/model") == "/model/data"
  relative = ctr.CtrConfig(data_dir="rel")
  assert ctr.training_data_dir(relative, "") == os.path.join(os.getcwd(), "rel")
  with pytest.raises(errors.UsageError) as e:
    ctr.training_data_dir(ctr.CtrConfig(), "")
  assert str(e.value) == "ctr data_dir ('') must be set when there is no model_dir"


@pytest.mark.parametrize("params,message", [
    ({"vocab": "10"}, "ctr: unknown setting(s) vocab (known: "),
    ({"vocab_sizes": "10:x"}, "ctr vocab_sizes ('10:x') is not a valid value"),
    ({"vocab_sizes": "10:0"}, "ctr vocab_sizes (10:0) must be positive integers"),
    ({"embedding_dim": "0"}, "ctr embedding_dim (0) must be a positive integer"),
    ({"learning_rate": "-1"}, "ctr learning_rate (-1.0) must be a positive number"),
    ({"train_examples": "0"}, "ctr train_examples (0) must be a positive integer"),
    ({"records_per_file": "1e3"}, "ctr records_per_file ('1e3') is not a valid value"),
])
def test_bad_params_are_usage_errors(params, message):
  with pytest.raises(errors.UsageError) as e:
    ctr.CtrConfig.from_params(params)
  assert str(e.value).startswith(message)


def _examples(indices, seed=7, split=1, config=ctr.CtrConfig(vocab_sizes=(1000, 300))):
  examples = ctr.make_examples(tf.constant(indices, tf.int64), config, seed, split)
  return {k: v.numpy() for k, v in examples.items() if k != "label"}, examples["label"].numpy()


def test_examples_are_a_pure_function_of_seed_split_and_index():
  features, labels = _examples([5, 6, 7, 8])
  again, again_labels = _examples([7, 8])  # Other batch: same examples.
  np.testing.assert_array_equal(features["cat"][2:], again["cat"])
  np.testing.assert_array_equal(features["dense"][2:], again["dense"])
  np.testing.assert_array_equal(labels[2:], again_labels)
  other_seed, _ = _examples([5, 6, 7, 8], seed=8)
  other_split, _ = _examples([5, 6, 7, 8], split=2)
  assert not np.array_equal(features["dense"], other_seed["dense"])
  assert not np.array_equal(features["dense"], other_split["dense"])


def test_data_has_skewed_ids_in_range_and_a_plausible_click_rate():
  features, labels = _examples(np.arange(20000))
  ids = features["cat"][:, 0]
  assert ids.min() >= 0 and ids.max() < 1000
  assert np.mean(ids < 100) > 0.4  # Skewed: 10% of the vocabulary gets > 40% of traffic.
  assert 0.2 < labels.mean() < 0.5
  assert features["dense"].shape == (20000, 8)
  assert abs(features["dense"].mean()) < 0.05 and abs(features["dense"].std() - 1) < 0.05


def test_eval_parts_cover_the_eval_set_exactly_once():
  config = ctr.CtrConfig(vocab_sizes=(50,), eval_examples=100)
  fn = ctr.eval_dataset_fn(config, seed=1, batch_size=16)
  whole = np.concatenate([e["dense"] for e in fn(tf.distribute.InputContext())])
  parts = [np.concatenate([e["dense"] for e in fn(tf.distribute.InputContext(3, i))])
           for i in range(3)]
  assert whole.shape == (100, 8)
  merged = np.concatenate(parts)
  assert merged.shape == whole.shape
  np.testing.assert_array_equal(np.sort(merged, axis=0), np.sort(whole, axis=0))
