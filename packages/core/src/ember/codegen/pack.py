"""Operand packing: a matmul-like kernel on a CPU reads its B operand from a copy laid out for the register block.

A register-blocked matmul (codegen/opt.py) reads, per step of the reduction, one row of B's column block: a few
vectors `K*N` elements apart. Where that stride is a large power of two, every row maps to the same few cache sets and
the block's panel of B falls out of L1 and L2 between row blocks (33 GFLOP/s for 1024x1024 on one core of the
development machine); where B is a transposed view (`x @ W.T`, every Linear layer) its columns are not contiguous at
all and no column block exists. Packing copies B once, in a kernel of its own, into the layout the block walks:

    Bp[(batch..., n // W, k..., n % W)] = B[batch..., k..., n]       W = the block's columns

so one block's panel is `K*W` contiguous elements (94 GFLOP/s on one core for the same matmul). The copy reads and
writes B once; the matmul reads it once per block of rows, so packing is planned only where rows are many
(`PACK_MIN_ROWS`) and B is big enough for its layout to matter (`PACK_MIN_ELEMENTS`).

The engine runs a plan as two calls with a scratch buffer between them (engine/realize.py); renderers ask for it
with `Renderer.pack_operands`. Results are those of the unpacked kernel: the same products summed in the same order.
"""
from __future__ import annotations
from dataclasses import dataclass
from ember.dtype import DType, PtrDType
from ember.helpers import NOOPT, prod
from ember.renderer import Renderer
from ember.uop.ops import Ops, UOp, AxisType, KernelInfo
from ember.codegen.opt import output_ranges, block_columns, resident_column, _const_end, _lane_stride, \
  MATMUL_COLS, WIDE_COLS, wide_rows, eight_rows

# elements of one column block's panel of B (K x the block's columns) up to which B is packed in blocks of 4 vectors
# (512 KB of float32, a quarter of the AVX-512 VM's 2 MB L2 per core). CPU time of the programs, alternating runs under
# load: 1024^3 (a 256 KB panel) ran 96 -> 113 GFLOP/s on two threads (median of 12, faster in 10) in 4 x 4-vector
# blocks; 2048^3 (512 KB) 151-152 -> 162-164 GFLOP/s on one thread (best of 5) in 6 x 4-vector blocks against 8 rows
# x 2 vectors over a 256 KB panel (4 x 4-vector blocks had been slower there on a VM with a smaller L2)
WIDE_PANEL = 1 << 17

PACK_MIN_ROWS = 32  # outputs sharing each column block of B (rows of a matmul, pixels of a convolution)
PACK_MIN_ELEMENTS = 1 << 14  # elements of B (64 KB of float32): smaller operands stay in L1/L2 as they are

@dataclass(frozen=True)
class PackPlan:
  """`pack` copies the kernel's buffer `src_slot` into a scratch buffer of `size` elements of `dtype` (the pack
  kernel's PARAM 0 is the scratch, PARAM 1 the source); `main` is the kernel reading the scratch as PARAM
  `scratch_slot` instead of the source."""
  pack: UOp
  main: UOp
  src_slot: int
  scratch_slot: int
  size: int
  dtype: DType

def _ranges(x: UOp) -> set[UOp]: return {n for n in x.toposort() if n.op is Ops.RANGE}

def _flat(idxs: list[UOp], ends: list[int]) -> UOp:
  out = idxs[0]
  for i, e in zip(idxs[1:], ends[1:]): out = out * e + i
  return out

def _find_operand(sink: UOp, red: UOp, width: int) -> tuple[UOp, UOp, int] | None:
  """(B's load, its column range, the block's columns): the load inside the reduction that moves with an output
  column range and a reduce range but not with a long output row range, which another load (A) moves with while
  ignoring the column."""
  outs = output_ranges(sink)
  loads = [n for n in red.src[0].toposort() if n.op is Ops.LOAD]
  if len(loads) < 2: return None
  moves = {ld: _ranges(ld.src[0]) for ld in loads}  # the ranges each load's index moves with
  reduce_rngs = set(red.src[1:])
  stores = [n.src[0].src[1] for n in sink.toposort() if n.op is Ops.STORE]
  for col in reversed(outs):
    if (span := block_columns(_const_end(col), width)) is None: continue
    # the block's columns are stored contiguously (gcc's SLP vectoriser starts from those stores; a block of rows
    # stored a row apart, A packed in B's place, ran at 5 GFLOP/s)
    if any(_lane_stride(st, col, span) != 1 for st in stores): continue
    for b in loads:
      idx = b.src[0]
      if len(idx.src) != 2 or idx.src[0].op is not Ops.PARAM: continue  # gated (padded) loads stay as they are
      brngs = moves[b]
      if col not in brngs or not brngs & reduce_rngs or not brngs <= set(outs) | reduce_rngs: continue
      # B's reuse: the outputs that read the same B elements (every output range B ignores: a convolution's
      # batch x height x width, a matmul's rows)
      rows = [r for r in outs if r is not col and r not in brngs]
      if prod(_const_end(r) for r in rows) < PACK_MIN_ROWS: continue
      if any(col not in moves[a] and row in moves[a] for a in loads if a is not b for row in rows):
        return b, col, span
  return None

