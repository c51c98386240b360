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
from typing import Callable, NoReturn, cast
from ember.dtype import DType, PtrDType, AnyDType, dtypes
from ember.errors import CompileError
from ember.renderer import Renderer
from ember.renderer.cstyle import ptr_dtype, text_rules, value_dtype as _dt, var_name
from ember.renderer.emulate import EmulatedFloat, bits_to_float, emulate_floats, float_to_bits
from ember.uop.ops import Ops, UOp, AxisType, GroupOp, QDOT_PLANE
from ember.uop.rewrite import PatternMatcher, UPat

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
  """Per-render state, the `ctx` of the rendering rules: the renderer, the value of every uop, the lines so far."""
  renderer: LLVMRenderer
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
  def __getitem__(self, u: UOp) -> str:
    """The LLVM value of a source; an accumulator is loaded here, so each use reads its current value."""
    if u.op in (Ops.DEFINE_ACC, Ops.ASSIGN):
      acc = u if u.op is Ops.DEFINE_ACC else u.src[0]
      ret = self.fresh(f"acc{acc.arg}.r")
      self.emit(f"{ret} = load {ltype(acc.dtype)}, ptr %acc{acc.arg}")
      return ret
    if u in self.names: return self.names[u]
    if u.op is Ops.CONST: return lconst(u.arg, _dt(u))
    raise CompileError(f"{type(self.renderer).__name__}: {u.op.name} is used before it appears in the linear program")
  def fresh(self, prefix: str) -> str:
    n = self.counters.get(prefix, 0)
    self.counters[prefix] = n + 1
    return f"%{prefix}{n}"
  def emit(self, text: str) -> str:
    """Append instructions to the current block; returns "", the value of a uop that is only instructions."""
    self.lines.extend("  " + line for line in text.split("\n"))
    return ""
  def label(self, name: str) -> None:
    self.lines.append(f"{name}:")
    self.block = name
  def gate(self, index: UOp) -> str | None:
    """The condition of a gated INDEX (its third source), None for an ungated one."""
    return self[index.src[2]] if len(index.src) == 3 else None
  def convert(self, x: str, s: DType, dst: DType) -> str:
    """A value conversion with C semantics (float->int truncates, ->bool is != 0)."""
    if s is dst or (ltype(s) == ltype(dst) and dtypes.is_int(s) and dtypes.is_int(dst)): return x  # same bits
    ret, ts, td = self.fresh("cast"), ltype(s), ltype(dst)
    if dst is dtypes.bool:
      self.emit(f"{ret} = fcmp une {ts} {x}, {lconst(0.0, s)}" if dtypes.is_float(s) else
                f"{ret} = icmp ne {ts} {x}, 0")
    elif dtypes.is_float(s) and dtypes.is_float(dst):
      self.emit(f"{ret} = {'fpext' if dst.itemsize > s.itemsize else 'fptrunc'} {ts} {x} to {td}")
    elif dtypes.is_float(s): self.emit(f"{ret} = {'fptosi' if _signed(dst) else 'fptoui'} {ts} {x} to {td}")
    elif dtypes.is_float(dst): self.emit(f"{ret} = {'sitofp' if _signed(s) else 'uitofp'} {ts} {x} to {td}")
    elif dst.itemsize < s.itemsize: self.emit(f"{ret} = trunc {ts} {x} to {td}")
    else: self.emit(f"{ret} = {'sext' if _signed(s) else 'zext'} {ts} {x} to {td}")
    return ret
  def bitcast(self, x: str, src: DType, dst: DType) -> str:
    if src.itemsize != dst.itemsize: raise CompileError(f"BITCAST needs equal itemsizes, got {src!r} -> {dst!r}")
    if src is dtypes.bool: x, src = self.convert(x, src, dtypes.uint8), dtypes.uint8
    if dst is dtypes.bool: return self.convert(self.bitcast(x, src, dtypes.uint8), dtypes.uint8, dst)
    if ltype(src) == ltype(dst): return x
    ret = self.fresh("cast")
    self.emit(f"{ret} = bitcast {ltype(src)} {x} to {ltype(dst)}")
    return ret

