"""CStyleLanguage: the shared renderer base of every C-like target (C, CUDA, HIP, MSL).

It prints the linear program of `docs/linear-program.md` one uop per line. Values are named `data{slot}` (buffers),
`ridx{axis}` (loop counters), `acc{id}` (accumulators), `val{n}` (loads), `alu{n}` (ALU results) and `cast{n}`
(CAST/BITCAST results); a single-use ALU/CAST is inlined into its user when that reads exactly the same values.

Op-to-text is data: `code_for_op` (an ALU op as a function of its operands' strings and dtype) and `string_rewrite`
(`pm_render_c`, a PatternMatcher of rendering rules, one per uop kind). A subclass changes data only: `type_map`,
`code_for_op` entries, rules of its own in front of `string_rewrite`, the prefixes, the literal spellings.

bfloat16 and fp8 reach no C-style renderer: `render` first rewrites them (ember.renderer.emulate) into raw bits in
memory, computed in float32, converted by integer code on LOAD, before STORE and on CAST to them (round to nearest
even).
"""
from __future__ import annotations
import math
import re
import struct
from dataclasses import dataclass, field
from typing import Callable, NoReturn, cast
from ember.dtype import DType, PtrDType, AnyDType, dtypes
from ember.errors import CompileError
from ember.renderer import Renderer
from ember.renderer.emulate import EmulatedFloat, emulate_floats, emulated_floats
from ember.uop.ops import Ops, UOp, AxisType, GroupOp, QDOT_PLANE
from ember.uop.rewrite import PatternMatcher, UPat

# ** shared by the C-style and LLVM renderers **

_generated_name = re.compile(r"^(data|ridx|acc|val|alu|cast|shfl|temp|wmma|qdot)\d+(_\w*)?$")

def var_name(name: str, reserved: frozenset[str] = frozenset()) -> str:
  """A DEFINE_VAR's name as an identifier that cannot collide with a keyword or the names renderers generate."""
  ident = re.sub(r"\W", "_", name)
  if not ident or ident[0].isdigit(): ident = "_" + ident
  if _generated_name.match(ident) or ident in reserved: ident += "_"
  return ident

def value_dtype(u: UOp) -> DType:
  """The dtype of a uop used as a value (a pointer dtype here is a malformed program)."""
  if isinstance(u.dtype, PtrDType): raise CompileError(f"{u.op.name} of pointer dtype {u.dtype!r} is used as a value")
  return u.dtype

def ptr_dtype(u: UOp) -> PtrDType:
  """The dtype of a buffer or block-shared array (a value dtype here is a malformed program)."""
  if not isinstance(u.dtype, PtrDType): raise CompileError(f"{u.op.name} of value dtype {u.dtype!r} is used as memory")
  return u.dtype

def float32_literal(v: float) -> str:
  """The shortest decimal that reads back as exactly this float32 value."""
  s = repr(v)
  for digits in range(1, 10):
    s = f"{v:.{digits}g}"
    if struct.unpack("f", struct.pack("f", float(s)))[0] == v: break
  return s if any(c in s for c in ".en") else s + ".0"

def _libm(name: str, prefix: str = "") -> Callable[..., str]:
  return lambda x, dtype: f"{prefix}{name}{'' if dtype is dtypes.float64 else 'f'}({x})"

def _max(a: str, b: str, dtype: DType) -> str:
  if dtypes.is_float(dtype): return f"((({a}>{b})||({a}!={a}))?{a}:{b})"  # NaN in either operand propagates
  return f"(({a}>{b})?{a}:{b})"

# ** the renderer **

# uops always printed as their name or expression: reading one reads whatever accumulators its string names
_by_name = frozenset({Ops.DEFINE_ACC, Ops.ASSIGN, Ops.INDEX})
# the uops printed inside their single user where that keeps their value (`_plan_inlining`)
_inlinable = frozenset(GroupOp.ALU | {Ops.CAST, Ops.BITCAST})

