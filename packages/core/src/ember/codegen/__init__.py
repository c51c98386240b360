"""Codegen: one kernel AST -> lowering passes -> a linear program -> source text via the device's renderer."""
from __future__ import annotations
import math
import time
from collections import defaultdict
from typing import cast
from ember.dtype import DType, PtrDType, dtypes
from ember.errors import CompileError
from ember.helpers import BEAM, NUM_CPU_THREADS, SPEC, DEBUG, NOOPT, prod
from ember.renderer import Renderer, ProgramSpec, Estimates
from ember.uop.ops import Ops, UOp, AxisType, GroupOp, KernelInfo, pretty_print
from ember.uop.rewrite import graph_rewrite, PatternMatcher, UPat
from ember.uop import rewrite as uop_rewrite
from ember.uop.symbolic import symbolic
from ember.uop.spec import type_verify
from ember.codegen.linearize import linearize
from ember.codegen.group import global_ranges, group_reduce, unflatten, _pow2_divisor
from ember.codegen.tensorcore import apply_tensor_cores
from ember.codegen.launch import apply_launch
from ember.codegen.gather import pm_reduce_collapse
from ember.codegen.rowreuse import reuse_row_values
from ember.codegen.opt import Opt, hand_coded_opts, apply_opts_list, opt_threads, fuse_mulacc, pm_recombine_divmod

# ** lowering passes **

def _lower_mulacc(a: UOp, b: UOp, c: UOp) -> UOp: return a * b + c

pm_lower_alu = PatternMatcher([
  (UPat(Ops.MULACC, src=(UPat.var("a"), UPat.var("b"), UPat.var("c"))), _lower_mulacc),  # mulacc(a,b,c) -> a*b+c
])

def _gate_invariant_loads(x: UOp) -> UOp | None:
  """A load gated by a constant True needs no gate; gated by False it is the zero constant."""
  if len(x.src[0].src) == 3 and x.src[0].src[2].op is Ops.CONST:
    idx = x.src[0]
    if idx.src[2].arg: return idx.replace(src=idx.src[:2]).load()
    return x.const_like(0)
  return None

def _division_guard(x: UOp, y: UOp) -> tuple[UOp | None, UOp | None]:
  """(where `x / y` would trap in C, where `y == 0`): it traps (SIGFPE on x86) for `y == 0` and for `x == MIN, y == -1`
  of a signed dtype. Each part is None when the operands' value ranges rule it out, so index math (divisors that are
  positive constants) gets no guard."""
  zero = None if y.vmin > 0 or y.vmax < 0 else y.eq(y.const_like(0))
  overflow = None
  if x.vmin == dtypes.min(cast(DType, x.dtype)) and y.vmin <= -1 <= y.vmax:
    is_min = None if x.op is Ops.CONST else x.eq(x.const_like(x.vmin))
    is_minus_one = None if y.op is Ops.CONST else y.eq(y.const_like(-1))
    overflow = is_minus_one if is_min is None else is_min if is_minus_one is None else is_min & is_minus_one
  guard = zero if overflow is None else overflow if zero is None else zero | overflow
  return guard, zero

def _safe_division(d: UOp, x: UOp, y: UOp) -> UOp | None:
  """Integer IDIV/MOD never trap: x // 0 and x % 0 are 0, MIN // -1 wraps to MIN and MIN % -1 is 0 (numpy's values).

  The divisor becomes 1 where it would trap, which already gives MIN // 1 == MIN and x % 1 == 0; a division by zero
  then selects 0. A divisor that is the guard this rule built is left alone (the rewrite runs to a fixed point)."""
  if not (dtypes.is_int(d.dtype) or d.dtype is dtypes.bool): return None  # bools divide as C ints
  if y.op is Ops.CONST and y.arg == 0: return d.const_like(0)
  if y.op is Ops.WHERE and y.src[1] is y.const_like(1) and y.src[0] is _division_guard(x, y.src[2])[0]: return None
  guard, zero = _division_guard(x, y)
  if guard is None: return None
  safe = x.alu(d.op, guard.where(y.const_like(1), y))
  return zero.where(d.const_like(0), safe) if zero is not None and d.op is Ops.IDIV else safe