def _missing(ctx: _Ctx, what: str, fix: str) -> NoReturn:
  raise CompileError(f"{type(ctx.renderer).__name__} has no {what}; {fix}")

def _range(ctx: _Ctx, x: UOp) -> str:
  axis, axis_type = x.arg
  t, ridx, dt = ltype(x.dtype), f"%ridx{axis}", _dt(x)
  end = ctx.convert(ctx[x.src[0]], _dt(x.src[0]), dt)
  start, stop = "0", end
  if axis_type is AxisType.THREAD:  # this thread's chunk: [core_id*chunk, min(end, (core_id+1)*chunk))
    if not ctx.renderer.has_threads:
      raise CompileError(f"{type(ctx.renderer).__name__} has no threads but the kernel has a THREAD range")
    core_id = ctx.convert(f"%{ctx.renderer.thread_args[0]}", dtypes.int32, dt)
    num_cores = ctx.convert(f"%{ctx.renderer.thread_args[1]}", dtypes.int32, dt)
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
  ctx.loops[x] = (ridx, stop)
  return ridx

def _end(ctx: _Ctx, rng: UOp) -> str:
  if rng not in ctx.loops: raise CompileError(f"{type(ctx.renderer).__name__}: END of a RANGE that is not open")
  ridx, _ = ctx.loops.pop(rng)
  t, axis = ltype(rng.dtype), rng.arg[0]
  ctx.emit(f"{ridx}.next = add {t} {ridx}, 1\nstore {t} {ridx}.next, ptr {ridx}.addr\nbr label %loop{axis}")
  ctx.label(f"loop{axis}.exit")
  return ""

def _define_acc(ctx: _Ctx, x: UOp) -> str:
  ctx.allocas.append(f"  %acc{x.arg} = alloca {ltype(x.dtype)}")
  return ctx.emit(f"store {ltype(x.dtype)} {ctx[x.src[0]]}, ptr %acc{x.arg}")

def _assign(ctx: _Ctx, x: UOp) -> str:
  acc = x.src[0]
  return ctx.emit(f"store {ltype(acc.dtype)} {ctx[x.src[1]]}, ptr %acc{acc.arg}")

def _define_local(ctx: _Ctx, x: UOp) -> str:
  if not ctx.renderer.local_ptr_type:
    _missing(ctx, "block-shared memory", "set local_ptr_type for GPU targets")
  space, ptr = ctx.renderer.local_ptr_type.removeprefix("ptr").strip(), ptr_dtype(x)
  ctx.globals.append(f"@{x.arg} = internal unnamed_addr {space} global [{ptr.size} x "
                     f"{ltype(ptr.base)}] undef, align 16")
  return f"@{x.arg}"

def _shuffle(ctx: _Ctx, x: UOp) -> str:
  if ctx.renderer.shuffle_ir is None: _missing(ctx, "SHUFFLE_XOR", "set shuffle_ir")
  ret = ctx.fresh("shfl")
  ctx.emit(ctx.renderer.shuffle_ir(ret, ctx[x.src[0]], x.arg, _dt(x)))
  return ret

