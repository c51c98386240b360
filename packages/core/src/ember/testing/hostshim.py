"""Test helpers for backends whose kernels also run through the host shim (`ember.device.hostshim`): the kernel corpus
built on the PYTHON reference device, a runner of whole schedules through host shim builds, and the checks that the
MOCK devices of the GPU backends share.

Unlike the kit's package module, this one imports ember when it is imported: only a backend's tests import it.
"""
from __future__ import annotations
import contextlib
import ctypes
import functools
import os
import subprocess
import sys
from typing import Any, Callable, Iterator
import numpy as np
from ember.codegen import get_program
from ember.device.hostshim import HostKernel, HostShimCompiler
from ember.dtype import DType, dtypes
from ember.renderer import ProgramSpec, Renderer
from ember.schedule import ScheduleItem
from ember.tensor import Tensor
from ember.testing import KERNEL_CORPUS, REFERENCE_DEVICE, tolerance
from ember.uop.ops import Ops, UOp, int_shape

EMULATED = (dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2)
"""The dtypes C renderers store as raw bits and compute in float32."""
CORPUS_DTYPES = tuple(d for d in dtypes.all if d is not dtypes.void)
ArgLayout = Callable[[list[UOp]], tuple[list[tuple[int, int]], int]]

def corpus_tensor(name: str, dt: DType) -> Tensor:
  """The corpus kernel `name` over `dt`, built on the reference device."""
  return KERNEL_CORPUS[name](REFERENCE_DEVICE, dt)

def kernel_asts(t: Tensor) -> list[Any]: return [it.ast for it in t.schedule() if it.kind == "kernel"]

def programs(t: Tensor, renderer: Renderer) -> list[ProgramSpec]:
  """Every kernel of `t`'s schedule rendered by `renderer`."""
  return [get_program(ast, renderer) for ast in kernel_asts(t)]

def corpus_programs(name: str, renderer: Renderer) -> Iterator[ProgramSpec]:
  """Every kernel of the corpus entry `name`, over every corpus dtype `renderer` supports, rendered by `renderer`."""
  for dt in CORPUS_DTYPES:
    if dt not in renderer.unsupported_dtypes: yield from programs(corpus_tensor(name, dt), renderer)

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

def as_values(raw: np.ndarray, dt: DType, shape: tuple[int, ...]) -> np.ndarray:
  """Bytes holding `dt` elements -> an array of values in `shape` (emulated dtypes decoded to float64)."""
  if dt in EMULATED: return decode_bits(raw.view(np.uint16 if dt.itemsize == 2 else np.uint8), dt).reshape(shape)
  return raw.view(np.dtype(dt.fmt)).reshape(shape)

def pack_params(layout: list[tuple[int, int]], size: int, args: list[int]) -> bytes:
  """A parameter block of `size` bytes with each integer argument (an address or a variable) little-endian at its
  (offset, width) slot of `layout`."""
  if len(args) != len(layout): raise AssertionError(f"{len(args)} arguments for {len(layout)} parameters")
  params = bytearray(size)
  for (offset, width), value in zip(layout, args):
    params[offset:offset + width] = int(value).to_bytes(width, "little", signed=value < 0)
  return bytes(params)

def _dim3(size: list[int] | None) -> tuple[int, int, int]:
  """A launch size as the shim's three dims (missing ones are 1, as a device launch pads them)."""
  dims = [*(size or ()), 1, 1, 1]
  return dims[0], dims[1], dims[2]

def run_schedule_on_shim(items: list[ScheduleItem], dt: DType, shape: tuple[int, ...], renderer: Renderer,
                         arg_layout: ArgLayout, kernel_for: Callable[[ProgramSpec], HostKernel]) -> np.ndarray:
  """Execute a schedule with every kernel rendered by `renderer` and run by the host shim (`kernel_for` gives the
  loaded build of a program, `arg_layout` the parameter block of its uops); returns the last item's output as values
  of `dt` in `shape`. Host memory is one array per base buffer, so buffer views alias their base as on a device;
  inputs start with their contents, every other buffer with zeros."""
  memory: dict[int, np.ndarray] = {}
  for it in items:
    if it.kind != "kernel" or it.ast is None:
      raise AssertionError(f"unexpected {it.kind} item in a single-device schedule")
    for b in it.bufs:
      base = b.base
      if id(base) not in memory:
        memory[id(base)] = base.numpy().view(np.uint8).copy() if base.is_allocated else np.zeros(base.nbytes, np.uint8)
    spec = get_program(it.ast, renderer)
    layout, size = arg_layout(spec.uops)
    args = [memory[id(b.base)].ctypes.data + b.offset for b in it.bufs] + [it.var_vals[v.arg[0]] for v in spec.vars]
    params = pack_params(layout, size, args)
    kernel_for(spec).run(params, _dim3(spec.global_size), _dim3(spec.local_size))
  out = items[-1].bufs[0]
  return as_values(memory[id(out.base)][out.offset:out.offset + out.nbytes], dt, shape)

