"""Kernel optimisations on the kernel AST: upcasting output ranges and splitting reductions.

Both unroll a range by substitution (hash-consing shares everything that does not depend on the unrolled index), and
the linearizer runs reductions that share their ranges in one loop, so the C compiler sees independent accumulators
it can keep in vector registers:

* `upcast(ast, rng, amt)`: output range `r` -> `r_o*amt + c` for c in 0..amt-1; each store is repeated amt times.
  A matmul's output columns become amt accumulators over one shared k loop (register blocking).
* `split_reduce(ast, red, amt)`: a reduction over `k` -> amt partial reductions over `k_o` (k = k_o*amt + c), combined
  at the end. The partial sums of a dot product are then independent lanes a vector unit can run at once.

`hand_coded_opts` picks them for renderers that declare a SIMD width (`Renderer.simd_width`); every opt preserves
the kernel's results up to float reassociation.
"""
from __future__ import annotations
from ember.dtype import dtypes
from ember.errors import CompileError
from ember.renderer import Renderer
from ember.uop.ops import Ops, UOp, AxisType
from ember.uop.rewrite import graph_rewrite
from ember.uop.symbolic import symbolic

class KernelOptError(CompileError):
  """An optimisation does not apply to this kernel (the range does not divide, is symbolic, ...)."""

def _const_end(rng: UOp) -> int:
  if rng.src[0].op is not Ops.CONST: raise KernelOptError(f"range {rng.arg} has a symbolic end")
  return rng.src[0].arg

def upcast(ast: UOp, rng: UOp, amt: int, outermost: bool = False) -> UOp:
  """Unroll output range `rng` by `amt`: amt stores per iteration of the shortened range. `outermost` moves the
  shortened range outside the other output loops (loops run in axis order), so what it selects stays in cache."""
  end = _const_end(rng)
  if rng.arg[1] is not AxisType.GLOBAL or end % amt or amt < 2: raise KernelOptError(f"cannot upcast range of {end} by {amt}")
  axis = rng.arg[0]
  if outermost:
    # renumber the other ranges one up so the shortened range can take axis 0 (loops open in axis order)
    shift = {r: r.replace(arg=(r.arg[0] + 1, *r.arg[1:])) for r in ast.toposort() if r.op is Ops.RANGE}
    ast, rng, axis = ast.substitute(shift), shift[rng], 0
  outer = UOp.range(end // amt, axis, AxisType.GLOBAL)
  stores = tuple(st.substitute({rng: outer * amt + c}) for c in range(amt) for st in ast.src)
  return graph_rewrite(ast.replace(src=stores), symbolic, name="upcast")

def split_reduce(ast: UOp, red: UOp, amt: int) -> UOp:
  """Split a one-range reduction into `amt` independent partial reductions, combined after the loop."""
  if len(red.src) != 2: raise KernelOptError("split_reduce handles reductions over one range")
  rng = red.src[1]
  end = _const_end(rng)
  if end % amt or amt < 2: raise KernelOptError(f"cannot split a reduction of {end} by {amt}")
  outer = UOp.range(end // amt, rng.arg[0], AxisType.REDUCE)
  parts = [UOp(Ops.REDUCE, red.dtype, (red.src[0].substitute({rng: outer * amt + c}), outer), red.arg) for c in range(amt)]
  while len(parts) > 1:  # combine as a tree: fewer dependent steps, and pairs of lanes like a vector reduction
    parts = [UOp(red.arg, red.dtype, (parts[i], parts[i + 1])) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
  return graph_rewrite(ast.substitute({red: parts[0]}), symbolic, name="split reduce")

def _stride(idx: UOp, rng: UOp) -> int | None:
  """How much `idx` moves when `rng` steps by one, if that is a constant."""
  diff = graph_rewrite(idx.substitute({rng: rng + 1}) - idx, symbolic, name="stride")
  return diff.arg if diff.op is Ops.CONST else None

def hand_coded_opts(ast: UOp, renderer: Renderer) -> UOp:
  """The default opts: register-block a reduction's contiguous output columns, else vectorise its partial sums."""
  width = getattr(renderer, "simd_width", 0)
  if width < 2: return ast
  reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE]
  if not reduces: return ast
  nodes = list(ast.toposort())
  globals_ = sorted((n for n in nodes if n.op is Ops.RANGE and n.arg[1] is AxisType.GLOBAL and n.src[0].op is Ops.CONST),
                    key=lambda r: r.arg[0])
  loads = [n.src[0].src[1] for n in nodes if n.op is Ops.LOAD]
  # matmul-like: an output range that some input reads contiguously, while another input ignores it
  for rng in reversed(globals_):
    if _const_end(rng) % width: continue
    strides = [_stride(i, rng) for i in loads]
    if 1 in strides and 0 in strides:
      # one vector of output columns per k step; gcc keeps it in one register (more rows of accumulators defeat its
      # SLP vectoriser), and the column block goes outermost so its slice of the second input stays in cache
      return upcast(ast, rng, width, outermost=True)
  # reductions over a long contiguous range: independent partial sums
  for red in reduces:
    if len(red.src) == 2 and red.src[1].src[0].op is Ops.CONST and red.src[1].src[0].arg % width == 0 \
       and red.src[1].src[0].arg >= 4 * width and red.arg in (Ops.ADD, Ops.MAX) and not dtypes.is_int(red.dtype):
      ast = split_reduce(ast, red, width)
  return ast
