"""Unary and binary math: exp/log/trig, rounding, sign, isnan, logical ops.

A mixin of `ember.tensor.Tensor`. This module cannot import ember.tensor (which imports it to define Tensor);
ember.tensor hands it `PyBool`, `PyFloat`, `PyInt` ... once Tensor exists (`LATE_NAMES`)."""
from __future__ import annotations
import functools
import math
from typing import TYPE_CHECKING, Any
from ember.dtype import check_scalar_fits, dtypes, least_upper_float, strong_dtype
from ember.errors import DTypeError, ShapeError
from ember.tensor_ops.elementwise import _refuse_zero_divisor
from ember.uop.ops import Ops

if TYPE_CHECKING:
  from ember.tensor import (PyBool, PyFloat, PyInt, Tensor, _const_uop)

LATE_NAMES = ('PyBool', 'PyFloat', 'PyInt', 'Tensor', '_const_uop')

# expm1's Taylor coefficients 1/k!, k = 9 down to 1 (Horner order)
_EXPM1_TAYLOR = tuple(1 / math.factorial(k) for k in range(9, 0, -1))

class MathMixin:
  __slots__ = ()  # Tensor's own slots stay the only instance fields
  # ** unary math **
  def _float_unary(self: Tensor, op: Ops) -> Tensor:
    ft = least_upper_float(self.dtype)
    return self.cast(ft)._alu(op)
  def exp2(self: Tensor) -> Tensor: return self._float_unary(Ops.EXP2)
  def log2(self: Tensor) -> Tensor: return self._float_unary(Ops.LOG2)
  def sin(self: Tensor) -> Tensor: return self._float_unary(Ops.SIN)
  def sqrt(self: Tensor) -> Tensor: return self._float_unary(Ops.SQRT)
  def reciprocal(self: Tensor) -> Tensor: return self._float_unary(Ops.RECIPROCAL)
  def trunc(self: Tensor) -> Tensor:
    return self if dtypes.is_int(self.dtype) or self.dtype is dtypes.bool else self._alu(Ops.TRUNC)
  def exp(self: Tensor) -> Tensor:
    # half types go through float32 as in torch: x * (1 / ln 2) rounded to half moves exp(x) by several ulps
    if self.dtype in (dtypes.float16, dtypes.bfloat16): return self.float().exp().cast(self.dtype)
    if dtypes.is_float(self.dtype): return self.mul(1 / math.log(2)).exp2()
    return self.cast(least_upper_float(self.dtype)).exp()
  def log(self: Tensor) -> Tensor:
    if self.dtype in (dtypes.float16, dtypes.bfloat16): return self.float().log().cast(self.dtype)
    return self.log2().mul(math.log(2))
  def cos(self: Tensor) -> Tensor: return (math.pi / 2 - self.cast(least_upper_float(self.dtype))).sin()
  def tanh(self: Tensor) -> Tensor:
    """Hyperbolic tangent, -expm1(-2|x|) / (2 + expm1(-2|x|)) with x's sign: relative accuracy near 0
    (2 * sigmoid(2x) - 1 gave tanh(1e-8) = 0), and exp never overflows, so no inf reaches the gradient at large |x|.

    >>> round(Tensor([0.5]).tanh().item(), 5)
    0.46212
    """
    if self.dtype in (dtypes.float16, dtypes.bfloat16): return self.float().tanh().cast(self.dtype)
    x = self._float()
    pos = x >= 0
    em = (pos.where(x, -x) * -2).expm1()  # in (-1, 0]; the gradient of |x| through where is 1, also at 0
    t = -em / (em + 2)
    return pos.where(t, -t)
  def sigmoid(self: Tensor) -> Tensor:
    x = self.cast(least_upper_float(self.dtype))
    # with e = exp(-|x|) <= 1: 1 / (1 + e) for x >= 0 and e / (1 + e) below. exp never overflows, so neither the value
    # nor the gradient meets inf * 0 at large |x| (1 / (1 + exp(-x)) gave a NaN gradient at x = -1e3)
    pos = x >= 0
    e = (pos.where(-x, x) * (1 / math.log(2))).exp2()
    return pos.where(1, e) * (1 + e).reciprocal()
  def relu(self: Tensor) -> Tensor:
    """max(x, 0); the gradient is 1 where x > 0 and 0 elsewhere, also at 0 (torch's choice at the kink).

    >>> Tensor([-1.0, 0.0, 2.0]).relu().tolist()
    [0.0, 0.0, 2.0]
    """
    return (self > 0).where(self, self.isnan().where(self.detach(), 0))  # NaN stays NaN
  def abs(self: Tensor) -> Tensor:
    if dtypes.is_unsigned(self.dtype) or self.dtype is dtypes.bool: return self
    # the sign bit, not `< 0`, so that abs(-0.0) is +0.0; at 0 the gradient is 0 (sign(x), as in torch)
    if dtypes.is_float(self.dtype): return (self == 0).where(0, self._signbit().where(-self, self))
    return (self < 0).where(-self, self)
  def floor(self: Tensor) -> Tensor:
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    return (self < t).where(t - 1, t)
  def ceil(self: Tensor) -> Tensor:
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    return (self > t).where(t + 1, t)
  def square(self: Tensor) -> Tensor: return self * self
  def rsqrt(self: Tensor) -> Tensor: return self.sqrt().reciprocal()
  def _float(self: Tensor) -> Tensor: return self.cast(least_upper_float(self.dtype))
  def fmod(self: Tensor, x: Any, reverse: PyBool = False) -> Tensor:
    """C-style remainder: the result has the sign of the dividend (torch.fmod), unlike `%` which follows the divisor.

    >>> Tensor([-3.0, 3.0]).fmod(2).tolist()
    [-1.0, 1.0]
    """
    a, b = self._broadcasted(x, reverse)
    if dtypes.is_int(a.dtype):
      _refuse_zero_divisor(x, reverse, "fmod")
      return a._alu(Ops.MOD, b)
    if a.dtype is dtypes.bool: raise DTypeError("fmod of bool tensors is not supported; cast to int first")
    return a - (a / b).trunc() * b
  def _signbit(self: Tensor) -> Tensor:
    """True where the sign bit is set (so -0.0 and negative NaN count as negative)."""
    if not dtypes.is_float(self.dtype): return self < 0 if not dtypes.is_unsigned(self.dtype) else self != self
    x = self.cast(strong_dtype(self.dtype))
    return x.bitcast({1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[x.dtype.itemsize]) < 0
  def copysign(self: Tensor, x: Any) -> Tensor:
    """The magnitude of self with the sign of `x` (the sign bit, so -0.0 counts as negative).

    >>> Tensor([1.0, -2.0]).copysign(Tensor([-0.0, 3.0])).tolist()
    [-1.0, 2.0]
    """
    a, b = self._broadcasted(x)
    mag = a.abs()
    if dtypes.is_unsigned(a.dtype): return mag
    return b._signbit().where(-mag, mag)
  def log1p(self: Tensor) -> Tensor:
    """log(1 + x), accurate where 1 + x rounds (|x| small): log(w) * x / (w - 1) with w = 1 + x cancels w's rounding
    (Goldberg's correction). The gradient is 1 / (1 + x).

    >>> Tensor([1e-10]).log1p().item()
    1e-10
    """
    if self.dtype in (dtypes.float16, dtypes.bfloat16): return self.float().log1p().cast(self.dtype)
    x = self._float()
    w = x + 1
    naive = w.log()
    corrected = (w == 1).where(x, naive * x / (w - 1))
    # the correction as a constant: the value is corrected's, the gradient log(w)'s; where w is 0, inf or NaN (x at
    # -1, +inf, NaN, or below -1) the plain log is already right
    return (w.isfinite() & (w > 0)).where(naive + (corrected - naive).detach(), naive)
  def expm1(self: Tensor) -> Tensor:
    """exp(x) - 1, accurate near 0 (where exp(x) rounds near 1): its Taylor series to x^9 for |x| < 0.5 (truncation
    below 1e-8 relative), exp(x) - 1 beyond. The gradient is exp(x).

    >>> Tensor([1e-10]).expm1().item()
    1e-10
    """
    if self.dtype in (dtypes.float16, dtypes.bfloat16): return self.float().expm1().cast(self.dtype)
    x = self._float()
    near0 = (x < 0.5) & (x > -0.5)  # (abs's sign-bit select inside this compare kept gcc from vectorising the loop)
    xs = near0.where(x, 0)  # the series only sees small inputs
    series: Any = _EXPM1_TAYLOR[0]
    for c in _EXPM1_TAYLOR[1:]: series = series * xs + c
    return near0.where(series * xs, x.exp() - 1)
  def logaddexp(self: Tensor, x: Any) -> Tensor:
    """log(exp(self) + exp(x)) without overflow.

    >>> round(Tensor([1000.0]).logaddexp(1000.0).item(), 3)
    1000.693
    """
    a, b = self._broadcasted(x)
    a, b = a._float(), b._float()
    # max(a, b) + log1p(exp(-|a - b|)): accurate where the smaller term is below the larger's rounding (softplus(-30) is
    # 9.4e-14, not 0). Equal arguments (both infinite included) add log(2); the gradient is softmax(a, b)
    hi, lo = a.maximum(b), a.minimum(b)
    return hi + (hi == lo).where(0, lo - hi).exp().log1p()
  def lerp(self: Tensor, end: Any, weight: Any) -> Tensor:
    """self + weight * (end - self), evaluated from the nearer end like torch (exact at weight 0 and 1).

    >>> Tensor([0.0, 10.0]).lerp(Tensor([10.0, 20.0]), 0.5).tolist()
    [5.0, 15.0]
    """
    a, b = self._broadcasted(end)
    w = weight if isinstance(weight, Tensor) else Tensor(_const_uop(weight, dtypes.from_py(weight), self.device))
    diff = b - a
    return (w.abs() < 0.5).where(a + w * diff, b - diff * (1 - w))
  def isclose(self: Tensor, other: Any, rtol: PyFloat = 1e-05, atol: PyFloat = 1e-08,
              equal_nan: PyBool = False) -> Tensor:
    """Elementwise |self - other| <= atol + rtol * |other| (torch.isclose, including infinities and `equal_nan`).

    >>> Tensor([1.0, 1.1]).isclose(Tensor([1.0 + 1e-7, 1.0])).tolist()
    [True, False]
    """
    a, b = self._broadcasted(other)
    eq = a == b
    if a.dtype is dtypes.bool: return eq
    af, bf = a._float(), b._float()
    close = eq | (af.isfinite() & bf.isfinite() & ((af - bf).abs() <= atol + rtol * bf.abs()))
    return close | (af.isnan() & bf.isnan()) if equal_nan else close
  def clip(self: Tensor, min_: Any = None, max_: Any = None, *, min: Any = None, max: Any = None) -> Tensor:
    """Clamp values into [min_, max_] (torch's `min=`/`max=` spell the same bounds); either bound may be None or a
    tensor, and they broadcast with self. NaN in self or a bound gives NaN; with min_ > max_ the result is max_
    (torch.clamp). The gradient flows to self where min_ <= x <= max_, to a bound where it is the result.

    >>> Tensor([-2, 0, 5]).clip(-1, 3).tolist()
    [-1, 0, 3]
    >>> Tensor([-2.0, 0.5]).clamp(min=0).tolist()
    [0.0, 0.5]
    """
    lo, hi = (min_ if min is None else min), (max_ if max is None else max)
    if lo is None and hi is None:
      raise ShapeError("clip/clamp needs at least one bound: pass min_ (min=) or max_ (max=), or both")
    for bound in (lo, hi): check_scalar_fits(bound, self.dtype, "clip/clamp")
    ret, bounds = self, []
    if lo is not None:
      a, low = ret._broadcasted(lo)
      ret = (a < low).where(low, a)  # x == min keeps x, so the gradient goes to x there (torch)
      bounds.append(low)
    if hi is not None:
      a, high = ret._broadcasted(hi)
      ret = (a > high).where(high, a)
      bounds.append(high)
    if not dtypes.is_float(ret.dtype): return ret
    # NaN anywhere gives NaN (comparisons with NaN are False, so the wheres above kept x) with no gradient, as torch
    # (not by summing x and the bounds: -inf + inf is NaN too, and clip(-inf, inf) must keep x)
    nan = functools.reduce(lambda acc, t: acc | t.isnan(), bounds, self.isnan()).detach()
    return nan.where(math.nan, ret)
  def clamp(self: Tensor, min_: Any = None, max_: Any = None, *, min: Any = None, max: Any = None) -> Tensor:
    """Alias of `clip`.

    >>> Tensor([0.5, 2.0]).clamp(max=1.0).tolist()
    [0.5, 1.0]
    """
    return self.clip(min_, max_, min=min, max=max)
  def sign(self: Tensor) -> Tensor:
    """-1, 0 or 1 by sign (0 for NaN and -0.0, like torch); the dtype is kept and the gradient is zero.

    >>> Tensor([-3, 0, 2]).sign().tolist()
    [-1, 0, 1]
    """
    if self.dtype is dtypes.bool: return self
    if dtypes.is_unsigned(self.dtype): return (self > 0).cast(self.dtype)
    return (self > 0).where(1, (self < 0).where(-1, 0)).cast(self.dtype)
  def round(self: Tensor, decimals: PyInt = 0) -> Tensor:
    """Round half to even (banker's rounding, like torch.round); `decimals` rounds to that many places.

    >>> Tensor([0.5, 1.5, 2.5, -0.5, 2.6]).round().tolist()
    [0.0, 2.0, 2.0, -0.0, 3.0]
    """
    if not dtypes.is_float(self.dtype): return self
    if decimals != 0: return (self * 10 ** decimals).round() / 10 ** decimals
    f = self.floor()
    d = self - f
    odd = (f * 0.5).floor() * 2 != f
    up = (d > 0.5) | ((d == 0.5) & odd)
    return up.where(f + 1, f).copysign(self)
  def log10(self: Tensor) -> Tensor:
    """Base-10 logarithm.

    >>> Tensor([100.0]).log10().tolist()
    [2.0]
    """
    return self.log2() * math.log10(2)
  def tan(self: Tensor) -> Tensor:
    """Tangent, sin/cos.

    >>> round(Tensor([0.5]).tan().item(), 5)
    0.5463
    """
    return self.sin() / self.cos()
  def atan(self: Tensor) -> Tensor:
    """Arctangent, by argument reduction (1/x for |x| > 1, two half-angle steps) and a Taylor series.

    >>> round(Tensor([1.0]).atan().item(), 5)
    0.7854
    """
    x = self._float()
    ax = x.abs()
    big = ax > 1
    t = big.where(big.where(ax, 1).reciprocal(), ax)
    # atan(t) = 2 * atan(t / (1 + sqrt(1 + t^2))): twice takes |t| <= 1 to <= tan(pi/16) ~ 0.199
    for _ in range(2): t = t / ((t * t + 1).sqrt() + 1)
    t2 = t * t
    series: Any = 1 / 25
    for k in range(11, -1, -1): series = series * t2 + ((-1) ** k) / (2 * k + 1)
    r = series * t * 4
    r = big.where(math.pi / 2 - r, r)
    return x._signbit().where(-r, r)
  def asin(self: Tensor) -> Tensor:
    """Arcsine (NaN outside [-1, 1]).

    >>> round(Tensor([0.5]).asin().item(), 5)
    0.5236
    """
    x = self._float()
    return (x / ((1 - x) * (1 + x)).sqrt()).atan()
  def acos(self: Tensor) -> Tensor:
    """Arccosine, 2 * atan(sqrt((1 - x) / (1 + x))) (accurate near 1).

    >>> round(Tensor([0.5]).acos().item(), 5)
    1.0472
    """
    x = self._float()
    return ((1 - x) / (1 + x)).sqrt().atan() * 2
  def sinh(self: Tensor) -> Tensor:
    """Hyperbolic sine (a short series near 0 keeps relative accuracy).

    >>> round(Tensor([1.0]).sinh().item(), 5)
    1.1752
    """
    x = self._float()
    near0 = x.abs() < 0.5
    # the series only sees small inputs, so the unused branch never feeds inf into the backward pass
    xs = near0.where(x, 0)
    x2 = xs * xs
    small = xs * (1 + x2 / 6 * (1 + x2 / 20 * (1 + x2 / 42 * (1 + x2 / 72))))
    return near0.where(small, (x.exp() - (-x).exp()) / 2)
  def cosh(self: Tensor) -> Tensor:
    """Hyperbolic cosine.

    >>> round(Tensor([1.0]).cosh().item(), 5)
    1.54308
    """
    x = self._float()
    return (x.exp() + (-x).exp()) / 2
  def asinh(self: Tensor) -> Tensor:
    """Inverse hyperbolic sine, sign(x) * log(|x| + sqrt(x^2 + 1)).

    >>> round(Tensor([1.0]).asinh().item(), 5)
    0.88137
    """
    x = self._float()
    neg = x._signbit()
    ax = neg.where(-x, x)  # |x| whose gradient is 1 at +0 (abs's is 0 there: asinh'(0) came out 0, not 1)
    # log1p(|x| + x^2 / (1 + sqrt(1 + x^2))) keeps relative accuracy near 0; past 2^28, sqrt(1 + x^2) is |x| and x^2
    # may overflow: log(2|x|)
    big = ax > 2.0 ** 28
    axs = big.where(0, ax)
    # each branch sees only its own inputs: log(0)'s infinite gradient times where's 0 would be NaN
    r = big.where(big.where(ax, 1).log() + math.log(2), (axs + axs * axs / ((axs * axs + 1).sqrt() + 1)).log1p())
    return neg.where(-r, r)
  def acosh(self: Tensor) -> Tensor:
    """Inverse hyperbolic cosine (NaN below 1).

    >>> round(Tensor([2.0]).acosh().item(), 5)
    1.31696
    """
    x = self._float()
    return (x + ((x - 1) * (x + 1)).sqrt()).log()
  def atanh(self: Tensor) -> Tensor:
    """Inverse hyperbolic tangent, 0.5 * log((1 + x) / (1 - x)) = 0.5 * (log1p(x) - log1p(-x)).

    >>> round(Tensor([0.5]).atanh().item(), 5)
    0.54931
    """
    x = self._float()
    # two log1p: relative accuracy near 0 (the terms have opposite signs, nothing cancels), 1 -+ x exact near +-1, and
    # the gradient 1 / (1 - x^2) is inf at +-1, not inf / inf
    return (x.log1p() - (-x).log1p()) * 0.5
  def erf(self: Tensor) -> Tensor:
    """Gauss error function: a Maclaurin series for |x| < 1, Abramowitz-Stegun 7.1.26 (abs error < 1.5e-7) beyond.

    >>> round(Tensor([1.0]).erf().item(), 5)
    0.8427
    """
    x = self._float()
    ax = x.abs()
    xs = (ax < 1).where(x, 0)
    xs2 = xs * xs
    coef = [((-1) ** n) / (math.factorial(n) * (2 * n + 1)) for n in range(12)]
    series: Any = coef[-1]
    for c in reversed(coef[:-1]): series = series * xs2 + c
    series = series * xs * (2 / math.sqrt(math.pi))
    x2 = x * x
    t = (ax * 0.3275911 + 1).reciprocal()
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    tail = 1 - poly * (-x2).exp()
    return (ax < 1).where(series, x._signbit().where(-tail, tail))
  def isinf(self: Tensor, detect_positive: PyBool = True, detect_negative: PyBool = True) -> Tensor:
    """True at +inf (if `detect_positive`) and -inf (if `detect_negative`).

    >>> Tensor([1.0, float("inf"), -float("inf")]).isinf(detect_negative=False).tolist()
    [False, True, False]
    """
    if not dtypes.is_float(self.dtype): return self.full_like(False, dtype=dtypes.bool)
    pos = (self == math.inf) if detect_positive else self.full_like(False, dtype=dtypes.bool)
    return pos | (self == -math.inf) if detect_negative else pos
  def isnan(self: Tensor) -> Tensor:
    """True where the value is NaN.

    >>> Tensor([1.0, float("nan")]).isnan().tolist()
    [False, True]
    """
    return self != self
  def isfinite(self: Tensor) -> Tensor:
    """True where the value is neither infinite nor NaN.

    >>> Tensor([1.0, float("inf"), float("nan")]).isfinite().tolist()
    [True, False, False]
    """
    return (self.isinf() | self.isnan()).logical_not()
  def logical_and(self: Tensor, x: Any) -> Tensor:
    """Elementwise AND of truth values (nonzero is True).

    >>> Tensor([1, 0, 2]).logical_and(Tensor([1, 1, 0])).tolist()
    [True, False, False]
    """
    a, b = self._broadcasted(x)
    return a.cast(dtypes.bool) & b.cast(dtypes.bool)
  def logical_or(self: Tensor, x: Any) -> Tensor:
    """Elementwise OR of truth values.

    >>> Tensor([1, 0, 0]).logical_or(Tensor([0, 0, 3])).tolist()
    [True, False, True]
    """
    a, b = self._broadcasted(x)
    return a.cast(dtypes.bool) | b.cast(dtypes.bool)
  def logical_xor(self: Tensor, x: Any) -> Tensor:
    """Elementwise XOR of truth values.

    >>> Tensor([1, 0, 1]).logical_xor(Tensor([1, 1, 0])).tolist()
    [False, True, True]
    """
    a, b = self._broadcasted(x)
    return a.cast(dtypes.bool) != b.cast(dtypes.bool)
  def bitwise_not(self: Tensor) -> Tensor:
    """Bitwise NOT of an int tensor (logical NOT for bool), like `~`.

    >>> Tensor([0, 5]).bitwise_not().tolist()
    [-1, -6]
    """
    return ~self
