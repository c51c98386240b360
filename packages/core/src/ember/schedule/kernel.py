"""Lowering one kernel: a tensor-level graph, indexed by loop ranges, becomes a kernel AST.

Movement ops never copy: `index_through` turns each one into index math on the ranges (a PAD adds a validity
condition that gates loads). Elementwise ops are computed in place; a REDUCE_AXIS opens new REDUCE ranges. Nodes that
the scheduler decided to materialise are read back from their buffers.
"""
from __future__ import annotations
from typing import Callable
from ember.dtype import DType, dtypes, strong_dtype
from ember.errors import ShapeError
from ember.helpers import prod
from ember.uop.ops import Ops, UOp, GroupOp, AxisType, KernelInfo, sint

INT32_MAX = 2 ** 31 - 1

def _idx_const(v: int, dtype: DType = dtypes.int32) -> UOp: return UOp.const(dtype, v)

def _to_uop(s: sint, dtype: DType = dtypes.int32) -> UOp: return s if isinstance(s, UOp) else _idx_const(s, dtype)

def _index_dtype(idxs: tuple[UOp, ...]) -> DType:
  """The dtype of a kernel's index math, which its ranges carry: int64 where an index can exceed int32."""
  return dtypes.int64 if any(i.dtype is dtypes.int64 for i in idxs) else dtypes.int32

def reshape_groups(old: tuple[sint, ...], new: tuple[sint, ...]) -> list[tuple[list[int], list[int]]] | None:
  """A reshape's dims in matching runs, (old dims, new dims) of the same number of elements, size-1 dims left out
  (`(B, 20, 20, 5, 5, 32) -> (B, 20, 20, 1, 5, 5, 32)` is six runs of one dim each); None where a size is symbolic
  or 0. Each run is indexed on its own, so no index spans the whole shape: that one can exceed int32 where every run
  fits (a batch of 10,000 in a conv's window view), and its div/mod chain is left for symbolic to fold."""
  src, dst = [s for s in old if isinstance(s, int) and s > 0], [s for s in new if isinstance(s, int) and s > 0]
  if len(src) != len(old) or len(dst) != len(new): return None
  olds, news = [k for k, s in enumerate(src) if s != 1], [k for k, s in enumerate(dst) if s != 1]
  groups: list[tuple[list[int], list[int]]] = []
  a = b = 0
  while a < len(olds):
    go, gn, po, pn = [olds[a]], [news[b]], src[olds[a]], dst[news[b]]
    a, b = a + 1, b + 1
    while po != pn:  # the products meet: both shapes hold the same elements in the same order
      if po < pn: go, po, a = go + [olds[a]], po * src[olds[a]], a + 1
      else: gn, pn, b = gn + [news[b]], pn * dst[news[b]], b + 1
    groups.append((go, gn))
  return groups

def _index_bound(n: UOp) -> int:
  """The largest index that lowering `n` computes besides the flat indices of buffers: one of its dims, or for a
  reshape the flat index of its largest run of dims (its whole shape where the dims do not split into runs)."""
  def bound(shape: tuple[sint, ...]) -> int: return prod(s.vmax if isinstance(s, UOp) else s for s in shape)
  dims = max((bound((s,)) for s in n.shape), default=1)
  if n.op is not Ops.RESHAPE: return dims
  if (groups := reshape_groups(n.src[0].shape, n.shape)) is None: return max(dims, bound(n.shape))
  return max([dims] + [bound(tuple(n.shape[k] for k in news)) for _, news in groups])

def needs_int64_index(node: UOp, out_buf: UOp, realized: dict[UOp, UOp]) -> bool:
  """Whether some index of the kernel that computes `node` can exceed int32: a buffer it reads or writes has more than
  INT32_MAX elements, or a dim or a reshape's run of dims (`_index_bound`) does. Views larger than that whose
  indices stay small (a conv's (N, *out, Cout, *kernel, Cin) product at a batch of 10,000) keep int32, so a kernel's
  code depends on its batch size only through its loop bounds."""
  # a realized node or an assign's target may be a view (RESHAPE ...) of its BUFFER: the buffer holds the size
  sizes = [out_buf.base.arg.size]
  for n in node.toposort(gate=lambda n: n is node or n not in realized):
    if n is not node and n in realized: sizes.append(realized[n].base.arg.size)
    elif n.op is Ops.BUFFER: sizes.append(n.arg.size)
    elif n.op not in (Ops.DEVICE, Ops.CONST, Ops.DEFINE_VAR, Ops.BIND): sizes.append(_index_bound(n))
  return max(sizes) > INT32_MAX

