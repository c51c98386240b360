"""Linearize a kernel AST into the program a renderer prints (see docs/linear-program.md).

Output ranges open first; each REDUCE becomes an accumulator, a loop over its ranges and an ASSIGN. Code that does
not depend on a reduction's ranges is emitted before its loop (hoisted), so nothing is recomputed per iteration and
no value is used outside the loop that defines it.
"""
from __future__ import annotations
from ember.dtype import dtypes, PtrDType
from ember.errors import CompileError
from ember.uop.ops import Ops, UOp, AxisType

def reduce_identity(op: Ops, dtype) -> object:
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return dtypes.min(dtype)
  raise CompileError(f"unknown reduce op {op}")

def _range_deps(sink: UOp) -> dict[UOp, frozenset[UOp]]:
  deps: dict[UOp, frozenset[UOp]] = {}
  for n in sink.toposort():
    d = frozenset().union(*(deps[s] for s in n.src)) if n.src else frozenset()
    if n.op is Ops.RANGE: d = d | {n}
    if n.op is Ops.REDUCE: d = d - frozenset(n.src[1:])
    deps[n] = d
  return deps

def linearize(sink: UOp) -> list[UOp]:
  if sink.op is not Ops.SINK: raise CompileError(f"linearize needs a SINK, got {sink.op}")
  deps = _range_deps(sink)
  out: list[UOp] = []
  done: dict[UOp, UOp] = {}
  acc_count = [0]
  topo = list(sink.toposort())
  # arguments first: buffer params by slot, then variables by name
  for p in sorted((n for n in topo if n.op is Ops.PARAM), key=lambda n: n.arg):
    done[p] = p
    out.append(p)
  for v in sorted((n for n in topo if n.op is Ops.DEFINE_VAR), key=lambda n: n.arg):
    done[v] = v
    out.append(v)

  def emit(n: UOp) -> UOp:
    stack: list[tuple[UOp, bool]] = [(n, False)]
    while stack:
      node, ready = stack.pop()
      if node in done: continue
      if node.op is Ops.REDUCE:
        emit_reduce(node)
        continue
      if not ready:
        stack.append((node, True))
        for s in reversed(node.src):
          if s not in done: stack.append((s, False))
        continue
      new = node if all(done[s] is s for s in node.src) else UOp(node.op, node.dtype, tuple(done[s] for s in node.src), node.arg, node.tag)
      done[node] = new
      out.append(new)
    return done[n]

  def emit_reduce(node: UOp) -> None:
    value, rngs = node.src[0], node.src[1:]
    rset = frozenset(rngs)
    # hoist everything the loop body needs that does not vary with the reduce ranges
    for m in value.toposort():
      if m not in done and not (deps[m] & rset) and m.op is not Ops.RANGE: emit(m)
    init = UOp.const(node.dtype, reduce_identity(node.arg, node.dtype))  # type: ignore[arg-type]
    emit(init)
    acc = UOp(Ops.DEFINE_ACC, node.dtype, (done[init],), acc_count[0])
    acc_count[0] += 1
    out.append(acc)
    for r in rngs:
      emit(r.src[0])
      lin_r = r if done[r.src[0]] is r.src[0] else r.replace(src=(done[r.src[0]],))
      done[r] = lin_r
      out.append(lin_r)
    val = emit(value)
    upd = UOp(node.arg, node.dtype, (acc, val))
    out.append(upd)
    out.append(UOp(Ops.ASSIGN, node.dtype, (acc, upd)))
    for r in reversed(rngs): out.append(UOp(Ops.END, dtypes.void, (done[r],)))
    done[node] = acc

  globals_ = sorted((n for n in topo if n.op is Ops.RANGE and n.arg[1] in (AxisType.GLOBAL, AxisType.THREAD, AxisType.LOOP)),
                    key=lambda r: r.arg[0])
  opened: list[UOp] = []
  for r in globals_:
    emit(r.src[0])
    lin_r = r if done[r.src[0]] is r.src[0] else r.replace(src=(done[r.src[0]],))
    done[r] = lin_r
    out.append(lin_r)
    opened.append(lin_r)
  for store in sink.src: emit(store)
  for r in reversed(opened): out.append(UOp(Ops.END, dtypes.void, (r,)))
  return out

def is_pointer(u: UOp) -> bool: return isinstance(u.dtype, PtrDType)
