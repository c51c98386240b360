"""bfloat16 and fp8 on targets without them: raw bits in memory, float32 in registers.

One rewrite of the linear program serves every renderer whose `Renderer.native_floats` lacks a format (the C-style
and LLVM bases run it first thing in `render`): buffers of the format become buffers of its storage integer (uint16,
uint8), a LOAD converts the bits to float32 and a STORE converts back, a CAST to the format rounds to it and back,
BITCASTs go through the bits, and every other value of the format is a float32. The conversions are integer UOps, so
the renderers print them as ordinary ALU code. Block-shared arrays and accumulators hold the float32 value, like the
registers they come from.

float32 -> bits rounds to nearest even; e4m3fn (`finite_only`) saturates to its max like `ember.dtype.as_const`, the
IEEE-like formats overflow to inf. NaN maps to the format's quiet NaN (the sign kept).
"""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Any
from ember.dtype import DType, PtrDType, dtypes
from ember.renderer import Renderer
from ember.uop.ops import Ops, UOp
from ember.uop.rewrite import PatternMatcher, UPat

EMULATED_FLOATS = frozenset({dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2})

def emulated_floats(renderer: Renderer) -> frozenset[DType]:
  """The formats codegen rewrites for `renderer`: neither native nor refused by it."""
  return EMULATED_FLOATS - renderer.native_floats - renderer.unsupported_dtypes

@dataclass(frozen=True)
class EmulatedFloat:
  """The bit layout of a float stored as raw bits (bfloat16, fp8, and float16 for the JIT's half conversions), and
  the constants of its float32 conversions."""
  exp: int
  man: int
  finite_only: bool
  storage: DType
  @staticmethod
  def of(dt: DType) -> EmulatedFloat:
    exp, man = dtypes.finfo(dt)
    return EmulatedFloat(exp, man, dt is dtypes.fp8e4m3, dtypes.uint16 if dt.itemsize == 2 else dtypes.uint8)
  @property
  def bias(self) -> int: return 2 ** (self.exp - 1) - 1
  @property
  def shift(self) -> int: return 23 - self.man  # float32 mantissa bits dropped
  @property
  def rebias(self) -> int: return (127 - self.bias) << self.man  # exponent offset, in units of the code's lsb
  @property
  def min_normal_bits(self) -> int: return (128 - self.bias) << 23  # float32 bits of the smallest normal value
  @property
  def has_subnormal_path(self) -> bool: return self.bias != 127  # bfloat16 subnormals are float32 subnormals
  @property
  def subnormal_shift_base(self) -> int: return 1 - self.bias + 127 + self.shift
  @property
  def inf_code(self) -> int: return ((1 << self.exp) - 1) << self.man
  @property
  def max_code(self) -> int: return (1 << (self.exp + self.man)) - 2 if self.finite_only else self.inf_code - 1
  @property
  def overflow_code(self) -> int: return self.max_code if self.finite_only else self.inf_code
  @property
  def nan_code(self) -> int:
    return (1 << (self.exp + self.man)) - 1 if self.finite_only else self.inf_code | (1 << (self.man - 1))
  @property
  def sign_shift(self) -> int: return 31 - self.exp - self.man
  @property
  def sign_bit(self) -> int: return 1 << (self.exp + self.man)
  @property
  def subnormal_scale(self) -> float: return 2.0 ** (1 - self.bias - self.man)  # value of the lsb of a subnormal

# ** the conversions, as integer UOps **
# `tag` makes the first node of a conversion (and so all of it) belong to one user: a linear program places it right
# before that user, inside its loop, so no other user (perhaps after the loop) may share it

def _u32(value: int) -> UOp: return UOp.const(dtypes.uint32, value)
def _shl(x: UOp, n: int) -> UOp: return x.alu(Ops.SHL, _u32(n))
def _shr(x: UOp, n: int | UOp) -> UOp: return x.alu(Ops.SHR, n if isinstance(n, UOp) else _u32(n))
def _sub(x: UOp, y: UOp | int) -> UOp: return x.alu(Ops.SUB, y if isinstance(y, UOp) else _u32(y))
def _gt(x: UOp, y: UOp | int) -> UOp: return (y if isinstance(y, UOp) else _u32(y)).lt(x)  # unsigned x > y

