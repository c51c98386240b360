"""The CPU renderers: C for the system compiler, LLVM IR for llvmlite. Both take `core_id, num_cores` last.

The CPU runtime's calling convention: buffers (pointers) in slot order, then the DEFINE_VAR values, then
`core_id, num_cores` (every kernel takes them; only a THREAD range reads them). The C renderer also exports
`<name>_argfmt`, a struct-style format of those arguments ("P" pointer, "i" int32, "q" int64), so the runtime can
pass each value at its own width.
"""
from __future__ import annotations
import os
from typing import Any, Callable
from ember.plugin import (CStyleLanguage, LLVMRenderer, DType, Ops, UOp, UPat, PatternMatcher, dtypes, NUM_CPU_THREADS,
                          text_rules, value_dtype)
from ember_cpu import vectorize
from ember_cpu.compiler import _host_cpu_id, _is_x86, is_host_arch

ARGFMT_SUFFIX = "_argfmt"

def cpu_threads() -> int:
  """How many threads a kernel runs on: NUM_CPU_THREADS, else every core."""
  return NUM_CPU_THREADS.value or os.cpu_count() or 1

def kernel_argfmt(uops: list[UOp], has_threads: bool) -> str:
  """The argument format of a kernel under the CPU calling convention."""
  PARAM, DEFINE_VAR = Ops.PARAM, Ops.DEFINE_VAR  # each `Ops.X` read is slow on Python 3.11
  fmt = "P" * sum(1 for u in uops if u.op is PARAM)
  fmt += "".join("q" if u.dtype.itemsize == 8 else "i" for u in uops if u.op is DEFINE_VAR)
  return fmt + ("ii" if has_threads else "")

def _builtin(name: str) -> Callable[..., str]:
  return lambda x, dtype: f"__builtin_{name}{'' if dtype is dtypes.float64 else 'f'}({x})"

def _index_terms(idx: UOp, inlined: set[UOp]) -> tuple[list[UOp], int]:
  """An integer index as the terms of its ADD tree, in order, and the sum of its constant terms.

  An inlined value is printed where its user is evaluated, so an ADD is split into its terms only where that keeps
  each inlined term's value: the index's own use (every ADD above it inlined), a named ADD whose terms are named, or
  inlined terms that read no accumulator (their string means the same wherever the ADD's value is in scope)."""
  def splittable(x: UOp, here: bool) -> bool:
    return all(c.op is Ops.CONST or c not in inlined or here or (c.op is Ops.ADD and splittable(c, False))
               or not any(n.op in (Ops.DEFINE_ACC, Ops.ASSIGN, Ops.REDUCE) for n in c.toposort()) for c in x.src)
  terms: list[UOp] = []
  const = 0
  stack = [(idx, idx in inlined)]  # (value, whether it is evaluated at the index's use)
  while stack:
    x, here = stack.pop()
    if x.op is Ops.CONST: const += x.arg
    elif x.op is Ops.ADD and splittable(x, here): stack += [(c, here and c in inlined) for c in reversed(x.src)]
    else: terms.append(x)
  return terms, const

# ** float MAX reductions as integer MAX reductions **
# A NaN-propagating float max, `(a>b || a!=a) ? a : b`, is no reduction gcc or LLVM vectorise (without
# -ffinite-math-only they may not reassociate it, and its select reads the accumulator twice), but an int max is.
# The bits of a float b, as a signed int, order like the float for every non-NaN value once the negative ones have
# their magnitude bits flipped: key(b) = b ^ ((b >> 31) & 0x7fffffff) (an involution; -0.0 < +0.0). NaN is found by a
# second int max over the magnitude bits, b & 0x7fffffff, which exceeds inf's exactly for a NaN. Both reductions run
# in one loop (same ranges) as plain int maxima: vpmaxsd on AVX-512.

_KEY_INT = {dtypes.float32: dtypes.int32, dtypes.float64: dtypes.int64}

def _flip(bits: UOp) -> UOp:
  """key(bits) and its inverse: the magnitude bits flipped where the sign bit is set."""
  width = bits.dtype.itemsize * 8
  return bits ^ (bits.alu(Ops.SHR, bits.const_like(width - 1)) & bits.const_like((1 << (width - 1)) - 1))

