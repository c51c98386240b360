"""EXP2, LOG2 and SIN built from basic ALU ops, for renderers whose `code_for_op` lacks them.

Every function builds a kernel-level UOp graph in the input's dtype (float16, bfloat16 and fp8 compute in float32 and
cast back) from ADD, SUB, MUL, FDIV, CMPLT, CMPNE, WHERE, TRUNC, CAST, BITCAST and SHL/SHR/AND/OR on ints only:

* exp2: split d = q + r with q an integer and |r| <= 1/2, a polynomial for 2**r, then 2**q through the exponent bits
  (in two halves, so results in the subnormal range round once, correctly).
* log2: exponent and mantissa from the bits (subnormals scaled up first), m in [sqrt(1/2), sqrt(2)), then
  log2(m) = 2/ln2 * atanh((m-1)/(m+1)) with the leading terms carried as double-word (hi + lo) values.
* sin: a Payne-Hanek reduction that is exact for every finite input. |x| * 2/pi is formed mod 4 as a sum of exact
  partial products of x's two halves with short pieces of 2/pi; huge x first drop a power of two whose multiples of
  2/pi are known mod 4 (one of a few exponent buckets, picked by WHERE, since kernels have no constant tables).

Special values follow C and numpy: exp2(inf)=inf, exp2(-inf)=0, overflow to inf, underflow to 0; log2(0)=-inf,
log2(x<0)=nan, log2(inf)=inf; sin(+-inf)=nan, sin(-0.0)=-0.0; nan stays nan. The error-free steps (two_sum,
two_prod with bit-mask splitting) stay exact if a compiler contracts a*b+c into FMA, but not under reassociation
(fast-math), which no renderer may enable for these kernels.

All constants (pi, ln2 and the bits of 2/pi) are computed here with integer arithmetic, then rounded to the dtype.
"""
from __future__ import annotations
import functools
import math
import struct
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable
from ember.dtype import DType, dtypes
from ember.errors import DTypeError
from ember.uop.ops import Ops, UOp
from ember.uop.rewrite import PatternMatcher, UPat, graph_rewrite
from ember.codegen.opt import FUSED

# ** exact constants from integer series **

def _arctan_inv(n: int, bits: int, hyperbolic: bool = False) -> int:
  """atan(1/n) (or atanh(1/n)) scaled by 2**bits, truncated term by term (error below a few units)."""
  total, power, k = 0, (1 << bits) // n, 0
  while power:
    term = power // (2 * k + 1)
    total += term if hyperbolic or k % 2 == 0 else -term
    power //= n * n
    k += 1
  return total

@functools.cache
def _pi(bits: int) -> Fraction:
  guard = bits + 64
  # Machin: pi = 16 atan(1/5) - 4 atan(1/239)
  return Fraction(16 * _arctan_inv(5, guard) - 4 * _arctan_inv(239, guard), 1 << guard)

@functools.cache
def _ln2(bits: int) -> Fraction:
  guard = bits + 64
  return Fraction(2 * _arctan_inv(3, guard, hyperbolic=True), 1 << guard)  # ln2 = 2 atanh(1/3)

def _round(value: Fraction, dtype: DType) -> float:
  """`value` rounded to `dtype` (float() of a Fraction rounds correctly; float32 is exact from that float64)."""
  return float(dtype.const(float(value)))

def _split_const(value: Fraction, dtype: DType) -> tuple[float, float]:
  """A constant as a hi + lo pair of dtype values, good to about twice the dtype's precision."""
  hi = _round(value, dtype)
  return hi, _round(value - Fraction(hi), dtype)

# ** float formats **