def _wmma(ctx: _Ctx, x: UOp) -> str:
  """The first WMMA of a set of sources builds the A and B vectors and calls the intrinsic with C = 0; each WMMA
  extracts its element of the result."""
  from ember.codegen.tensorcore import tensor_core
  name, index, count = x.arg
  if name not in ctx.renderer.wmma_intrinsics:
    _missing(ctx, f"intrinsic for the matrix instruction {name}", "add it to wmma_intrinsics or drop it from "
             "tensor_cores")
  tc = tensor_core(name)
  t_in, t_acc = ltype(tc.dtype_in), ltype(tc.dtype_acc)
  acc_t = f"<{count} x {t_acc}>"
  if (ret := ctx.wmma.get(x.src)) is None:
    intrinsic, extra = ctx.renderer.wmma_intrinsics[name]
    ret = ctx.wmma[x.src] = ctx.fresh("wmma")
    n_a = tc.elements[0]
    vectors = []
    for part, srcs in (("a", x.src[:n_a]), ("b", x.src[n_a:])):
      vec_t, prev = f"<{len(srcs)} x {t_in}>", "poison"
      for i, s in enumerate(srcs):
        ctx.emit(f"{ret}.{part}{i} = insertelement {vec_t} {prev}, {t_in} {ctx[s]}, i32 {i}")
        prev = f"{ret}.{part}{i}"
      vectors.append(f"{vec_t} {prev}")
    ctx.emit(f"{ret} = call {acc_t} @{intrinsic}({', '.join(vectors)}, {acc_t} zeroinitializer{extra})")
    extra_types = "".join(", " + arg.strip().split(" ")[0] for arg in extra.split(",") if arg.strip())
    ctx.helpers.setdefault(intrinsic, f"declare {acc_t} @{intrinsic}({vectors[0].rsplit(' ', 1)[0]}, "
                                      f"{vectors[1].rsplit(' ', 1)[0]}, {acc_t}{extra_types})")
  ctx.emit(f"{ret}.d{index} = extractelement {acc_t} {ret}, i32 {index}")
  return f"{ret}.d{index}"

def _f32_const(v: float) -> str:
  """A float constant rounded to float32 (LLVM rejects a float constant that float cannot hold)."""
  return lconst(struct.unpack("f", struct.pack("f", v))[0], dtypes.float32)

_IOTA32 = f"<{', '.join(f'i32 {i}' for i in range(32))}>"

def _splat(n: int, t: str, v: int) -> str: return f"<{', '.join([f'{t} {v}'] * n)}>"

