"""The IR spec checker: well-formed kernels pass, each malformed node is named in a SpecError."""
from __future__ import annotations
import os
import pytest
from ember.dtype import dtypes
from ember.errors import EmberError
from ember.helpers import SPEC
from ember.uop.ops import UOp, Ops, AxisType
from ember.uop.spec import SpecError, type_verify, check_kernel_node

def _param(slot: int, dt=dtypes.float32, n: int = 16) -> UOp: return UOp(Ops.PARAM, dt.ptr(n), (), slot)

def _good_kernel() -> UOp:
  r = UOp.range(16, 0, AxisType.GLOBAL)
  out, inp = _param(0), _param(1)
  val = inp.index(r).load() * UOp.const(dtypes.float32, 2.0)
  return UOp(Ops.SINK, dtypes.void, (out.index(r).store(val),))

def test_spec_is_on_for_the_test_run():
  assert os.environ.get("SPEC") == "1" and SPEC.value == 1

def test_good_kernel_passes():
  type_verify(_good_kernel(), "test")

def test_spec_error_is_an_ember_error():
  assert issubclass(SpecError, EmberError)

def test_bitwise_ops_on_floats_are_rejected():
  f = UOp.const(dtypes.float32, 1.0)
  with pytest.raises(SpecError, match="AND"):
    type_verify(UOp(Ops.AND, dtypes.float32, (f, f)), "t")
  # an int-typed AND whose operands are floats is rejected too
  assert not check_kernel_node(UOp(Ops.AND, dtypes.int32, (f, f)))

def test_weak_dtypes_are_rejected_in_kernels():
  w = UOp.const(dtypes.weakfloat, 1.0)
  with pytest.raises(SpecError, match="weak"):
    type_verify(UOp(Ops.ADD, dtypes.weakfloat, (w, w)), "t")

@pytest.mark.parametrize("node", [
  lambda: UOp(Ops.IDIV, dtypes.float32, (UOp.const(dtypes.float32, 1.0), UOp.const(dtypes.float32, 2.0))),  # int only
  lambda: UOp(Ops.EXP2, dtypes.int32, (UOp.const(dtypes.int32, 1),)),  # float only
  lambda: UOp(Ops.FDIV, dtypes.int32, (UOp.const(dtypes.int32, 1), UOp.const(dtypes.int32, 2))),
  lambda: UOp(Ops.ADD, dtypes.int32, (UOp.const(dtypes.int32, 1), UOp.const(dtypes.int64, 2))),  # mixed dtypes
  lambda: UOp(Ops.CMPLT, dtypes.int32, (UOp.const(dtypes.int32, 1), UOp.const(dtypes.int32, 2))),  # must be bool
  lambda: UOp(Ops.WHERE, dtypes.int32, (UOp.const(dtypes.int32, 1),) * 2 + (UOp.const(dtypes.int32, 2),)),  # int cond
  lambda: UOp(Ops.SHL, dtypes.float32, (UOp.const(dtypes.float32, 1.0), UOp.const(dtypes.int32, 1))),
  lambda: UOp(Ops.SINK, dtypes.void, (UOp.const(dtypes.int32, 1),)),  # a sink holds stores
  lambda: UOp(Ops.PARAM, dtypes.float32, (), 0),  # a param is a pointer
  lambda: UOp(Ops.RESHAPE, dtypes.float32, (UOp.const(dtypes.float32, 1.0),), (1,)),  # no tensor ops in kernels
])
def test_malformed_nodes_are_rejected(node):
  u = node()
  with pytest.raises(SpecError, match=u.op.name):
    type_verify([u], "t")

def test_load_dtype_must_match_the_pointer():
  p = _param(0, dtypes.float32)
  bad = UOp(Ops.LOAD, dtypes.int32, (p.index(UOp.const(dtypes.int32, 0)),))
  with pytest.raises(SpecError, match="LOAD"):
    type_verify([bad], "t")

def test_store_value_must_match_the_pointer():
  p = _param(0, dtypes.float32)
  bad = p.index(UOp.const(dtypes.int32, 0)).store(UOp.const(dtypes.int32, 1))
  with pytest.raises(SpecError, match="STORE"):
    type_verify([bad], "t")

def test_gate_must_be_bool():
  p = _param(0)
  bad = UOp(Ops.INDEX, p.dtype, (p, UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, 1)))
  with pytest.raises(SpecError, match="INDEX"):
    type_verify([bad], "t")

def test_message_names_where_it_happened():
  f = UOp.const(dtypes.float32, 1.0)
  with pytest.raises(SpecError, match="after my pass"):
    type_verify([UOp(Ops.XOR, dtypes.float32, (f, f))], "after my pass")