def plan_packing(ast: UOp, renderer: Renderer) -> PackPlan | None:
  """A packing plan for a kernel AST (as the scheduler made it), or None where packing does not apply or would not
  pay. The scratch buffer takes the slot after the kernel's last buffer."""
  width = getattr(renderer, "simd_width", 0)
  if NOOPT.value or width < 2 or not getattr(renderer, "pack_operands", False): return None
  from ember.codegen import simplify_kernel
  sink = simplify_kernel(ast)
  reds = [n for n in sink.toposort() if n.op is Ops.REDUCE]
  if len(reds) != 1 or reds[0].arg is not Ops.ADD: return None
  red = reds[0]
  rngs = [n for n in sink.toposort() if n.op is Ops.RANGE]
  if any(r.src[0].op is not Ops.CONST for r in rngs): return None  # symbolic sizes: no fixed layout
  if (found := _find_operand(sink, red, width)) is None: return None
  load, col, span = found
  idx, param = load.src[0].src[1], load.src[0].src[0]
  brngs = _ranges(idx)
  batch = [r for r in output_ranges(sink) if r in brngs and r is not col]
  ks = [r for r in red.src[1:] if r in brngs]
  # blocks of 4 vectors where the kernel runs 6 rows x 4 vectors over them (opt.packed_wide, opt.wide_rows) and their
  # panel of B stays within WIDE_PANEL, else of 2 (a block of 2 vectors finds no constant lane stride in a 4-vector
  # packing); all the columns where they are 4 vectors
  if span == WIDE_COLS * width and _const_end(col) != span:
    # the kernel's rows: the innermost output range the other loads (A) move with and B does not (opt.matmul_axes)
    a_rngs = set().union(*(_ranges(n.src[0]) for n in red.src[0].toposort() if n.op is Ops.LOAD and n is not load))
    row = next((r for r in reversed(output_ranges(sink)) if r is not col and r not in brngs and r in a_rngs), None)
    if row is None or not wide_rows(_const_end(row)) or prod(_const_end(r) for r in ks) * span > WIDE_PANEL or \
       eight_rows(sink, _const_end(row)):
      span = MATMUL_COLS * width
  ends = [_const_end(r) for r in batch] + [_const_end(col) // span] + [_const_end(r) for r in ks] + [span]
  size = prod(ends)
  # a small B stays as it is where its block's columns are contiguous already; strided ones (a conv's weight in its
  # (Cout, *kernel, Cin) order, W.T) give the unpacked kernel no column block at all
  if size < PACK_MIN_ELEMENTS and _lane_stride(idx, col, span) == 1: return None
  # a B that stays in L2 as it lies is read there by 4 x 4-vector blocks (opt.resident_column): no pack kernel
  if resident_column(sink, width) == output_ranges(sink).index(col): return None
  assert isinstance(param.dtype, PtrDType)
  dtype = param.dtype.base
  # the pack kernel: one output range per packed dim, in layout order (its stores run contiguously)
  g = [UOp.range(e, i, AxisType.GLOBAL, col.dtype) for i, e in enumerate(ends)]
  sub = {r: g[i] for i, r in enumerate(batch)} | {r: g[len(batch) + 1 + i] for i, r in enumerate(ks)}
  sub[col] = g[len(batch)] * span + g[-1]
  src_param = UOp(Ops.PARAM, param.dtype, (), 1)
  out_param = UOp(Ops.PARAM, dtype.ptr(size), (), 0)
  value = src_param.index(idx.substitute(sub)).load()
  pack = UOp(Ops.SINK, sink.dtype, (out_param.index(_flat(g, ends)).store(value),), KernelInfo(len(g)))
  # the main kernel reads the scratch at the packed position of the element it read from B
  slot = 1 + max(n.arg for n in ast.toposort() if n.op is Ops.PARAM)
  scratch = UOp(Ops.PARAM, dtype.ptr(size), (), slot)
  packed_idx = _flat([*batch, col // span, *ks, col % span], ends)
  main = sink.substitute({load.src[0]: scratch.index(packed_idx)})
  return PackPlan(pack, main, param.arg, slot, size, dtype)