@dataclass
class _Ctx:
  """Per-render state, the `ctx` of the rendering rules: the renderer, the string of every uop, the lines so far, the
  helpers the kernel needs."""
  renderer: CStyleLanguage
  names: dict[UOp, str] = field(default_factory=dict)
  inlined: set[UOp] = field(default_factory=set)
  counters: dict[str, int] = field(default_factory=dict)
  lines: list[str] = field(default_factory=list)
  helpers: dict[str, str] = field(default_factory=dict)
  wmma: dict[tuple[UOp, ...], str] = field(default_factory=dict)  # sources of a matrix instruction -> its result array
  depth: int = 1
  plan: object = None  # what a target's `plan_render` worked out for this program (the C renderer's vector lanes)
  # each uop's place in the program and its users there, in program order (for `plan_render` too)
  pos: dict[UOp, int] = field(default_factory=dict)
  users: dict[UOp, list[UOp]] = field(default_factory=dict)
  silent: set[UOp] = field(default_factory=set)  # uops that `plan_render` found print nothing
  def __getitem__(self, u: UOp) -> str:
    """The string of a source: its name, its inlined expression, or a constant's literal."""
    if u in self.names: return self.names[u]
    if u.op is Ops.CONST: return self.renderer.render_const(u.arg, value_dtype(u))
    raise CompileError(f"{type(self.renderer).__name__}: {u.op.name} is used before it appears in the linear program")
  def gate(self, index: UOp) -> str | None:
    """The condition of a gated INDEX (its third source), None for an ungated one."""
    return self[index.src[2]] if len(index.src) == 3 else None
  def fresh(self, prefix: str) -> str:
    n = self.counters.get(prefix, 0)
    self.counters[prefix] = n + 1
    return f"{prefix}{n}"
  def emit(self, line: str) -> None: self.lines.append("  " * self.depth + line)
  def alu(self, x: UOp, code: Callable[..., str] | None) -> str:
    """An ALU uop as an expression of its operands, `code` (a `code_for_op` entry) printing the operation itself."""
    if code is None: _missing(self, f"code for {x.op.name}", "codegen must rewrite it first")
    r, srcs = self.renderer, [self[s] for s in x.src]
    dt, out_dt = value_dtype(x.src[-1]), value_dtype(x)  # WHERE's condition is src[0]
    if x.op in GroupOp.Unary and x.op not in (Ops.NEG, Ops.RECIPROCAL) and dt in r.math_via_float:
      return r.render_cast(code(r.render_cast(srcs[0], dtypes.float32), dtype=dtypes.float32), out_dt)
    if x.op is Ops.MULACC and out_dt in r.narrow_dtypes:  # round the product, as a MUL of this dtype would
      srcs[0] = r.render_cast(r.code_for_op[Ops.MUL](srcs[0], srcs[1], dtype=dt), out_dt)
      code, srcs = r.code_for_op[Ops.ADD], [srcs[0], srcs[2]]
    expr = code(*srcs, dtype=dt)
    if x in self.inlined and out_dt in r.narrow_dtypes and x.op not in GroupOp.Comparison | {Ops.WHERE, Ops.MAX}:
      expr = r.render_cast(expr, out_dt)  # C computes a narrow type in int or float: back to its own width
    return expr

def _missing(ctx: _Ctx, what: str, fix: str) -> NoReturn:
  raise CompileError(f"{type(ctx.renderer).__name__} has no {what}; {fix}")

def _special(ctx: _Ctx, x: UOp) -> str:
  if (code := ctx.renderer.code_for_workitem.get(x.arg[0])) is None:
    return _missing(ctx, f"hardware index {x.arg!r}", "set code_for_workitem for GPU targets")
  return code("xyz"[int(x.arg[-1])])

def _range(ctx: _Ctx, x: UOp) -> str:
  ridx, end, int_t = ctx[x], ctx[x.src[0]], ctx.renderer.render_dtype(x.dtype)
  if x.arg[1] is not AxisType.THREAD: return f"for ({int_t} {ridx} = 0; {ridx} < {end}; {ridx}++) {{"
  if not ctx.renderer.has_threads:
    raise CompileError(f"{type(ctx.renderer).__name__} has no threads but the kernel has a THREAD range")
  core_id, num_cores = ctx.renderer.thread_args  # this thread's chunk: [core_id*chunk, min(end, (core_id+1)*chunk))
  return "\n".join([f"{int_t} {ridx}_chunk = ({end}+{num_cores}-1)/{num_cores};",
                    f"{int_t} {ridx}_end = ({core_id}+1)*{ridx}_chunk < {end} ? ({core_id}+1)*{ridx}_chunk : {end};",
                    f"for ({int_t} {ridx} = {core_id}*{ridx}_chunk; {ridx} < {ridx}_end; {ridx}++) {{"])

