"""Every ALU op of the linear program, for every dtype, on both CPU renderers, against numpy (torch for bf16/fp8)."""
from __future__ import annotations
import numpy as np
import pytest
from ember.plugin import Ops, dtypes, DType
from cpu_kernels import RENDERERS, EMULATED, alu, as_values, decode, elementwise, encode, np_dtype, run

N = 64
INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
        dtypes.uint64]
FLOATS = [dtypes.float16, dtypes.float32, dtypes.float64, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2]

def c_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """C division: truncate toward zero (numpy's // floors)."""
  q = a // b
  return q + ((a % b != 0) & ((a < 0) != (b < 0))).astype(a.dtype)

INT_OPS = {
  Ops.ADD: (lambda a, b, c, s: alu(Ops.ADD, a, b), lambda a, b, c, s: a + b),
  Ops.SUB: (lambda a, b, c, s: alu(Ops.SUB, a, b), lambda a, b, c, s: a - b),
  Ops.MUL: (lambda a, b, c, s: alu(Ops.MUL, a, b), lambda a, b, c, s: a * b),
  Ops.IDIV: (lambda a, b, c, s: alu(Ops.IDIV, a, b), lambda a, b, c, s: c_div(a, b)),
  Ops.MOD: (lambda a, b, c, s: alu(Ops.MOD, a, b), lambda a, b, c, s: a - c_div(a, b) * b),
  Ops.MAX: (lambda a, b, c, s: alu(Ops.MAX, a, b), lambda a, b, c, s: np.maximum(a, b)),
  Ops.CMPLT: (lambda a, b, c, s: alu(Ops.CMPLT, a, b), lambda a, b, c, s: a < b),
  Ops.CMPNE: (lambda a, b, c, s: alu(Ops.CMPNE, a, c), lambda a, b, c, s: a != c),
  Ops.CMPEQ: (lambda a, b, c, s: alu(Ops.CMPEQ, a, c), lambda a, b, c, s: a == c),
  Ops.AND: (lambda a, b, c, s: alu(Ops.AND, a, b), lambda a, b, c, s: a & b),
  Ops.OR: (lambda a, b, c, s: alu(Ops.OR, a, b), lambda a, b, c, s: a | b),
  Ops.XOR: (lambda a, b, c, s: alu(Ops.XOR, a, b), lambda a, b, c, s: a ^ b),
  Ops.SHL: (lambda a, b, c, s: alu(Ops.SHL, a, s), lambda a, b, c, s: np.left_shift(a, s)),
  Ops.SHR: (lambda a, b, c, s: alu(Ops.SHR, a, s), lambda a, b, c, s: np.right_shift(a, s)),
  Ops.WHERE: (lambda a, b, c, s: alu(Ops.CMPLT, a, b).where(a, c), lambda a, b, c, s: np.where(a < b, a, c)),
  Ops.MULACC: (lambda a, b, c, s: alu(Ops.MULACC, a, b, c), lambda a, b, c, s: a * b + c),
  Ops.NEG: (lambda a, b, c, s: alu(Ops.NEG, a), lambda a, b, c, s: -a),
}

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("dt", INTS, ids=lambda d: d.name)
def test_int_ops(kind: str, dt: DType) -> None:
  rng = np.random.default_rng(dt.priority)
  npdt = np_dtype(dt)
  info = np.iinfo(npdt)
  a = rng.integers(info.min, info.max, N, dtype=npdt, endpoint=True)
  b = rng.integers(info.min, info.max, N, dtype=npdt, endpoint=True)
  a[:4] = [info.min, info.max, 0, 7]
  b[:4] = [3, -5 if info.min < 0 else 5, 9, 2]
  bad = b == 0
  if info.min < 0: bad |= (a == info.min) & (b == -1)
  b[bad] = 3  # no division by 0, no MIN/-1
  c = a.copy()
  c[::3] = b[::3]
  s = rng.integers(0, dt.bitsize, N).astype(npdt)
  outs_dt = [dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt for op in INT_OPS]
  prog = elementwise([f for f, _ in INT_OPS.values()], [dt] * 4, outs_dt, N)
  bufs = [np.zeros(N, np_dtype(o)) for o in outs_dt] + [a, b, c, s]
  got = run(kind, prog, bufs)
  with np.errstate(all="ignore"):
    for k, (op, (_, oracle)) in enumerate(INT_OPS.items()):
      want = np.asarray(oracle(a, b, c, s)).astype(np_dtype(outs_dt[k]))
      np.testing.assert_array_equal(got[k], want, err_msg=f"{op} {dt}")

FLOAT_OPS = {
  Ops.ADD: (lambda a, b, c: alu(Ops.ADD, a, b), lambda a, b, c: a + b),
  Ops.SUB: (lambda a, b, c: alu(Ops.SUB, a, b), lambda a, b, c: a - b),
  Ops.MUL: (lambda a, b, c: alu(Ops.MUL, a, b), lambda a, b, c: a * b),
  Ops.FDIV: (lambda a, b, c: alu(Ops.FDIV, a, b), lambda a, b, c: a / b),
  Ops.MAX: (lambda a, b, c: alu(Ops.MAX, a, b), lambda a, b, c: np.maximum(a, b)),
  Ops.CMPLT: (lambda a, b, c: alu(Ops.CMPLT, a, b), lambda a, b, c: a < b),
  Ops.CMPNE: (lambda a, b, c: alu(Ops.CMPNE, a, c), lambda a, b, c: a != c),
  Ops.CMPEQ: (lambda a, b, c: alu(Ops.CMPEQ, a, c), lambda a, b, c: a == c),
  Ops.WHERE: (lambda a, b, c: alu(Ops.CMPLT, a, b).where(b, c), lambda a, b, c: np.where(a < b, b, c)),
  Ops.MULACC: (lambda a, b, c: alu(Ops.MULACC, a, b, c), lambda a, b, c: a * b + c),
  Ops.NEG: (lambda a, b, c: alu(Ops.NEG, a), lambda a, b, c: -a),
}

