"""A row's expensive elementwise value, computed once: the reduction over the row stores it, the output loop reloads it.

A kernel that writes the rows it reduced (softmax: `e = exp(x - max)`, out = `e / sum(e)`) computes `e` twice on a
CPU-like device, once per element in the loop of the sum and once per element in the loop of the stores. When `e`
holds a transcendental (an exp is ~20 vector ops after its decomposition, a store and a reload two), the loop of the
sum also stores each `e` into the output element the store loop writes, and the store loop reads it back:

  STORE(out[i(g, r1)], f(E[r1], REDUCE(E[r2], r2)))
  -> STORE(out[i(g, r1)], f(LOAD(out[i(g, r1)]), REDUCE(AFTER(E[r2], STORE(out[i(g, r2)], E[r2])), r2)))

AFTER(value, stores) is `value` once the stores ran; the linearizer emits the stores in the reduction's loop. This is
right only where the reduction runs to its end before the store loop opens, which the linearizer guarantees for a
reduction that moves with output ranges outside `r1` only (a row statistic: computed before the row's loop opens),
and where no two threads share a row: `r1` is not the first output range (the one codegen splits over CPU threads).
GPU renderers (one thread per output) are left alone.
"""
from __future__ import annotations
from ember.dtype import PtrDType
from ember.uop.ops import Ops, UOp, AxisType, GroupOp
from ember.codegen.linearize import range_deps

def _ranges(x: UOp) -> set[UOp]:
  """The ranges `x` moves with (a reduction's own ranges excluded)."""
  return set(range_deps(x)[x])

def _reuse(sink: UOp, store: UOp, outer: list[UOp]) -> UOp | None:
  """`sink` with `store`'s row value computed once (see the module doc), else None."""
  idx, value = store.src[0], store.src[1]
  buf = idx.src[0]
  if len(idx.src) != 2 or not isinstance(ptr := buf.dtype, PtrDType): return None  # a gated store writes part of it
  writes = [s for s in sink.src if s.op is Ops.STORE and s.src[0].src[0] is buf]
  if len(writes) != 1 or any(n.op is Ops.LOAD and n.src[0].src[0] is buf for n in sink.toposort()): return None
  nodes = value.toposort()
  for red in (n for n in nodes if n.op is Ops.REDUCE and len(n.src) == 2):
    body, r2 = red.src[0], red.src[1]
    if body.dtype is not ptr.base or not any(n.op in GroupOp.Transcendental for n in body.toposort()): continue
    deps = _ranges(red)
    for r1 in outer[1:]:  # outer[0] is split over threads
      if r1.src[0] is not r2.src[0] or r1 in deps or not deps <= {r for r in outer if r.arg[0] < r1.arg[0]}: continue
      if (moved := body.substitute({r2: r1})) is body or moved not in nodes: continue
      here = idx.src[1].substitute({r1: r2})
      # the output index moves with r1 and with nothing the reduction's loop lacks (a broadcast of the row over an
      # output range between the row's ranges would be written for one iteration of that range only)
      if here is idx.src[1] or not _ranges(here) - {r2} <= deps: continue
      kept = UOp(Ops.AFTER, body.dtype, (body, buf.index(here).store(body)))
      new_store = store.replace(src=(idx, value.substitute({red: red.replace(src=(kept, r2)), moved: idx.load()})))
      return sink.substitute({store: new_store})
  return None

def reuse_row_values(sink: UOp) -> UOp:
  """Every store of the kernel whose row value a row reduction also computes, rewritten to compute it once."""
  topo = sink.toposort()
  if not any(n.op is Ops.REDUCE for n in topo) or not any(n.op in GroupOp.Transcendental for n in topo): return sink
  outer = sorted((n for n in topo if n.op is Ops.RANGE and n.arg[1] is AxisType.GLOBAL), key=lambda r: r.arg[0])
  for store in [s for s in sink.src if s.op is Ops.STORE]:
    if (new := _reuse(sink, store, outer)) is not None: sink = new
  return sink
