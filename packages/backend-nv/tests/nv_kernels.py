"""Kernels of the conformance corpus built on the PYTHON reference device, and a runner of their schedules through
the NV host shim, for the tests of this package."""
from __future__ import annotations
import functools
from typing import Any, Callable
import numpy as np
from ember.codegen import get_program
from ember.dtype import DType, dtypes
from ember.renderer import ProgramSpec, Renderer
from ember.schedule import ScheduleItem
from ember.testing import KERNEL_CORPUS
from ember.tensor import Tensor
from ember_nv.mock import HostKernel, HostShimCompiler
from ember_nv.renderer import CUDARenderer, kernel_arg_layout

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

def _shim_kernel(spec: ProgramSpec) -> HostKernel: return HostKernel(shim_compiler().compile_cached(spec.src))

def run_schedule_on_shim(items: list[ScheduleItem], dt: DType, shape: tuple[int, ...],
                         kernel_for: Callable[[ProgramSpec], HostKernel] = _shim_kernel) -> np.ndarray:
  """Execute a schedule with every kernel rendered by CUDARenderer and run by the host shim (`kernel_for` gives the
  loaded build of a program); returns the last item's output as values of `dt` (emulated dtypes decoded) in `shape`.
  Host memory is one array per base buffer, so buffer views alias their base as on a device; inputs start with their
  contents, every other buffer with zeros."""
  renderer, memory = CUDARenderer(), {}
  for it in items:
    if it.kind != "kernel": raise AssertionError(f"unexpected {it.kind} item in a single-device schedule")
    for b in it.bufs:
      if id(b.base) in memory: continue
      memory[id(b.base)] = b.base.numpy().view(np.uint8).copy() if b.base.is_allocated else np.zeros(b.base.nbytes,
                                                                                                       np.uint8)
    spec = get_program(it.ast, renderer)
    layout, size = kernel_arg_layout(spec.uops)
    args = [memory[id(b.base)].ctypes.data + b.offset for b in it.bufs] + [it.var_vals[v.arg[0]] for v in spec.vars]
    if len(args) != len(layout):
      raise AssertionError(f"{spec.name}: {len(args)} arguments for {len(layout)} parameters")
    params = bytearray(size)
    for (offset, width), value in zip(layout, args):
      params[offset:offset + width] = int(value).to_bytes(width, "little", signed=value < 0)
    kernel_for(spec).run(bytes(params), tuple(spec.global_size or (1, 1, 1)), tuple(spec.local_size or (1, 1, 1)))
  out = items[-1].bufs[0]
  raw = memory[id(out.base)][out.offset:out.offset + out.nbytes]
  if dt in EMULATED: return decode_bits(raw.view(np.uint16 if dt.itemsize == 2 else np.uint8), dt).reshape(shape)
  return raw.view(np.dtype(dt.fmt)).reshape(shape)

def run_on_shim(t: Tensor) -> np.ndarray:
  """Execute `t`'s schedule through the host shim, one build per kernel; returns the output as values, in `t`'s
  shape."""
  return run_schedule_on_shim(t.schedule(), t.dtype, tuple(t.shape))
