"""xexp2/xlog2/xsin against numpy, evaluated op by op over numpy arrays with each node's exact dtype."""
from __future__ import annotations
import math
import warnings
from typing import Any, Callable
import numpy as np
import pytest
from ember.dtype import DType, dtypes
from ember.errors import DTypeError
from ember.uop.ops import Ops, UOp
from ember.uop.spec import type_verify
from ember.codegen.transcendental import xexp2, xlog2, xsin, decompose_transcendental

# the numpy oracles are called on inf, nan, zero and negative inputs on purpose
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# the ops every target has; the decompositions may use nothing else
BASIC_OPS = {Ops.PARAM, Ops.CONST, Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.RECIPROCAL, Ops.CMPLT, Ops.CMPNE, Ops.WHERE,
             Ops.TRUNC, Ops.CAST, Ops.BITCAST, Ops.SHL, Ops.SHR, Ops.AND, Ops.OR, Ops.SINK}

NP: dict[Any, Any] = {dtypes.bool: np.bool_, dtypes.int32: np.int32, dtypes.int64: np.int64,
                      dtypes.float16: np.float16, dtypes.float32: np.float32, dtypes.float64: np.float64}

_binary = {Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.FDIV: np.divide, Ops.CMPLT: np.less,
           Ops.CMPNE: np.not_equal, Ops.SHL: np.left_shift, Ops.SHR: np.right_shift, Ops.AND: np.bitwise_and,
           Ops.OR: np.bitwise_or}

def _eval_node(u: UOp, src: list[np.ndarray]) -> np.ndarray:
  out = NP[u.dtype]
  if u.op is Ops.CONST: return np.array(u.arg, dtype=out)
  if u.op in _binary: return _binary[u.op](src[0], src[1])
  if u.op is Ops.WHERE: return np.where(src[0], src[1], src[2])
  if u.op is Ops.TRUNC: return np.trunc(src[0])
  if u.op is Ops.RECIPROCAL: return np.divide(np.array(1, src[0].dtype), src[0])
  if u.op is Ops.CAST: return src[0].astype(out)
  if u.op is Ops.BITCAST: return np.asarray(src[0]).view(out)
  raise AssertionError(f"evaluator has no rule for {u.op}")

def evaluate(out: UOp, inputs: dict[UOp, np.ndarray]) -> np.ndarray:
  """Run a graph elementwise with numpy, one IEEE-rounded op at a time, checking every node's dtype.
  `inputs` maps the leaves (and anything else to stand in for) to arrays."""
  values: dict[UOp, np.ndarray] = {}
  with warnings.catch_warnings(), np.errstate(all="ignore"):
    warnings.simplefilter("ignore")
    for u in out.toposort(gate=lambda node: node not in inputs):
      if u in inputs:
        values[u] = inputs[u]
        continue
      assert u.op in BASIC_OPS, f"{u.op} is not a basic op"
      values[u] = _eval_node(u, [values[s] for s in u.src])
      got = np.asarray(values[u]).dtype
      assert got == NP[u.dtype], f"{u.op} gave {got}, the uop says {u.dtype}"
  return np.asarray(values[out])

def run(fn: Callable[[UOp], UOp], x: np.ndarray, dtype: DType) -> np.ndarray:
  leaf = UOp(Ops.PARAM, dtype, arg=0)
  return evaluate(fn(leaf), {leaf: x.astype(NP[dtype])})

def check(err: np.ndarray, tol: float, x: np.ndarray, got: np.ndarray, want: np.ndarray) -> None:
  i = int(err.argmax())
  assert err[i] <= tol, f"worst {err[i]:.2f} ulp at x={x[i]!r}: got {got[i]!r}, want {want[i]!r}"

def ulp_error(got: np.ndarray, want: np.ndarray, dtype: type) -> np.ndarray:
  """|got - want| in units of the spacing of `dtype` at `want` (the float64 or longdouble oracle); 0 where `got` is
  `want` correctly rounded to `dtype` (that covers infs, overflow and nan), inf where one is nan and the other not."""
  with np.errstate(all="ignore"):
    rounded: np.ndarray = want.astype(dtype)
    spacing = np.spacing(np.minimum(np.abs(rounded), np.finfo(dtype).max)).astype(np.float64)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64)) / spacing
  exact = (got == rounded) | (np.isnan(got) & np.isnan(rounded))
  return np.where(exact, 0.0, np.where(np.isnan(err), np.inf, err))

RNG = np.random.default_rng(1234)

def _random_f32(n: int) -> np.ndarray:
  """Uniform over float32 bit patterns (every exponent equally likely), both signs."""
  return RNG.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)