pm_safe_division = PatternMatcher([
  (UPat((Ops.IDIV, Ops.MOD), src=(UPat.var("x"), UPat.var("y")), name="d"), _safe_division),  # x/0 -> 0, MIN/-1 -> MIN
])

pm_gates = PatternMatcher([
  (UPat(Ops.LOAD, name="x"), _gate_invariant_loads),
])

THREAD_MIN_WORK = 1 << 15  # loop iterations from which a reduction kernel runs on every CPU thread
# elements from which an elementwise kernel does: a second thread's dispatch (~25 us on the 2-core development machine)
# is what one thread takes for 128K elements of an SGD update or a layout copy (27 us; a matmul 256's packed B, 64K
# elements, 14 us on one thread and 34 on two)
THREAD_MIN_ELEMENTS = 1 << 18

def range_trips(r: UOp) -> int:
  """A RANGE's trip count, or for one of symbolic trip count (a bound Variable's) the most it can be."""
  end = r.src[0]
  return end.arg if end.op is Ops.CONST else max(int(end.vmax), 1)

def apply_opts(ast: UOp, renderer: Renderer, work: int, threads: int | None = None) -> tuple[UOp, list[int] | None]:
  """Kernel optimisations (the hook BEAM and hand-coded opts plug into). CPU: split the outermost range over threads.

  The renderers compute each thread's share of a THREAD range when the kernel runs (`ceil(end / num_cores)` rows from
  `core_id`'s), so a range of symbolic trip count (a decode step's position) splits too: its threads are as many as
  its largest value allows, and a thread whose share starts past the bound value's end runs no iteration."""
  if NOOPT.value or not renderer.has_threads: return ast, None
  topo = ast.toposort()  # one walk of the unrolled kernel for its ranges, its reductions and the substitution
  ranges = global_ranges(ast, topo)
  if not ranges: return ast, None
  nthreads = threads or NUM_CPU_THREADS.value or (renderer.global_max[0] if renderer.global_max else 1)
  first = ranges[0]
  n = min(nthreads, range_trips(first))
  reduces = any(x.op is Ops.REDUCE for x in topo)
  if n < 2 or (threads is None and work < (THREAD_MIN_WORK if reduces else THREAD_MIN_ELEMENTS)): return ast, None
  return uop_rewrite.substitute(ast, {first: first.replace(arg=(first.arg[0], AxisType.THREAD))}, topo), [n, 1, 1]

def apply_gpudims(ast: UOp, renderer: Renderer) -> tuple[UOp, list[int] | None, list[int] | None]:
  """GPU renderers: the output ranges become one flat hardware index `gidx0*L + lidx0` (block, thread).

  The flat index is clamped to the last element, so extra threads of a partial block recompute and rewrite the last
  element with the same value instead of reading or writing out of bounds.
  """
  ranges = global_ranges(ast)
  if any(r.src[0].op is not Ops.CONST for r in ranges):
    raise CompileError("GPU kernels with symbolic output shapes need kernel opts")
  ends = [r.src[0].arg for r in ranges]
  total = prod(ends) if ends else 1
  cap = min(256, renderer.local_max[0] if renderer.local_max else 256)
  local = total if total <= cap else _pow2_divisor(total, cap)
  if local < 32 and total > cap: local = cap  # an awkward size: full blocks, clamped tail
  local = min(local, total)
  grid = -(-total // local)
  index_dtype = ranges[0].dtype if ranges else dtypes.int32  # int64 in kernels whose indices exceed int32
  flat = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, grid),), "gidx0").cast(index_dtype) * local + \
    UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, local),), "lidx0").cast(index_dtype)
  if grid * local != total: flat = flat.lt(total - 1).where(flat, UOp.const(index_dtype, total - 1))
  return ast.substitute(dict(zip(ranges, unflatten(flat, ends)))), [grid, 1, 1], [local, 1, 1]