def qdot_ir(bits: int, zero: int, offset: bool, planes: int) -> tuple[str, str]:
  """The name and IR definition of a function computing QDOT (UOp.qdot) for these codes: a loop over the blocks, each
  block's 32 codes times each plane of its activations as one vector of int32 products summed to a scalar."""
  name = f"ember_qdot{bits}_z{zero}_p{planes}{'_m' if offset else ''}"
  params = ["ptr %w", "ptr %sc", "ptr %xq", "ptr %xd", "ptr %xs", *(["ptr %mo"] if offset else []), "i32 %nb"]
  if bits == 4:
    codes = ["%wo = mul i64 %b64, 16", "%wp = getelementptr i8, ptr %w, i64 %wo",
             "%raw = load <16 x i8>, ptr %wp, align 1", f"%lo = and <16 x i8> %raw, {_splat(16, 'i8', 15)}",
             f"%hi = lshr <16 x i8> %raw, {_splat(16, 'i8', 4)}",
             f"%u = shufflevector <16 x i8> %lo, <16 x i8> %hi, <32 x i32> {_IOTA32}"]
  else:
    codes = ["%wo = mul i64 %b64, 32", "%wp = getelementptr i8, ptr %w, i64 %wo",
             "%u = load <32 x i8>, ptr %wp, align 1"]
  codes += [f"%qo = mul i64 %b64, {32 * planes}", "%u32 = zext <32 x i8> %u to <32 x i32>"]
  for p in range(planes):
    codes += [f"%qo{p} = add i64 %qo, {32 * p}", f"%qp{p} = getelementptr i8, ptr %xq, i64 %qo{p}",
              f"%q{p} = load <32 x i8>, ptr %qp{p}, align 1", f"%q{p}w = sext <32 x i8> %q{p} to <32 x i32>",
              f"%p{p} = mul <32 x i32> %u32, %q{p}w",
              f"%s{p} = call i32 @llvm.vector.reduce.add.v32i32(<32 x i32> %p{p})"]
  # planes pair up into exact int32 sums (p0 * 254 + p1 stays below 2**31), each pair's sum converted to float
  groups = [list(range(g, min(g + 2, planes))) for g in range(0, planes, 2)]
  top, prev = groups[0][-1], ""
  for g, planes_g in enumerate(groups):
    if len(planes_g) == 1: codes += [f"%g{g} = add i32 %s{planes_g[0]}, 0"]
    else: codes += [f"%g{g}h = mul i32 %s{planes_g[0]}, {QDOT_PLANE}", f"%g{g} = add i32 %g{g}h, %s{planes_g[1]}"]
    codes += [f"%g{g}f = sitofp i32 %g{g} to float",
              f"%g{g}s = fmul float %g{g}f, {_f32_const(float(QDOT_PLANE) ** (top - planes_g[-1]))}"]
    if prev: codes += [f"%g{g}t = fadd float {prev}, %g{g}s"]
    prev = f"%g{g}t" if prev else f"%g{g}s"
  codes += [f"%sf = fadd float {prev}, 0.0"]
  terms = ["%xsp = getelementptr float, ptr %xs, i64 %b64", "%xsv = load float, ptr %xsp"]
  terms += ["%zt = fmul float %scv, %xsv", "%zs.next = fadd float %zs, %zt"] if zero else \
    ["%zs.next = fadd float %zs, 0.0"]
  terms += ["%mp = getelementptr float, ptr %mo, i64 %b64", "%mv = load float, ptr %mp", "%mt = fmul float %mv, %xsv",
            "%ms.next = fadd float %ms, %mt"] if offset else ["%ms.next = fadd float %ms, 0.0"]
  body = [
    "entry:", "br label %loop", "loop:",
    "%b = phi i32 [ 0, %entry ], [ %b.next, %body ]", "%dot = phi float [ 0.0, %entry ], [ %dot.next, %body ]",
    "%zs = phi float [ 0.0, %entry ], [ %zs.next, %body ]", "%ms = phi float [ 0.0, %entry ], [ %ms.next, %body ]",
    "%more = icmp slt i32 %b, %nb", "br i1 %more, label %body, label %exit", "body:", "%b64 = sext i32 %b to i64",
    *codes,
    "%scp = getelementptr float, ptr %sc, i64 %b64", "%scv = load float, ptr %scp",
    "%xdp = getelementptr float, ptr %xd, i64 %b64", "%xdv = load float, ptr %xdp", "%f0 = fmul float %scv, %xdv",
    f"%f = fmul float %f0, {_f32_const(float(QDOT_PLANE) ** -top)}",
    "%t = fmul float %sf, %f", "%dot.next = fadd float %dot, %t", *terms,
    "%b.next = add i32 %b, 1", "br label %loop", "exit:",
    f"%zz = fmul float %zs, {lconst(float(zero), dtypes.float32)}", "%r0 = fsub float %dot, %zz",
    "%r = fadd float %r0, %ms", "ret float %r"]
  lines = [line if line.endswith(":") else "  " + line for line in body]
  return name, f"define internal float @{name}({', '.join(params)}) nounwind {{\n" + "\n".join(lines) + "\n}"

def _qdot(ctx: _Ctx, x: UOp) -> str:
  if not ctx.renderer.has_qdot: _missing(ctx, "QDOT", "set has_qdot where its IR compiles, or keep it out")
  blocks, bits, zero, planes = x.arg
  name, definition = qdot_ir(bits, zero, len(x.src) == 6, planes)
  ctx.helpers.setdefault("llvm.vector.reduce.add.v32i32", "declare i32 @llvm.vector.reduce.add.v32i32(<32 x i32>)")
  ctx.helpers.setdefault(name, definition)
  ret = ctx.fresh("qdot")
  args = ", ".join(f"{ctx.ptr_types.get(s, ctx.renderer.buffer_type)} {ctx[s]}" for s in x.src)
  ctx.emit(f"{ret} = call float @{name}({args}, i32 {blocks})")
  return ret

def _index(ctx: _Ctx, x: UOp) -> str:
  buf, idx_dt = x.src[0], _dt(x.src[1])
  idx = ctx.convert(ctx[x.src[1]], idx_dt, dtypes.int64 if _signed(idx_dt) else dtypes.uint64)
  base = buf.dtype.base if isinstance(buf.dtype, PtrDType) else buf.dtype
  ret, elem = ctx.fresh("idx"), mem_type(base)
  if buf.op is Ops.DEFINE_LOCAL: elem = ltype(base)  # block-shared arrays hold register values
  ptr_t = ctx.renderer.local_ptr_type if buf.op is Ops.DEFINE_LOCAL else ctx.renderer.buffer_type
  ctx.emit(f"{ret} = getelementptr {elem}, {ptr_t} {ctx[buf]}, i64 {idx}")
  ctx.ptr_types[x] = ptr_t
  return ret

