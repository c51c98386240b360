"""Group reductions for GPU renderers: the threads of a block share one reduction.

Without this, a GPU kernel gives each thread one output and that thread runs the whole reduction loop alone; a sum of
a million values is then one thread's work. `group_reduce` gives each output a block of G threads instead:

1. the reduction range `r` (length R) becomes `r' * G + lidx0`: thread t accumulates elements t, t+G, t+2G, ...
   (adjacent threads read adjacent elements, so global loads coalesce) into its own partial value;
2. where the target has a warp-wide register exchange (`Renderer.warp_size`, SHUFFLE_XOR for `shuffle_dtypes`), the
   W lanes of each warp combine their partials in log2(W) butterfly steps, after which every lane holds its warp's
   value;
3. the G/W warp values (or, without shuffles, all G partials) go to block-shared memory (DEFINE_LOCAL), a BARRIER
   makes them visible, and every thread folds them in the same order, so all threads hold the same result;
4. the output ranges become the block index `gidx0`, and only thread 0 of a block stores the result.

It applies to kernels whose reductions each run over one constant range that a power of two >= 32 divides, and are
long enough to be worth a block (`MIN_GROUP_REDUCE` elements, and either few outputs or a long reduction); a
reduction nested inside another's loop is left alone (its shared buffer would need a second barrier per iteration).
Float sums are reassociated (a tree instead of a left fold); MAX keeps NaN propagation because the combine is the
same MAX op.
"""
from __future__ import annotations
from typing import Iterable
from ember.dtype import DType, dtypes
from ember.helpers import prod
from ember.renderer import Renderer
from ember.uop.ops import Ops, UOp, AxisType

MAX_GROUP = 256           # threads per block for a group reduction
MIN_GROUP_REDUCE = 256    # shorter reductions stay one thread per output
MANY_OUTPUTS = 1 << 16    # with more outputs than this, only reductions of LONG_REDUCE or more are grouped
LONG_REDUCE = 2048

def _pow2_divisor(n: int, cap: int) -> int:
  size = 1
  while size * 2 <= cap and n % (size * 2) == 0: size *= 2
  return size

def global_ranges(ast: UOp, topo: Iterable[UOp] | None = None) -> list[UOp]:
  """The kernel's output loops, outermost first (`topo`: `ast.toposort()`, where the caller has it)."""
  return sorted((n for n in (ast.toposort() if topo is None else topo) if n.op is Ops.RANGE and
                 n.arg[1] is AxisType.GLOBAL), key=lambda r: r.arg[0])