def estimate(uops: list[UOp]) -> Estimates:
  ops, mult, stack = 0, 1, []
  for u in uops:
    if u.op is Ops.RANGE:
      n = u.src[0].arg if u.src[0].op is Ops.CONST else (u.src[0].vmax + 1 if u.src[0].vmax is not None else 1)
      stack.append(n)
      mult *= max(n, 1)
    elif u.op is Ops.END and stack: mult //= max(stack.pop(), 1)
    elif u.op is Ops.MULACC: ops += 2 * mult  # a multiply and an add
    elif u.op is Ops.QDOT: ops += 64 * u.arg[0] * u.arg[3] * mult  # a multiply-add per code, block and plane
    elif u.op in GroupOp.ALU and not dtypes.is_int(u.dtype): ops += mult
  params = [u.dtype for u in uops if u.op is Ops.PARAM and isinstance(u.dtype, PtrDType) and u.dtype.size > 0]
  mem = sum(p.size * p.base.itemsize for p in params)
  return Estimates(ops, mem)

_ABS_MASK = {2: 0x7FFF, 4: 0x7FFFFFFF, 8: 0x7FFFFFFFFFFFFFFF}

def _abs_bits(x: UOp, b: UOp, z: UOp) -> UOp | None:
  """`signbit(x) ? -x : x` (Tensor.abs of a float) as x with its sign bit cleared: the same value for every x (-0.0,
  NaNs and infinities included), one AND instead of an integer compare and a select, which kept gcc from vectorising
  loops whose masks mixed it with float compares (tanh's, sinh's)."""
  if not dtypes.is_float(x.dtype) or z.arg != 0 or (mask := _ABS_MASK.get(x.dtype.itemsize)) is None: return None
  if not dtypes.is_int(b.dtype) or b.dtype.itemsize != x.dtype.itemsize: return None
  return (b & b.const_like(mask)).bitcast(cast(DType, x.dtype))

def _zero_or_abs(x: UOp, z: UOp, zero: UOp, a: UOp, m: UOp) -> UOp | None:
  """`x == 0 ? +0.0 : |x|` (abs's zero gradient at 0, in the forward pass) is |x|: a mask without the sign bit gives
  +0.0 at both zeros."""
  return a if z.arg == 0 and zero.arg == 0 and math.copysign(1.0, zero.arg) > 0 and m.arg >= 0 else None

pm_float_abs = PatternMatcher([
  (UPat(Ops.WHERE, src=(UPat(Ops.CMPLT, src=(UPat(Ops.BITCAST, src=(UPat.var("x"),), name="b"), UPat.cvar("z"))),
                        UPat(Ops.NEG, src=(UPat.var("x"),)), UPat.var("x"))), _abs_bits),
  (UPat(Ops.WHERE, src=(UPat(Ops.CMPEQ, src=(UPat.var("x"), UPat.cvar("z"))), UPat.cvar("zero"),
                        UPat(Ops.BITCAST, name="a", src=(UPat(Ops.AND, src=(UPat(Ops.BITCAST, src=(UPat.var("x"),)),
                                                                             UPat.cvar("m"))),)))), _zero_or_abs),
])

SAME_COND_SEARCH = 64  # nodes of each arm searched for a select on the same condition (bounds the cost per select)

def _arm_selects(arm: UOp, c: UOp) -> list[UOp]:
  """The selects on condition `c` among the first SAME_COND_SEARCH nodes under `arm` (breadth first)."""
  found: list[UOp] = []
  seen, queue = {arm}, [arm]
  for n in queue:
    if n.op is Ops.WHERE and n.src[0] is c: found.append(n)
    for s in n.src:
      if s not in seen and len(seen) < SAME_COND_SEARCH:
        seen.add(s)
        queue.append(s)
  return found

def _same_condition(w: UOp) -> UOp | None:
  """`c ? f(c ? a : b) : g(c ? d : e)` is `c ? f(a) : g(e)`: inside an arm of a select its condition is known. Besides
  dropping the inner selects, this keeps gcc 12 from miscompiling the loop: at -O3 with AVX2 or AVX-512 it vectorised
  `t = c ? v : 0; out = c ? (t < k ? u : 0) : 0` with the wrong mask (lanes where c held stored 0: the gradient of
  max_unpool2d through isfinite)."""
  c, x, y = w.src
  inner_x, inner_y = _arm_selects(x, c), _arm_selects(y, c)
  if not inner_x and not inner_y: return None
  nx = x.substitute({n: n.src[1] for n in inner_x}) if inner_x else x
  ny = y.substitute({n: n.src[2] for n in inner_y}) if inner_y else y
  return None if nx is x and ny is y else w.replace(src=(c, nx, ny))

