"""The NV renderers: CUDA C for NVRTC (a `CStyleLanguage` set up by data) and PTX text emitted directly.

Both follow the GPU convention of `docs/linear-program.md`: codegen turns the output ranges into SPECIAL `gidx0`
(`blockIdx.x`, PTX `%ctaid.x`) and `lidx0` (`threadIdx.x`, PTX `%tid.x`); `ProgramSpec.global_size` is the grid in
blocks and `local_size` the block size. Kernel arguments are the buffers (64-bit pointers) in slot order, then the
DEFINE_VAR values at their own width; the runtimes and the MOCK pack them the same way (`kernel_arg_layout`).
"""
from __future__ import annotations
import re
import struct
from typing import Any, Callable
from ember.plugin import (CompileError, CStyleLanguage, DType, GroupOp, Ops, PtrDType, Renderer, UOp, UPat,
                          aligned_layout, dtypes, ptr_dtype, text_rules, value_dtype)

DEFAULT_ARCH = "sm_80"

def parse_arch(arch: str) -> int:
  """`sm_90` -> 90. The CUDA 13 toolchain targets sm_75 and newer."""
  m = re.fullmatch(r"sm_(\d+)[af]?", arch or DEFAULT_ARCH)
  if m is None: raise CompileError(f"NV arch {arch!r} is not of the form sm_XX; use e.g. DEV=NV:CUDA:sm_90")
  return int(m.group(1))

def kernel_arg_layout(uops: list[UOp]) -> tuple[list[tuple[int, int]], int]:
  """The kernel parameter block: (offset, size) per argument (buffers by slot, then DEFINE_VARs) and its total size;
  every argument is aligned to its own size, as the CUDA ABI lays out a `__global__` function's parameters."""
  sizes = [8 for u in sorted((u for u in uops if u.op is Ops.PARAM), key=lambda u: u.arg)]
  sizes += [u.dtype.itemsize for u in uops if u.op is Ops.DEFINE_VAR]
  return aligned_layout(sizes)

def _math(name: str) -> Callable[..., str]:
  return lambda x, dtype: f"{name}{'' if dtype is dtypes.float64 else 'f'}({x})"

_bitcast_intrinsics = {
  (dtypes.float32, dtypes.int32): "__float_as_int", (dtypes.int32, dtypes.float32): "__int_as_float",
  (dtypes.float32, dtypes.uint32): "__float_as_uint", (dtypes.uint32, dtypes.float32): "__uint_as_float",
  (dtypes.float64, dtypes.int64): "__double_as_longlong", (dtypes.int64, dtypes.float64): "__longlong_as_double",
  (dtypes.float16, dtypes.int16): "__half_as_short", (dtypes.int16, dtypes.float16): "__short_as_half",
  (dtypes.float16, dtypes.uint16): "__half_as_ushort", (dtypes.uint16, dtypes.float16): "__ushort_as_half"}

def _mma_helper(name: str, ptx_type: str, arg_type: str, bits: Callable[[str], str]) -> tuple[str, str]:
  """The CUDA C helper of `mma.sync.aligned.m16n8k16.row.col.f32.<ptx_type>.<ptx_type>.f32` with C = 0 (codegen
  adds D to its accumulators): `fn(d, a0..a7, b0..b3)`, the elements packed in pairs into .b32 registers, the lower
  index in the low half (ember.codegen.tensorcore has the fragment layouts). Only device code defines it: the host
  shim defines a function of the same signature that emulates the warp (ember_nv.compiler.SHIM_HEADER)."""
  fn = f"__ember_wmma_{name}"
  args = ", ".join([f"{arg_type} a{i}" for i in range(8)] + [f"{arg_type} b{i}" for i in range(4)])
  def pack(x: str, i: int) -> str: return f"((unsigned)({bits(f'{x}{i}')}) | ((unsigned)({bits(f'{x}{i + 1}')}) << 16))"
  regs = [f"pa{i}" for i in range(4)] + [f"pb{i}" for i in range(2)]
  packs = [f"  unsigned {r} = {pack(r[1], 2 * int(r[2]))};" for r in regs]
  asm = (f'  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{ptx_type}.{ptx_type}.f32 {{%0, %1, %2, %3}}, '
         '{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"\n'
         '    : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])\n'
         f'    : {", ".join(f"{chr(34)}r{chr(34)}({r})" for r in regs)}, "f"(0.0f));')
  body = "\n".join(["#ifdef __CUDA_ARCH__", f"static __device__ __forceinline__ void {fn}(float* d, {args}) {{", *packs,
                    asm, "}", "#endif"])
  return fn, body

