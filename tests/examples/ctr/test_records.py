"""The ctr's example records (tfps.examples.ctr.records): the bytes protobuf writes."""

import numpy as np
import pytest
import tensorflow as tf

from tfps.examples.ctr import records as example_records

pytestmark = pytest.mark.tf


def test_records_are_the_bytes_protobuf_writes():
  ints = {"a": np.array([0, 1, 127, 128, 300, 2**40]), "b": np.array([5, 0, 16383, 16384, 7, 1]),
          "c": np.array([[0, 2**20], [1, 1], [128, 5], [7, 16384], [0, 0], [2**40, 127]])}
  floats = {"z": np.linspace(-2, 2, 18, dtype=np.float32).reshape(6, 3)}
  data, offsets = example_records.encode(ints, floats)
  for i in range(6):
    example = tf.train.Example()
    for name, values in ints.items():
      example.features.feature[name].int64_list.value.extend(np.atleast_1d(values[i]).tolist())
    example.features.feature["z"].float_list.value.extend(floats["z"][i].tolist())
    # Keys in sorted order: protobuf's deterministic output sorts map keys.
    assert data[offsets[i]:offsets[i + 1]] == example.SerializeToString(deterministic=True)


def test_records_parse_back_with_many_features():
  rng = np.random.default_rng(0)
  ints = {f"cat_{i}": rng.integers(0, 2 ** (3 * i + 1), 500) for i in range(12)}
  floats = {"dense": rng.normal(size=(500, 40)).astype(np.float32)}
  data, offsets = example_records.encode(ints, floats)
  spec = {name: tf.io.FixedLenFeature([], tf.int64) for name in ints}
  spec["dense"] = tf.io.FixedLenFeature([40], tf.float32)
  parsed = tf.io.parse_example([data[a:b] for a, b in zip(offsets[:-1], offsets[1:])], spec)
  for name, values in {**ints, **floats}.items():
    np.testing.assert_array_equal(parsed[name].numpy(), values)


def test_negative_int64_features_are_refused():
  with pytest.raises(ValueError, match="non-negative"):
    example_records.encode({"a": np.array([1, -1])}, {})
  with pytest.raises(ValueError, match="non-negative"):
    example_records.encode({"a": np.array([[1, 2], [3, -1]])}, {})
