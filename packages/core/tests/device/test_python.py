"""The PYTHON device: a numpy interpreter of hand-built linear programs, checked against Python math and numpy."""
from __future__ import annotations
import math
import struct
from typing import Any
import numpy as np
import pytest
from ember.device import python as pydev
from ember.device.base import BufferSpec, Buffer
from ember.device.python import (PythonAllocator, PythonCompiler, PythonDevice, PythonProgram, PythonRenderer,
                                 decode_program)
from ember.dtype import DType, as_const, dtypes
from ember.errors import CompileError, DeviceError, MemoryAccessError
from ember.uop.ops import AxisType, GroupOp, Ops, UOp, exec_alu
from ember.testing.programs import end, param

# ** building and running linear programs **

def host(arr: np.ndarray) -> memoryview:
  """The bytes of a contiguous numpy array, as the runtimes take them (no copy)."""
  return arr.data.cast("B")


def i32(v: int) -> UOp: return UOp.const(dtypes.int32, v)
def acc(init: UOp, acc_id: int = 0) -> UOp: return UOp(Ops.DEFINE_ACC, init.dtype, (init,), acc_id)
def assign(a: UOp, value: UOp) -> UOp: return UOp(Ops.ASSIGN, a.dtype, (a, value))

def linear(*anchors: UOp) -> list[UOp]:
  """The anchors in order, each preceded by those of its sources not placed yet (sources first)."""
  out: list[UOp] = []
  def emit(u: UOp) -> None:
    if u in out: return
    for s in u.src: emit(s)
    out.append(u)
  for a in anchors: emit(a)
  return out

def compile_program(uops: list[UOp], name: str = "test_kernel") -> PythonProgram:
  src = PythonRenderer().render(uops, name)
  return PythonProgram(name, PythonCompiler().compile_cached(src))

def run(uops: list[UOp], *bufs: np.ndarray, vals: tuple[int, ...] = (), name: str = "test_kernel") -> None:
  compile_program(uops, name)(*(host(b) for b in bufs), vals=vals)

# ** an oracle for every dtype, written with Python floats and ints only **

def fp8_values(dt: DType) -> list[float]:
  """Value of each of the 256 codes, from the format definitions (e4m3fn: bias 7, no inf; e5m2: IEEE-like, bias 15)."""
  exp_bits, man_bits = (4, 3) if dt is dtypes.fp8e4m3 else (5, 2)
  bias, out = 2 ** (exp_bits - 1) - 1, []
  for code in range(256):
    sign = -1.0 if code >> 7 else 1.0
    exp, man = (code >> man_bits) & (2 ** exp_bits - 1), code & (2 ** man_bits - 1)
    if dt is dtypes.fp8e4m3 and exp == 15 and man == 7: out.append(math.nan)
    elif dt is dtypes.fp8e5m2 and exp == 31: out.append(sign * math.inf if man == 0 else math.nan)
    elif exp == 0: out.append(sign * man * 2.0 ** (1 - bias - man_bits))
    else: out.append(sign * (1 + man * 2.0 ** -man_bits) * 2.0 ** (exp - bias))
  return out

def fp8_round(x: float, dt: DType) -> float:
  """Nearest fp8 value by brute force over all codes, ties to the even code; e4m3fn saturates, e5m2 overflows to inf."""
  if math.isnan(x): return math.nan
  values = fp8_values(dt)
  if dt is dtypes.fp8e4m3: x = max(-448.0, min(448.0, x))
  elif abs(x) >= 65536.0: return math.copysign(math.inf, x)  # at or past the step after the max: nearest is inf
  candidates = [(abs(v - abs(x)), code & 1, v) for code, v in enumerate(values[:128]) if math.isfinite(v)]
  if dt is dtypes.fp8e5m2: candidates.append((abs(65536.0 - abs(x)), 0, math.inf))  # the step past the max is inf
  return math.copysign(min(candidates)[2], x)

def wrap(v: int, dt: DType) -> int:
  v &= (1 << dt.bitsize) - 1
  return v - (1 << dt.bitsize) if dtypes.is_int(dt) and not dtypes.is_unsigned(dt) and v >> (dt.bitsize - 1) else v

def ref_value(x: Any, dt: DType) -> Any:
  """A Python value as `dt` holds it (C conversion: truncate and wrap ints, round floats to nearest even)."""
  if dt is dtypes.bool: return x != 0
  if dtypes.is_int(dt):
    if isinstance(x, float): x = 0 if not math.isfinite(x) else math.trunc(x)
    return wrap(int(x), dt)
  if dt in dtypes.fp8s: return fp8_round(float(x), dt)
  return as_const(float(x), dt)  # float16/32 via struct, bfloat16 by rounding float32 bits, float64 as is

