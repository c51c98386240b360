"""The backend conformance kit: what every ember device must do, in tiers that skip by declared capability.

Run it against a device with the pytest plugin this package registers (entry point ``pytest11``)::

  pytest --pyargs ember.testing --ember-device=CPU
  pytest --pyargs ember.testing --ember-device=CPU:LLVM   # a renderer picked like DEV does

Tiers (one test module each): registration and probe (``test_registration``), allocator round trips
(``test_allocator``), render + compile of a kernel corpus (``test_compile``), numerics against the PYTHON reference
device over every dtype the renderer supports (``test_numerics``), HCQ queues (``test_queues``), multi-device and CPU
threads (``test_multidevice``), kernel times in profiles (``test_profile``). A tier whose capability the device does
not declare skips with the reason; it never fails for it. This module imports only numpy at import time (and ember
lazily), because it ships in the core wheel.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable
import numpy as np

if TYPE_CHECKING:
  from ember.device.base import Compiled
  from ember.dtype import DType
  from ember.renderer import ProgramSpec
  from ember.tensor import Tensor

REFERENCE_DEVICE = "PYTHON"

@dataclass(frozen=True)
class Capabilities:
  """What a device declares, as the kit reads it. Each tier skips on the flag it needs."""
  device: str
  has_renderer: bool
  has_compiler: bool
  holds_data: bool  # False for dry-run devices (NULL): they compile and schedule but keep no bytes
  supports_views: bool  # the allocator implements `_offset`
  zero_copy: bool  # the allocator implements `_as_buffer`
  has_threads: bool  # the renderer splits kernels over CPU threads (NUM_CPU_THREADS)
  queue_interfaces: tuple[str, ...]  # HCQ interfaces registered through ember_register_queues
  dtypes: tuple[DType, ...]  # renderer.supported_dtypes(), empty without a renderer

def open_device(device: str) -> Compiled:
  from ember.device import Device
  return Device[device]

def _holds_data(dev: Compiled) -> bool:
  declared = getattr(dev, "holds_data", None)
  if declared is not None: return bool(declared)
  from ember.device.null import NullAllocator
  return not isinstance(dev.allocator, NullAllocator)

def capabilities(device: str) -> Capabilities:
  from ember.device import Device
  dev = open_device(device)
  head = Device.canonicalize(device).partition(":")[0]
  registry = Device.registry
  queues = tuple(iface for (d, iface) in registry.queues if d == head)
  renderer = dev.renderer
  return Capabilities(device=Device.canonicalize(device), has_renderer=renderer is not None,
                      has_compiler=dev.compiler is not None, holds_data=_holds_data(dev),
                      supports_views=hasattr(dev.allocator, "_offset"), zero_copy=hasattr(dev.allocator, "_as_buffer"),
                      has_threads=bool(getattr(renderer, "has_threads", False)), queue_interfaces=queues,
                      dtypes=tuple(renderer.supported_dtypes()) if renderer is not None else ())

# ** inputs, tolerances and comparison **

def sample(shape: tuple[int, ...], dt: DType, seed: int, nonzero: bool = False, positive: bool = False) -> np.ndarray:
  """Deterministic inputs that stay exact and overflow-free in `dt`: small ints, moderate floats."""
  from ember.dtype import dtypes
  rng = np.random.default_rng(seed)
  if dt is dtypes.bool: return rng.integers(0, 2, shape).astype(np.bool_)
  if dtypes.is_int(dt):
    lo = 1 if (nonzero or positive) else (0 if dtypes.is_unsigned(dt) else -6)
    vals = rng.integers(lo, 7, shape)
    if not dtypes.is_unsigned(dt) and nonzero and not positive: vals = vals * rng.choice([-1, 1], shape)
    return vals.astype(np.int64)
  floats = rng.standard_normal(shape) * 2
  if positive: floats = np.abs(floats) + 0.25
  elif nonzero: floats = np.where(np.abs(floats) < 0.25, 0.5, floats)
  return floats.astype(np.float64)

def tensor(data: np.ndarray, dt: DType, device: str) -> Tensor:
  """A tensor of dtype `dt` on `device` holding `data` (formats numpy lacks are cast on the device)."""
  from ember.dtype import dtypes
  from ember.tensor import Tensor
  if dt.fmt is not None: return Tensor(np.ascontiguousarray(data.astype(dt.fmt)), device=device)
  return Tensor(np.ascontiguousarray(data.astype(np.float32)), device=device).cast(dt) if dt is not dtypes.bool else \
    Tensor(data.astype(np.bool_), device=device)

def tolerance(dt: DType) -> tuple[float, float]:
  """(rtol, atol) for comparing a device against the reference: a couple of ulps of `dt`'s format."""
  from ember.dtype import dtypes
  table = {dtypes.float64: (1e-9, 1e-12), dtypes.float32: (2e-5, 1e-6), dtypes.float16: (4e-3, 1e-3),
           dtypes.bfloat16: (3e-2, 1e-2), dtypes.fp8e4m3: (0.26, 0.05), dtypes.fp8e5m2: (0.51, 0.1)}
  return table.get(dt, (0.0, 0.0))

