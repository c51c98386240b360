"""ember: a lazy Tensor library with autograd that compiles to fused kernels through one UOp IR."""
from __future__ import annotations
import pkgutil
__path__ = pkgutil.extend_path(__path__, __name__)  # ember.nn ships in its own distribution (ember-nn)
__version__ = "0.1.0"