def encode(values: list[Any], dt: DType) -> np.ndarray:
  """Memory bytes holding `values` (already representable in dt): raw bits for bfloat16/fp8."""
  if dt is dtypes.bfloat16:
    return np.array([struct.unpack("I", struct.pack("f", v))[0] >> 16 for v in values], np.uint16)
  if dt in dtypes.fp8s:
    table = fp8_values(dt)
    def code(v: float) -> int:
      if math.isnan(v): return 0x7F
      return next(c for c, t in enumerate(table) if t == v and math.copysign(1, t) == math.copysign(1, v))
    return np.array([code(v) for v in values], np.uint8)
  return np.array(values, dtype=dt.fmt)

def decode(arr: np.ndarray, dt: DType) -> list[Any]:
  if dt is dtypes.bfloat16: return [struct.unpack("f", struct.pack("I", int(b) << 16))[0] for b in arr]
  if dt in dtypes.fp8s: return [fp8_values(dt)[int(b)] for b in arr]
  return [v.item() for v in arr]

def same(a: Any, b: Any) -> bool:
  if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b): return True
  return a == b and type(a) is type(b)

def assert_same(got: list[Any], want: list[Any], what: str) -> None:
  bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if not same(g, w)]
  assert not bad, f"{what}: first mismatches (index, got, want): {bad[:5]}"

FLOAT_INPUTS = [0.0, -0.0, 1.0, -1.5, 2.5, 0.1, -3.75, 7.0, 100.0, 1e-3, -0.3, 5.5, math.inf, -math.inf, math.nan]

def inputs(dt: DType, seed: int, n: int = 24) -> list[Any]:
  """Edge values and random ones, all representable in dt."""
  rng = np.random.default_rng(seed)
  if dt is dtypes.bool: return [bool(v) for v in rng.integers(0, 2, n)]
  if dtypes.is_int(dt):
    edges = [0, 1, -1, 2, 7, -7, dtypes.min(dt), dtypes.max(dt), dtypes.min(dt) + 1, 3, -3, 100]
    int_type = np.uint64 if dt is dtypes.uint64 else np.int64
    rand = [int(v) for v in rng.integers(dtypes.min(dt), dtypes.max(dt), n, dtype=int_type, endpoint=True)]
    return [ref_value(v, dt) for v in edges + rand]
  rand = [float(v) for v in rng.normal(0, 4, n)]
  return [ref_value(v, dt) for v in FLOAT_INPUTS + rand]

def elementwise(op: Ops, dt: DType, out_dt: DType, operand_dts: list[DType], n: int) -> list[UOp]:
  """out[i] = op(in1[i], in2[i], ...) over one GLOBAL range."""
  out, ins = param(0, out_dt, n), [param(k + 1, d, n) for k, d in enumerate(operand_dts)]
  r = UOp.range(n, 0, AxisType.GLOBAL)
  result = UOp(op, dt, tuple(p.index(r).load() for p in ins))
  return linear(r, out.index(r).store(result), end(r))

def run_alu(op: Ops, dt: DType, columns: list[list[Any]], operand_dts: list[DType]) -> list[Any]:
  n = len(columns[0])
  out_dt = dtypes.bool if op in GroupOp.Comparison else dt
  out = np.zeros(n, np.uint8 if out_dt in dtypes.fp8s else (np.uint16 if out_dt is dtypes.bfloat16 else out_dt.fmt))
  run(elementwise(op, out_dt, out_dt, operand_dts, n), out, *(encode(c, d) for c, d in zip(columns, operand_dts)))
  return decode(out, out_dt)

def ref_alu(op: Ops, dt: DType, operands: tuple[Any, ...]) -> Any:
  """Python semantics of the op (ember's constant folder), rounded by this file's own fp8 oracle."""
  out_dt = dtypes.bool if op in GroupOp.Comparison else dt
  if dt in dtypes.fp8s and out_dt is dt:
    return fp8_round(exec_alu(op, dtypes.float64, tuple(float(x) for x in operands)), dt)
  return exec_alu(op, out_dt, operands)

INT_DTYPES = list(dtypes.ints)
FLOAT_DTYPES = list(dtypes.floats)
INT_BINARY = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ,
              Ops.AND, Ops.OR, Ops.XOR]
FLOAT_BINARY = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]

# ** ALU ops against Python semantics, for every dtype **

@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", INT_BINARY, ids=lambda o: o.name)
def test_int_binary(op: Ops, dt: DType) -> None:
  a, b = inputs(dt, 1), inputs(dt, 2)
  got = run_alu(op, dt, [a, b], [dt, dt])
  assert_same(got, [ref_alu(op, dt, (x, y)) for x, y in zip(a, b)], f"{op} {dt}")