def strides_for(shape: tuple[sint, ...]) -> list[sint]:
  strides: list[sint] = []
  acc: sint = 1
  for s in reversed(shape):
    strides.append(acc)
    acc = acc * s
  return list(reversed(strides))

def flat_index(idxs: tuple[UOp, ...], shape: tuple[sint, ...]) -> UOp:
  dt = _index_dtype(idxs)
  ret: UOp = _idx_const(0, dt)
  for i, st, s in zip(idxs, strides_for(shape), shape):
    if isinstance(s, int) and s == 1: continue
    ret = ret + i * _to_uop(st, dt) if not (isinstance(st, int) and st == 1) else ret + i
  return ret

def _unbound(b: UOp, ctx: KernelCtx) -> UOp:
  """A BIND's variable, its value recorded for the launch."""
  ctx.var_vals[b.src[0].arg[0]] = b.src[1].arg
  return b.src[0]

def _unbind(s: sint, ctx: KernelCtx) -> sint:
  if isinstance(s, UOp): return s.substitute({b: _unbound(b, ctx) for b in s.toposort() if b.op is Ops.BIND})
  return s

class KernelCtx:
  """State while lowering one kernel: buffer params by slot, fresh range ids, variables, memo."""
  def __init__(self, realized: dict[UOp, UOp], output: UOp, index_dtype: DType = dtypes.int32):
    self.realized, self.output, self.index_dtype = realized, output, index_dtype
    self.bufs: list[UOp] = []
    self.params: dict[UOp, UOp] = {}
    self.next_axis = 0
    self.var_vals: dict[str, int] = {}
    self.memo: dict[tuple[UOp, tuple[UOp, ...], UOp | None], UOp] = {}
  def param(self, buf: UOp) -> UOp:
    if buf not in self.params:
      assert isinstance(buf.dtype, DType), f"a BUFFER holds scalars, not {buf.dtype}"
      self.params[buf] = UOp(Ops.PARAM, buf.dtype.ptr(buf.arg.size), (), len(self.bufs))
      self.bufs.append(buf)
    return self.params[buf]
  def new_range(self, end: sint, axis_type: AxisType) -> UOp:
    r = UOp.range(_unbind(end, self), self.next_axis, axis_type, self.index_dtype)
    self.next_axis += 1
    return r

def _reshape_index(idxs: tuple[UOp, ...], shape: tuple[sint, ...], src_shape: tuple[sint, ...],
                   dt: DType) -> tuple[UOp, ...]:
  """The index into `src_shape` of the element at `idxs` of its reshape to `shape`: the flat index of each run of
  `reshape_groups` split over the run's source dims (one run of every dim where sizes are symbolic)."""
  groups = reshape_groups(src_shape, shape) or [(list(range(len(src_shape))), list(range(len(shape))))]
  out = [_idx_const(0, dt)] * len(src_shape)
  for olds, news in groups:
    flat = flat_index(tuple(idxs[k] for k in news), tuple(shape[k] for k in news))
    run = tuple(src_shape[k] for k in olds)
    for i, (k, st, s) in enumerate(zip(olds, strides_for(run), run)):
      if isinstance(s, int) and s == 1: continue
      e = flat // _to_uop(st, dt) if not (isinstance(st, int) and st == 1) else flat
      out[k] = e % _to_uop(s, dt) if i > 0 else e
  return tuple(out)

