"""The AMD renderers: AMDGPU LLVM IR for llvmlite's amdgcn target, and HIP-style C. Both are the core bases set up by
data (triple, data layout, calling convention, address spaces, workitem spellings).

Both follow the GPU convention of `docs/linear-program.md`: codegen turns the output ranges into SPECIAL `gidx0`
(`llvm.amdgcn.workgroup.id.x`) and `lidx0` (`llvm.amdgcn.workitem.id.x`). Kernel arguments are the buffers (64-bit
global pointers) in slot order, then the DEFINE_VAR values at their own width, each aligned to its size: the HSA
kernarg segment layout that `kernarg_layout` computes and the code object metadata reports.
"""
from __future__ import annotations
import re
from typing import Any, Callable
from ember.plugin import (CompileError, CStyleLanguage, DType, LLVMRenderer, Ops, UOp, UPat, aligned_layout, dtypes,
                          text_rules)

DEFAULT_ARCH = "gfx1100"
# the archs this backend knows: wave size and LDS bytes per workgroup (RDNA3 is wave32, CDNA3/4 wave64)
ARCHS: dict[str, tuple[int, int]] = {"gfx1100": (32, 64 * 1024), "gfx1101": (32, 64 * 1024),
                                     "gfx1102": (32, 64 * 1024), "gfx1200": (32, 64 * 1024),
                                     "gfx1201": (32, 64 * 1024), "gfx90a": (64, 64 * 1024),
                                     "gfx942": (64, 64 * 1024), "gfx950": (64, 160 * 1024)}
CODE_OBJECT_VERSION = 5  # ROCm 5.x and newer load v5; LLVM 22's default (v6) needs a recent ROCm
MAX_WORKGROUP = 256  # codegen picks blocks of at most 256 threads; the kernels declare it (amdgpu-flat-work-group-size)

# the amdgcn data layout (LLVM 19+): private memory (allocas) is address space 5, globals 1, LDS 3
AMDGPU_DATALAYOUT = ("e-m:e-p:64:64-p1:64:64-p2:32:32-p3:32:32-p4:64:64-p5:32:32-p6:32:32-p7:160:256:256:32-"
                     "p8:128:128:128:48-p9:192:256:256:32-i64:64-v16:16-v24:32-v32:32-v48:64-v96:128-v192:256-"
                     "v256:256-v512:512-v1024:1024-v2048:2048-n32:64-S32-A5-G1-ni:7:8:9")

def parse_arch(arch: str) -> str:
  """`gfx1100` -> `gfx1100`; anything that is not a known AMD GPU arch is a CompileError naming the known ones."""
  arch = arch or DEFAULT_ARCH
  if arch not in ARCHS:
    raise CompileError(f"AMD arch {arch!r} is not supported; use one of {', '.join(ARCHS)}, e.g. DEV=AMD::gfx942")
  return arch

def kernarg_layout(uops: list[UOp]) -> tuple[list[tuple[int, int]], int]:
  """The kernarg segment: (offset, size) per argument (buffers by slot, then DEFINE_VARs) and its total size, every
  argument aligned to its own size (the AMDGPU HSA ABI)."""
  sizes = [8 for _ in sorted((u for u in uops if u.op is Ops.PARAM), key=lambda u: u.arg)]
  sizes += [u.dtype.itemsize for u in uops if u.op is Ops.DEFINE_VAR]
  return aligned_layout(sizes)

# EXP2/LOG2/SIN are left to codegen's decompositions: the f64 forms have no amdgcn instruction (they would be calls to
# the device library, which a code object of ours does not link), and the f32 ones are approximations
_transcendental = (Ops.EXP2, Ops.LOG2, Ops.SIN)
_workitem_intrinsic = {"g": "workgroup", "l": "workitem"}
# allocas (loop counters, accumulators) live in the private address space of the data layout (A5)
_alloca_re = re.compile(r"^(\s+%[\w.]+ = alloca [^,\n]+)$", re.M)
_private_ptr_re = re.compile(r"\bptr (%(?:acc\d+|ridx\d+\.addr))\b")

_code_object_version_flag = ("!llvm.module.flags = !{!0}\n"
                             f'!0 = !{{i32 1, !"amdhsa_code_object_version", i32 {CODE_OBJECT_VERSION * 100}}}\n')

# matrix instructions (ember.codegen.tensorcore names): RDNA3's WMMA exists on gfx11 only (gfx12 changed its layouts)
RDNA3_WMMA = "wmma_f32_16x16x16_f16_w32"
CDNA_MFMA = "mfma_f32_16x16x16_f16"  # gfx908 and later CDNA (wave64)
def _tensor_cores(arch: str) -> tuple[str, ...]:
  if arch.startswith("gfx11"): return (RDNA3_WMMA,)
  return (CDNA_MFMA,) if arch in ("gfx90a", "gfx942", "gfx950") else ()

