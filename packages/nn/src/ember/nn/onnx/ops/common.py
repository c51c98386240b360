"""Helpers the op implementations share: reading shape-like inputs as Python values, axes, and ONNX's pad layout."""
from __future__ import annotations
import math
from typing import Any, Sequence
from ember import Tensor, dtypes
from ember.dtype import DType
from ember.errors import AxisError, DTypeError
from ember.nn.onnx.errors import UnsupportedOpError
from ember.nn.functional import static_shape

def dims(x: Tensor) -> list[int]:
  """x's shape as ints (ONNX shapes are concrete once the inputs are given)."""
  return list(static_shape(x, "an ONNX op"))

def dim(x: Tensor, i: int) -> int: return static_shape(x, "an ONNX op")[i]

def ints(value: Tensor | Sequence[int] | int | None) -> list[int] | None:
  """A shape-like input (a Tensor that shapes, axes or sizes are read from) as Python ints; realizes it if needed."""
  if value is None: return None
  if isinstance(value, Tensor):
    if not dtypes.is_int(value.dtype):
      raise DTypeError(f"a shape, axes or sizes input must be integer, got {value.dtype!r}")
    flat = value.reshape(-1).tolist() if value.numel() else []
    return [int(v) for v in flat]
  if isinstance(value, int): return [value]
  return [int(v) for v in value]

def floats(value: Tensor | Sequence[float] | None) -> list[float] | None:
  if value is None: return None
  if isinstance(value, Tensor): return [float(v) for v in value.reshape(-1).tolist()] if value.numel() else []
  return [float(v) for v in value]

def scalar(value: Tensor | int | float | bool) -> Any:
  """A one-element input as a Python number."""
  if isinstance(value, Tensor): return value.reshape(-1)[0].item() if value.ndim else value.item()
  return value

def axis(a: int, ndim: int) -> int:
  if not -ndim <= a < max(ndim, 1): raise AxisError(f"axis {a} is out of range for rank {ndim}")
  return a + ndim if a < 0 else a

def axes_of(values: Sequence[int], ndim: int) -> list[int]: return [axis(a, ndim) for a in values]

def pad_pairs(pads: Sequence[int], n: int) -> list[tuple[int, int]]:
  """ONNX pads [x1_begin, x2_begin, ..., x1_end, x2_end] as [(x1_begin, x1_end), ...]."""
  return [(int(pads[i]), int(pads[i + n])) for i in range(n)]

def auto_pads(auto_pad: str, in_sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
              dilations: Sequence[int], pads: Sequence[int] | None) -> list[tuple[int, int]]:
  """The (begin, end) padding of each spatial dim from `auto_pad` (SAME_UPPER puts an odd extra at the end,
  SAME_LOWER at the begin), or from `pads` when it is NOTSET."""
  n = len(kernel)
  if auto_pad in ("NOTSET", ""): return pad_pairs(pads, n) if pads else [(0, 0)] * n
  if auto_pad == "VALID": return [(0, 0)] * n
  if auto_pad not in ("SAME_UPPER", "SAME_LOWER"): raise UnsupportedOpError(f"auto_pad {auto_pad!r} is not supported")
  out = []
  for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
    total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
    small = total // 2
    out.append((small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small))
  return out

def full_pads(x: Tensor, spatial: list[tuple[int, int]]) -> list[tuple[int, int]]:
  """Per-dim padding of x that pads only its trailing spatial dims."""
  return [(0, 0)] * (x.ndim - len(spatial)) + spatial

def lowest(dt: DType) -> float | int: return -math.inf if dtypes.is_float(dt) else dtypes.min(dt)
def highest(dt: DType) -> float | int: return math.inf if dtypes.is_float(dt) else dtypes.max(dt)

def const_like(x: Tensor, value: Any, shape: Sequence[int] | None = None, dtype: DType | None = None) -> Tensor:
  """A constant on x's device (x's dtype unless given), broadcast to `shape` (x's shape unless given)."""
  return Tensor.full(tuple(x.shape if shape is None else shape), value, dtype=dtype or x.dtype, device=x.device)
