"""GPU launch opts: an explicit choice of how a kernel maps onto blocks and threads, for BEAM and for users.

Without one, codegen's GPU heuristics decide (tensor cores, staged when the matmul is big enough; group reductions;
else one thread per output in blocks of up to 256). A kernel's opt list may hold one launch opt (`opt.LAUNCH_KINDS`):

* `LOCAL(axis, amt)`: output range `axis` is split into blocks of `amt` threads (`lidx0`); the other output ranges
  and the blocks of this one make up the grid (`gidx0`). `amt` must divide the range (PADTO it first otherwise).
* `GROUP(0, amt)` / `GROUPTOP(0, amt)`: every reduction is shared by the `amt` threads of a block (codegen/group.py);
  thread t takes elements t, t+amt, ... (GROUP: adjacent threads read adjacent elements) or the t-th contiguous chunk
  of R/amt elements (GROUPTOP).
* `TC(warps, amt)`: the matmul runs on the target's matrix instructions, `warps` warps per block each with `amt` x
  `amt` instruction tiles, operands staged through shared memory; `TC(1, 0)` is one warp per tile, unstaged
  (codegen/tensorcore.py).

Each raises KernelOptError when it does not fit the kernel or the target, so BEAM can try them blindly.
"""
from __future__ import annotations
from ember.dtype import dtypes
from ember.helpers import prod
from ember.renderer import Renderer
from ember.uop.ops import AxisType, Ops, UOp
from ember.codegen.group import global_ranges, group_reduce, unflatten
from ember.codegen.opt import LAUNCH_KINDS, KernelOptError, Opt, apply_opts_list, output_ranges
from ember.codegen.tensorcore import STAGED_TILES, apply_tensor_cores

Launch = tuple[UOp, list[int], list[int]]

def apply_local(ast: UOp, renderer: Renderer, axis: int, amt: int) -> Launch:
  """Output range `axis` split into blocks of `amt` threads; the grid walks the other ranges and this one's blocks."""
  ranges = global_ranges(ast)
  if any(r.src[0].op is not Ops.CONST for r in ranges): raise KernelOptError("LOCAL needs constant output ranges")
  rng = next((r for r in ranges if r.arg[0] == axis), None)
  if rng is None: raise KernelOptError(f"LOCAL: the kernel has no output range with axis {axis}")
  if amt < 1 or rng.src[0].arg % amt or (renderer.local_max and amt > renderer.local_max[0]):
    raise KernelOptError(f"LOCAL: {amt} threads do not divide the range of {rng.src[0].arg} or exceed the block limit")
  counts = [r.src[0].arg // amt if r is rng else r.src[0].arg for r in ranges]
  if renderer.global_max and prod(counts) > renderer.global_max[0]: raise KernelOptError("LOCAL: the grid is too big")
  gidx = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, prod(counts)),), "gidx0")
  lidx = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, amt),), "lidx0")
  subs = {r: i.cast(r.dtype) for r, i in zip(ranges, unflatten(gidx, counts))}
  subs[rng] = subs[rng] * amt + lidx.cast(rng.dtype)
  return ast.substitute(subs), [prod(counts), 1, 1], [amt, 1, 1]

def apply_launch(ast: UOp, renderer: Renderer, opts: list[Opt] | tuple[Opt, ...]) -> Launch | None:
  """The kernel launched as its launch opt says (None: it has none, codegen's heuristics decide)."""
  launch = [o for o in opts if o.op in LAUNCH_KINDS]
  if not launch: return None
  if len(launch) > 1: raise KernelOptError(f"one launch opt per kernel, got {launch}")
  if not renderer.has_local: raise KernelOptError(f"{launch[0]}: {renderer} has no blocks of threads")
  if any(n.op is Ops.RANGE and n.dtype is dtypes.int64 for n in ast.toposort()):
    raise KernelOptError(f"{launch[0]}: the kernel indexes with int64, the hardware indices are int32")
  opt = launch[0]
  if opt.op == "LOCAL": return apply_local(ast, renderer, opt.axis, opt.amt)
  if opt.op in ("GROUP", "GROUPTOP"):
    if (grouped := group_reduce(ast, renderer, opt.amt, top=opt.op == "GROUPTOP")) is None:
      raise KernelOptError(f"{opt}: the kernel's reductions cannot be shared by {opt.amt} threads on {renderer}")
    return grouped
  if (tc := apply_tensor_cores(ast, renderer, (opt.axis, opt.amt))) is None:
    raise KernelOptError(f"{opt}: no tensor core fits")
  return tc

def launch_candidates(ast: UOp, renderer: Renderer) -> list[tuple[Opt, ...]]:
  """BEAM's GPU candidates that fit `ast` on `renderer`: tensor core tilings (staged or not), group reductions of
  32..256 threads in both orders, blocks of 16..256 threads over the innermost output range, and reductions unrolled
  by 2 or 4 (with the heuristic launch)."""
  cands: list[tuple[Opt, ...]] = [(Opt("TC", warps, amt),) for warps, amt in ((1, 0), *STAGED_TILES, (2, 1), (4, 1))]
  cands += [(Opt(kind, 0, amt),) for kind in ("GROUP", "GROUPTOP") for amt in (32, 64, 128, 256)]
  if outs := output_ranges(ast): cands += [(Opt("LOCAL", outs[-1].arg[0], amt),) for amt in (16, 32, 64, 128, 256)]
  reds = sorted({r.arg[0] for r in ast.toposort() if r.op is Ops.RANGE and r.arg[1] is AxisType.REDUCE})
  cands += [(Opt("UNROLL", axis, amt),) for axis in reds for amt in (2, 4)]
  fitting: list[tuple[Opt, ...]] = []
  for cand in cands:
    try: apply_launch(apply_opts_list(ast, cand), renderer, cand)
    except KernelOptError: continue
    fitting.append(cand)
  return fitting