def _int_max_reduce(red: UOp) -> UOp | None:
  dt = value_dtype(red)
  if red.arg is not Ops.MAX or (idt := _KEY_INT.get(dt)) is None: return None
  width = idt.itemsize * 8
  magnitude = (1 << (width - 1)) - 1
  exp, man = dtypes.finfo(dt)
  inf_bits = ((1 << exp) - 1) << man
  bits = red.src[0].bitcast(idt)
  keys = UOp(Ops.REDUCE, idt, (_flip(bits), *red.src[1:]), Ops.MAX)
  mags = UOp(Ops.REDUCE, idt, (bits & magnitude, *red.src[1:]), Ops.MAX)
  # an empty reduction leaves keys at the int minimum: clamp it to -inf's key (-inf is the sign bit and inf's bits)
  top = keys.maximum(UOp.const(idt, (inf_bits - (1 << (width - 1))) ^ magnitude))
  return UOp.const(idt, inf_bits).lt(mags).where(mags.bitcast(dt), _flip(top).bitcast(dt))

# codegen's rewrite for the CPU renderers: float MAX reductions as int maxima
pm_cpu = PatternMatcher([
  (UPat(Ops.REDUCE, name="red"), _int_max_reduce),
])

# ** half to float as integer operations (C) **
# gcc 12 converts each _Float16 on its own (vcvtsh2ss, or vcvtph2ps on one lane without AVX512-FP16) and never
# vectorises the conversion, so a kernel reading half ran ~13x slower than on float32. The same value from the bits:
# the exponent and mantissa moved to float's places and scaled by 2^(127-15) (exact, subnormal halves included), the
# infinities and NaNs (half's all-ones exponent: bit 15 of (exponent bits + 0x400)) given float's all-ones exponent,
# the sign put back: integer and float operations gcc's vectorisers turn into a few vector instructions per 16 values
# (a select on a float compare there kept the whole block scalar).

def _half_to_float(x: UOp, h: UOp) -> UOp:
  # a half assembled from its bytes (the GGUF block scales a kernel dequantises) is widened from those bits directly
  raw = h.src[0] if h.op is Ops.BITCAST and h.src[0].dtype is dtypes.uint16 else h.bitcast(dtypes.uint16)
  bits = raw.cast(dtypes.uint32)
  scaled = ((bits & 0x7fff) << 13).bitcast(dtypes.float32) * 2.0 ** 112
  special = (((bits & 0x7c00) + 0x400) >> 15) * 0x7f800000
  f = (scaled.bitcast(dtypes.uint32) | special | ((bits & 0x8000) << 16)).bitcast(dtypes.float32)
  return f if x.dtype is dtypes.float32 else f.cast(x.dtype)

pm_clang = pm_cpu + PatternMatcher([
  (UPat(Ops.CAST, dtype=(dtypes.float32, dtypes.float64), src=(UPat.var("h", dtype=dtypes.float16),), name="x"),
   _half_to_float),
])

# ** fused multiply-adds on targets without them **
# exp2's polynomial (ember.codegen.transcendental) is MULACCs that may round once: one vfmadd each where the target has
# FMA (a softmax of (4096, 1024) on one core 2.8 -> 2.3 ms), but a call to libm's fmaf per lane where it has not. There
# they are a multiply and an add again, as before. Kernel opts' MULACCs come later (ember.codegen.opt.fuse_mulacc)

_FMA_ARCHS = ("x86-64-v3", "x86-64-v4")  # the named x86 targets known to have FMA; other names count as without

def has_fma(arch: str) -> bool:
  """Whether the CPU `arch` (the host by default) has a fused multiply-add instruction: every non-x86 target gcc builds
  for here (64-bit ARM, RISC-V, POWER), an x86 host whose flags list fma, the x86-64-v3 and v4 levels."""
  if not _is_x86(): return True
  if is_host_arch(arch): return "fma" in _host_cpu_id().split()
  return arch.lower() in _FMA_ARCHS

