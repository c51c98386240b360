"""The IR spec checker: PatternMatchers of bools that say which UOps are well formed.

`type_verify(uops, spec)` raises `SpecError` naming the first bad node. With `SPEC=1` (the test suite sets it) codegen
checks every kernel AST and every linear program between passes.
"""
from __future__ import annotations
from ember.dtype import dtypes, PtrDType
from ember.errors import EmberError
from ember.uop.ops import Ops, UOp, GroupOp

class SpecError(EmberError, RuntimeError):
  """A pass produced a UOp graph that breaks the IR spec (a bug in ember or in a backend's rewrite rules)."""

def _alu_ok(x: UOp) -> bool:
  if x.op is Ops.WHERE: return x.src[0].dtype is dtypes.bool and x.src[1].dtype is x.dtype and x.src[2].dtype is x.dtype
  if x.op in GroupOp.Comparison: return x.dtype is dtypes.bool and x.src[0].dtype is x.src[1].dtype
  if x.op in GroupOp.Bitwise:
    if dtypes.is_float(x.dtype): return False  # bitwise ops on floats are rejected
    if x.op in (Ops.SHL, Ops.SHR): return dtypes.is_int(x.dtype) and all(dtypes.is_int(s.dtype) for s in x.src)
  if x.op in (Ops.IDIV, Ops.MOD) and not dtypes.is_int(x.dtype): return False
  float_only = GroupOp.Transcendental | {Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC, Ops.FDIV}
  if x.op in float_only and not dtypes.is_float(x.dtype): return False
  return all(s.dtype is x.dtype for s in x.src)

# the element dtypes of QDOT's sources (UOp.qdot): codes, scale, xq, xd, xs and the optional offset
_QDOT_SRCS = (dtypes.uint8, dtypes.float32, dtypes.int8, dtypes.float32, dtypes.float32, dtypes.float32)

def _qdot_ok(x: UOp) -> bool:
  if x.dtype is not dtypes.float32 or len(x.src) not in (5, 6): return False
  if not (isinstance(x.arg, tuple) and len(x.arg) == 4 and all(isinstance(a, int) for a in x.arg)): return False
  blocks, bits, _, planes = x.arg
  srcs_ok = all(s.op is Ops.INDEX and isinstance(s.dtype, PtrDType) and s.dtype.base is dt
                for s, dt in zip(x.src, _QDOT_SRCS))
  return blocks > 0 and bits in (4, 8) and planes in (1, 2, 3) and srcs_ok

def check_kernel_node(x: UOp) -> bool:
  """Spec of kernel ASTs and linear programs."""
  if x.op in GroupOp.ALU: return _alu_ok(x)
  if x.op is Ops.PARAM: return isinstance(x.dtype, PtrDType) and isinstance(x.arg, int)
  if x.op is Ops.INDEX:
    return (x.src[0].op in (Ops.PARAM, Ops.DEFINE_LOCAL) and dtypes.is_int(x.src[1].dtype)
            and (len(x.src) == 2 or x.src[2].dtype is dtypes.bool))
  if x.op is Ops.LOAD:  # a load of block-shared memory also names the BARRIER it must wait for
    if len(x.src) == 2 and x.src[1].op is not Ops.BARRIER: return False
    return len(x.src) <= 2 and x.src[0].op is Ops.INDEX and isinstance(x.src[0].dtype, PtrDType) \
      and x.dtype is x.src[0].dtype.base
  if x.op is Ops.STORE:
    return x.src[0].op is Ops.INDEX and isinstance(x.src[0].dtype, PtrDType) and x.src[1].dtype is x.src[0].dtype.base
  if x.op is Ops.RANGE: return dtypes.is_int(x.dtype) and len(x.src) == 1 and dtypes.is_int(x.src[0].dtype)
  if x.op is Ops.REDUCE: return all(s.op is Ops.RANGE for s in x.src[1:]) and x.arg in (Ops.ADD, Ops.MUL, Ops.MAX)
  if x.op is Ops.CONST: return not x.dtype.weak and x.src == ()
  if x.op is Ops.DEFINE_VAR: return dtypes.is_int(x.dtype)
  if x.op is Ops.SINK: return all(s.op in (Ops.STORE, Ops.SINK) for s in x.src)
  if x.op in (Ops.CAST, Ops.BITCAST): return len(x.src) == 1
  if x.op is Ops.SPECIAL: return x.dtype is dtypes.int32 and isinstance(x.arg, str) and len(x.src) == 1
  if x.op is Ops.DEFINE_LOCAL:
    return isinstance(x.dtype, PtrDType) and x.dtype.size > 0 and isinstance(x.arg, str) and x.src == ()
  if x.op is Ops.BARRIER: return x.dtype is dtypes.void and all(s.op is Ops.STORE for s in x.src)
  if x.op is Ops.SHUFFLE_XOR:
    return len(x.src) == 1 and x.dtype is x.src[0].dtype and isinstance(x.arg, int) and x.arg > 0
  if x.op is Ops.WMMA:  # arg: (instruction name, this output element, output elements per lane)
    return dtypes.is_float(x.dtype) and len(x.src) >= 2 and all(not isinstance(s.dtype, PtrDType) for s in x.src) \
      and isinstance(x.arg, tuple) and len(x.arg) == 3 and isinstance(x.arg[0], str) and 0 <= x.arg[1] < x.arg[2]
  if x.op is Ops.QDOT: return _qdot_ok(x)
  if x.op is Ops.AFTER: return x.dtype is x.src[0].dtype and all(s.op is Ops.STORE for s in x.src[1:])
  if x.op in (Ops.END, Ops.DEFINE_ACC, Ops.ASSIGN): return True
  return False

def type_verify(uops: list[UOp] | UOp, where: str = "") -> None:
  nodes = list(uops.toposort()) if isinstance(uops, UOp) else uops
  for u in nodes:
    if u.dtype.weak and u.op is not Ops.SINK:
      raise SpecError(f"{where}: weak dtype {u.dtype!r} reached a kernel in {u.op}; weak dtypes must be lowered first")
    if not check_kernel_node(u):
      srcs = ", ".join(f"{s.op.name}:{s.dtype!r}" for s in u.src)
      raise SpecError(f"{where}: malformed {u.op.name} of dtype {u.dtype!r} with sources ({srcs}), arg={u.arg!r}")