_code_for_mma = {
  "mma_m16n8k16_f16_f32": _mma_helper("mma_m16n8k16_f16_f32", "f16", "half", lambda x: f"__half_as_ushort({x})"),
  # bfloat16 is computed in float32 (its LOADs convert): the upper half of the float's bits is the value exactly
  "mma_m16n8k16_bf16_f32": _mma_helper("mma_m16n8k16_bf16_f32", "bf16", "float",
                                       lambda x: f"__float_as_uint({x}) >> 16"),
}

def _cast_from_half(ctx: Any, x: UOp, h: UOp) -> str | None:
  """cuda_fp16.h converts half unambiguously only to float: through float, to bool as != 0 (None: half to half)."""
  if x.dtype is dtypes.float16: return None
  as_float = f"__half2float({ctx[h]})"
  return f"({as_float}!=0.0f)" if x.dtype is dtypes.bool else ctx.renderer.render_cast(as_float, x.dtype)

# CUDA's rendering rules, in front of the C-style base's
pm_render_cuda = text_rules([
  (UPat(Ops.CAST, src=(UPat(dtype=dtypes.float16, name="h"),), name="x"), _cast_from_half),
])

class CUDARenderer(CStyleLanguage):
  """CUDA C for NVRTC: `extern "C" __global__` kernels, `half` from cuda_fp16.h, bfloat16 and fp8 as raw bits
  computed in float32 (ember.renderer.emulate), math through CUDA's device functions, bit casts through intrinsics."""
  device = "NV"
  suffix = "cu"
  has_local = True
  has_shared = True
  global_max = (2 ** 31 - 1, 65535, 65535)
  local_max = (1024, 1024, 64)
  shared_max = 48 * 1024
  warp_size = 32
  shuffle_dtypes = frozenset({dtypes.float32, dtypes.int32, dtypes.uint32})
  shared_prefix = "__shared__ "
  barrier = "__syncthreads();"
  code_for_shuffle = staticmethod(lambda x, mask, dtype: f"__shfl_xor_sync(0xffffffffu, {x}, {mask})")
  kernel_prefix = 'extern "C" __global__ void '
  helper_prefix = "static __device__ __forceinline__ "
  arg_int_prefix = "const "
  code_for_workitem = {"g": lambda axis: f"blockIdx.{axis}", "l": lambda axis: f"threadIdx.{axis}"}
  infinity = "__int_as_float(0x7f800000)"
  nan = "__int_as_float(0x7fc00000)"
  bool_literals = ("false", "true")
  type_map: dict[DType, str] = {**CStyleLanguage.type_map, dtypes.float16: "half"}
  # fp16 and bf16 matmuls on mma.sync (sm_80+: every arch this toolchain targets but sm_75, see __init__)
  tensor_cores: tuple[str, ...] = ("mma_m16n8k16_f16_f32", "mma_m16n8k16_bf16_f32")
  code_for_wmma = _code_for_mma
  code_for_op = {**CStyleLanguage.code_for_op, Ops.EXP2: _math("exp2"), Ops.LOG2: _math("log2"), Ops.SIN: _math("sin"),
                 Ops.SQRT: _math("sqrt"), Ops.TRUNC: _math("trunc")}
  string_rewrite = pm_render_cuda + CStyleLanguage.string_rewrite

  def __init__(self, arch: str = "") -> None:
    self.arch = arch or DEFAULT_ARCH
    if parse_arch(self.arch) < 80: self.tensor_cores = ()  # m16n8k16 for f16/bf16 into f32 needs sm_80

  def render_bitcast(self, x: str, src: DType, dst: DType, ctx: Any) -> str:
    if (fn := _bitcast_intrinsics.get((src, dst))) is not None: return f"{fn}({x})"
    return super().render_bitcast(x, src, dst, ctx)

  def render_cast(self, x: str, dt: DType) -> str:
    # cuda_fp16.h converts half only to and from float (and a few ints) unambiguously: go through float both ways
    if dt is dtypes.float16: return f"__float2half((float)({x}))"
    return f"({self.render_dtype(dt)})({x})"

  def render_kernel(self, name: str, params: list[str], body: list[str], helpers: list[str]) -> str:
    uses_half = any("half" in line for line in (*params, *body, *helpers))
    return ("#include <cuda_fp16.h>\n" if uses_half else "") + super().render_kernel(name, params, body, helpers)