class ShimRunner:
  """Runs tensors' schedules through one backend's host shim: `renderer` and `arg_layout` as the backend's runtime
  uses them, and `compiler` (built once, on first use) for the builds."""
  def __init__(self, renderer: Callable[[], Renderer], arg_layout: ArgLayout,
               compiler: Callable[[], HostShimCompiler]) -> None:
    self.renderer, self.arg_layout, self._compiler = renderer, arg_layout, compiler
  @functools.cached_property
  def compiler(self) -> HostShimCompiler: return self._compiler()
  def kernel(self, spec: ProgramSpec) -> HostKernel: return HostKernel(self.compiler.compile_cached(spec.src))
  def run_schedule(self, items: list[ScheduleItem], dt: DType, shape: tuple[int, ...],
                   kernel_for: Callable[[ProgramSpec], HostKernel] | None = None) -> np.ndarray:
    return run_schedule_on_shim(items, dt, shape, self.renderer(), self.arg_layout, kernel_for or self.kernel)
  def run(self, t: Tensor) -> np.ndarray:
    """`t`'s schedule through the host shim, one build per kernel; returns the output as values in `t`'s shape."""
    return self.run_schedule(t.schedule(), t.dtype, int_shape(t.shape, "a host shim run"))
  def run_edited(self, t: Tensor, edit: Callable[[str], str]) -> np.ndarray:
    """Like `run`, with every kernel's source passed through `edit` before it is built (a test's broken kernel)."""
    def kernel(spec: ProgramSpec) -> HostKernel: return HostKernel(self.compiler.compile(edit(spec.src)))
    return self.run_schedule(t.schedule(), t.dtype, int_shape(t.shape, "a host shim run"), kernel)

# ** checks shared by the backends' tests **

def check_corpus_kernel(name: str, dt: DType, run: Callable[[Tensor], np.ndarray]) -> None:
  """The corpus kernel `name` over `dt`, run by `run`, matches the reference device realising the same graph."""
  t = corpus_tensor(name, dt)
  got = run(t)
  want = t.numpy()
  rtol, atol = max(tolerance(t.dtype), tolerance(dt))  # emulated dtypes compute their intermediates in float32
  if dt in EMULATED:  # the reference rounds every partial sum: cancellation leaves errors of the size of the terms
    atol = max(atol, rtol * float(np.nanmax(np.abs(want.astype(np.float64)))))
  np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)

def check_over_covering_math(run: Callable[[Tensor], np.ndarray]) -> None:
  """1000 elements (not a multiple of any block size, so clamped tail threads run too) through exp2, log2, sqrt and
  sin, against numpy."""
  x = np.random.default_rng(0).uniform(0.5, 4.0, 1000).astype(np.float32)
  def T() -> Tensor: return Tensor(x, device=REFERENCE_DEVICE)
  got = run(T().exp2() + T().log2() * T().sqrt() + T().sin())
  np.testing.assert_allclose(got, np.exp2(x) + np.log2(x) * np.sqrt(x) + np.sin(x), rtol=1e-5, atol=1e-5)

def check_casts(run: Callable[[Tensor], np.ndarray], targets: tuple[DType, ...]) -> None:
  """float32 values with fractions, negatives and one beyond int8 cast to each of `targets`, against numpy (C
  truncation toward zero; a negative value cast to uint8 wraps modulo 256 as the C cast does on the host)."""
  x = np.array([-3.75, -1.5, -0.25, 0.0, 0.5, 1.25, 2.5, 100.75], np.float32)
  for dt in targets:
    got = run(Tensor(x, device=REFERENCE_DEVICE).cast(dt))
    if dt is dtypes.uint8: want = np.trunc(x).astype(np.int64).astype(np.uint8)
    else: want = x.astype(np.float64).astype(np.dtype(dt.fmt))
    np.testing.assert_array_equal(got, want, err_msg=dt.name)

def _group_input(seed: int, *shape: int) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device=REFERENCE_DEVICE)

def _group_nan() -> Tensor:
  x = np.random.default_rng(5).standard_normal((4, 512)).astype(np.float32)
  x[1, 300], x[3, 7] = np.nan, np.inf
  return Tensor(x, device=REFERENCE_DEVICE).max(1)

