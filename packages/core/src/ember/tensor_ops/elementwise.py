"""Elementwise ops: casts, arithmetic with broadcasting and weak-dtype promotion, comparisons, bitwise ops.

A mixin of `ember.tensor.Tensor`. This module cannot import ember.tensor (which imports it to define Tensor);
ember.tensor hands it `PyBool`, `Tensor`, `_binop` ... once Tensor exists (`LATE_NAMES`)."""
from __future__ import annotations
from typing import TYPE_CHECKING, Any
from ember.dtype import DType, dtypes, least_upper_dtype, least_upper_float, strong_dtype, to_dtype
from ember.errors import DTypeError, ShapeError, DeviceError, IntegerDivisionByZeroError
from ember.uop.ops import Ops, UOp, GroupOp, sint

if TYPE_CHECKING:
  from ember.tensor import (PyBool, PyInt, Tensor, _binop, _cast_uop, _const_uop, _exact_floordiv,
                            _is_contiguous_buffer, _shift, broadcast_shape)

LATE_NAMES = ('PyBool', 'Tensor', '_binop', '_cast_uop', '_const_uop', '_exact_floordiv', '_is_contiguous_buffer',
              '_shift', 'broadcast_shape')

class ElementwiseMixin:
  __slots__ = ()  # Tensor's own slots stay the only instance fields
  # ** elementwise **
  def _const_like(self: Tensor, x: Any) -> Tensor:
    if self.sharding is not None: return self.sharding.const_like(x)
    return Tensor(_const_uop(x, dtypes.from_py(x), self.device))
  def _broadcasted(self: Tensor, y: Any, reverse: bool = False) -> tuple[Tensor, Tensor]:
    if self.sharding is not None: return self.sharding.broadcasted(self, y, reverse)
    if isinstance(y, Tensor): other = y
    elif isinstance(y, (bool, int, float)): other = Tensor(_const_uop(y, dtypes.from_py(y), self.device))
    else: other = Tensor(y, device=self.device)
    if other.device != self.device:
      raise DeviceError(f"operands on different devices: {self.device} and {other.device}; move one with .to()")
    dt = least_upper_dtype(self.dtype, other.dtype)
    a, b = self.cast(dt), other.cast(dt)
    shp = broadcast_shape(a.shape, b.shape)
    a, b = a._broadcast_to(shp), b._broadcast_to(shp)
    return (b, a) if reverse else (a, b)
  def _broadcast_to(self: Tensor, shape: tuple[sint, ...]) -> Tensor:
    if self.shape == shape: return self
    return self.reshape((1,) * (len(shape) - self.ndim) + self.shape).expand(shape)
  def _alu(self: Tensor, op: Ops, *srcs: Tensor) -> Tensor:
    if self.sharding is not None: return self.sharding.alu(self, op, *srcs)
    out_dtype = dtypes.bool if op in GroupOp.Comparison else self.dtype
    if op in GroupOp.Bitwise and any(dtypes.is_float(s.dtype) for s in (self, *srcs)):
      got = " and ".join(repr(s.dtype) for s in (self, *srcs))
      raise DTypeError(f"{op.name.lower()} needs int or bool operands, got {got}")
    # comparisons and int results carry no gradient (torch: only float tensors require grad), so backward never
    # fills a .grad for a mask
    rg = (any(t.requires_grad for t in (self, *srcs)) and dtypes.is_float(out_dtype)) or None
    return Tensor(UOp(op, out_dtype, tuple(t.uop for t in (self, *srcs))), requires_grad=rg)
  def cast(self: Tensor, dtype: DType | str) -> Tensor:
    dt = to_dtype(dtype)
    if self.dtype is dt: return self
    if self.sharding is not None: return self.sharding.cast(self, dt)
    rg = self.requires_grad if dtypes.is_float(dt) else None
    return Tensor(_cast_uop(self.uop, dt), requires_grad=rg)
  def bitcast(self: Tensor, dtype: DType | str) -> Tensor:
    dt = to_dtype(dtype)
    if self.dtype.weak or dt.weak: raise DTypeError(f"bitcast needs concrete dtypes, got {self.dtype!r} -> {dt!r}")
    if self.sharding is not None: return self if self.dtype is dt else self.sharding.bitcast(self, dt)
    if dt.itemsize != self.dtype.itemsize:
      if not self.shape or (self.shape[-1] * self.dtype.itemsize) % dt.itemsize != 0:
        raise ShapeError(f"bitcast {self.dtype!r} -> {dt!r}: last dim of shape {self.shape} does not divide")
      src = self if _is_contiguous_buffer(self.uop) else self.contiguous()
      return Tensor(UOp(Ops.BITCAST, dt, (src.uop,)))
    return self if self.dtype is dt else Tensor(UOp(Ops.BITCAST, dt, (self.uop,)))
  def float(self: Tensor) -> Tensor: return self.cast(dtypes.float32)
  def half(self: Tensor) -> Tensor: return self.cast(dtypes.float16)
  def int(self: Tensor) -> Tensor: return self.cast(dtypes.int32)
  def long(self: Tensor) -> Tensor: return self.cast(dtypes.int64)
  def bool(self: Tensor) -> Tensor: return self.cast(dtypes.bool)
  def double(self: Tensor) -> Tensor: return self.cast(dtypes.float64)

  def add(self: Tensor, x: Any, reverse: PyBool = False, *, alpha: Any = None) -> Tensor:
    """self + x (torch's `alpha=` scales x first)."""
    return _binop(Ops.ADD, self, x if alpha is None else x * alpha, reverse)
  def sub(self: Tensor, x: Any, reverse: PyBool = False, *, alpha: Any = None) -> Tensor:
    """self - x (torch's `alpha=` scales x first)."""
    a, b = self._broadcasted(x if alpha is None else x * alpha, reverse)
    if a.dtype is dtypes.bool:
      raise DTypeError("subtraction of bool tensors is not supported; use logical_xor or cast to int")
    return a._alu(Ops.SUB, b)
  def mul(self: Tensor, x: Any, reverse: PyBool = False) -> Tensor: return _binop(Ops.MUL, self, x, reverse)
  def div(self: Tensor, x: Any, reverse: PyBool = False, rounding_mode: str | None = None) -> Tensor:
    """self / x; `rounding_mode="trunc"` rounds the quotient toward zero, `"floor"` down (Python's //: the floor of
    the exact quotient, so 1.0 // 0.1 is 9.0). Rounded quotients keep int dtypes and have zero gradient, as in torch.

    >>> Tensor([7, -7]).div(2, rounding_mode="floor").tolist()
    [3, -4]
    """
    if rounding_mode not in (None, "trunc", "floor"):
      raise ShapeError(f"div rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    a, b = self._broadcasted(x, reverse)
    if rounding_mode is None:
      ft = least_upper_float(a.dtype)
      return a.cast(ft)._alu(Ops.FDIV, b.cast(ft))
    if a.dtype is dtypes.bool: a, b = a.cast(dtypes.int32), b.cast(dtypes.int32)
    if dtypes.is_int(a.dtype):
      _refuse_zero_divisor(x, reverse, f"div(rounding_mode={rounding_mode!r})")
      return a._alu(Ops.IDIV, b) if rounding_mode == "trunc" else a._floordiv(b)
    ad, bd = a.detach(), b.detach()
    q = (ad / bd).trunc() if rounding_mode == "trunc" else _exact_floordiv(ad, bd)
    # a piecewise-constant result: zero gradient, but a and b stay in the graph (so asking for their gradient works)
    return (a.isnan() | b.isnan()).where(q, q)
  def _floordiv(self: Tensor, b: Tensor) -> Tensor:
    q = self._alu(Ops.IDIV, b)
    # C division truncates: step down where the signs differ and there is a remainder
    fix = (self._alu(Ops.MOD, b) != 0) & ((self < 0) != (b < 0))
    return fix.where(q - 1, q)
  def mod(self: Tensor, x: Any, reverse: PyBool = False) -> Tensor:
    a, b = self._broadcasted(x, reverse)
    if dtypes.is_int(a.dtype):
      _refuse_zero_divisor(x, reverse, "%")
      r = a._alu(Ops.MOD, b)
      return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)
    q = _exact_floordiv(a.detach(), b.detach())
    # the value is a - q * b computed exactly (1.0 % 0.1 is 0.0999..., not 0); the gradient is that of a - q * b
    approx = a - q * b
    exact = (a.cast(dtypes.float64) - q.cast(dtypes.float64) * b.cast(dtypes.float64)).cast(a.dtype)
    value = approx + (exact - approx).detach()
    value = (value == 0).where(a.detach() * 0, value)  # a zero remainder takes a's sign, as torch's (fmod's) does
    # a finite a modulo an infinite b is a itself, or b where their signs differ and a != 0 (torch, Python)
    over_inf = ((a != 0) & ((a < 0) != (b < 0))).where(b, a)
    return (b.isinf() & a.isfinite()).where(over_inf, value)
  def neg(self: Tensor) -> Tensor:
    if self.dtype is dtypes.bool: return self.logical_not()
    return self._alu(Ops.NEG)
  def maximum(self: Tensor, x: Any) -> Tensor:
    a, b = self._broadcasted(x)
    return a._alu(Ops.MAX, b)
  def minimum(self: Tensor, x: Any) -> Tensor:
    a, b = self._broadcasted(x)
    if a.dtype is dtypes.bool: return a & b
    # ints through ~ (order-reversing without overflow: -x wraps at the minimum int), floats through -x (NaN propagates)
    if dtypes.is_int(a.dtype): return ~((~a)._alu(Ops.MAX, ~b))
    return -((-a)._alu(Ops.MAX, -b))
  def where(self: Tensor, x: Any, y: Any) -> Tensor:
    if self.dtype is not dtypes.bool:
      raise DTypeError(f"where condition must be bool, got {self.dtype!r}; compare it first (e.g. t != 0)")
    if self.sharding is not None: return self.sharding.where(self, x, y)
    xs = x if isinstance(x, Tensor) else Tensor(_const_uop(x, dtypes.from_py(x), self.device))
    ys = y if isinstance(y, Tensor) else Tensor(_const_uop(y, dtypes.from_py(y), self.device))
    dt = least_upper_dtype(xs.dtype, ys.dtype)
    shp = broadcast_shape(self.shape, xs.shape, ys.shape)
    c, a, b = self._broadcast_to(shp), xs.cast(dt)._broadcast_to(shp), ys.cast(dt)._broadcast_to(shp)
    rg = a.requires_grad or b.requires_grad or None
    return Tensor(UOp(Ops.WHERE, dt, (c.uop, a.uop, b.uop)), requires_grad=rg)
  def _cmp(self: Tensor, op: Ops, x: Any, reverse: PyBool = False) -> Tensor:
    a, b = self._broadcasted(x, reverse)
    return a._alu(op, b)
  def __lt__(self: Tensor, x: Any) -> Tensor: return self._cmp(Ops.CMPLT, x)
  def __gt__(self: Tensor, x: Any) -> Tensor: return self._cmp(Ops.CMPLT, x, reverse=True)
  def _may_be_nan(self: Tensor, x: Any) -> PyBool:
    return dtypes.is_float(self.dtype) or isinstance(x, float) or (isinstance(x, Tensor) and dtypes.is_float(x.dtype))
  # `not (x > y)` is one compare, but True where either side is NaN: IEEE (and torch) say False there
  def __le__(self: Tensor, x: Any) -> Tensor:
    if not self._may_be_nan(x): return self._cmp(Ops.CMPLT, x, reverse=True).logical_not()
    return self._cmp(Ops.CMPLT, x) | self._cmp(Ops.CMPEQ, x)
  def __ge__(self: Tensor, x: Any) -> Tensor:
    if not self._may_be_nan(x): return self._cmp(Ops.CMPLT, x).logical_not()
    return self._cmp(Ops.CMPLT, x, reverse=True) | self._cmp(Ops.CMPEQ, x)
  def __eq__(self: Tensor, x: Any) -> Tensor: return self._cmp(Ops.CMPEQ, x)  # type: ignore[override]
  def __ne__(self: Tensor, x: Any) -> Tensor: return self._cmp(Ops.CMPNE, x)  # type: ignore[override]
  def logical_not(self: Tensor) -> Tensor:
    as_bool = self.cast(dtypes.bool)
    return as_bool._alu(Ops.CMPNE, Tensor(_const_uop(True, dtypes.bool, self.device))._broadcast_to(self.shape))
  def bitwise_and(self: Tensor, x: Any) -> Tensor: return _binop(Ops.AND, self, x)
  def bitwise_or(self: Tensor, x: Any) -> Tensor: return _binop(Ops.OR, self, x)
  def bitwise_xor(self: Tensor, x: Any) -> Tensor: return _binop(Ops.XOR, self, x)
  def lshift(self: Tensor, x: Any) -> Tensor: return _shift(Ops.SHL, self, x)
  def rshift(self: Tensor, x: Any) -> Tensor: return _shift(Ops.SHR, self, x)

  # ** torch's in-place methods: the result written into this tensor's memory (assign), returning it; refused where
  # the result's kind does not fit this dtype (as torch: `int_tensor.exp_()` would truncate) **
  def add_(self: Tensor, x: Any, *, alpha: Any = None) -> Tensor:
    return _in_place(self, self.add(x, alpha=alpha), 'add_')
  def sub_(self: Tensor, x: Any, *, alpha: Any = None) -> Tensor:
    return _in_place(self, self.sub(x, alpha=alpha), 'sub_')
  def mul_(self: Tensor, x: Any) -> Tensor: return _in_place(self, self.mul(x), 'mul_')
  def div_(self: Tensor, x: Any, *, rounding_mode: str | None = None) -> Tensor:
    return _in_place(self, self.div(x, rounding_mode=rounding_mode), 'div_')
  def pow_(self: Tensor, x: Any) -> Tensor: return _in_place(self, self.pow(x), 'pow_')
  def neg_(self: Tensor) -> Tensor: return _in_place(self, self.neg(), 'neg_')
  def abs_(self: Tensor) -> Tensor: return _in_place(self, self.abs(), 'abs_')
  def exp_(self: Tensor) -> Tensor: return _in_place(self, self.exp(), 'exp_')
  def log_(self: Tensor) -> Tensor: return _in_place(self, self.log(), 'log_')
  def sqrt_(self: Tensor) -> Tensor: return _in_place(self, self.sqrt(), 'sqrt_')
  def floor_(self: Tensor) -> Tensor: return _in_place(self, self.floor(), 'floor_')
  def ceil_(self: Tensor) -> Tensor: return _in_place(self, self.ceil(), 'ceil_')
  def round_(self: Tensor, decimals: PyInt = 0) -> Tensor: return _in_place(self, self.round(decimals), 'round_')
  def relu_(self: Tensor) -> Tensor: return _in_place(self, self.relu(), 'relu_')
  def sigmoid_(self: Tensor) -> Tensor: return _in_place(self, self.sigmoid(), 'sigmoid_')
  def tanh_(self: Tensor) -> Tensor: return _in_place(self, self.tanh(), 'tanh_')
  def clamp_(self: Tensor, min: Any = None, max: Any = None) -> Tensor:
    return _in_place(self, self.clamp(min, max), 'clamp_')
  def clip_(self: Tensor, min: Any = None, max: Any = None) -> Tensor:
    return _in_place(self, self.clip(min, max), 'clip_')
  def lerp_(self: Tensor, end: Any, weight: Any) -> Tensor: return _in_place(self, self.lerp(end, weight), 'lerp_')
  def masked_fill_(self: Tensor, mask: Tensor, value: Any) -> Tensor:
    """The value is cast to this dtype (masked_fill's), as torch does (1.5 into an int tensor fills 1)."""
    return _in_place(self, self.masked_fill(mask, value), 'masked_fill_')
  def copy_(self: Tensor, src: Any) -> Tensor:
    """Write `src` (broadcast to this shape, cast to this dtype) into this tensor."""
    value = src if isinstance(src, Tensor) else Tensor(src, device=self.device)
    return self.assign(value.to(self.device).cast(self.dtype)._broadcast_to(self.shape))


