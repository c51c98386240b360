"""Building hand-written linear programs and running them on the CPU device, for the tests of this package."""
from __future__ import annotations
import contextlib
import functools
from typing import Any, Iterator
import numpy as np
from ember.plugin import AxisType, DType, Ops, PtrDType, UOp, dtypes
from ember_cpu.compiler import ClangCompiler, LLVMCompiler, _is_x86
from ember_cpu.device import CPUDevice
from ember_cpu.renderer import ClangRenderer, CPULLVMRenderer
from ember.testing import format_values
from ember.testing.hostshim import selected_device
from ember.testing.programs import end, linear, param

RENDERERS = ("C", "LLVM")
EMULATED = (dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2)
# CPU targets every kernel must run on besides the host: x86-64-v3 is AVX2 and F16C without AVX-512 (no instruction
# converts double to half), x86-64-v2 has no F16C at all (every half conversion is a helper call)
BASELINES = ("x86-64-v3", "x86-64-v2") if _is_x86() else ("generic",)
TARGETS = ("host", *BASELINES)

@functools.cache
def device(kind: str, arch: str = "") -> CPUDevice:
  if kind == "C": return CPUDevice("CPU", ClangRenderer(arch), ClangCompiler(arch=arch))
  return CPUDevice("CPU", CPULLVMRenderer(arch), LLVMCompiler(arch))

def alu(op: Ops, *srcs: UOp) -> UOp: return srcs[0].alu(op, *srcs[1:])
def const(dt: DType, v: Any) -> UOp: return UOp.const(dt, v)

def np_dtype(dt: DType) -> Any:
  """The numpy dtype of a buffer of `dt` (bfloat16 and fp8 as their raw bits)."""
  if dt is dtypes.bfloat16: return np.uint16
  if dt in (dtypes.fp8e4m3, dtypes.fp8e5m2): return np.uint8
  return np.dtype(dt.fmt)

def run_spec(dev: CPUDevice, spec: Any, inputs: dict[int, np.ndarray], threads: bool = True) -> list[np.ndarray]:
  """Compile and run a ProgramSpec of `dev` with buffer slot s holding inputs[s] (zeros elsewhere); the buffers it
  writes, in `spec.outs` order."""
  prg = dev.runtime(spec.name, dev.compiler.compile(spec.src))
  params = sorted((u for u in spec.uops if u.op is Ops.PARAM), key=lambda u: u.arg)
  arrays, handles = [], []
  for p in params:
    assert isinstance(p.dtype, PtrDType)
    a = np.ascontiguousarray(inputs[p.arg]) if p.arg in inputs else np.zeros(p.dtype.size, np_dtype(p.dtype.base))
    h = dev.allocator.alloc(a.nbytes)
    dev.allocator._copyin(h, memoryview(a).cast("B"))
    arrays.append(a)
    handles.append(h)
  gsize = spec.global_size if threads and spec.global_size else (1, 1, 1)
  prg(*handles, global_size=tuple(gsize), wait=True)
  outs = []
  for slot in spec.outs:
    out = np.empty_like(arrays[slot])
    dev.allocator._copyout(memoryview(out).cast("B"), handles[slot])
    outs.append(out)
  return outs

def compile_program(kind: str, prog: list[UOp], name: str = "k", arch: str = "") -> Any:
  dev = device(kind, arch)
  return dev.runtime(name, dev.compiler.compile(dev.renderer.render(prog, name)))

def run(kind: str, prog: list[UOp], bufs: list[np.ndarray], vals: tuple[int, ...] = (),
        threads: int = 1, arch: str = "") -> list[np.ndarray]:
  """Run a program (compiled for the CPU `arch`, the host by default) with buffer `i` (slot i) initialised from
  bufs[i]; return every buffer afterwards."""
  prg, alloc = compile_program(kind, prog, arch=arch), device(kind, arch).allocator
  handles = []
  for a in bufs:
    h = alloc.alloc(a.nbytes)
    alloc._copyin(h, memoryview(np.ascontiguousarray(a)).cast("B"))
    handles.append(h)
  prg(*handles, global_size=(threads, 1, 1), vals=vals, wait=True)
  outs = []
  for a, h in zip(bufs, handles):
    out = np.empty_like(a)
    alloc._copyout(memoryview(out).cast("B"), h)
    outs.append(out)
  return outs

