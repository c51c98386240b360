"""ember: a lazy Tensor library with autograd that compiles to fused kernels through one UOp IR."""
from __future__ import annotations
import pkgutil
__path__ = pkgutil.extend_path(__path__, __name__)  # ember.nn ships in its own distribution (ember-nn)
__version__ = "0.1.0"

from ember.dtype import dtypes, DType  # noqa: E402
from ember.helpers import Context, GlobalCounters, getenv  # noqa: E402
from ember.uop.ops import UOp, Variable  # noqa: E402
from ember.device import Device  # noqa: E402
from ember.device.base import Buffer  # noqa: E402
from ember.tensor import Tensor  # noqa: E402
from ember.engine.jit import TinyJit  # noqa: E402
from ember.function import function  # noqa: E402
from ember.profiler import profile  # noqa: E402
from ember.helpers import TRACK_MATCH_STATS, VIZ  # noqa: E402
if VIZ.value not in ("", "0") or TRACK_MATCH_STATS.value:  # record every graph_rewrite, report at exit (ember.viz)
  from ember.viz import install_from_env
  install_from_env()

# the public API (docs/public-api.md): these names, ember.errors, ember.dtype's __all__ and, for backends, ember.plugin
__all__ = ["Tensor", "dtypes", "DType", "Device", "Buffer", "Context", "getenv", "TinyJit", "Variable", "UOp",
           "GlobalCounters", "function", "profile"]

def __getattr__(name: str):  # `from ember import nn` works when ember-nn is installed, without importing it eagerly
  if name == "nn":
    import importlib
    return importlib.import_module("ember.nn")
  raise AttributeError(f"module 'ember' has no attribute {name!r}")
