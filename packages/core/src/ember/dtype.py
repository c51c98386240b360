"""DTypes, the promotion lattice and weak dtypes for Python scalars.

A weak dtype (`weakint`, `weakfloat`) is the type of a Python literal: under promotion it defers to any concrete
dtype of its kind (`int8 + 2 -> int8`, `float16 + 2.5 -> float16`), and it commits to the default dtype when it is
materialised. Strong dtypes are singletons compared by identity.
"""
from __future__ import annotations
import builtins
import functools
import math
import struct
from dataclasses import dataclass
from typing import Any, Final
from ember.errors import ArgumentError, DTypeError
from ember.helpers import DEFAULT_FLOAT, DEFAULT_INT

@dataclass(frozen=True, eq=False, repr=False)
class DType:
  priority: int
  itemsize: int
  name: str
  fmt: str | None
  kind: str  # 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float, 'v' void
  weak: bool = False
  def __repr__(self) -> str: return f"dtypes.{self.name}"
  def __reduce__(self) -> Any: return (_dtype_by_name, (self.name,))
  @property
  def bitsize(self) -> int: return self.itemsize * 8
  def scalar(self) -> DType: return self
  def ptr(self, size: int = -1) -> PtrDType: return PtrDType(self, size)
  @property
  def min(self) -> int | float: return dtypes.min(self)
  @property
  def max(self) -> int | float: return dtypes.max(self)
  def const(self, value: Any) -> Any: return as_const(value, self)

@dataclass(frozen=True, repr=False)
class PtrDType:
  """A pointer to `size` elements of `base`: the dtype of a kernel's buffer parameter."""
  base: DType
  size: int = -1
  def __repr__(self) -> str: return f"{self.base!r}.ptr({self.size})"
  @property
  def itemsize(self) -> int: return 8
  @property
  def name(self) -> str: return f"{self.base.name}*"
  weak = False
  kind = "p"
  def scalar(self) -> PtrDType: return self

AnyDType = DType | PtrDType

def _mk(priority: int, itemsize: int, name: str, fmt: str | None, kind: str, weak: bool = False) -> DType:
  return DType(priority, itemsize, name, fmt, kind, weak)

class DTypes:
  """The namespace of dtypes. `default_float` / `default_int` follow `Context(DEFAULT_FLOAT=..., DEFAULT_INT=...)`."""
  void: Final = _mk(-1, 0, "void", None, "v")
  bool: Final = _mk(0, 1, "bool", "?", "b")
  weakint: Final = _mk(1, 0, "weakint", None, "i", weak=True)
  int8: Final = _mk(2, 1, "int8", "b", "i")
  uint8: Final = _mk(3, 1, "uint8", "B", "u")
  int16: Final = _mk(4, 2, "int16", "h", "i")
  uint16: Final = _mk(5, 2, "uint16", "H", "u")
  int32: Final = _mk(6, 4, "int32", "i", "i")
  uint32: Final = _mk(7, 4, "uint32", "I", "u")
  int64: Final = _mk(8, 8, "int64", "q", "i")
  uint64: Final = _mk(9, 8, "uint64", "Q", "u")
  weakfloat: Final = _mk(10, 0, "weakfloat", None, "f", weak=True)
  fp8e4m3: Final = _mk(11, 1, "fp8e4m3", None, "f")
  fp8e5m2: Final = _mk(12, 1, "fp8e5m2", None, "f")
  float16: Final = _mk(13, 2, "float16", "e", "f")
  bfloat16: Final = _mk(14, 2, "bfloat16", None, "f")
  float32: Final = _mk(15, 4, "float32", "f", "f")
  float64: Final = _mk(16, 8, "float64", "d", "f")
  # aliases
  char, uchar, short, ushort, int, uint, long, ulong = int8, uint8, int16, uint16, int32, uint32, int64, uint64
  half, float, double = float16, float32, float64

  @property
  def default_float(self) -> DType: return _dtype_by_name(DEFAULT_FLOAT.value)
  @property
  def default_int(self) -> DType: return _dtype_by_name(DEFAULT_INT.value)

  @staticmethod
  def is_float(dt: AnyDType) -> builtins.bool: return dt.kind == "f"
  @staticmethod
  def is_int(dt: AnyDType) -> builtins.bool: return dt.kind in ("i", "u")
  @staticmethod
  def is_unsigned(dt: AnyDType) -> builtins.bool: return dt.kind == "u"
  @staticmethod
  def is_bool(dt: AnyDType) -> builtins.bool: return dt.kind == "b"
  @staticmethod
  def is_weak(dt: AnyDType) -> builtins.bool: return dt.weak

  @staticmethod
  def min(dt: DType) -> builtins.int | builtins.float:
    if dt.kind == "b": return False
    if dt.kind == "i": return -(2 ** (dt.bitsize - 1)) if dt.itemsize else -(2 ** 63)
    if dt.kind == "u": return 0
    return -math.inf
  @staticmethod
  def max(dt: DType) -> builtins.int | builtins.float:
    if dt.kind == "b": return True
    if dt.kind == "i": return 2 ** (dt.bitsize - 1) - 1 if dt.itemsize else 2 ** 63 - 1
    if dt.kind == "u": return 2 ** dt.bitsize - 1
    return math.inf

  def finfo(self, dt: DType) -> tuple[builtins.int, builtins.int]:
    """(exponent bits, mantissa bits) of a float dtype."""
    table = {self.float16: (5, 10), self.bfloat16: (8, 7), self.float32: (8, 23), self.float64: (11, 52),
             self.fp8e4m3: (4, 3), self.fp8e5m2: (5, 2)}
    if dt not in table: raise DTypeError(f"finfo needs a concrete float dtype, got {dt!r}")
    return table[dt]

  def from_py(self, x: Any) -> DType:
    """The dtype of a Python value: bool -> bool, int -> weakint, float -> weakfloat, a sequence -> the strong lub."""
    if isinstance(x, bool): return self.bool
    if isinstance(x, int): return self.weakint
    if isinstance(x, float): return self.weakfloat
    if isinstance(x, (list, tuple)):
      flat = list(_flatten(x))
      if not flat: return self.default_float
      return strong_dtype(functools.reduce(least_upper_dtype, (self.from_py(v) for v in flat)))
    raise DTypeError(f"cannot infer a dtype from {type(x).__name__} {x!r}; "
                     "pass a bool, int, float or a nested list of them")

  def from_np(self, npdtype: Any) -> DType:
    import numpy as np
    key = np.dtype(npdtype)
    for dt in self.all:
      if dt.fmt is not None and np.dtype(dt.fmt) == key: return dt
    raise DTypeError(f"numpy dtype {key} has no ember equivalent")

  @functools.cached_property
  def all(self) -> tuple[DType, ...]:
    return (self.bool, self.int8, self.uint8, self.int16, self.uint16, self.int32, self.uint32, self.int64, self.uint64,
            self.fp8e4m3, self.fp8e5m2, self.float16, self.bfloat16, self.float32, self.float64)
  @property
  def floats(self) -> tuple[DType, ...]: return tuple(d for d in self.all if d.kind == "f")
  @property
  def uints(self) -> tuple[DType, ...]: return tuple(d for d in self.all if d.kind == "u")
  @property
  def sints(self) -> tuple[DType, ...]: return tuple(d for d in self.all if d.kind == "i")
  @property
  def ints(self) -> tuple[DType, ...]: return self.sints + self.uints
  @property
  def fp8s(self) -> tuple[DType, ...]: return (self.fp8e4m3, self.fp8e5m2)
  @property
  def weaks(self) -> tuple[DType, ...]: return (self.weakint, self.weakfloat)