@dataclass(frozen=True)
class _Format:
  """What the bit tricks need to know about a float dtype."""
  dtype: DType
  int_dtype: DType
  mant: int  # significant bits, implicit one included
  bias: int
  split_clear: int  # low mantissa bits a mask clears to split x into hi (exact products) + lo
  chunk: int  # bits in one piece of 2/pi, so piece * (hi or lo) is exact
  bucket: int  # exponent span of one Payne-Hanek bucket
  sin_tiny: float  # below this |x|, sin(x) rounds to x
  exp2_deg: int
  log2_terms: int
  sin_terms: int
  cos_terms: int
  @property
  def emax(self) -> int: return self.bias
  @property
  def min_normal(self) -> float: return 2.0 ** (1 - self.bias)

_FORMATS = {
  dtypes.float32: _Format(dtypes.float32, dtypes.int32, mant=24, bias=127, split_clear=12, chunk=12, bucket=24,
                          sin_tiny=2.0 ** -12, exp2_deg=7, log2_terms=5, sin_terms=5, cos_terms=5),
  dtypes.float64: _Format(dtypes.float64, dtypes.int64, mant=53, bias=1023, split_clear=27, chunk=26, bucket=64,
                          sin_tiny=2.0 ** -26, exp2_deg=13, log2_terms=11, sin_terms=8, cos_terms=9),
}

def _format_of(d: UOp) -> _Format | None:
  """The format to compute `d` in; None means compute in float32 and cast back."""
  if d.dtype in _FORMATS: return _FORMATS[d.dtype]
  if isinstance(d.dtype, DType) and dtypes.is_float(d.dtype) and not d.dtype.weak and d.dtype.itemsize < 4: return None
  raise DTypeError(f"transcendental decomposition needs a concrete float dtype, got {d.dtype!r}; "
                   "lower weak dtypes (and cast ints to float) before decomposing")

# ** small building blocks **

def _trunc(x: UOp) -> UOp: return x.alu(Ops.TRUNC)
def _sub(a: UOp, b: UOp | float) -> UOp: return a.alu(Ops.SUB, a.ufix(b))
def _neg(x: UOp) -> UOp: return x * -1.0
def _not(cond: UOp) -> UOp: return cond.ne(True)

def _rint(x: UOp) -> UOp:
  """An integer within 1/2 (plus rounding) of x: trunc(x +- 1/2); the callers need no exact tie rule."""
  return _trunc(x + x.lt(0.0).where(x.const_like(-0.5), x.const_like(0.5)))

def _float_bits(v: float, fmt: _Format) -> int:
  """The bits of float `v` in `fmt`, as a signed int of its width."""
  return int.from_bytes(struct.pack("<f" if fmt.dtype.itemsize == 4 else "<d", v), "little", signed=True)

def _poly(x: UOp, coeffs: list[float], fused: bool = False) -> UOp:
  """coeffs[0] + x*coeffs[1] + x**2*coeffs[2] + ... by Horner; `fused`: each step one MULACC that may round once."""
  acc = x.const_like(coeffs[-1])
  for c in reversed(coeffs[:-1]):
    acc = UOp(Ops.MULACC, x.dtype, (acc, x, x.const_like(c)), FUSED) if fused else acc * x + c
  return acc

def _two_sum(a: UOp, b: UOp) -> tuple[UOp, UOp]:
  """s + e == a + b exactly, s = fl(a + b) (Knuth)."""
  s = a + b
  bb = _sub(s, a)
  return s, _sub(a, _sub(s, bb)) + _sub(b, bb)

def _split(x: UOp, fmt: _Format) -> tuple[UOp, UOp]:
  """x = hi + lo exactly, hi the top `mant - split_clear` bits (a bit mask: FMA contraction cannot break it)."""
  mask = x.bitcast(fmt.int_dtype) & UOp.const(fmt.int_dtype, -(1 << fmt.split_clear))
  hi = mask.bitcast(fmt.dtype)
  return hi, _sub(x, hi)