pm_same_condition = PatternMatcher([(UPat(Ops.WHERE, name="w"), _same_condition)])

# built once: joining tables indexes every rule again (an inspect.signature per rule), which every kernel paid
pm_simplify = symbolic + pm_lower_alu + pm_recombine_divmod + pm_reduce_collapse + pm_float_abs + pm_same_condition

def simplify_kernel(ast: UOp) -> UOp:
  """Fold movement-op index math (a reshape of a permuted view leaves (k//a)*a + k%a chains that recombine to k) and
  drop the gates of padding that is always valid."""
  # a gather's one-hot reduction collapses to a load here, before kernel opts split and unroll its range
  sink = graph_rewrite(ast, pm_simplify, name="simplify index math")
  return graph_rewrite(sink, pm_gates, name="drop constant gates")

# seconds spent in each codegen pass (and the scheduler's, ember.schedule) since the process started: what a first
# call costs, pass by pass (the bench reports a cold first call's)
pass_seconds: defaultdict[str, float] = defaultdict(float)

class timed_pass:
  """`with timed_pass("linearize"):` adds the block's wall time to `pass_seconds["linearize"]`."""
  __slots__ = ("name", "start")
  def __init__(self, name: str) -> None: self.name = name
  def __enter__(self) -> None: self.start = time.perf_counter()
  def __exit__(self, *exc: object) -> None: pass_seconds[self.name] += time.perf_counter() - self.start

def full_rewrite(ast: UOp, renderer: Renderer,
                 opts: list[Opt] | None = None) -> tuple[list[UOp], list[int] | None, list[int] | None]:
  """The pipeline from kernel AST to linear program; each pass runs where it does for the reason on its line."""
  if DEBUG.value >= 5: _debug_print(f"kernel {kernel_name(ast)}, AST:\n{pretty_print(ast, max_nodes=1 << 30)}")
  with timed_pass("simplify"):
    sink = simplify_kernel(ast)
    # a row's exp stored by the loop of its sum, reloaded by the loop of the stores (outputs run as loops only)
    if not renderer.has_local: sink = reuse_row_values(sink)
  work = prod(range_trips(r) for r in sink.toposort() if r.op is Ops.RANGE)  # symbolic: at their largest
  with timed_pass("choose opts"):
    if opts is None: opts = [] if NOOPT.value else hand_coded_opts(sink, renderer)  # register blocking, partial sums
  with timed_pass("apply opts"): sink = apply_opts_list(sink, opts)
  if (tracer := uop_rewrite.TRACER) is not None: tracer.note_opts(opts)  # VIZ shows them
  sink, gsize = apply_opts(sink, renderer, work, opt_threads(opts))  # split the outermost loop over CPU threads
  lsize = None
  if renderer.has_local:
    # a matmul runs on the warp's matrix instructions; a long reduction is shared by the threads of a block (shared
    # memory, warp shuffles); else one thread per output
    # (both index with int32 hardware indices: a kernel with int64 indices gets one thread per output)
    wide = any(n.op is Ops.RANGE and n.dtype is dtypes.int64 for n in sink.toposort())
    grouped = apply_launch(sink, renderer, opts)  # an explicit LOCAL/GROUP/GROUPTOP/TC opt, else the heuristics
    if grouped is None and not (NOOPT.value or wide):
      grouped = apply_tensor_cores(sink, renderer) or group_reduce(sink, renderer)
    sink, gsize, lsize = grouped if grouped is not None else apply_gpudims(sink, renderer)
    sink = graph_rewrite(sink, symbolic, name="simplify gpu index math")
  if {Ops.EXP2, Ops.LOG2, Ops.SIN} - set(renderer.code_for_op):
    from ember.codegen.transcendental import pm_transcendental
    native = frozenset(renderer.code_for_op)
    # targets without native exp2/log2/sin get them from basic ALU ops
    sink = graph_rewrite(sink, pm_transcendental, ctx=native, name="decompose transcendentals")
  # after every pass that folds index math (a guard would hide the constant divisors those rules look for), before the
  # renderer's own rewrites: no target ever sees an integer division that can trap
  sink = graph_rewrite(sink, pm_safe_division, name="guard integer division")
  if renderer.extra_matcher is not None: sink = graph_rewrite(sink, renderer.extra_matcher, name="renderer rewrites")
  if SPEC.value: type_verify(sink, "kernel AST")
  if DEBUG.value >= 3: _debug_print(f"kernel {kernel_name(ast)}: opts {opts}, global {gsize}, local {lsize}")
  if DEBUG.value >= 5: _debug_print(f"kernel {kernel_name(ast)}, lowered:\n{pretty_print(sink, max_nodes=1 << 30)}")
  with timed_pass("linearize"):
    uops = linearize(sink)
    if opts and getattr(renderer, "fused_mulacc", False): uops = fuse_mulacc(uops)  # acc += a*b as one fma
  if DEBUG.value >= 6: _debug_print(f"kernel {kernel_name(ast)}, linear program:\n{format_program(uops)}")
  if SPEC.value: type_verify(uops, "linear program")
  return uops, gsize, lsize

