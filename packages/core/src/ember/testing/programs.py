"""Building linear programs by hand (docs/linear-program.md), for renderer and device tests that need a program no
Tensor op produces, or exactly one uop of a kind."""
from __future__ import annotations
from ember.dtype import DType, dtypes
from ember.uop.ops import Ops, UOp

def linear(*items: UOp) -> list[UOp]:
  """A linear program: each item after whatever of its sources is not listed yet."""
  out: dict[UOp, None] = {}
  for item in items:
    for u in item.toposort(): out.setdefault(u, None)
  return list(out)

def param(slot: int, dt: DType, size: int) -> UOp:
  """Buffer argument `slot`: a pointer to `size` elements of `dt`."""
  return UOp(Ops.PARAM, dt.ptr(size), arg=slot)

def end(rng: UOp) -> UOp:
  """The END that closes loop `rng`."""
  return UOp(Ops.END, dtypes.void, (rng,))