def index_through(u: UOp, idxs: tuple[UOp, ...],
                  stop: Callable[[UOp], bool] | None = None) -> tuple[UOp, tuple[UOp, ...], UOp | None]:
  """Walk down movement ops (to the first node `stop` accepts, if given): the base node, the index into it, and the
  validity condition (None: always valid)."""
  valid: UOp | None = None
  dt = _index_dtype(idxs)
  while u.op in GroupOp.Movement and not (stop is not None and stop(u)):
    src = u.src[0]
    if u.op is Ops.RESHAPE:
      idxs = _reshape_index(idxs, u.shape, src.shape, dt)
    elif u.op is Ops.PERMUTE:
      new = [_idx_const(0, dt)] * len(idxs)
      for i, p in enumerate(u.arg): new[p] = idxs[i]
      idxs = tuple(new)
    elif u.op is Ops.EXPAND:
      idxs = tuple(_idx_const(0, dt) if (isinstance(s, int) and s == 1) and not (isinstance(n, int) and n == 1) else i
                   for i, s, n in zip(idxs, src.shape, u.arg))
    elif u.op is Ops.PAD:
      new = []
      for idx, (b, a), s in zip(idxs, u.arg, src.shape):
        if b or a:
          cond: UOp | None = None
          if b: cond = idx.ge(b)
          if a: cond = idx.lt(_to_uop(s, dt) + b) if cond is None else cond & idx.lt(_to_uop(s, dt) + b)
          if cond is not None: valid = cond if valid is None else valid & cond
        new.append(idx - b if b else idx)
      idxs = tuple(new)
    elif u.op is Ops.SHRINK:
      idxs = tuple(i + _to_uop(b, dt) if not (isinstance(b, int) and b == 0) else i for i, (b, _) in zip(idxs, u.arg))
    elif u.op is Ops.FLIP:
      idxs = tuple((_to_uop(s, dt) - 1 - i) if f else i for i, f, s in zip(idxs, u.arg, src.shape))
    u = src
  return u, idxs, valid

def _and(a: UOp | None, b: UOp | None) -> UOp | None:
  if a is None: return b
  if b is None: return a
  return a & b

def lower(u: UOp, idxs: tuple[UOp, ...], valid: UOp | None, ctx: KernelCtx) -> UOp:
  """The scalar value of tensor node `u` at position `idxs` (only read under `valid`)."""
  key = (u, idxs, valid)
  if (ret := ctx.memo.get(key)) is not None: return ret
  ret = _lower(u, idxs, valid, ctx)
  ctx.memo[key] = ret
  return ret

def _load(buf: UOp, idx: UOp, valid: UOp | None, ctx: KernelCtx) -> UOp:
  return ctx.param(buf).index(idx, valid).load()

def _reshaped_buffer(u: UOp, ctx: KernelCtx) -> UOp | None:
  """The buffer under a chain of reshapes, if the chain ends at one (a BUFFER, or a node already materialised)."""
  base = u
  while base.op is Ops.RESHAPE: base = base.src[0]
  if base is ctx.output: return None
  buf = base if base.op is Ops.BUFFER else ctx.realized.get(base)
  return buf if buf is not None and buf.op is Ops.BUFFER else None