def _load(ctx: _Ctx, x: UOp) -> str:
  """A load of memory (bool is a byte); a gated load branches around it and is 0 where the gate is off."""
  dt, buffer_type = _dt(x), ctx.renderer.buffer_type
  ret, gate, ptr = ctx.fresh("val"), ctx.gate(x.src[0]), ctx.names[x.src[0]]
  if x.src[0].src[0].op is Ops.DEFINE_LOCAL:  # a register value, no conversion
    ctx.emit(f"{ret} = load {ltype(dt)}, {ctx.ptr_types[x.src[0]]} {ptr}")
    return ret
  def load_and_convert() -> str:
    ctx.emit(f"{ret}.m = load {mem_type(dt)}, {buffer_type} {ptr}")
    if dt is not dtypes.bool: return f"{ret}.m"
    ctx.emit(f"{ret}.v = icmp ne i8 {ret}.m, 0")
    return f"{ret}.v"
  if gate is None: return load_and_convert()
  before, then, join = ctx.block, f"{ret[1:]}.then", f"{ret[1:]}.join"
  ctx.emit(f"br i1 {gate}, label %{then}, label %{join}")
  ctx.label(then)
  value = load_and_convert()
  ctx.emit(f"br label %{join}")
  ctx.label(join)
  ctx.emit(f"{ret} = phi {ltype(dt)} [ {value}, %{then} ], [ {lconst(0, dt)}, %{before} ]")
  return ret

def _store(ctx: _Ctx, x: UOp) -> str:
  """A store to memory (bool as a byte); a gated store branches around it."""
  index, dt = x.src[0], _dt(x.src[1])
  value = ctx[x.src[1]]
  if index.src[0].op is Ops.DEFINE_LOCAL:
    store = f"store {ltype(dt)} {value}, {ctx.ptr_types[index]} {ctx.names[index]}"
  else:
    if dt is dtypes.bool:
      ret = ctx.fresh("st")
      ctx.emit(f"{ret} = zext i1 {value} to i8")
      value = ret
    store = f"store {mem_type(dt)} {value}, {ctx.renderer.buffer_type} {ctx.names[index]}"
  if (gate := ctx.gate(index)) is None: return ctx.emit(store)
  label = ctx.fresh("store")[1:]
  ctx.emit(f"br i1 {gate}, label %{label}.then, label %{label}.join")
  ctx.label(f"{label}.then")
  ctx.emit(f"{store}\nbr label %{label}.join")
  ctx.label(f"{label}.join")
  return ""

def _alu(ctx: _Ctx, x: UOp) -> str:
  """An ALU uop by its `code_for_op` entry; unary math of `math_via_float` dtypes runs in float32."""
  if (code := ctx.renderer.code_for_op.get(x.op)) is None:
    _missing(ctx, f"code for {x.op.name}", "codegen must rewrite it first")
  srcs = [ctx[s] for s in x.src]
  dt = _dt(x.src[-1])  # the operands' dtype (WHERE's condition is src[0])
  if x.op in (Ops.SHL, Ops.SHR) and x.src[1].dtype is not x.src[0].dtype:  # LLVM shifts need equal operand types
    srcs[1], dt = ctx.convert(srcs[1], _dt(x.src[1]), _dt(x.src[0])), _dt(x.src[0])
  ret = ctx.fresh("alu")
  if x.op in GroupOp.Unary and x.op not in (Ops.NEG, Ops.RECIPROCAL) and dt in ctx.renderer.math_via_float:
    wide = ctx.convert(srcs[0], dt, dtypes.float32)
    ctx.emit(code(f"{ret}.f", wide, dtype=dtypes.float32))
    return ctx.convert(f"{ret}.f", dtypes.float32, dt)
  ctx.emit(code(ret, *srcs, dtype=dt))
  return ret

