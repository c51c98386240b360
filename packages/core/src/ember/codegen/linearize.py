"""Linearize a kernel AST into the program a renderer prints (see docs/linear-program.md).

Output ranges open first, in order; a reduction that moves with none of the output ranges still to open runs before
they open (a row's statistics once per row). Each REDUCE becomes an accumulator, a loop over its ranges and an ASSIGN.
Code that does not depend on a reduction's ranges is emitted before its loop (hoisted), so nothing is recomputed per
iteration and no value is used outside the loop that defines it. Block-shared buffers (DEFINE_LOCAL) are declared
right after the arguments; a BARRIER is emitted after the stores it orders (its sources), and a reduction loop whose
body has one ends with another (the write-after-read order of the next iteration's stores).
"""
from __future__ import annotations
from typing import Iterable
from ember.dtype import dtypes
from ember.errors import CompileError
from ember.uop.ops import Ops, UOp, AxisType, toposort_all

def reduce_identity(op: Ops, dtype) -> object:
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return dtypes.min(dtype)
  raise CompileError(f"unknown reduce op {op}")

_NONE: frozenset = frozenset()

def _union(sets: list[frozenset[UOp]]) -> frozenset[UOp]:
  """The union of `sets`, without building a new set where one of them is it (most nodes of an unrolled kernel)."""
  sets = [x for x in sets if x]
  if not sets: return _NONE
  return sets[0] if all(x is sets[0] for x in sets) else frozenset().union(*sets)

def _sources_union(src: tuple[UOp, ...], sets: dict[UOp, frozenset[UOp]]) -> frozenset[UOp]:
  """The union of the sets of `src` (`_union` without its lists for one or two sources, most nodes: a linear walk
  over an unrolled kernel calls this for every node twice)."""
  if len(src) == 1: return sets[src[0]] or _NONE
  if len(src) == 2:
    a, b = sets[src[0]], sets[src[1]]
    return (a or _NONE) if a is b or not b else b if not a else a | b
  return _union([sets[s] for s in src])

def range_deps(sink: UOp, topo: Iterable[UOp] | None = None) -> dict[UOp, frozenset[UOp]]:
  """Per node under `sink` (`topo`: its toposort, where the caller has it), the ranges it moves with (a reduction's
  own ranges excluded)."""
  deps: dict[UOp, frozenset[UOp]] = {}
  for n in sink.toposort() if topo is None else topo:
    d = _sources_union(n.src, deps)
    if n.op is Ops.RANGE: d = d | {n}
    if n.op is Ops.REDUCE: d = d - frozenset(n.src[1:])
    deps[n] = d
  return deps

