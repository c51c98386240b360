"""ember's NV backend: wiring only. Every heavy module (ctypes over libcuda/libnvrtc) is imported inside the hooks."""
from __future__ import annotations
from typing import Any
from ember.plugin import hookimpl, BackendInfo, ProbeResult, PLUGIN_API_VERSION, device_target

@hookimpl
def ember_backend_info() -> BackendInfo:
  return BackendInfo(name="nv", api_version=PLUGIN_API_VERSION, requires_core=">=0.1,<0.2", priority=20,
                     description="NVIDIA GPUs: CUDA C (NVRTC) and PTX (ptxas); CUDA driver API runtime; MOCK+NV")

def _cuda_device(device: str, renderer: Any, compiler: Any) -> Any:
  from ember_nv.device import CUDADevice
  return CUDADevice(device, renderer, compiler)

def _nv_device(device: str, renderer: Any, compiler: Any) -> Any:
  from ember_nv.queue import open_nv_device
  return open_nv_device(device, device_target(device).interface, renderer, compiler)

@hookimpl
def ember_register_devices(registry: Any) -> None:
  registry.add("CUDA", _cuda_device, priority=20)
  # NV: the kernel-driver interface (ember_nv.nvdriver, never run on hardware) and the MOCK software GPU. Its priority
  # is below CUDA's, so a machine with both uses the CUDA driver API unless DEV=NV asks for the ioctl interface.
  registry.add("NV", _nv_device, priority=19, interfaces=("NV", "MOCK"))

@hookimpl
def ember_register_renderers(registry: Any) -> None:
  def cuda_renderer(arch: str) -> Any:
    from ember_nv.renderer import CUDARenderer
    return CUDARenderer(arch)
  def ptx_renderer(arch: str) -> Any:
    from ember_nv.renderer import PTXRenderer
    return PTXRenderer(arch)
  for device in ("CUDA", "NV"):
    registry.add(device, "CUDA", cuda_renderer, priority=10)
    registry.add(device, "PTX", ptx_renderer, priority=5)

@hookimpl
def ember_register_compilers(registry: Any) -> None:
  def nvrtc(renderer: Any) -> Any:
    from ember_nv.compiler import NVRTCCompiler
    return NVRTCCompiler(renderer.arch)
  def ptxas(renderer: Any) -> Any:
    from ember_nv.compiler import PTXCompiler
    return PTXCompiler(renderer.arch)
  for device in ("CUDA", "NV"):
    registry.add(device, "CUDA", nvrtc)
    registry.add(device, "PTX", ptxas)

@hookimpl
def ember_register_queues(registry: Any) -> None:
  def nv_interface(interface: str) -> Any:
    from ember_nv.queue import nv_interface as make
    return make(interface)
  registry.add("NV", "NV", lambda: nv_interface("NV"))
  registry.add("NV", "MOCK", lambda: nv_interface("MOCK"))

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