@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", [Ops.SHL, Ops.SHR], ids=lambda o: o.name)
def test_int_shifts(op: Ops, dt: DType) -> None:
  a = inputs(dt, 3)
  shifts = [ref_value(s % dt.bitsize, dt) for s in range(len(a))]
  got = run_alu(op, dt, [a, shifts], [dt, dt])
  assert_same(got, [ref_alu(op, dt, (x, s)) for x, s in zip(a, shifts)], f"{op} {dt}")

@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: d.name)
def test_int_neg_where_mulacc(dt: DType) -> None:
  a, b, c = inputs(dt, 4), inputs(dt, 5), inputs(dt, 6)
  assert_same(run_alu(Ops.NEG, dt, [a], [dt]), [ref_alu(Ops.NEG, dt, (x,)) for x in a], f"NEG {dt}")
  want = [ref_alu(Ops.MULACC, dt, o) for o in zip(a, b, c)]
  assert_same(run_alu(Ops.MULACC, dt, [a, b, c], [dt] * 3), want, "MULACC")
  cond = inputs(dtypes.bool, 7, len(a))
  want = [x if k else y for k, x, y in zip(cond, a, b)]
  assert_same(run_alu(Ops.WHERE, dt, [cond, a, b], [dtypes.bool, dt, dt]), want, "WHERE")

def test_int_division_by_zero_gives_zero_and_min_over_minus_one_wraps() -> None:
  for dt in (dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint32):
    a = [7, -7, 0, dtypes.min(dt), dtypes.min(dt), 5] if not dtypes.is_unsigned(dt) else [7, 9, 0, 1, 2, 5]
    b = [0, 0, 0, 0, -1, 3] if not dtypes.is_unsigned(dt) else [0, 0, 0, 0, 1, 3]
    a, b = [ref_value(x, dt) for x in a], [ref_value(x, dt) for x in b]
    assert_same(run_alu(Ops.IDIV, dt, [a, b], [dt, dt]), [ref_alu(Ops.IDIV, dt, o) for o in zip(a, b)], f"IDIV {dt}")
    assert_same(run_alu(Ops.MOD, dt, [a, b], [dt, dt]), [ref_alu(Ops.MOD, dt, o) for o in zip(a, b)], f"MOD {dt}")

def test_idiv_mod_truncate_toward_zero() -> None:
  a, b = [7, -7, 7, -7, 1, -1], [2, 2, -2, -2, 3, 3]
  assert run_alu(Ops.IDIV, dtypes.int32, [a, b], [dtypes.int32] * 2) == [int(x / y) for x, y in zip(a, b)]
  assert run_alu(Ops.MOD, dtypes.int32, [a, b], [dtypes.int32] * 2) == [int(math.fmod(x, y)) for x, y in zip(a, b)]

@pytest.mark.parametrize("op", [Ops.AND, Ops.OR, Ops.XOR, Ops.CMPNE, Ops.CMPEQ, Ops.CMPLT, Ops.ADD, Ops.MUL, Ops.MAX],
                         ids=lambda o: o.name)
def test_bool_binary(op: Ops) -> None:
  a, b = [False, False, True, True], [False, True, False, True]
  want = [ref_alu(op, dtypes.bool, o) for o in zip(a, b)]
  assert_same(run_alu(op, dtypes.bool, [a, b], [dtypes.bool] * 2), want, str(op))

def test_bool_neg_and_where() -> None:
  a = [False, True]
  want = [ref_alu(Ops.NEG, dtypes.bool, (x,)) for x in a]
  assert_same(run_alu(Ops.NEG, dtypes.bool, [a], [dtypes.bool]), want, "NEG")
  got = run_alu(Ops.WHERE, dtypes.bool, [[True, False], [True, True], [False, False]], [dtypes.bool] * 3)
  assert got == [True, False]

@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", FLOAT_BINARY, ids=lambda o: o.name)
def test_float_binary(op: Ops, dt: DType) -> None:
  a, b = inputs(dt, 8), inputs(dt, 9)
  got = run_alu(op, dt, [a, b], [dt, dt])
  assert_same(got, [ref_alu(op, dt, (x, y)) for x, y in zip(a, b)], f"{op} {dt}")

@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", [Ops.NEG, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC], ids=lambda o: o.name)
def test_float_unary_exact(op: Ops, dt: DType) -> None:
  a = inputs(dt, 10)
  assert_same(run_alu(op, dt, [a], [dt]), [ref_alu(op, dt, (x,)) for x in a], f"{op} {dt}")

@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=lambda d: d.name)
def test_float_ternary(dt: DType) -> None:
  a, b, c = inputs(dt, 11), inputs(dt, 12), inputs(dt, 13)
  cond = inputs(dtypes.bool, 14, len(a))
  got = run_alu(Ops.WHERE, dt, [cond, a, b], [dtypes.bool, dt, dt])
  assert_same(got, [x if k else y for k, x, y in zip(cond, a, b)], f"WHERE {dt}")
  # MULACC rounds the product to dt before adding, like C without contraction
  mul = [ref_alu(Ops.MUL, dt, (x, y)) for x, y in zip(a, b)]
  want = [ref_alu(Ops.ADD, dt, (m, z)) for m, z in zip(mul, c)]
  assert_same(run_alu(Ops.MULACC, dt, [a, b, c], [dt] * 3), want, "MULACC")