# the LLVM renderers' rendering rules: each emits the instructions of one uop of the linear program into `ctx` (an
# `_Ctx`) and returns its value ("" for a uop that has none). A target puts rules of its own in front:
# `PatternMatcher([...]) + base`
pm_render_llvm = text_rules([
  (UPat(Ops.CONST, name="x"), lambda x: lconst(x.arg, _dt(x))),
  (UPat(Ops.RANGE, name="x"), _range),
  (UPat(Ops.END, name="x"), lambda ctx, x: _end(ctx, x.src[0])),
  (UPat(Ops.DEFINE_ACC, name="x"), _define_acc),
  (UPat(Ops.ASSIGN, name="x"), _assign),
  (UPat(Ops.DEFINE_LOCAL, name="x"), _define_local),
  (UPat(Ops.BARRIER), lambda ctx: ctx.emit(ctx.renderer.barrier_ir or _missing(ctx, "BARRIER", "set barrier_ir"))),
  (UPat(Ops.SHUFFLE_XOR, name="x"), _shuffle),
  (UPat(Ops.WMMA, name="x"), _wmma),
  (UPat(Ops.QDOT, name="x"), _qdot),
  (UPat(Ops.INDEX, name="x"), _index),
  (UPat(Ops.LOAD, name="x"), _load),
  (UPat(Ops.STORE, name="x"), _store),
  (UPat(GroupOp.ALU, name="x"), _alu),
  (UPat(Ops.CAST, name="x"), lambda ctx, x: ctx.convert(ctx[x.src[0]], _dt(x.src[0]), _dt(x))),
  (UPat(Ops.BITCAST, name="x"), lambda ctx, x: ctx.bitcast(ctx[x.src[0]], _dt(x.src[0]), _dt(x))),
])

# ops with nothing to render: buffers and variables are parameters, SINK and NOOP order the program
_no_code = (Ops.PARAM, Ops.DEFINE_VAR, Ops.SINK, Ops.NOOP)

class LLVMRenderer(Renderer):
  """Renders a linear program as one LLVM IR function. Subclasses set the target data below and put their own
  rendering rules in front of `string_rewrite`."""
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
  # ALU op -> its instructions as a function of the result's name, the operands' values and their dtype
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
  # uop -> its instructions and value (pm_render_llvm)
  string_rewrite: PatternMatcher = pm_render_llvm

  def render(self, uops: list[UOp], name: str = "kernel") -> str:
    uops = emulate_floats(uops, self)
    ctx = _Ctx(self)
    params: list[str] = []
    for u in sorted((u for u in uops if u.op is Ops.PARAM), key=lambda u: u.arg):
      ctx.names[u] = f"%data{u.arg}"
      params.append(f"{self.buffer_type} %data{u.arg}")
    for u in uops:
      if u.op is Ops.DEFINE_VAR:
        ctx.names[u] = "%" + var_name(u.arg[0], frozenset(self.thread_args))
        params.append(f"{ltype(u.dtype)} {ctx.names[u]}")
    if self.has_threads: params += [f"i32 %{a}" for a in self.thread_args]
    for u in uops: self.render_uop(u, ctx)
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

  def render_uop(self, u: UOp, ctx: _Ctx) -> None:
    """Render one uop by `string_rewrite`: its instructions go to `ctx`, its value is what the rule returns."""
    if u.op in _no_code: return
    if (value := cast(str | None, self.string_rewrite.rewrite(u, ctx))) is None:
      raise CompileError(f"{type(self).__name__} cannot render {u.op.name}: it is not an op of the linear program")
    if value: ctx.names[u] = value

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
  renderer = LLVMRenderer()
  out, ctx = convert(x), _Ctx(renderer, names={x: "%x"})
  for u in out.toposort():
    if u is not x: renderer.render_uop(u, ctx)
  return (f"define internal {ltype(ret)} @{name}({ltype(arg)} %x) nounwind {{\n" + "\n".join(ctx.lines) +
          f"\n  ret {ltype(ret)} {ctx[out]}\n}}")

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