pm_unfuse = PatternMatcher([
  (UPat(Ops.MULACC, arg="fma", src=(UPat.var("a"), UPat.var("b"), UPat.var("c"))), lambda a, b, c: a * b + c),
])

def _index_offsets(ctx: Any, x: UOp, buf: UOp, idx: UOp) -> str:
  """`buf[x+y+c]` printed `(buf+x+y)[c]`: under -fwrapv gcc cannot prove that int `x+c` and `x+c+1` are neighbours,
  nor that a wrapping int sum `x+y` of a loop-invariant x and a loop counter's y moves affinely with the loop, but
  pointer offsets added one term at a time are both; its SLP and loop vectorisers then turn unrolled loads and stores
  into vector loads and stores, and partial sums over a loop into vector accumulators."""
  terms, const = _index_terms(idx, ctx.inlined)
  return f"({'+'.join([ctx[buf], *(ctx[t] for t in terms)])})[{ctx.renderer.render_const(const, idx.dtype)}]"

# ** the next row's cache lines, one loop ahead **
# A kernel that walks rows one after another (a softmax: per row a max loop, an exp loop, a scale loop) reads each
# row's first cache lines cold: the hardware prefetchers stop at 4 KB pages and start over on each, so every row
# began with a wait on memory (perf: 30-40% of a softmax of (4096, 1024) on the row's first load). A loop of 64-byte
# vector loads that covers one row of an outer loop exactly (index = outer*N + inner*lanes, inner's trip count *
# lanes == N, N floats at least a page, one row per block) also prefetches the same line of the next row, so that row
# streams in while this one computes (one core: 2.3 -> 2.0 ms). Prefetches never fault, past the buffer's end included.

_PAGE = 4096  # shorter rows share pages, which the hardware prefetchers stream through

def _row_prefetch(ctx: Any, g: vectorize.Lanes) -> str | None:
  """`__builtin_prefetch` of the next row's line for a vector load group `g` that covers one row, else None."""
  first = g.uops[0]
  if first.op is not Ops.LOAD or len(g.uops) * g.dtype.itemsize != 64: return None
  if (index := first.src[0]).op is not Ops.INDEX or len(index.src) != 2: return None
  buf, idx = index.src
  terms, const = _index_terms(idx, ctx.inlined)
  if len(terms) != 2: return None
  strides: dict[UOp, int] = {}
  for t in terms:
    if t.op is Ops.RANGE: strides[t] = 1
    elif t.op is Ops.MUL and (rng := t.src[0]).op is Ops.RANGE and (n := t.src[1]).op is Ops.CONST: strides[rng] = n.arg
    else: return None
  if len(strides) != 2: return None
  (outer, row), (inner, step) = sorted(strides.items(), key=lambda kv: -kv[1])
  if ctx.loop_parent.get(inner) is not outer: return None  # the next row is the enclosing loop's next iteration
  if step != len(g.uops) or inner.src[0].op is not Ops.CONST or inner.src[0].arg * step != row: return None
  if const != 0 or row * g.dtype.itemsize < _PAGE: return None  # one row a block, as long as a page at least
  # rows read a few at a time (a matvec's block of rows far apart) are streams the prefetchers already follow
  if any(o is not g and o.kind == "load" and o.uops[0].op is Ops.LOAD and o.uops[0].src[0].src[0] is buf
         and inner in o.uops[0].src[0].toposort() for o in ctx.plan.emit_at.values()): return None
  return f"__builtin_prefetch(&({'+'.join([ctx[buf], *(ctx[t] for t in terms)])})[{const + row}], 0, 3);"

# gcc's loop vectoriser uses 256-bit vectors on AVX-512 CPUs unless told otherwise; a row kernel's loops it vectorises
# itself (a softmax's max loop on int keys, its scale loop) take 512-bit ones where the row prefetch is emitted
# (softmax (4096, 1024), one core: 1.84-1.95 -> 1.69-1.79 ms in a C harness). gcc only: clang has no such target option
_WIDE_LOOPS = ('#if defined(__x86_64__) && !defined(__clang__)\n__attribute__((target("prefer-vector-width=512")))\n'
               '#endif\n')