def elementwise(fns: list[Any], in_dts: list[DType], out_dts: list[DType], n: int) -> list[UOp]:
  """out_k[i] = fns[k](loads of every input at i), over a THREAD range of n."""
  outs = [param(k, dt, n) for k, dt in enumerate(out_dts)]
  ins = [param(len(out_dts) + k, dt, n) for k, dt in enumerate(in_dts)]
  rng = UOp.range(n, 0, AxisType.THREAD)
  loads = [p.index(rng).load() for p in ins]
  return linear(*[o.index(rng).store(fn(*loads)) for o, fn in zip(outs, fns)], end(rng))

# ** oracles for bfloat16 and fp8, from the definition of each format **
# A value of a code is (1 + m/2^M) * 2^(e-bias), subnormal m * 2^(1-bias-M). float32 -> code picks the nearest value,
# ties to the even code; e4m3fn (no inf) saturates to its max like `ember.dtype.as_const`, the others overflow to inf.

@functools.cache
def _table(dt: DType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(value of every code, sorted candidate magnitudes, their codes); IEEE formats' inf is a candidate at 2^(emax+1)."""
  exp, man = dtypes.finfo(dt)
  bias, codes = 2 ** (exp - 1) - 1, np.arange(1 << (exp + man + 1), dtype=np.int64)
  neg = codes >> (exp + man)
  vals = format_values(dt)
  positive = (neg == 0) & np.isfinite(vals)
  mags, mag_codes = vals[positive], codes[positive]
  if dt is not dtypes.fp8e4m3:
    mags, mag_codes = np.append(mags, 2.0 ** ((1 << exp) - 1 - bias)), np.append(mag_codes, ((1 << exp) - 1) << man)
  return vals, mags, mag_codes

def decode(bits: np.ndarray, dt: DType) -> np.ndarray:
  """Raw bits of an emulated dtype -> float32 values."""
  return _table(dt)[0][bits.astype(np.int64)].astype(np.float32)

def encode(values: np.ndarray, dt: DType) -> np.ndarray:
  """float32 values -> raw bits of an emulated dtype, rounding to nearest even."""
  vals, mags, mag_codes = _table(dt)
  x = np.asarray(values, dtype=np.float32).astype(np.float64)
  a = np.abs(x)
  if dt is dtypes.fp8e4m3: a = np.minimum(a, mags[-1])
  hi = np.clip(np.searchsorted(mags, a), 1, len(mags) - 1)
  lo_v, hi_v, lo_c, hi_c = mags[hi - 1], mags[hi], mag_codes[hi - 1], mag_codes[hi]
  mid = (lo_v + hi_v) / 2
  code = np.where(a < mid, lo_c, np.where(a > mid, hi_c, np.where(lo_c % 2 == 0, lo_c, hi_c)))
  code = np.where(a > mags[-1], mag_codes[-1], code)  # inf, and beyond the last candidate
  exp, man = dtypes.finfo(dt)
  code = code | (np.signbit(x).astype(np.int64) << (exp + man))
  code = np.where(np.isnan(x), int(np.flatnonzero(np.isnan(vals))[0]), code)
  return code.astype(np_dtype(dt))

def as_values(a: np.ndarray, dt: DType) -> np.ndarray:
  """Buffer contents as comparable numbers (emulated dtypes decoded)."""
  return decode(a, dt) if dt in EMULATED else a

@contextlib.contextmanager
def reopened_cpu(renderer: str) -> Iterator[Any]:
  """The CPU device reopened with `renderer` ("CPU:C" or "CPU:LLVM", and so its runtime) for the block; the devices
  opened before are restored after it."""
  from ember.device import Device
  opened = dict(Device._opened)
  Device._opened.pop("CPU", None)
  try:
    with selected_device(renderer, "CPU") as dev: yield dev
  finally:
    Device._opened.clear()
    Device._opened.update(opened)