GROUP_CASES: dict[str, Callable[[], Tensor]] = {
  "softmax_512": lambda: _group_input(1, 4, 512).softmax(1),
  "var_1024": lambda: _group_input(2, 3, 1024).var(1),
  "sum_plus_max_512": lambda: _group_input(8, 4, 512).sum(1) + _group_input(8, 4, 512).max(1),
  "argmax_512": lambda: _group_input(3, 5, 512).argmax(1),
  "matvec_576": lambda: _group_input(4, 1, 576) @ _group_input(6, 576, 40),
  "max_nan_inf": _group_nan,
  "sum_int64_768": lambda: Tensor(np.arange(-700, 2372, dtype=np.int64).reshape(4, 768) * 3_000_000_000,
                                  device=REFERENCE_DEVICE).sum(1),
  "sum_half_256": lambda: _group_input(7, 6, 256).cast(dtypes.float16).sum(1),
}
"""Kernels with reductions long enough for ember.codegen.group on GPU renderers (shared memory, barriers, warp
shuffles), including dependent reductions (softmax, var), NaN/inf through MAX, and dtypes without shuffles."""

def check_group_case(name: str, renderer: Renderer, run: Callable[[Tensor], np.ndarray]) -> None:
  """GROUP_CASES[name], run by `run`, matches the reference device; at least one of its kernels is a group reduction
  on `renderer` (so the test fails if the heuristic stops applying)."""
  t = GROUP_CASES[name]()
  uops = [u for spec in programs(t, renderer) for u in spec.uops]
  assert any(u.op in (Ops.BARRIER, Ops.SHUFFLE_XOR) for u in uops), f"{name}: no group reduction on {renderer}"
  got, want = run(t), t.numpy()
  rtol, atol = (2e-3, 2e-3) if t.dtype is dtypes.float16 else (1e-5, 1e-5)  # sums in a different order
  if dtypes.is_float(t.dtype):
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
  else: np.testing.assert_array_equal(got, want)

@contextlib.contextmanager
def selected_device(dev: str, name: str) -> Iterator[Any]:
  """`Device.DEFAULT = dev` (selecting like DEV=`dev`, e.g. MOCK+NV) for the block, which gets the opened device
  `name` (e.g. NV); the previous selection is restored after."""
  from ember.device import Device
  old = (Device._dev, Device._default)
  Device.DEFAULT = dev
  try: yield Device[name]
  finally: Device._dev, Device._default = old

def check_tensor_ops(device: str) -> None:
  """Matmul + relu, a reduction, a pad and a cast on `device` match numpy."""
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(7, 9)).astype(np.float32), rng.normal(size=(9, 5)).astype(np.float32)
  x, y = Tensor(a, device=device), Tensor(b, device=device)
  np.testing.assert_allclose(((x @ y).relu() + 1).numpy(), np.maximum(a @ b, 0) + 1, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(x.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(x.pad(((1, 2), (0, 3))).numpy(), np.pad(a, ((1, 2), (0, 3))))
  np.testing.assert_array_equal((x * 3).cast(dtypes.int32).numpy(), (a * 3).astype(np.int32))

def check_graph_replay(dev: Any, device: str) -> None:
  """An HCQGraph of one kernel launched twice replays three times with its input buffer swapped each time."""
  from ember.device.hcq import HCQGraph
  x = Tensor(np.zeros(16, np.float32), device=device)
  item = [it for it in (x * 2 + 1).schedule() if it.kind == "kernel"][0]
  spec = get_program(item.ast, dev.renderer)
  prg = dev.runtime(spec.name, dev.compiler.compile_cached(spec.src))
  bufs = [b.ensure_allocated()._buf for b in item.bufs]
  graph = HCQGraph(dev, [(prg, bufs, (), _dim3(spec.global_size), _dim3(spec.local_size))] * 2)
  for k in range(3):
    new_in = dev.allocator.alloc(64)
    data = np.arange(16, dtype=np.float32) * (k + 1)
    ctypes.memmove(new_in.va_addr, data.tobytes(), 64)
    graph({id(bufs[1]): new_in})
    dev.synchronize()
    np.testing.assert_array_equal(np.frombuffer(ctypes.string_at(bufs[0].va_addr, 64), np.float32), data * 2 + 1)

def run_python(code: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
  """`code` in a fresh interpreter with `env` added to this process's environment."""
  return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                        timeout=timeout)

__all__ = ["EMULATED", "CORPUS_DTYPES", "corpus_tensor", "kernel_asts", "programs", "corpus_programs", "decode_bits",
           "as_values", "pack_params", "run_schedule_on_shim", "ShimRunner", "check_corpus_kernel",
           "check_over_covering_math", "check_casts", "selected_device", "check_tensor_ops", "check_graph_replay",
           "run_python"]
