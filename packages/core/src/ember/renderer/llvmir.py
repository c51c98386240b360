"""LLVMRenderer: the shared base of renderers that print a linear program as LLVM IR text (the CPU and AMD targets).

Loops use an alloca'd counter and accumulators are allocas: the O2 pipeline (mem2reg) turns them into phis. There are
no fast-math flags, so results match C compiled with `-ffp-contract=off` to the bit. Gated loads and stores branch
around the memory access. MAX propagates NaN with `fcmp uno` + `select` (llvm.maxnum would drop it).

A subclass sets data: `triple`, `datalayout`, `calling_conv`, `buffer_type`, `fn_attrs`, `code_for_op` entries.
bfloat16 and fp8 reach no LLVM renderer: `render` first rewrites them (ember.renderer.emulate) into raw bits in memory,
computed in float32, converted by integer code (round to nearest even).
"""
from __future__ import annotations
import re
import struct
from dataclasses import dataclass, field
from typing import Callable
from ember.dtype import DType, PtrDType, AnyDType, dtypes
from ember.errors import CompileError
from ember.renderer import Renderer
from ember.renderer.cstyle import value_dtype as _dt, var_name
from ember.renderer.emulate import EmulatedFloat, bits_to_float, emulate_floats, float_to_bits
from ember.uop.ops import Ops, UOp, AxisType, GroupOp

def ltype(dt: AnyDType) -> str:
  """The LLVM type of a value of `dt` in a register."""
  if isinstance(dt, PtrDType): return "ptr"
  if dt is dtypes.bool: return "i1"
  if dtypes.is_int(dt): return f"i{dt.bitsize}"
  if dt is dtypes.float32: return "float"
  if dt is dtypes.float16: return "half"
  if dt is dtypes.float64: return "double"
  raise CompileError(f"LLVMRenderer has no LLVM type for {dt!r}")

def mem_type(dt: DType) -> str:
  """The LLVM type of an element of `dt` in memory: bool is a byte."""
  if dt is dtypes.bool: return "i8"
  return ltype(dt)

def lconst(value: bool | int | float, dt: DType) -> str:
  """An LLVM constant: ints in two's complement, floats as exact hex (doubles' bits, or 0xH bits for half)."""
  if dt is dtypes.bool: return "true" if value else "false"
  if dtypes.is_int(dt):
    v = int(value) & ((1 << dt.bitsize) - 1)
    return str(v - (1 << dt.bitsize) if v >= 1 << (dt.bitsize - 1) else v)
  if dt is dtypes.float16: return "0xH" + struct.pack(">e", value).hex().upper()
  return "0x" + struct.pack(">d", float(value)).hex().upper()

def _signed(dt: DType) -> bool: return dt.kind == "i"

def _arith(int_op: str, float_op: str, uint_op: str | None = None, bool_op: str | None = None) -> Callable[..., str]:
  def fn(ret: str, a: str, b: str, dtype: DType) -> str:
    op = float_op if dtypes.is_float(dtype) else (int_op if uint_op is None or _signed(dtype) else uint_op)
    if dtype is dtypes.bool and bool_op is not None: op = bool_op  # i1 arithmetic wraps; bool add is logical or
    return f"{ret} = {op} {ltype(dtype)} {a}, {b}"
  return fn

def _cmp(int_pred: str, float_pred: str, uint_pred: str | None = None) -> Callable[..., str]:
  def fn(ret: str, a: str, b: str, dtype: DType) -> str:
    if dtypes.is_float(dtype): return f"{ret} = fcmp {float_pred} {ltype(dtype)} {a}, {b}"
    return f"{ret} = icmp {int_pred if uint_pred is None or _signed(dtype) else uint_pred} {ltype(dtype)} {a}, {b}"
  return fn

_intrinsic_suffix = {"half": "f16", "float": "f32", "double": "f64"}

def _intrinsic(name: str) -> Callable[..., str]:
  def fn(ret: str, x: str, dtype: DType) -> str:
    t = ltype(dtype)
    return f"{ret} = call {t} @llvm.{name}.{_intrinsic_suffix[t]}({t} {x})"
  return fn

def _neg(ret: str, x: str, dtype: DType) -> str:
  if dtypes.is_float(dtype): return f"{ret} = fneg {ltype(dtype)} {x}"
  if dtype is dtypes.bool: return f"{ret} = xor i1 {x}, true"
  return f"{ret} = sub {ltype(dtype)} 0, {x}"

