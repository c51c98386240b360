"""Gathers: the lowered form of tensor indexing `x[idx]` is a one-hot reduction, `sum_r where(idx == r, x(r), 0)`,
which reads all of `x` for every output element. When `idx` does not depend on the reduced range `r`, the reduction
collapses to one guarded load, `where(0 <= idx < n, x(idx), 0)`: the cost of indexing becomes linear in the output,
not in the size of the indexed dimension."""
from __future__ import annotations
from typing import cast
from ember.dtype import DType, dtypes
from ember.uop.ops import Ops, UOp
from ember.uop.rewrite import PatternMatcher, UPat

def _gate_on(x: UOp, r: UOp, valid: UOp) -> UOp:
  """`x` with every load whose address depends on the range `r` gated by `valid` (a gated-off load reads 0)."""
  def gated(idx: UOp) -> UOp:
    return idx.replace(src=(*idx.src[:2], valid if len(idx.src) == 2 else idx.src[2] & valid))
  indexes = [u for u in x.toposort() if u.op is Ops.INDEX and r in u.toposort()]
  return x.substitute({u: gated(u) for u in indexes}) if indexes else x

def _reduce_collapse(red: UOp) -> UOp | None:
  """A reduction over ranges including `r` of `where(idx == r, x(r), e)` with `idx` independent of `r` and `e` the
  reduction's identity drops `r`: the value becomes `where(0 <= idx < n, x(idx), e)`, the loads of `x` gated so an
  index out of range reads nothing."""
  val, ranges = red.src[0], red.src[1:]
  if val.op is not Ops.WHERE or val.src[0].op is not Ops.CMPEQ: return None
  a, b = val.src[0].src
  r, idx = (a, b) if a in ranges else (b, a) if b in ranges else (None, None)
  if r is None or idx is None or r.op is not Ops.RANGE or r.src[0].op is not Ops.CONST or r in idx.toposort():
    return None
  x, e = val.src[1], val.src[2]
  identity = {Ops.ADD: 0, Ops.MAX: dtypes.min(cast(DType, red.dtype))}.get(red.arg)
  if identity is None or e.op is not Ops.CONST or e.arg != identity: return None
  valid = UOp.const(idx.dtype, -1).lt(idx) & idx.lt(r.src[0])
  out = valid.where(_gate_on(x, r, valid).substitute({r: idx}), e)
  rest = tuple(u for u in ranges if u is not r)
  return red.replace(src=(out, *rest)) if rest else out

pm_reduce_collapse = PatternMatcher([
  (UPat(Ops.REDUCE, name="red"), _reduce_collapse),  # sum_r where(idx == r, x(r), 0) -> where(idx in [0, n), x(idx), 0)
])