def _define_local(ctx: _Ctx, x: UOp) -> str:
  if not (prefix := ctx.renderer.shared_prefix):
    return _missing(ctx, "block-shared memory", "set shared_prefix for GPU targets")
  return f"{prefix}{ctx.renderer.render_dtype(ptr_dtype(x).base)} {x.arg}[{ptr_dtype(x).size}];"

def _shuffle(ctx: _Ctx, x: UOp) -> str:
  if ctx.renderer.code_for_shuffle is None:
    return _missing(ctx, "SHUFFLE_XOR", "set code_for_shuffle (and warp_size)")
  return ctx.renderer.code_for_shuffle(ctx[x.src[0]], x.arg, value_dtype(x))

def _wmma(ctx: _Ctx, x: UOp) -> str:
  """The first WMMA of a set of sources calls the instruction's helper into an array; each names its element."""
  name, index, count = x.arg
  if (out := ctx.wmma.get(x.src)) is None:
    if (code := ctx.renderer.code_for_wmma.get(name)) is None:
      return _missing(ctx, f"code for the matrix instruction {name}", "add it to code_for_wmma or drop it from "
                      "tensor_cores")
    fn, definition = code
    ctx.helpers.setdefault(fn, definition)
    out = ctx.wmma[x.src] = ctx.fresh("wmma")
    ctx.emit(f"{ctx.renderer.render_dtype(x.dtype)} {out}[{count}];")
    ctx.emit(f"{fn}({out}, {', '.join(ctx[s] for s in x.src)});")
  return f"{out}[{index}]"

# QDOT (UOp.qdot) as a call of a helper per (code bits, zero point, offset). x86 CPUs with VNNI multiply a block's
# unsigned codes by its signed activations 32 at a time (vpdpbusd into 8 int32 lanes), convert those to float once
# per block and accumulate them, scaled, in one float vector: the horizontal sum runs once per row. Elsewhere the
# block's integer dot product is a plain loop.
_QDOT_PRELUDE = """#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>
#define EMBER_DPBUSD _mm256_dpbusd_epi32
#elif defined(__AVXVNNI__)
#include <immintrin.h>
#define EMBER_DPBUSD _mm256_dpbusd_avx_epi32
#endif"""

def qdot_helper(r: CStyleLanguage, bits: int, zero: int, offset: bool, planes: int) -> tuple[str, str]:
  """The name and C definition of the helper that computes QDOT for these codes (see UOp.qdot)."""
  name = f"ember_qdot{bits}_z{zero}_p{planes}{'_m' if offset else ''}"
  ptr = lambda t, n: f"{r.buffer_prefix}const {t}* {n}"  # noqa: E731
  params = [ptr("unsigned char", "w"), ptr("float", "sc"), ptr("signed char", "xq"), ptr("float", "xd"),
            ptr("float", "xs"), *([ptr("float", "mo")] if offset else []), "int nb"]
  per_block = [*(["zs += sc[b]*xs[b];"] if zero else []), *(["ms += mo[b]*xs[b];"] if offset else [])]
  # a plane's integer dot product (below 2**21 in all, 2**17 in a lane) converts to float exactly; with VNNI each
  # plane has a float vector accumulator of its own (independent chains), combined with its factor after the loop
  step = 32 * planes
  factor = [float32_literal(float(QDOT_PLANE) ** -p) + "f" for p in range(planes)]
  load = lambda p: f"_mm256_loadu_si256((const __m256i*)(xq+{step}*b+{32 * p}))"  # noqa: E731
  if bits == 4:
    codes = ["__m128i raw = _mm_loadu_si128((const __m128i*)(w+16*b));",
             "__m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));"]
    plain = [f"for (int j = 0; j < 16; j++) s{p} += (w[16*b+j]&15)*xq[{step}*b+{32 * p}+j] + "
             f"(w[16*b+j]>>4)*xq[{step}*b+{32 * p + 16}+j];" for p in range(planes)]
  else:
    codes = ["__m256i u = _mm256_loadu_si256((const __m256i*)(w+32*b));"]
    plain = [f"for (int j = 0; j < 32; j++) s{p} += w[32*b+j]*xq[{step}*b+{32 * p}+j];" for p in range(planes)]
  dots = ["__m256 f = _mm256_set1_ps(sc[b]*xd[b]);"]
  dots += [f"acc{p} = _mm256_fmadd_ps(_mm256_cvtepi32_ps(EMBER_DPBUSD(_mm256_setzero_si256(), u, {load(p)})), f, "
           f"acc{p});" for p in range(planes)]
  combine = [f"acc0 = _mm256_fmadd_ps(acc{p}, _mm256_set1_ps({factor[p]}), acc0);" for p in range(1, planes)]
  sums = " + ".join(f"(float)s{p}" + (f"*{factor[p]}" if p else "") for p in range(planes))
  tail = "".join([f" - {zero}.0f*zs" if zero else "", " + ms" if offset else ""])
  body = [
    "float zs = 0.0f, ms = 0.0f;",
    "#ifdef EMBER_DPBUSD",
    f"__m256 {', '.join(f'acc{p} = _mm256_setzero_ps()' for p in range(planes))};",
    "for (int b = 0; b < nb; b++) {",
    *("  " + c for c in codes + dots),
    *("  " + p for p in per_block),
    "}",
    *combine,
    "__m128 h = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));",
    "h = _mm_add_ps(h, _mm_movehl_ps(h, h));",
    "float dot = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));",
    "#else",
    "float dot = 0.0f;",
    "for (int b = 0; b < nb; b++) {",
    f"  int {', '.join(f's{p} = 0' for p in range(planes))};",
    *("  " + p for p in plain),
    f"  dot += ({sums})*(sc[b]*xd[b]);",
    *("  " + p for p in per_block),
    "}",
    "#endif",
    "(void)zs; (void)ms;",
    f"return dot{tail};"]
  lines = [line if line.startswith("#") else "  " + line for line in body]
  return name, f"{r.helper_prefix}float {name}({', '.join(params)}) {{\n" + "\n".join(lines) + "\n}"