def _kind_rank(dt: DType) -> int:
  """bool < int < float: the order in which an in-place result may be written (a float into an int tensor may not)."""
  return 0 if dt is dtypes.bool else 1 if dtypes.is_int(dt) else 2

def _in_place(t: Tensor, result: Tensor, op: str) -> Tensor:
  """An in-place op: `result` written into t's buffer (assign), refused as torch refuses it where the result's kind
  (bool < int < float) does not fit t's dtype (`exp_` or `div_` of an int tensor would truncate, silently)."""
  if _kind_rank(strong_dtype(result.dtype)) > _kind_rank(strong_dtype(t.dtype)):
    raise DTypeError(f"{op}: the result's dtype {strong_dtype(result.dtype)!r} cannot be written into a {t.dtype!r} "
                     f"tensor in place; use the out-of-place {op.rstrip('_')}() (or cast the tensor first)")
  return t.assign(result)  # a result reading t elsewhere gets its own buffer first (the scheduler's assign rule)

def _refuse_zero_divisor(x: Any, reverse: bool, what: str) -> None:
  """IntegerDivisionByZeroError for an int division by a Python 0 (known without a sync; torch raises for it)."""
  if not reverse and isinstance(x, (int, bool)) and not x:
    raise IntegerDivisionByZeroError(f"integer {what} by zero; divide by a nonzero value (or cast to float: inf/nan)")
