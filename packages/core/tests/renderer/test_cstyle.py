"""The C-style renderer base, checked on the text it prints (no compiler needed)."""
from __future__ import annotations
import math
import re
import struct
import numpy as np
import pytest
from ember.dtype import dtypes
from ember.errors import CompileError
from ember.renderer.emulate import EmulatedFloat
from ember.renderer.cstyle import CStyleLanguage, float32_literal, var_name
from ember.uop.ops import AxisType, Ops, UOp
from ember.uop.rewrite import PatternMatcher, UPat
from ember.testing.programs import end, linear, param

class PlainC(CStyleLanguage):
  """The base as it is, plus threads (the CPU renderer's setting)."""
  has_threads = True


def test_int_literals() -> None:
  r = PlainC()
  assert r.render_const(5, dtypes.int64) == "5LL"
  assert r.render_const(-(2 ** 63), dtypes.int64) == "(-9223372036854775807LL-1)"
  assert r.render_const(-(2 ** 31), dtypes.int32) == "(-2147483647-1)"
  assert r.render_const(2 ** 64 - 1, dtypes.uint64) == f"{2 ** 64 - 1}ULL"
  assert r.render_const(2 ** 32 - 1, dtypes.uint32) == f"{2 ** 32 - 1}u"
  assert r.render_const(0, dtypes.uint32) == "0u"
  assert r.render_const(-3, dtypes.int8) == "(-3)"
  assert r.render_const(True, dtypes.bool) == "1"

def test_float_literals() -> None:
  r = PlainC()
  assert r.render_const(math.inf, dtypes.float32) == "INFINITY"
  assert r.render_const(-math.inf, dtypes.float32) == "(-INFINITY)"
  assert r.render_const(math.nan, dtypes.float32) == "NAN"
  assert r.render_const(-0.0, dtypes.float32) == "(-0.0f)"
  assert r.render_const(0.1, dtypes.float64) == "0.1"
  assert r.render_const(1.5, dtypes.float16) == "((half)1.5f)"
  assert r.render_const(0.5, dtypes.bfloat16) == "0.5f"  # computed in float32

def test_float32_literals_read_back_exactly() -> None:
  values = np.random.default_rng(0).normal(0, 1e3, 2000).astype(np.float32)
  values = np.concatenate([values, np.float32([1e-45, 3.4028235e38, 0.1, 1 / 3, 16777216.0, 2.0 ** -126])])
  for v in values:
    lit = float32_literal(float(v))
    assert np.float32(lit) == v, lit
    assert re.fullmatch(r"-?\d+\.\d*(e[+-]\d+)?|-?\d+(\.\d*)?e[+-]\d+", lit), lit  # a valid C literal with an f suffix

def test_var_names_never_collide() -> None:
  assert var_name("n") == "n"
  assert var_name("val0") == "val0_" and var_name("ridx3") == "ridx3_" and var_name("acc1") == "acc1_"
  assert var_name("a.b") == "a_b" and var_name("2x") == "_2x"
  assert var_name("int", frozenset({"int"})) == "int_"

def test_emulated_float_codes_follow_the_formats() -> None:
  # OCP fp8 spec: e4m3fn max 0x7e (448), NaN 0x7f, no inf; e5m2 inf 0x7c, max 0x7b; bfloat16 inf 0x7f80
  e4m3, e5m2, bf16 = (EmulatedFloat.of(d) for d in (dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.bfloat16))
  assert (e4m3.max_code, e4m3.nan_code, e4m3.overflow_code, e4m3.bias) == (0x7E, 0x7F, 0x7E, 7)
  assert (e5m2.max_code, e5m2.inf_code, e5m2.overflow_code, e5m2.bias) == (0x7B, 0x7C, 0x7C, 15)
  assert (bf16.inf_code, bf16.nan_code, bf16.storage, bf16.has_subnormal_path) == (0x7F80, 0x7FC0, dtypes.uint16, False)
  # the smallest normal of e4m3 is 2^-6, its subnormal step 2^-9
  assert struct.unpack("f", struct.pack("I", e4m3.min_normal_bits))[0] == 2.0 ** -6
  assert e4m3.subnormal_scale == 2.0 ** -9

def _elementwise(dt, n: int = 8) -> list[UOp]:
  out, inp = param(0, dt, n), param(1, dt, n)
  rng = UOp.range(n, 0, AxisType.LOOP)
  return linear(out.index(rng).store(inp.index(rng).load() * 2), end(rng))

def test_emulated_floats_are_integer_code_on_raw_bits() -> None:
  r = PlainC()
  assert "__ember" not in r.render(_elementwise(dtypes.float32))
  src = r.render(_elementwise(dtypes.bfloat16))
  assert "const unsigned short* data1" in src and "unsigned short* data0" in src
  # the conversions are ALU code in the kernel (ember.renderer.emulate), not helper functions
  assert "bfloat16" not in src and "__ember_f32" not in src and "32767u" in src  # round to nearest even