def _max(ret: str, a: str, b: str, dtype: DType) -> str:
  t = ltype(dtype)
  if dtypes.is_float(dtype):  # (a > b || a != a) ? a : b
    return "\n".join([f"{ret}.gt = fcmp ogt {t} {a}, {b}", f"{ret}.nan = fcmp uno {t} {a}, {a}",
                      f"{ret}.c = or i1 {ret}.gt, {ret}.nan", f"{ret} = select i1 {ret}.c, {t} {a}, {t} {b}"])
  pred = "sgt" if _signed(dtype) else "ugt"
  return f"{ret}.c = icmp {pred} {t} {a}, {b}\n{ret} = select i1 {ret}.c, {t} {a}, {t} {b}"

def _mulacc(ret: str, a: str, b: str, c: str, dtype: DType) -> str:
  f = "f" if dtypes.is_float(dtype) else ""
  return f"{ret}.m = {f}mul {ltype(dtype)} {a}, {b}\n{ret} = {f}add {ltype(dtype)} {ret}.m, {c}"

@dataclass
class _Ctx:
  names: dict[UOp, str] = field(default_factory=dict)
  counters: dict[str, int] = field(default_factory=dict)
  allocas: list[str] = field(default_factory=list)
  lines: list[str] = field(default_factory=list)
  helpers: dict[str, str] = field(default_factory=dict)
  block: str = "entry"
  globals: list[str] = field(default_factory=list)  # module-level definitions (block-shared arrays)
  ptr_types: dict[UOp, str] = field(default_factory=dict)  # INDEX -> the pointer type of its address space
  loops: dict[UOp, tuple[str, str]] = field(default_factory=dict)  # RANGE -> (its value, its stop value)
  wmma: dict[tuple[UOp, ...], str] = field(default_factory=dict)  # sources of a matrix instruction -> its result
  def fresh(self, prefix: str) -> str:
    n = self.counters.get(prefix, 0)
    self.counters[prefix] = n + 1
    return f"%{prefix}{n}"
  def emit(self, text: str) -> None: self.lines.extend("  " + line for line in text.split("\n"))
  def label(self, name: str) -> None:
    self.lines.append(f"{name}:")
    self.block = name