def _qdot(ctx: _Ctx, x: UOp) -> str:
  if not ctx.renderer.has_qdot: _missing(ctx, "QDOT", "set has_qdot where its helper compiles, or keep it out")
  blocks, bits, zero, planes = x.arg
  name, definition = qdot_helper(ctx.renderer, bits, zero, len(x.src) == 6, planes)
  ctx.helpers.setdefault("ember_qdot_prelude", _QDOT_PRELUDE)
  ctx.helpers.setdefault(name, definition)
  return f"{name}({', '.join(f'&{ctx[s]}' for s in x.src)}, {blocks})"

def _load(ctx: _Ctx, x: UOp) -> str:
  if (gate := ctx.gate(x.src[0])) is None: return ctx[x.src[0]]
  return f"({gate} ? {ctx[x.src[0]]} : {ctx.renderer.render_const(0, value_dtype(x))})"  # a gated-off load reads 0

def _store(ctx: _Ctx, x: UOp) -> str:
  store = f"{ctx[x.src[0]]} = {ctx[x.src[1]]};"
  return store if (gate := ctx.gate(x.src[0])) is None else f"if ({gate}) {store}"

def _cast(ctx: _Ctx, x: UOp) -> str:
  src, dst = value_dtype(x.src[0]), value_dtype(x)
  return ctx[x.src[0]] if src is dst else ctx.renderer.render_cast(ctx[x.src[0]], dst)

def _bitcast(ctx: _Ctx, x: UOp) -> str:
  src, dst = value_dtype(x.src[0]), value_dtype(x)
  if src.itemsize != dst.itemsize: raise CompileError(f"BITCAST needs equal itemsizes, got {src!r} -> {dst!r}")
  return ctx[x.src[0]] if src is dst else ctx.renderer.render_bitcast(ctx[x.src[0]], src, dst, ctx)

def text_rules(rules: list[tuple[UPat, Callable[..., str | None]]]) -> PatternMatcher:
  """Rendering rules as a PatternMatcher. Their callbacks return text where rewrite rules return UOps: `rewrite`
  hands back whatever a callback returns (None: the rule does not apply), and the renderers read it as text."""
  return PatternMatcher(cast(list[tuple[UPat, Callable[..., UOp | None]]], rules))

