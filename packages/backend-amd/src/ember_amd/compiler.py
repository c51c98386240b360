"""The AMD compilers: AMDGPU LLVM IR -> code object in process (llvmlite's amdgcn target, then `elf.link_code_object`),
and HIP-style C -> code object with a HIP-capable clang (hipcc / amdclang++ / clang with the amdgcn target) where one
is installed. Neither needs a GPU. And the host shim build of the HIP-style C that the MOCK+AMD device runs.

*The host shim* (`AMDShimCompiler`): `HIPRenderer` output compiled by the system C++ compiler through core's host shim
(`ember.plugin.HostShimCompiler`): the workgroup/workitem id builtins read thread-local globals that a generated
launcher sets while it loops over every workgroup and thread of the grid; barriers, `ds_bpermute` and the matrix
instructions are emulated over a workgroup's host threads. The launcher reads the kernel arguments from a kernarg
segment laid out like the HSA ABI's (`kernarg_layout`), which is what the MOCK GPU finds behind COMPUTE_USER_DATA_0/1.
"""
from __future__ import annotations
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from typing import Any
from ember.plugin import CompileError, Compiler, HostShimCompiler, Renderer, ShimDialect
from ember_amd.elf import link_code_object
from ember_amd.renderer import parse_arch

def _numbered(src: str) -> str: return "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(src.splitlines()))

def _llvm() -> Any:
  try: import llvmlite.binding as llvm
  except ImportError as e:
    raise CompileError("the AMD LLVM compiler needs llvmlite; `pip install llvmlite` (a dependency of "
                       "ember-backend-amd)") from e
  llvm.initialize_all_targets()
  llvm.initialize_all_asmprinters()
  return llvm

@functools.cache
def amdgpu_target_machine(arch: str) -> Any:
  """An llvmlite target machine for amdgcn-amd-amdhsa and one gfx arch, or a CompileError if this LLVM lacks it."""
  llvm = _llvm()
  try: target = llvm.Target.from_triple("amdgcn-amd-amdhsa")
  except RuntimeError as e:
    raise CompileError(f"this llvmlite's LLVM {llvm.llvm_version_info} has no AMDGPU target ({e}); install an "
                       "llvmlite wheel built with all targets") from e
  return target.create_target_machine(cpu=arch, opt=2, reloc="pic", codemodel="default")

def compile_amdgpu_object(src: str, arch: str) -> bytes:
  """LLVM IR -> the optimised amdgcn relocatable object (ET_REL) for `arch`."""
  llvm, machine = _llvm(), amdgpu_target_machine(arch)
  try:
    mod = llvm.parse_assembly(src)
    mod.verify()
  except RuntimeError as e:
    raise CompileError(f"LLVM rejected an AMDGPU kernel for {arch}: {e}\nsource:\n{_numbered(src)}") from e
  passes = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=2))
  passes.getModulePassManager().run(mod, passes)
  try: return machine.emit_object(mod)
  except RuntimeError as e:
    raise CompileError(f"LLVM could not generate amdgcn code for {arch}: {e}\nsource:\n{_numbered(src)}") from e

def amdgpu_assembly(src: str, arch: str) -> str:
  """The amdgcn assembly of LLVM IR for `arch` (for DEBUG and for tests that read instructions)."""
  llvm, machine = _llvm(), amdgpu_target_machine(arch)
  mod = llvm.parse_assembly(src)
  passes = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=2))
  passes.getModulePassManager().run(mod, passes)
  return str(machine.emit_assembly(mod))

class AMDLLVMCompiler(Compiler):
  """AMDGPU LLVM IR -> HSA code object for one gfx arch: llvmlite at O2, then ember's code object linker."""
  binary_format = "hsaco"
  def __init__(self, arch: str) -> None:
    self.arch = parse_arch(arch)
    amdgpu_target_machine(self.arch)
    llvm = _llvm()
    super().__init__(f"compile_amdgpu_llvm_{'_'.join(map(str, llvm.llvm_version_info))}_{self.arch}")
  def compile(self, src: str) -> bytes: return link_code_object(compile_amdgpu_object(src, self.arch))

HIP_COMPILERS = ("hipcc", "amdclang++", "clang++", "clang")