def assert_matches(out: Tensor, ref: Tensor, context: str, computed_in: DType | None = None) -> None:
  """Values and dtype of `out` equal the reference's, within `tolerance` of the output dtype, or of `computed_in` when
  that is coarser: a renderer may keep the intermediates of a low-precision computation in float32 (see
  docs/linear-program.md), so results agree only to the precision of the inputs."""
  if out.dtype is not ref.dtype: raise AssertionError(f"{context}: dtype {out.dtype!r} != reference {ref.dtype!r}")
  if tuple(out.shape) != tuple(ref.shape):
    raise AssertionError(f"{context}: shape {out.shape} != reference {ref.shape}")
  a, b = out.numpy(), ref.numpy()
  rtol, atol = tolerance(out.dtype)
  if computed_in is not None and tolerance(computed_in)[0] > rtol: rtol, atol = tolerance(computed_in)
  if rtol == 0 and atol == 0:
    np.testing.assert_array_equal(a, b, err_msg=context)
  else:
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True,
                               err_msg=context)

# ** the kernel corpus: each builds a tensor graph on a device; inputs come from `sample` **

Builder = Callable[[str, "DType"], "Tensor"]

def _elementwise(device: str, dt: DType) -> Tensor:
  from ember.dtype import dtypes
  a, b = tensor(sample((4, 6), dt, 1), dt, device), tensor(sample((4, 6), dt, 2), dt, device)
  if dt is dtypes.bool: return (a & b) | (a < b)
  return (a.maximum(b) + a * b).cast(dtypes.float32)

def _reduce(device: str, dt: DType) -> Tensor:
  return tensor(sample((5, 7), dt, 3), dt, device).sum(1)

def _movement(device: str, dt: DType) -> Tensor:
  x = tensor(sample((3, 4), dt, 4), dt, device)
  return x.permute(1, 0).pad(((1, 0), (0, 2))).flip(0).shrink(((1, 5), (1, 5))).reshape(2, 8).contiguous()

def _gated_pad(device: str, dt: DType) -> Tensor:
  from ember.dtype import dtypes
  x = tensor(sample((3, 4), dt, 5), dt, device)
  return x.pad(((2, 1), (1, 3))).cast(dtypes.float32) + 1

def _matmul(device: str, dt: DType) -> Tensor:
  a, b = tensor(sample((4, 5), dt, 6), dt, device), tensor(sample((5, 3), dt, 7), dt, device)
  return a @ b