@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", [Ops.EXP2, Ops.LOG2, Ops.SIN], ids=lambda o: o.name)
def test_transcendentals(op: Ops, dt: DType) -> None:
  raw = [0.0, -0.0, 0.5, 1.0, -1.0, 3.0, -2.25, 7.5, 0.1, 10.0, 12.0, math.inf, -math.inf, math.nan]
  a = [ref_value(v, dt) for v in raw]
  got = run_alu(op, dt, [a], [dt])
  want = [ref_alu(op, dt, (x,)) for x in a]
  # libm results may differ from Python's float64 math by an ulp of dt; specials (inf, nan, 0) must match exactly
  ulp = {dtypes.float64: 2.0 ** -50, dtypes.float32: 2.0 ** -22, dtypes.float16: 2.0 ** -9, dtypes.bfloat16: 2.0 ** -6,
         dtypes.fp8e5m2: 2.0 ** -1, dtypes.fp8e4m3: 2.0 ** -2}[dt]
  for x, g, w in zip(a, got, want):
    if math.isfinite(w) and w != 0: assert g == pytest.approx(w, rel=ulp, abs=1e-300), f"{op}({x}) in {dt}: {g} != {w}"
    else: assert same(g, w) or (w == 0 and abs(g) < ulp), f"{op}({x}) in {dt}: {g} != {w}"

def test_transcendental_specials_follow_c() -> None:
  dt = dtypes.float32
  assert run_alu(Ops.EXP2, dt, [[math.inf, -math.inf, 200.0]], [dt]) == [math.inf, 0.0, math.inf]
  got = run_alu(Ops.LOG2, dt, [[0.0, -1.0, math.inf, -0.0]], [dt])
  assert got[0] == -math.inf and math.isnan(got[1]) and got[2] == math.inf and got[3] == -math.inf
  assert all(math.isnan(v) for v in run_alu(Ops.SIN, dt, [[math.inf, -math.inf, math.nan]], [dt]))
  got = run_alu(Ops.SQRT, dt, [[-1.0, -0.0]], [dt])
  assert math.isnan(got[0]) and got[1] == 0.0 and math.copysign(1.0, got[1]) == -1.0

def test_max_propagates_nan_from_either_side() -> None:
  for dt in (dtypes.float32, dtypes.float16, dtypes.bfloat16):
    got = run_alu(Ops.MAX, dt, [[math.nan, 1.0, -math.inf], [1.0, math.nan, -1.0]], [dt, dt])
    assert math.isnan(got[0]) and math.isnan(got[1]) and got[2] == -1.0

def test_float_ops_round_to_the_dtype_every_step() -> None:
  # 1 + 2**-9 is not a bfloat16 (7 mantissa bits): it must round back to 1, while float32 keeps it
  small = 2.0 ** -9
  assert run_alu(Ops.ADD, dtypes.bfloat16, [[1.0], [small]], [dtypes.bfloat16] * 2) == [1.0]
  assert run_alu(Ops.ADD, dtypes.float32, [[1.0], [small]], [dtypes.float32] * 2) == [1.0 + small]
  assert run_alu(Ops.ADD, dtypes.float16, [[60000.0], [10000.0]], [dtypes.float16] * 2) == [math.inf]

# ** CAST and BITCAST **

ALL_DTYPES = list(dtypes.all)

@pytest.mark.parametrize("src", ALL_DTYPES, ids=lambda d: d.name)
def test_cast_to_every_dtype(src: DType) -> None:
  if dtypes.is_float(src):
    raw = [0.0, -0.0, 1.5, -2.5, 3.75, 100.25, -1000.0, 448.0, 65504.0, 1e6, -129.5, 300.5, 0.375, math.nan, math.inf,
           -math.inf, 57344.0, 2.0 ** 40, -(2.0 ** 70)]
  elif src is dtypes.bool: raw = [False, True]
  else: raw = [0, 1, -1, 7, -128, 127, 255, 1000, -30000, 65535, 2 ** 31 - 1, -(2 ** 31), 2 ** 40 + 3, 2 ** 63 - 1, 600]
  values = [ref_value(v, src) for v in raw]
  for dst in ALL_DTYPES:
    n = len(values)
    out_store = np.uint8 if dst in dtypes.fp8s else (np.uint16 if dst is dtypes.bfloat16 else dst.fmt)
    out, inp = np.zeros(n, out_store), encode(values, src)
    r = UOp.range(n, 0, AxisType.GLOBAL)
    uops = linear(r, param(0, dst, n).index(r).store(param(1, src, n).index(r).load().cast(dst)), end(r))
    run(uops, out, inp)
    want = []
    for v in values:
      if dtypes.is_float(dst) and not dtypes.is_float(src): v = float(v)
      want.append(ref_value(v, dst))
    assert_same(decode(out, dst), want, f"cast {src.name} -> {dst.name}")