def float_inputs(dt: DType, seed: int) -> tuple[np.ndarray, ...]:
  """Random values with NaN, infinities and signed zeros in both operands, as buffer contents of `dt`."""
  rng = np.random.default_rng(seed)
  vals = [rng.normal(0, 4, N).astype(np.float32) for _ in range(3)]
  vals[0][:8] = [np.nan, 1.0, np.inf, -np.inf, 0.0, -0.0, 2.5, np.inf]
  vals[1][:8] = [1.0, np.nan, 3.0, -np.inf, -0.0, 0.0, 0.0, 1.0]
  vals[2][::4] = vals[0][::4]
  if dt in EMULATED: return tuple(encode(v, dt) for v in vals)
  return tuple(v.astype(np_dtype(dt)) for v in vals)

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_float_ops(kind: str, dt: DType) -> None:
  a, b, c = float_inputs(dt, dt.priority)
  outs_dt = [dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt for op in FLOAT_OPS]
  prog = elementwise([f for f, _ in FLOAT_OPS.values()], [dt] * 3, outs_dt, N)
  got = run(kind, prog, [np.zeros(N, np_dtype(o)) for o in outs_dt] + [a, b, c])
  # emulated dtypes compute in float32 and round once, when stored
  va, vb, vc = (as_values(x, dt) for x in (a, b, c))
  with np.errstate(all="ignore"):
    for k, (op, (_, oracle)) in enumerate(FLOAT_OPS.items()):
      want = np.asarray(oracle(va, vb, vc))
      if outs_dt[k] is dt and dt in EMULATED: want = decode(encode(want, dt), dt)
      np.testing.assert_array_equal(as_values(got[k], outs_dt[k]), want, err_msg=f"{op} {dt}")

UNARY_OPS = {
  Ops.EXP2: (np.exp2, 4), Ops.LOG2: (np.log2, 4), Ops.SIN: (np.sin, 4),
  Ops.SQRT: (np.sqrt, 0), Ops.RECIPROCAL: (lambda x: x.dtype.type(1) / x, 0),
  Ops.TRUNC: (np.trunc, 0),
}

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("dt", FLOATS, ids=lambda d: d.name)
def test_unary_ops(kind: str, dt: DType) -> None:
  x = np.random.default_rng(dt.priority).uniform(-8, 8, N).astype(np.float32)
  x[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 0.5, -2.5]
  buf = encode(x, dt) if dt in EMULATED else x.astype(np_dtype(dt))
  prog = elementwise([lambda v, op=op: alu(op, v) for op in UNARY_OPS], [dt], [dt] * len(UNARY_OPS), N)
  got = run(kind, prog, [np.zeros_like(buf) for _ in UNARY_OPS] + [buf])
  # half and the emulated dtypes run these in float32 and round the result once
  compute = np.float64 if dt is dtypes.float64 else np.float32
  xs = as_values(buf, dt).astype(compute)
  with np.errstate(all="ignore"):
    for k, (op, (oracle, ulps)) in enumerate(UNARY_OPS.items()):
      want = np.asarray(oracle(xs), dtype=compute)
      want = decode(encode(want, dt), dt) if dt in EMULATED else want.astype(np_dtype(dt))
      # libm and numpy may differ in the last bit of a transcendental; rounding to a narrow format can amplify that
      rtol = ulps * float(np.finfo(np.float64 if dt is dtypes.float64 else np.float32).eps)
      if dt is dtypes.float16 or dt in EMULATED: rtol = rtol and 2.0 ** -dtypes.finfo(dt)[1]
      np.testing.assert_allclose(as_values(got[k], dt), want, rtol=rtol, atol=0, equal_nan=True, err_msg=f"{op} {dt}")

BOOL_OPS = {
  Ops.AND: (lambda a, b: alu(Ops.AND, a, b), lambda a, b: a & b),
  Ops.OR: (lambda a, b: alu(Ops.OR, a, b), lambda a, b: a | b),
  Ops.XOR: (lambda a, b: alu(Ops.XOR, a, b), lambda a, b: a ^ b),
  Ops.NEG: (lambda a, b: alu(Ops.NEG, a), lambda a, b: ~a),
  Ops.CMPNE: (lambda a, b: alu(Ops.CMPNE, a, b), lambda a, b: a != b),
  Ops.CMPEQ: (lambda a, b: alu(Ops.CMPEQ, a, b), lambda a, b: a == b),
  Ops.CMPLT: (lambda a, b: alu(Ops.CMPLT, a, b), lambda a, b: a < b),
  Ops.MAX: (lambda a, b: alu(Ops.MAX, a, b), lambda a, b: a | b),
  Ops.WHERE: (lambda a, b: a.where(b, alu(Ops.NEG, b)), lambda a, b: np.where(a, b, ~b)),
}

@pytest.mark.parametrize("kind", RENDERERS)
def test_bool_ops(kind: str) -> None:
  a = np.array([False, False, True, True] * 4)
  b = np.array([False, True, False, True] * 4)
  prog = elementwise([f for f, _ in BOOL_OPS.values()], [dtypes.bool] * 2, [dtypes.bool] * len(BOOL_OPS), len(a))
  got = run(kind, prog, [np.zeros_like(a) for _ in BOOL_OPS] + [a, b])
  for k, (op, (_, oracle)) in enumerate(BOOL_OPS.items()):
    np.testing.assert_array_equal(got[k], oracle(a, b), err_msg=str(op))