@functools.cache
def find_hip_compiler() -> str | None:
  """A compiler that builds HIP for amdgcn: hipcc or amdclang++ from ROCm ($ROCM_PATH, /opt/rocm), else a clang on
  PATH whose targets include amdgcn. None when there is none."""
  roots = [os.environ.get("ROCM_PATH", ""), "/opt/rocm"]
  for root in filter(None, roots):
    for name in ("bin/hipcc", "llvm/bin/amdclang++", "llvm/bin/clang++"):
      if os.path.exists(path := os.path.join(root, name)): return path
  for name in HIP_COMPILERS[2:]:
    if (found := shutil.which(name)) is None: continue
    try: targets = subprocess.run([found, "-print-targets"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError): continue
    if "amdgcn" in targets: return found
  return None

class HIPCompiler(Compiler):
  """HIP-style C -> HSA code object with a HIP-capable clang (`-x hip --offload-device-only -nogpuinc -nogpulib`)."""
  binary_format = "hsaco"
  def __init__(self, arch: str) -> None:
    self.arch = parse_arch(arch)
    if (cc := find_hip_compiler()) is None:
      raise CompileError("no HIP compiler found (looked for $ROCM_PATH/bin/hipcc, /opt/rocm, and a clang with the "
                         "amdgcn target on PATH); install ROCm, or use DEV=AMD:LLVM (llvmlite, no ROCm needed)")
    self.cc = cc
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    super().__init__(f"compile_hip_{hashlib.sha256(version.encode()).hexdigest()[:12]}_{self.arch}")
  def compile(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="ember_hip_") as tmp:
      out = os.path.join(tmp, "kernel.hsaco")
      cmd = [self.cc, "-x", "hip", f"--offload-arch={self.arch}", "--offload-device-only", "-nogpuinc", "-nogpulib",
             "-O3", "-ffp-contract=off", "-fno-gpu-rdc", "-", "-o", out]
      try: proc = subprocess.run(cmd, input=src.encode(), capture_output=True, timeout=300)
      except (OSError, subprocess.SubprocessError) as e: raise CompileError(f"running {self.cc} failed: {e}") from e
      if proc.returncode != 0:
        raise CompileError(f"{self.cc} rejected a HIP kernel for {self.arch}:\n{proc.stderr.decode(errors='replace')}\n"
                           f"source:\n{_numbered(src)}")
      with open(out, "rb") as f: return f.read()

# ** the host shim (MOCK+AMD) **

SHIM_HEADER = r"""
struct ember_dim3 { unsigned int x, y, z; };
static thread_local ember_dim3 ember_workgroup, ember_workitem;
#define EMBER_LAUNCH_BOUNDS
#define __builtin_amdgcn_workgroup_id_x() ((int)ember_workgroup.x)
#define __builtin_amdgcn_workgroup_id_y() ((int)ember_workgroup.y)
#define __builtin_amdgcn_workgroup_id_z() ((int)ember_workgroup.z)
#define __builtin_amdgcn_workitem_id_x() ((int)ember_workitem.x)
#define __builtin_amdgcn_workitem_id_y() ((int)ember_workitem.y)
#define __builtin_amdgcn_workitem_id_z() ((int)ember_workitem.z)
#define __builtin_amdgcn_s_barrier() ember_sync()
#define __builtin_amdgcn_fence(order, scope) ((void)0)
#define __builtin_amdgcn_ds_bpermute(addr, v) ember_exchange_with((v), \
  (ember_tid & ~(unsigned)(EMBER_WAVE_SIZE - 1)) + (((unsigned)(addr) >> 2) & (unsigned)(EMBER_WAVE_SIZE - 1)))
"""

SHIM_HEADER += r"""
// v_wmma_f32_16x16x16_f16 (RDNA3, wave32) for a wave of host threads (the threaded launcher runs a workgroup's threads
// together). RDNA3 ISA: lane l holds row l % 16 of A and column l % 16 of B, k = 0..15 in order, and lanes 16..31 must
// hold copies of lanes 0..15; D element v of lane l is D[2v + l / 16][l % 16]. Every lane publishes its fragments,
// the workgroup syncs, each lane computes its D elements from lanes 0..15 (exact products, float sums), NaN where a
// lane of the upper half does not hold the copy the ISA requires; a second sync lets the slots be reused.
static float ember_wmma_frag[1024][32];
static inline void __ember_wmma_wmma_f32_16x16x16_f16_w32(float* d, """ + \
  ", ".join([f"_Float16 a{i}" for i in range(16)] + [f"_Float16 b{i}" for i in range(16)]) + r""") {
  const _Float16 ab[32] = {""" + ", ".join([f"a{i}" for i in range(16)] + [f"b{i}" for i in range(16)]) + r"""};
  unsigned lane = ember_tid % 32, base = ember_tid - lane;
  for (unsigned i = 0; i < 32; i++) ember_wmma_frag[ember_tid][i] = (float)ab[i];
  ember_rendezvous();
  bool copies = true;
  for (unsigned l = 16; l < 32; l++)
    for (unsigned i = 0; i < 32; i++)
      copies = copies && ember_wmma_frag[base + l][i] == ember_wmma_frag[base + l - 16][i];
  for (unsigned v = 0; v < 8; v++) {
    unsigned row = 2 * v + lane / 16, col = lane % 16;
    float sum = 0.0f;
    for (unsigned k = 0; k < 16; k++) sum += ember_wmma_frag[base + row][k] * ember_wmma_frag[base + col][16 + k];
    d[v] = copies ? sum : NAN;
  }
  ember_rendezvous();
}
"""

SHIM_HEADER += r"""
// v_mfma_f32_16x16x16_f16 (CDNA, wave64) for a wave of host threads. AMD's CDNA3/4 matrix core guide: lane l holds
// A[l % 16][4(l / 16) + i] and B[4(l / 16) + i][l % 16], i = 0..3; D element i of lane l is D[4(l / 16) + i][l % 16].
// Every lane publishes its fragments, the workgroup syncs, each lane computes its D elements by reading A and B back
// from the lanes that hold them, and a second sync lets the slots be reused.
static float ember_mfma_frag[1024][8];
static inline void __ember_wmma_mfma_f32_16x16x16_f16(float* d, """ + \
  ", ".join([f"_Float16 a{i}" for i in range(4)] + [f"_Float16 b{i}" for i in range(4)]) + r""") {
  const _Float16 ab[8] = {a0, a1, a2, a3, b0, b1, b2, b3};
  unsigned lane = ember_tid % 64, base = ember_tid - lane;
  for (unsigned i = 0; i < 8; i++) ember_mfma_frag[ember_tid][i] = (float)ab[i];
  ember_rendezvous();
  for (unsigned i = 0; i < 4; i++) {
    unsigned row = 4 * (lane / 16) + i, col = lane % 16;
    float sum = 0.0f;
    for (unsigned k = 0; k < 16; k++)
      sum += ember_mfma_frag[base + row + 16 * (k / 4)][k % 4] * ember_mfma_frag[base + col + 16 * (k / 4)][4 + k % 4];
    d[i] = sum;
  }
  ember_rendezvous();
}
"""

AMD_SHIM = ShimDialect("AMD", "HIPRenderer", 'extern "C" __global__ void EMBER_LAUNCH_BOUNDS ', SHIM_HEADER,
                       "ember_workgroup = {bx, by, bz}; ember_workitem = {tx, ty, tz};",
                       sync_markers=("__shared__", "__builtin_amdgcn_s_barrier", "__builtin_amdgcn_ds_bpermute",
                                     "__ember_wmma_"))
"""HIP-style C on the host: the amdgcn workgroup/workitem id builtins read the shim's thread-local globals; the
barrier is the shim's block sync and ds_bpermute its register exchange (lane `addr / 4` of the caller's wave); the
WMMA helper is emulated across the wave's host threads. The
launcher's parameter block is the kernarg segment (`signature_layout`, the layout `renderer.kernarg_layout` computes
from the uops)."""

def kernel_signature(src: str) -> tuple[str, list[str]]:
  """The name and the parameter types of the (single) kernel in HIPRenderer output."""
  return AMD_SHIM.signature(src)

def shim_launcher(src: str) -> str:
  """C++ that runs the kernel over a grid: `ember_launch(kernargs, grid xyz, workgroup xyz)`."""
  return AMD_SHIM.launcher(src)

class AMDShimCompiler(HostShimCompiler):
  """HIP-style C (HIPRenderer output) -> a host shared object through the shim header and g++/clang++ (MOCK+AMD)."""
  def __init__(self, cxx: str | None = None) -> None: super().__init__(AMD_SHIM, cxx)

def hip_compiler(renderer: Renderer, interface: str) -> Compiler:
  """The compiler for HIPRenderer output: the host shim on MOCK+AMD, a HIP-capable clang otherwise."""
  return AMDShimCompiler() if interface.startswith("MOCK") else HIPCompiler(renderer.arch)