def unflatten(flat: UOp, counts: list[int]) -> list[UOp]:
  """The index along each of `counts` (row-major: the last fastest) that the flat index `flat` stands for."""
  out, stride = [], prod(counts)
  for n in counts:
    stride //= n
    out.append((flat // stride) % n if stride > 1 else flat % n)
  return out

def group_size(ast: UOp, renderer: Renderer, forced: int | None = None) -> int:
  """Threads per block for a group reduction of `ast` on `renderer`, or 0 when it does not apply. `forced` (a GROUP
  opt's amount) skips the heuristic's length thresholds: it only has to divide every reduction and fit the target."""
  if not (renderer.has_local and renderer.has_shared): return 0
  reds = [n for n in ast.toposort() if n.op is Ops.REDUCE]
  if not reds or any(len(r.src) != 2 or r.src[1].src[0].op is not Ops.CONST for r in reds): return 0
  outs = global_ranges(ast)
  if any(r.src[0].op is not Ops.CONST for r in outs): return 0
  total = prod(r.src[0].arg for r in outs) if outs else 1
  if renderer.global_max and total > renderer.global_max[0]: return 0
  ends = [r.src[1].src[0].arg for r in reds]
  shortest = min(ends)
  if forced is None and (shortest < MIN_GROUP_REDUCE or (total > MANY_OUTPUTS and shortest < LONG_REDUCE)): return 0
  for red in reds:  # a reduction whose value changes with another reduction's loop is nested in it
    rng = red.src[1]
    if any(sub is not red and sub.op is Ops.REDUCE and rng in sub.src[0].toposort() for sub in red.src[0].toposort()):
      return 0
  cap = min(MAX_GROUP, renderer.local_max[0] if renderer.local_max else MAX_GROUP)
  if forced is not None:
    if forced < 2 or any(e % forced for e in ends) or (renderer.local_max and forced > renderer.local_max[0]): return 0
    size = forced
  else: size = min(_pow2_divisor(e, cap) for e in ends)
  if size < 32 and forced is None: return 0
  if renderer.shared_max and size * max(r.dtype.itemsize for r in reds) > renderer.shared_max: return 0
  return size

def group_reduce(ast: UOp, renderer: Renderer, size: int | None = None,
                 top: bool = False) -> tuple[UOp, list[int], list[int]] | None:
  """The kernel with every reduction shared by the threads of a block (see the module docstring), its grid and its
  block size; None when `group_size` says it does not apply. `size` forces the threads per block (a GROUP opt);
  `top` gives thread t the t-th contiguous chunk of each reduction instead of every size-th element (GROUPTOP)."""
  if (size := group_size(ast, renderer, size)) == 0: return None
  lidx = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, size),), "lidx0")
  next_axis = max((n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE), default=-1) + 1
  warp = renderer.warp_size if renderer.warp_size >= 2 and size % renderer.warp_size == 0 else 0
  short: dict[UOp, UOp] = {}  # reduction range -> the per-thread range (shared ranges stay shared: one loop)
  new: dict[UOp, UOp] = {}
  for n in ast.toposort():
    src = tuple(new[s] for s in n.src)
    if n.op is not Ops.REDUCE:
      new[n] = n if all(a is b for a, b in zip(src, n.src)) else n.replace(src=src)
      continue
    rng = n.src[1]
    if rng not in short: short[rng] = UOp.range(rng.src[0].arg // size, rng.arg[0], AxisType.REDUCE)
    at = lidx * short[rng].src[0].arg + short[rng] if top else short[rng] * size + lidx
    part = UOp(Ops.REDUCE, n.dtype, (src[0].substitute({rng: at}), short[rng]), n.arg)
    slots, slot, writer = size, lidx, None
    if warp and n.dtype in renderer.shuffle_dtypes:
      mask = warp // 2
      while mask >= 1:  # butterfly: after log2(warp) steps every lane holds the combination of its warp
        part = UOp(n.arg, n.dtype, (part, UOp(Ops.SHUFFLE_XOR, n.dtype, (part,), mask)))
        mask //= 2
      slots, slot, writer = size // warp, lidx // warp, (lidx % warp).eq(0)
    if slots == 1:
      new[n] = part
      continue
    assert isinstance(n.dtype, DType), f"a REDUCE yields scalars, not {n.dtype}"
    shared = UOp(Ops.DEFINE_LOCAL, n.dtype.ptr(slots), (), f"temp{next_axis}")
    barrier = UOp(Ops.BARRIER, dtypes.void, (shared.index(slot, writer).store(part),))
    fold = UOp.range(slots, next_axis, AxisType.REDUCE)
    next_axis += 1
    new[n] = UOp(Ops.REDUCE, n.dtype, (UOp(Ops.LOAD, n.dtype, (shared.index(fold), barrier)), fold), n.arg)
  sink = new[ast]
  first = lidx.eq(0)
  stores = []
  for st in sink.src:  # one thread per block writes the result
    idx = st.src[0]
    gate = first if len(idx.src) == 2 else idx.src[2] & first
    stores.append(st.replace(src=(idx.src[0].index(idx.src[1], gate), *st.src[1:])))
  sink = sink.replace(src=tuple(stores))
  outs = global_ranges(sink)
  counts = [r.src[0].arg for r in outs]
  total = prod(counts)
  gidx = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, total),), "gidx0")
  return sink.substitute(dict(zip(outs, unflatten(gidx, counts)))), [total, 1, 1], [size, 1, 1]