def _two_prod(a: UOp, b: UOp, fmt: _Format) -> tuple[UOp, UOp]:
  """p + e == a * b (exactly for float32; for float64 the lo*lo term rounds, far below the result's precision)."""
  p = a * b
  ah, al = _split(a, fmt)
  bh, bl = _split(b, fmt)
  return p, _sub(ah * bh, p) + ah * bl + al * bh + al * bl

def _in_float32(fn: Callable[[UOp], UOp], d: UOp) -> UOp:
  return fn(d.cast(dtypes.float32)).cast(d.dtype)

# ** exp2 **

@functools.cache
def _exp2_coeffs(fmt: _Format) -> list[float]:
  ln2 = _ln2(200)
  return [_round(ln2 ** n / math.factorial(n), fmt.dtype) for n in range(fmt.exp2_deg + 1)]

def _clamp_magnitude(d: UOp, limit: float, fmt: _Format) -> UOp:
  """d with |d| > limit (infinities included) replaced by +-limit; nan stays nan. Integer ops on the bits, no select:
  with e = bits(limit) - |bits(d)|, the excess -e is taken off where e < 0 and |bits(d)| <= bits(inf) (not nan)."""
  idt, width = fmt.int_dtype, fmt.int_dtype.itemsize * 8
  bits = d.bitcast(idt)
  mag = bits & UOp.const(idt, (1 << (width - 1)) - 1)
  e = _sub(UOp.const(idt, _float_bits(limit, fmt)), mag)
  inf_bits = _float_bits(math.inf, fmt)
  over = (e & _sub(mag, UOp.const(idt, inf_bits + 1))).alu(Ops.SHR, UOp.const(idt, width - 1))  # -1 where replaced
  return (bits + (e & over)).bitcast(fmt.dtype)

def xexp2(d: UOp, fused: bool = False) -> UOp:
  """2**d from basic ALU ops; `fused`: the polynomial's steps are MULACCs that may round once (a fused multiply-add)."""
  if (fmt := _format_of(d)) is None: return _in_float32(functools.partial(xexp2, fused=fused), d)
  # |d| clamped to bias + mant: 2**-(bias + mant), a quarter of the least subnormal, rounds to 0 (so does -inf) and
  # 2**(bias + mant) overflows to inf (so does inf), while the exponent's two halves below stay in the normal range. nan
  # stays in x and reaches the result through r. No select anywhere (the clamp is integer ops on the bits): a select
  # stays scalar in the CPU renderer's vector code, and gcc turned the two nested clamps into six masked compares and
  # blends per half vector, a third of a softmax's time
  x = _clamp_magnitude(d, float(fmt.bias + fmt.mant), fmt)
  # q = round(x) by the magic add: 1.5 * 2**(mant-1) + x has no fraction bits left (|x| <= bias + mant is far below
  # 2**(mant-2)), so the add rounds x to an integer and the subtraction is exact; q as an int is the difference of the
  # sum's bits and the magic's bits. No float-to-int conversion (undefined for nan in C)
  magic = x.const_like(1.5 * 2.0 ** (fmt.mant - 1))
  t = x + magic
  r = _sub(x, _sub(t, magic))  # exact, |r| <= 1/2 (nan for nan)
  # 2**q in two factors, 2**floor(q/2) and 2**(q - floor(q/2)), so a result in the subnormal range rounds once. With
  # both biases folded into the magic's bits: kb = q + 2*bias, kb >> 1 = floor(q/2) + bias, kb - that = the rest + bias
  idt, shift = fmt.int_dtype, UOp.const(fmt.int_dtype, fmt.mant - 1)
  kb = _sub(t.bitcast(idt), UOp.const(idt, _float_bits(magic.arg, fmt) - 2 * fmt.bias))
  half = kb.alu(Ops.SHR, UOp.const(idt, 1))
  p1, p2 = half.alu(Ops.SHL, shift).bitcast(fmt.dtype), _sub(kb, half).alu(Ops.SHL, shift).bitcast(fmt.dtype)
  return _poly(r, _exp2_coeffs(fmt), fused) * p1 * p2

