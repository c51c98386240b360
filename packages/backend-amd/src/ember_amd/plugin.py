"""ember's AMD backend: wiring only. Heavy modules (llvmlite, the queues, the MOCK) are imported inside the hooks."""
from __future__ import annotations
import os
from typing import Callable
from ember.plugin import (PLUGIN_API_VERSION, BackendInfo, Compiled, CompileError, Compiler, CompilerRegistry,
                          DeviceRegistry, ProbeResult, QueueRegistry, Renderer, RendererRegistry, device_target,
                          hookimpl)

@hookimpl
def ember_backend_info() -> BackendInfo:
  return BackendInfo(name="amd", api_version=PLUGIN_API_VERSION, requires_core=">=0.1,<0.2", priority=20,
                     description="AMD GPUs: AMDGPU LLVM IR (llvmlite) and HIP-style C; HSA code objects; MOCK+AMD")

def _amd_device(device: str, renderer: Renderer | None, compiler: Compiler | None) -> Compiled:
  from ember_amd.device import open_amd_device
  return open_amd_device(device, device_target(device).interface, renderer, compiler)

@hookimpl
def ember_register_devices(registry: DeviceRegistry) -> None:
  registry.add("AMD", _amd_device, priority=20, interfaces=("KFD", "MOCK"))

def _gpu_arch(arch: str) -> str:
  """DEV's arch, else (on the KFD interface) the arch of the GPU DEV selects; "" leaves the renderer's default."""
  target = device_target("AMD")
  if arch or target.interface.startswith("MOCK") or not os.path.exists("/dev/kfd"): return arch
  from ember_amd.kfd import default_arch
  return default_arch(target.index)

def _llvm_renderer(arch: str) -> Renderer:
  if device_target("AMD").interface.startswith("MOCK"):
    raise CompileError("MOCK+AMD runs HIP-style C on the host; the LLVM renderer's code objects need the GPU")
  from ember_amd.renderer import AMDLLVMRenderer
  return AMDLLVMRenderer(_gpu_arch(arch))

def _hip_renderer(arch: str) -> Renderer:
  from ember_amd.renderer import HIPRenderer
  return HIPRenderer(_gpu_arch(arch))

def _null_renderer(arch: str) -> Renderer:  # DEV=NULL::gfx1100: only an AMD arch selects it, so DEV=NULL keeps PYTHON
  from ember_amd.renderer import AMDLLVMRenderer, parse_arch
  if not arch.startswith("gfx"):
    raise CompileError(f"the AMD renderer of NULL needs an AMD arch (gfx...), got {arch!r}")
  return AMDLLVMRenderer(parse_arch(arch))

@hookimpl
def ember_register_renderers(registry: RendererRegistry) -> None:
  registry.add("AMD", "LLVM", _llvm_renderer, priority=10)
  registry.add("AMD", "HIP", _hip_renderer, priority=5)
  registry.add("NULL", "AMD", _null_renderer, priority=10)

def _llvm_compiler(renderer: Renderer) -> Compiler:
  from ember_amd.compiler import AMDLLVMCompiler
  return AMDLLVMCompiler(renderer.arch)

def _hip_compiler(renderer: Renderer) -> Compiler:
  from ember_amd.compiler import hip_compiler
  return hip_compiler(renderer, device_target("AMD").interface)

@hookimpl
def ember_register_compilers(registry: CompilerRegistry) -> None:
  registry.add("AMD", "LLVM", _llvm_compiler)
  registry.add("AMD", "HIP", _hip_compiler)
  registry.add("NULL", "AMD", _llvm_compiler)

def _amd_interface(interface: str) -> Callable[[], Callable[..., Compiled]]:
  def make() -> Callable[..., Compiled]:
    from ember_amd.device import amd_interface
    return amd_interface(interface)
  return make

@hookimpl
def ember_register_queues(registry: QueueRegistry) -> None:
  for interface in ("KFD", "MOCK"): registry.add("AMD", interface, _amd_interface(interface))

@hookimpl
def ember_probe(device: str) -> ProbeResult | None:
  if device.split(":")[0].upper() != "AMD": return None
  from ember_amd.device import probe_amd
  return probe_amd(device_target(device).interface)