def _long_reduce(device: str, dt: DType) -> Tensor:
  """Reductions of 512 elements: GPU renderers share each among the threads of a block (shared memory, a barrier,
  warp shuffles; ember.codegen.group). Integer-valued inputs keep every order of summation exact; 8/16-bit and
  emulated formats take only the max (exact in any order)."""
  from ember.dtype import dtypes
  data = sample((3, 512), dt, 8)
  x = tensor(np.round(data) if dtypes.is_float(dt) else data, dt, device)
  if dt in (dtypes.float32, dtypes.float64) or (dtypes.is_int(dt) and dt.itemsize >= 4):
    return x.max(1).cast(dtypes.float32) * 1000 + x.sum(1).cast(dtypes.float32)
  return x.max(1)

KERNEL_CORPUS: dict[str, Builder] = {"elementwise": _elementwise, "reduce": _reduce, "movement": _movement,
                                     "gated_pad": _gated_pad, "matmul": _matmul, "long_reduce": _long_reduce}

def format_values(dt: DType) -> np.ndarray:
  """The value of every code of the small float format `dt` (bfloat16, fp8e4m3, fp8e5m2, float16), as float64, from
  the format's definition (numpy has no such dtypes): e4m3fn has no inf, its all-ones code is NaN."""
  from ember.dtype import dtypes
  exp, man = dtypes.finfo(dt)
  bias, codes = 2 ** (exp - 1) - 1, np.arange(1 << (exp + man + 1), dtype=np.int64)
  e, m, neg = (codes >> man) & ((1 << exp) - 1), codes & ((1 << man) - 1), codes >> (exp + man)
  vals = np.where(e == 0, m * 2.0 ** (1 - bias - man), (1 + m / 2.0 ** man) * 2.0 ** (e - bias))
  top = e == (1 << exp) - 1
  if dt is dtypes.fp8e4m3: vals = np.where(top & (m == (1 << man) - 1), np.nan, vals)
  else: vals = np.where(top, np.where(m == 0, np.inf, np.nan), vals)
  return np.where(neg == 1, -vals, vals)

def division_operands(dt: DType) -> tuple[np.ndarray, np.ndarray]:
  """Every pair of the dividends MIN, MAX, 0, +-1, +-7 with the divisors 0, +-1, +-3, MIN, MAX of int dtype `dt` (the
  ones it holds): where integer division traps in C, and around it."""
  npdt = np.dtype(dt.fmt)
  info = np.iinfo(npdt)
  a = sorted(v for v in {info.min, info.max, 0, 1, 7, -1, -7} if info.min <= v <= info.max)
  b = sorted(v for v in {0, 1, 3, -1, -3, info.min, info.max} if info.min <= v <= info.max)
  grid_a, grid_b = np.meshgrid(np.array(a, npdt), np.array(b, npdt), indexing="ij")
  return grid_a.ravel(), grid_b.ravel()

def trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """C division (toward zero) with ember's values where C traps: x / 0 is 0, MIN / -1 wraps to MIN."""
  safe = np.where(b == 0, 1, b).astype(a.dtype)
  with np.errstate(all="ignore"): return np.where(b == 0, 0, (a - np.fmod(a, safe)) // safe).astype(a.dtype)

def kernel_items(t: Tensor) -> list[Any]:
  return [it for it in t.schedule() if it.kind == "kernel"]

def render_and_compile(t: Tensor, device: str) -> list[tuple[ProgramSpec, bytes]]:
  """Render and compile every kernel `t` needs on `device` (no launch): the compile tier's unit of work."""
  from ember.codegen import get_program
  dev = open_device(device)
  if dev.renderer is None or dev.compiler is None: raise AssertionError(f"{device} has no renderer or no compiler")
  out = []
  for it in kernel_items(t):
    spec = get_program(it.ast, dev.renderer, device)
    out.append((spec, dev.compiler.compile(spec.src)))
  return out

__all__ = ["REFERENCE_DEVICE", "Capabilities", "capabilities", "open_device", "sample", "tensor", "tolerance",
           "assert_matches", "KERNEL_CORPUS", "kernel_items", "render_and_compile"]