BITCAST_PAIRS = [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32), (dtypes.float32, dtypes.uint32),
                 (dtypes.float16, dtypes.int16), (dtypes.uint16, dtypes.float16), (dtypes.float64, dtypes.int64),
                 (dtypes.int64, dtypes.float64), (dtypes.bfloat16, dtypes.uint16), (dtypes.int16, dtypes.bfloat16),
                 (dtypes.fp8e4m3, dtypes.uint8), (dtypes.uint8, dtypes.fp8e5m2), (dtypes.int8, dtypes.uint8),
                 (dtypes.uint8, dtypes.bool)]

@pytest.mark.parametrize("src,dst", BITCAST_PAIRS, ids=lambda d: d.name)
def test_bitcast(src: DType, dst: DType) -> None:
  values = [ref_value(v, src) for v in ([1.0, -2.5, 0.0, 3.0, -0.0] if dtypes.is_float(src) else [1, 0, 3, 60, 62])]
  n = len(values)
  inp = encode(values, src)
  out = np.zeros(n, inp.dtype)
  r = UOp.range(n, 0, AxisType.GLOBAL)
  run(linear(r, param(0, dst, n).index(r).store(param(1, src, n).index(r).load().bitcast(dst)), end(r)), out, inp)
  if dst is dtypes.bool: assert decode(out, dst) == [v != 0 for v in inp.tolist()]  # any non-zero byte reads as true
  else: assert out.tobytes() == inp.tobytes()  # the bits pass through unchanged

# ** memory: loads, stores, gates and bounds checks **

def test_gated_load_and_store() -> None:
  n = 10
  x = np.arange(n, dtype=np.float32) + 1
  out = np.full(n, -1, np.float32)
  r = UOp.range(n, 0, AxisType.GLOBAL)
  shifted = r + 3
  inside = shifted.lt(n)
  value = param(1, dtypes.float32, n).index(shifted, inside).load()  # x[i+3] if i+3 < n else 0
  store = param(0, dtypes.float32, n).index(r, r.lt(8)).store(value)  # only i < 8 is written
  run(linear(r, store, end(r)), out, x)
  want = np.where(np.arange(n) + 3 < n, np.concatenate([x[3:], np.zeros(3, np.float32)]), 0)
  np.testing.assert_array_equal(out, np.where(np.arange(n) < 8, want, -1))

def test_out_of_bounds_load_raises() -> None:
  x, out = np.ones(8, np.float32), np.zeros(9, np.float32)
  r = UOp.range(9, 0, AxisType.GLOBAL)
  uops = linear(r, param(0, dtypes.float32, 9).index(r).store(param(1, dtypes.float32, 8).index(r).load()), end(r))
  with pytest.raises(MemoryAccessError) as e: run(uops, out, x, name="oob_load")
  msg = str(e.value)
  assert "'oob_load'" in msg and "read" in msg and "slot 1" in msg and "index 8" in msg and "8 elements" in msg

def test_out_of_bounds_store_raises_before_writing() -> None:
  x, out = np.arange(6, dtype=np.int32), np.zeros(4, np.int32)
  r = UOp.range(6, 0, AxisType.GLOBAL)
  uops = linear(r, param(0, dtypes.int32, 4).index(r).store(param(1, dtypes.int32, 6).index(r).load()), end(r))
  with pytest.raises(MemoryAccessError) as e: run(uops, out, x, name="oob_store")
  msg = str(e.value)
  assert "'oob_store'" in msg and "wrote" in msg and "slot 0" in msg and "index 4" in msg and "4 elements" in msg
  assert "2 lane(s)" in msg

def test_negative_index_raises() -> None:
  out = np.zeros(4, np.int32)
  r = UOp.range(4, 0, AxisType.GLOBAL)
  idx = r - 1
  uops = linear(r, param(0, dtypes.int32, 4).index(idx).store(r), end(r))
  with pytest.raises(MemoryAccessError, match="index -1"): run(uops, out)

def test_out_of_bounds_in_sequential_loop_raises() -> None:
  out = np.zeros(3, np.int32)
  r = UOp.range(4, 0, AxisType.REDUCE)
  uops = linear(r, param(0, dtypes.int32, 3).index(r).store(r), end(r))
  with pytest.raises(MemoryAccessError, match="index 3"): run(uops, out)
  np.testing.assert_array_equal(out, [0, 1, 2])  # the loop ran in order until the bad access