dtypes = DTypes()

def _dtype_by_name(name: str) -> DType:
  dt = getattr(DTypes, name, None)
  if not isinstance(dt, DType):
    raise DTypeError(f"unknown dtype name {name!r}; use one of {[d.name for d in dtypes.all]}")
  return dt

def to_dtype(x: DType | str) -> DType: return x if isinstance(x, DType) else _dtype_by_name(x)

def _flatten(x: Any):
  for v in x:
    if isinstance(v, (list, tuple)): yield from _flatten(v)
    else: yield v

# ** promotion lattice **
# An edge a -> b means a converts to b without loss of kind. Weak dtypes sit just above the strong dtypes they defer to:
# bool -> weakint -> every int; every int -> weakfloat -> every float (so int64 lub uint64 is weakfloat).
_lattice: dict[DType, tuple[DType, ...]] = {
  dtypes.bool: (dtypes.weakint,), dtypes.weakint: (dtypes.int8, dtypes.uint8),
  dtypes.int8: (dtypes.int16,), dtypes.int16: (dtypes.int32,), dtypes.int32: (dtypes.int64,),
  dtypes.int64: (dtypes.weakfloat,),
  dtypes.uint8: (dtypes.int16, dtypes.uint16), dtypes.uint16: (dtypes.int32, dtypes.uint32),
  dtypes.uint32: (dtypes.int64, dtypes.uint64), dtypes.uint64: (dtypes.weakfloat,),
  dtypes.weakfloat: (dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.bfloat16),
  # fp8 -> float16 only: with bfloat16 as a second parent the lub would depend on the order of promotion
  dtypes.fp8e4m3: (dtypes.float16,), dtypes.fp8e5m2: (dtypes.float16,),
  dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,), dtypes.float32: (dtypes.float64,),
  dtypes.float64: (),
}

@functools.cache
def _ancestors(dt: DType) -> frozenset[DType]:
  return frozenset({dt}).union(*(_ancestors(p) for p in _lattice[dt]))

def least_upper_dtype(*ds: AnyDType) -> DType:
  """The smallest dtype every argument converts to: `int8, weakint -> int8`, `int32, float16 -> float16`."""
  for d in ds:
    if not isinstance(d, DType) or d not in _lattice:
      raise DTypeError(f"cannot promote {d!r}; only value dtypes promote")
  common = frozenset.intersection(*(_ancestors(d) for d in ds))
  return min(common, key=lambda d: d.priority)