def kernel_name(ast: UOp) -> str:
  ranges = sorted((n for n in ast.toposort() if n.op is Ops.RANGE), key=lambda r: r.arg[0])
  shape = [r.src[0].arg if r.src[0].op is Ops.CONST else "s" for r in ranges]
  has_reduce = any(n.op is Ops.REDUCE for n in ast.toposort())
  return ("r_" if has_reduce else "E_") + "_".join(str(s) for s in shape) if shape else "E_scalar"

def get_program(ast: UOp, renderer: Renderer, device: str = "", opts: list[Opt] | None = None) -> ProgramSpec:
  """Codegen one kernel for `renderer`: the rendered source plus everything needed to launch it. `opts` overrides the
  kernel opts; BEAM=N searches them on `device`."""
  if ast.op is Ops.PROGRAM or (isinstance(ast.arg, KernelInfo) and ast.arg.name is not None):
    from ember.codegen.handwritten import handwritten_program
    if (tracer := uop_rewrite.TRACER) is not None: tracer.begin_kernel(ast, device)  # VIZ lists it with its source
    spec = handwritten_program(ast, renderer, device)  # a kernel a user wrote (Tensor.custom_kernel): loops as written
    if DEBUG.value >= 4 and spec.src: _debug_print(spec.src)
    if tracer is not None: tracer.end_kernel(spec)
    return spec
  if opts is None and BEAM.value >= 1 and device and not NOOPT.value:
    from ember.codegen.search import beam_search
    opts = beam_search(ast, renderer, device, BEAM.value)
  if (tracer := uop_rewrite.TRACER) is not None: tracer.begin_kernel(ast, device)  # VIZ files the rewrites below here
  uops, gsize, lsize = full_rewrite(ast, renderer, opts)
  name = kernel_name(ast)
  try:
    with timed_pass("render"): src = renderer.render(uops, name)
  except CompileError: raise
  except Exception as e: raise CompileError(f"{type(renderer).__name__} failed to render kernel {name}: {e}") from e
  params = [u for u in uops if u.op is Ops.PARAM]
  outs = sorted({u.src[0].src[0].arg for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM})
  ins = sorted({u.src[0].src[0].arg for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM})
  if DEBUG.value >= 4: _debug_print(src)
  variables = [u for u in uops if u.op is Ops.DEFINE_VAR]
  spec = ProgramSpec(name, src, device, uops, [p.arg for p in params], variables, outs, ins,
                     gsize, lsize, estimate(uops))
  if tracer is not None: tracer.end_kernel(spec)
  return spec

def _debug_print(src: str) -> None:
  import sys
  sys.stderr.write(src + "\n")

def format_program(uops: list[UOp]) -> str:
  """A linear program one uop a line (DEBUG=6): its index, op, dtype, the indices of its sources and its arg."""
  index = {u: i for i, u in enumerate(uops)}
  return "\n".join(f"{i:4d} {u.op.name:12s} {u.dtype!r:28s} {str([index[s] for s in u.src]):16s} {u.arg!r}"
                   for i, u in enumerate(uops))