_HIP_WMMA_ARGS = ", ".join([f"half a{i}" for i in range(16)] + [f"half b{i}" for i in range(16)])
_HIP_WMMA = f"""#ifdef __AMDGCN__
typedef _Float16 ember_half16 __attribute__((ext_vector_type(16)));
typedef float ember_float8 __attribute__((ext_vector_type(8)));
static inline __device__ void __ember_wmma_{RDNA3_WMMA}(float* d, {_HIP_WMMA_ARGS}) {{
  ember_half16 a = {{{", ".join(f"a{i}" for i in range(16))}}};
  ember_half16 b = {{{", ".join(f"b{i}" for i in range(16))}}};
  ember_float8 c = {{}};
  ember_float8 r = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c);
  for (int i = 0; i < 8; i++) d[i] = r[i];
}}
#endif"""
"""HIP's WMMA helper: `fn(d, a0..a15, b0..b15)` with C = 0 (codegen adds D to its accumulators). Only device code
defines it: the host shim defines a function of the same signature that emulates the wave (ember_amd.mock)."""

_HIP_MFMA_ARGS = ", ".join([f"half a{i}" for i in range(4)] + [f"half b{i}" for i in range(4)])
_HIP_MFMA = f"""#ifdef __AMDGCN__
typedef _Float16 ember_half4 __attribute__((ext_vector_type(4)));
typedef float ember_float4 __attribute__((ext_vector_type(4)));
static inline __device__ void __ember_wmma_{CDNA_MFMA}(float* d, {_HIP_MFMA_ARGS}) {{
  ember_half4 a = {{a0, a1, a2, a3}};
  ember_half4 b = {{b0, b1, b2, b3}};
  ember_float4 c = {{}};
  ember_float4 r = __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, 0, 0, 0);
  for (int i = 0; i < 4; i++) d[i] = r[i];
}}
#endif"""
"""HIP's MFMA helper, like `_HIP_WMMA`: `fn(d, a0..a3, b0..b3)`, C = 0, cbsz/abid/blgp 0 (no broadcast)."""

def _workitem_id(ctx: Any, x: UOp) -> str:
  if (kind := _workitem_intrinsic.get(x.arg[0])) is None:
    raise CompileError(f"AMDLLVMRenderer has no hardware index {x.arg!r}; expected gidxN or lidxN")
  ret = ctx.fresh("special")
  ctx.emit(f"{ret} = call i32 @llvm.amdgcn.{kind}.id.{'xyz'[int(x.arg[-1])]}()")
  return ret

# AMDGPU LLVM IR's rendering rules, in front of the LLVM base's
pm_render_amdgpu = text_rules([
  (UPat(Ops.SPECIAL, name="x"), _workitem_id),
])

class AMDLLVMRenderer(LLVMRenderer):
  """AMDGPU LLVM IR: an `amdgpu_kernel` over `ptr addrspace(1)` buffers, hardware indices from the amdgcn workgroup /
  workitem id intrinsics, allocas in the private address space (mem2reg removes them at -O2)."""
  device = "AMD"
  suffix = "ll"
  has_local = True
  has_shared = True
  global_max = (2 ** 31 - 1, 65535, 65535)
  local_max = (MAX_WORKGROUP, MAX_WORKGROUP, MAX_WORKGROUP)
  triple = "amdgcn-amd-amdhsa"
  datalayout = AMDGPU_DATALAYOUT
  calling_conv = "amdgpu_kernel"
  buffer_type = "ptr addrspace(1)"
  fn_attrs = f'nounwind "amdgpu-flat-work-group-size"="1,{MAX_WORKGROUP}"'
  code_for_op = {op: fn for op, fn in LLVMRenderer.code_for_op.items() if op not in _transcendental}
  string_rewrite = pm_render_amdgpu + LLVMRenderer.string_rewrite
  shuffle_dtypes = frozenset({dtypes.float32, dtypes.int32, dtypes.uint32})
  local_ptr_type = "ptr addrspace(3)"  # LDS
  barrier_ir = ('fence syncscope("workgroup") release\ncall void @llvm.amdgcn.s.barrier()\n'
                'fence syncscope("workgroup") acquire')
  wmma_intrinsics = {RDNA3_WMMA: ("llvm.amdgcn.wmma.f32.16x16x16.f16.v8f32.v16f16", ""),
                     CDNA_MFMA: ("llvm.amdgcn.mfma.f32.16x16x16f16", ", i32 0, i32 0, i32 0")}

  def __init__(self, arch: str = "") -> None:
    self.arch = parse_arch(arch)
    self.wave_size, self.shared_max = ARCHS[self.arch]
    self.warp_size = self.wave_size
    self.tensor_cores = _tensor_cores(self.arch)

  def shuffle_ir(self, ret: str, x: str, mask: int, dtype: DType) -> str:
    """ds_bpermute reads lane `addr / 4` of the wave: the lane (workitem id within its wave) xor `mask`."""
    t = "float" if dtype is dtypes.float32 else "i32"  # the shuffle_dtypes
    bits = [f"{ret}.b = bitcast {t} {x} to i32"] if t != "i32" else []
    src = f"{ret}.b" if bits else x
    out = [f"{ret}.id = call i32 @llvm.amdgcn.workitem.id.x()", f"{ret}.lane = and i32 {ret}.id, {self.wave_size - 1}",
           f"{ret}.src = xor i32 {ret}.lane, {mask}", f"{ret}.addr = shl i32 {ret}.src, 2", *bits,
           f"{ret}{'.r' if bits else ''} = call i32 @llvm.amdgcn.ds.bpermute(i32 {ret}.addr, i32 {src})"]
    if bits: out.append(f"{ret} = bitcast i32 {ret}.r to {t}")
    return "\n".join(out)

  def render(self, uops: list[UOp], name: str = "kernel") -> str:
    src = super().render(uops, name)
    src = _private_ptr_re.sub(r"ptr addrspace(5) \1", _alloca_re.sub(r"\1, addrspace(5)", src))
    return src + _code_object_version_flag  # the base declares the intrinsics (workitem ids, barrier, bpermute)


