"""TensorFlow's server without TensorFlow's Python API, for a ps or worker process.

A ps or worker only serves: every op it runs arrives as a graph from the
coordinator, and TensorFlow's C++ runtime runs it. `import tensorflow`
loads the whole Python API as well (Keras, distribution strategies, test
helpers): ~8 s of CPU on the 2-core hosts tfps is measured on, paid by
every ps and worker start and restart, and taken from training while a
killed task comes back. TensorFlow's server library (`server_lib`) needs
only the runtime, which it loads in ~1 s.

Python imports a package before any of its modules, and TensorFlow's
package init is what loads the API. So `load()` puts a stand-in for the
`tensorflow` package in `sys.modules`, one that only knows where the
package's files are, and imports `server_lib` through it. That is reaching
into TensorFlow's layout, as `base.tf_internals` does for the coordinator;
this module is kept apart because it must not import TensorFlow's API at
all. `tests/ps_worker/test_tf_runtime.py` says when a release moves it.

A process that loaded the runtime this way cannot `import tensorflow`
afterwards (the stand-in says so by name). Ops a library registers from
Python are not there either: `--notf_runtime_only` loads all of TensorFlow
for those. When the runtime cannot be loaded this way (another release),
the full import is used and one line says so.
"""

import dataclasses
import importlib
import importlib.util
import sys
import types
from typing import Any

from absl import logging

_PACKAGE = "tensorflow"
# Marks the stand-in package (a process where it is set has no TensorFlow API).
_MARK = "__tfps_runtime_only__"


@dataclasses.dataclass(frozen=True)
class Runtime:
  """What a ps or worker uses of TensorFlow: its server and the server's types."""

  Server: Any  # tf.distribute.Server
  ClusterSpec: Any  # tf.train.ClusterSpec
  ConfigProto: Any  # tf.compat.v1.ConfigProto
  OpError: type  # tf.errors.OpError
  version: str  # tf.__version__
  api_loaded: bool  # False: the runtime only.


def load(runtime_only: bool = True) -> Runtime:
  """TensorFlow's server library: the runtime only if `runtime_only` and possible, else
  through the full `import tensorflow` (also when this process imported it already)."""
  loaded = sys.modules.get(_PACKAGE)
  if runtime_only and (loaded is None or getattr(loaded, _MARK, False)):
    try:
      return _runtime_only()
    except Exception as e:  # pylint: disable=broad-except  (any failure: the full import)
      _forget_stand_in()
      logging.info("TensorFlow's runtime could not be loaded on its own (%s: %s); importing "
                   "all of TensorFlow", type(e).__name__, str(e).splitlines()[0][:200]
                   if str(e) else "")
  return _full()


def _runtime_only() -> Runtime:
  if _PACKAGE not in sys.modules:
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
      raise ImportError("tensorflow is not installed")
    stand_in = types.ModuleType(
        _PACKAGE, "TensorFlow's runtime only (tfps.ps_worker.tf_runtime)")
    stand_in.__path__ = list(spec.submodule_search_locations)
    stand_in.__file__ = spec.origin
    setattr(stand_in, _MARK, True)

    def no_api(name: str):
      raise AttributeError(
          f"tensorflow.{name}: this process loaded TensorFlow's runtime only, without its "
          "Python API (tfps.ps_worker.tf_runtime; --notf_runtime_only loads all of it)")
    stand_in.__getattr__ = no_api
    sys.modules[_PACKAGE] = stand_in
  server_lib = importlib.import_module("tensorflow.python.training.server_lib")
  errors = importlib.import_module("tensorflow.python.framework.errors")
  config_pb2 = importlib.import_module("tensorflow.core.protobuf.config_pb2")
  versions = importlib.import_module("tensorflow.python.framework.versions")
  return Runtime(Server=server_lib.Server, ClusterSpec=server_lib.ClusterSpec,
                 ConfigProto=config_pb2.ConfigProto, OpError=errors.OpError,
                 version=versions.__version__, api_loaded=False)


def _forget_stand_in() -> None:
  """Drops the stand-in package, so that `import tensorflow` runs the real one.

  What was imported through it stays: TensorFlow's C extension registers
  itself once per process (a second load aborts it), and the real package
  finds those modules already imported.
  """
  if getattr(sys.modules.get(_PACKAGE), _MARK, False):
    del sys.modules[_PACKAGE]


def _full() -> Runtime:
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  return Runtime(Server=tf.distribute.Server, ClusterSpec=tf.train.ClusterSpec,
                 ConfigProto=tf.compat.v1.ConfigProto, OpError=tf.errors.OpError,
                 version=tf.__version__, api_loaded=True)
