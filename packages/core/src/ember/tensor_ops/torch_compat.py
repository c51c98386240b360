"""The torch.Tensor methods code ported from torch calls, composed from ember's own ops: aliases (`absolute`,
`arccos`, `greater` ...), elementwise math (`atan2`, `hypot`, `erfc`, `xlogy`, `gcd`, `frexp` ...), reductions
(`amax`, `nansum`, `median`, `quantile`, `mode`, `norm` ...), matrix products (`mm`, `bmm`, `addmm`, `kron` ...),
movement and indexing (`movedim`, `narrow`, `tensor_split`, `index_add`, `masked_scatter` ...), counting and search
(`bincount`, `histc`, `searchsorted`, `unique` ...), special functions (`lgamma`, `digamma`, `erfinv`), in-place
`op_` forms, and small linear algebra (`det`, `slogdet`, `inverse`,
`matrix_power`).

Everything stays lazy, except the few ops whose result's shape depends on the data (`unique`, `unique_consecutive`,
`argwhere`, `bincount`): those read the tensor on the host, and refuse inside a TinyJit capture or an ember.function
trace. Indices (and counts) are int32, as everywhere in ember; docs/torch-compat.md lists this and every other place
where ember differs from torch.
"""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence
import numpy as np
from ember.dtype import DType, dtypes, least_upper_float, narrow_float, strong_dtype
from ember.errors import (ArgumentError, AxisError, DTypeError, DTypeNotImplementedError, EmptyReductionError,
                          IndexingError, ShapeError)
from ember.tensor_index import check_index_range, data_checks_run
from ember.tensor_ops.elementwise import _in_place as _write
from ember.tensor_ops.reduce import ValuesIndices
from ember.uop.ops import int_size

if TYPE_CHECKING:
  from ember.tensor import Tensor

_QUANTILE_MODES = ("linear", "lower", "higher", "midpoint", "nearest")
# Lanczos approximation of the gamma function, g = 7, 9 terms (relative error ~1e-15)
_LANCZOS_G = 7
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059,
            12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7)
# erfinv: Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision, Horner order
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                   -0.00417768164, 0.246640727, 1.50140941)
# modified Bessel functions I0, I1: Abramowitz-Stegun 9.8.1-9.8.4 (relative error below 2.2e-7), Horner order
_I0_SMALL = (0.0045813, 0.0360768, 0.2659732, 1.2067492, 3.0899424, 3.5156229, 1.0)
_I0_LARGE = (0.00392377, -0.01647633, 0.02635537, -0.02057706, 0.00916281, -0.00157565, 0.00225319, 0.01328592,
             0.39894228)
_I1_SMALL = (0.00032411, 0.00301532, 0.02658733, 0.15084934, 0.51498869, 0.87890594, 0.5)
_I1_LARGE = (-0.00420059, 0.01787654, -0.02895312, 0.02282967, -0.01031555, 0.00163801, -0.00362018, -0.03988024,
             0.39894228)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                0.00943887047, 1.00167406, 2.83297682)

# the named tuples torch returns (plain tuples unpack the same way)
class MinMax(NamedTuple):
  min: Tensor
  max: Tensor

class Frexp(NamedTuple):
  mantissa: Tensor
  exponent: Tensor

class Histogram(NamedTuple):
  hist: Tensor
  bin_edges: Tensor

class SignLogAbsDet(NamedTuple):
  sign: Tensor
  logabsdet: Tensor

def _new(data: Any, like: Tensor, dtype: DType | None = None) -> Tensor:
  from ember.tensor import Tensor
  return Tensor(data, device=like.device, dtype=dtype)

def _need_float(t: Tensor, op: str, error: type[DTypeError] = DTypeError) -> None:
  """`error`: DTypeNotImplementedError where torch has no kernel for the dtype (NotImplementedError there)."""
  if not dtypes.is_float(t.dtype):
    raise error(f"{op} needs a float tensor, got {t.dtype!r}; cast it first (e.g. .float())")

def _need_int(t: Tensor, op: str, error: type[DTypeError] = DTypeError) -> None:
  if not dtypes.is_int(t.dtype):
    raise error(f"{op} needs an int tensor, got {t.dtype!r}; cast it first (e.g. .int())")

def _need_dims(t: Tensor, op: str) -> None:
  if t.ndim == 0: raise AxisError(f"{op} needs a tensor of at least 1 dim, got a 0-d one")

def _host_read(op: str, alternative: str) -> None:
  """Ops whose result's shape depends on the values read them on the host: not while TinyJit captures (a replay
  would reuse the shape read now) nor while an ember.function traces (its inputs are stand-ins then)."""
  if not data_checks_run():
    raise ShapeError(f"{op}'s result has a shape that depends on the tensor's values, which cannot be read inside a "
                     f"TinyJit capture or an ember.function trace; {alternative}")

def _wide(*ts: Tensor) -> tuple[list[Tensor], DType]:
  """`ts` (of one dtype) as the floats to compute in, and the result's float dtype: half types compute in float32, as
  torch's kernels do (rounding each step to half lost up to several ulps); cast the result back to the dtype."""
  dt = least_upper_float(ts[0].dtype)
  compute = dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt
  return [t.cast(compute) for t in ts], dt

def _with_grad(value: Tensor, x: Tensor, dydx: Tensor) -> Tensor:
  """`value`, whose derivative with respect to `x` is `dydx` (for values computed by bit tricks or fitted formulas,
  whose own derivative is not the function's). Where x or the derivative is not finite there is no gradient."""
  lin = x.isfinite().where(x, 0) * dydx.detach()
  # where lin is not finite (an infinite derivative: lgamma at 0) the value stays as it is, with no gradient
  return value.detach() + lin.isfinite().detach().where(lin - lin.detach(), 0)

def _finite_max(dt: DType) -> float:
  if dt is dtypes.fp8e4m3: return 448.0
  exp_bits, man_bits = dtypes.finfo(dt)
  return (2 - 2.0 ** -man_bits) * 2.0 ** (2 ** (exp_bits - 1) - 1)

def _dims(t: Tensor, dim: Any) -> tuple[int, ...]:
  """The resolved dims of an int, a sequence, or None / () (all of them, as torch's amax/amin/norm read it)."""
  if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0): return tuple(range(t.ndim))
  return t._reduce_axes(dim)

def _last(t: Tensor, d: int) -> Tensor:
  """`t` with dim `d` moved to the end."""
  return t.permute([i for i in range(t.ndim) if i != d] + [d])

def _from_last(t: Tensor, d: int) -> Tensor:
  """Undo `_last`: the last dim goes back to position `d`."""
  order = list(range(t.ndim - 1))
  order.insert(d, t.ndim - 1)
  return t.permute(order)

