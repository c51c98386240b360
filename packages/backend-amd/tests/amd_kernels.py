"""Kernels of the conformance corpus built on the PYTHON reference device, and a runner of their schedules through
the AMD host shim, for the tests of this package."""
from __future__ import annotations
import functools
import struct
from typing import Any
import numpy as np
from ember.codegen import get_program
from ember.dtype import DType, dtypes
from ember.renderer import Renderer
from ember.schedule import ScheduleItem
from ember.testing import KERNEL_CORPUS
from ember.tensor import Tensor
from ember_amd.mock import HostKernel, HostShimCompiler
from ember_amd.renderer import HIPRenderer, kernarg_layout

EMULATED = (dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2)
CORPUS_DTYPES = tuple(d for d in dtypes.all if d is not dtypes.void)

def corpus_tensor(name: str, dt: DType) -> Tensor: return KERNEL_CORPUS[name]("PYTHON", dt)

def kernel_asts(t: Tensor) -> list[Any]: return [it.ast for it in t.schedule() if it.kind == "kernel"]

def programs(t: Tensor, renderer: Renderer) -> list[Any]: return [get_program(ast, renderer) for ast in kernel_asts(t)]

@functools.cache
def shim_compiler() -> HostShimCompiler: return HostShimCompiler()

def decode_bits(raw: np.ndarray, dt: DType) -> np.ndarray:
  """Raw bits of bfloat16/fp8 -> float64 values, from the format's definition (sign, exponent, mantissa)."""
  exp, man = dtypes.finfo(dt)
  bias, codes = 2 ** (exp - 1) - 1, raw.astype(np.int64)
  e, m, sign = (codes >> man) & ((1 << exp) - 1), codes & ((1 << man) - 1), np.where(codes >> (exp + man), -1.0, 1.0)
  vals = np.where(e == 0, m * 2.0 ** (1 - bias - man), (1 + m / 2.0 ** man) * 2.0 ** (e - bias))
  top = e == (1 << exp) - 1
  if dt is dtypes.fp8e4m3: vals = np.where(top & (m == (1 << man) - 1), np.nan, vals)
  else: vals = np.where(top, np.where(m == 0, np.inf, np.nan), vals)
  return sign * vals

def run_on_shim(t: Tensor) -> np.ndarray:
  """Execute `t`'s schedule with every kernel rendered by HIPRenderer and run by the host shim, arguments passed in a
  kernarg segment laid out by `kernarg_layout`; returns the output as values (emulated dtypes decoded)."""
  items: list[ScheduleItem] = t.schedule()
  renderer, memory = HIPRenderer(), {}
  for it in items:
    if it.kind != "kernel": raise AssertionError(f"unexpected {it.kind} item in a single-device schedule")
    for b in it.bufs:
      if id(b) in memory: continue
      memory[id(b)] = b.numpy().view(np.uint8).copy() if b.is_allocated else np.zeros(b.nbytes, np.uint8)
    spec = get_program(it.ast, renderer)
    layout, size = kernarg_layout(spec.uops)
    kernargs = np.zeros(max(size, 8), np.uint8)
    for (offset, _), b in zip(layout, it.bufs): struct.pack_into("<Q", kernargs, offset, memory[id(b)].ctypes.data)
    kernel = HostKernel(shim_compiler().compile_cached(spec.src))
    kernel.run(kernargs.ctypes.data, tuple(spec.global_size), tuple(spec.local_size))
  raw = memory[id(items[-1].bufs[0])]
  dt = t.dtype
  if dt in EMULATED: return decode_bits(raw.view(np.uint16 if dt.itemsize == 2 else np.uint8), dt).reshape(t.shape)
  return raw.view(np.dtype(dt.fmt)).reshape(t.shape)
