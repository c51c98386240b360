"""ember's Metal backend: wiring only. The runtime (ctypes + libobjc) is imported when METAL is probed or opened; on
platforms that are not macOS the probe answers "unavailable" with the reason and loads no native library."""
from __future__ import annotations
from typing import Any
from ember.plugin import hookimpl, BackendInfo, ProbeResult, PLUGIN_API_VERSION

@hookimpl
def ember_backend_info() -> BackendInfo:
  return BackendInfo(name="metal", api_version=PLUGIN_API_VERSION, requires_core=">=0.1,<0.2", priority=20,
                     description="Apple GPUs: MSL compiled by Metal, driven through the Objective-C runtime (macOS)")

@hookimpl
def ember_register_devices(registry: Any) -> None:
  def metal_device(device: str, renderer: Any, compiler: Any) -> Any:
    from ember_metal.device import MetalDevice
    return MetalDevice(device, renderer, compiler)
  registry.add("METAL", metal_device, priority=20)

@hookimpl
def ember_register_renderers(registry: Any) -> None:
  def msl_renderer(arch: str) -> Any:
    from ember_metal.renderer import MetalRenderer
    return MetalRenderer(arch)
  registry.add("METAL", "MSL", msl_renderer, priority=10)

@hookimpl
def ember_register_compilers(registry: Any) -> None:
  def metal_compiler(renderer: Any) -> Any:
    from ember_metal.device import MetalCompiler
    return MetalCompiler()
  registry.add("METAL", "MSL", metal_compiler)

@hookimpl
def ember_probe(device: str) -> ProbeResult | None:
  if device.split(":")[0].upper() != "METAL": return None
  from ember_metal.device import probe  # loads no native library unless this is macOS
  usable, reason = probe()
  return ProbeResult(ok=usable, reason=reason)
