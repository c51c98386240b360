"""The AMD side of the host-shim test helpers (`ember.testing.hostshim`): schedules run through the AMD host shim, with
kernels rendered by HIPRenderer and the kernarg segment laid out by `kernarg_layout`, for the tests of this package."""
from __future__ import annotations
import numpy as np
from ember.tensor import Tensor
from ember.testing.hostshim import CORPUS_DTYPES, EMULATED, ShimRunner, corpus_tensor, programs
from ember_amd.compiler import AMDShimCompiler
from ember_amd.renderer import HIPRenderer, kernarg_layout

__all__ = ["CORPUS_DTYPES", "EMULATED", "SHIM", "corpus_tensor", "programs", "run_on_shim"]

SHIM = ShimRunner(HIPRenderer, kernarg_layout, AMDShimCompiler)

def run_on_shim(t: Tensor) -> np.ndarray:
  """`t`'s schedule through the AMD host shim, one build per kernel; returns the output as values in `t`'s shape."""
  return SHIM.run(t)