def _builtin(name: str) -> Callable[..., str]:
  return lambda x, dtype: f"__builtin_{name}{'' if dtype is dtypes.float64 else 'f'}({x})"

# self-contained HIP: no hip_runtime.h (hipcc -nogpuinc works, and so does the host shim, which defines these first)
HIP_PRELUDE = f"""#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif
#define EMBER_LAUNCH_BOUNDS __attribute__((amdgpu_flat_work_group_size(1, {MAX_WORKGROUP})))
"""

class HIPRenderer(CStyleLanguage):
  """HIP-style C: `extern "C" __global__` kernels over the clang amdgcn builtins (workgroup/workitem ids, math), `half`
  as `_Float16`, bfloat16 and fp8 as raw bits computed in float32 (ember.renderer.emulate)."""
  device = "AMD"
  suffix = "hip"
  has_local = True
  has_shared = True
  global_max = AMDLLVMRenderer.global_max
  local_max = AMDLLVMRenderer.local_max
  kernel_prefix = 'extern "C" __global__ void EMBER_LAUNCH_BOUNDS '
  helper_prefix = "static inline __device__ "
  arg_int_prefix = "const "
  code_for_workitem = {"g": lambda axis: f"__builtin_amdgcn_workgroup_id_{axis}()",
                       "l": lambda axis: f"__builtin_amdgcn_workitem_id_{axis}()"}
  infinity = "__builtin_inff()"
  nan = "__builtin_nanf(\"\")"
  bool_literals = ("false", "true")
  type_map: dict[DType, str] = {**CStyleLanguage.type_map, dtypes.float16: "half"}
  code_for_op = {**{op: fn for op, fn in CStyleLanguage.code_for_op.items() if op not in _transcendental},
                 Ops.SQRT: _builtin("sqrt"), Ops.TRUNC: _builtin("trunc")}

  shuffle_dtypes = frozenset({dtypes.float32, dtypes.int32, dtypes.uint32})
  shared_prefix = "__shared__ "
  barrier = ('__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); '
             '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");')

  code_for_wmma = {RDNA3_WMMA: (f"__ember_wmma_{RDNA3_WMMA}", _HIP_WMMA),
                   CDNA_MFMA: (f"__ember_wmma_{CDNA_MFMA}", _HIP_MFMA)}

  def __init__(self, arch: str = "") -> None:
    self.arch = parse_arch(arch)
    self.wave_size, self.shared_max = ARCHS[self.arch]
    self.warp_size = self.wave_size
    self.tensor_cores = _tensor_cores(self.arch)

  def code_for_shuffle(self, x: str, mask: int, dtype: DType) -> str:
    """ds_bpermute reads lane `addr / 4` of the wave: the lane (workitem id within its wave) xor `mask`."""
    t = self.render_dtype(dtype)
    lane = "(__builtin_amdgcn_workitem_id_x() & (EMBER_WAVE_SIZE - 1))"
    bits = f"__builtin_bit_cast(int, {x})"
    return f"__builtin_bit_cast({t}, __builtin_amdgcn_ds_bpermute(({lane} ^ {mask}) << 2, {bits}))"

  def render_kernel(self, name: str, params: list[str], body: list[str], helpers: list[str]) -> str:
    uses_half = any("half" in line for line in (*params, *body, *helpers))
    head = HIP_PRELUDE + ("typedef _Float16 half;\n" if uses_half else "")
    if any("EMBER_WAVE_SIZE" in line for line in body):
      head += f"#undef EMBER_WAVE_SIZE\n#define EMBER_WAVE_SIZE {self.wave_size}\n"
    return head + super().render_kernel(name, params, body, helpers)