# a kernel that runs at most this many operations (each uop counted once per trip of the loops around it) compiles
# at gcc's -O1 plus the loop and SLP vectorisers instead of -O3 (`__attribute__((optimize))`; the command line's float
# flags still hold): a train step's bias gradients, loss and small updates are a quarter of its cold first call's gcc
# time and run a few microseconds either way
SMALL_KERNEL_OPS = 1 << 16
_SMALL = '#if !defined(__clang__)\n__attribute__((optimize("O1", "tree-vectorize")))\n#endif\n'

def _small(uops: list[UOp]) -> bool:
  ops, trips = 0, [1]
  RANGE, END, CONST = Ops.RANGE, Ops.END, Ops.CONST  # each `Ops.X` read is slow on Python 3.11
  for u in uops:
    if (op := u.op) is RANGE:
      if u.src[0].op is not CONST: return False
      trips.append(trips[-1] * u.src[0].arg)
    elif op is END and len(trips) > 1: trips.pop()
    else: ops += trips[-1]
  return ops <= SMALL_KERNEL_OPS

def _fma(ctx: Any, x: UOp) -> str:
  return f"__builtin_fma{'f' if x.dtype is dtypes.float32 else ''}({','.join(ctx[s] for s in x.src)})"

# C's rendering rules for the system compiler, in front of the C-style base's
pm_render_clang = text_rules([
  (UPat(Ops.INDEX, src=(UPat.var("buf"), UPat(Ops.ADD, name="idx")), allow_any_len=True, name="x"), _index_offsets),
  # a MULACC of kernel opts (ClangRenderer.fused_mulacc) as one fused multiply-add
  (UPat(Ops.MULACC, dtype=(dtypes.float32, dtypes.float64), arg="fma", name="x"), _fma),
  # EXP2 and LOG2 are not in code_for_op (codegen decomposes them), but a hand-built program's still render, as the
  # builtins
  (UPat(Ops.EXP2, name="x"), lambda ctx, x: ctx.alu(x, _builtin("exp2"))),
  (UPat(Ops.LOG2, name="x"), lambda ctx, x: ctx.alu(x, _builtin("log2"))),
])