# ** log2 **

def xlog2(d: UOp) -> UOp:
  """log2(d) from basic ALU ops."""
  if (fmt := _format_of(d)) is None: return _in_float32(xlog2, d)
  idt = fmt.int_dtype
  x = d.gt(0.0).where(d.lt(math.inf).where(d, d.const_like(1.0)), d.const_like(1.0))  # specials compute on 1
  subnormal = x.lt(fmt.min_normal)
  x = subnormal.where(x * 2.0 ** fmt.mant, x)
  bits = x.bitcast(idt)
  mant_mask = (1 << (fmt.mant - 1)) - 1
  m = ((bits & UOp.const(idt, mant_mask)) | UOp.const(idt, fmt.bias << (fmt.mant - 1))).bitcast(fmt.dtype)  # [1, 2)
  e = _sub(bits.alu(Ops.SHR, UOp.const(idt, fmt.mant - 1)).cast(fmt.dtype), float(fmt.bias))
  e = subnormal.where(_sub(e, float(fmt.mant)), e)
  big = m.gt(math.sqrt(2.0))
  m = big.where(m * 0.5, m)
  e = big.where(e + 1.0, e)
  # t = (m-1)/(m+1) as th + tl; m-1 is exact
  num = _sub(m, 1.0)
  den_hi, den_lo = _two_sum(m, m.const_like(1.0))
  inv = m.const_like(1.0) / den_hi
  t_hi = num * inv
  p_hi, p_lo = _two_prod(t_hi, den_hi, fmt)
  t_lo = _sub(_sub(_sub(num, p_hi), p_lo), t_hi * den_lo) * inv
  # log2(m) = K*t + K*t*(t^2/3 + t^4/5 + ...), K = 2/ln2 as k_hi + k_lo
  k_hi, k_lo = _split_const(2 / _ln2(200), fmt.dtype)
  main_hi, main_lo = _two_prod(t_hi, m.const_like(k_hi), fmt)
  t2 = t_hi * t_hi
  series = _poly(t2, [1.0 / (2 * k + 3) for k in range(fmt.log2_terms)]) * t2
  low = main_lo + (t_hi * k_lo + t_lo * k_hi) + main_hi * series
  s, err = _two_sum(e, main_hi)
  ret = s + (err + low)
  ret = d.lt(math.inf).where(ret, d.const_like(math.inf))
  ret = d.ne(0.0).where(ret, d.const_like(-math.inf))
  return d.lt(0.0).where(d.const_like(math.nan), d.ne(d).where(d.const_like(math.nan), ret))

# ** sin **

@dataclass(frozen=True)
class _Reduction:
  """Payne-Hanek data for one format: per exponent bucket, the scale 2**-(bucket*b) and 2/pi * 2**(bucket*b) mod 4
  as `chunk`-bit pieces (each exact in a product with either half of x) plus one rounded tail."""
  thresholds: tuple[int, ...]  # biased exponent where bucket b (b >= 1) starts
  scales: tuple[float, ...]
  pieces: tuple[tuple[float, ...], ...]  # [bucket][piece]
  tails: tuple[float, ...]