def test_gated_out_of_bounds_does_not_raise() -> None:
  x, out = np.arange(4, dtype=np.int32), np.full(8, 9, np.int32)
  r = UOp.range(8, 0, AxisType.GLOBAL)
  load = param(1, dtypes.int32, 4).index(r + 100, r.lt(4)).load()  # every active lane would be out of bounds
  out_buf = param(0, dtypes.int32, 8)
  gated_off_store = out_buf.index(r + 50, UOp.const(dtypes.bool, False)).store(r)
  uops = linear(r, out_buf.index(r).store(load), gated_off_store, end(r))
  with pytest.raises(MemoryAccessError): run(uops, out, x)  # gate true for r < 4 with index r+100: caught
  load = param(1, dtypes.int32, 4).index(r + 100, r.lt(0)).load()  # gate false everywhere: no access, value 0
  uops = linear(r, out_buf.index(r).store(load), gated_off_store, end(r))
  run(uops, out, x)
  np.testing.assert_array_equal(out, np.zeros(8, np.int32))

def test_bounds_are_those_of_the_view_passed() -> None:
  alloc = PythonAllocator()
  base = alloc.alloc(16 * 4)
  view = alloc._offset(base, 4 * 4, 8 * 4)  # elements 8..11 of the base
  r = UOp.range(5, 0, AxisType.GLOBAL)
  uops = linear(r, param(0, dtypes.int32, 4).index(r).store(r), end(r))
  with pytest.raises(MemoryAccessError, match="4 elements"): compile_program(uops)(view)
  r = UOp.range(4, 0, AxisType.GLOBAL)
  compile_program(linear(r, param(0, dtypes.int32, 4).index(r).store(r + 1), end(r)))(view)
  np.testing.assert_array_equal(np.frombuffer(base, np.int32), [0] * 8 + [1, 2, 3, 4] + [0] * 4)

# ** loops: reductions, nesting, per-lane bounds, variables **

def test_row_sum_reduction() -> None:
  rows, cols = 5, 7
  x = np.random.default_rng(0).integers(-100, 100, (rows, cols)).astype(np.int32)
  out = np.zeros(rows, np.int32)
  i, k = UOp.range(rows, 0, AxisType.GLOBAL), UOp.range(cols, 1, AxisType.REDUCE)
  a = acc(i32(0))
  total = assign(a, a + param(1, dtypes.int32, rows * cols).index(i * cols + k).load())
  run(linear(i, a, k, total, end(k), param(0, dtypes.int32, rows).index(i).store(a), end(i)), out, x.reshape(-1))
  np.testing.assert_array_equal(out, x.sum(axis=1))

def test_max_reduction_float() -> None:
  x = np.random.default_rng(1).normal(size=(6, 9)).astype(np.float32)
  x[2, 4] = np.nan
  out = np.zeros(6, np.float32)
  i, k = UOp.range(6, 0, AxisType.GLOBAL), UOp.range(9, 1, AxisType.REDUCE)
  a = acc(UOp.const(dtypes.float32, -math.inf))
  best = assign(a, a.maximum(param(1, dtypes.float32, 54).index(i * 9 + k).load()))
  run(linear(i, a, k, best, end(k), param(0, dtypes.float32, 6).index(i).store(a), end(i)), out, x.reshape(-1))
  np.testing.assert_array_equal(out, x.max(axis=1))  # numpy max also propagates the NaN of row 2

