"""ember's Metal backend: wiring only. The runtime (ctypes + libobjc) is imported when METAL is probed or opened; on
platforms that are not macOS the probe answers "unavailable" with the reason and loads no native library."""
from __future__ import annotations
from ember.plugin import (PLUGIN_API_VERSION, BackendInfo, Compiled, Compiler, CompilerRegistry, DeviceRegistry,
                          ProbeResult, Renderer, RendererRegistry, hookimpl)

@hookimpl
def ember_backend_info() -> BackendInfo:
  return BackendInfo(name="metal", api_version=PLUGIN_API_VERSION, requires_core=">=0.1,<0.2", priority=20,
                     description="Apple GPUs: MSL compiled by Metal, driven through the Objective-C runtime (macOS)")

def _metal_device(device: str, renderer: Renderer | None, compiler: Compiler | None) -> Compiled:
  from ember_metal.device import MetalDevice
  return MetalDevice(device, renderer, compiler)

@hookimpl
def ember_register_devices(registry: DeviceRegistry) -> None:
  registry.add("METAL", _metal_device, priority=20)

def _msl_renderer(arch: str) -> Renderer:
  from ember_metal.renderer import MetalRenderer
  return MetalRenderer(arch)

@hookimpl
def ember_register_renderers(registry: RendererRegistry) -> None:
  registry.add("METAL", "MSL", _msl_renderer, priority=10)

def _metal_compiler(renderer: Renderer) -> Compiler:
  from ember_metal.compiler import MetalCompiler
  from ember_metal.device import metal_context
  return MetalCompiler(metal_context)

@hookimpl
def ember_register_compilers(registry: CompilerRegistry) -> None:
  registry.add("METAL", "MSL", _metal_compiler)

@hookimpl
def ember_probe(device: str) -> ProbeResult | None:
  if device.split(":")[0].upper() != "METAL": return None
  from ember_metal.device import probe_metal  # loads no native library unless this is macOS
  return probe_metal()