def test_accumulator_read_is_not_moved_past_its_assign() -> None:
  n = 4
  out, inp = param(0, dtypes.int32, n), param(1, dtypes.int32, n)
  acc = UOp(Ops.DEFINE_ACC, dtypes.int32, (UOp.const(dtypes.int32, 0),), 0)
  rng = UOp.range(n, 0, AxisType.LOOP)
  before, x = acc * 3, inp.index(rng).load()
  assign = UOp(Ops.ASSIGN, dtypes.int32, (acc, acc + x))
  lines = PlainC().render(linear(acc, rng, before, x, assign, out.index(rng).store(before), end(rng))).splitlines()
  snapshot = next(i for i, line in enumerate(lines) if re.search(r"int alu\d+ = \(acc0\*3\);", line))
  assigned = next(i for i, line in enumerate(lines) if line.strip().startswith("acc0 = "))
  assert snapshot < assigned

def test_single_use_expressions_are_inlined() -> None:
  src = PlainC().render(_elementwise(dtypes.float32))
  assert "data0[ridx0] = (val0*2.0f);" in src and "alu" not in src

def test_narrow_int_results_are_cast_when_inlined() -> None:
  src = PlainC().render(_elementwise(dtypes.int8))
  assert "(signed char)((val0*2))" in src

def test_thread_range_needs_threads() -> None:
  out = param(0, dtypes.int32, 8)
  rng = UOp.range(8, 0, AxisType.THREAD)
  prog = linear(out.index(rng).store(rng), end(rng))
  src = PlainC().render(prog, "k")
  assert "const int core_id, const int num_cores" in src and "ridx0 = core_id*ridx0_chunk" in src
  with pytest.raises(CompileError, match="no threads"):
    CStyleLanguage().render(prog, "k")

def test_unknown_ops_and_unclosed_ranges_are_errors() -> None:
  with pytest.raises(CompileError, match="not an op of the linear program"):
    PlainC().render([UOp(Ops.RESHAPE, dtypes.int32, (), (1,))])
  rng = UOp.range(4, 0, AxisType.LOOP)
  with pytest.raises(CompileError, match="without its END"):
    PlainC().render(linear(rng))

# ** rendering rules as data **

class HexCasts(PlainC):
  """A target whose rule prints int32 -> float32 casts its own way and leaves every other cast to the base's rule."""
  string_rewrite = PatternMatcher([
    (UPat(Ops.CAST, dtypes.float32, src=(UPat(dtype=dtypes.int32, name="i"),)), lambda ctx, i: f"i2f({ctx[i]})"),
  ]) + CStyleLanguage.string_rewrite

def test_a_target_rule_goes_before_the_base_rules() -> None:
  out, ints, shorts = param(0, dtypes.float32, 8), param(1, dtypes.int32, 8), param(2, dtypes.int16, 8)
  rng = UOp.range(8, 0, AxisType.LOOP)
  value = ints.index(rng).load().cast(dtypes.float32) + shorts.index(rng).load().cast(dtypes.float32)
  prog = linear(out.index(rng).store(value), end(rng))
  src = HexCasts().render(prog)
  assert "data0[ridx0] = (i2f(val0)+(float)(val1));" in src  # the int16 cast falls through to the base rule
  assert "(float)(val0)" in PlainC().render(prog)

def _gpu_program(op: Ops) -> list[UOp]:
  out, zero, one = param(0, dtypes.float32, 32), UOp.const(dtypes.int32, 0), UOp.const(dtypes.float32, 1.0)
  lidx = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, 32),), "lidx0")
  if op is Ops.SPECIAL: return linear(out.index(lidx).store(lidx.cast(dtypes.float32)))
  if op is Ops.BARRIER: return linear(UOp(Ops.BARRIER, dtypes.void, ()), out.index(zero).store(one))
  temp = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(32), arg="temp0")
  if op is Ops.DEFINE_LOCAL: return linear(temp.index(zero).store(one))
  return linear(out.index(zero).store(UOp(Ops.SHUFFLE_XOR, dtypes.float32, (one,), 1)))

class GPU(CStyleLanguage):
  code_for_workitem = {"l": lambda axis: f"threadIdx.{axis}"}
  shared_prefix, barrier = "__shared__ ", "__syncthreads();"
  code_for_shuffle = staticmethod(lambda x, mask, dtype: f"__shfl_xor_sync(~0u, {x}, {mask})")

@pytest.mark.parametrize("op, text, fix", [
  (Ops.SPECIAL, "int lidx0 = threadIdx.x;", "code_for_workitem"), (Ops.BARRIER, "__syncthreads();", "set barrier"),
  (Ops.DEFINE_LOCAL, "__shared__ float temp0[32];", "shared_prefix"),
  (Ops.SHUFFLE_XOR, "float shfl0 = __shfl_xor_sync(~0u, 1.0f, 1);", "code_for_shuffle")], ids=lambda v: str(v))
def test_gpu_ops_need_their_spelling(op: Ops, text: str, fix: str) -> None:
  assert f"  {text}" in GPU().render(_gpu_program(op)).splitlines()
  with pytest.raises(CompileError, match=fix):
    CStyleLanguage().render(_gpu_program(op))

def test_an_alu_op_without_code_is_an_error() -> None:
  class NoSqrt(PlainC):
    code_for_op = {op: fn for op, fn in CStyleLanguage.code_for_op.items() if op is not Ops.SQRT}
  with pytest.raises(CompileError, match="no code for SQRT; codegen must rewrite it first"):
    NoSqrt().render(linear(param(0, dtypes.float32, 1).index(UOp.const(dtypes.int32, 0)).store(
      UOp.const(dtypes.float32, 2.0).alu(Ops.SQRT))))