def bits_to_float(bits: UOp, fmt: EmulatedFloat, tag: Any = None) -> UOp:
  """A format's raw bits (its storage dtype) -> the float32 value they encode."""
  w = UOp(Ops.CAST, dtypes.uint32, (bits,), tag=tag)
  if not fmt.has_subnormal_path: return _shl(w, 16).bitcast(dtypes.float32)  # bfloat16: the upper half of a float32
  emax, mmax = (1 << fmt.exp) - 1, (1 << fmt.man) - 1
  sign = _shl(w & fmt.sign_bit, fmt.sign_shift)
  e, m = _shr(w, fmt.man) & emax, w & mmax
  normal = sign | _shl(e + (127 - fmt.bias), 23) | _shl(m, fmt.shift)
  if fmt.finite_only: special = (e.eq(_u32(emax)) & m.eq(_u32(mmax))).where(sign | 0x7fc00000, normal)  # NaN, no inf
  else: special = e.eq(_u32(emax)).where(sign | 0x7f800000 | _shl(m, fmt.shift), normal)  # inf and NaN
  subnormal = m.cast(dtypes.float32) * UOp.const(dtypes.float32, fmt.subnormal_scale)
  subnormal = sign.ne(_u32(0)).where(-subnormal, subnormal)
  return e.eq(_u32(0)).where(subnormal, special.bitcast(dtypes.float32))

def float_to_bits(x: UOp, fmt: EmulatedFloat, tag: Any = None) -> UOp:
  """A float32 value -> a format's raw bits (its storage dtype), rounding to nearest even."""
  u = UOp(Ops.BITCAST, dtypes.uint32, (x,), tag=tag)
  a = u & 0x7fffffff
  sign = _shr(u, fmt.sign_shift) & fmt.sign_bit
  # normal: round the float32 bits to the code's lsb (ties to even), rebias, clamp overflow
  rounded = _shr(a + ((1 << (fmt.shift - 1)) - 1) + (_shr(a, fmt.shift) & 1), fmt.shift)
  if fmt.rebias: rounded = _sub(rounded, fmt.rebias)
  code = _gt(rounded, fmt.max_code).where(_u32(fmt.overflow_code), rounded)
  if fmt.has_subnormal_path:  # subnormal: shift the mantissa (implicit bit included) right, to nearest even
    shift = _sub(_u32(fmt.subnormal_shift_base), _shr(a, 23))
    shift = _gt(shift, 25).where(_u32(25), shift)  # also where the subtraction wrapped: a is normal there
    mant = (a & 0x7fffff) | 0x800000
    one, kept = _u32(1).alu(Ops.SHL, shift), _shr(mant, shift)
    rem, half = mant & _sub(one, 1), _shr(one, 1)
    up = _gt(rem, half) | (rem.eq(half) & (kept & 1).ne(_u32(0)))
    code = a.lt(_u32(fmt.min_normal_bits)).where(kept + up.cast(dtypes.uint32), code)
  code = _gt(a, 0x7f800000).where(_u32(fmt.nan_code), code)
  return (code | sign).cast(fmt.storage)

# ** the rewrite **

@dataclass
class _Rewrite:
  """The formats to emulate, what each uop of the program so far became, and the tag of the uop being rewritten."""
  emulated: frozenset[DType]
  done: dict[UOp, UOp] = field(default_factory=dict)
  tag: Any = None
  def srcs(self, x: UOp) -> tuple[UOp, ...]: return tuple(self.done.get(s, s) for s in x.src)
  def value(self, x: UOp) -> UOp: return self.done.get(x, x)

def _storage_ptr(ctx: _Rewrite, x: UOp) -> UOp | None:
  """A buffer (or an INDEX into one) of an emulated format: global memory holds its bits, shared memory float32."""
  if not isinstance(x.dtype, PtrDType) or x.dtype.base not in ctx.emulated: return None
  buf = x.src[0] if x.op is Ops.INDEX else x
  elem = dtypes.float32 if buf.op is Ops.DEFINE_LOCAL else EmulatedFloat.of(x.dtype.base).storage
  return x.replace(dtype=elem.ptr(x.dtype.size), src=ctx.srcs(x))