@pytest.mark.parametrize("max_lanes", [pydev.MAX_LANES, 1], ids=["vectorised", "python_loops"])
def test_matmul(max_lanes: int, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(pydev, "MAX_LANES", max_lanes)
  m, k_, n = 4, 6, 5
  rng = np.random.default_rng(2)
  a, b = rng.normal(size=(m, k_)).astype(np.float64), rng.normal(size=(k_, n)).astype(np.float64)
  out = np.zeros(m * n, np.float64)
  i, j, k = UOp.range(m, 0, AxisType.GLOBAL), UOp.range(n, 1, AxisType.LOOP), UOp.range(k_, 2, AxisType.REDUCE)
  s = acc(UOp.const(dtypes.float64, 0.0))
  update = assign(s, UOp(Ops.MULACC, dtypes.float64, (param(1, dtypes.float64, m * k_).index(i * k_ + k).load(),
                                                       param(2, dtypes.float64, k_ * n).index(k * n + j).load(), s)))
  uops = linear(i, j, s, k, update, end(k), param(0, dtypes.float64, m * n).index(i * n + j).store(s), end(j), end(i))
  run(uops, out, a.reshape(-1), b.reshape(-1))
  np.testing.assert_allclose(out.reshape(m, n), a @ b, rtol=1e-12)

def test_accumulator_outside_a_parallel_loop_is_carried() -> None:
  # acc is declared before a LOOP range that updates it: the loop must not be vectorised
  x = np.arange(1, 11, dtype=np.int64)
  out = np.zeros(1, np.int64)
  r = UOp.range(10, 0, AxisType.LOOP)
  a = acc(UOp.const(dtypes.int64, 0))
  update = assign(a, a * 2 + param(1, dtypes.int64, 10).index(r).load())
  run(linear(a, r, update, end(r), param(0, dtypes.int64, 1).index(i32(0)).store(a)), out, x)
  want = 0
  for v in x.tolist(): want = want * 2 + v
  assert out[0] == want

def test_triangular_loops_with_per_lane_ends() -> None:
  n = 6
  out = np.full(n * n, -1, np.int32)
  i = UOp.range(n, 0, AxisType.GLOBAL)
  j = UOp.range(i + 1, 1, AxisType.LOOP)  # j < i+1 differs between the lanes of i
  run(linear(i, j, param(0, dtypes.int32, n * n).index(i * n + j).store(i * 10 + j), end(j), end(i)), out)
  ii, jj = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
  np.testing.assert_array_equal(out.reshape(n, n), np.where(jj <= ii, ii * 10 + jj, -1))

def test_prefix_sum_with_per_lane_reduce_end() -> None:
  n = 9
  x = np.random.default_rng(3).normal(size=n)
  out = np.zeros(n, np.float64)
  i = UOp.range(n, 0, AxisType.GLOBAL)
  k = UOp.range(i + 1, 1, AxisType.REDUCE)
  a = acc(UOp.const(dtypes.float64, 0.0))
  update = assign(a, a + param(1, dtypes.float64, n).index(k).load())
  run(linear(i, a, k, update, end(k), param(0, dtypes.float64, n).index(i).store(a), end(i)), out, x)
  np.testing.assert_allclose(out, np.cumsum(x), rtol=1e-12)

def test_nested_parallel_loops_3d() -> None:
  shape = (3, 4, 5)
  x = np.random.default_rng(4).integers(0, 50, shape).astype(np.int16)
  out = np.zeros(shape[::-1], np.int16)
  r0, r1, r2 = (UOp.range(s, a, AxisType.GLOBAL) for a, s in enumerate(shape))
  src_idx = (r0 * 4 + r1) * 5 + r2
  dst_idx = (r2 * 4 + r1) * 3 + r0
  value = param(1, dtypes.int16, x.size).index(src_idx).load() * UOp.const(dtypes.int16, 3)
  run(linear(r0, r1, r2, param(0, dtypes.int16, x.size).index(dst_idx).store(value), end(r2), end(r1), end(r0)),
      out.reshape(-1), x.reshape(-1))
  np.testing.assert_array_equal(out, (x * 3).transpose(2, 1, 0))

def test_define_var_loop_bound() -> None:
  n = UOp.variable("n", 1, 16)
  x = np.arange(16, dtype=np.float32)
  r = UOp.range(n, 0, AxisType.GLOBAL)
  doubled = param(1, dtypes.float32, 16).index(r).load() * 2.0
  uops = linear(n, r, param(0, dtypes.float32, 16).index(r).store(doubled), end(r))
  prg = compile_program(uops)
  for value in (5, 16):
    out = np.full(16, -1, np.float32)
    prg(host(out), host(x), vals=(value,))
    np.testing.assert_array_equal(out, np.where(np.arange(16) < value, x * 2, -1))
  with pytest.raises(DeviceError, match="outside its range"): prg(host(out), host(x), vals=(17,))
  with pytest.raises(DeviceError, match="1 variable values, got 0"): prg(host(out), host(x))

def test_two_variables_in_list_order() -> None:
  a, b = UOp.variable("a", 0, 100), UOp.variable("b", 0, 100)
  out = np.zeros(1, np.int32)
  uops = linear(a, b, param(0, dtypes.int32, 1).index(i32(0)).store(a * 1000 + b))
  compile_program(uops)(host(out), vals=(12, 34))
  assert out[0] == 12 * 1000 + 34

def test_wait_returns_time_and_empty_loop_runs_nothing() -> None:
  out = np.full(4, 7, np.int32)
  r = UOp.range(0, 0, AxisType.GLOBAL)
  prg = compile_program(linear(r, param(0, dtypes.int32, 4).index(r + 100).store(r), end(r)))
  t = prg(host(out), wait=True)
  assert isinstance(t, float) and t >= 0
  np.testing.assert_array_equal(out, [7, 7, 7, 7])

# ** source text, compiler and program checks **

def test_render_round_trip_keeps_every_uop() -> None:
  n = UOp.variable("n", 1, 8)
  r = UOp.range(n, 3, AxisType.THREAD)
  nan = UOp.const(dtypes.float32, math.nan)
  value = param(1, dtypes.bfloat16, 8).index(r, r.lt(4)).load().cast(dtypes.float32) + nan
  uops = linear(n, r, param(0, dtypes.float32, 8).index(r).store(value), end(r))
  src = PythonRenderer().render(uops, "roundtrip")
  assert src.startswith("# ember-python-v1 roundtrip")
  assert decode_program(src) == uops  # hash-consing: equal programs are the same UOp objects
  assert "for v" in src and "THREAD" in src  # the comments make the listing readable
  assert PythonCompiler().disassemble(PythonCompiler().compile(src)) == src

def test_compiler_rejects_garbage() -> None:
  with pytest.raises(CompileError, match="not a PYTHON program"): PythonCompiler().compile("int main() {}")
  with pytest.raises(CompileError, match="line 2"): PythonCompiler().compile('# ember-python-v1 k\n{"op": "NOPE"}\n')

def test_program_checks() -> None:
  r = UOp.range(4, 0, AxisType.GLOBAL)
  buf = param(0, dtypes.int32, 4)
  with pytest.raises(CompileError, match="never closed"):
    compile_program([r.src[0], r, buf, buf.index(r), buf.index(r).store(r)])
  inner = UOp.range(4, 1, AxisType.LOOP)
  with pytest.raises(CompileError, match="does not close"):
    compile_program(linear(r, inner, buf.index(r).store(inner), end(r), end(inner)))
  leaked = inner * 2
  with pytest.raises(CompileError, match="after the loop"):
    compile_program(linear(r, inner, leaked, end(inner), buf.index(r).store(leaked), end(r)))
  wrong_load = UOp(Ops.LOAD, dtypes.float32, (buf.index(r),))
  with pytest.raises(CompileError, match="loads"):
    compile_program(linear(r, buf.index(r).store(wrong_load.cast(dtypes.int32)), end(r)))
  with pytest.raises(CompileError, match="float-only"):
    compile_program(linear(r, buf.index(r).store(UOp(Ops.SQRT, dtypes.int32, (r,))), end(r)))
  with pytest.raises(DeviceError, match="takes 1 buffers, got 0"):
    compile_program(linear(r, buf.index(r).store(r), end(r)))()

# ** the allocator and the device object **

def test_allocator_copy_and_views() -> None:
  alloc = PythonAllocator()
  handle = alloc.alloc(32)
  data = np.arange(8, dtype=np.float32)
  alloc._copyin(handle, host(data))
  np.frombuffer(alloc._as_buffer(handle), np.float32)[1] = 42.0  # zero-copy: writes are visible
  view = alloc._offset(handle, 8, 4)
  got = np.empty(2, np.float32)
  alloc._copyout(host(got), view)
  np.testing.assert_array_equal(got, [42.0, 2.0])

def test_allocator_external_pointer() -> None:
  backing = np.arange(4, dtype=np.int32)
  handle = PythonAllocator().alloc(16, BufferSpec(external_ptr=backing.ctypes.data))
  np.frombuffer(handle, np.int32)[0] = 99
  assert backing[0] == 99

def test_device_runs_a_kernel_on_its_buffers() -> None:
  dev = PythonDevice("PYTHON")
  assert isinstance(dev.renderer, PythonRenderer) and not dev.renderer.has_threads
  assert GroupOp.ALU <= set(dev.renderer.code_for_op)  # no op is decomposed for PYTHON, EXP2/LOG2/SIN included
  n = 6
  a, b = (dev.allocator.alloc(n * 4) for _ in range(2))
  dev.allocator._copyin(a, host(np.arange(n, dtype=np.float32)))
  r = UOp.range(n, 0, AxisType.GLOBAL)
  x = param(1, dtypes.float32, n).index(r).load()
  uops = linear(r, param(0, dtypes.float32, n).index(r).store(x * x + 1.0), end(r))
  src = dev.renderer.render(uops, "square")
  dev.runtime("square", dev.compiler.compile(src))(b, a)
  out = np.empty(n, np.float32)
  dev.allocator._copyout(host(out), b)
  np.testing.assert_array_equal(out, np.arange(n, dtype=np.float32) ** 2 + 1)

def test_buffer_round_trip_through_the_allocator_contract() -> None:
  # Buffer looks its allocator up in the registry; here we hand it the PYTHON allocator's handle directly
  dev = PythonDevice()
  buf = Buffer("PYTHON", 4, dtypes.int32)
  buf.allocator = dev.allocator  # bypasses the registry, which another module provides
  buf.allocate()
  buf.allocator._copyin(buf._buf, host(np.array([3, 1, 4, 1], np.int32)))
  view = buf.as_buffer()
  assert view is not None
  np.testing.assert_array_equal(np.frombuffer(view, np.int32), [3, 1, 4, 1])
