"""Helpers whose module `tests/base/test_tf_internals.py` has AutoGraph leave unconverted."""


def absolute(x):
  if x > 0:  # On a tensor: only AutoGraph makes this a graph's cond.
    return x
  return -x


def call(fn):
  return fn()
