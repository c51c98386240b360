"""codegen/rowreuse.py: where a row's value is stored by its reduction's loop and reloaded, and where it must not be."""
from __future__ import annotations
from ember.codegen.rowreuse import reuse_row_values
from ember.dtype import dtypes
from ember.uop.ops import UOp, Ops, AxisType, KernelInfo

N = 8

def _softmax_like(broadcast: bool) -> UOp:
  """out[g, (m,) r1] = e(g, r1) / sum_r2 e(g, r2) with e = exp2(x[g, r]); `broadcast`: the row written for each m of
  an output range between g and r1, which the reduction does not move with."""
  g, m = UOp.range(4, 0, AxisType.GLOBAL), UOp.range(3, 1, AxisType.GLOBAL)
  r1, r2 = UOp.range(N, 2, AxisType.GLOBAL), UOp.range(N, 3, AxisType.REDUCE)
  out = UOp(Ops.PARAM, dtypes.float32.ptr(4 * 3 * N), (), 0)
  inp = UOp(Ops.PARAM, dtypes.float32.ptr(4 * N), (), 1)
  def e(r: UOp) -> UOp: return inp.index(g * N + r).load().alu(Ops.EXP2)
  total = UOp(Ops.REDUCE, dtypes.float32, (e(r2), r2), Ops.ADD)
  at = g * (3 * N) + m * N + r1 if broadcast else g * N + r1
  return UOp(Ops.SINK, dtypes.void, (out.index(at).store(e(r1) * total.alu(Ops.RECIPROCAL)),), KernelInfo(3))

def test_the_row_value_is_stored_by_the_reduction_and_reloaded() -> None:
  sink = reuse_row_values(_softmax_like(broadcast=False))
  assert sum(n.op is Ops.EXP2 for n in sink.toposort()) == 1
  after = [n for n in sink.toposort() if n.op is Ops.AFTER]
  assert len(after) == 1 and after[0].src[1].op is Ops.STORE
  store = sink.src[0]
  assert any(n.op is Ops.LOAD and n.src[0] is store.src[0] for n in store.src[1].toposort())

def test_a_row_broadcast_over_a_range_the_reduction_lacks_is_left_alone() -> None:
  # the reduction's loop runs once per g: storing the row there would write it for one m only
  sink = _softmax_like(broadcast=True)
  assert reuse_row_values(sink) is sink