# ** PTX **

_ptx_type = {dtypes.bool: "pred", dtypes.int8: "s8", dtypes.uint8: "u8", dtypes.int16: "s16", dtypes.uint16: "u16",
             dtypes.int32: "s32", dtypes.uint32: "u32", dtypes.int64: "s64", dtypes.uint64: "u64",
             dtypes.float16: "f16", dtypes.float32: "f32", dtypes.float64: "f64"}

# register name prefixes by register type (a prefix may not end in a digit: `%r32<4>` would read as `%r320`...)
_reg_prefix = {"pred": "p", "b32": "rb", "b64": "rd",
               "s16": "rh", "u16": "rhu", "s32": "r", "u32": "ru", "s64": "rl", "u64": "rlu",
               "f16": "h", "f32": "f", "f64": "fd"}

def _bits(dt: DType) -> str: return f"b{8 * dt.itemsize}"

def _reg_type(dt: DType) -> str:
  """Registers hold at least 16 bits; 8-bit values live in 16-bit registers, loads and stores widen/narrow them."""
  t = _ptx_type[dt]
  return t[0] + "16" if t in ("s8", "u8") else t

# matrix instructions (ember.codegen.tensorcore names): the mnemonic and how many packed .b32 registers hold A
_ptx_mma = {"mma_m16n8k16_f16_f32": ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 4)}

class PTXRenderer(Renderer):
  """PTX text straight from the linear program: one virtual register per value, predicated loads and stores for
  gates, `bra` loops, SPECIAL as `%ctaid.x`/`%tid.x`, DEFINE_LOCAL as a `.shared` array read and written with
  `ld.shared`/`st.shared`, BARRIER as `bar.sync 0`, SHUFFLE_XOR as `shfl.sync.bfly.b32`. bfloat16 and fp8 are
  not rendered (`unsupported_dtypes`)."""
  device = "NV"
  suffix = "ptx"
  has_local = True
  has_shared = True
  global_max = CUDARenderer.global_max
  local_max = CUDARenderer.local_max
  shared_max = CUDARenderer.shared_max
  warp_size = CUDARenderer.warp_size
  shuffle_dtypes = CUDARenderer.shuffle_dtypes
  unsupported_dtypes = frozenset({dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2})
  tensor_cores: tuple[str, ...] = ("mma_m16n8k16_f16_f32",)
  # what the renderer computes natively (SIN is decomposed by codegen: PTX's sin.approx is too coarse)
  code_for_op = {op: (lambda *a, **k: "") for op in (Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC)}

  def __init__(self, arch: str = "") -> None:
    self.arch = arch or DEFAULT_ARCH
    self.sm = parse_arch(self.arch)
    if self.sm < 80: self.tensor_cores = ()

  def render(self, uops: list[UOp], name: str = "kernel") -> str:
    return _PTXBuilder(self, uops, name).build()