def _lower(u: UOp, idxs: tuple[UOp, ...], valid: UOp | None, ctx: KernelCtx) -> UOp:
  if u.op is Ops.ASSIGN and u is not ctx.output:
    return lower(u.src[0], idxs, valid, ctx)  # an assign's value lives in its target (a view of a buffer)
  if u is not ctx.output and any(isinstance(s, int) and s == 0 for s in u.shape):
    # a node without elements is only reached through a PAD's padding (e.g. a reduction over an empty axis pads in
    # its identity): nothing is read, so no zero-size buffer becomes a kernel argument
    return UOp.const(strong_dtype(u.dtype), 0)  # type: ignore[arg-type]
  if u is not ctx.output and u in ctx.realized:
    return _load(ctx.realized[u], flat_index(idxs, u.shape), valid, ctx)
  dt: DType = strong_dtype(u.dtype)  # type: ignore[arg-type]
  if u.op is Ops.RESHAPE and (flat := _reshaped_buffer(u, ctx)) is not None:
    # a reshape keeps the element order: a materialised buffer is read at the flat index of the reshaped view, not
    # through the div/mod chain that splitting and re-joining the dims would leave (and symbolic cannot always fold)
    return _load(flat, flat_index(idxs, u.shape), valid, ctx)
  if u.op in GroupOp.Movement:
    at_buffer = lambda n: n.op is Ops.RESHAPE and _reshaped_buffer(n, ctx) is not None  # noqa: E731
    base, new_idxs, cond = index_through(u, idxs, at_buffer)
    inner = lower(base, new_idxs, _and(valid, cond), ctx)
    return inner if cond is None else cond.where(inner, inner.const_like(0))
  if u.op is Ops.BUFFER: return _load(u, idxs[0] if idxs else _idx_const(0, ctx.index_dtype), valid, ctx)
  if u.op is Ops.CONST: return UOp.const(dt, u.arg)
  if u.op is Ops.RANGE: return idxs[0].cast(dt)  # tensor-level iota: the index along its only dim
  if u.op is Ops.BIND:
    ctx.var_vals[u.src[0].arg[0]] = u.src[1].arg
    return u.src[0].cast(dt)
  if u.op is Ops.DEFINE_VAR: return u.cast(dt)
  if u.op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD, Ops.CUSTOM_GRAD):
    return lower(u.src[0], idxs, valid, ctx)
  if u.op is Ops.REDUCE_AXIS:
    op, axes = u.arg
    src = u.src[0]
    rngs = {a: ctx.new_range(src.shape[a], AxisType.REDUCE) for a in axes}
    inner_idxs = tuple(rngs[i] if i in rngs else idx for i, idx in enumerate(idxs))
    inner = lower(src, inner_idxs, valid, ctx)
    return UOp(Ops.REDUCE, inner.dtype, (inner, *rngs.values()), op)
  if u.op is Ops.CAST:
    inner = lower(u.src[0], idxs, valid, ctx)
    return inner.cast(dt)
  if u.op is Ops.BITCAST:
    inner = lower(u.src[0], idxs, valid, ctx)
    return inner.bitcast(dt)
  if u.op in GroupOp.ALU:
    srcs = tuple(lower(s, idxs, valid, ctx) for s in u.src)
    if u.op is Ops.WHERE: return UOp(Ops.WHERE, srcs[1].dtype, srcs)
    return UOp(u.op, dtypes.bool if u.op in GroupOp.Comparison else srcs[0].dtype, srcs)
  raise ShapeError(f"cannot lower {u.op} inside a kernel")

def lower_kernel(node: UOp, out_buf: UOp, realized: dict[UOp, UOp]) -> tuple[UOp, list[UOp], dict[str, int]]:
  """The kernel AST that computes `node` into `out_buf`: (SINK, buffer uops by slot, variable values)."""
  ctx = KernelCtx(realized, node, dtypes.int64 if needs_int64_index(node, out_buf, realized) else dtypes.int32)
  shape = node.shape
  ranges = tuple(_idx_const(0, ctx.index_dtype) if isinstance(s, int) and s == 1 else
                 ctx.new_range(s, AxisType.GLOBAL) for s in shape)
  if node.op is Ops.ASSIGN:
    target, value = node.src
    base, tidx, tvalid = index_through(target, ranges)
    store_buf = base if base.op is Ops.BUFFER else realized[base]
    out_param = ctx.param(store_buf)
    val = lower(value, ranges, None, ctx)
    store_idx = tidx[0] if base.op is Ops.BUFFER else flat_index(tidx, base.shape)
    store = out_param.index(store_idx, tvalid).store(val)
  else:
    out_param = ctx.param(out_buf)
    val = lower(node, ranges, None, ctx)
    store = out_param.index(flat_index(ranges, shape)).store(val)
  ends = tuple(r for r in ranges if r.op is Ops.RANGE)
  sink = UOp(Ops.SINK, dtypes.void, (store,), arg=KernelInfo(len(ends)))
  # a kernel over symbolic sizes: index math built from the views' shapes (strides, the output's flat index) still
  # holds their BINDs; the kernel reads each variable as a DEFINE_VAR whose value comes with the launch
  if ctx.var_vals: sink = sink.substitute({b: _unbound(b, ctx) for b in sink.toposort() if b.op is Ops.BIND})
  return sink, ctx.bufs, ctx.var_vals

def kernel_size(shape: tuple[sint, ...]) -> sint: return prod(shape)