def linearize(sink: UOp) -> list[UOp]:
  if sink.op is not Ops.SINK: raise CompileError(f"linearize needs a SINK, got {sink.op}")
  topo = sink.toposort()
  # one walk for everything the program's order needs from the graph (a walk per question cost a third of the pass
  # on an unrolled kernel): per node the ranges it moves with (`range_deps`) and the reductions under it, itself
  # included (a reduction's input holds the ones that feed it); the arguments, reductions, output ranges and the
  # values computed from reductions (in topo order)
  deps: dict[UOp, frozenset[UOp]] = {}
  reduces_under: dict[UOp, frozenset[UOp]] = {}
  params: list[UOp] = []
  variables: list[UOp] = []
  local_bufs: list[UOp] = []
  outer_ranges: list[UOp] = []
  groups: dict[tuple[UOp, ...], list[UOp]] = {}  # reductions by their ranges
  from_reduce: dict[UOp, None] = {}
  outer_types = (AxisType.GLOBAL, AxisType.THREAD, AxisType.LOOP)
  for n in topo:
    src, op = n.src, n.op
    d, under = (_sources_union(src, deps), _sources_union(src, reduces_under)) if src else (_NONE, _NONE)
    if op is Ops.RANGE:
      d = d | {n}
      if n.arg[1] in outer_types: outer_ranges.append(n)
    elif op is Ops.REDUCE:
      d = d - frozenset(src[1:])
      under = under | {n}
      groups.setdefault(src[1:], []).append(n)
      from_reduce[n] = None
    elif op is Ops.PARAM: params.append(n)
    elif op is Ops.DEFINE_VAR: variables.append(n)
    elif op is Ops.DEFINE_LOCAL: local_bufs.append(n)
    if under and op is not Ops.STORE and not from_reduce.keys().isdisjoint(src):
      from_reduce[n] = None
    deps[n], reduces_under[n] = d, under
  out: list[UOp] = []
  done: dict[UOp, UOp] = {}
  acc_count = [0]
  # arguments first: buffer params by slot, then variables by name; block-shared buffers are declared at the top of
  # the kernel (MSL allows them only at kernel scope)
  for p in [*sorted(params, key=lambda n: n.arg), *sorted(variables, key=lambda n: n.arg),
            *sorted(local_bufs, key=lambda n: n.arg)]:
    done[p] = p
    out.append(p)

  def emit(n: UOp) -> UOp:
    stack: list[tuple[UOp, bool]] = [(n, False)]
    while stack:
      node, ready = stack.pop()
      if node in done: continue
      if node.op is Ops.REDUCE:
        emit_reduce(node)
        continue
      if not ready:
        # its sources first; one already emitted each (most nodes of a loop's body) is emitted now, as it would be
        # when popped next
        top = len(stack)
        for s in reversed(node.src):
          if s not in done: stack.append((s, False))
        if len(stack) != top:
          stack.insert(top, (node, True))
          continue
      if node.op is Ops.AFTER:  # its value, once the statements it names are emitted (codegen/rowreuse.py)
        done[node] = done[node.src[0]]
        continue
      new_src = tuple([done[s] for s in node.src])
      new = node if new_src == node.src else UOp(node.op, node.dtype, new_src, node.arg, node.tag)
      done[node] = new
      out.append(new)
    return done[n]

  # reductions over the same ranges that do not feed each other share one loop (an unrolled kernel has many)
  open_ranges: set[UOp] = set()
  identities: dict[tuple[Ops, object], UOp] = {}
  def feeds_from(r: UOp) -> frozenset[UOp]: return reduces_under[r.src[0]]

  def emit_reduce(node: UOp) -> None:
    rngs = node.src[1:]
    siblings = groups[rngs]
    sibling_set = frozenset(siblings)
    group = [r for r in siblings if r not in done and not (feeds_from(r) & sibling_set) - {r}]
    if node not in group: group = [node]
    # hoist everything the loop body needs that only varies with loops already open
    for m in toposort_all([red.src[0] for red in group]):
      if m not in done and deps[m] <= open_ranges and m.op is not Ops.RANGE: emit(m)
    accs = []
    for red in group:
      # the identity of each (op, dtype) built once: an unrolled matmul has hundreds of accumulators of one kind
      if (init := identities.get(key := (red.arg, red.dtype))) is None:
        init = identities[key] = UOp.const(red.dtype, reduce_identity(red.arg, red.dtype))
      emit(init)
      acc = UOp(Ops.DEFINE_ACC, red.dtype, (done[init],), acc_count[0])
      acc_count[0] += 1
      out.append(acc)
      accs.append(acc)
    for r in rngs:
      emit(r.src[0])
      lin_r = r if done[r.src[0]] is r.src[0] else r.replace(src=(done[r.src[0]],))
      done[r] = lin_r
      out.append(lin_r)
    open_ranges.update(rngs)
    body = len(out)
    vals = [emit(red.src[0]) for red in group]
    open_ranges.difference_update(rngs)
    for red, acc, val in zip(group, accs, vals):
      upd = UOp(red.arg, red.dtype, (acc, val))
      out.append(upd)
      out.append(UOp(Ops.ASSIGN, red.dtype, (acc, upd)))
    # a loop that stages data through shared memory ends with a second barrier: the next iteration's stores must not
    # overwrite what other threads still read in this one
    if any(u.op is Ops.BARRIER for u in out[body:]): out.append(UOp(Ops.BARRIER, dtypes.void, (), "loop end"))
    for r in reversed(rngs): out.append(UOp(Ops.END, dtypes.void, (done[r],)))
    for red, acc in zip(group, accs): done[red] = acc

  def waits_for_siblings(n: UOp) -> bool:
    """Whether a reduction under `n` shares its loop with a sibling that moves with a range not open yet: it then runs
    in that loop, where the sibling can (an unrolled copy of a reduction whose value folded to a constant moves with
    no output range; run before the output loops, it took its siblings along, which read a range opened later)."""
    return any(s not in done and not deps[s] <= open_ranges
               for red in reduces_under[n] if red not in done for s in groups[red.src[1:]])

  opened: list[UOp] = []
  for r in sorted(outer_ranges, key=lambda r: r.arg[0]):
    # values of reductions that move with neither this loop nor an inner one are computed before it opens: a row's
    # statistics once per row in a kernel that writes the rows it reduced (softmax), not once per element
    for n in from_reduce:
      if n not in done and deps[n] <= open_ranges and not waits_for_siblings(n): emit(n)
    emit(r.src[0])
    lin_r = r if done[r.src[0]] is r.src[0] else r.replace(src=(done[r.src[0]],))
    done[r] = lin_r
    out.append(lin_r)
    opened.append(lin_r)
    open_ranges.add(r)
  for store in sink.src: emit(store)
  for r in reversed(opened): out.append(UOp(Ops.END, dtypes.void, (r,)))
  return out

