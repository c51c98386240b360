"""Kernel optimisations on the kernel AST: upcasting output ranges, splitting reductions, threads, fused accumulation.

Opts unroll a range by substitution (hash-consing shares everything that does not depend on the unrolled index), and
the linearizer runs reductions that share their ranges in one loop, so the C compiler sees independent accumulators
it can keep in vector registers:

* `upcast(ast, rng, amt)`: output range `r` -> `r_o*amt + c` for c in 0..amt-1; each store is repeated amt times.
  A matmul's output columns become amt accumulators over one shared k loop; upcasting its rows as well gives a
  rows x columns block of accumulators per k step (register blocking: each loaded value is used several times).
  `strided=True` spreads the lanes over the range instead (`r_o + c*(n/amt)`): a matvec then streams amt distant
  rows of its weight at once (amt prefetch streams where one row at a time is one).
* `split_reduce(ast, red, amt)`: a reduction over `k` -> amt partial reductions over `k_o` (k = k_o*amt + c), combined
  at the end. The partial sums of a dot product are then independent lanes a vector unit can run at once. Over several
  ranges the innermost is split (a sum over (blocks, 16 lanes) becomes 16 partial sums over the blocks).
* `fuse_mulacc(uops)`: in the linear program, `acc = acc + a*b` becomes one MULACC, which renderers that declare
  `fused_mulacc` print as a fused multiply-add (what lets gcc keep a matmul's accumulators in vector registers).

A kernel's choice is a list of `Opt`s. `hand_coded_opts` picks one for renderers that declare a SIMD width
(`Renderer.simd_width`); BEAM (codegen/search.py) times alternatives. Every opt preserves the kernel's results up to
float reassociation (tests compare against the unoptimised kernel).
"""
from __future__ import annotations
from dataclasses import dataclass
from ember.dtype import dtypes
from ember.errors import CompileError
from ember.helpers import prod
from ember.renderer import Renderer
from ember.uop.ops import Ops, UOp, AxisType
from ember.uop import rewrite as uop_rewrite
from ember.uop.rewrite import graph_rewrite, PatternMatcher, UPat
from ember.uop.symbolic import symbolic, split_terms, term_factor

class KernelOptError(CompileError):
  """An optimisation does not apply to this kernel (the range does not divide, is symbolic, ...)."""

OPT_KINDS = ("UPCAST", "UPCAST_OUTER", "UPCAST_STRIDED", "UPCAST_PADDED", "SPLIT", "THREADS", "UNROLL", "PADTO",
             "LOCAL", "GROUP", "GROUPTOP", "TC")
LAUNCH_KINDS = ("LOCAL", "GROUP", "GROUPTOP", "TC")
"""GPU opts: how codegen maps the kernel onto blocks and threads (codegen/launch.py), at most one per kernel."""

@dataclass(frozen=True)
class Opt:
  """One optimisation. UPCAST/UPCAST_OUTER/UPCAST_STRIDED: `axis` is the axis number of a constant output range at the
  time the opt applies (UPCAST_OUTER makes the shortened range axis 0 and numbers every other range one up;
  UPCAST_STRIDED takes lanes `n/amt` apart, n the range's size, and writes each reduction's products `moving *
  shared`, see `rows_apart_opts`; UPCAST_PADDED first pads a range `amt` does not divide up to a multiple of it, the
  extra lanes loading what the range's last iteration loads and storing nothing, see `pad_range`); SPLIT: every
  float ADD/MAX reduction is split into `amt` partial sums over its innermost range (`axis` 0; `axis` 1 splits the
  ADD ones only, leaving MAX to a compiler that vectorises it as written); THREADS: the outermost output loop runs
  on `amt` CPU threads. UNROLL: the reduction range with axis number `axis` runs `amt` iterations per loop trip
  (unrolled in the body); PADTO: the output range `axis` is padded up to a multiple of `amt` (loads and stores of the
  extra iterations gated off). GPU launch opts (LAUNCH_KINDS): LOCAL: output range `axis` is split into blocks of `amt`
  threads; GROUP/GROUPTOP: `amt` threads of a block share every reduction (thread t takes elements t, t+amt, ... /
  the t-th contiguous chunk), combined through shared memory; TC: matrix instructions with `axis` warps per block and
  `amt` x `amt` instruction tiles per warp, operands staged through shared memory (`amt` 0: one warp per tile)."""
  op: str
  axis: int
  amt: int
  def __post_init__(self) -> None:
    if self.op not in OPT_KINDS: raise KernelOptError(f"unknown opt {self.op!r}; use one of {', '.join(OPT_KINDS)}")

def _const_end(rng: UOp) -> int:
  if rng.src[0].op is not Ops.CONST: raise KernelOptError(f"range {rng.arg} has a symbolic end")
  return rng.src[0].arg

def output_ranges(ast: UOp) -> list[UOp]:
  """The kernel's constant-size output ranges, in loop order."""
  rngs = (n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] is AxisType.GLOBAL and n.src[0].op is Ops.CONST)
  return sorted(rngs, key=lambda r: r.arg[0])