class LLVMRenderer(Renderer):
  """Renders a linear program as one LLVM IR function. Subclasses set the target data below."""
  triple: str = ""
  datalayout: str = ""
  calling_conv: str = ""         # e.g. "amdgpu_kernel"
  buffer_type: str = "ptr"       # e.g. "ptr addrspace(1)"
  fn_attrs: str = "nounwind"
  thread_args: tuple[str, str] = ("core_id", "num_cores")
  # GPU targets with block-shared memory: its pointer type, the IR lines of a BARRIER, and SHUFFLE_XOR as
  # `shuffle_ir(ret, x, mask, dtype) -> lines` (None: no register exchange)
  local_ptr_type: str = ""
  barrier_ir: str = ""
  shuffle_ir: Callable[[str, str, int, DType], str] | None = None
  # warp matrix instructions (Renderer.tensor_cores): name -> (intrinsic, extra trailing arguments such as
  # ", i32 0"); it is called as `<nD x acc> @intrinsic(<nA x in> A, <nB x in> B, <nD x acc> zeroinitializer...)`
  wmma_intrinsics: dict[str, tuple[str, str]] = {}
  math_via_float: frozenset[DType] = frozenset({dtypes.float16})  # unary math runs in float32 for these
  code_for_op: dict[Ops, Callable[..., str]] = {
    Ops.NEG: _neg, Ops.EXP2: _intrinsic("exp2"), Ops.LOG2: _intrinsic("log2"), Ops.SIN: _intrinsic("sin"),
    Ops.SQRT: _intrinsic("sqrt"), Ops.TRUNC: _intrinsic("trunc"),
    Ops.RECIPROCAL: lambda ret, x, dtype: f"{ret} = fdiv {ltype(dtype)} {lconst(1.0, dtype)}, {x}",
    Ops.ADD: _arith("add", "fadd", bool_op="or"), Ops.SUB: _arith("sub", "fsub", bool_op="xor"),
    Ops.MUL: _arith("mul", "fmul", bool_op="and"),
    Ops.FDIV: _arith("fdiv", "fdiv"), Ops.IDIV: _arith("sdiv", "fdiv", "udiv"), Ops.MOD: _arith("srem", "frem", "urem"),
    Ops.MAX: _max, Ops.CMPLT: _cmp("slt", "olt", "ult"), Ops.CMPNE: _cmp("ne", "une"), Ops.CMPEQ: _cmp("eq", "oeq"),
    Ops.AND: _arith("and", "and"), Ops.OR: _arith("or", "or"), Ops.XOR: _arith("xor", "xor"),
    Ops.SHL: _arith("shl", "shl"), Ops.SHR: _arith("ashr", "ashr", "lshr"),
    Ops.WHERE: lambda ret, c, a, b, dtype: f"{ret} = select i1 {c}, {ltype(dtype)} {a}, {ltype(dtype)} {b}",
    Ops.MULACC: _mulacc}

  def render(self, uops: list[UOp], name: str = "kernel") -> str:
    uops = emulate_floats(uops, self)
    ctx = _Ctx()
    params: list[str] = []
    for u in sorted((u for u in uops if u.op is Ops.PARAM), key=lambda u: u.arg):
      ctx.names[u] = f"%data{u.arg}"
      params.append(f"{self.buffer_type} %data{u.arg}")
    for u in uops:
      if u.op is Ops.DEFINE_VAR:
        ctx.names[u] = "%" + var_name(u.arg[0], frozenset(self.thread_args))
        params.append(f"{ltype(u.dtype)} {ctx.names[u]}")
    if self.has_threads: params += [f"i32 %{a}" for a in self.thread_args]
    for u in uops: self._render_uop(u, ctx)
    if ctx.loops: raise CompileError(f"{type(self).__name__}: kernel {name} has a RANGE without its END")
    body = "\n".join(ctx.lines)
    intrinsics = re.findall(r"call (\w+) @(llvm\.[\w.]+)\(([^()]*)\)", body)
    declares = sorted({f"declare {ret} @{fn}({', '.join(a.strip().rsplit(' ', 1)[0] for a in args.split(',') if a)})"
                       for ret, fn, args in intrinsics})
    head = [f'target datalayout = "{self.datalayout}"'] if self.datalayout else []
    head += [f'target triple = "{self.triple}"'] if self.triple else []
    cc = f"{self.calling_conv} " if self.calling_conv else ""
    fn = [f"define {cc}void @{name}({', '.join(params)}) {self.fn_attrs} {{", "entry:", *ctx.allocas, body,
          "  ret void", "}"]
    return "\n".join([*head, *ctx.globals, *declares, *ctx.helpers.values(), *fn]) + "\n"

  # ** values **
  def _val(self, u: UOp, ctx: _Ctx) -> str:
    """The LLVM value of a source; an accumulator is loaded here, so each use reads its current value."""
    if u.op in (Ops.DEFINE_ACC, Ops.ASSIGN):
      acc = u if u.op is Ops.DEFINE_ACC else u.src[0]
      ret = ctx.fresh(f"acc{acc.arg}.r")
      ctx.emit(f"{ret} = load {ltype(acc.dtype)}, ptr %acc{acc.arg}")
      return ret
    if u in ctx.names: return ctx.names[u]
    if u.op is Ops.CONST: return lconst(u.arg, u.dtype)  # type: ignore[arg-type]
    raise CompileError(f"{type(self).__name__}: {u.op.name} is used before it appears in the linear program")

  def _render_uop(self, u: UOp, ctx: _Ctx) -> None:
    op = u.op
    if op in (Ops.PARAM, Ops.DEFINE_VAR, Ops.SINK, Ops.NOOP): return
    if op is Ops.CONST: ctx.names[u] = lconst(u.arg, u.dtype)  # type: ignore[arg-type]
    elif op is Ops.RANGE: self._render_range(u, ctx)
    elif op is Ops.END: self._render_end(u.src[0], ctx)
    elif op is Ops.DEFINE_ACC:
      ctx.allocas.append(f"  %acc{u.arg} = alloca {ltype(u.dtype)}")
      ctx.emit(f"store {ltype(u.dtype)} {self._val(u.src[0], ctx)}, ptr %acc{u.arg}")
    elif op is Ops.ASSIGN:
      acc = u.src[0]
      ctx.emit(f"store {ltype(acc.dtype)} {self._val(u.src[1], ctx)}, ptr %acc{acc.arg}")
    elif op is Ops.DEFINE_LOCAL:
      if not self.local_ptr_type:
        raise CompileError(f"{type(self).__name__} has no block-shared memory; set local_ptr_type for GPU targets")
      space = self.local_ptr_type.removeprefix("ptr").strip()
      ctx.globals.append(f"@{u.arg} = internal unnamed_addr {space} global [{u.dtype.size} x "
                         f"{ltype(u.dtype.base)}] undef, align 16")
      ctx.names[u] = f"@{u.arg}"
    elif op is Ops.BARRIER:
      if not self.barrier_ir: raise CompileError(f"{type(self).__name__} has no BARRIER; set barrier_ir")
      ctx.emit(self.barrier_ir)
    elif op is Ops.SHUFFLE_XOR:
      if self.shuffle_ir is None: raise CompileError(f"{type(self).__name__} has no SHUFFLE_XOR; set shuffle_ir")
      ret = ctx.fresh("shfl")
      ctx.emit(self.shuffle_ir(ret, self._val(u.src[0], ctx), u.arg, _dt(u)))
      ctx.names[u] = ret
    elif op is Ops.WMMA: self._render_wmma(u, ctx)
    elif op is Ops.INDEX: self._render_index(u, ctx)
    elif op is Ops.LOAD: self._render_load(u, ctx)
    elif op is Ops.STORE: self._render_store(u, ctx)
    elif op in GroupOp.ALU: self._render_alu(u, ctx)
    elif op is Ops.CAST: ctx.names[u] = self._convert(self._val(u.src[0], ctx), _dt(u.src[0]), _dt(u), ctx)
    elif op is Ops.BITCAST: ctx.names[u] = self._bitcast(self._val(u.src[0], ctx), _dt(u.src[0]), _dt(u), ctx)
    else: raise CompileError(f"{type(self).__name__} cannot render {op.name}: it is not an op of the linear program")

  def _render_wmma(self, u: UOp, ctx: _Ctx) -> None:
    """The first WMMA of a set of sources builds the A and B vectors and calls the intrinsic with C = 0; each WMMA
    extracts its element of the result."""
    from ember.codegen.tensorcore import tensor_core
    name, index, count = u.arg
    if name not in self.wmma_intrinsics:
      raise CompileError(f"{type(self).__name__} has no intrinsic for the matrix instruction {name}; add it to "
                         "wmma_intrinsics or drop it from tensor_cores")
    tc = tensor_core(name)
    t_in, t_acc = ltype(tc.dtype_in), ltype(tc.dtype_acc)
    acc_t = f"<{count} x {t_acc}>"
    if (ret := ctx.wmma.get(u.src)) is None:
      intrinsic, extra = self.wmma_intrinsics[name]
      ret = ctx.wmma[u.src] = ctx.fresh("wmma")
      n_a = tc.elements[0]
      vectors = []
      for part, srcs in (("a", u.src[:n_a]), ("b", u.src[n_a:])):
        vec_t, prev = f"<{len(srcs)} x {t_in}>", "poison"
        for i, s in enumerate(srcs):
          ctx.emit(f"{ret}.{part}{i} = insertelement {vec_t} {prev}, {t_in} {self._val(s, ctx)}, i32 {i}")
          prev = f"{ret}.{part}{i}"
        vectors.append(f"{vec_t} {prev}")
      ctx.emit(f"{ret} = call {acc_t} @{intrinsic}({', '.join(vectors)}, {acc_t} zeroinitializer{extra})")
      extra_types = "".join(", " + arg.strip().split(" ")[0] for arg in extra.split(",") if arg.strip())
      ctx.helpers.setdefault(intrinsic, f"declare {acc_t} @{intrinsic}({vectors[0].rsplit(' ', 1)[0]}, "
                                        f"{vectors[1].rsplit(' ', 1)[0]}, {acc_t}{extra_types})")
    ctx.names[u] = f"{ret}.d{index}"
    ctx.emit(f"{ctx.names[u]} = extractelement {acc_t} {ret}, i32 {index}")

  def _render_range(self, u: UOp, ctx: _Ctx) -> None:
    axis, axis_type = u.arg
    t, ridx, dt = ltype(u.dtype), f"%ridx{axis}", _dt(u)
    end = self._convert(self._val(u.src[0], ctx), _dt(u.src[0]), dt, ctx)
    start, stop = "0", end
    if axis_type is AxisType.THREAD:  # this thread's chunk: [core_id*chunk, min(end, (core_id+1)*chunk))
      if not self.has_threads:
        raise CompileError(f"{type(self).__name__} has no threads but the kernel has a THREAD range")
      core_id = self._convert(f"%{self.thread_args[0]}", dtypes.int32, dt, ctx)
      num_cores = self._convert(f"%{self.thread_args[1]}", dtypes.int32, dt, ctx)
      ctx.emit("\n".join([
        f"{ridx}.n1 = add {t} {end}, {num_cores}", f"{ridx}.n2 = sub {t} {ridx}.n1, 1",
        f"{ridx}.chunk = sdiv {t} {ridx}.n2, {num_cores}", f"{ridx}.start = mul {t} {core_id}, {ridx}.chunk",
        f"{ridx}.hi = add {t} {ridx}.start, {ridx}.chunk", f"{ridx}.lt = icmp slt {t} {ridx}.hi, {end}",
        f"{ridx}.stop = select i1 {ridx}.lt, {t} {ridx}.hi, {t} {end}"]))
      start, stop = f"{ridx}.start", f"{ridx}.stop"
    ctx.allocas.append(f"  {ridx}.addr = alloca {t}")
    ctx.emit(f"store {t} {start}, ptr {ridx}.addr\nbr label %loop{axis}")
    ctx.label(f"loop{axis}")
    ctx.emit(f"{ridx} = load {t}, ptr {ridx}.addr\n%loop{axis}.c = icmp slt {t} {ridx}, {stop}\n"
             f"br i1 %loop{axis}.c, label %loop{axis}.body, label %loop{axis}.exit")
    ctx.label(f"loop{axis}.body")
    ctx.names[u] = ridx
    ctx.loops[u] = (ridx, stop)

  def _render_end(self, rng: UOp, ctx: _Ctx) -> None:
    if rng not in ctx.loops: raise CompileError(f"{type(self).__name__}: END of a RANGE that is not open")
    ridx, _ = ctx.loops.pop(rng)
    t, axis = ltype(rng.dtype), rng.arg[0]
    ctx.emit(f"{ridx}.next = add {t} {ridx}, 1\nstore {t} {ridx}.next, ptr {ridx}.addr\nbr label %loop{axis}")
    ctx.label(f"loop{axis}.exit")

  def _render_index(self, u: UOp, ctx: _Ctx) -> None:
    buf, idx_dt = u.src[0], _dt(u.src[1])
    idx = self._convert(self._val(u.src[1], ctx), idx_dt, dtypes.int64 if _signed(idx_dt) else dtypes.uint64, ctx)
    ret, elem = ctx.fresh("idx"), mem_type(buf.dtype.base if isinstance(buf.dtype, PtrDType) else buf.dtype)
    if buf.op is Ops.DEFINE_LOCAL: elem = ltype(buf.dtype.base)  # block-shared arrays hold register values
    ptr_t = self.local_ptr_type if buf.op is Ops.DEFINE_LOCAL else self.buffer_type
    ctx.emit(f"{ret} = getelementptr {elem}, {ptr_t} {self._val(buf, ctx)}, i64 {idx}")
    ctx.names[u], ctx.ptr_types[u] = ret, ptr_t

  def _gate(self, index: UOp, ctx: _Ctx) -> str | None:
    return self._val(index.src[2], ctx) if len(index.src) == 3 else None

  def _render_load(self, u: UOp, ctx: _Ctx) -> None:
    dt = _dt(u)
    ret, gate, ptr = ctx.fresh("val"), self._gate(u.src[0], ctx), ctx.names[u.src[0]]
    if u.src[0].src[0].op is Ops.DEFINE_LOCAL:  # a register value, no conversion
      ctx.emit(f"{ret} = load {ltype(dt)}, {ctx.ptr_types[u.src[0]]} {ptr}")
      ctx.names[u] = ret
      return
    def load_and_convert() -> str:
      ctx.emit(f"{ret}.m = load {mem_type(dt)}, {self.buffer_type} {ptr}")
      if dt is dtypes.bool:
        ctx.emit(f"{ret}.v = icmp ne i8 {ret}.m, 0")
        return f"{ret}.v"
      return f"{ret}.m"
    if gate is None:
      ctx.names[u] = load_and_convert()
      return
    before, then, join = ctx.block, f"{ret[1:]}.then", f"{ret[1:]}.join"
    ctx.emit(f"br i1 {gate}, label %{then}, label %{join}")
    ctx.label(then)
    value, then_end = load_and_convert(), then
    ctx.emit(f"br label %{join}")
    ctx.label(join)
    zero = lconst(0, dt)
    ctx.emit(f"{ret} = phi {ltype(dt)} [ {value}, %{then_end} ], [ {zero}, %{before} ]")
    ctx.names[u] = ret

  def _render_store(self, u: UOp, ctx: _Ctx) -> None:
    index, dt = u.src[0], _dt(u.src[1])
    value = self._val(u.src[1], ctx)
    if index.src[0].op is Ops.DEFINE_LOCAL:
      store = f"store {ltype(dt)} {value}, {ctx.ptr_types[index]} {ctx.names[index]}"
    else:
      if dt is dtypes.bool:
        ret = ctx.fresh("st")
        ctx.emit(f"{ret} = zext i1 {value} to i8")
        value = ret
      store = f"store {mem_type(dt)} {value}, {self.buffer_type} {ctx.names[index]}"
    if (gate := self._gate(index, ctx)) is None:
      ctx.emit(store)
      return
    label = ctx.fresh("store")[1:]
    ctx.emit(f"br i1 {gate}, label %{label}.then, label %{label}.join")
    ctx.label(f"{label}.then")
    ctx.emit(f"{store}\nbr label %{label}.join")
    ctx.label(f"{label}.join")

  def _render_alu(self, u: UOp, ctx: _Ctx) -> None:
    if (fn := self.code_for_op.get(u.op)) is None:
      raise CompileError(f"{type(self).__name__} has no code for {u.op.name}; codegen must rewrite it first")
    srcs = [self._val(s, ctx) for s in u.src]
    dt = _dt(u.src[-1])  # the operands' dtype (WHERE's condition is src[0])
    if u.op in (Ops.SHL, Ops.SHR) and u.src[1].dtype is not u.src[0].dtype:  # LLVM shifts need equal operand types
      srcs[1], dt = self._convert(srcs[1], _dt(u.src[1]), _dt(u.src[0]), ctx), _dt(u.src[0])
    ret = ctx.fresh("alu")
    if u.op in GroupOp.Unary and u.op not in (Ops.NEG, Ops.RECIPROCAL) and dt in self.math_via_float:
      wide = self._convert(srcs[0], dt, dtypes.float32, ctx)
      ctx.emit(fn(f"{ret}.f", wide, dtype=dtypes.float32))
      ctx.names[u] = self._convert(f"{ret}.f", dtypes.float32, dt, ctx)
      return
    ctx.emit(fn(ret, *srcs, dtype=dt))
    ctx.names[u] = ret

  # ** conversions **
  def _convert(self, x: str, s: DType, dst: DType, ctx: _Ctx) -> str:
    """A value conversion with C semantics (float->int truncates, ->bool is != 0)."""
    if s is dst or (ltype(s) == ltype(dst) and dtypes.is_int(s) and dtypes.is_int(dst)): return x  # same bits
    ret, ts, td = ctx.fresh("cast"), ltype(s), ltype(dst)
    if dst is dtypes.bool:
      ctx.emit(f"{ret} = fcmp une {ts} {x}, {lconst(0.0, s)}" if dtypes.is_float(s) else f"{ret} = icmp ne {ts} {x}, 0")
    elif dtypes.is_float(s) and dtypes.is_float(dst):
      ctx.emit(f"{ret} = {'fpext' if dst.itemsize > s.itemsize else 'fptrunc'} {ts} {x} to {td}")
    elif dtypes.is_float(s): ctx.emit(f"{ret} = {'fptosi' if _signed(dst) else 'fptoui'} {ts} {x} to {td}")
    elif dtypes.is_float(dst): ctx.emit(f"{ret} = {'sitofp' if _signed(s) else 'uitofp'} {ts} {x} to {td}")
    elif dst.itemsize < s.itemsize: ctx.emit(f"{ret} = trunc {ts} {x} to {td}")
    else: ctx.emit(f"{ret} = {'sext' if _signed(s) else 'zext'} {ts} {x} to {td}")
    return ret

  def _bitcast(self, x: str, src: DType, dst: DType, ctx: _Ctx) -> str:
    if src.itemsize != dst.itemsize: raise CompileError(f"BITCAST needs equal itemsizes, got {src!r} -> {dst!r}")
    if src is dtypes.bool: x, src = self._convert(x, src, dtypes.uint8, ctx), dtypes.uint8
    if dst is dtypes.bool: return self._convert(self._bitcast(x, src, dtypes.uint8, ctx), dtypes.uint8, dst, ctx)
    if ltype(src) == ltype(dst): return x
    ret = ctx.fresh("cast")
    ctx.emit(f"{ret} = bitcast {ltype(src)} {x} to {ltype(dst)}")
    return ret

