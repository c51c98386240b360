"""The NV side of the host-shim test helpers (`ember.testing.hostshim`): schedules run through the NV host shim, with
kernels rendered by CUDARenderer and parameters packed by `kernel_arg_layout`, for the tests of this package."""
from __future__ import annotations
from typing import Callable
import numpy as np
from ember.dtype import DType
from ember.renderer import ProgramSpec
from ember.schedule import ScheduleItem
from ember.tensor import Tensor
from ember.testing.hostshim import CORPUS_DTYPES, EMULATED, ShimRunner, corpus_tensor, programs
from ember.plugin import HostKernel
from ember_nv.compiler import NVShimCompiler
from ember_nv.renderer import CUDARenderer, kernel_arg_layout

__all__ = ["CORPUS_DTYPES", "EMULATED", "SHIM", "corpus_tensor", "programs", "run_schedule_on_shim", "run_on_shim"]

SHIM = ShimRunner(CUDARenderer, kernel_arg_layout, NVShimCompiler)

def run_schedule_on_shim(items: list[ScheduleItem], dt: DType, shape: tuple[int, ...],
                         kernel_for: Callable[[ProgramSpec], HostKernel] | None = None) -> np.ndarray:
  """A schedule through the NV host shim (`kernel_for` gives the loaded build of a program, by default one build per
  kernel); returns the last item's output as values of `dt` in `shape`."""
  return SHIM.run_schedule(items, dt, shape, kernel_for)

def run_on_shim(t: Tensor) -> np.ndarray:
  """`t`'s schedule through the NV host shim, one build per kernel; returns the output as values in `t`'s shape."""
  return SHIM.run(t)