# the C-style renderers' rendering rules: each turns one uop of the linear program into text, `ctx` a `_Ctx`. The
# text of a value (an expression) is inlined into its user or declared under a name, the text of any other uop is its
# statement(s) (`CStyleLanguage.render_uop`). A target puts rules of its own in front: `PatternMatcher([...]) + base`
pm_render_c = text_rules([
  (UPat(Ops.CONST, name="x"), lambda ctx, x: ctx.renderer.render_const(x.arg, value_dtype(x))),
  (UPat(Ops.SPECIAL, name="x"), _special),
  (UPat(Ops.RANGE, name="x"), _range),
  (UPat(Ops.END), lambda: "}"),
  (UPat(Ops.DEFINE_ACC, name="x"), lambda ctx, x: ctx[x.src[0]]),
  (UPat(Ops.ASSIGN, name="x"), lambda ctx, x: f"{ctx[x]} = {ctx[x.src[1]]};"),
  (UPat(Ops.DEFINE_LOCAL, name="x"), _define_local),
  (UPat(Ops.BARRIER), lambda ctx: ctx.renderer.barrier or _missing(ctx, "BARRIER", "set barrier for GPU targets")),
  (UPat(Ops.SHUFFLE_XOR, name="x"), _shuffle),
  (UPat(Ops.WMMA, name="x"), _wmma),
  (UPat(Ops.QDOT, name="x"), _qdot),
  (UPat(Ops.INDEX, name="x"), lambda ctx, x: f"{ctx[x.src[0]]}[{ctx[x.src[1]]}]"),  # a gate is read by its LOAD/STORE
  (UPat(Ops.LOAD, name="x"), _load),
  (UPat(Ops.STORE, name="x"), _store),
  (UPat(GroupOp.ALU, name="x"), lambda ctx, x: ctx.alu(x, ctx.renderer.code_for_op.get(x.op))),
  (UPat(Ops.CAST, name="x"), _cast),
  (UPat(Ops.BITCAST, name="x"), _bitcast),
])

# ops with no text of their own: buffers and variables are parameters, SINK and NOOP order the program
_no_text = (Ops.PARAM, Ops.DEFINE_VAR, Ops.SINK, Ops.NOOP)
# uops named by what they are before their rule runs (a rule reads its own name as ctx[x])
_fixed_names: dict[Ops, Callable[[_Ctx, UOp], str]] = {
  Ops.RANGE: lambda ctx, u: f"ridx{u.arg[0]}", Ops.DEFINE_ACC: lambda ctx, u: f"acc{u.arg}",
  Ops.SPECIAL: lambda ctx, u: u.arg, Ops.DEFINE_LOCAL: lambda ctx, u: u.arg, Ops.ASSIGN: lambda ctx, u: ctx[u.src[0]]}
# uops whose text is an expression that stands for them wherever they are read
_expressions = (Ops.CONST, Ops.INDEX, Ops.WMMA)
# values declared `T name = text;`: named above, or fresh with this prefix (unless inlined into their one user)
_declared = (Ops.SPECIAL, Ops.DEFINE_ACC)
_value_prefix = {Ops.LOAD: "val", Ops.SHUFFLE_XOR: "shfl", Ops.CAST: "cast", Ops.BITCAST: "cast",
                 Ops.QDOT: "qdot", **{op: "alu" for op in GroupOp.ALU}}

