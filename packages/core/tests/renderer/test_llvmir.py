"""The LLVM-IR renderer base, checked on the text it prints; parsed and verified by llvmlite where it is installed."""
from __future__ import annotations
import math
import pytest
from ember.dtype import dtypes
from ember.errors import CompileError
from ember.renderer.llvmir import LLVMRenderer, lconst
from ember.uop.ops import AxisType, Ops, UOp
from ember.uop.rewrite import PatternMatcher, UPat
from ember.testing.programs import end, linear, param

class PlainLLVM(LLVMRenderer):
  has_threads = True


def test_constants() -> None:
  assert lconst(1.0, dtypes.float32) == "0x3FF0000000000000"
  assert lconst(math.inf, dtypes.float64) == "0x7FF0000000000000"
  assert lconst(1.0, dtypes.float16) == "0xH3C00"
  assert lconst(2 ** 64 - 1, dtypes.uint64) == "-1" and lconst(255, dtypes.uint8) == "-1"
  assert lconst(-5, dtypes.int32) == "-5"
  assert lconst(True, dtypes.bool) == "true"

def _kernel(dt, thread: bool = True) -> list[UOp]:
  n = 16
  out, a, b = param(0, dt, n), param(1, dt, n), param(2, dtypes.bool, n)
  rng = UOp.range(UOp.variable("n", 1, n), 0, AxisType.THREAD if thread else AxisType.LOOP)
  x = a.index(rng, b.index(rng).load()).load()
  values = [x.maximum(x * 2), x.alu(Ops.MULACC, x, x), x.cast(dtypes.float32).cast(dt)]
  if dtypes.is_float(dt):
    values += [x.alu(op) for op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC, Ops.RECIPROCAL)]
  else: values += [x // 3, x % 3, x.alu(Ops.SHR, UOp.const(dtypes.int32, 1).cast(dt))]
  total = values[0]
  for v in values[1:]: total = total + v
  return linear(out.index(rng, rng.lt(10)).store(total), end(rng))

DTYPES = [dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.int8,
          dtypes.uint32, dtypes.int64]

@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
def test_ir_is_valid_and_has_no_fast_math(dt) -> None:
  src = PlainLLVM().render(_kernel(dt), "k")
  assert "fast" not in src and "maxnum" not in src and "contract" not in src
  if dtypes.is_float(dt): assert "fcmp uno" in src  # MAX propagates NaN
  llvm = pytest.importorskip("llvmlite.binding")
  llvm.parse_assembly(src).verify()

def test_thread_range_needs_threads() -> None:
  with pytest.raises(CompileError, match="no threads"):
    LLVMRenderer().render(_kernel(dtypes.float32), "k")
  assert "core_id" not in LLVMRenderer().render(_kernel(dtypes.float32, thread=False), "k")

def test_target_data_is_printed() -> None:
  class Target(PlainLLVM):
    triple, datalayout = "x86_64-unknown-linux-gnu", "e-m:e-i64:64-n8:16:32:64-S128"
  src = Target().render(_kernel(dtypes.float32), "k")
  assert 'target triple = "x86_64-unknown-linux-gnu"' in src
  assert 'target datalayout = "e-m:e-i64:64-n8:16:32:64-S128"' in src

# ** rendering rules as data **

def _shared_program() -> list[UOp]:
  temp, zero = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(32), arg="temp0"), UOp.const(dtypes.int32, 0)
  return linear(temp.index(zero).store(UOp.const(dtypes.float32, 1.0)), UOp(Ops.BARRIER, dtypes.void, ()))

def test_gpu_ops_need_their_spelling() -> None:
  class Shared(PlainLLVM):
    local_ptr_type = "ptr addrspace(3)"
  with pytest.raises(CompileError, match="set local_ptr_type"):
    PlainLLVM().render(_shared_program(), "k")
  with pytest.raises(CompileError, match="set barrier_ir"):
    Shared().render(_shared_program(), "k")
  class Barrier(Shared):
    barrier_ir = "call void @llvm.barrier()"
  src = Barrier().render(_shared_program(), "k")
  assert "@temp0 = internal unnamed_addr addrspace(3) global [32 x float] undef, align 16" in src
  assert "  store float 0x3FF0000000000000, ptr addrspace(3) %idx0\n  call void @llvm.barrier()\n" in src

def _thread_id(ctx, x: UOp) -> str:
  ctx.emit(f"%{x.arg} = call i32 @llvm.tid.x()")
  return f"%{x.arg}"

def test_a_target_rule_goes_before_the_base_rules() -> None:
  class Workitems(PlainLLVM):
    string_rewrite = PatternMatcher([(UPat(Ops.SPECIAL, name="x"), _thread_id)]) + LLVMRenderer.string_rewrite
  out = param(0, dtypes.int32, 32)
  lidx = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, 32),), "lidx0")
  prog = linear(out.index(lidx).store(lidx + 1))
  src = Workitems().render(prog, "k")
  assert "%lidx0 = call i32 @llvm.tid.x()" in src and "%alu0 = add i32 %lidx0, 1" in src
  llvm = pytest.importorskip("llvmlite.binding")
  llvm.parse_assembly(src).verify()
  with pytest.raises(CompileError, match="cannot render SPECIAL"):
    PlainLLVM().render(prog, "k")