def _sections(n: int, spec: Any, op: str) -> list[tuple[int, int]]:
  """The (start, stop) pieces torch.tensor_split makes of a dim of size `n`: an int is a number of sections (the first
  n % k one longer), a sequence the indices to split before (Python slice bounds)."""
  if isinstance(spec, (int, np.integer)):
    k = int(spec)
    if k <= 0: raise ShapeError(f"{op} needs a number of sections > 0, got {k}")
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    return [(sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(k)]
  bounds = [int(i) for i in spec]
  out, prev = [], 0
  for b in [*bounds, n]:
    start, stop, _ = slice(prev, b).indices(n)
    out.append((start, max(start, stop)))
    prev = b
  return out

def _matrix_dims(t: Tensor, op: str) -> int:
  if t.ndim < 2 or t.shape[-1] != t.shape[-2]:
    raise ShapeError(f"{op} needs square matrices in the last two dims, got shape {t.shape}")
  return int_size(t.shape[-1], op)

def _eliminate(a: Tensor, b: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
  """Gauss-Jordan elimination with partial pivoting of the (..., n, n) matrices `a`, applying the same row operations
  to the (..., n, m) `b`. Returns the pivots (..., n), the permutation's sign (...), whether a pivot was 0 (...), and b
  transformed (a^-1 b where a is invertible). A zero pivot is replaced by 1 so the steps after it stay finite. (a and
  b stay two tensors: one [a | b] tensor made the CPU renderers' upcast backward kernels fail to compile.)"""
  from ember.tensor import Tensor
  n = int_size(a.shape[-1], "elimination")
  rows = Tensor.arange(n, device=a.device, dtype=dtypes.int32)
  sign = a[..., 0, 0].full_like(1.0).detach()
  singular = a[..., 0, 0].full_like(False, dtype=dtypes.bool)
  mats = [a] if b is None else [a, b.cast(a.dtype)]
  pivots = []
  for k in range(n):
    pick = (rows >= k).where(mats[0][..., :, k].detach().abs(), -1).argmax(-1)  # the largest candidate at/below row k
    is_p = (rows == pick.unsqueeze(-1)).unsqueeze(-1)  # (..., n, 1)
    is_k = (rows == k).unsqueeze(-1)
    # rows k and pick swapped; selecting by where keeps inf/NaN of one row out of the others
    picked = [is_p.where(m, 0).sum(-2) for m in mats]
    mats = [is_k.where(p.unsqueeze(-2), is_p.where(m[..., k, :].unsqueeze(-2), m)) for m, p in zip(mats, picked)]
    sign = (pick != k).where(-sign, sign)
    piv = picked[0][..., k]
    zero = piv == 0
    singular = singular | zero
    pivots.append(piv)
    factor = is_k.squeeze(-1).where(0, mats[0][..., :, k]).unsqueeze(-1)  # (..., n, 1), 0 on row k
    units = [p / zero.where(1, piv).unsqueeze(-1) for p in picked]
    mats = [is_k.where(u.unsqueeze(-2), m - factor * u.unsqueeze(-2)).contiguous() for m, u in zip(mats, units)]
  return Tensor.stack(*pivots, dim=-1), sign, singular, (mats[1] if b is not None else None)

class TorchCompatMixin:
  """Mixin holding the torch.Tensor methods of this module (see the module docstring)."""
  __slots__ = ()

  # ** aliases **
  def absolute(self: Tensor) -> Tensor:
    """Alias of `abs` (torch.Tensor.absolute)."""
    return self.abs()
  def arccos(self: Tensor) -> Tensor:
    """Alias of `acos`."""
    return self.acos()
  def arcsin(self: Tensor) -> Tensor:
    """Alias of `asin`."""
    return self.asin()
  def arctan(self: Tensor) -> Tensor:
    """Alias of `atan`."""
    return self.atan()
  def arccosh(self: Tensor) -> Tensor:
    """Alias of `acosh`."""
    return self.acosh()
  def arcsinh(self: Tensor) -> Tensor:
    """Alias of `asinh`."""
    return self.asinh()
  def arctanh(self: Tensor) -> Tensor:
    """Alias of `atanh`."""
    return self.atanh()
  def arctan2(self: Tensor, other: Any) -> Tensor:
    """Alias of `atan2`."""
    return self.atan2(other)
  def greater(self: Tensor, other: Any) -> Tensor:
    """Alias of `gt`."""
    return self > other
  def greater_equal(self: Tensor, other: Any) -> Tensor:
    """Alias of `ge` (False where either side is NaN)."""
    return self.ge(other)
  def less(self: Tensor, other: Any) -> Tensor:
    """Alias of `lt`."""
    return self < other
  def less_equal(self: Tensor, other: Any) -> Tensor:
    """Alias of `le` (False where either side is NaN)."""
    return self.le(other)
  def not_equal(self: Tensor, other: Any) -> Tensor:
    """Alias of `ne`."""
    return self != other
  def multiply(self: Tensor, other: Any) -> Tensor:
    """Alias of `mul`."""
    return self.mul(other)
  def subtract(self: Tensor, other: Any, *, alpha: Any = 1) -> Tensor:
    """self - alpha * other (torch.Tensor.subtract).

    >>> Tensor([5, 5]).subtract(Tensor([1, 2]), alpha=2).tolist()
    [3, 1]
    """
    return self.sub(other if alpha == 1 else other * alpha)
  def divide(self: Tensor, other: Any, *, rounding_mode: str | None = None) -> Tensor:
    """Alias of `div`, with its `rounding_mode` (None, "trunc" or "floor")."""
    return self.div(other, rounding_mode=rounding_mode)
  def true_divide(self: Tensor, other: Any) -> Tensor:
    """True division, always a float result (torch.Tensor.true_divide)."""
    return self.div(other)
  def floor_divide(self: Tensor, other: Any) -> Tensor:
    """The quotient rounded down, Python's // (torch.Tensor.floor_divide).

    >>> Tensor([7, -7]).floor_divide(2).tolist()
    [3, -4]
    """
    return self.div(other, rounding_mode="floor")
  def remainder(self: Tensor, other: Any) -> Tensor:
    """Python's %: the result takes the divisor's sign (torch.Tensor.remainder; `fmod` takes the dividend's).

    >>> Tensor([-3, 3]).remainder(2).tolist()
    [1, 1]
    """
    return self.mod(other)
  def negative(self: Tensor) -> Tensor:
    """-self; a bool tensor raises as in torch (use logical_not)."""
    if self.dtype is dtypes.bool: raise DTypeError("negative of a bool tensor is not supported; use logical_not()")
    return -self
  def positive(self: Tensor) -> Tensor:
    """self; a bool tensor raises as in torch."""
    if self.dtype is dtypes.bool: raise DTypeError("positive of a bool tensor is not supported, as in torch")
    return self
  def fix(self: Tensor) -> Tensor:
    """Alias of `trunc`: round toward zero."""
    return self.trunc()
  def sgn(self: Tensor) -> Tensor:
    """The sign, as `sign` (ember has no complex dtypes, where torch's sgn differs)."""
    return self.sign()
  def clamp_min(self: Tensor, min: Any) -> Tensor:
    """clamp(min=min)."""
    return self.clip(min=min)
  def clamp_max(self: Tensor, max: Any) -> Tensor:
    """clamp(max=max)."""
    return self.clip(max=max)
  def swapaxes(self: Tensor, axis0: int, axis1: int) -> Tensor:
    """Alias of `transpose(axis0, axis1)`."""
    return self.transpose(axis0, axis1)
  def swapdims(self: Tensor, dim0: int, dim1: int) -> Tensor:
    """Alias of `transpose(dim0, dim1)`."""
    return self.transpose(dim0, dim1)
  def t(self: Tensor) -> Tensor:
    """The transpose of a matrix; 0-d and 1-d tensors come back as they are (torch.Tensor.t).

    >>> Tensor([[1, 2]]).t().tolist()
    [[1], [2]]
    """
    if self.ndim > 2: raise ShapeError(f"t() needs a tensor of at most 2 dims, got shape {self.shape}; use transpose")
    return self if self.ndim < 2 else self.transpose(0, 1)
  def ravel(self: Tensor) -> Tensor:
    """The elements as a 1-d tensor."""
    return self.flatten()
  def reshape_as(self: Tensor, other: Tensor) -> Tensor:
    """reshape to other's shape."""
    return self.reshape(other.shape)
  def view_as(self: Tensor, other: Tensor) -> Tensor:
    """view with other's shape."""
    return self.reshape(other.shape)
  def expand_as(self: Tensor, other: Tensor) -> Tensor:
    """expand to other's shape."""
    return self.expand(other.shape)
  def broadcast_to(self: Tensor, shape: Any) -> Tensor:
    """expand to `shape` (-1 keeps a dim)."""
    return self.expand(shape)
  def type_as(self: Tensor, other: Tensor) -> Tensor:
    """cast to other's dtype."""
    return self.cast(other.dtype)
  def moveaxis(self: Tensor, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
    """Alias of `movedim`."""
    return self.movedim(source, destination)
  def msort(self: Tensor) -> Tensor:
    """The values sorted along dim 0 (torch.msort)."""
    return self.sort(0)[0]
  def argwhere(self: Tensor) -> Tensor:
    """The indices of the nonzero elements, (count, ndim), as `nonzero` (int32; this reads the count on the host)."""
    _host_read("argwhere", "use nonzero(size=...) for a fixed number of rows")
    return self.nonzero()

  # ** elementwise math **
  def addcmul(self: Tensor, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
    """self + value * tensor1 * tensor2.

    >>> Tensor([1.0]).addcmul(Tensor([2.0]), Tensor([3.0]), value=0.5).tolist()
    [4.0]
    """
    return self + value * tensor1 * tensor2
  def addcdiv(self: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: Any = 1) -> Tensor:
    """self + value * tensor1 / tensor2 (true division; two int operands raise, as in torch).

    >>> Tensor([1.0]).addcdiv(Tensor([3.0]), Tensor([2.0]), value=2).tolist()
    [4.0]
    """
    if not dtypes.is_float(tensor1.dtype) and not dtypes.is_float(tensor2.dtype):
      raise DTypeError(f"addcdiv of int tensors ({tensor1.dtype!r} / {tensor2.dtype!r}) is not supported, as in torch; "
                       "use (tensor1 // tensor2) for integer division, or cast to float")
    return self + value * (tensor1 / tensor2)
  def atan2(self: Tensor, other: Any) -> Tensor:
    """The angle of the point (other, self) in (-pi, pi], with C's rules for zeros (their signs) and infinities.

    >>> round(Tensor([1.0]).atan2(Tensor([-1.0])).item(), 5)
    2.35619
    """
    y, x = self._broadcasted(other)
    (y, x), dt = _wide(y, x)
    neg_y, neg_x = y._signbit(), x._signbit()
    ay, ax = neg_y.where(-y, y), neg_x.where(-x, x)  # |y|, |x| with gradient +-1 also at 0
    both_inf = ay.isinf() & ax.isinf()
    steep = ay > ax
    num, den = steep.where(ax, ay), steep.where(ay, ax)  # num <= den
    safe = (den == 0) | both_inf
    ratio = safe.where(both_inf.where(1, 0), num / safe.where(1, den))
    r = ratio.atan()
    r = steep.where(math.pi / 2 - r, r)
    r = neg_x.where(math.pi - r, r)
    r = neg_y.where(-r, r)
    return (y.isnan() | x.isnan()).where(math.nan, r).cast(dt)
  def hypot(self: Tensor, other: Any) -> Tensor:
    """sqrt(self^2 + other^2) without overflow or underflow in the squares (inf if either is infinite).

    >>> Tensor([3.0]).hypot(Tensor([4.0])).tolist()
    [5.0]
    """
    a, b = self._broadcasted(other)
    (a, b), dt = _wide(a, b)
    big = a.detach().abs().maximum(b.detach().abs())
    scale = ((big == 0) | big.isinf()).where(1, big)
    r = ((a / scale).square() + (b / scale).square()).sqrt() * scale
    return (a.isinf() | b.isinf()).where(math.inf, r).cast(dt)
  def logaddexp2(self: Tensor, other: Any) -> Tensor:
    """log2(2^self + 2^other) without overflow.

    >>> Tensor([3.0]).logaddexp2(Tensor([3.0])).tolist()
    [4.0]
    """
    a, b = self._broadcasted(other)
    (a, b), dt = _wide(a, b)
    return ((a * math.log(2)).logaddexp(b * math.log(2)) * (1 / math.log(2))).cast(dt)
  def xlogy(self: Tensor, other: Any) -> Tensor:
    """self * log(other), 0 where self is 0 (unless other is NaN).

    >>> Tensor([0.0, 2.0]).xlogy(Tensor([0.0, 1.0])).tolist()
    [0.0, 0.0]
    """
    x, y = self._broadcasted(other)
    x, y = x._float(), y._float()  # half types in half, rounding as torch's kernel does
    zero = (x == 0) & y.isnan().logical_not()
    return zero.where(0, x * zero.where(1, y).log())
  def sinc(self: Tensor) -> Tensor:
    """sin(pi x) / (pi x), 1 at 0 (the normalized sinc).

    >>> Tensor([0.0, 0.5]).sinc().tolist()[0]
    1.0
    """
    (x,), dt = _wide(self)
    zero = x == 0
    px = zero.where(1, x) * math.pi
    return zero.where(1, px.sin() / px).cast(dt)
  def erfc(self: Tensor) -> Tensor:
    """1 - erf(x), with relative accuracy in the tail (1 - erf(x) is 0 in float32 past x = 4): Numerical Recipes'
    Chebyshev fit of exp(x^2) erfc(x) (relative error below 1.2e-7). The gradient is -2/sqrt(pi) exp(-x^2).

    >>> f"{Tensor([5.0]).erfc().item():.4e}"
    '1.5375e-12'
    """
    if self.dtype in (dtypes.float16, dtypes.bfloat16): return self.float().erfc().cast(self.dtype)
    x = self._float()
    z = x.abs()
    t = 1 / (z * 0.5 + 1)
    coef = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
            -0.82215223, 0.17087277)
    poly: Any = coef[-1]
    for c in reversed(coef[:-1]): poly = poly * t + c
    tail = t * (poly - z * z).exp()
    value = (x < 0).where(2 - tail, tail)
    return _with_grad(value, x, (-x * x).exp() * (-2 / math.sqrt(math.pi)))
  def logit(self: Tensor, eps: float | None = None) -> Tensor:
    """log(x / (1 - x)); with `eps`, x is clamped to [eps, 1 - eps] first (torch.logit).

    >>> round(Tensor([0.75]).logit().item(), 5)
    1.09861
    """
    x = self._float()  # half types in half, rounding as torch's kernel does
    if eps is not None: x = x.clip(eps, 1 - eps)
    return (x / (1 - x)).log()
  def deg2rad(self: Tensor) -> Tensor:
    """Degrees to radians (a float result for int input)."""
    return self._float() * (math.pi / 180)
  def rad2deg(self: Tensor) -> Tensor:
    """Radians to degrees (a float result for int input)."""
    return self._float() * (180 / math.pi)
  def float_power(self: Tensor, exponent: Any) -> Tensor:
    """self ** exponent computed in float64, as torch.float_power (the result is float64).

    >>> Tensor([2]).float_power(3).tolist()
    [8.0]
    """
    e = exponent.cast(dtypes.float64) if hasattr(exponent, "uop") else float(exponent)
    return self.cast(dtypes.float64).pow(e)
  def frac(self: Tensor) -> Tensor:
    """The fractional part, x - trunc(x), with x's sign (float tensors only, as in torch).

    >>> Tensor([1.5, -2.25]).frac().tolist()
    [0.5, -0.25]
    """
    _need_float(self, "frac", DTypeNotImplementedError)
    return self - self.trunc()
  def fmax(self: Tensor, other: Any) -> Tensor:
    """Elementwise maximum that ignores NaN: NaN only where both are NaN (torch.fmax).

    >>> Tensor([1.0, float("nan")]).fmax(Tensor([float("nan"), 2.0])).tolist()
    [1.0, 2.0]
    """
    a, b = self._broadcasted(other)
    if not dtypes.is_float(a.dtype): return a.maximum(b)
    return ((a >= b) | b.isnan()).where(a, b)
  def fmin(self: Tensor, other: Any) -> Tensor:
    """Elementwise minimum that ignores NaN: NaN only where both are NaN (torch.fmin)."""
    a, b = self._broadcasted(other)
    if not dtypes.is_float(a.dtype): return a.minimum(b)
    return ((a <= b) | b.isnan()).where(a, b)
  def heaviside(self: Tensor, values: Any) -> Tensor:
    """0 where self < 0, `values` where self == 0, 1 where self > 0 (NaN gives 0, as in torch); the dtypes must match.

    >>> Tensor([-1.0, 0.0, 2.0]).heaviside(Tensor([0.5])).tolist()
    [0.0, 0.5, 1.0]
    """
    v = values if hasattr(values, "uop") else _new(values, self, self.dtype)
    if strong_dtype(v.dtype) is not strong_dtype(self.dtype):
      raise DTypeError(f"heaviside needs values of self's dtype {self.dtype!r}, got {v.dtype!r}; cast one of them")
    x = self.detach()
    return (x == 0).where(v.detach(), (x > 0).cast(self.dtype)).cast(self.dtype)
  def hardshrink(self: Tensor, lambd: float = 0.5) -> Tensor:
    """x where |x| > lambd, else 0 (NaN stays NaN).

    >>> Tensor([-1.0, 0.2, 0.7]).hardshrink().tolist()
    [-1.0, 0.0, 0.7]
    """
    _need_float(self, "hardshrink", DTypeNotImplementedError)
    return ((self >= -lambd) & (self <= lambd)).where(0, self)
  def nan_to_num(self: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """NaN -> `nan`, +inf -> `posinf`, -inf -> `neginf` (default: the dtype's largest and lowest finite values).

    >>> Tensor([float("nan"), 1.0]).nan_to_num(nan=-1.0).tolist()
    [-1.0, 1.0]
    """
    if not dtypes.is_float(self.dtype): return self
    top = _finite_max(strong_dtype(self.dtype))
    x = self.isnan().where(nan, self)
    x = (self == math.inf).where(top if posinf is None else posinf, x)
    return (self == -math.inf).where(-top if neginf is None else neginf, x).cast(self.dtype)
  def signbit(self: Tensor) -> Tensor:
    """True where the sign bit is set: negative values, -0.0 and NaNs with the sign bit.

    >>> Tensor([-0.0, 0.0, -2.0]).signbit().tolist()
    [True, False, True]
    """
    return self._signbit()
  def isposinf(self: Tensor) -> Tensor:
    """True at +inf."""
    return self.isinf(detect_negative=False)
  def isneginf(self: Tensor) -> Tensor:
    """True at -inf."""
    return self.isinf(detect_positive=False)
  def isreal(self: Tensor) -> Tensor:
    """True everywhere: ember has no complex dtypes."""
    return self.full_like(True, dtype=dtypes.bool)
  def ldexp(self: Tensor, other: Any) -> Tensor:
    """self * 2 ** other, a float result.

    >>> Tensor([1.5]).ldexp(Tensor([3])).tolist()
    [12.0]
    """
    a, e = self._broadcasted(other)
    return a._float() * e._float().exp2()
  def frexp(self: Tensor) -> Frexp:
    """(mantissa, exponent) with self == mantissa * 2 ** exponent, |mantissa| in [0.5, 1) and an int32 exponent;
    0, inf and NaN give (self, 0). Read from the bits, so exact (subnormals included).

    >>> [t.tolist() for t in Tensor([8.0, -0.375]).frexp()]
    [[0.5, -0.75], [4, -1]]
    """
    _need_float(self, "frexp")
    if self.dtype is not dtypes.float64 and self.dtype is not dtypes.float32:
      m, e = self.float().frexp()
      return Frexp(m.cast(self.dtype), e)
    wide = self.dtype is dtypes.float64
    ibits, man, bias, tiny = (dtypes.int64, 52, 1022, 2.0 ** -1022) if wide else (dtypes.int32, 23, 126, 2.0 ** -126)
    emask = 0x7FF if wide else 0xFF
    x = self
    sub = x.abs() < tiny  # subnormals (and 0) scaled into the normal range first, exactly
    xs = sub.where(x * 2.0 ** (man + 1), x)
    bits = xs.detach().bitcast(ibits)
    e_xs = ((bits >> man) & emask) - bias  # the exponent of xs
    mant = ((bits & ~(emask << man)) | (bias << man)).bitcast(self.dtype)
    special = (x == 0) | x.isinf() | x.isnan()
    e = special.where(0, e_xs - sub.where(man + 1, 0).cast(ibits)).cast(dtypes.int32)
    # d mantissa / dx = 2^-exponent, through xs: 2^-e_xs stays finite where 2^-exponent of a subnormal overflows
    return Frexp(special.where(x, _with_grad(mant, xs, (-e_xs.cast(self.dtype)).exp2())), e)
  def bitwise_left_shift(self: Tensor, other: Any) -> Tensor:
    """self << other (torch.Tensor.bitwise_left_shift)."""
    return self.lshift(other)
  def bitwise_right_shift(self: Tensor, other: Any) -> Tensor:
    """self >> other, arithmetic for signed ints (torch.Tensor.bitwise_right_shift)."""
    return self.rshift(other)
  def nextafter(self: Tensor, other: Any) -> Tensor:
    """The next float after self toward other (other where they are equal, NaN if either is NaN), read from the bits.

    >>> Tensor([1.0]).nextafter(Tensor([2.0])).item() > 1.0
    True
    """
    a, b = self._broadcasted(other)
    _need_float(a, "nextafter")
    dt = strong_dtype(a.dtype)
    ibits = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[dt.itemsize]
    a, b = a.cast(dt).detach(), b.cast(dt).detach()
    bits = a.bitcast(ibits)
    # away from zero is +1 on the magnitude's bits, toward zero -1; from +-0 the smallest subnormal with b's sign
    away = (b > a) == (a > 0)
    step = bits + away.where(1, -1).cast(ibits)
    tiny = _new(1, a, ibits).bitcast(dt)
    out = (a == 0).where(b._signbit().where(-tiny, tiny), step.bitcast(dt))
    return (a.isnan() | b.isnan()).where(math.nan, (a == b).where(b, out))
  def sum_to_size(self: Tensor, *size: Any) -> Tensor:
    """Sum over the dims that broadcast `size` to this shape (the reverse of expand): the result has shape `size`.

    >>> Tensor([[1, 2], [3, 4]]).sum_to_size(1, 2).tolist()
    [[4, 6]]
    """
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
    lead = self.ndim - len(shape)
    if lead < 0 or any(s not in (1, t) for s, t in zip(shape, self.shape[lead:])):
      raise ShapeError(f"sum_to_size: size {shape} is not expandable to shape {self.shape}")
    axes = tuple(range(lead)) + tuple(lead + i for i, (s, t) in enumerate(zip(shape, self.shape[lead:])) if s == 1 != t)
    return self.sum(axes, keepdim=True).reshape(shape) if axes else self
  def lgamma(self: Tensor) -> Tensor:
    """log|gamma(x)|: the Lanczos approximation for x >= 0.5, the reflection formula below (inf at 0 and the negative
    integers). The gradient is digamma(x).

    >>> round(Tensor([5.0]).lgamma().item(), 5)
    3.17805
    """
    (x,), dt = _wide(self)
    neg = x < 0.5
    z = neg.where(1 - x, x) - 1  # >= -0.5: the Lanczos series for gamma(z + 1)
    series: Any = _LANCZOS[0]
    for i, c in enumerate(_LANCZOS[1:], start=1): series = series + c / (z + i)
    t = z + (_LANCZOS_G + 0.5)
    pos = (0.5 * math.log(2 * math.pi)) + (z + 0.5) * t.log() - t + series.log()
    sin = _sin_pi(x.detach()).abs()  # the reflection's |sin(pi x)|
    out = neg.where((math.pi / sin).log() - pos, pos)
    out = (neg & (x == x.floor())).where(math.inf, out)  # 0 and the negative integers (poles)
    out = x.isinf().where(math.inf, out)
    return _with_grad(out, x, x.digamma()).cast(dt)
  def digamma(self: Tensor) -> Tensor:
    """The logarithmic derivative of gamma: the recurrence psi(x) = psi(x + 1) - 1/x up to x >= 6, then the asymptotic
    series; the reflection formula below 0.5. -inf at 0 and NaN at the negative integers, as torch. The gradient is
    the trigamma function.

    >>> round(Tensor([1.0]).digamma().item(), 5)
    -0.57722
    """
    (x,), dt = _wide(self)
    neg = x < 0.5
    y = neg.where(1 - x, x)
    psi = _psi_shifted(y)
    refl = psi - math.pi * _cos_pi(x.detach()) / _sin_pi(x.detach())
    out = neg.where(refl, psi)
    out = (x == 0).where(-math.inf, ((x < 0) & (x == x.floor())).where(math.nan, out))
    out = (x == math.inf).where(math.inf, out)
    return _with_grad(out, x, _trigamma(x)).cast(dt)
  def erfinv(self: Tensor) -> Tensor:
    """The inverse of erf on (-1, 1) (+-inf at +-1, NaN outside): Giles' single-precision polynomials in
    w = -log(1 - x^2), accurate to a few float32 ulps. The gradient is sqrt(pi) / 2 * exp(erfinv(x)^2).

    >>> round(Tensor([0.5]).erfinv().item(), 5)
    0.47694
    """
    (x,), dt = _wide(self)
    w = -((1 - x) * (1 + x)).log()
    central = w < 5
    wc = central.where(w, 5) - 2.5
    wt = central.where(5, w).sqrt() - 3  # each branch sees only its own inputs
    pc: Any = _ERFINV_CENTRAL[0]
    for c in _ERFINV_CENTRAL[1:]: pc = pc * wc + c
    pt: Any = _ERFINV_TAIL[0]
    for c in _ERFINV_TAIL[1:]: pt = pt * wt + c
    out = central.where(pc, pt) * x
    out = (x.abs() == 1).where(x * math.inf, (x.abs() > 1).where(math.nan, out))
    return _with_grad(out, x, (out.detach().square()).exp() * (math.sqrt(math.pi) / 2)).cast(dt)
  def i0(self: Tensor) -> Tensor:
    """The modified Bessel function of the first kind, order 0 (Abramowitz-Stegun 9.8.1-2: relative error below
    5e-7, also in float64; in float32 exp's rounding at large |x| makes it 5e-6). The gradient is i1(x).

    >>> round(Tensor([1.0]).i0().item(), 5)
    1.26607
    """
    (x,), dt = _wide(self)
    value = _bessel(x, _I0_SMALL, _I0_LARGE, odd=False)
    return _with_grad(value, x, _bessel(x, _I1_SMALL, _I1_LARGE, odd=True)).cast(dt)
  def gcd(self: Tensor, other: Any) -> Tensor:
    """Greatest common divisor of int tensors, non-negative; gcd(0, 0) is 0 (Euclid's algorithm, unrolled for the
    dtype's worst case).

    >>> Tensor([12, -4, 0]).gcd(Tensor([18, 6, 5])).tolist()
    [6, 2, 5]
    """
    a, b = self._broadcasted(other)
    _need_int(a, "gcd", DTypeNotImplementedError)
    a, b = a.abs(), b.abs()
    for _ in range(int(1.45 * a.dtype.itemsize * 8) + 2):
      nz = b != 0
      a, b = nz.where(b, a), nz.where(a.fmod(nz.where(b, 1)), 0)
    return a
  def lcm(self: Tensor, other: Any) -> Tensor:
    """Least common multiple of int tensors, non-negative; 0 if either is 0.

    >>> Tensor([4, 6]).lcm(Tensor([6, 0])).tolist()
    [12, 0]
    """
    a, b = self._broadcasted(other)
    g = a.gcd(b)
    return (g == 0).where(0, (a.div(g.maximum(1), rounding_mode="trunc") * b).abs())

  # ** reductions **
  def amax(self: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    """The maximum over `dim` (an int or a tuple; () or None: every dim). NaN propagates; the gradient is shared
    evenly between tied maxima.

    >>> Tensor([[1, 5], [7, 2]]).amax(1).tolist()
    [5, 7]
    """
    return self.max(_dims(self, dim), keepdim)
  def amin(self: Tensor, dim: Any = (), keepdim: bool = False) -> Tensor:
    """The minimum over `dim` (an int or a tuple; () or None: every dim)."""
    return self.min(_dims(self, dim), keepdim)
  def aminmax(self: Tensor, *, dim: int | None = None, keepdim: bool = False) -> MinMax:
    """(min, max) over `dim` (every element when None).

    >>> [t.item() for t in Tensor([3, 1, 2]).aminmax()]
    [1, 3]
    """
    return MinMax(self.min(dim, keepdim), self.max(dim, keepdim))
  def count_nonzero(self: Tensor, dim: Any = None) -> Tensor:
    """How many elements are nonzero over `dim` (every dim when None), as int32 (torch: int64).

    >>> Tensor([[0, 1], [2, 3]]).count_nonzero(0).tolist()
    [1, 2]
    """
    return (self != 0).sum(dim, dtype=dtypes.int32)
  def nansum(self: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: DType | None = None) -> Tensor:
    """The sum with NaNs counted as zero.

    >>> Tensor([1.0, float("nan"), 2.0]).nansum().item()
    3.0
    """
    x = self.isnan().where(0, self) if dtypes.is_float(self.dtype) else self
    return x.sum(dim, keepdim, dtype=dtype)
  def nanmean(self: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: DType | None = None) -> Tensor:
    """The mean of the non-NaN elements (NaN where there are none).

    >>> Tensor([1.0, float("nan"), 2.0]).nanmean().item()
    1.5
    """
    _need_float(self, "nanmean")
    x = self.cast(dtype) if dtype is not None else self
    keep = x.isnan().logical_not()
    return x.nansum(dim, keepdim) / keep.sum(dim, keepdim, dtype=x.dtype)
  def _select_sorted(self: Tensor, dim: int | None, keepdim: bool, op: str,
                     position: Any) -> tuple[Tensor, Tensor]:
    """Sort along `dim` (the flattened tensor when None) and pick, per row, the element at `position(n, nan_count)`
    (an int for every row, or an int tensor of shape (..., 1)): (values, int32 indices)."""
    from ember.tensor import Tensor
    x = self.flatten() if dim is None else self
    d = x._resolve_dim(dim if dim is not None else 0) if x.ndim else 0
    if x.ndim == 0: x, d = x.reshape(1), 0
    n = int_size(x.shape[d], op)
    if n == 0: raise EmptyReductionError(f"{op}() of shape {self.shape} along dim {dim} has no elements to select; "
                                         "pass a non-empty dim")
    row = _last(x, d)
    vals, idx = row.sort(-1)
    nan_count = row.isnan().sum(-1, keepdim=True, dtype=dtypes.int32) if dtypes.is_float(row.dtype) else None
    k = position(n, nan_count)
    k = Tensor.full((*row.shape[:-1], 1), k, dtype=dtypes.int32, device=self.device) if isinstance(k, int) \
      else k.cast(dtypes.int32)
    v, i = vals._gather(vals.ndim - 1, k), idx._gather(idx.ndim - 1, k)
    if dim is None or self.ndim == 0: return v.reshape(()), i.reshape(())
    if not keepdim: return v.squeeze(-1), i.squeeze(-1)
    return _from_last(v, d), _from_last(i, d)
  def median(self: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """The lower median (the ((n - 1) // 2)-th smallest; NaN if the row has a NaN). With `dim`, a named tuple
    (values, indices), the indices int32; without, the median of every element as one value.

    >>> Tensor([3, 1, 4, 2]).median().item()
    2
    """
    def position(n: int, nan_count: Tensor | None) -> Any:
      # with NaNs, the first NaN: they sort after every number, from position n - nan_count
      return (n - 1) // 2 if nan_count is None else (nan_count > 0).where(n - nan_count, (n - 1) // 2)
    v, i = self._select_sorted(dim, keepdim, "median", position)
    return v if dim is None else ValuesIndices(v, i)
  def nanmedian(self: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """The lower median of the non-NaN elements (NaN where all are NaN); with `dim`, (values, int32 indices).

    >>> Tensor([1.0, float("nan"), 3.0, 2.0]).nanmedian().item()
    2.0
    """
    def position(n: int, nan_count: Tensor | None) -> Any:
      return (n - 1) // 2 if nan_count is None else ((n - nan_count - 1) // 2).maximum(0)
    v, i = self._select_sorted(dim, keepdim, "nanmedian", position)
    return v if dim is None else ValuesIndices(v, i)
  def kthvalue(self: Tensor, k: int, dim: int = -1, keepdim: bool = False) -> ValuesIndices:
    """The k-th smallest element along `dim` (k counts from 1; NaN sorts last) and its int32 index.

    >>> [t.item() for t in Tensor([5, 1, 4]).kthvalue(2)]
    [4, 2]
    """
    d = self._resolve_dim(dim) if self.ndim else 0
    n = int_size(self.shape[d], "kthvalue") if self.ndim else 1
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
      raise ArgumentError(f"kthvalue k={k} is out of range for dim {dim} of size {n} (shape {self.shape}); "
                      f"k counts from 1 to {n}")
    v, i = self._select_sorted(d, keepdim, "kthvalue", lambda n, c: int(k) - 1)
    return ValuesIndices(v.reshape(()), i.reshape(())) if self.ndim == 0 else ValuesIndices(v, i)
  def mode(self: Tensor, dim: int = -1, keepdim: bool = False) -> ValuesIndices:
    """The most frequent value along `dim` (the smallest among equally frequent ones; NaN only in an all-NaN row) and
    the int32 index of its last occurrence, as torch's CPU kernel picks.

    >>> [t.item() for t in Tensor([3, 1, 3, 1, 2]).mode()]
    [1, 3]
    """
    from ember.tensor import Tensor
    x = self.reshape(1) if self.ndim == 0 else self
    d = x._resolve_dim(dim)
    n = int_size(x.shape[d], "mode")
    if n == 0:
      raise EmptyReductionError(f"mode() along dim {dim} of shape {self.shape} has no elements; pass a non-empty dim")
    row = _last(x, d).detach()
    counts = (row.unsqueeze(-1) == row.unsqueeze(-2)).sum(-1, dtype=dtypes.int32)  # (..., n): how often row[i] occurs
    top = counts == counts.max(-1, keepdim=True)
    largest = dtypes.max(strong_dtype(row.dtype)) if not dtypes.is_float(row.dtype) else math.inf
    if dtypes.is_float(row.dtype):  # NaNs never win unless the row holds nothing else (torch's CPU kernel)
      number = row.isnan().logical_not()
      top = number & (counts == number.where(counts, 0).max(-1, keepdim=True))
    value = top.where(row, largest).min(-1, keepdim=True)
    pos = Tensor.arange(n, device=self.device, dtype=dtypes.int32)
    idx = (row == value).where(pos, -1).max(-1, keepdim=True)
    if dtypes.is_float(row.dtype): idx = number.any(-1, keepdim=True).where(idx, 0)  # all NaN: the first
    val = _last(x, d)._gather(row.ndim - 1, idx) if dtypes.is_float(row.dtype) else value
    if self.ndim == 0: return ValuesIndices(val.reshape(()), idx.reshape(()))
    if not keepdim: return ValuesIndices(val.squeeze(-1), idx.squeeze(-1))
    return ValuesIndices(_from_last(val, d), _from_last(idx, d))
  def quantile(self: Tensor, q: Any, dim: int | None = None, keepdim: bool = False, *,
               interpolation: str = "linear") -> Tensor:
    """The q-th quantiles along `dim` (of every element when None), q a float or a 1-d tensor in [0, 1] (its values
    become a new first dim). `interpolation` between the neighbouring order statistics: linear, lower, higher,
    midpoint or nearest. NaN where a row has a NaN (nanquantile skips them).

    >>> Tensor([1.0, 2.0, 3.0, 4.0]).quantile(0.5).item()
    2.5
    """
    return self._quantile(q, dim, keepdim, interpolation, "quantile")
  def nanquantile(self: Tensor, q: Any, dim: int | None = None, keepdim: bool = False, *,
                  interpolation: str = "linear") -> Tensor:
    """`quantile` of the non-NaN elements (NaN where a row is all NaN).

    >>> Tensor([1.0, float("nan"), 3.0]).nanquantile(0.5).item()
    2.0
    """
    return self._quantile(q, dim, keepdim, interpolation, "nanquantile")
  def _quantile(self: Tensor, q: Any, dim: int | None, keepdim: bool, interpolation: str, op: str) -> Tensor:
    _need_float(self, op)
    if interpolation not in _QUANTILE_MODES:
      raise ArgumentError(f"{op} interpolation must be one of {', '.join(_QUANTILE_MODES)}, got {interpolation!r}")
    qt = q.cast(self.dtype) if hasattr(q, "uop") else None
    if qt is None:
      if not 0 <= float(q) <= 1: raise ArgumentError(f"{op} q must be in [0, 1], got {q}")
      qt = _new(float(q), self, self.dtype)
    elif qt.ndim > 1: raise ShapeError(f"{op} q must be a float, a 0-d or a 1-d tensor, got shape {qt.shape}")
    elif data_checks_run() and qt.numel() and ((qt < 0) | (qt > 1) | qt.isnan()).any().item():
      raise ArgumentError(f"{op} q values must be in [0, 1], got {qt.tolist()}")
    x = self.flatten() if dim is None else self
    d = x._resolve_dim(dim) if dim is not None and x.ndim else 0
    if x.ndim == 0: x = x.reshape(1)
    n = int_size(x.shape[d], op)
    if n == 0: raise ShapeError(f"{op}() needs a non-empty input along dim {dim}, got shape {self.shape}")
    row = _last(x, d)
    vals = row.sort(-1)[0].unsqueeze(0)  # (1, ..., n)
    nan = row.isnan().unsqueeze(0)
    qs = qt.reshape(-1, *([1] * row.ndim))  # (Q, 1, ..., 1)
    if op == "nanquantile":
      ranks = (qs * (nan.logical_not().sum(-1, keepdim=True, dtype=self.dtype) - 1)).maximum(0)
    else: ranks = nan.any(-1, keepdim=True).where(n - 1, qs * (n - 1))
    ranks = {"lower": ranks.floor, "higher": ranks.ceil, "nearest": ranks.round}.get(interpolation, lambda: ranks)()
    shape = (qs.shape[0], *row.shape[:-1], 1)
    below = ranks.floor().cast(dtypes.int32)._broadcast_to(shape)
    vals = vals._broadcast_to((qs.shape[0], *row.shape))
    out = vals._gather(vals.ndim - 1, below)
    if interpolation in ("linear", "midpoint"):
      above = ranks.ceil().cast(dtypes.int32)._broadcast_to(shape)
      weight = (ranks - ranks.floor()) if interpolation == "linear" else 0.5
      out = out.lerp(vals._gather(vals.ndim - 1, above), weight)
    out = out.squeeze(-1)  # (Q, ...)
    if keepdim:
      out = out.reshape(qs.shape[0], *([1] * self.ndim)) if dim is None else _from_last(out.unsqueeze(-1), d + 1)
    return out if qt.ndim == 1 else out.squeeze(0)
  def norm(self: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False, dtype: DType | None = None) -> Tensor:
    """The vector p-norm over `dim` (every dim when None): p a number (inf: max |x|, -inf: min |x|, 0: the count of
    nonzeros) or "fro" (the 2-norm). The gradient at a zero vector is 0, as in torch. ("nuc" is not supported: use
    svd()[1].sum(-1).)

    >>> Tensor([3.0, -4.0]).norm().item()
    5.0
    """
    x = self.cast(dtype) if dtype is not None else self
    _need_float(x, "norm")
    if narrow_float(x.dtype): return x.float().norm(p, dim, keepdim).cast(x.dtype)  # as torch: in float32, cast once
    if p == "fro": p = 2
    if isinstance(p, str): raise ArgumentError(f"norm p must be a number or 'fro', got {p!r}; for the nuclear norm "
                                               "use svd()[1].sum(-1)")
    axes = _dims(x, dim)
    ax = x.abs()
    if p == math.inf: return ax.amax(axes, keepdim)
    if p == -math.inf: return ax.amin(axes, keepdim)
    if p == 0: return (x != 0).sum(axes, keepdim, dtype=x.dtype)
    if p == 1: return ax.sum(axes, keepdim)
    s = (ax.square() if p == 2 else ax.pow(p)).sum(axes, keepdim)
    zero = s == 0  # the root's gradient is infinite at 0: the where keeps it out (x^p's is 0 there)
    root = zero.where(1, s).sqrt() if p == 2 else zero.where(1, s).pow(1 / p)
    return zero.where(0, root)
  def dist(self: Tensor, other: Any, p: float = 2) -> Tensor:
    """The p-norm of self - other.

    >>> Tensor([1.0, 1.0]).dist(Tensor([4.0, 5.0])).item()
    5.0
    """
    return (self - other).norm(p)
  def diff(self: Tensor, n: int = 1, dim: int = -1, prepend: Tensor | None = None,
           append: Tensor | None = None) -> Tensor:
    """The n-th forward difference along `dim` (x[i+1] - x[i]; != for bool), with `prepend`/`append` joined first.

    >>> Tensor([1, 4, 9, 16]).diff().tolist()
    [3, 5, 7]
    """
    if self.ndim == 0: raise ShapeError("diff needs a tensor of at least 1 dim, got a 0-d one")
    d = self._resolve_dim(dim)
    x = self if prepend is None else prepend.cat(self, dim=d)
    if append is not None: x = x.cat(append, dim=d)
    for _ in range(n):
      m = int_size(x.shape[d], "diff")
      if m == 0: break
      hi, lo = x._slice_dim(d, 1, m), x._slice_dim(d, 0, m - 1)
      x = hi != lo if x.dtype is dtypes.bool else hi - lo
    return x
  def trace(self: Tensor) -> Tensor:
    """The sum of the main diagonal of a matrix (ints sum in int32, as ember's sum; torch: int64).

    >>> Tensor([[1, 2], [3, 4]]).trace().item()
    5
    """
    if self.ndim != 2: raise ShapeError(f"trace needs a matrix, got shape {self.shape}")
    return self.diagonal().sum()
  def cov(self: Tensor, *, correction: int = 1, fweights: Tensor | None = None,
          aweights: Tensor | None = None) -> Tensor:
    """The covariance matrix of the variables in the rows (observations in the columns; a 1-d tensor is one
    variable), with torch.cov's `correction`, frequency weights `fweights` and observation weights `aweights`.

    >>> Tensor([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]]).cov().tolist()
    [[1.0, -1.0], [-1.0, 1.0]]
    """
    if self.ndim > 2: raise ShapeError(f"cov needs a 1-d or 2-d tensor, got shape {self.shape}")
    x = (self.reshape(1, -1) if self.ndim < 2 else self)._float()
    obs = int_size(x.shape[1], "cov")
    w: Tensor | None = None
    for name, wt in (("fweights", fweights), ("aweights", aweights)):
      if wt is None: continue
      if wt.ndim > 1 or (wt.ndim == 1 and wt.shape[0] != obs):
        raise ShapeError(f"cov {name} must be 0-d or 1-d with {obs} entries (one per observation), got {wt.shape}")
      if name == "fweights": _need_int(wt, "cov fweights")
      w = wt.cast(x.dtype) if w is None else w * wt.cast(x.dtype)
    if w is None:
      w_sum: Any = obs
      avg = x.mean(1, keepdim=True)
    else:
      w_sum = w.sum()
      avg = (x * w).sum(1, keepdim=True) / w_sum
    if w is not None and aweights is not None and correction != 0:
      norm = w_sum - correction * (w * aweights.cast(x.dtype)).sum() / w_sum
    else: norm = w_sum - correction
    norm = norm.maximum(0) if hasattr(norm, "uop") else max(norm, 0)
    dev = x - avg
    c = dev.dot((dev * w if w is not None else dev).transpose(0, 1)) / norm
    return c.reshape(()) if self.ndim < 2 or x.shape[0] == 1 else c
  def histc(self: Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:
    """A histogram of `bins` equal-width bins over [min, max] (the data's min and max when both are equal); values
    outside are ignored, max itself falls in the last bin. Float tensors only; no gradient.

    >>> Tensor([1.0, 2.0, 1.0]).histc(bins=4, min=0, max=3).tolist()
    [0.0, 2.0, 1.0, 0.0]
    """
    from ember.tensor import Tensor
    _need_float(self, "histc", DTypeNotImplementedError)
    if not isinstance(bins, (int, np.integer)) or bins <= 0: raise ArgumentError(f"histc bins must be > 0, got {bins}")
    if min > max: raise ArgumentError(f"histc max must be larger than min, got min={min}, max={max}")
    x = self.detach().flatten()
    if x.shape[0] == 0: return Tensor.zeros(int(bins), dtype=self.dtype, device=self.device)
    lo: Any = min
    hi: Any = max
    if min == max:
      lo, hi = x.min(), x.max()
      same = lo == hi
      lo, hi = same.where(lo - 1, lo), same.where(hi + 1, hi)
    inside = (x >= lo) & (x <= hi)
    pos = ((x - lo) * bins / (hi - lo)).floor().minimum(bins - 1)
    hit = inside.unsqueeze(-1) & (pos.unsqueeze(-1) == Tensor.arange(int(bins), device=self.device, dtype=x.dtype))
    return hit.sum(0, dtype=self.dtype)
  def histogram(self: Tensor, bins: Any = 100, *, range: tuple[float, float] | None = None,
                weight: Tensor | None = None, density: bool = False) -> Histogram:
    """(hist, bin_edges): `bins` equal-width bins over `range` (the data's min and max when None, widened by 0.5 each
    way when they are equal), or the sorted 1-d tensor of edges `bins`. Bins hold [left, right), the last also its
    right edge; `weight` weighs each element, `density` divides by the total and the bin widths. No sync: the edges
    from the data stay tensors.

    >>> Tensor([1.0, 2.0, 1.0]).histogram(2).hist.tolist()
    [2.0, 1.0]
    """
    from ember.tensor import Tensor
    _need_float(self, "histogram", DTypeNotImplementedError)
    x = self.detach().flatten()
    if hasattr(bins, "uop"):
      if bins.ndim != 1 or bins.shape[0] < 2:
        raise ShapeError(f"histogram bins must be 1-d with 2 or more edges, got shape {bins.shape}")
      edges = bins.cast(self.dtype)
    else:
      if not isinstance(bins, (int, np.integer)) or bins <= 0:
        raise ArgumentError(f"histogram bins must be a count > 0 or a tensor of edges, got {bins!r}")
      if range is not None:
        if range[0] > range[1]: raise ArgumentError(f"histogram range must be (min, max) with min <= max, got {range}")
        lo: Any = _new(float(range[0]), self, self.dtype)
        hi: Any = _new(float(range[1]), self, self.dtype)
      elif x.shape[0] == 0: lo, hi = _new(0.0, self, self.dtype), _new(1.0, self, self.dtype)
      else: lo, hi = x.min(), x.max()
      same = lo == hi
      lo, hi = same.where(lo - 0.5, lo), same.where(hi + 0.5, hi)
      i = Tensor.arange(int(bins) + 1, device=self.device, dtype=self.dtype)
      step = (hi - lo) / int(bins)
      edges = (i < (int(bins) + 1) // 2).where(lo + step * i, hi - step * (int(bins) - i))  # torch.linspace's halves
    n = int_size(edges.shape[0], "histogram") - 1
    left, right = edges[:-1], edges[1:]
    xs = x.unsqueeze(-1)
    last = Tensor.arange(n, device=self.device) == n - 1
    hit = (xs >= left) & ((xs < right) | (last & (xs == right)))  # (N, bins)
    w = weight.detach().flatten().cast(self.dtype).unsqueeze(-1) if weight is not None else 1
    hist = hit.where(w, 0).sum(0, dtype=self.dtype) if x.shape[0] else Tensor.zeros(n, dtype=self.dtype,
                                                                                      device=self.device)
    if density: hist = hist / (hist.sum() * (right - left))
    return Histogram(hist, edges)
  def bincount(self: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
    """How often each value 0, 1, ... occurs in a 1-d non-negative int tensor (with `weights`: their sums), at
    least `minlength` long. The length depends on the largest value, so this reads the tensor on the host. Counts are
    int32 (torch: int64); float32/float64 weights keep their dtype, others sum in float64.

    >>> Tensor([1, 1, 3]).bincount().tolist()
    [0, 2, 0, 1]
    """
    from ember.tensor import Tensor
    if self.ndim != 1: raise ShapeError(f"bincount needs a 1-d tensor, got shape {self.shape}")
    _need_int(self, "bincount")
    if not isinstance(minlength, (int, np.integer)) or minlength < 0:
      raise ArgumentError(f"bincount minlength must be >= 0, got {minlength}")
    if weights is not None and weights.shape != self.shape:
      raise ShapeError(f"bincount weights must have the input's shape {self.shape}, got {weights.shape}")
    _host_read("bincount", "use one_hot(n).sum(0) or scatter_reduce into a tensor of a fixed length")
    size = int(minlength)
    if self.numel():
      lo, hi = (int(v) for v in Tensor.stack(self.min(), self.max()).tolist())
      if lo < 0: raise ArgumentError(f"bincount needs non-negative values, got {lo}")
      size = max(size, hi + 1)
    wdt = dtypes.int32 if weights is None else weights.dtype if weights.dtype in (dtypes.float32, dtypes.float64) \
      else dtypes.float64
    if size == 0 or self.numel() == 0: return Tensor.zeros(size, dtype=wdt, device=self.device)
    hit = self.unsqueeze(-1) == Tensor.arange(size, device=self.device, dtype=self.dtype)
    vals = weights.cast(wdt).unsqueeze(-1) if weights is not None else 1
    return hit.where(vals, 0).sum(0, dtype=wdt)
  def searchsorted(self: Tensor, values: Any, *, out_int32: bool = False, right: bool = False, side: str | None = None,
                   sorter: Tensor | None = None) -> Tensor:
    """torch.searchsorted(self, values): where each value would be inserted in the sorted last dim of self to keep it
    sorted (the first such place, or the last with `right=True` / side="right"). int32 (`out_int32` is accepted;
    torch's default is int64). `sorter` holds the indices that sort an unsorted self.

    >>> Tensor([1, 3, 5]).searchsorted(Tensor([3, 6])).tolist()
    [1, 3]
    """
    if side is not None:
      if side not in ("left", "right"):
        raise ArgumentError(f"searchsorted side must be 'left' or 'right', got {side!r}")
      if right and side == "left":
        raise ArgumentError("searchsorted got side='left' and right=True, which disagree; pass one of them")
      right = side == "right"
    if self.ndim == 0: raise ShapeError("searchsorted needs a sorted sequence of at least 1 dim, got a 0-d tensor")
    seq = self if sorter is None else self.gather(-1, sorter)
    v = values if hasattr(values, "uop") else _new(values, self)
    if seq.ndim > 1 and (v.ndim != seq.ndim or v.shape[:-1] != seq.shape[:-1]):
      raise ShapeError(f"searchsorted: values {v.shape} must have the leading dims of the sorted sequence {seq.shape}")
    if seq.ndim == 1:
      below = seq <= v.unsqueeze(-1) if right else seq < v.unsqueeze(-1)  # (*v.shape, n)
    else:
      s, vv = seq.unsqueeze(-2), v.unsqueeze(-1)  # (..., 1, n) against (..., m, 1)
      below = s <= vv if right else s < vv
    return below.sum(-1, dtype=dtypes.int32)
  def bucketize(self: Tensor, boundaries: Tensor, *, out_int32: bool = False, right: bool = False) -> Tensor:
    """The index of the bucket of each element between the sorted 1-d `boundaries` (torch.bucketize): with
    right=False, boundaries[i-1] < x <= boundaries[i]. int32 (torch's default is int64).

    >>> Tensor([1, 4, 9]).bucketize(Tensor([2, 4, 8])).tolist()
    [0, 1, 3]
    """
    if boundaries.ndim != 1: raise ShapeError(f"bucketize needs 1-d boundaries, got shape {boundaries.shape}")
    return boundaries.searchsorted(self, right=right)
  def trapezoid(self: Tensor, x: Tensor | None = None, *, dx: float | None = None, dim: int = -1) -> Tensor:
    """The trapezoidal rule along `dim`: with sample points `x` (1-d, or the shape of self), or spacing `dx`
    (default 1). torch.trapezoid(self, ...).

    >>> Tensor([1.0, 2.0, 3.0]).trapezoid().item()
    4.0
    """
    if x is not None and dx is not None: raise ArgumentError("trapezoid takes x or dx, not both")
    d = self._resolve_dim(dim)
    n = int_size(self.shape[d], "trapezoid")
    y = self._float()
    if n == 0: return y.sum(d)
    pair = y._slice_dim(d, 1, n) + y._slice_dim(d, 0, n - 1)
    if x is None: return (pair * (1.0 if dx is None else dx)).sum(d) / 2
    if x.ndim == 1:
      if x.shape[0] != n: raise ShapeError(f"trapezoid x has {x.shape[0]} points but dim {d} of y has {n}")
      step = x.diff().reshape(*([1] * d), n - 1, *([1] * (self.ndim - d - 1)))
    else: step = x.diff(dim=d)
    return (step * pair).sum(d) / 2
  def trapz(self: Tensor, x: Tensor | None = None, *, dx: float | None = None, dim: int = -1) -> Tensor:
    """Alias of `trapezoid`."""
    return self.trapezoid(x, dx=dx, dim=dim)

  # ** products **
  def mm(self: Tensor, mat2: Tensor) -> Tensor:
    """The product of two matrices (2-d only; `matmul` broadcasts).

    >>> Tensor([[1, 2]]).mm(Tensor([[3], [4]])).tolist()
    [[11]]
    """
    if self.ndim != 2 or mat2.ndim != 2:
      raise ShapeError(f"mm needs two matrices, got shapes {self.shape}, {mat2.shape}")
    return self.dot(mat2)
  def mv(self: Tensor, vec: Tensor) -> Tensor:
    """A matrix times a vector."""
    if self.ndim != 2 or vec.ndim != 1:
      raise ShapeError(f"mv needs a matrix and a vector, got shapes {self.shape}, {vec.shape}")
    return self.dot(vec)
  def bmm(self: Tensor, mat2: Tensor) -> Tensor:
    """Batched matrix product of (b, n, m) and (b, m, p) (no broadcasting; `matmul` broadcasts)."""
    if self.ndim != 3 or mat2.ndim != 3 or self.shape[0] != mat2.shape[0]:
      raise ShapeError(f"bmm needs two 3-d tensors with the same batch, got shapes {self.shape}, {mat2.shape}")
    return self.dot(mat2)
  def addmm(self: Tensor, mat1: Tensor, mat2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """beta * self + alpha * (mat1 @ mat2); beta=0 ignores self (NaN in it does not propagate).

    >>> Tensor([[1.0]]).addmm(Tensor([[2.0]]), Tensor([[3.0]]), alpha=2).tolist()
    [[13.0]]
    """
    prod_ = mat1.mm(mat2)
    return _scaled_add(self, prod_, beta, alpha)
  def baddbmm(self: Tensor, batch1: Tensor, batch2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """beta * self + alpha * (batch1 @ batch2), batched."""
    return _scaled_add(self, batch1.bmm(batch2), beta, alpha)
  def addmv(self: Tensor, mat: Tensor, vec: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """beta * self + alpha * (mat @ vec)."""
    return _scaled_add(self, mat.mv(vec), beta, alpha)
  def addr(self: Tensor, vec1: Tensor, vec2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """beta * self + alpha * outer(vec1, vec2)."""
    return _scaled_add(self, vec1.outer(vec2), beta, alpha)
  def addbmm(self: Tensor, batch1: Tensor, batch2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    """beta * self + alpha * the sum over the batch of batch1 @ batch2."""
    return _scaled_add(self, batch1.bmm(batch2).sum(0), beta, alpha)
  def corrcoef(self: Tensor) -> Tensor:
    """Pearson correlation coefficients of the variables in the rows (cov normalised by the standard deviations,
    clipped to [-1, 1]).

    >>> Tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]).corrcoef().tolist()
    [[1.0, -1.0], [-1.0, 1.0]]
    """
    c = self.cov()
    if c.ndim == 0: return c / c
    d = c.diagonal().sqrt()
    return (c / d.unsqueeze(1) / d.unsqueeze(0)).clip(-1, 1)
  def outer(self: Tensor, vec2: Tensor) -> Tensor:
    """The outer product of two vectors.

    >>> Tensor([1, 2]).outer(Tensor([3, 4])).tolist()
    [[3, 4], [6, 8]]
    """
    if self.ndim != 1 or vec2.ndim != 1: raise ShapeError(f"outer needs two vectors, got {self.shape}, {vec2.shape}")
    return self.unsqueeze(1) * vec2.unsqueeze(0)
  def ger(self: Tensor, vec2: Tensor) -> Tensor:
    """Alias of `outer`."""
    return self.outer(vec2)
  def inner(self: Tensor, other: Tensor) -> Tensor:
    """The sum over the last dims of self and other (their product when one is 0-d); the result's shape is
    self.shape[:-1] + other.shape[:-1].

    >>> Tensor([1, 2]).inner(Tensor([[1, 1], [0, 1]])).tolist()
    [3, 2]
    """
    if self.ndim == 0 or other.ndim == 0: return self * other
    if self.shape[-1] != other.shape[-1]:
      raise ShapeError(f"inner needs equal last dims, got shapes {self.shape} and {other.shape}")
    a = self.reshape(*self.shape[:-1], *([1] * (other.ndim - 1)), self.shape[-1])
    return (a * other).sum(-1, dtype=None if dtypes.is_float(a.dtype) else a.dtype)
  def vdot(self: Tensor, other: Tensor) -> Tensor:
    """The dot product of two vectors of equal length."""
    if self.ndim != 1 or other.ndim != 1 or self.shape != other.shape:
      raise ShapeError(f"vdot needs two vectors of equal length, got shapes {self.shape} and {other.shape}")
    return self.dot(other)
  def kron(self: Tensor, other: Tensor) -> Tensor:
    """The Kronecker product: blocks self[i] * other (shapes multiply dim by dim, the shorter padded with 1s).

    >>> Tensor([1, 2]).kron(Tensor([1, 10])).tolist()
    [1, 10, 2, 20]
    """
    nd = max(self.ndim, other.ndim)
    if nd == 0: return self * other
    a = self.reshape(*([1] * (nd - self.ndim)), *self.shape)
    b = other.reshape(*([1] * (nd - other.ndim)), *other.shape)
    ai = a.reshape(*[v for s in a.shape for v in (s, 1)])
    bi = b.reshape(*[v for s in b.shape for v in (1, s)])
    return (ai * bi).reshape(*[x * y for x, y in zip(a.shape, b.shape)])
  def cross(self: Tensor, other: Tensor, dim: int | None = None) -> Tensor:
    """The cross product of 3-vectors along `dim` (inputs broadcast); dim=None takes the first dim of size 3, as
    torch.cross does (torch.linalg.cross defaults to -1).

    >>> Tensor([1, 0, 0]).cross(Tensor([0, 1, 0])).tolist()
    [0, 0, 1]
    """
    a, b = self._broadcasted(other)
    if dim is None:
      dim = next((i for i, s in enumerate(a.shape) if s == 3), None)
      if dim is None: raise ShapeError(f"cross found no dim of size 3 in shape {a.shape}; pass dim")
    d = a._resolve_dim(dim)
    if a.shape[d] != 3: raise ShapeError(f"cross needs dim {dim} of size 3, got shape {a.shape}")
    x0, x1, x2 = (a._slice_dim(d, i, i + 1) for i in range(3))
    y0, y1, y2 = (b._slice_dim(d, i, i + 1) for i in range(3))
    return (x1 * y2 - x2 * y1).cat(x2 * y0 - x0 * y2, x0 * y1 - x1 * y0, dim=d)

  # ** movement and indexing **
  def movedim(self: Tensor, source: int | Sequence[int], destination: int | Sequence[int]) -> Tensor:
    """Move the dims `source` to the positions `destination`; the others keep their order.

    >>> Tensor.zeros(2, 3, 4).movedim(0, -1).shape
    (3, 4, 2)
    """
    src = [source] if isinstance(source, (int, np.integer)) else list(source)
    dst = [destination] if isinstance(destination, (int, np.integer)) else list(destination)
    if len(src) != len(dst):
      raise ShapeError(f"movedim needs as many source dims as destinations, got {src} and {dst}")
    if self.ndim == 0:  # a 0-d tensor takes dim 0 or -1, as if it had one dim
      for i in (*src, *dst): self._resolve_dim(i, extra=1)
      return self
    s, t = [self._resolve_dim(i) for i in src], [self._resolve_dim(i) for i in dst]
    if len(set(s)) != len(s) or len(set(t)) != len(t):
      raise ShapeError(f"movedim dims repeat: source {src}, destination {dst}")
    order: list[int | None] = [None] * self.ndim
    for i, j in zip(s, t): order[j] = i
    rest = iter(i for i in range(self.ndim) if i not in s)
    return self.permute([next(rest) if o is None else o for o in order])
  def narrow(self: Tensor, dim: int, start: Any, length: int) -> Tensor:
    """`length` elements of dim `dim` from `start` (negative counts from the end).

    >>> Tensor([0, 1, 2, 3, 4]).narrow(0, -2, 2).tolist()
    [3, 4]
    """
    if self.ndim == 0: raise ShapeError("narrow needs a tensor of at least 1 dim, got a 0-d one")
    if hasattr(start, "uop"):  # torch takes a 0-d int tensor too: its value sets the shape, read on the host
      _host_read("narrow with a tensor start", "pass start as a Python int")
      start = int(start.item())
    d = self._resolve_dim(dim)
    n = int_size(self.shape[d], "narrow")
    if not -n <= start <= n:
      raise AxisError(f"narrow start {start} is out of range [{-n}, {n}] for dim {dim} of shape {self.shape}")
    begin = start + n if start < 0 else start
    if length < 0 or begin + length > n:
      raise ShapeError(f"narrow: start {start} + length {length} exceeds dim {dim} of size {n}")
    return self._slice_dim(d, begin, begin + length)
  def select(self: Tensor, dim: int, index: int) -> Tensor:
    """The slice at `index` of dim `dim` (negative counts from the end), without that dim.

    >>> Tensor([[1, 2], [3, 4]]).select(1, -1).tolist()
    [2, 4]
    """
    _need_dims(self, "select")
    d = self._resolve_dim(dim)
    n = int_size(self.shape[d], "select")
    if not -n <= index < n:
      raise AxisError(f"select index {index} is out of range for dim {dim} of size {n} (shape {self.shape})")
    i = index + n if index < 0 else index
    return self._slice_dim(d, i, i + 1).squeeze(d)
  def unbind(self: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices along `dim`, each without it.

    >>> [t.tolist() for t in Tensor([[1, 2], [3, 4]]).unbind(1)]
    [[1, 3], [2, 4]]
    """
    _need_dims(self, "unbind")
    d = self._resolve_dim(dim)
    return tuple(self.select(d, i) for i in range(int_size(self.shape[d], "unbind")))
  def tensor_split(self: Tensor, indices_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """Split along `dim` into `n` near-equal pieces (an int: the first ones one longer), or before each index of a
    sequence (numpy.array_split's rules). A tensor argument is read on the host.

    >>> [t.tolist() for t in Tensor([0, 1, 2, 3, 4]).tensor_split(3)]
    [[0, 1], [2, 3], [4]]
    """
    spec = indices_or_sections
    if hasattr(spec, "uop"):
      if not dtypes.is_int(spec.dtype) or spec.ndim > 1:
        raise DTypeError(f"tensor_split takes an int, a sequence or a 0-d/1-d int tensor, got {spec.dtype!r} "
                         f"{spec.shape}")
      _host_read("tensor_split with a tensor argument", "pass the sections or indices as Python ints")
      spec = spec.tolist()
    if self.ndim == 0: raise ShapeError("tensor_split needs a tensor of at least 1 dim, got a 0-d one")
    d = self._resolve_dim(dim)
    n = int_size(self.shape[d], "tensor_split")
    return tuple(self._slice_dim(d, a, b) for a, b in _sections(n, spec, "tensor_split"))
  def hsplit(self: Tensor, sections: Any) -> tuple[Tensor, ...]:
    """tensor_split along dim 1 (dim 0 of a 1-d tensor); an int must divide the dim evenly."""
    if self.ndim == 0: raise ShapeError("hsplit needs a tensor of at least 1 dim, got a 0-d one")
    return _even_split(self, sections, 1 if self.ndim > 1 else 0, "hsplit")
  def vsplit(self: Tensor, sections: Any) -> tuple[Tensor, ...]:
    """tensor_split along dim 0 of a tensor of at least 2 dims; an int must divide the dim evenly."""
    if self.ndim < 2: raise ShapeError(f"vsplit needs a tensor of at least 2 dims, got shape {self.shape}")
    return _even_split(self, sections, 0, "vsplit")
  def dsplit(self: Tensor, sections: Any) -> tuple[Tensor, ...]:
    """tensor_split along dim 2 of a tensor of at least 3 dims; an int must divide the dim evenly."""
    if self.ndim < 3: raise ShapeError(f"dsplit needs a tensor of at least 3 dims, got shape {self.shape}")
    return _even_split(self, sections, 2, "dsplit")
  def fliplr(self: Tensor) -> Tensor:
    """Flip dim 1 (left-right) of a tensor of at least 2 dims."""
    if self.ndim < 2: raise ShapeError(f"fliplr needs a tensor of at least 2 dims, got shape {self.shape}")
    return self.flip(1)
  def flipud(self: Tensor) -> Tensor:
    """Flip dim 0 (up-down) of a tensor of at least 1 dim."""
    if self.ndim < 1: raise ShapeError("flipud needs a tensor of at least 1 dim, got a 0-d one")
    return self.flip(0)
  def rot90(self: Tensor, k: int = 1, dims: Sequence[int] = (0, 1)) -> Tensor:
    """Rotate by 90 degrees `k` times in the plane of `dims`, from the first dim's direction toward the second's.

    >>> Tensor([[1, 2], [3, 4]]).rot90().tolist()
    [[2, 4], [1, 3]]
    """
    if len(dims) != 2: raise ShapeError(f"rot90 needs 2 dims, got {list(dims)}")
    d0, d1 = self._resolve_dim(dims[0]), self._resolve_dim(dims[1])
    if self.ndim < 2 or d0 == d1: raise ShapeError(f"rot90 needs two different dims, got {list(dims)} for {self.shape}")
    k = k % 4
    if k == 1: return self.flip(d1).transpose(d0, d1)
    if k == 2: return self.flip(d0, d1)
    if k == 3: return self.flip(d0).transpose(d0, d1)
    return self
  def tile(self: Tensor, dims: Any, *more: int) -> Tensor:
    """Repeat the tensor `dims[i]` times along each dim; fewer reps than dims repeat the last dims (torch.tile).

    >>> Tensor([[1, 2]]).tile(2).tolist()
    [[1, 2, 1, 2]]
    """
    reps = (dims, *more) if isinstance(dims, (int, np.integer)) else tuple(dims)
    return self.repeat(*([1] * (self.ndim - len(reps))), *reps)
  def take(self: Tensor, index: Tensor) -> Tensor:
    """The elements of the flattened tensor at `index` (negative counts from the end); the result has index's shape.

    >>> Tensor([[1, 2], [3, 4]]).take(Tensor([0, -1])).tolist()
    [1, 4]
    """
    if not dtypes.is_int(index.dtype): raise DTypeError(f"take index must be an int tensor, got {index.dtype!r}")
    return self.flatten()[index]
  def take_along_dim(self: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """gather along `dim` with self and `indices` broadcast over the other dims (dim=None: over the flattened
    tensors).

    >>> Tensor([[10, 30, 20]]).take_along_dim(Tensor([[1, 2]]), 1).tolist()
    [[30, 20]]
    """
    if dim is None: return self.flatten().gather(0, indices.flatten())
    _need_dims(self, "take_along_dim")
    d = self._resolve_dim(dim)
    if indices.ndim != self.ndim:
      raise ShapeError(f"take_along_dim: indices of shape {indices.shape} need as many dims as self {self.shape}")
    rest = [s for i, s in enumerate(self.shape) if i != d]
    irest = [s for i, s in enumerate(indices.shape) if i != d]
    from ember.tensor import broadcast_shape
    common = list(broadcast_shape(tuple(rest), tuple(irest)))
    x = self.expand(*common[:d], self.shape[d], *common[d:])
    idx = indices.expand(*common[:d], indices.shape[d], *common[d:])
    return x.gather(d, idx)
  def diagflat(self: Tensor, offset: int = 0) -> Tensor:
    """A square matrix with the flattened tensor on its `offset` diagonal.

    >>> Tensor([[1, 2]]).diagflat().tolist()
    [[1, 0], [0, 2]]
    """
    return self.flatten().diag(offset)
  def split_with_sizes(self: Tensor, split_sizes: Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Split along `dim` into pieces of `split_sizes`, which must add up to the dim's size."""
    return self.split(list(split_sizes), dim)
  def slice_scatter(self: Tensor, src: Tensor, dim: int = 0, start: int | None = None, end: int | None = None,
                    step: int = 1) -> Tensor:
    """self with `src` written into the slice start:end:step of dim `dim` (out of place).

    >>> Tensor.zeros(4).slice_scatter(Tensor([1.0, 2.0]), start=1, step=2).tolist()
    [0.0, 1.0, 0.0, 2.0]
    """
    d = self._resolve_dim(dim)
    n = int_size(self.shape[d], "slice_scatter")
    if step <= 0: raise ArgumentError(f"slice_scatter step must be positive, got {step}")
    first, stop, _ = slice(start, end, step).indices(n)
    k = len(range(first, stop, step))
    want = tuple(k if i == d else s for i, s in enumerate(self.shape))
    if src.shape != want:
      raise ShapeError(f"slice_scatter: src of shape {src.shape} must have the slice's shape {want}")
    return _placed(self, src, d, first, step)
  def select_scatter(self: Tensor, src: Tensor, dim: int, index: int) -> Tensor:
    """self with `src` written into the slice at `index` of dim `dim` (out of place)."""
    d = self._resolve_dim(dim)
    n = int_size(self.shape[d], "select_scatter")
    if not -n <= index < n: raise AxisError(f"select_scatter index {index} is out of range for dim {dim} of size {n}")
    if src.shape != self.select(d, index).shape:
      raise ShapeError(f"select_scatter: src of shape {src.shape} must have the slice's shape "
                       f"{self.select(d, index).shape}")
    return _placed(self, src.unsqueeze(d), d, index + n if index < 0 else index, 1)
  def diagonal_scatter(self: Tensor, src: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """self with `src` written on the `offset` diagonal of the (dim1, dim2) planes (out of place)."""
    from ember.tensor import Tensor
    want = self.diagonal(offset, dim1, dim2).shape
    if src.shape != want:
      raise ShapeError(f"diagonal_scatter: src of shape {src.shape} must have the diagonal's shape {want}")
    d1, d2 = self._resolve_dim(dim1), self._resolve_dim(dim2)
    r, c = int_size(self.shape[d1], "diagonal_scatter"), int_size(self.shape[d2], "diagonal_scatter")
    rows = Tensor.arange(r, device=self.device).reshape(*[r if i == d1 else 1 for i in range(self.ndim)])
    cols = Tensor.arange(c, device=self.device).reshape(*[c if i == d2 else 1 for i in range(self.ndim)])
    on = cols - rows == offset
    # src's last dim runs along the diagonal: placed at (i + r0, i + c0), it reads at the row (or column) it sits on
    k = int_size(want[-1], "diagonal_scatter")
    vals = src.unsqueeze(-1).unsqueeze(-1)  # (..., k, 1, 1)
    pos = Tensor.arange(k, device=self.device).reshape(k, 1, 1)
    r0 = 0 if offset >= 0 else -offset
    plane = ((Tensor.arange(r, device=self.device).reshape(1, r, 1) - r0) == pos).where(vals, 0).sum(-3)  # (..., r, 1)
    plane = plane.expand(*plane.shape[:-1], c)  # (..., r, c): row i holds src[i - r0]
    lead = [i for i in range(self.ndim) if i not in (d1, d2)]
    order = [0] * self.ndim
    for j, i in enumerate(lead + [d1, d2]): order[i] = j
    return on.where(plane.permute(order).cast(self.dtype), self)
  def renorm(self: Tensor, p: float, dim: int, maxnorm: float) -> Tensor:
    """Each slice along `dim` (all other dims) rescaled to p-norm at most `maxnorm` (those below are kept).

    >>> Tensor([[3.0, 4.0], [0.3, 0.4]]).renorm(2, 0, 1.0).tolist()
    [[0.6000000238418579, 0.800000011920929], [0.30000001192092896, 0.4000000059604645]]
    """
    _need_float(self, "renorm")
    d = self._resolve_dim(dim)
    norms = self.norm(p, [i for i in range(self.ndim) if i != d], keepdim=True)
    return (norms > maxnorm).where(self * (maxnorm / (norms + 1e-7)), self)
  def nelement(self: Tensor) -> Any:
    """The number of elements (numel)."""
    return self.numel()
  def ndimension(self: Tensor) -> int:
    """The number of dims (ndim)."""
    return self.ndim
  def is_signed(self: Tensor) -> bool:
    """True for signed int and float dtypes."""
    return not (dtypes.is_unsigned(self.dtype) or self.dtype is dtypes.bool)
  def is_complex(self: Tensor) -> bool:
    """False: ember has no complex dtypes."""
    return False
  def is_same_size(self: Tensor, other: Tensor) -> bool:
    """Whether other has this shape."""
    return self.shape == other.shape
  def byte(self: Tensor) -> Tensor:
    """Cast to uint8."""
    return self.cast(dtypes.uint8)
  def char(self: Tensor) -> Tensor:
    """Cast to int8."""
    return self.cast(dtypes.int8)
  def diag_embed(self: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """Square matrices with the last dim of self on their `offset` diagonal, placed at dims `dim1`, `dim2` of the
    result.

    >>> Tensor([1, 2]).diag_embed().tolist()
    [[1, 0], [0, 2]]
    """
    from ember.tensor import Tensor
    _need_dims(self, "diag_embed")
    x = self
    nd = x.ndim + 1
    d1, d2 = x._resolve_dim(dim1, extra=1), x._resolve_dim(dim2, extra=1)
    if d1 == d2: raise ShapeError(f"diag_embed dims must differ, got dim1={dim1}, dim2={dim2}")
    n = int_size(x.shape[-1], "diag_embed")
    eye = Tensor.arange(n, device=self.device).reshape(n, 1) == Tensor.arange(n, device=self.device).reshape(1, n)
    mat = eye.where(x.unsqueeze(-2), x._zero())  # (..., n, n)
    k = abs(offset)
    pads = ((0, k), (k, 0)) if offset >= 0 else ((k, 0), (0, k))
    mat = mat.pad(((0, 0),) * (nd - 2) + pads)
    rest = iter(range(nd - 2))
    return mat.permute([nd - 2 if i == d1 else nd - 1 if i == d2 else next(rest) for i in range(nd)])
  def _index_along(self: Tensor, dim: int, index: Tensor, op: str, negative: bool = False) -> tuple[int, Tensor]:
    """Resolve `dim` and check a 0-d/1-d int `index` into it (`negative`: -n .. -1 count from the end): (dim, (k, n)
    bool mask of which position each index entry names)."""
    from ember.tensor import Tensor
    d = self._resolve_dim(dim) if self.ndim else 0
    if not dtypes.is_int(index.dtype): raise IndexingError(f"{op} index must be an int tensor, got {index.dtype!r}")
    if index.ndim > 1: raise IndexingError(f"{op} index must be 0-d or 1-d, got shape {index.shape}")
    n = int_size(self.shape[d], op) if self.ndim else 1
    check_index_range(index, n, f"{op} along dim {d}", low=-n if negative else 0)
    if negative: index = (index < 0).where(index + n, index)
    return d, index.reshape(-1, 1) == Tensor.arange(n, device=self.device, dtype=index.dtype)
  def _source_rows(self: Tensor, d: int, index: Tensor, source: Any, op: str) -> Tensor:
    """`source` checked against self with dim d of len(index), moved to (..., k, 1)."""
    src = source if hasattr(source, "uop") else _new(source, self, self.dtype)
    want = tuple(index.numel() if i == d else s for i, s in enumerate(self.shape))
    if src.shape != want and not (self.ndim == 0 and src.numel() == 1):
      raise ShapeError(f"{op}: source of shape {src.shape} must have shape {want} (self with dim {d} of len(index))")
    return _last(src.reshape(want), d).cast(self.dtype).unsqueeze(-1) if self.ndim else src.reshape(1, 1)
  def index_add(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Any = 1) -> Tensor:
    """self with alpha * source[..., i, ...] added at position index[i] of dim `dim` (repeated indices add up).

    >>> Tensor([0, 0, 0]).index_add(0, Tensor([2, 0, 2]), Tensor([1, 2, 3])).tolist()
    [2, 0, 4]
    """
    d, hit = self._index_along(dim, index, "index_add")
    rows = self._source_rows(d, index, source, "index_add")  # (..., k, 1)
    added = hit.where(rows, 0).sum(-2, dtype=self.dtype)  # (..., n)
    if alpha != 1: added = added * alpha
    return self + (_from_last(added, d) if self.ndim else added.reshape(()))
  def index_copy(self: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """self with source[..., i, ...] written at position index[i] of dim `dim` (of repeated indices the last wins).

    >>> Tensor([0, 0, 0]).index_copy(0, Tensor([2, 0]), Tensor([5, 7])).tolist()
    [7, 0, 5]
    """
    from ember.tensor import Tensor
    d, hit = self._index_along(dim, index, "index_copy")
    rows = self._source_rows(d, index, source, "index_copy")
    k = int_size(hit.shape[0], "index_copy")
    pos = Tensor.arange(k, device=self.device, dtype=dtypes.int32).reshape(k, 1)
    chosen = hit & (pos == hit.where(pos, -1).max(0, keepdim=True))  # the last entry naming each position
    value = chosen.where(rows, 0).sum(-2, dtype=self.dtype)
    written = hit.any(0)
    if self.ndim == 0: return written.reshape(()).where(value.reshape(()), self)
    return _from_last(written.where(value, _last(self, d)), d)
  def index_fill(self: Tensor, dim: int, index: Tensor, value: Any) -> Tensor:
    """self with `value` (a number or a 0-d tensor) at the positions `index` of dim `dim` (negative ones count from the
    end, as in torch; index_add and index_copy refuse them, as torch does).

    >>> Tensor([1, 2, 3]).index_fill(0, Tensor([0, 2]), -1).tolist()
    [-1, 2, -1]
    """
    d, hit = self._index_along(dim, index, "index_fill", negative=True)
    if hasattr(value, "uop") and value.ndim != 0:
      raise ShapeError(f"index_fill value must be a number or a 0-d tensor, got shape {value.shape}")
    v = value.cast(self.dtype) if hasattr(value, "uop") else _new(value, self, self.dtype)
    written = hit.any(0)
    if self.ndim == 0: return written.reshape(()).where(v, self)
    return written.reshape(*([1] * d), -1, *([1] * (self.ndim - d - 1))).where(v, self)
  def masked_scatter(self: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """self with the elements of `source`, in order, written where `mask` (broadcast to self) is True.

    `source` needs at least as many elements as the mask has True values; ember does not check this (it would read
    the mask): past the end the last element of source repeats.

    >>> Tensor([0, 0, 0]).masked_scatter(Tensor([True, False, True]), Tensor([5, 6, 7])).tolist()
    [5, 0, 6]
    """
    if mask.dtype is not dtypes.bool: raise DTypeError(f"masked_scatter mask must be bool, got {mask.dtype!r}")
    m = mask._broadcast_to(self.shape) if mask.shape != self.shape else mask
    if m.shape != self.shape: raise ShapeError(f"masked_scatter mask {mask.shape} does not broadcast to {self.shape}")
    flat_m = m.flatten()
    src = source.flatten().cast(self.dtype)
    if src.shape[0] == 0 or flat_m.shape[0] == 0: return self
    rank = (flat_m.cast(dtypes.int32).cumsum() - 1).clip(0, int_size(src.shape[0], "masked_scatter") - 1)
    return flat_m.where(src._gather(0, rank), self.flatten()).reshape(self.shape)
  def put(self: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    """self viewed as 1-d with source's elements written (or with `accumulate`, added) at the flat positions `index`
    (negative count from the end); index and source have as many elements.

    >>> Tensor([1, 2, 3]).put(Tensor([-1, 0]), Tensor([9, 8])).tolist()
    [8, 2, 9]
    """
    if not dtypes.is_int(index.dtype): raise IndexingError(f"put index must be an int tensor, got {index.dtype!r}")
    if index.numel() != source.numel():
      raise ShapeError(f"put needs as many source elements ({source.numel()}) as indices ({index.numel()})")
    flat, idx = self.flatten(), index.flatten()
    n = int_size(flat.shape[0], "put")
    check_index_range(idx, n, "put", low=-n)
    idx = (idx < 0).where(idx + n, idx)
    src = source.flatten()
    out = flat.index_add(0, idx, src) if accumulate else flat.index_copy(0, idx, src)
    return out.reshape(self.shape)
  def index_reduce(self: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    """Combine source[..., i, ...] into position index[i] of dim `dim` with `reduce` (prod, mean, amax or amin);
    `include_self=False` ignores self's value where something lands (torch.Tensor.index_reduce).

    >>> Tensor([1.0, 1.0]).index_reduce(0, Tensor([0, 0]), Tensor([2.0, 3.0]), "prod").tolist()
    [6.0, 1.0]
    """
    if reduce not in ("prod", "mean", "amax", "amin"):
      raise ArgumentError(f"index_reduce reduce must be prod, mean, amax or amin, got {reduce!r}")
    d, _ = self._index_along(dim, index, "index_reduce")
    rows = self._source_rows(d, index, source, "index_reduce").squeeze(-1)  # (..., k): checked, dim d last
    idx = index.reshape(-1).cast(dtypes.int32).expand(rows.shape)
    return _from_last(_last(self, d).scatter_reduce(-1, idx, rows, reduce, include_self=include_self), d)
  def scatter_add(self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """scatter_reduce with "sum": src[p] added at index[p] along `dim`.

    >>> Tensor([0, 0]).scatter_add(0, Tensor([1, 1, 0]), Tensor([1, 2, 3])).tolist()
    [3, 3]
    """
    return self.scatter_reduce(dim, index, src, "sum")

  # ** values read on the host **
  def equal(self: Tensor, other: Tensor) -> bool:
    """True when other has self's shape and equal values (NaN is never equal), as a Python bool (a sync).

    >>> Tensor([1, 2]).equal(Tensor([1, 2]))
    True
    """
    if self.shape != other.shape: return False
    return bool((self == other).all().item())
  def unique(self: Tensor, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False,
             dim: int | None = None) -> Any:
    """The distinct values (or slices along `dim`), sorted, with the int32 inverse indices and int32 counts when
    asked. The number of values depends on the data: this reads the tensor on the host. NaNs are each distinct.

    >>> Tensor([2, 1, 2]).unique().tolist()
    [1, 2]
    """
    _host_read("unique", "keep a fixed-size result, e.g. with sort() and a mask of changes")
    arr = self.numpy()
    d = self._resolve_dim(dim) if dim is not None else None
    if d is None: vals, inv, cnt = np.unique(arr, return_inverse=True, return_counts=True, equal_nan=False)
    else: vals, inv, cnt = np.unique(arr, return_inverse=True, return_counts=True, axis=d, equal_nan=False)
    inv = inv.reshape(arr.shape) if d is None else inv.reshape(-1)
    return _unique_result(self, vals, inv, cnt, return_inverse, return_counts)
  def unique_consecutive(self: Tensor, return_inverse: bool = False, return_counts: bool = False,
                         dim: int | None = None) -> Any:
    """Collapse runs of equal values (or slices along `dim`), with int32 inverse indices and counts when asked. Reads
    the tensor on the host (the result's length depends on the data).

    >>> Tensor([1, 1, 2, 2, 1]).unique_consecutive().tolist()
    [1, 2, 1]
    """
    _host_read("unique_consecutive", "keep a fixed-size result, e.g. with diff() and a mask of changes")
    arr = self.numpy()
    d = self._resolve_dim(dim) if dim is not None else None
    rows = arr.reshape(-1, 1) if d is None else np.moveaxis(arr, d, 0).reshape(arr.shape[d], -1)
    if rows.shape[0] == 0:
      starts = np.zeros(0, dtype=bool)
    else:
      starts = np.concatenate([[True], (rows[1:] != rows[:-1]).any(axis=1)])
    inv = np.cumsum(starts) - 1
    cnt = np.diff(np.append(np.flatnonzero(starts), rows.shape[0]))
    vals = arr.reshape(-1)[starts] if d is None else np.take(arr, np.flatnonzero(starts), axis=d)
    return _unique_result(self, vals, inv.reshape(arr.shape) if d is None else inv, cnt, return_inverse, return_counts)

  # ** in place (assign: the same buffer, so TinyJit replays and optimizers see the update) **
  def fill_(self: Tensor, value: Any) -> Tensor:
    """Write `value` (a number or a 0-d tensor) into every element, in place; returns self.

    >>> Tensor.zeros(2).contiguous().realize().fill_(3.0).tolist()
    [3.0, 3.0]
    """
    if hasattr(value, "uop"):
      if value.ndim != 0: raise ShapeError(f"fill_ value must be a number or a 0-d tensor, got shape {value.shape}")
      return self.assign(value.cast(self.dtype).expand(self.shape))
    return self.assign(self.full_like(value))
  def zero_(self: Tensor) -> Tensor:
    """Write 0 into every element, in place; returns self."""
    return self.fill_(0)
  # the results of these ops written into this tensor's buffer, as torch's `op_`
  def absolute_(self: Tensor) -> Tensor: return _write(self, self.absolute(), "absolute_")
  def arccos_(self: Tensor) -> Tensor: return _write(self, self.arccos(), "arccos_")
  def arcsin_(self: Tensor) -> Tensor: return _write(self, self.arcsin(), "arcsin_")
  def arctan_(self: Tensor) -> Tensor: return _write(self, self.arctan(), "arctan_")
  def arccosh_(self: Tensor) -> Tensor: return _write(self, self.arccosh(), "arccosh_")
  def arcsinh_(self: Tensor) -> Tensor: return _write(self, self.arcsinh(), "arcsinh_")
  def arctanh_(self: Tensor) -> Tensor: return _write(self, self.arctanh(), "arctanh_")
  def acos_(self: Tensor) -> Tensor: return _write(self, self.acos(), "acos_")
  def asin_(self: Tensor) -> Tensor: return _write(self, self.asin(), "asin_")
  def atan_(self: Tensor) -> Tensor: return _write(self, self.atan(), "atan_")
  def acosh_(self: Tensor) -> Tensor: return _write(self, self.acosh(), "acosh_")
  def asinh_(self: Tensor) -> Tensor: return _write(self, self.asinh(), "asinh_")
  def atanh_(self: Tensor) -> Tensor: return _write(self, self.atanh(), "atanh_")
  def cos_(self: Tensor) -> Tensor: return _write(self, self.cos(), "cos_")
  def cosh_(self: Tensor) -> Tensor: return _write(self, self.cosh(), "cosh_")
  def sin_(self: Tensor) -> Tensor: return _write(self, self.sin(), "sin_")
  def sinh_(self: Tensor) -> Tensor: return _write(self, self.sinh(), "sinh_")
  def tan_(self: Tensor) -> Tensor: return _write(self, self.tan(), "tan_")
  def erf_(self: Tensor) -> Tensor: return _write(self, self.erf(), "erf_")
  def erfc_(self: Tensor) -> Tensor: return _write(self, self.erfc(), "erfc_")
  def exp2_(self: Tensor) -> Tensor: return _write(self, self.exp2(), "exp2_")
  def expm1_(self: Tensor) -> Tensor: return _write(self, self.expm1(), "expm1_")
  def log10_(self: Tensor) -> Tensor: return _write(self, self.log10(), "log10_")
  def log1p_(self: Tensor) -> Tensor: return _write(self, self.log1p(), "log1p_")
  def log2_(self: Tensor) -> Tensor: return _write(self, self.log2(), "log2_")
  def reciprocal_(self: Tensor) -> Tensor: return _write(self, self.reciprocal(), "reciprocal_")
  def rsqrt_(self: Tensor) -> Tensor: return _write(self, self.rsqrt(), "rsqrt_")
  def sign_(self: Tensor) -> Tensor: return _write(self, self.sign(), "sign_")
  def sgn_(self: Tensor) -> Tensor: return _write(self, self.sgn(), "sgn_")
  def square_(self: Tensor) -> Tensor: return _write(self, self.square(), "square_")
  def trunc_(self: Tensor) -> Tensor: return _write(self, self.trunc(), "trunc_")
  def fix_(self: Tensor) -> Tensor: return _write(self, self.fix(), "fix_")
  def frac_(self: Tensor) -> Tensor: return _write(self, self.frac(), "frac_")
  def negative_(self: Tensor) -> Tensor: return _write(self, self.negative(), "negative_")
  def deg2rad_(self: Tensor) -> Tensor: return _write(self, self.deg2rad(), "deg2rad_")
  def rad2deg_(self: Tensor) -> Tensor: return _write(self, self.rad2deg(), "rad2deg_")
  def sinc_(self: Tensor) -> Tensor: return _write(self, self.sinc(), "sinc_")
  def logical_not_(self: Tensor) -> Tensor: return _write(self, self.logical_not(), "logical_not_")
  def lgamma_(self: Tensor) -> Tensor: return _write(self, self.lgamma(), "lgamma_")
  def digamma_(self: Tensor) -> Tensor: return _write(self, self.digamma(), "digamma_")
  def erfinv_(self: Tensor) -> Tensor: return _write(self, self.erfinv(), "erfinv_")
  def i0_(self: Tensor) -> Tensor: return _write(self, self.i0(), "i0_")
  def bitwise_not_(self: Tensor) -> Tensor: return _write(self, self.bitwise_not(), "bitwise_not_")
  def arctan2_(self: Tensor, other: Any) -> Tensor: return _write(self, self.arctan2(other), "arctan2_")
  def atan2_(self: Tensor, other: Any) -> Tensor: return _write(self, self.atan2(other), "atan2_")
  def hypot_(self: Tensor, other: Any) -> Tensor: return _write(self, self.hypot(other), "hypot_")
  def xlogy_(self: Tensor, other: Any) -> Tensor: return _write(self, self.xlogy(other), "xlogy_")
  def ldexp_(self: Tensor, other: Any) -> Tensor: return _write(self, self.ldexp(other), "ldexp_")
  def gcd_(self: Tensor, other: Any) -> Tensor: return _write(self, self.gcd(other), "gcd_")
  def lcm_(self: Tensor, other: Any) -> Tensor: return _write(self, self.lcm(other), "lcm_")
  def heaviside_(self: Tensor, other: Any) -> Tensor: return _write(self, self.heaviside(other), "heaviside_")
  def remainder_(self: Tensor, other: Any) -> Tensor: return _write(self, self.remainder(other), "remainder_")
  def floor_divide_(self: Tensor, other: Any) -> Tensor: return _write(self, self.floor_divide(other), "floor_divide_")
  def true_divide_(self: Tensor, other: Any) -> Tensor: return _write(self, self.true_divide(other), "true_divide_")
  def multiply_(self: Tensor, other: Any) -> Tensor: return _write(self, self.multiply(other), "multiply_")
  def copysign_(self: Tensor, other: Any) -> Tensor: return _write(self, self.copysign(other), "copysign_")
  def fmod_(self: Tensor, other: Any) -> Tensor: return _write(self, self.fmod(other), "fmod_")
  def logical_and_(self: Tensor, other: Any) -> Tensor: return _write(self, self.logical_and(other), "logical_and_")
  def logical_or_(self: Tensor, other: Any) -> Tensor: return _write(self, self.logical_or(other), "logical_or_")
  def logical_xor_(self: Tensor, other: Any) -> Tensor: return _write(self, self.logical_xor(other), "logical_xor_")
  def bitwise_and_(self: Tensor, other: Any) -> Tensor: return _write(self, self.bitwise_and(other), "bitwise_and_")
  def bitwise_or_(self: Tensor, other: Any) -> Tensor: return _write(self, self.bitwise_or(other), "bitwise_or_")
  def bitwise_xor_(self: Tensor, other: Any) -> Tensor: return _write(self, self.bitwise_xor(other), "bitwise_xor_")
  def float_power_(self: Tensor, other: Any) -> Tensor: return _write(self, self.float_power(other), "float_power_")
  def eq_(self: Tensor, other: Any) -> Tensor: return _write(self, self.eq(other), "eq_")
  def ne_(self: Tensor, other: Any) -> Tensor: return _write(self, self.ne(other), "ne_")
  def lt_(self: Tensor, other: Any) -> Tensor: return _write(self, self.lt(other), "lt_")
  def le_(self: Tensor, other: Any) -> Tensor: return _write(self, self.le(other), "le_")
  def gt_(self: Tensor, other: Any) -> Tensor: return _write(self, self.gt(other), "gt_")
  def ge_(self: Tensor, other: Any) -> Tensor: return _write(self, self.ge(other), "ge_")
  def greater_(self: Tensor, other: Any) -> Tensor: return _write(self, self.greater(other), "greater_")
  def greater_equal_(self: Tensor, other: Any) -> Tensor:
    return _write(self, self.greater_equal(other), "greater_equal_")
  def less_(self: Tensor, other: Any) -> Tensor: return _write(self, self.less(other), "less_")
  def less_equal_(self: Tensor, other: Any) -> Tensor: return _write(self, self.less_equal(other), "less_equal_")
  def not_equal_(self: Tensor, other: Any) -> Tensor: return _write(self, self.not_equal(other), "not_equal_")
  def clamp_min_(self: Tensor, min: Any) -> Tensor: return _write(self, self.clamp_min(min), "clamp_min_")
  def clamp_max_(self: Tensor, max: Any) -> Tensor: return _write(self, self.clamp_max(max), "clamp_max_")
  def subtract_(self: Tensor, other: Any, *, alpha: Any = 1) -> Tensor:
    return _write(self, self.subtract(other, alpha=alpha), "subtract_")
  def divide_(self: Tensor, other: Any, *, rounding_mode: str | None = None) -> Tensor:
    return _write(self, self.divide(other, rounding_mode=rounding_mode), "divide_")
  def logit_(self: Tensor, eps: float | None = None) -> Tensor: return _write(self, self.logit(eps), "logit_")
  def nan_to_num_(self: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    return _write(self, self.nan_to_num(nan, posinf, neginf), "nan_to_num_")
  def addcmul_(self: Tensor, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
    return _write(self, self.addcmul(tensor1, tensor2, value=value), "addcmul_")
  def addcdiv_(self: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: Any = 1) -> Tensor:
    return _write(self, self.addcdiv(tensor1, tensor2, value=value), "addcdiv_")
  def addmm_(self: Tensor, mat1: Tensor, mat2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return _write(self, self.addmm(mat1, mat2, beta=beta, alpha=alpha), "addmm_")
  def baddbmm_(self: Tensor, batch1: Tensor, batch2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return _write(self, self.baddbmm(batch1, batch2, beta=beta, alpha=alpha), "baddbmm_")
  def addmv_(self: Tensor, mat: Tensor, vec: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return _write(self, self.addmv(mat, vec, beta=beta, alpha=alpha), "addmv_")
  def addr_(self: Tensor, vec1: Tensor, vec2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return _write(self, self.addr(vec1, vec2, beta=beta, alpha=alpha), "addr_")
  def index_reduce_(self: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str, *,
                    include_self: bool = True) -> Tensor:
    return _write(self, self.index_reduce(dim, index, source, reduce, include_self=include_self), "index_reduce_")
  def bitwise_left_shift_(self: Tensor, other: Any) -> Tensor:
    return _write(self, self.bitwise_left_shift(other), "bitwise_left_shift_")
  def bitwise_right_shift_(self: Tensor, other: Any) -> Tensor:
    return _write(self, self.bitwise_right_shift(other), "bitwise_right_shift_")
  def nextafter_(self: Tensor, other: Any) -> Tensor: return _write(self, self.nextafter(other), "nextafter_")
  def put_(self: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    return _write(self, self.put(index, source, accumulate), "put_")
  def index_add_(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Any = 1) -> Tensor:
    return _write(self, self.index_add(dim, index, source, alpha=alpha), "index_add_")
  def index_copy_(self: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    return _write(self, self.index_copy(dim, index, source), "index_copy_")
  def index_fill_(self: Tensor, dim: int, index: Tensor, value: Any) -> Tensor:
    return _write(self, self.index_fill(dim, index, value), "index_fill_")
  def masked_scatter_(self: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    return _write(self, self.masked_scatter(mask, source), "masked_scatter_")
  def scatter_(self: Tensor, dim: int, index: Tensor, src: Any, reduce: str | None = None) -> Tensor:
    return _write(self, self.scatter(dim, index, src, reduce=reduce), "scatter_")
  def scatter_add_(self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return _write(self, self.scatter_add(dim, index, src), "scatter_add_")
  def scatter_reduce_(self: Tensor, dim: int, index: Tensor, src: Any, reduce: str,
                      include_self: bool = True) -> Tensor:
    return _write(self, self.scatter_reduce(dim, index, src, reduce, include_self), "scatter_reduce_")
  def tril_(self: Tensor, diagonal: int = 0) -> Tensor: return _write(self, self.tril(diagonal), "tril_")
  def triu_(self: Tensor, diagonal: int = 0) -> Tensor: return _write(self, self.triu(diagonal), "triu_")
  def cumsum_(self: Tensor, dim: int) -> Tensor: return _write(self, self.cumsum(dim), "cumsum_")
  def cumprod_(self: Tensor, dim: int) -> Tensor: return _write(self, self.cumprod(dim), "cumprod_")
  def fill_diagonal_(self: Tensor, fill_value: Any, wrap: bool = False) -> Tensor:
    """Write `fill_value` on the main diagonal (of a matrix, or where all indices are equal for more dims, which must
    then be of one size); `wrap=True` restarts the diagonal of a tall matrix every cols + 1 rows, as torch does.

    >>> Tensor.zeros(2, 3).contiguous().realize().fill_diagonal_(5.0).tolist()
    [[5.0, 0.0, 0.0], [0.0, 5.0, 0.0]]
    """
    from ember.tensor import Tensor
    if self.ndim < 2: raise ShapeError(f"fill_diagonal_ needs at least 2 dims, got shape {self.shape}")
    if self.ndim > 2 and len(set(self.shape)) != 1:
      raise ShapeError(f"fill_diagonal_ of more than 2 dims needs them all of one size, got shape {self.shape}")
    shape = [int_size(s, "fill_diagonal_") for s in self.shape]
    idx = [Tensor.arange(n, device=self.device).reshape(*[n if j == i else 1 for j in range(self.ndim)])
           for i, n in enumerate(shape)]
    rows, cols = shape[0], shape[1]
    if self.ndim == 2 and wrap and rows > cols + 1:
      on = (idx[0] % (cols + 1)) == idx[1]  # the diagonal restarts after a skipped row
    else:
      on = idx[0] == idx[1]
      for i in idx[2:]: on = on & (i == idx[0])
      if self.ndim == 2: on = on & (idx[0] < cols)
    return _write(self, on.where(_new(fill_value, self, self.dtype), self), "fill_diagonal_")

  # ** linear algebra **
  def det(self: Tensor) -> Tensor:
    """The determinant of the (batched) square matrices in the last two dims, by Gaussian elimination with partial
    pivoting (n steps, lazy).

    >>> Tensor([[1.0, 2.0], [3.0, 4.0]]).det().item()
    -2.0
    """
    _need_float(self, "det")
    n = _matrix_dims(self, "det")
    if n == 0: return self.sum((-2, -1)) + 1
    pivots, sign, singular, _ = _eliminate(self, None)
    return singular.where(0, pivots.prod(-1) * sign)
  def slogdet(self: Tensor) -> SignLogAbsDet:
    """(sign, log|det|) of the (batched) square matrices: sign 0 and log|det| -inf for a singular one.

    >>> [round(t.item(), 4) for t in Tensor([[0.0, 2.0], [3.0, 0.0]]).slogdet()]
    [-1.0, 1.7918]
    """
    _need_float(self, "slogdet")
    n = _matrix_dims(self, "slogdet")
    if n == 0: return SignLogAbsDet(self.sum((-2, -1)) + 1, self.sum((-2, -1)))
    pivots, sign, singular, _ = _eliminate(self, None)
    signs = (pivots < 0).cast(dtypes.int32).sum(-1) % 2 == 1
    s = signs.where(-sign, sign)
    logabs = (pivots == 0).where(1, pivots.abs()).log().sum(-1)
    return SignLogAbsDet(singular.where(0, s), singular.where(-math.inf, logabs))
  def logdet(self: Tensor) -> Tensor:
    """log(det): NaN for a negative determinant, -inf for a singular matrix.

    >>> round(Tensor([[2.0, 0.0], [0.0, 3.0]]).logdet().item(), 4)
    1.7918
    """
    sign, logabs = self.slogdet()
    return (sign < 0).where(math.nan, logabs)
  def inverse(self: Tensor) -> Tensor:
    """The inverse of the (batched) square matrices, by Gauss-Jordan elimination with partial pivoting. A singular
    matrix gives inf/NaN entries (torch raises; checking would read the data).

    >>> Tensor([[2.0, 0.0], [0.0, 4.0]]).inverse().tolist()
    [[0.5, 0.0], [0.0, 0.25]]
    """
    from ember.tensor import Tensor
    _need_float(self, "inverse")
    n = _matrix_dims(self, "inverse")
    if n == 0: return self
    eye = Tensor.eye(n, dtype=self.dtype, device=self.device).expand(self.shape)
    _, _, singular, inv = _eliminate(self, eye)
    assert inv is not None
    return singular.unsqueeze(-1).unsqueeze(-1).where(math.nan, inv)
  def cholesky(self: Tensor, upper: bool = False) -> Tensor:
    """The Cholesky factor of (batched) symmetric positive-definite matrices: lower triangular L with L @ L.mT == self
    (`upper=True`: U = L.mT, U.mT @ U == self). Column by column, n steps, lazy; a matrix that is not positive
    definite gives NaN entries (torch raises; checking would read the data).

    >>> Tensor([[4.0, 2.0], [2.0, 5.0]]).cholesky().tolist()
    [[2.0, 0.0], [1.0, 2.0]]
    """
    from ember.tensor import Tensor
    _need_float(self, "cholesky", DTypeNotImplementedError)
    n = _matrix_dims(self, "cholesky")
    idx = Tensor.arange(n, device=self.device, dtype=dtypes.int32)
    rows, cols = idx.reshape(n, 1), idx.reshape(1, n)
    # the lower triangle's values (as LAPACK reads them) with a symmetric gradient (torch's: A is taken as symmetric)
    sym = (self + self.transpose(-2, -1)) * 0.5
    a = (self.tril() + self.tril(-1).transpose(-2, -1)).detach() + (sym - sym.detach())
    low = self.full_like(0.0)
    for j in range(n):
      # column j of A minus what columns 0 .. j-1 of L already give: sum_k L[i, k] L[j, k] (columns >= j still 0)
      v = a[..., :, j] - (low * low[..., j:j + 1, :]).sum(-1)  # (..., n)
      d = v[..., j:j + 1].sqrt()
      col = (rows.reshape(n) > j).where(v / d, (rows.reshape(n) == j).where(d, 0))
      low = (cols == j).where(col.unsqueeze(-1), low).contiguous()
    return low.transpose(-2, -1) if upper else low
  def cholesky_inverse(self: Tensor, upper: bool = False) -> Tensor:
    """The inverse of A from its Cholesky factor self (A = L @ L.mT, or U.mT @ U with `upper=True`)."""
    a = self.transpose(-2, -1).matmul(self) if upper else self.matmul(self.transpose(-2, -1))
    return a.inverse()
  def cholesky_solve(self: Tensor, input2: Tensor, upper: bool = False) -> Tensor:
    """X with A @ X == self, A given by its Cholesky factor `input2` (torch.Tensor.cholesky_solve's order)."""
    _need_float(input2, "cholesky_solve")
    n = _matrix_dims(input2, "cholesky_solve")
    a = input2.transpose(-2, -1).matmul(input2) if upper else input2.matmul(input2.transpose(-2, -1))
    if self.ndim < 2 or self.shape[-2] != n:
      raise ShapeError(f"cholesky_solve: the right-hand side {self.shape} needs {n} rows, as the factor {input2.shape}")
    from ember.tensor import broadcast_shape
    batch = broadcast_shape(a.shape[:-2], self.shape[:-2])
    _, _, singular, x = _eliminate(a.expand(*batch, n, n), self.expand(*batch, *self.shape[-2:]))
    assert x is not None
    return singular.unsqueeze(-1).unsqueeze(-1).where(math.nan, x)
  def matrix_power(self: Tensor, n: int) -> Tensor:
    """The n-th power of the (batched) square matrices, by repeated squaring; n=0 gives identities, n<0 powers of
    the inverse.

    >>> Tensor([[1, 1], [1, 0]]).matrix_power(5).tolist()
    [[8, 5], [5, 3]]
    """
    from ember.tensor import Tensor
    size = _matrix_dims(self, "matrix_power")
    if not isinstance(n, (int, np.integer)): raise DTypeError(f"matrix_power n must be an int, got {n!r}")
    if n == 0:  # identities, with self kept in the graph (a zero gradient, as in torch)
      eye = Tensor.eye(size, dtype=self.dtype, device=self.device).expand(self.shape)
      return self.isnan().where(eye, eye) if dtypes.is_float(self.dtype) else eye
    base = self.inverse() if n < 0 else self
    out: Tensor | None = None
    k = abs(int(n))
    while k:
      if k & 1: out = base if out is None else out.matmul(base)
      k >>= 1
      if k: base = base.matmul(base)
    assert out is not None
    return out

def _placed(t: Tensor, src: Tensor, d: int, start: int, step: int) -> Tensor:
  """t with src's k entries along dim d at positions start, start + step, ... (pads and reshapes, so gradients flow
  to both)."""
  n, k = int_size(t.shape[d], "scatter"), int_size(src.shape[d], "scatter")
  if k == 0: return t
  def spread(x: Tensor) -> Tensor:  # (..., k, ...) -> (..., n, ...), zeros between and around the entries
    x = x.unsqueeze(d + 1).pad(((0, 0),) * (d + 1) + ((0, step - 1),) + ((0, 0),) * (x.ndim - d - 1))
    x = x.reshape(*x.shape[:d], k * step, *x.shape[d + 2:])._slice_dim(d, 0, (k - 1) * step + 1)
    return x.pad(((0, 0),) * d + ((start, n - start - (k - 1) * step - 1),) + ((0, 0),) * (x.ndim - d - 1))
  hit = spread(src.full_like(True, dtype=dtypes.bool))
  return hit.where(spread(src.cast(t.dtype)), t)

def _bessel(x: Tensor, small: tuple[float, ...], large: tuple[float, ...], odd: bool) -> Tensor:
  """I0 (odd=False) or I1 (odd=True) by Abramowitz-Stegun: a polynomial in (x / 3.75)^2 below 3.75 (times x for I1),
  exp(|x|) / sqrt(|x|) times a polynomial in 3.75 / |x| above. exp(|x| / 2) twice: finite as long as the result is."""
  x = x.detach()
  ax = x.abs()
  near = ax < 3.75
  t = near.where(ax, 0) / 3.75
  t2 = t * t
  p: Any = small[0]
  for c in small[1:]: p = p * t2 + c
  if odd: p = p * x
  far = near.where(3.75, ax)  # each branch sees only its own inputs
  u = 3.75 / far
  q: Any = large[0]
  for c in large[1:]: q = q * u + c
  half = (far * 0.5).exp()
  tail = half * q / far.sqrt() * half
  tail = (ax == math.inf).where(math.nan, tail)  # torch's i0(+-inf) is NaN (its Chebyshev form computes inf * 0)
  if odd: tail = x._signbit().where(-tail, tail)
  return near.where(p, tail)

def _sin_pi(x: Tensor) -> Tensor:
  """sin(pi x) from x's distance r to the nearest integer n (exact): (-1)^n sin(pi r). Integers give exactly 0, and
  near them pi r keeps its relative accuracy (pi x rounded to float32 did not: lgamma near a pole lost 5 digits)."""
  n = x.round()
  s = ((x - n) * math.pi).sin()
  return ((n * 0.5).floor() * 2 != n).where(-s, s)

def _cos_pi(x: Tensor) -> Tensor:
  n = x.round()
  c = ((x - n) * math.pi).cos()
  return ((n * 0.5).floor() * 2 != n).where(-c, c)

def _psi_shifted(y: Tensor) -> Tensor:
  """digamma(y) for y >= 0.5: six steps of psi(y) = psi(y + 1) - 1/y, then the asymptotic series (y >= 6)."""
  acc: Any = 0
  for _ in range(6):
    small = y < 6
    acc = acc + small.where(1 / small.where(y, 1), 0)
    y = small.where(y + 1, y)
  inv2 = 1 / (y * y)
  tail = inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 * (1 / 240 - inv2 / 132))))
  return y.log() - 0.5 / y - tail - acc

def _trigamma(x: Tensor) -> Tensor:
  """psi'(x): the recurrence psi'(y) = psi'(y + 1) + 1/y^2 up to y >= 6, the asymptotic series, the reflection
  pi^2 / sin^2(pi x) - psi'(1 - x) below 0.5."""
  x = x.detach()
  neg = x < 0.5
  y = neg.where(1 - x, x)
  acc: Any = 0
  for _ in range(6):
    small = y < 6
    acc = acc + small.where(1 / small.where(y * y, 1), 0)
    y = small.where(y + 1, y)
  inv = 1 / y
  inv2 = inv * inv
  series = inv + inv2 / 2 + inv * inv2 * (1 / 6 - inv2 * (1 / 30 - inv2 * (1 / 42 - inv2 / 30)))
  psi1 = series + acc
  return neg.where(math.pi ** 2 / _sin_pi(x).square() - psi1, psi1)

def _scaled_add(base: Tensor, product: Tensor, beta: Any, alpha: Any) -> Tensor:
  scaled = product if alpha == 1 else product * alpha
  if beta == 0:  # base is ignored (its NaNs too), but stays in the graph with a zero gradient, as in torch
    out = scaled._broadcast_to(tuple(_bshape(base, scaled)))
    return base.isnan()._broadcast_to(out.shape).where(out, out)
  return (base if beta == 1 else base * beta) + scaled

def _bshape(a: Tensor, b: Tensor) -> tuple[Any, ...]:
  from ember.tensor import broadcast_shape
  return broadcast_shape(a.shape, b.shape)

def _even_split(t: Tensor, sections: Any, d: int, op: str) -> tuple[Tensor, ...]:
  if isinstance(sections, (int, np.integer)):
    n = int_size(t.shape[d], op)
    if sections <= 0 or n % sections:
      raise ShapeError(f"{op} cannot split dim {d} of size {n} into {sections} equal sections; pass a divisor of {n} "
                       "or a list of indices")
  return t.tensor_split(sections, d)

def _unique_result(t: Tensor, vals: np.ndarray, inv: np.ndarray, cnt: np.ndarray, return_inverse: bool,
                   return_counts: bool) -> Any:
  dt = strong_dtype(t.dtype)
  values = _new(np.ascontiguousarray(vals), t).cast(dt) if vals.size else _empty(vals.shape, dt, t)
  outs = [values]
  if return_inverse: outs.append(_new(np.ascontiguousarray(inv, dtype=np.int32), t) if inv.size
                                 else _empty(inv.shape, dtypes.int32, t))
  if return_counts: outs.append(_new(np.ascontiguousarray(cnt, dtype=np.int32), t) if cnt.size
                                else _empty(cnt.shape, dtypes.int32, t))
  return outs[0] if len(outs) == 1 else tuple(outs)

def _empty(shape: tuple[int, ...], dt: DType, like: Tensor) -> Tensor:
  from ember.tensor import Tensor
  return Tensor.empty(*shape, dtype=dt, device=like.device)

