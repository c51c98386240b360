"""ember's NV backend: wiring only. Every heavy module (ctypes over libcuda/libnvrtc) is imported inside the hooks."""
from __future__ import annotations
from typing import Callable
from ember.plugin import (PLUGIN_API_VERSION, BackendInfo, Compiled, CompileError, Compiler, CompilerRegistry,
                          DeviceRegistry, ProbeResult, QueueRegistry, Renderer, RendererRegistry, device_target,
                          hookimpl)

@hookimpl
def ember_backend_info() -> BackendInfo:
  return BackendInfo(name="nv", api_version=PLUGIN_API_VERSION, requires_core=">=0.1,<0.2", priority=20,
                     description="NVIDIA GPUs: CUDA C (NVRTC) and PTX (ptxas); CUDA driver API runtime; MOCK+NV")

def _cuda_device(device: str, renderer: Renderer | None, compiler: Compiler | None) -> Compiled:
  from ember_nv.device import CUDADevice
  return CUDADevice(device, renderer, compiler)

def _nv_device(device: str, renderer: Renderer | None, compiler: Compiler | None) -> Compiled:
  from ember_nv.device import open_nv_device
  return open_nv_device(device, device_target(device).interface, renderer, compiler)

@hookimpl
def ember_register_devices(registry: DeviceRegistry) -> None:
  registry.add("CUDA", _cuda_device, priority=20)
  # NV: the kernel-driver interface (ember_nv.nvdriver, never run on hardware) and the MOCK software GPU. Its priority
  # is below CUDA's, so a machine with both uses the CUDA driver API unless DEV=NV asks for the ioctl interface.
  registry.add("NV", _nv_device, priority=19, interfaces=("NV", "MOCK"))

def _cuda_renderer(arch: str) -> Renderer:
  from ember_nv.renderer import CUDARenderer
  return CUDARenderer(arch)

def _ptx_renderer(arch: str) -> Renderer:
  from ember_nv.renderer import PTXRenderer
  return PTXRenderer(arch)

def _nv_ptx_renderer(arch: str) -> Renderer:
  if device_target("NV").interface.startswith("MOCK"):
    raise CompileError("MOCK+NV runs CUDA C through the host shim; PTX needs the GPU; use DEV=MOCK+NV or "
                       "DEV=MOCK+NV:CUDA")
  return _ptx_renderer(arch)

@hookimpl
def ember_register_renderers(registry: RendererRegistry) -> None:
  for device in ("CUDA", "NV"):
    registry.add(device, "CUDA", _cuda_renderer, priority=10)
  registry.add("CUDA", "PTX", _ptx_renderer, priority=5)
  registry.add("NV", "PTX", _nv_ptx_renderer, priority=5)

def _nvrtc(renderer: Renderer) -> Compiler:
  from ember_nv.compiler import NVRTCCompiler
  return NVRTCCompiler(renderer.arch)

def _nv_cuda_compiler(renderer: Renderer) -> Compiler:
  """NV's CUDA C compiler follows the interface DEV selects: the MOCK builds for the host, so it needs no NVRTC."""
  from ember_nv.compiler import cuda_compiler
  return cuda_compiler(renderer, device_target("NV").interface)

def _ptxas(renderer: Renderer) -> Compiler:
  from ember_nv.compiler import PTXCompiler
  return PTXCompiler(renderer.arch)

@hookimpl
def ember_register_compilers(registry: CompilerRegistry) -> None:
  registry.add("CUDA", "CUDA", _nvrtc)
  registry.add("NV", "CUDA", _nv_cuda_compiler)
  for device in ("CUDA", "NV"): registry.add(device, "PTX", _ptxas)

def _nv_interface(interface: str) -> Callable[[], Callable[..., Compiled]]:
  def make() -> Callable[..., Compiled]:
    from ember_nv.device import nv_interface
    return nv_interface(interface)
  return make

@hookimpl
def ember_register_queues(registry: QueueRegistry) -> None:
  for interface in ("NV", "MOCK"): registry.add("NV", interface, _nv_interface(interface))

@hookimpl
def ember_probe(device: str) -> ProbeResult | None:
  head = device.split(":")[0].upper()
  if head == "CUDA":
    from ember_nv.device import probe_cuda
    return probe_cuda()
  if head == "NV":
    from ember_nv.device import probe_nv
    return probe_nv(device_target(device).interface)
  return None