def _specials(dtype: type) -> np.ndarray:
  fi = np.finfo(dtype)
  vals = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, 0.5, fi.tiny, fi.smallest_subnormal, fi.max, -fi.max,
          float(fi.tiny) / 3, float(fi.eps), 1 - float(fi.epsneg), 1 + float(fi.eps)]
  return np.array(vals, dtype=dtype)

# ** exp2 **

def _exp2_inputs(dtype: type) -> np.ndarray:
  fi = np.finfo(dtype)
  lo, hi = -(fi.maxexp - fi.minexp + fi.nmant) - 3, fi.maxexp + 2  # well past underflow and overflow
  zero_below = -(fi.maxexp - fi.minexp + fi.nmant)  # 2**zero_below is half the least subnormal
  edges = [fi.maxexp - 2**-10, fi.maxexp, zero_below, zero_below + 0.01, zero_below - 0.01, zero_below + 1]
  x = np.concatenate([RNG.uniform(lo, hi, 20000), RNG.uniform(-1, 1, 5000), RNG.uniform(lo, fi.minexp, 5000),
                      np.arange(lo, hi, 0.25), np.arange(-5, 5, 1 / 64), _specials(dtype).astype(np.float64), edges])
  return x.astype(dtype)

@pytest.mark.parametrize("dtype,tol", [(np.float32, 2.0), (np.float64, 4.0)])
def test_exp2_accuracy(dtype: type, tol: float) -> None:
  x = _exp2_inputs(dtype)
  got = run(xexp2, x, dtypes.from_np(dtype))
  want = np.exp2(x.astype(np.longdouble)).astype(np.float64) if dtype is np.float64 else np.exp2(x.astype(np.float64))
  check(ulp_error(got, want, dtype), tol, x, got, want)

def test_exp2_specials() -> None:
  x = np.array([np.inf, -np.inf, np.nan, 128.0, 1000.0, -150.0, -149.0, -149.5, -126.0, 0.0, -0.0, 1e-30], np.float32)
  got = run(xexp2, x, dtypes.float32)
  np.testing.assert_array_equal(got, np.exp2(x.astype(np.float64)).astype(np.float32))

# ** log2 **

def _log2_inputs(dtype: type) -> np.ndarray:
  bits: Any = {np.float32: np.uint32, np.float64: np.uint64}[dtype]  # type: ignore[index]
  nbits = np.dtype(bits).itemsize * 8
  random_bits = RNG.integers(0, 2**63, 30000, dtype=np.uint64) >> np.uint64(64 - nbits)
  positive: np.ndarray = random_bits.astype(bits).view(dtype)  # every positive exponent, subnormals too
  near_one = 1 + RNG.uniform(-1e-3, 1e-3, 5000)
  ulps_from_one = 1 + np.arange(-100, 100) * np.finfo(dtype).eps
  sqrt2 = np.float64(math.sqrt(2)) * np.array([1 - 1e-7, 1, 1 + 1e-7, 0.5, 0.5 + 1e-7])
  return np.concatenate([positive, near_one.astype(dtype), ulps_from_one.astype(dtype), sqrt2.astype(dtype),
                         np.abs(_specials(dtype)), -RNG.uniform(0, 10, 10).astype(dtype), _specials(dtype)])

@pytest.mark.parametrize("dtype,tol", [(np.float32, 2.0), (np.float64, 4.0)])
def test_log2_accuracy(dtype: type, tol: float) -> None:
  x = _log2_inputs(dtype)
  got = run(xlog2, x, dtypes.from_np(dtype))
  want = np.log2(x.astype(np.longdouble)).astype(np.float64) if dtype is np.float64 else np.log2(x.astype(np.float64))
  check(ulp_error(got, want, dtype), tol, x, got, want)

def test_log2_specials() -> None:
  fi = np.finfo(np.float32)
  x = np.array([0.0, -0.0, -1.0, -np.inf, np.inf, np.nan, fi.smallest_subnormal, fi.tiny, 1.0, 8.0, 2.0**-140],
               np.float32)
  got = run(xlog2, x, dtypes.float32)
  np.testing.assert_array_equal(got, np.log2(x.astype(np.float64)).astype(np.float32))

# ** sin **

def _sin_oracle(x: np.ndarray) -> np.ndarray:
  return np.sin(x.astype(np.longdouble)).astype(np.float64)