# ** the runtime of an in-process JIT **
# Where a CPU has no instruction for a half conversion (double -> half without AVX512-FP16; every half conversion
# without F16C, as on x86-64-v2), LLVM's code generator calls compiler-rt's helper instead. A JIT'd kernel finds no
# compiler-rt in its process, so these definitions stand in for them: integer arithmetic on the bits (the same
# conversions as bfloat16's and fp8's, correctly rounded to nearest even), half passed and returned as LLVM's `half`,
# so each follows the target's calling convention for the helper. double -> half first rounds to float32 to odd
# (an inexact result gets its last bit set): float32 keeps more than 11 + 2 bits, so the second rounding is exact.

JIT_RUNTIME_SYMBOLS = ("__extendhfsf2", "__truncsfhf2", "__truncdfhf2")

def _conversion_ir(name: str, arg: DType, ret: DType, convert: Callable[[UOp], UOp]) -> str:
  """An internal LLVM function of one argument: `convert`'s UOps on it, printed by the LLVM renderer's ALU code."""
  x = UOp(Ops.DEFINE_VAR, arg, arg=("x", 0, 0))
  out, ctx, renderer = convert(x), _Ctx(names={x: "%x"}), LLVMRenderer()
  for u in out.toposort():
    if u is not x: renderer._render_uop(u, ctx)
  return (f"define internal {ltype(ret)} @{name}({ltype(arg)} %x) nounwind {{\n" + "\n".join(ctx.lines) +
          f"\n  ret {ltype(ret)} {renderer._val(out, ctx)}\n}}")