def upcast(ast: UOp, rng: UOp, amt: int, outermost: bool = False, strided: bool = False) -> UOp:
  """Unroll output range `rng` by `amt`: amt stores per iteration of the shortened range. `outermost` moves the
  shortened range outside the other output loops (loops run in axis order), so what it selects stays in cache.
  `strided`: iteration r_o computes r_o + c*(end/amt) for c in 0..amt-1 (lanes a quarter of the range apart for amt
  4) instead of r_o*amt + c."""
  end = _const_end(rng)
  if rng.arg[1] is not AxisType.GLOBAL or amt < 2 or end % amt:
    raise KernelOptError(f"cannot upcast range of {end} by {amt}")
  axis = rng.arg[0]
  if outermost:
    # renumber the other ranges one up so the shortened range can take axis 0 (loops open in axis order)
    shift = {r: r.replace(arg=(r.arg[0] + 1, *r.arg[1:])) for r in ast.toposort() if r.op is Ops.RANGE}
    ast, rng, axis = ast.substitute(shift), shift[rng], 0
  outer = UOp.range(end // amt, axis, AxisType.GLOBAL, rng.dtype)
  lanes = [outer + c * (end // amt) if strided else outer * amt + c for c in range(amt)]
  stores = _unroll(ast, rng, lanes, symbolic)
  return graph_rewrite(ast.replace(src=stores), symbolic, name="upcast")

def _unroll(ast: UOp, rng: UOp, values: list[UOp], pm: PatternMatcher | None = None) -> tuple[UOp, ...]:
  """The kernel's stores with `rng` replaced by each of `values` in turn (all stores per value). One walk finds the
  nodes that move with `rng`; only those are rebuilt per value (a substitution per value walked the whole kernel: a
  matmul's 32 column lanes, then 8 rows of 32 stores each, were most of a first call's opt time). `pm`: each lane's
  nodes come out as `graph_rewrite(store, pm)` would make them, each node rewritten as it is built from rewritten
  sources (`rewrite_built`), instead of raw copies the caller's rewrite then walks and builds again."""
  moving: dict[UOp, None] = {rng: None}
  for n in ast.toposort():
    if n is not ast and not moving.keys().isdisjoint(n.src): moving[n] = None
  if pm is not None and uop_rewrite.TRACER is not None: pm = None  # VIZ records the caller's rewrite step by step
  del moving[rng]
  # what the rewrite makes of the nodes that do not move (the same in every lane)
  fixed: dict[UOp, UOp] = {}
  if pm is not None:
    for n in moving:
      for s in n.src:
        if s not in moving and s not in fixed: fixed[s] = graph_rewrite(s, pm)
  out: list[UOp] = []
  for v in values:
    new = {**fixed, rng: v if pm is None else graph_rewrite(v, pm)}
    get = new.get
    for n in moving:
      node = UOp(n.op, n.dtype, tuple([get(s, s) for s in n.src]), n.arg, n.tag)
      new[n] = node if pm is None else uop_rewrite.rewrite_built(node, pm)
    out += [get(st, st) for st in ast.src]
  return tuple(out)

def shared_operand_first(ast: UOp, rng: UOp, moving_first: bool = False) -> UOp:
  """`ast` with every reduction's product of two loads that moves with `rng` on one side only written `shared *
  moving`: a matmul's column lanes (UPCAST_OUTER) then load one A value and then B's lanes in one run. gcc's SLP
  vectoriser needs that run: a weight gradient written `B * A` interleaved A's load with B's and left 32 of its
  block's 64 multiply-adds scalar (7.6 against 26 GFLOP/s). `moving_first` writes them `moving * shared` instead: the
  C renderer's lane groups order a row's partial sums by the address of their first load, which must then be the
  row's own (a matvec's weight row), not the vector every row shares (it would group one lane of each row: gathers,
  left scalar). Float products commute exactly, so results do not change."""
  def loaded(x: UOp) -> bool: return x.op is Ops.LOAD or (x.op is Ops.CAST and loaded(x.src[0]))
  products = {p for r in ast.toposort() if r.op is Ops.REDUCE and (p := r.src[0]).op is Ops.MUL
              and all(loaded(x) for x in p.src)}
  moving: set[UOp] = {rng}
  new: dict[UOp, UOp] = {}
  for n in ast.toposort():
    if n is not rng and any(s in moving for s in n.src): moving.add(n)
    src = tuple(new.get(s, s) for s in n.src)
    if n in products and (n.src[1] if moving_first else n.src[0]) in moving and \
       (n.src[0] if moving_first else n.src[1]) not in moving: src = (src[1], src[0])
    if src != n.src: new[n] = UOp(n.op, n.dtype, src, n.arg, n.tag)
  return new.get(ast, ast)

def split_reduce(ast: UOp, red: UOp, amt: int) -> UOp:
  """Split a reduction into `amt` independent partial reductions, combined after the loop. Over several ranges, the
  innermost (its last range, the loop that runs fastest) is split: k = k_o*amt + c; a k_o of one iteration goes."""
  rng = red.src[-1]
  end = _const_end(rng)
  if amt < 2 or end % amt: raise KernelOptError(f"cannot split a reduction of {end} by {amt}")
  keep = red.src[1:-1]
  if end == amt and keep: outer, rngs = UOp.const(rng.dtype, 0), keep  # lane c of the loop over the other ranges
  else:
    outer = UOp.range(end // amt, rng.arg[0], AxisType.REDUCE, rng.dtype)
    rngs = (*keep, outer)
  parts = [UOp(Ops.REDUCE, red.dtype, (red.src[0].substitute({rng: outer * amt + c}), *rngs), red.arg)
           for c in range(amt)]
  while len(parts) > 1:  # combine by halves, like a vector reduction: lane c with lane c + half, as whole vectors
    half = (len(parts) + 1) // 2
    parts = [UOp(red.arg, red.dtype, (parts[i], parts[i + half])) if i + half < len(parts) else parts[i]
             for i in range(half)]
  return graph_rewrite(ast.substitute({red: parts[0]}), symbolic, name="split reduce")

def _splittable(red: UOp) -> bool:
  """A float ADD/MAX reduction over constant ranges (its innermost range is the one split)."""
  return len(red.src) >= 2 and all(r.src[0].op is Ops.CONST for r in red.src[1:]) and red.arg in (Ops.ADD, Ops.MAX) \
    and not dtypes.is_int(red.dtype)

def _split_key(red: UOp) -> tuple[tuple[object, int], ...]:
  return tuple((r.arg, _const_end(r)) for r in red.src[1:])

def apply_opt(ast: UOp, opt: Opt) -> UOp:
  """Apply one opt to a kernel AST; KernelOptError when it does not fit this kernel."""
  if opt.op in ("UPCAST", "UPCAST_OUTER", "UPCAST_STRIDED", "UPCAST_PADDED"):
    rng = next((r for r in output_ranges(ast) if r.arg[0] == opt.axis), None)
    if rng is None: raise KernelOptError(f"{opt}: the kernel has no constant output range with axis {opt.axis}")
    if opt.op == "UPCAST_PADDED":
      if opt.amt >= 2 and _const_end(rng) % opt.amt:
        ast = pad_range(ast, rng, opt.amt, clamp=True)
        rng = next(r for r in output_ranges(ast) if r.arg[0] == opt.axis)
      return upcast(ast, rng, opt.amt)
    if opt.op != "UPCAST": ast = shared_operand_first(ast, rng, moving_first=opt.op == "UPCAST_STRIDED")
    return upcast(ast, rng, opt.amt, outermost=opt.op == "UPCAST_OUTER", strided=opt.op == "UPCAST_STRIDED")
  if opt.op == "SPLIT":
    ops = (Ops.ADD,) if opt.axis == 1 else (Ops.ADD, Ops.MAX)
    reds = [n for n in ast.toposort() if n.op is Ops.REDUCE and _splittable(n) and n.arg in ops]
    if not reds: raise KernelOptError(f"{opt}: no float ADD/MAX reduction over constant ranges to split")
    for red in reds:
      if (end := _const_end(red.src[-1])) % opt.amt:
        raise KernelOptError(f"{opt}: a reduction whose innermost range is {end} does not divide")
    targets = {_split_key(r) for r in reds}  # the partial reductions' ranges differ (shorter or gone): not targets
    while (todo := next((n for n in ast.toposort() if n.op is Ops.REDUCE and _splittable(n) and n.arg in ops
                         and _split_key(n) in targets), None)) is not None:
      ast = split_reduce(ast, todo, opt.amt)
    return ast
  if opt.op == "UNROLL":
    rng = next((r for r in ast.toposort() if r.op is Ops.RANGE and r.arg[0] == opt.axis
                and r.arg[1] is AxisType.REDUCE), None)
    if rng is None: raise KernelOptError(f"{opt}: the kernel has no reduction range with axis {opt.axis}")
    return unroll_reduce(ast, rng, opt.amt)
  if opt.op == "PADTO":
    rng = next((r for r in output_ranges(ast) if r.arg[0] == opt.axis), None)
    if rng is None: raise KernelOptError(f"{opt}: the kernel has no constant output range with axis {opt.axis}")
    return pad_range(ast, rng, opt.amt)
  if opt.op in LAUNCH_KINDS: return ast  # applied where codegen maps the kernel onto the GPU (codegen/launch.py)
  if opt.amt < 1: raise KernelOptError(f"{opt}: a thread count must be at least 1")
  return ast  # THREADS is applied by codegen's thread split

def unroll_reduce(ast: UOp, rng: UOp, amt: int) -> UOp:
  """Every reduction over `rng` (k) runs over k_o = k // amt, its body the combination of the `amt` values at
  k = k_o*amt + c: fewer loop trips, independent loads the compiler can schedule together. Same order of combination
  as the loop for MAX; float sums pair up differently."""
  end = _const_end(rng)
  if amt < 2 or end % amt: raise KernelOptError(f"cannot unroll a reduction range of {end} by {amt}")
  outer = UOp.range(end // amt, rng.arg[0], AxisType.REDUCE, rng.dtype)
  new: dict[UOp, UOp] = {}
  for red in (n for n in ast.toposort() if n.op is Ops.REDUCE and rng in n.src[1:]):
    body = red.src[0].substitute({rng: outer * amt})
    for c in range(1, amt): body = UOp(red.arg, red.dtype, (body, red.src[0].substitute({rng: outer * amt + c})))
    new[red] = UOp(Ops.REDUCE, red.dtype, (body, *(outer if r is rng else r for r in red.src[1:])), red.arg)
  if not new: raise KernelOptError(f"no reduction runs over the range with axis {rng.arg[0]}")
  return graph_rewrite(ast.substitute(new), symbolic, name="unroll")

def pad_range(ast: UOp, rng: UOp, amt: int, clamp: bool = False) -> UOp:
  """Output range `rng` (n iterations) runs ceil(n/amt)*amt: every load and store whose index moves with it is gated
  by `rng < n` (a gated-off load reads 0 and nothing is stored), so the extra iterations compute garbage they never
  write. What LOCAL needs for a size no block divides. `clamp`: the stores are gated, the loads are not: they read at
  `min(rng, n-1)` (what iteration n-1 reads, always in bounds) and stay unconditional. A register block's rows padded
  so (a matmul's 1024 rows in blocks of 6) then load their A values with no test in the reduction's loop, where a
  gated load there cost more than the larger block saved (130 against 141 GFLOP/s for 1024^3)."""
  end = _const_end(rng)
  if amt < 2 or rng.arg[1] is not AxisType.GLOBAL: raise KernelOptError(f"cannot pad a range of {end} to {amt}")
  padded = UOp.range(-(-end // amt) * amt, rng.arg[0], AxisType.GLOBAL, rng.dtype)
  valid = padded.lt(end)
  if clamp:
    at = valid.where(padded, padded.const_like(end - 1))
    new: dict[UOp, UOp] = {}
    for n in ast.toposort():
      if n.op is Ops.STORE and rng in (idx := n.src[0]).src[1].toposort():
        gate = valid if len(idx.src) == 2 else idx.src[2].substitute({rng: padded}) & valid
        new[idx] = idx.replace(src=(idx.src[0], idx.src[1].substitute({rng: padded}), gate))
    # the stores' indices first (they move with the padded range, gated); every other use of `rng` reads clamped
    # one substitution: the new indices hold `padded`, not `rng`, so substituting `at` after them would not change them
    return ast.substitute({**new, rng: at})
  ast = ast.substitute({rng: padded})
  gated: dict[UOp, UOp] = {}
  for idx in (n for n in ast.toposort() if n.op is Ops.INDEX and n.src[0].op is Ops.PARAM):
    if padded not in idx.src[1].toposort(): continue
    gate = valid if len(idx.src) == 2 else idx.src[2] & valid
    gated[idx] = idx.replace(src=(idx.src[0], idx.src[1], gate))
  return ast.substitute(gated)

def _const_last(x: UOp, y: UOp, c: UOp) -> UOp | None:
  return (x + y) + c if dtypes.is_int(x.dtype) and x.op is not Ops.CONST else None

# `base + (off + c)` -> `(base + off) + c` on integers (associative, wrapping included): the unrolled loads of a row
# then share one base and differ by constants, which is how gcc's SLP vectoriser recognises a contiguous vector load
pm_const_last = PatternMatcher([
  (UPat(Ops.ADD, src=(UPat.var("x"), UPat(Ops.ADD, src=(UPat.var("y"), UPat.cvar("c"))))), _const_last),
])

def _divmod_parts(t: UOp) -> tuple[str, UOp, int, int, int] | None:
  """`(x//a)*k` as ("div", x, a, 0, k), `((x//a)%b)*k` as ("div", x, a, b, k), `(x%a)*k` as ("mod", x, a, 1, k)."""
  v, k = term_factor(t)
  if v is None or not v.src or v.src[-1].op is not Ops.CONST or v.src[-1].arg <= 0: return None
  if v.op is Ops.MOD and v.src[0].op is Ops.IDIV and v.src[0].src[1].op is Ops.CONST and v.src[0].src[1].arg > 0:
    return "div", v.src[0].src[0], v.src[0].src[1].arg, v.src[1].arg, k
  if v.op is Ops.IDIV: return "div", v.src[0], v.src[1].arg, 0, k
  if v.op is Ops.MOD: return "mod", v.src[0], v.src[1].arg, 1, k
  return None

def recombine_divmod(x: UOp) -> UOp | None:
  """In an int sum, `(x//a)*a*m + (x%a)*m -> x*m` and `((x//a)%b)*a*m + (x%a)*m -> (x%(a*b))*m` for x >= 0, the
  terms anywhere in the sum: what a reshape of a permuted view leaves in an index (`(k//192)*192 + ((k//64)%3)*64 +
  k%64` is `k`). Vectorisers need the plain index to see contiguous loads."""
  terms = split_terms(x)
  if len(terms) < 2: return None
  parts = [_divmod_parts(t) for t in terms]
  for i, p in enumerate(parts):
    if p is None or p[0] != "mod" or p[1].vmin < 0: continue
    _, base, a, _, m = p
    for j, q in enumerate(parts):
      if q is None or q[0] != "div" or q[1] is not base or q[2] != a or q[4] != a * m: continue
      merged = base if q[3] == 0 else base % base.const_like(a * q[3])
      rest = [t for n, t in enumerate(terms) if n not in (i, j)]
      out = merged if m == 1 else merged * merged.const_like(m)
      for t in rest: out = out + t
      return out
  return None

pm_recombine_divmod = PatternMatcher([
  (UPat(Ops.ADD, name="x", dtype=(dtypes.int32, dtypes.int64)), recombine_divmod),
])

def constants_last(ast: UOp) -> UOp:
  """`graph_rewrite(ast, pm_const_last)` that tries its rule only where it can match (a sum whose second term is a sum)
  or where a source changed: most nodes of an unrolled kernel are neither, and walking them all took a tenth of its
  opt time."""
  if uop_rewrite.TRACER is not None: return graph_rewrite(ast, pm_const_last, name="constants last")
  changed: dict[UOp, UOp] = {}
  changed_nodes = changed.keys()
  for n in ast.toposort():
    if not changed_nodes.isdisjoint(n.src):
      node = UOp(n.op, n.dtype, tuple([changed.get(s, s) for s in n.src]), n.arg, n.tag)
      # the rule's root is a sum: anything else rebuilt on changed sources is what the rewrite makes of it
      changed[n] = uop_rewrite.rewrite_built(node, pm_const_last) if n.op is Ops.ADD else node
    elif n.op is Ops.ADD and n.src[1].op is Ops.ADD and (new := uop_rewrite.rewrite_built(n, pm_const_last)) is not n:
      changed[n] = new
  return changed.get(ast, ast)

def apply_opts_list(ast: UOp, opts: list[Opt] | tuple[Opt, ...]) -> UOp:
  for o in opts: ast = apply_opt(ast, o)
  if any(o.op != "THREADS" for o in opts): ast = constants_last(ast)
  return ast

def opt_threads(opts: list[Opt] | tuple[Opt, ...]) -> int | None:
  """The thread count a THREADS opt asks for, else None (codegen's default)."""
  return next((o.amt for o in reversed(opts) if o.op == "THREADS"), None)

def _stride(idx: UOp, rng: UOp) -> int | None:
  """How much `idx` moves when `rng` steps by one, if that is a constant."""
  return _lane_stride(idx, rng, 0)

def _strides_of(idx: UOp) -> dict[tuple[UOp, int], int | None]:
  """The strides found so far of index `idx`, by (range, span), kept on the node: choosing a matmul's opts asks the
  same question of the same index 2-3 times (its axes, whether B stays resident, whether it is packed wide; 256 asks
  for 94 answers in the MLP step and transformer block), each a substitution and a symbolic rewrite."""
  if (found := idx.__dict__.get("_strides")) is None: found = idx.__dict__["_strides"] = {}
  return found

MATMUL_COLS = 2  # vectors of columns per register block of a matmul (hand_coded_opts)
# a matmul of exactly 4 vectors of columns takes them all in one block; 6 rows x 4 vectors: 24 of AVX-512's 32 vector
# registers accumulate, 4 hold B's vectors, one A's broadcast. Against 4 rows, each B vector loaded (from L2: the
# panel is 64-256 KB) serves 6 FMAs instead of 4. One thread, CPU time, best of 5 under load, B packed: 768^3 146 ->
# 163 GFLOP/s, 1024^3 (rows padded to 1026) 138-141 -> 154-155, 2048^3 150 (8 x 2 vectors) -> 161
WIDE_COLS, WIDE_ROWS = 4, 6

# multiply-adds of a matmul from which its block takes WIDE_ROWS rows; smaller ones take 4. The 6-row block unrolls
# 1.5x the accumulators, and codegen's time grows with them: a cold first call of the MLP step (784-512-512-10, batch
# 256, kernels of 2^25-2^27 multiply-adds) spent 151 -> 229 ms (best of 4-6) applying opts, for 6.77 -> 6.55 ms a
# step (one thread, best of 60)
TALL_BLOCK_MACS = 1 << 27

def tall_matmul(ast: UOp) -> bool:
  """Whether a kernel runs TALL_BLOCK_MACS iterations or more of its innermost body (a matmul's multiply-adds)."""
  rngs = [n for n in ast.toposort() if n.op is Ops.RANGE]
  return all(r.src[0].op is Ops.CONST for r in rngs) and prod(_const_end(r) for r in rngs) >= TALL_BLOCK_MACS

def eight_rows(ast: UOp, end: int) -> bool:
  """Whether a matmul below TALL_BLOCK_MACS with `end` rows takes 8 rows x MATMUL_COLS vectors (its B packed in
  blocks of that many, codegen/pack.py) instead of 4 x WIDE_COLS: where 8 divide its rows or padding to 8 is cheap
  (`block_rows`). One thread, CPU time, best of 5, alternating runs: 784x256 @ 256x512 1.47-1.53 -> 1.28-1.29 ms,
  512x256 @ 256x512 0.93-0.95 -> 0.82-0.83, 256x512 @ 512x512 0.94 -> 0.87-0.88, 256^3 (B read in place)
  0.211-0.216 -> 0.204; a 32-column panel of B (K x 32) also stays in L1 where a 64-column one did not."""
  return not tall_matmul(ast) and block_rows(end, 8) == 8

def tall_rows(end: int) -> int:
  """Rows per WIDE_COLS-vector block of a matmul of TALL_BLOCK_MACS or more with `end` rows: WIDE_ROWS where they
  divide them or padding is cheap (`block_rows`), else 7 where 7 divide them (28 accumulators; gcc keeps one of them
  on the stack, a load and a store per 28 FMAs), else WIDE_ROWS (`matmul_opts` takes a divisor). A 3x3 convolution's
  56 pixels of a row (64 output channels, 16 x 56 x 56 x 64 x 576 multiply-adds) in 7s: 32.5-33.1 -> 31.0-31.9 ms
  against 4s (one thread, CPU time, best of 8, four alternating runs each; padding 56 to 60 wastes 7%)."""
  return 7 if block_rows(end, WIDE_ROWS) != WIDE_ROWS and end % 7 == 0 else WIDE_ROWS

def wide_rows(end: int) -> bool:
  """Whether `end` rows suit the WIDE_COLS-vector block: WIDE_ROWS of them per block (padded where that is cheap,
  `block_rows`) or 4 (a multiple of 4 that padding to 6 would cost too much: 8, 16, 28)."""
  return end % 4 == 0 or block_rows(end, WIDE_ROWS) == WIDE_ROWS

def column_spans(end: int, width: int, cols: int = MATMUL_COLS) -> list[int]:
  """Columns per register block of a matmul with `end` output columns, best first: WIDE_COLS vectors where they divide
  them (4 rows x 4 vectors of accumulators: each A value loaded serves 4 vectors instead of 2, and A, often a tall
  im2col matrix or a 4 MB operand streamed from L3 once per column block, is read half as often), then `c` vectors
  (c = cols..1) that divide them, then half or a quarter of a vector (at least 4 lanes: an AVX2 or SSE register) for
  column counts no whole vector divides (200 = 25 x 8)."""
  out = [WIDE_COLS * width] if end % (WIDE_COLS * width) == 0 else []
  out += [c * width for c in range(max(cols, 1), 0, -1) if end % (c * width) == 0]
  if not out: out = [w for w in (width // 2, width // 4) if w >= 4 and end % w == 0]
  return list(dict.fromkeys(out))

# elements of a matmul's B (256 KB of float32, 64 pages: what the L1 TLB maps) up to which it is read where it lies,
# and the rows sharing it from which a larger B (up to 1 MB) is packed instead of read in place. One thread, CPU time
# of a JIT'd call, medians of 4-5 alternating runs under load 5-6, B packed on every call (as a train step's): 512^3
# 2.08 -> 1.93 ms (1.88 with the pack kept), 784 x 256 x 512 1.72 -> 1.59, 256 x 512 x 512 1.15 -> 1.03; 128 and 64
# rows ran slower packed (64 x 512 x 512 0.28 -> 0.34 ms: the copy costs more than the faster kernel saves). Read in
# place, B's rows 2 KB apart cross a page every other k step, which the prefetcher does not follow; packed, the
# block's panel is one contiguous stream
RESIDENT_ELEMENTS, RESIDENT_MAX_ELEMENTS, RESIDENT_PACK_ROWS = 1 << 16, 1 << 18, 256

def resident_column(ast: UOp, width: int) -> int | None:
  """The output range (an index into `output_ranges`) a matmul's B is read along, where B is contiguous over
  WIDE_COLS vectors of those columns, small enough (RESIDENT_ELEMENTS; up to RESIDENT_MAX_ELEMENTS where fewer than
  RESIDENT_PACK_ROWS rows share it) to stay in cache as it lies, and the rows suit the block (`wide_rows`):
  codegen/pack.py leaves such a B unpacked and the kernel takes 6 (or 4) rows x 4 vectors of columns.
  On the 2-core development VM (one thread, CPU time of the programs, medians of 3 alternating runs) 256^3 ran
  0.49 -> 0.40 ms, 512^3 4.5 -> 3.5 ms, 2048x256x256 4.6 -> 3.7 ms against B packed in 2-vector blocks of 8 rows; a
  B of 784 x 512 stayed faster packed (1.7-2.7 against 3.7-4.2 ms), and 10 rows blocked 2 at a time were slower
  than 5. None where B does not qualify."""
  if (axes := matmul_axes(ast, width, wide := WIDE_COLS * width)) is None: return None
  rngs = output_ranges(ast)
  if axes[1] is not None and not wide_rows(_const_end(rngs[axes[1]])): return None
  col = rngs[axes[0]]
  reds = [n for n in ast.toposort() if n.op is Ops.REDUCE]
  idxs = dict.fromkeys(n.src[0].src[1] for r in reds for n in r.src[0].toposort() if n.op is Ops.LOAD)
  b_rngs = [[x for x in i.toposort() if x.op is Ops.RANGE] for i in idxs if _lane_stride(i, col, wide) == 1]
  # a B with a symbolic size (a decode step's context) has no fixed footprint: not resident
  if not b_rngs or any(x.src[0].op is not Ops.CONST for rs in b_rngs for x in rs): return None
  size = max(prod(_const_end(x) for x in rs) for rs in b_rngs)
  # the outputs that read each element of B (every output range no B index moves with: a matmul's rows)
  shared = prod(_const_end(r) for r in rngs if all(r not in rs for rs in b_rngs))
  fits = size <= RESIDENT_ELEMENTS or (size <= RESIDENT_MAX_ELEMENTS and shared < RESIDENT_PACK_ROWS)
  return axes[0] if fits else None

def packed_wide(ast: UOp, width: int, axes: tuple[int, int | None]) -> bool:
  """Whether a matmul's B is read from a copy packed in blocks of WIDE_COLS vectors (contiguous within each block of
  columns, not across blocks: `(n//64)*K*64 + k*64 + n%64`). codegen/pack.py packs so where the rows suit the block
  (`wide_rows`) and its panel of B fits WIDE_PANEL: the kernel then runs 6 rows x 4 vectors, loading each A value once
  per 64 columns instead of 32 (A, streamed from L3 once per column block, is read half as often)."""
  if matmul_axes(ast, width, WIDE_COLS * width) != axes: return False
  col = output_ranges(ast)[axes[0]]
  reds = [n for n in ast.toposort() if n.op is Ops.REDUCE]
  idxs = dict.fromkeys(n.src[0].src[1] for r in reds for n in r.src[0].toposort() if n.op is Ops.LOAD)
  return any(_lane_stride(i, col, WIDE_COLS * width) == 1 and _stride(i, col) != 1 for i in idxs)

def block_columns(end: int, width: int) -> int | None:
  """The default columns per register block (the first of `column_spans`), None if no block of 4+ lanes divides."""
  return next(iter(column_spans(end, width)), None)

def _lane_stride(idx: UOp, rng: UOp, span: int) -> int | None:
  """How much `idx` moves per lane when `rng` is unrolled by `span` (rng -> r*span + c), if every lane c moves it by
  the same constant: a packed operand (`(n//span)*K*span + k*span + n%span`) is contiguous across the lanes of one
  block although not across blocks. `span` 0: how much it moves when `rng` steps by one (`_stride`)."""
  if span < 2 or _const_end(rng) % span: span = 0
  if (key := (rng, span)) in (found := _strides_of(idx)): return found[key]
  if span == 0:
    diff = graph_rewrite(idx.substitute({rng: rng + 1}) - idx, symbolic, name="stride")
    found[key] = diff.arg if diff.op is Ops.CONST else None
    return found[key]
  outer = UOp.range(_const_end(rng) // span, -1, AxisType.GLOBAL, rng.dtype)
  at = lambda c: idx.substitute({rng: outer * span + c})  # noqa: E731
  one, last = (graph_rewrite(at(c) - at(0), symbolic, name="lane stride") for c in (1, span - 1))
  found[key] = one.arg if one.op is Ops.CONST and last.op is Ops.CONST and last.arg == one.arg * (span - 1) else None
  return found[key]

def matmul_axes(ast: UOp, width: int, span: int | None = None) -> tuple[int, int | None] | None:
  """(column range, row range or None) of a matmul-like reduction kernel, as indexes into `output_ranges`: the column
  range is read contiguously (over blocks of `span` columns; default: of some register block's width) by one input
  (B) and ignored by another (A); the row range moves A and not B. Only the reductions' inputs count: what the
  kernel reads after them (a residual or bias added to the product) is read once per output either way."""
  if not (reds := [n for n in ast.toposort() if n.op is Ops.REDUCE]): return None
  rngs = output_ranges(ast)
  loads = list(dict.fromkeys(n.src[0].src[1] for r in reds for n in r.src[0].toposort() if n.op is Ops.LOAD))
  for ci in reversed(range(len(rngs))):
    col = rngs[ci]
    # an explicit span fits only a range it divides (lane strides of one it does not divide are not a block's)
    spans = ([span] if _const_end(col) % span == 0 else []) if span else column_spans(_const_end(col), width)
    strides = next((st for sp in spans if 1 in (st := [_lane_stride(i, col, sp) for i in loads]) and 0 in st), None)
    if strides is None: continue
    a_loads = [i for i, s in zip(loads, strides) if s == 0]
    b_loads = [i for i, s in zip(loads, strides) if s == 1]
    for ri in reversed(range(len(rngs))):
      if ri == ci: continue
      row = rngs[ri]
      if any(_stride(i, row) not in (0, None) for i in a_loads) and all(_stride(i, row) == 0 for i in b_loads):
        return ci, ri
    return ci, None
  return None

def matmul_opts(ast: UOp, width: int, cols: int, rows: int,
                axes: tuple[int, int | None] | None = None) -> list[Opt]:
  """A rows x (cols vectors of `width`) block of accumulators for a matmul-like kernel, column block outermost (its
  slice of B stays in cache while the rows stream). Amounts shrink to what divides; [] if the kernel is not one.
  `axes`: its `matmul_axes`, when the caller has them."""
  if (axes := axes or matmul_axes(ast, width)) is None: return []
  rngs = output_ranges(ast)
  cend = _const_end(rngs[axes[0]])
  # the block's columns must be contiguous in B (a packed B is so only within its own blocks)
  span = next((sp for sp in column_spans(cend, width, cols) if sp <= max(cols, 1) * width
               and matmul_axes(ast, width, sp) == axes), None)
  if span is None: return []
  ci, ri = axes
  # the block's lanes must be stored contiguously too: gcc's SLP vectoriser starts from the stores, and a block stored
  # a row apart (a (512, 10) weight gradient blocked along its 512) kept all 160 multiply-adds scalar
  if any(_lane_stride(n.src[0].src[1], rngs[ci], span) != 1 for n in ast.toposort() if n.op is Ops.STORE): return []
  opts = [Opt("UPCAST_OUTER", rngs[ci].arg[0], span)]
  if ri is not None and (r := block_rows(_const_end(rngs[ri]), rows)) > 1:
    # after UPCAST_OUTER every other axis is one up
    opts.append(Opt("UPCAST" if _const_end(rngs[ri]) % r == 0 else "UPCAST_PADDED", rngs[ri].arg[0] + 1, r))
  return opts

PAD_WASTE = 20  # a matmul's rows are padded up to a multiple of its block's where that adds at most 1/PAD_WASTE

def block_rows(end: int, rows: int) -> int:
  """Rows per register block for a matmul of `end` rows: `rows` where they divide them or padding them up to a
  multiple adds at most 1/PAD_WASTE of the rows (UPCAST_PADDED: 1024 in blocks of 6 computes 1026), else the largest
  count up to `rows` that divides them."""
  if rows < 2 or end % rows == 0 or (-end % rows) * PAD_WASTE <= end: return max(rows, 1)
  return next((r for r in range(rows, 1, -1) if end % r == 0), 1)

SHORT_REDUCE_ONE_THREAD = 1 << 20  # output elements x lanes up to which a short reduction runs on one thread

def reuse_opts(ast: UOp, amts: tuple[int, ...] = (8, 4, 2)) -> list[Opt]:
  """Register blocking for a reduction kernel that is no matmul (a convolution: its output columns are not a multiple
  of the SIMD width, its weights not contiguous in the output channels): upcast the longest output range that one
  input ignores (stride 0: a convolution's output channels, which the image does not depend on) and another moves
  along, by the largest of `amts` that divides it. Each such load is then shared by `amt` accumulators of one loop,
  so the loop does `amt` multiply-adds per load of that input. The innermost output range (the contiguous stores)
  stays as it is; [] when no range fits."""
  rngs = output_ranges(ast)
  loads = [n.src[0].src[1] for n in ast.toposort() if n.op is Ops.LOAD]
  best: tuple[int, UOp, int] | None = None
  for rng in rngs[:-1]:
    end = _const_end(rng)
    amt = next((a for a in amts if end % a == 0 and end > a), None)
    if amt is None: continue
    strides = [_stride(i, rng) for i in loads]
    if 0 in strides and any(s != 0 for s in strides) and (best is None or end > best[0]): best = (end, rng, amt)
  return [] if best is None else [Opt("UPCAST", best[1].arg[0], best[2])]

ROWS_APART = (4, 2)  # rows a row reduction streams at once (rows_apart_opts), the first that divides them

def rows_apart_opts(ast: UOp, width: int) -> list[Opt]:
  """A kernel of float sums and maxima over rows that lie contiguously along the reduction, one output per row (a
  row sum or max, softmax's statistics, a matvec `x @ W.T` over W's rows): the longest output range upcast by 4 (or
  2) with its lanes a quarter of the range apart. Each loop trip then streams 4 distant rows, 4 prefetch streams
  instead of one, and loads once what the rows share (a matvec's x, a row's max). One thread, CPU time, medians of
  alternating runs on the 2-core VM under load: x(1,576) @ W(49152,576).T 11.3-12.5 -> 7.3-8.9 ms (torch 2.13:
  9.8-11.8 ms), row max of 4096 x 4096 8.8-9.5 -> 5.3-5.5 ms (torch 9.4 ms), row sum 7.1 -> 5.5 ms; a 3.5 MB W
  level. Consecutive rows would store 4 outputs in a row, which the C renderer's lane groups take as the vector
  lanes (gathering the rows down their columns). [] for other kernels: rows shorter than 4 vectors, reductions along
  a strided axis, an output range the reductions do not move with (softmax's normalised elements), int reductions."""
  reds = [n for n in ast.toposort() if n.op is Ops.REDUCE]
  if not reds or not all(_splittable(r) and prod(_const_end(x) for x in r.src[1:]) >= 4 * width for r in reds):
    return []
  loads = []
  for red in reds:
    idxs = [n.src[0].src[1] for n in red.src[0].toposort() if n.op is Ops.LOAD]
    steps = [_stride(i, red.src[-1]) for i in idxs]
    if any(st not in (0, 1) for st in steps) or 1 not in steps: return []
    loads += idxs
  best: tuple[int, UOp, int] | None = None
  for rng in output_ranges(ast):
    if all(_stride(i, rng) == 0 for i in loads): return []
    end = _const_end(rng)
    amt = next((a for a in ROWS_APART if end % a == 0 and end >= 2 * a), None)
    if amt is not None and (best is None or end > best[0]): best = (end, rng, amt)
  return [] if best is None else [Opt("UPCAST_STRIDED", best[1].arg[0], best[2])]

TRANSPOSE_TILE = 64  # elements of a transposing copy's register tile (compile time grows with it)

def _term_stride(idx: UOp, rng: UOp) -> int | None:
  """`_stride` read off an index's terms (`c*rng` and terms without `rng`) without rewriting it; the rewrite where a
  term uses `rng` otherwise (divisions of a reshape). Every elementwise kernel asks this of each load: the rewrite took
  1.3 ms a kernel of a first call."""
  total = 0
  for t in split_terms(idx):
    v, k = term_factor(t)
    if v is rng: total += k
    elif v is not None and rng in v.toposort(): return _stride(idx, rng)
  return total

def transpose_opts(ast: UOp) -> list[Opt]:
  """A tile for an elementwise kernel that transposes (a layout copy: a conv's NCHW <-> channels-last, a head
  permute, a transposed B packed): its stores run contiguously along the innermost output range, which some load
  reads with a stride, and that load runs contiguously along another output range. Upcasting both (8-16 lanes of the
  store's range, 4-8 of the load's) gives gcc a tile of contiguous loads and contiguous stores to shuffle between
  where the load's lines would leave L1 before their next use; elsewhere the store's range alone is upcast (a padded
  conv input's gated loads, 3.5 -> 1.9 ms CPU time). [] for every other kernel."""
  rngs = output_ranges(ast)
  if len(rngs) < 2 or len(rngs) != sum(n.op is Ops.RANGE for n in ast.toposort()): return []
  inner = rngs[-1]
  stores = [n.src[0].src[1] for n in ast.toposort() if n.op is Ops.STORE]
  if not stores or any(_term_stride(i, inner) != 1 for i in stores): return []
  loads = [n.src[0].src[1] for n in ast.toposort() if n.op is Ops.LOAD]
  steps = [_term_stride(i, inner) for i in loads]
  # an index that is no affine function of the range (a reshape's divisions) would split across the lanes
  if None in steps: return []
  strided = [i for i, st in zip(loads, steps) if st not in (0, 1)]
  if not strided: return []
  inner_amt = next((a for a in (16, 8, 4) if _const_end(inner) % a == 0), None)
  if inner_amt is None: return []
  along = next((r for r in reversed(rngs[:-1]) if any(_term_stride(i, r) == 1 for i in strided)), None)
  along_amt = None if along is None else next((a for a in (8, 4) if _const_end(along) % a == 0), None)
  # the load's cache lines are reused by the next iteration of `along`: right away where it is the loop around the
  # stores' (a 2-D transpose; a tile made gcc shuffle for nothing: 0.32 -> 0.43 ms), only after every loop between
  # them where it is further out (NHWC -> NCHW: 200 KB of lines later, 5.2 -> 2.1 ms CPU time with the tile)
  if along is None or along_amt is None or along is rngs[-2]: return [Opt("UPCAST", inner.arg[0], inner_amt)]
  inner_amt = min(inner_amt, TRANSPOSE_TILE // along_amt)
  return [Opt("UPCAST", along.arg[0], along_amt), Opt("UPCAST", inner.arg[0], inner_amt)]

def hand_coded_opts(ast: UOp, renderer: Renderer) -> list[Opt]:
  """The default opts: register-block a matmul-like kernel (rows x vectors of columns of accumulators), else split
  long contiguous reductions into SIMD-width partial sums, else keep short reductions (at most a SIMD width per
  output, such as summing partial-sum lanes) on one thread."""
  width = getattr(renderer, "simd_width", 0)
  if width < 2: return []
  if not any(n.op is Ops.REDUCE for n in ast.toposort()): return transpose_opts(ast)
  # 2 vectors of columns x 8 rows: B's rows are a power-of-two stride apart, so its panel does not stay in cache;
  # 8 rows per B load halve that traffic against 4x4 (2x16 and 4x8 are ~15% faster still, but unroll twice as many
  # accumulators: 4x the first-call time of a transformer block, spent rewriting the unrolled graph)
  # A B small enough to stay in L2 unpacked (`resident_column`), read where it lies, or copied by codegen/pack.py into
  # blocks of 4 vectors (its columns in 64s) where the rows suit them (`packed_wide`, `wide_rows`): 6 (or 7) rows x 4
  # vectors in a matmul of TALL_BLOCK_MACS or more (`tall_rows`), else 8 rows x 2 vectors where the rows suit 8
  # (`eight_rows`), else 4 rows x 4 vectors
  if (axes := matmul_axes(ast, width)) is not None:
    if _const_end(output_ranges(ast)[axes[0]]) == WIDE_COLS * width or resident_column(ast, width) == axes[0] or \
       packed_wide(ast, width, axes):
      if axes[1] is None: return matmul_opts(ast, width, WIDE_COLS, 1, axes)
      rend = _const_end(output_ranges(ast)[axes[1]])
      if tall_matmul(ast): return matmul_opts(ast, width, WIDE_COLS, tall_rows(rend), axes)
      # below TALL_BLOCK_MACS, 8 rows x 2 vectors where the rows suit 8 (`eight_rows`): as many accumulators as
      # 4 x 4 (the same codegen time), each B vector loaded serving 8 FMAs instead of 4
      if eight_rows(ast, rend) and (mm := matmul_opts(ast, width, MATMUL_COLS, 8, axes)): return mm
      return matmul_opts(ast, width, WIDE_COLS, 4, axes)
    if (mm := matmul_opts(ast, width, MATMUL_COLS, 8, axes)): return mm
  # reductions the target's compiler vectorises as they are (`Renderer.vector_reduce_ops`, e.g. the CPU's MAX as an
  # int max) run fastest unsplit: partial lanes only make it shuffle them
  native: frozenset[Ops] = getattr(renderer, "vector_reduce_ops", frozenset())  # duck-typed renderers may lack it
  rows = rows_apart_opts(ast, width)  # long rows reduced 4 at a time, a quarter of the rows apart
  if all(n.arg in native for n in ast.toposort() if n.op is Ops.REDUCE): return rows
  reds = [n for n in ast.toposort() if n.op is Ops.REDUCE and _splittable(n)]
  # the innermost range gives the lanes; the whole reduction must be long enough to pay for combining them. Native
  # reductions next to others (softmax's max beside its sum of exp) stay whole: 16 int-max lanes ran 2x slower
  # A row the SIMD width does not divide (softmax over 1000 columns) splits into the widest half or quarter vector of
  # lanes that divides it: a float sum with one accumulator stays scalar (the compiler may not reassociate it), so
  # its exp loop ran scalar too (softmax (4096, 1000) 4.9-5.3 ms against 1.8-1.9 for 1024 columns, one core)
  split = [r for r in reds if r.arg not in native]
  lanes = next((n for n in (width, width // 2, width // 4) if n >= 2 and split and
                all(_const_end(r.src[-1]) % n == 0 for r in split)), 0)
  if lanes and all(prod(_const_end(x) for x in r.src[1:]) >= 4 * width for r in split):
    return [*rows, Opt("SPLIT", 1 if len(split) < len(reds) else 0, lanes)]
  # a reduction of at most `width` elements per output (summing partial-sum lanes) does too little per output for a
  # second thread to pay for its launch (~25 us on the 2-core development machine, the time of 10^5-10^6 adds)
  every = [n for n in ast.toposort() if n.op is Ops.REDUCE]
  outs = [n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] is AxisType.GLOBAL]
  short = len(reds) == len(every) and all(prod(_const_end(x) for x in r.src[1:]) <= width for r in reds)
  if short and all(o.src[0].op is Ops.CONST for o in outs) and \
     prod(_const_end(o) for o in outs) * width <= SHORT_REDUCE_ONE_THREAD:
    return [Opt("THREADS", 0, 1)]
  return reuse_opts(ast)  # a convolution: its output channels share each image load

# ** the linear program **

FUSED = "fma"  # the arg of a MULACC that may round once (a fused multiply-add); a plain MULACC rounds a*b first

def fuse_mulacc(uops: list[UOp]) -> list[UOp]:
  """`acc = acc + a*b` -> `acc = MULACC(a, b, acc, arg=FUSED)` for float32/float64 accumulators whose product has no
  other use; the product's own line goes. Every later uop is rebuilt on the new sources."""
  uses: dict[UOp, int] = {}
  for u in uops:
    for s in u.src: uses[s] = uses.get(s, 0) + 1
  # partial sums combined with each other after their loop stay `acc + a*b`: gcc vectorises a group of those as one
  # vector accumulator, but has no vector reduction for a group of fma calls (the lanes of a matmul's block, each
  # stored on its own, need none)
  partial = {s for u in uops if u.op in (Ops.ADD, Ops.MAX) and u.src[0].op is Ops.DEFINE_ACC
             and all(s.op is Ops.DEFINE_ACC for s in u.src) for s in u.src}
  fused = {u for u in uops if u.op is Ops.ADD and u.dtype in (dtypes.float32, dtypes.float64) and len(u.src) == 2
           and u.src[0].op is Ops.DEFINE_ACC and u.src[0] not in partial and u.src[1].op is Ops.MUL
           and uses.get(u.src[1], 0) == 1}
  if not fused: return uops
  dead = {u.src[1] for u in fused}
  out: list[UOp] = []
  new: dict[UOp, UOp] = {}
  for u in uops:
    if u in dead: continue
    if u in fused:
      mul = u.src[1]
      srcs = (new.get(mul.src[0], mul.src[0]), new.get(mul.src[1], mul.src[1]), new.get(u.src[0], u.src[0]))
      n = UOp(Ops.MULACC, u.dtype, srcs, FUSED)
    elif not new.keys().isdisjoint(u.src): n = UOp(u.op, u.dtype, tuple([new.get(s, s) for s in u.src]), u.arg, u.tag)
    else: n = u
    if n is not u: new[u] = n
    out.append(n)
  return out
