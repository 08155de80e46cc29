"""`tf.train.Example` records written from NumPy columns, a whole batch at a time.

Building one `tf.train.Example` proto per record in Python costs ~20 µs a
record (about 20 s for the million records of the built-in ctr's data); this
writes the same wire format for a whole batch with NumPy array operations
(~3 µs a record here). The format is the protobuf encoding of

    Example { features: Features { feature: map<string, Feature> } }
    Feature { int64_list: Int64List { value: [v] } | float_list: FloatList { value: [...] } }

with the map's entries in the order given and repeated values packed, as
TensorFlow's own writers produce it. Every nested message is a field: a tag
byte, the payload's length as a varint, the payload. Lengths vary from record
to record only through the varints of the int64 values, so each record is
built as a row of byte columns and a mask of the bytes it uses; the used bytes
of all rows, read in order, are the records one after the other.
"""

import dataclasses
from typing import Mapping

import numpy as np

# Wire tags (field number << 3 | 2, length-delimited) of the messages above.
_EXAMPLE_FEATURES = 0x0A  # Example.features
_FEATURES_ENTRY = 0x0A  # Features.feature (a map: repeated key/value entries)
_ENTRY_KEY, _ENTRY_VALUE = 0x0A, 0x12
_FEATURE_FLOAT_LIST, _FEATURE_INT64_LIST = 0x12, 0x1A
_LIST_VALUES = 0x0A  # Int64List.value, FloatList.value (packed)


@dataclasses.dataclass
class _Rows:
  """One byte string per row: byte columns, the mask of bytes used, each row's length."""

  columns: list[np.ndarray]  # [rows, width] uint8
  masks: list[np.ndarray]  # [rows, width] bool
  lengths: np.ndarray  # [rows] int64


def _constant(rows: int, data: bytes) -> _Rows:
  column = np.broadcast_to(np.frombuffer(data, np.uint8), (rows, len(data)))
  return _Rows([column], [np.ones(column.shape, bool)], np.full(rows, len(data), np.int64))


def _varint(values: np.ndarray) -> _Rows:
  """Base-128 varints of non-negative integers (7 bits a byte, high bit: more follow)."""
  values = values.astype(np.uint64)
  width = max(1, -(-int(values.max(initial=0)).bit_length() // 7))
  shifted = values[:, None] >> (np.uint64(7) * np.arange(width, dtype=np.uint64))
  more = (shifted >> np.uint64(7)) > 0
  column = ((shifted & np.uint64(0x7F)) | (more.astype(np.uint64) << np.uint64(7))).astype(np.uint8)
  used = shifted > 0
  used[:, 0] = True  # Zero is one byte.
  return _Rows([column], [used], used.sum(axis=1, dtype=np.int64))


def _join(*parts: _Rows) -> _Rows:
  return _Rows([c for p in parts for c in p.columns], [m for p in parts for m in p.masks],
               sum(p.lengths for p in parts))


def _field(tag: int, payload: _Rows) -> _Rows:
  rows = len(payload.lengths)
  return _join(_constant(rows, bytes([tag])), _varint(payload.lengths), payload)


def encode(int64_features: Mapping[str, np.ndarray],
           float_features: Mapping[str, np.ndarray]) -> tuple[bytes, list[int]]:
  """Serialized `tf.train.Example`s, one per row, and where each starts and ends.

  Args:
    int64_features: name -> [rows] or [rows, width] non-negative integers (one
      value each, or a fixed-length list each).
    float_features: name -> [rows, width] float32 (a fixed-length list each).

  Returns:
    (data, offsets): record i is `data[offsets[i]:offsets[i + 1]]`.
  """
  columns = [*int64_features.values(), *float_features.values()]
  rows = len(columns[0])
  if any(len(c) != rows for c in columns):
    raise ValueError(f"features have different numbers of rows: {[len(c) for c in columns]}")
  entries = []
  for name, values in int64_features.items():
    values = np.asarray(values)
    if values.ndim not in (1, 2) or (values.size and values.min() < 0):
      raise ValueError(
          f"int64 feature {name!r}: expected [rows] or [rows, width] non-negative integers")
    packed = _join(*(_varint(column) for column in (values.T if values.ndim == 2 else [values])))
    entries.append((name, _field(_FEATURE_INT64_LIST, _field(_LIST_VALUES, packed))))
  for name, values in float_features.items():
    values = np.ascontiguousarray(values, dtype="<f4")
    if values.ndim != 2:
      raise ValueError(f"float feature {name!r}: expected [rows, width] floats")
    raw = values.view(np.uint8).reshape(rows, -1)
    floats = _Rows([raw], [np.ones(raw.shape, bool)], np.full(rows, raw.shape[1], np.int64))
    entries.append((name, _field(_FEATURE_FLOAT_LIST, _field(_LIST_VALUES, floats))))
  features = _join(*(
      _field(_FEATURES_ENTRY, _join(_field(_ENTRY_KEY, _constant(rows, name.encode())),
                                    _field(_ENTRY_VALUE, feature)))
      for name, feature in entries))
  example = _field(_EXAMPLE_FEATURES, features)
  mask = np.concatenate(example.masks, axis=1)
  data = np.concatenate(example.columns, axis=1)[mask].tobytes()
  offsets = np.concatenate([[0], np.cumsum(example.lengths)])
  if offsets[-1] != len(data):
    raise AssertionError(f"internal: {len(data)} bytes encoded, lengths say {offsets[-1]}")
  return data, offsets.tolist()