def jit_runtime_ir() -> str:
  """An LLVM module that defines every function of JIT_RUNTIME_SYMBOLS without calling any other."""
  fmt = EmulatedFloat.of(dtypes.float16)
  to_f32 = _conversion_ir("__ember_f16_to_f32", dtypes.uint16, dtypes.float32, lambda x: bits_to_float(x, fmt))
  to_f16 = _conversion_ir("__ember_f32_to_f16", dtypes.float32, dtypes.uint16, lambda x: float_to_bits(x, fmt))
  return f"""declare double @llvm.fabs.f64(double)
{to_f32}
{to_f16}
define float @__extendhfsf2(half %h) nounwind {{
  %b = bitcast half %h to i16
  %f = call float @__ember_f16_to_f32(i16 %b)
  ret float %f
}}
define half @__truncsfhf2(float %x) nounwind {{
  %b = call i16 @__ember_f32_to_f16(float %x)
  %h = bitcast i16 %b to half
  ret half %h
}}
define half @__truncdfhf2(double %x) nounwind {{
  %f = fptrunc double %x to float
  %back = fpext float %f to double
  %inexact = fcmp one double %x, %back
  %bits = bitcast float %f to i32
  %low = and i32 %bits, 1
  %even = icmp eq i32 %low, 0
  %fix = and i1 %inexact, %even
  %ax = call double @llvm.fabs.f64(double %x)
  %aback = call double @llvm.fabs.f64(double %back)
  %away = fcmp ogt double %aback, %ax
  %step = select i1 %away, i32 -1, i32 1
  %odd = add i32 %bits, %step
  %r = select i1 %fix, i32 %odd, i32 %bits
  %rf = bitcast i32 %r to float
  %b = call i16 @__ember_f32_to_f16(float %rf)
  %h = bitcast i16 %b to half
  ret half %h
}}
"""
