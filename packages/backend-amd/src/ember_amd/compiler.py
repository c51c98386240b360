"""The AMD compilers: AMDGPU LLVM IR -> code object in process (llvmlite's amdgcn target, then `elf.link_code_object`),
and HIP-style C -> code object with a HIP-capable clang (hipcc / amdclang++ / clang with the amdgcn target) where one
is installed. Neither needs a GPU.
"""
from __future__ import annotations
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from typing import Any
from ember.plugin import CompileError, Compiler
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