def test_sin_float32_small_args() -> None:
  x = np.concatenate([RNG.uniform(-1e4, 1e4, 30000), RNG.uniform(-10, 10, 10000), np.arange(-200, 200) * (math.pi / 4),
                      np.array([2.0**-12, 2.0**-13, 2.0**-11, 1e-30, 3e-39, -3e-39])]).astype(np.float32)
  got = run(xsin, x, dtypes.float32)
  want = np.sin(x.astype(np.float64))
  check(ulp_error(got, want, np.float32), 2.0, x, got, want)

def test_sin_float32_near_multiples_of_half_pi() -> None:
  # the hardest inputs for argument reduction: every float32 nearest to k*pi/2 below 1e4, and its two neighbours
  x = (np.arange(1, int(1e4 / (math.pi / 2)) + 1) * (math.pi / 2)).astype(np.float32)
  x = np.concatenate([x, np.nextafter(x, np.float32(0)), np.nextafter(x, np.float32(np.inf))])
  got = run(xsin, x, dtypes.float32)
  want = _sin_oracle(x)
  check(ulp_error(got, want, np.float32), 2.0, x, got, want)

def test_sin_float32_large_args() -> None:
  medium = RNG.uniform(-1e6, 1e6, 20000).astype(np.float32)
  got = run(xsin, medium, dtypes.float32)
  assert np.abs(got - np.sin(medium.astype(np.float64))).max() <= 1e-6
  # every exponent: the reduction is exact, so even huge arguments stay within a couple of ulp
  x = _random_f32(20000)
  x = x[np.isfinite(x)]
  got = run(xsin, x, dtypes.float32)
  want = _sin_oracle(x)
  assert np.abs(got - want).max() <= 2e-7
  check(ulp_error(got, want, np.float32), 2.0, x, got, want)

def test_sin_float64() -> None:
  if np.finfo(np.longdouble).nmant < 60: pytest.skip("float64 sin of huge arguments needs an extended-precision oracle")
  every_exponent = np.ldexp(RNG.uniform(1, 2, 5000), RNG.integers(-60, 1023, 5000))
  x = np.concatenate([RNG.uniform(-1e4, 1e4, 10000), RNG.uniform(-4, 4, 5000), every_exponent,
                      np.arange(-50, 50) * (math.pi / 4)])
  got = run(xsin, x, dtypes.float64)
  want = _sin_oracle(x)
  check(ulp_error(got, want, np.float64), 4.0, x, got, want)

def test_sin_specials() -> None:
  big = np.finfo(np.float32).max
  x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, -1e-45, big, -big], np.float32)
  got = run(xsin, x, dtypes.float32)
  want = np.sin(x.astype(np.float64)).astype(np.float32)
  np.testing.assert_array_equal(got, want)
  assert np.signbit(got[4]) and not np.signbit(got[3])

# ** float16 and the pass **

@pytest.mark.parametrize("fn,ref", [(xexp2, np.exp2), (xlog2, np.log2), (xsin, np.sin)])
def test_float16(fn: Callable[[UOp], UOp], ref: Callable[[np.ndarray], np.ndarray]) -> None:
  x = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)  # every float16
  got = run(fn, x, dtypes.float16)
  assert got.dtype == np.float16
  want = ref(x.astype(np.float64))
  check(ulp_error(got, want, np.float16), 1.0, x, got, want)

def test_decompose_only_missing_ops() -> None:
  # a kernel out[i] = f(in[i]) for each function; the target has SIN natively
  params = [UOp(Ops.PARAM, dtypes.float32.ptr(8), arg=i) for i in range(4)]
  idx = UOp.range(8, 0)
  value = params[3].index(idx).load()
  stores = [p.index(idx).store(value.alu(op)) for p, op in zip(params, (Ops.EXP2, Ops.LOG2, Ops.SIN))]
  sink = UOp(Ops.SINK, dtypes.void, tuple(stores))
  out = decompose_transcendental(sink, {Ops.SIN: None})
  type_verify(out)
  ops = {u.op for u in out.toposort()}
  assert Ops.SIN in ops and Ops.EXP2 not in ops and Ops.LOG2 not in ops
  x = np.array([0.3, 2.5, 100.0, 1e-40], np.float32)
  for store, ref in zip(out.src[:2], (np.exp2, np.log2)):
    got = evaluate(store.src[1], {value: x})
    want = ref(x.astype(np.float64))
    check(ulp_error(got, want, np.float32), 2.0, x, got, want)
  assert decompose_transcendental(sink, {Ops.SIN, Ops.EXP2, Ops.LOG2}) is sink

def test_rejects_weak_dtype() -> None:
  with pytest.raises(DTypeError, match="weakfloat"):
    xsin(UOp(Ops.PARAM, dtypes.weakfloat, arg=0))