@functools.cache
def _reduction(fmt: _Format) -> _Reduction:
  # bucket b >= 1 holds x with exponent >= b*bucket + mant - 1, so x' = x * 2**-(b*bucket) is an integer below
  # 2**(bucket + mant - 1) and x * 2/pi = x' * (2**(b*bucket) * 2/pi mod 4) mod 4
  top = fmt.bucket + fmt.mant - 1
  nbuckets = (fmt.emax - (fmt.mant - 1)) // fmt.bucket + 1
  # fraction bits of 2/pi needed: x' < 2**top, and about mant + 20 bits of the reduced argument must be right
  frac_bits = top + fmt.mant + 20
  npieces = -(-(frac_bits + 2) // fmt.chunk)
  total_bits = (nbuckets - 1) * fmt.bucket + npieces * fmt.chunk + 2 * fmt.mant + 64
  two_over_pi = 2 / _pi(total_bits)
  pieces, tails, scales, thresholds = [], [], [], []
  for b in range(nbuckets):
    value = (two_over_pi * 2 ** (b * fmt.bucket)) % 4
    fixed = value * 2 ** (npieces * fmt.chunk - 2)
    whole = fixed.numerator // fixed.denominator
    chunks = [(whole >> (fmt.chunk * (npieces - 1 - i))) & ((1 << fmt.chunk) - 1) for i in range(npieces)]
    pieces.append(tuple(float(Fraction(c, 2 ** (fmt.chunk * (i + 1) - 2))) for i, c in enumerate(chunks)))
    tails.append(_round((fixed - whole) / 2 ** (npieces * fmt.chunk - 2), fmt.dtype))
    scales.append(2.0 ** -(b * fmt.bucket))
    if b: thresholds.append(b * fmt.bucket + fmt.mant - 1 + fmt.bias)
  return _Reduction(tuple(thresholds), tuple(scales), tuple(pieces), tuple(tails))

def _mod4(x: UOp) -> UOp:
  """x mod 4 for x >= 0, exact: x - 4*trunc(x/4) is representable whenever x has a fractional part below 4."""
  return _sub(x, _trunc(x * 0.25) * 4.0)

def _pick(bucket_of: list[UOp], values: tuple[float, ...], like: UOp) -> UOp:
  """values[b] for the bucket b that `bucket_of` (the tests 'bucket >= 1', 'bucket >= 2', ...) selects."""
  ret = like.const_like(values[0])
  for cond, v in zip(bucket_of, values[1:]): ret = cond.where(like.const_like(v), ret)
  return ret

def _quadrant_and_fraction(a: UOp, fmt: _Format) -> tuple[UOp, UOp, UOp]:
  """For finite a >= 0: (k, fh, fl) with a*2/pi = k + fh + fl (mod 4), k in 0..3 an int, |fh + fl| <= 1/2 (about)."""
  red = _reduction(fmt)
  ebits = a.bitcast(fmt.int_dtype).alu(Ops.SHR, UOp.const(fmt.int_dtype, fmt.mant - 1))
  bucket_of = [_not(ebits.lt(UOp.const(fmt.int_dtype, t))) for t in red.thresholds]
  xs = a * _pick(bucket_of, red.scales, a)  # exact: a power of two, the result stays normal
  xh, xl = _split(xs, fmt)
  top = fmt.bucket + fmt.mant - 1  # xs < 2**top
  # exact partial products, each with a bound on its size
  terms: list[tuple[float, UOp]] = []
  for i in range(len(red.pieces[0])):
    g = _pick(bucket_of, tuple(p[i] for p in red.pieces), a)
    piece_top = 2 - fmt.chunk * i  # piece i < 2**piece_top
    terms.append((2.0 ** (top + piece_top), xh * g))
    terms.append((2.0 ** (top + piece_top - (fmt.mant - fmt.split_clear) + 1), xl * g))
  # the rest of 2/pi, rounded: its product is far below the reduced argument's precision
  terms.append((2.0 ** (top + 2 - fmt.chunk * len(red.pieces[0])), xs * _pick(bucket_of, red.tails, a)))
  terms.sort(key=lambda t: -t[0])
  # sum mod 4: big terms through two_sum into s (kept in [0, 4)), small ones straight into lo
  small = 2.0 ** (3 - fmt.mant)
  s = a.const_like(0.0)
  lo = a.const_like(0.0)
  for bound, t in terms:
    if bound <= small:
      lo = lo + t
      continue
    if bound > 4.0: t = _mod4(t)
    s, err = _two_sum(s, t)
    s = _mod4(s)
    lo = lo + err
  q = _rint(s)
  fh, fl = _two_sum(_sub(s, q), lo)
  return q.cast(dtypes.int32) & UOp.const(dtypes.int32, 3), fh, fl

@functools.cache
def _sin_coeffs(fmt: _Format) -> tuple[list[float], list[float]]:
  """Taylor coefficients in r**2 of (sin(r)/r - 1)/r**2 and (cos(r) - 1 + r**2/2)/r**4."""
  sin_c = [_round(Fraction((-1) ** (k + 1), math.factorial(2 * k + 3)), fmt.dtype) for k in range(fmt.sin_terms)]
  cos_c = [_round(Fraction((-1) ** k, math.factorial(2 * k + 4)), fmt.dtype) for k in range(fmt.cos_terms)]
  return sin_c, cos_c

def xsin(d: UOp) -> UOp:
  """sin(d) from basic ALU ops, accurate for every finite input (exact Payne-Hanek argument reduction)."""
  if (fmt := _format_of(d)) is None: return _in_float32(xsin, d)
  negative = d.lt(0.0)
  a = negative.where(_neg(d), d)
  a = a.lt(math.inf).where(a, a.const_like(0.0))  # inf and nan compute on 0
  k, fh, fl = _quadrant_and_fraction(a, fmt)
  # r = (fh + fl) * pi/2 as rh + rl
  p_hi, p_lo = _split_const(_pi(200) / 2, fmt.dtype)
  rh, rl = _two_prod(fh, a.const_like(p_hi), fmt)
  rl = rl + (fh * p_lo + fl * p_hi)
  r2 = rh * rh
  sin_c, cos_c = _sin_coeffs(fmt)
  # sin(rh + rl) ~ rh + rl*(1 - r2/2) + rh*r2*S(r2);  cos(rh + rl) ~ 1 - r2/2 + r2*r2*C(r2) - rh*rl
  sin_r = rh + (_sub(rl, rl * r2 * 0.5) + rh * r2 * _poly(r2, sin_c))
  cos_r = a.const_like(1.0) + _sub(r2 * _sub(_poly(r2, cos_c) * r2, 0.5), rh * rl)
  ret = (k & UOp.const(dtypes.int32, 1)).ne(0).where(cos_r, sin_r)
  ret = (k & UOp.const(dtypes.int32, 2)).ne(0).where(_neg(ret), ret)
  ret = negative.where(_neg(ret), ret)
  ret = a.lt(fmt.sin_tiny).where(d, ret)  # also keeps -0.0 and subnormals exact
  return d.lt(math.inf).where(d.gt(-math.inf).where(ret, d.const_like(math.nan)), d.const_like(math.nan))

# ** the rewrite pass **

_FLOATS = tuple(dtypes.floats)

# ctx: the ops the target computes natively (a renderer's `code_for_op` keys); the others become basic ALU ops
pm_transcendental = PatternMatcher([
  (UPat(Ops.EXP2, dtype=_FLOATS, src=(UPat.var("d"),)),
   lambda ctx, d: None if Ops.EXP2 in ctx else xexp2(d, fused=Ops.MULACC in ctx)),  # 2**d
  (UPat(Ops.LOG2, dtype=_FLOATS, src=(UPat.var("d"),)), lambda ctx, d: None if Ops.LOG2 in ctx else xlog2(d)),  # log2 d
  (UPat(Ops.SIN, dtype=_FLOATS, src=(UPat.var("d"),)), lambda ctx, d: None if Ops.SIN in ctx else xsin(d)),  # sin d
])

def decompose_transcendental(sink: UOp, native: set[Ops] | frozenset[Ops] | dict[Ops, object]) -> UOp:
  """Rewrite the EXP2/LOG2/SIN nodes under `sink` that are not in `native` into basic ALU ops."""
  return graph_rewrite(sink, pm_transcendental, ctx=native, name="decompose transcendental")