def _load(ctx: _Rewrite, x: UOp) -> UOp | None:
  if x.dtype not in ctx.emulated: return None
  if x.src[0].src[0].op is Ops.DEFINE_LOCAL: return x.replace(dtype=dtypes.float32, src=ctx.srcs(x))
  fmt = EmulatedFloat.of(x.dtype)
  return bits_to_float(x.replace(dtype=fmt.storage, src=ctx.srcs(x)), fmt, ctx.tag)

def _store(ctx: _Rewrite, x: UOp, idx: UOp, value: UOp) -> UOp | None:
  if value.dtype not in ctx.emulated or idx.src[0].op is Ops.DEFINE_LOCAL: return None
  bits = float_to_bits(ctx.value(value), EmulatedFloat.of(value.dtype), ctx.tag)
  return x.replace(src=(ctx.value(idx), bits, *ctx.srcs(x)[2:]))

def _cast(ctx: _Rewrite, x: UOp) -> UOp | None:
  src = ctx.value(x.src[0])
  if x.dtype not in ctx.emulated:  # a cast from an emulated format is one from float32
    return (src if src.dtype is x.dtype else x.replace(src=(src,))) if x.src[0].dtype in ctx.emulated else None
  fmt = EmulatedFloat.of(x.dtype)  # round to the format, keep computing in float32
  return bits_to_float(float_to_bits(src.cast(dtypes.float32), fmt, ctx.tag), fmt)

def _bitcast(ctx: _Rewrite, x: UOp) -> UOp | None:
  src, dst = x.src[0].dtype, x.dtype
  if (src not in ctx.emulated and dst not in ctx.emulated) or isinstance(dst, PtrDType): return None
  bits = ctx.value(x.src[0])
  if src in ctx.emulated:  # the register holds a float32: its bits are the rounded storage value
    bits = float_to_bits(bits, EmulatedFloat.of(src), ctx.tag)
  if dst not in ctx.emulated: return bits if bits.dtype is dst else bits.bitcast(dst)
  fmt = EmulatedFloat.of(dst)
  return bits_to_float(bits if bits.dtype is fmt.storage else bits.bitcast(fmt.storage), fmt, ctx.tag)

def _to_float32(ctx: _Rewrite, x: UOp) -> UOp | None:
  if x.dtype not in ctx.emulated: return None
  return UOp.const(dtypes.float32, x.arg) if x.op is Ops.CONST else x.replace(dtype=dtypes.float32, src=ctx.srcs(x))

# each rule sees a uop of the original program; ctx.done has what its sources became
pm_emulate_floats = PatternMatcher([
  (UPat((Ops.PARAM, Ops.DEFINE_LOCAL, Ops.INDEX), name="x"), _storage_ptr),  # bf16* -> uint16*
  (UPat(Ops.LOAD, name="x"), _load),  # load(bf16) -> float(load(bits))
  (UPat(Ops.STORE, src=(UPat(Ops.INDEX, name="idx"), UPat.var("value")), allow_any_len=True, name="x"), _store),
  (UPat(Ops.CAST, name="x"), _cast),  # cast(x, bf16) -> float(bits(x)); cast(bf16 x, d) -> cast(float x, d)
  (UPat(Ops.BITCAST, name="x"), _bitcast),  # through the bits
  (UPat(dtype=tuple(EMULATED_FLOATS), name="x"), _to_float32),  # any other value of the format is a float32
])

def emulate_floats(uops: list[UOp], renderer: Renderer) -> list[UOp]:
  """The linear program with the formats `renderer` lacks rewritten (the program itself when it uses none of them):
  each uop's replacement takes its place, after the conversion code it needs."""
  emulated = emulated_floats(renderer)
  def uses(u: UOp) -> bool: return u.dtype in emulated or (isinstance(u.dtype, PtrDType) and u.dtype.base in emulated)
  if not any(uses(u) for u in uops): return uops
  ctx, out, placed = _Rewrite(emulated), [], set()
  for i, u in enumerate(uops):
    ctx.tag = ("emulate", i)
    for n in u.toposort(lambda n: n not in ctx.done):  # u, after the sources the program does not list (CONSTs)
      if n in ctx.done: continue
      new = pm_emulate_floats.rewrite(n, ctx)
      ctx.done[n] = n.replace(src=ctx.srcs(n)) if new is None else new
    for n in ctx.done[u].toposort(lambda n: n not in placed):
      if n in placed: continue
      placed.add(n)
      out.append(n)
  return out