def least_upper_float(dt: DType) -> DType:
  """The float a value of `dt` computes in: itself if float, weakfloat if weak, else the default float."""
  if dtypes.is_float(dt): return dt
  return dtypes.weakfloat if dt.weak else dtypes.default_float

def strong_dtype(dt: DType) -> DType:
  """Commit a weak dtype to its default: weakint -> default_int, weakfloat -> default_float."""
  if dt is dtypes.weakint: return dtypes.default_int
  if dt is dtypes.weakfloat: return dtypes.default_float
  return dt

def check_scalar_fits(v: Any, dt: DType, op: str) -> None:
  """A Python int that `op` writes into an int tensor of dtype `dt` must fit it (torch raises too): masked_fill(m, 1000)
  of an int8 tensor wrote -24. Arithmetic (`x + 1000`) wraps, as torch's does, and is not checked here."""
  if isinstance(v, int) and not isinstance(v, bool) and dtypes.is_int(dt) and not dtypes.min(dt) <= v <= dtypes.max(dt):
    raise ArgumentError(f"{op}: {v} does not fit {dt!r} (range {dtypes.min(dt)}..{dtypes.max(dt)}); cast the tensor "
                        "to a wider dtype first")

def narrow_float(dt: DType) -> bool:
  """half, bfloat16 and the fp8s: composite reductions (mean, var, norms, attention) compute in float32 and cast once
  at the end, as torch does, where sums of squares or of many elements overflow them."""
  return dtypes.is_float(dt) and dt.itemsize < 4

def sum_acc_dtype(dt: DType) -> DType:
  """The dtype a sum accumulates in.

  Unsigned -> at least uint32, int/bool -> at least int32, float -> at least float32.
  """
  dt = strong_dtype(dt)
  if dtypes.is_unsigned(dt): return least_upper_dtype(dt, dtypes.uint32)
  if dtypes.is_int(dt) or dtypes.is_bool(dt): return least_upper_dtype(dt, dtypes.int32)
  return least_upper_dtype(dt, dtypes.float32)

# ** constants **

def _to_fp8(x: float, exp_bits: int, man_bits: int, fn: bool) -> float:
  """Round a float to the nearest value representable in an fp8 format (saturating for e4m3fn)."""
  if math.isnan(x) or math.isinf(x): return x if not fn or math.isnan(x) else math.copysign(448.0, x)
  bias = 2 ** (exp_bits - 1) - 1
  max_val = 448.0 if fn else (2 - 2 ** -man_bits) * 2.0 ** (2 ** exp_bits - 2 - bias)
  if abs(x) > max_val:
    if fn: return math.copysign(max_val, x)
    # e5m2 overflows to inf only past the rounding midpoint between max_val and the next (absent) step
    if abs(x) >= max_val + 2.0 ** (2 ** exp_bits - 2 - bias - man_bits - 1): return math.copysign(math.inf, x)
    return math.copysign(max_val, x)
  if x == 0: return x
  e = max(math.frexp(abs(x))[1] - 1, 1 - bias)  # frexp is exact where floor(log2) can round up below a power of two
  step = 2.0 ** (e - man_bits)
  return round(x / step) * step

def as_const(value: Any, dt: AnyDType) -> Any:
  """Convert a Python value to what a constant of `dt` holds, with C conversion semantics (wrap ints, round floats)."""
  if isinstance(dt, PtrDType): raise DTypeError("pointer dtypes have no constants")
  if dt.kind == "b": return bool(value)
  if dt.kind in ("i", "u"):
    if isinstance(value, float):
      if math.isnan(value) or math.isinf(value): return 0
      value = math.trunc(value)
    value = int(value)
    if dt.weak: return value
    mask = (1 << dt.bitsize) - 1
    value &= mask
    if dt.kind == "i" and value >= 1 << (dt.bitsize - 1): value -= 1 << dt.bitsize
    return value
  if dt.kind == "f":
    value = float(value)
    if dt is dtypes.float32:
      if not math.isfinite(value): return value
      if abs(value) >= 3.4028235677973366e38: return math.copysign(math.inf, value)  # rounds past float32's max
      return struct.unpack("f", struct.pack("f", value))[0]
    if dt is dtypes.float16:
      try: return struct.unpack("e", struct.pack("e", value))[0]
      except OverflowError: return math.copysign(math.inf, value)
    if dt is dtypes.bfloat16:
      if not math.isfinite(value): return value
      bits = struct.unpack("I", struct.pack("f", as_const(value, dtypes.float32)))[0]
      bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
      return struct.unpack("f", struct.pack("I", bits & 0xFFFFFFFF))[0]
    if dt is dtypes.fp8e4m3: return _to_fp8(value, 4, 3, fn=True)
    if dt is dtypes.fp8e5m2: return _to_fp8(value, 5, 2, fn=False)
    return value
  return value

# the public names (docs/public-api.md); the rest (promotion internals, const folding) may change without notice
__all__ = ["DType", "PtrDType", "dtypes", "to_dtype", "least_upper_dtype", "strong_dtype"]