class _PTXBuilder:
  """The state of one PTX render: registers by uop, the lines of the body, the register counts per type."""
  def __init__(self, renderer: PTXRenderer, uops: list[UOp], name: str) -> None:
    self.renderer, self.uops, self.name = renderer, uops, name
    self.regs: dict[UOp, str] = {}
    self.counts: dict[str, int] = {}
    self.lines: list[str] = []
    self.gates: dict[UOp, str | None] = {}
    self.loops: list[tuple[UOp, str]] = []
    self.labels = 0
    self.wmma: dict[tuple[UOp, ...], list[str]] = {}  # sources of a matrix instruction -> its D registers

  def reg(self, dt: DType | str) -> str:
    kind = dt if isinstance(dt, str) else _reg_type(dt)
    prefix = _reg_prefix[kind]
    n = self.counts.get(kind, 0)
    self.counts[kind] = n + 1
    return f"%{prefix}{n}"

  def emit(self, line: str) -> None: self.lines.append("\t" + line)

  def const(self, value: bool | int | float, dt: DType) -> str:
    """An immediate operand; floats as their exact hex bit pattern (0f/0d), half through a register."""
    if dt is dtypes.bool: return "1" if value else "0"
    if dt is dtypes.float32: return "0f%08x" % struct.unpack("<I", struct.pack("<f", float(value)))[0]
    if dt is dtypes.float64: return "0d%016x" % struct.unpack("<Q", struct.pack("<d", float(value)))[0]
    if dt is dtypes.float16: return "0x%04x" % struct.unpack("<H", struct.pack("<e", float(value)))[0]
    return str(int(value))

  def src(self, u: UOp) -> str:
    if u in self.regs: return self.regs[u]
    if u.op is Ops.CONST:  # materialise every constant in a register: PTX immediates are not valid everywhere
      dt = value_dtype(u)
      r = self.reg(dt)
      if dt is dtypes.bool: self.emit(f"setp.ne.s32 {r}, {self.const(u.arg, dtypes.int32)}, 0;")
      elif dt is dtypes.float16: self.emit(f"mov.b16 {r}, {self.const(u.arg, dt)};")
      else: self.emit(f"mov.{_reg_type(dt)} {r}, {self.const(u.arg, dt)};")
      self.regs[u] = r
      return r
    raise CompileError(f"PTXRenderer: {u.op.name} is used before it appears in the linear program")

  def build(self) -> str:
    params: list[str] = []
    for u in sorted((u for u in self.uops if u.op is Ops.PARAM), key=lambda u: u.arg):
      params.append(f".param .u64 data{u.arg}")
    for i, u in enumerate(u for u in self.uops if u.op is Ops.DEFINE_VAR):
      params.append(f".param .{_ptx_type[value_dtype(u)]} var{i}")
    var_index = 0
    for u in self.uops:
      if u.op is Ops.PARAM:
        r = self.reg("b64")
        self.emit(f"ld.param.u64 {r}, [data{u.arg}];")
        self.emit(f"cvta.to.global.u64 {r}, {r};")
        self.regs[u] = r
      elif u.op is Ops.DEFINE_VAR:
        r = self.reg(value_dtype(u))
        self.emit(f"ld.param.{_ptx_type[value_dtype(u)]} {r}, [var{var_index}];")
        var_index += 1
        self.regs[u] = r
      else: self.render_uop(u)
    if self.loops: raise CompileError(f"PTXRenderer: kernel {self.name} has a RANGE without its END")
    decls = [f"\t.reg .{kind} %{_reg_prefix[kind]}<{n}>;" for kind, n in sorted(self.counts.items())]
    version = "9.0" if self.renderer.sm >= 100 else "8.0"
    head = [f".version {version}", f".target {self.renderer.arch}", ".address_size 64", "",
            f".visible .entry {self.name}(", ",\n".join("\t" + p for p in params), ")", "{"]
    return "\n".join(head + decls + self.lines + ["\tret;", "}", ""])

  def render_uop(self, u: UOp) -> None:
    op = u.op
    if op in (Ops.SINK, Ops.NOOP, Ops.CONST): return
    if op is Ops.SPECIAL:
      reg_name = {"g": "%ctaid", "l": "%tid"}[u.arg[0]] + "." + "xyz"[int(u.arg[-1])]
      r = self.reg(dtypes.int32)
      self.emit(f"mov.u32 {r}, {reg_name};")
      self.regs[u] = r
    elif op is Ops.RANGE:
      r = self.reg(value_dtype(u))
      self.emit(f"mov.{_reg_type(value_dtype(u))} {r}, 0;")
      end = self.src(u.src[0])
      label = f"LOOP_{self.labels}"
      self.labels += 1
      self.regs[u] = r
      p = self.reg("pred")
      # a loop of zero trips jumps straight past its body
      self.emit(f"setp.ge.{_reg_type(value_dtype(u))} {p}, {r}, {end};")
      self.emit(f"@{p} bra {label}_END;")
      self.lines.append(f"{label}:")
      self.loops.append((u, label))
    elif op is Ops.END:
      rng, label = self.loops.pop()
      r, t = self.regs[rng], _reg_type(value_dtype(rng))
      p = self.reg("pred")
      self.emit(f"add.{t} {r}, {r}, 1;")
      self.emit(f"setp.lt.{t} {p}, {r}, {self.src(rng.src[0])};")
      self.emit(f"@{p} bra {label};")
      self.lines.append(f"{label}_END:")
    elif op is Ops.DEFINE_ACC:
      r = self.reg(value_dtype(u))
      self.move(r, self.src(u.src[0]), value_dtype(u))
      self.regs[u] = r
    elif op is Ops.ASSIGN:
      self.move(self.regs[u.src[0]], self.src(u.src[1]), value_dtype(u))
      self.regs[u] = self.regs[u.src[0]]
    elif op is Ops.DEFINE_LOCAL:
      self.lines.append(f"\t.shared .align 16 .b8 {u.arg}[{ptr_dtype(u).size * ptr_dtype(u).base.itemsize}];")
      r = self.reg("b64")
      self.emit(f"mov.u64 {r}, {u.arg};")
      self.regs[u] = r
    elif op is Ops.BARRIER: self.emit("bar.sync 0;")
    elif op is Ops.SHUFFLE_XOR:
      r = self.reg(value_dtype(u))
      self.emit(f"shfl.sync.bfly.b32 {r}, {self.src(u.src[0])}, {u.arg}, 0x1f, 0xffffffff;")
      self.regs[u] = r
    elif op is Ops.WMMA: self.render_wmma(u)
    elif op is Ops.INDEX: self.render_index(u)
    elif op is Ops.LOAD: self.render_load(u)
    elif op is Ops.STORE: self.render_store(u)
    elif op in GroupOp.ALU: self.regs[u] = self.render_alu(u)
    elif op is Ops.CAST: self.regs[u] = self.render_cast(value_dtype(u.src[0]), value_dtype(u), self.src(u.src[0]))
    elif op is Ops.BITCAST:
      r = self.reg(value_dtype(u))
      self.emit(f"mov.{_bits(value_dtype(u))} {r}, {self.src(u.src[0])};")
      self.regs[u] = r
    else: raise CompileError(f"PTXRenderer cannot render {op.name}: it is not an op of the linear program")

  def render_wmma(self, u: UOp) -> None:
    """The first WMMA of a set of sources packs them in pairs into .b32 registers (the lower element in the low half)
    and runs the instruction with C = 0; every WMMA is one of its D registers."""
    name, index, count = u.arg
    if (instr := _ptx_mma.get(name)) is None:
      raise CompileError(f"PTXRenderer has no code for the matrix instruction {name}; known: {', '.join(_ptx_mma)}")
    if (outs := self.wmma.get(u.src)) is None:
      mnemonic, a_regs = instr
      halves = [self.src(s) for s in u.src]
      packed = []
      for lo, hi in zip(halves[::2], halves[1::2]):
        packed.append(self.reg("b32"))  # mma takes untyped registers
        self.emit(f"mov.b32 {packed[-1]}, {{{lo}, {hi}}};")
      zero = self.src(UOp.const(dtypes.float32, 0.0))
      outs = self.wmma[u.src] = [self.reg(dtypes.float32) for _ in range(count)]
      self.emit(f"{mnemonic} {{{', '.join(outs)}}}, {{{', '.join(packed[:a_regs])}}}, "
                f"{{{', '.join(packed[a_regs:])}}}, {{{', '.join([zero] * count)}}};")
    self.regs[u] = outs[index]

  def move(self, dst: str, src: str, dt: DType) -> None:
    self.emit(f"mov.{'pred' if dt is dtypes.bool else self.move_type(dt)} {dst}, {src};")

  def render_index(self, u: UOp) -> None:
    buf, idx = u.src[0], u.src[1]
    base = buf.dtype.base if isinstance(buf.dtype, PtrDType) else buf.dtype
    wide, addr = self.reg("b64"), self.reg("b64")
    self.emit(f"cvt.s64.{_reg_type(value_dtype(idx))} {wide}, {self.src(idx)};" if value_dtype(idx).itemsize < 8 else
              f"mov.b64 {wide}, {self.src(idx)};")
    self.emit(f"mad.lo.s64 {addr}, {wide}, {base.itemsize}, {self.src(buf)};")
    self.regs[u] = addr
    self.gates[u] = self.src(u.src[2]) if len(u.src) == 3 else None

  def render_load(self, u: UOp) -> None:
    idx, dt = u.src[0], value_dtype(u)
    gate = self.gates.get(idx)
    r = self.reg(dt)
    target = self.reg(dtypes.int16) if dt is dtypes.bool else r
    mem_t = "u8" if dt is dtypes.bool else _ptx_type[dt] if dt.itemsize == 1 else _bits(dt)
    if gate is not None:  # the value of a gated-off load is 0
      zero = "0" if dt is dtypes.bool else self.const(0, dt)
      self.emit(f"mov.{_bits(dtypes.int16) if dt is dtypes.bool else self.move_type(dt)} {target}, {zero};")
    space = "shared" if idx.src[0].op is Ops.DEFINE_LOCAL else "global"
    self.emit(f"{'@' + gate + ' ' if gate else ''}ld.{space}.{mem_t} {target}, [{self.regs[idx]}];")
    if dt is dtypes.bool: self.emit(f"setp.ne.s16 {r}, {target}, 0;")
    self.regs[u] = r

  def move_type(self, dt: DType) -> str: return _bits(dt) if dt is dtypes.float16 else _reg_type(dt)

  def render_store(self, u: UOp) -> None:
    idx, value = u.src[0], u.src[1]
    dt, gate = value_dtype(value), self.gates.get(idx)
    val = self.src(value)
    if dt is dtypes.bool:  # a predicate is stored as a byte 0/1
      wide = self.reg(dtypes.int16)
      self.emit(f"selp.u16 {wide}, 1, 0, {val};")
      val = wide
    mem_t = "u8" if dt is dtypes.bool else _ptx_type[dt] if dt.itemsize == 1 else _bits(dt)
    space = "shared" if idx.src[0].op is Ops.DEFINE_LOCAL else "global"
    self.emit(f"{'@' + gate + ' ' if gate else ''}st.{space}.{mem_t} [{self.regs[idx]}], {val};")

  def render_alu(self, u: UOp) -> str:
    op, out = u.op, value_dtype(u)
    srcs = [self.src(s) for s in u.src]
    dt = value_dtype(u.src[-1])
    t = _reg_type(dt)
    is_float = dtypes.is_float(dt)
    r = self.reg(out)
    if dt is dtypes.bool and op not in (Ops.WHERE,):
      return self.bool_alu(op, srcs, r)
    if op is Ops.WHERE and dt is dtypes.bool:  # no selp on predicates: (c & a) | (!c & b)
      other = self.reg("pred")
      self.emit(f"and.pred {r}, {srcs[0]}, {srcs[1]};")
      self.emit(f"not.pred {other}, {srcs[0]};")
      self.emit(f"and.pred {other}, {other}, {srcs[2]};")
      self.emit(f"or.pred {r}, {r}, {other};")
    elif op is Ops.WHERE:
      self.emit(f"selp.{self.move_type(dt)} {r}, {srcs[1]}, {srcs[2]}, {srcs[0]};")
    elif op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
      cmp = {Ops.CMPLT: "lt", Ops.CMPNE: "neu" if is_float else "ne", Ops.CMPEQ: "eq"}[op]
      self.emit(f"setp.{cmp}.{t} {r}, {srcs[0]}, {srcs[1]};")
    elif op is Ops.NEG:
      if is_float: self.emit(f"neg.{t} {r}, {srcs[0]};")
      else: self.emit(f"sub.{t} {r}, 0, {srcs[0]};")
    elif op in (Ops.ADD, Ops.SUB, Ops.MUL):
      name = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul"}[op]
      mode = ".rn" if is_float else ".lo" if op is Ops.MUL else ""
      self.emit(f"{name}{mode}.{t} {r}, {srcs[0]}, {srcs[1]};")
    elif op is Ops.MULACC:
      if is_float: self.emit(f"fma.rn.{t} {r}, {srcs[0]}, {srcs[1]}, {srcs[2]};")
      else: self.emit(f"mad.lo.{t} {r}, {srcs[0]}, {srcs[1]}, {srcs[2]};")
    elif op is Ops.FDIV: self.float_math(f"div.{'rn' if dt is not dtypes.float16 else 'rn'}", dt, r, srcs)
    elif op is Ops.IDIV: self.emit(f"div.{t} {r}, {srcs[0]}, {srcs[1]};")
    elif op is Ops.MOD: self.emit(f"rem.{t} {r}, {srcs[0]}, {srcs[1]};")
    elif op is Ops.MAX:
      if is_float: self.float_max(dt, r, srcs)
      else: self.emit(f"max.{t} {r}, {srcs[0]}, {srcs[1]};")
    elif op in (Ops.AND, Ops.OR, Ops.XOR):
      self.emit(f"{op.name.lower()}.{_bits(dt)} {r}, {srcs[0]}, {srcs[1]};")
    elif op is Ops.SHL: self.emit(f"shl.{_bits(dt)} {r}, {srcs[0]}, {self.shift_amount(u.src[1], srcs[1])};")
    elif op is Ops.SHR: self.emit(f"shr.{t} {r}, {srcs[0]}, {self.shift_amount(u.src[1], srcs[1])};")
    elif op is Ops.SQRT: self.float_math("sqrt.rn", dt, r, srcs)
    elif op is Ops.RECIPROCAL: self.float_math("rcp.rn", dt, r, srcs)
    elif op is Ops.TRUNC: self.float_math("cvt.rzi", dt, r, srcs, same_type=True)
    elif op is Ops.EXP2: self.float_math("ex2.approx", dt, r, srcs, approx=True)
    elif op is Ops.LOG2: self.float_math("lg2.approx", dt, r, srcs, approx=True)
    else: raise CompileError(f"PTXRenderer has no code for {op.name}; codegen must rewrite it first")
    if out.itemsize == 1 and op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.MULACC, Ops.NEG, Ops.SHL):
      # 8-bit values live in 16-bit registers: wrap the result back into the 8-bit range
      self.emit(f"cvt.{_reg_type(out)}.{_ptx_type[out]} {r}, {r};")
    return r

  def shift_amount(self, u: UOp, reg: str) -> str:
    """PTX shifts take a 32-bit amount."""
    if value_dtype(u).itemsize == 4: return reg
    r = self.reg(dtypes.uint32)
    self.emit(f"cvt.u32.{_reg_type(value_dtype(u))} {r}, {reg};")
    return r

  def bool_alu(self, op: Ops, srcs: list[str], r: str) -> str:
    if op is Ops.NEG: self.emit(f"not.pred {r}, {srcs[0]};")
    elif op in (Ops.AND, Ops.OR, Ops.XOR): self.emit(f"{op.name.lower()}.pred {r}, {srcs[0]}, {srcs[1]};")
    elif op in (Ops.CMPNE, Ops.MAX, Ops.ADD, Ops.MUL):  # bool: != is xor, max and + are or, * is and
      self.emit(f"{'xor' if op is Ops.CMPNE else 'and' if op is Ops.MUL else 'or'}.pred {r}, {srcs[0]}, {srcs[1]};")
    elif op is Ops.CMPEQ:
      self.emit(f"xor.pred {r}, {srcs[0]}, {srcs[1]};")
      self.emit(f"not.pred {r}, {r};")
    elif op is Ops.CMPLT:  # false < true
      self.emit(f"not.pred {r}, {srcs[0]};")
      self.emit(f"and.pred {r}, {r}, {srcs[1]};")
    else: raise CompileError(f"PTXRenderer has no code for {op.name} on bool")
    return r

  def float_math(self, instr: str, dt: DType, r: str, srcs: list[str], same_type: bool = False,
                 approx: bool = False) -> None:
    """Unary/binary float math; half and the approx functions compute in float32."""
    if dt is dtypes.float16 or (approx and dt is dtypes.float64):
      wide = [self.render_cast(dt, dtypes.float32, s) for s in srcs]
      tmp = self.reg(dtypes.float32)
      suffix = ".f32.f32" if same_type else ".f32"
      self.emit(f"{instr}{'.ftz' if approx else ''}{suffix} {tmp}, {', '.join(wide)};")
      self.emit(f"cvt.rn.{_reg_type(dt)}.f32 {r}, {tmp};" if dt is not dtypes.float32 else f"mov.f32 {r}, {tmp};")
      return
    suffix = f".{_reg_type(dt)}.{_reg_type(dt)}" if same_type else f".{_reg_type(dt)}"
    self.emit(f"{instr}{suffix} {r}, {', '.join(srcs)};")

  def float_max(self, dt: DType, r: str, srcs: list[str]) -> None:
    """NaN in either operand propagates: (a > b || a != a) ? a : b."""
    t = _reg_type(dt)
    gt, nan = self.reg("pred"), self.reg("pred")
    self.emit(f"setp.gt.{t} {gt}, {srcs[0]}, {srcs[1]};")
    self.emit(f"setp.nan.{t} {nan}, {srcs[0]}, {srcs[0]};")
    self.emit(f"or.pred {gt}, {gt}, {nan};")
    self.emit(f"selp.{_bits(dt) if dt is dtypes.float16 else t} {r}, {srcs[0]}, {srcs[1]}, {gt};")

  def render_cast(self, src: DType, dst: DType, x: str) -> str:
    if src is dst: return x
    r = self.reg(dst)
    if dst is dtypes.bool:
      zero = self.const(0, src) if src is not dtypes.float16 else self.src(UOp.const(dtypes.float16, 0.0))
      self.emit(f"setp.{'neu' if dtypes.is_float(src) else 'ne'}.{_reg_type(src)} {r}, {x}, {zero};")
    elif src is dtypes.bool:
      if dtypes.is_float(dst):
        one = self.const(1.0, dst)
        zero = self.const(0.0, dst)
        self.emit(f"selp.{_bits(dst)} {r}, {one}, {zero}, {x};")
      else: self.emit(f"selp.{_reg_type(dst)} {r}, 1, 0, {x};")
    else:
      sf, df = dtypes.is_float(src), dtypes.is_float(dst)
      if df and not sf or (df and sf and dst.itemsize < src.itemsize): mode = ".rn"
      elif sf and not df: mode = ".rzi"
      else: mode = ""
      if dst.itemsize == 1 and not sf:  # narrow to 8 bits, then sign/zero-extend in the 16-bit register
        self.emit(f"cvt.{_ptx_type[dst]}.{_reg_type(src)} {r}, {x};")
        self.emit(f"cvt.{_reg_type(dst)}.{_ptx_type[dst]} {r}, {r};")
      else: self.emit(f"cvt{mode}.{_ptx_type[dst]}.{_reg_type(src)} {r}, {x};")
    return r