class ClangRenderer(CStyleLanguage):
  """C for clang or gcc: builtins instead of libm headers, `_Float16` for half, bfloat16/fp8 as raw bits."""
  device = "CPU"
  suffix = "c"
  has_threads = True
  has_qdot = True
  simd_width = 16
  infinity = "__builtin_inff()"
  nan = '__builtin_nanf("")'
  type_map: dict[DType, str] = {**CStyleLanguage.type_map, dtypes.bool: "_Bool", dtypes.float16: "_Float16"}
  # kernel opts turn `acc += a*b` into MULACC with arg "fma" (ember.codegen.opt.FUSED): one fused multiply-add
  # (vfmadd), which gcc's SLP vectoriser keeps in vector registers; a plain MULACC stays a*b rounded, then +c
  fused_mulacc = True
  # a kernel's buffers never overlap (the scheduler passes a buffer it reads and writes as one parameter, and the
  # memory planner hands a dead buffer's memory only to later kernels): without `restrict` gcc must keep each load
  # of an epilogue (a residual added to a matmul's result) after the store before it, which split the stores gcc's SLP
  # vectoriser starts from and left such a matmul scalar (15 GFLOP/s instead of 120)
  buffer_suffix = " restrict"
  # no EXP2 or LOG2 here, so codegen decomposes them (ember.codegen.transcendental: a polynomial and exponent bits):
  # libm's exp2f and log2f are a call per element that gcc cannot vectorise, the decompositions plain arithmetic it
  # does (log of 4M floats 22.5 -> 6.5 ms, at most 0.54 ulp against log2f's 0.71). SIN stays libm's: its decomposition
  # reduces large arguments in scalar code (12x slower) and is less accurate. A hand-built program's EXP2 and LOG2
  # still render, as the builtins (pm_render_clang)
  code_for_op = {k: v for k, v in CStyleLanguage.code_for_op.items() if k not in (Ops.EXP2, Ops.LOG2)} | {
    Ops.SIN: _builtin("sin"), Ops.SQRT: _builtin("sqrt"), Ops.TRUNC: _builtin("trunc")}
  string_rewrite = pm_render_clang + CStyleLanguage.string_rewrite
  extra_matcher = pm_clang
  vector_reduce_ops = frozenset({Ops.MAX})  # as int maxima (pm_cpu) they vectorise unsplit: no SPLIT opt
  pack_operands = True  # a matmul's B in its register block's layout (ember.codegen.pack)
  def __init__(self, arch: str = "") -> None:
    self.arch, self.global_max = arch, (cpu_threads(),)
    if not has_fma(arch): self.extra_matcher = pm_clang + pm_unfuse
  def plan_render(self, uops: list[UOp], ctx: Any) -> None:
    # each loop's enclosing loop (_row_prefetch)
    ctx.loop_parent = {}
    open_loops: list[UOp] = []
    RANGE, END = Ops.RANGE, Ops.END  # each `Ops.X` read is slow on Python 3.11 (EnumType.__getattr__)
    for u in uops:
      if (op := u.op) is RANGE:
        ctx.loop_parent[u] = open_loops[-1] if open_loops else None
        open_loops.append(u)
      elif op is END and open_loops: open_loops.pop()
    # register blocks and upcast lanes as GCC vector code (ember_cpu.vectorize): what gcc's SLP vectoriser would
    # rebuild from the unrolled scalars, at a fraction of its compile time
    if (plan := vectorize.plan(uops, ctx.inlined, self.simd_width * 4, ctx.users or None, ctx.pos or None)) is not None:
      ctx.plan, ctx.inlined = plan, plan.inlined
      ctx.silent = plan.silent
  def render_uop(self, u: UOp, ctx: Any) -> None:
    plan = ctx.plan
    # (the uops the plan prints nothing for, ctx.silent, never get here: CStyleLanguage.render skips them)
    if plan is None or (group := plan.emit_at.get(u)) is None: return super().render_uop(u, ctx)
    vectorize.emit_group(ctx, plan, group, plan.block[u])
    if group.kind == "load" and (ahead := _row_prefetch(ctx, group)) is not None: ctx.emit(ahead)
  def render_kernel(self, name: str, params: list[str], body: list[str], helpers: list[str]) -> str:
    src = super().render_kernel(name, params, body, helpers)
    if not any("__builtin_prefetch(" in line for line in body): return src
    return src.replace(f"{self.kernel_prefix}{name}(", f"{_WIDE_LOOPS}{self.kernel_prefix}{name}(", 1)
  def render(self, uops: list[UOp], name: str = "kernel") -> str:
    src = super().render(uops, name)
    if _small(uops): src = src.replace(f"{self.kernel_prefix}{name}(", f"{_SMALL}{self.kernel_prefix}{name}(", 1)
    return src + f'const char {name}{ARGFMT_SUFFIX}[] = "{kernel_argfmt(uops, self.has_threads)}";\n'

class CPULLVMRenderer(LLVMRenderer):
  """LLVM IR for the CPU `arch` (the host by default): triple and datalayout come from llvmlite's target machine.
  Like the C renderer's, each kernel defines `<name>_argfmt`, its arguments under the CPU calling convention."""
  device = "CPU"
  suffix = "ll"
  has_threads = True
  has_qdot = True
  simd_width = 16
  extra_matcher = pm_cpu
  vector_reduce_ops = frozenset({Ops.MAX})  # as int maxima (pm_cpu) they vectorise unsplit: no SPLIT opt
  pack_operands = True  # a matmul's B in its register block's layout (ember.codegen.pack)
  def __init__(self, arch: str = "") -> None:
    from ember_cpu.compiler import target_machine
    machine = target_machine(arch)
    self.arch, self.triple, self.datalayout = arch, machine.triple, str(machine.target_data)
    self.global_max = (cpu_threads(),)
  def render(self, uops: list[UOp], name: str = "kernel") -> str:
    fmt = kernel_argfmt(uops, self.has_threads)
    return super().render(uops, name) + f'@{name}{ARGFMT_SUFFIX} = constant [{len(fmt) + 1} x i8] c"{fmt}\\00"\n'