class CStyleLanguage(Renderer):
  """Renders a linear program as one C-like function. Subclasses set the class attributes below and put their own
  rendering rules in front of `string_rewrite`; `render_kernel` (the function around the body), `render_cast` and
  `render_bitcast` are the methods a target overrides where its spelling of a type conversion differs."""
  kernel_prefix: str = "void "
  buffer_prefix: str = ""         # address-space qualifier before a buffer parameter, e.g. "device "
  buffer_suffix: str = ""         # after the `*`, e.g. " restrict"
  arg_int_prefix: str = "const "  # before a scalar int parameter
  helper_prefix: str = "static inline "
  extra_args: tuple[str, ...] = ()  # parameters appended after the variables (and the thread arguments)
  thread_args: tuple[str, str] = ("core_id", "num_cores")
  # GPU targets: how to read a SPECIAL hardware index, keyed by its first letter ('g' block, 'l' thread) and axis letter
  code_for_workitem: dict[str, Callable[[str], str]] = {}
  # GPU targets with block-shared memory: the qualifier of a DEFINE_LOCAL array, the BARRIER statement, and
  # SHUFFLE_XOR as an expression of (value, lane mask, dtype) (None: no register exchange)
  shared_prefix: str = ""
  barrier: str = ""
  code_for_shuffle: Callable[[str, int, DType], str] | None = None
  # warp matrix instructions (Renderer.tensor_cores): name -> (helper function, its definition). The helper takes a
  # pointer to this lane's D elements, then its A and B elements, and writes D = A @ B
  code_for_wmma: dict[str, tuple[str, str]] = {}
  infinity: str = "INFINITY"
  nan: str = "NAN"
  bool_literals: tuple[str, str] = ("0", "1")
  int_suffix: dict[DType, str] = {dtypes.uint32: "u", dtypes.int64: "LL", dtypes.uint64: "ULL"}
  type_map: dict[DType, str] = {
    dtypes.bool: "bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
    dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long long",
    dtypes.uint64: "unsigned long long", dtypes.float16: "half", dtypes.float32: "float", dtypes.float64: "double"}
  # these dtypes run the unary math functions in float32 (C has no half sqrt/exp2/...)
  math_via_float: frozenset[DType] = frozenset({dtypes.float16})
  # ALU results of these dtypes get an explicit cast when inlined: C computes them in a wider type
  narrow_dtypes: frozenset[DType] = frozenset({dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16,
                                               dtypes.float16})
  # operands of these ops are named, never inlined: MAX repeats them, a RANGE bound is evaluated once
  named_operands: frozenset[Ops] = frozenset({Ops.MAX, Ops.RANGE})
  # ALU op -> its expression as a function of the operands' strings and their dtype (`_Ctx.alu` applies it)
  code_for_op: dict[Ops, Callable[..., str]] = {
    Ops.NEG: lambda x, dtype: f"(!{x})" if dtype is dtypes.bool else f"(-{x})",
    Ops.EXP2: _libm("exp2"), Ops.LOG2: _libm("log2"), Ops.SIN: _libm("sin"), Ops.SQRT: _libm("sqrt"),
    Ops.TRUNC: _libm("trunc"),
    Ops.RECIPROCAL: lambda x, dtype: f"({'1.0' if dtype is dtypes.float64 else '1.0f'}/{x})",
    Ops.ADD: lambda a, b, dtype: f"({a}+{b})", Ops.SUB: lambda a, b, dtype: f"({a}-{b})",
    Ops.MUL: lambda a, b, dtype: f"({a}*{b})", Ops.FDIV: lambda a, b, dtype: f"({a}/{b})",
    Ops.IDIV: lambda a, b, dtype: f"({a}/{b})", Ops.MOD: lambda a, b, dtype: f"({a}%{b})", Ops.MAX: _max,
    Ops.CMPLT: lambda a, b, dtype: f"({a}<{b})", Ops.CMPNE: lambda a, b, dtype: f"({a}!={b})",
    Ops.CMPEQ: lambda a, b, dtype: f"({a}=={b})", Ops.AND: lambda a, b, dtype: f"({a}&{b})",
    Ops.OR: lambda a, b, dtype: f"({a}|{b})", Ops.XOR: lambda a, b, dtype: f"({a}^{b})",
    Ops.SHL: lambda a, b, dtype: f"({a}<<{b})", Ops.SHR: lambda a, b, dtype: f"({a}>>{b})",
    Ops.WHERE: lambda c, a, b, dtype: f"({c}?{a}:{b})", Ops.MULACC: lambda a, b, c, dtype: f"(({a}*{b})+{c})"}
  # uop -> its text (pm_render_c)
  string_rewrite: PatternMatcher = pm_render_c

  # ** dtypes **
  def render_dtype(self, dt: AnyDType) -> str:
    # a program's bfloat16/fp8 as `render` rewrites them (ember.codegen.emulate): raw bits in memory, float32 values
    if isinstance(dt, PtrDType):
      return self.render_dtype(EmulatedFloat.of(dt.base).storage if dt.base in emulated_floats(self) else dt.base) + "*"
    if dt in emulated_floats(self): dt = dtypes.float32
    if (name := self.type_map.get(dt)) is None:
      raise CompileError(f"{type(self).__name__} has no type for {dt!r}; add it to type_map or use a supported dtype")
    return name
  def render_cast(self, x: str, dt: DType) -> str: return f"({self.render_dtype(dt)})({x})"

  # ** literals **
  def render_const(self, value: bool | int | float, dt: DType) -> str:
    if dt is dtypes.bool: return self.bool_literals[bool(value)]
    if dtypes.is_float(dt):
      if dt in emulated_floats(self): dt = dtypes.float32  # a value of bfloat16/fp8 (ember.codegen.emulate)
      if math.isnan(value): lit = self.nan
      elif math.isinf(value): lit = self.infinity if value > 0 else f"-{self.infinity}"
      elif dt is dtypes.float64: lit = repr(float(value))
      else: lit = float32_literal(float(value)) + "f"
      if dt not in (dtypes.float32, dtypes.float64): return f"(({self.render_dtype(dt)}){lit})"  # half: a cast float
      return f"({lit})" if lit.startswith("-") else lit
    suffix = self.int_suffix.get(dt, "")
    if dt.kind == "i" and dt.itemsize >= 4 and value == dtypes.min(dt):  # -2147483648 is not a C literal
      return f"(-{-value - 1}{suffix}-1)"
    return f"({value}{suffix})" if value < 0 else f"{value}{suffix}"

  # ** bit conversions (overridable: MSL has as_type, CUDA has intrinsics) **
  def render_bitcast(self, x: str, src: DType, dst: DType, ctx: _Ctx) -> str:
    fn = f"__ember_bitcast_{src.name}_{dst.name}"
    if fn not in ctx.helpers:
      s, d = self.render_dtype(src), self.render_dtype(dst)
      body = f"{{ {d} r; __builtin_memcpy(&r, &x, sizeof(r)); return r; }}"
      ctx.helpers[fn] = f"{self.helper_prefix}{d} {fn}({s} x) {body}"
    return f"{fn}({x})"

  # ** the program **
  def _plan_inlining(self, uops: list[UOp], ctx: _Ctx | None = None) -> set[UOp]:
    """The ALU/CAST/BITCAST uops printed inside their single user instead of being named (and, given a `ctx`, each
    uop's place and users there).

    Inlining moves where an expression is evaluated to where its user is. That is only the same value when no loop
    opens or closes in between and no ASSIGN in between changes an accumulator the expression reads.
    """
    # the Ops members read per uop, once: on Python 3.11 each `Ops.X` read takes EnumType.__getattr__'s slow path
    RANGE, END, DEFINE_ACC, ASSIGN, INDEX = Ops.RANGE, Ops.END, Ops.DEFINE_ACC, Ops.ASSIGN, Ops.INDEX
    pos: dict[UOp, int] = {}
    users: dict[UOp, list[UOp]] = {u: [] for u in uops}
    users_of = users.get
    # loops opened or closed before each position: one opens or closes between two places where the counts differ
    # (a scan of the uops between a value and its user, per value, was a quadratic part of rendering a large kernel)
    loop_marks, loops = [0], 0
    for i, u in enumerate(uops):
      pos[u] = i
      if (op := u.op) is RANGE or op is END: loops += 1
      loop_marks.append(loops)
      for s in u.src:
        if (us := users_of(s)) is not None: us.append(u)
    if ctx is not None: ctx.pos, ctx.users = pos, users
    inlined: set[UOp] = set()
    named_operands = self.named_operands
    # accumulators an uop's (inlined) expression reads, for the uops that read any (most read none); only what an
    # INDEX or an inlining candidate reads is ever looked up
    reads_acc: dict[UOp, frozenset[UOp]] = {}
    for u in uops:
      if (op := u.op) is DEFINE_ACC: reads_acc[u] = frozenset({u})
      elif op is ASSIGN: reads_acc[u] = frozenset({u.src[0]})
      if op is not INDEX and (op not in _inlinable or len(its_users := users[u]) != 1): continue
      if reads_acc:  # named values are snapshots; an inlined one's string, or an INDEX's, carries its sources' reads
        carried: frozenset[UOp] | None = None
        for s in u.src:
          if (read := reads_acc.get(s)) is not None and (s in inlined or s.op in _by_name):
            carried = read if carried is None else carried | read
        if carried is not None: reads_acc[u] = carried
      if op is INDEX: continue
      user = its_users[0]
      if user.op in named_operands: continue
      # an INDEX is printed where it is loaded or stored: those are the real places of evaluation
      if user.op is not INDEX: end = pos[user]
      elif readers := users[user]: end = max([pos[x] for x in readers])
      else: continue
      start = pos[u] + 1
      if loop_marks[end if end > start else start] != loop_marks[start]: continue
      if (acc := reads_acc.get(u)) and any(x.op is ASSIGN and x.src[0] in acc for x in uops[start:end]): continue
      inlined.add(u)
    return inlined

  def render(self, uops: list[UOp], name: str = "kernel") -> str:
    uops = emulate_floats(uops, self)
    ctx = _Ctx(self)
    ctx.inlined = self._plan_inlining(uops, ctx)
    self.plan_render(uops, ctx)
    reserved = frozenset(self.thread_args) | frozenset(self.type_map.values()) | _c_keywords
    # the parameters: buffers (const unless stored to), then variables, in one walk of the program
    written, buffers, variables = set(), [], []
    STORE, PARAM, DEFINE_VAR = Ops.STORE, Ops.PARAM, Ops.DEFINE_VAR  # each `Ops.X` read is slow on 3.11
    for u in uops:
      if (op := u.op) is STORE: written.add(u.src[0].src[0])
      elif op is PARAM: buffers.append(u)
      elif op is DEFINE_VAR: variables.append(u)
    params: list[str] = []
    for u in sorted(buffers, key=lambda u: u.arg):
      ctx.names[u] = f"data{u.arg}"
      const = "" if u in written else "const "
      params.append(f"{self.buffer_prefix}{const}{self.render_dtype(u.dtype)}{self.buffer_suffix} data{u.arg}")
    for u in variables:
      ctx.names[u] = var_name(u.arg[0], reserved)
      params.append(f"{self.arg_int_prefix}{self.render_dtype(u.dtype)} {ctx.names[u]}")
    if self.has_threads:
      params += [f"{self.arg_int_prefix}{self.render_dtype(dtypes.int32)} {a}" for a in self.thread_args]
    params += list(self.extra_args)
    render_uop, silent = self.render_uop, ctx.silent
    for u in uops:
      if u not in silent: render_uop(u, ctx)
    if ctx.depth != 1: raise CompileError(f"{type(self).__name__}: kernel {name} has a RANGE without its END")
    return self.render_kernel(name, params, ctx.lines, list(ctx.helpers.values()))

  def plan_render(self, uops: list[UOp], ctx: _Ctx) -> None:
    """A target's own look at the whole program once inlining is planned, before any uop renders: it may read
    `ctx.pos` and `ctx.users`, set `ctx.plan` and `ctx.silent` (uops `render_uop` is not called for) and change
    `ctx.inlined` (none here)."""

  def render_kernel(self, name: str, params: list[str], body: list[str], helpers: list[str]) -> str:
    """The whole source: helpers, then the kernel function."""
    head = "\n".join(helpers) + ("\n" if helpers else "")
    return head + f"{self.kernel_prefix}{name}({', '.join(params)}) {{\n" + "\n".join(body) + "\n}\n"

  def render_uop(self, u: UOp, ctx: _Ctx) -> None:
    """Render one uop by `string_rewrite` and place its text: an expression where it is read, a declared value, or
    statement lines at the current loop depth."""
    if u.op in _no_text: return
    if (naming := _fixed_names.get(u.op)) is not None: ctx.names[u] = naming(ctx, u)
    if (text := cast(str | None, self.string_rewrite.rewrite(u, ctx))) is None:
      raise CompileError(f"{type(self).__name__} cannot render {u.op.name}: it is not an op of the linear program")
    if u.op in _expressions or u in ctx.inlined: ctx.names[u] = text
    elif u.op in _declared or u.op in _value_prefix:
      if u.op not in _declared: ctx.names[u] = ctx.fresh(_value_prefix[u.op])
      ctx.emit(f"{self.render_dtype(u.dtype)} {ctx.names[u]} = {text};")
    else:
      if u.op is Ops.END: ctx.depth -= 1
      for line in text.split("\n"): ctx.emit(line)
      if u.op is Ops.RANGE: ctx.depth += 1

_c_keywords = frozenset({
  "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum", "extern", "float",
  "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return", "short", "signed", "sizeof", "static",
  "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while", "bool", "true", "false", "half",
  "kernel", "device", "constant", "thread", "class", "template", "namespace", "new", "delete", "this"})
