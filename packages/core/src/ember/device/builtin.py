"""Core's own backend plugin: the NULL, PYTHON and DISK devices, wired through the same hooks a third-party backend
implements (see `ember.plugin`; being core, it imports them from the device layer, `ember.device.registration`).
Device classes are imported inside the factories, as any backend would.

* PYTHON: the bounds-checked interpreter; renders and "compiles" with the PYTHON renderer/compiler.
* NULL: schedules and compiles but does not run; uses the PYTHON renderer/compiler unless another backend adds its
  own renderer to NULL (``DEV=NULL::gfx1100`` then generates that target's code). Never chosen automatically.
* DISK: memory-mapped files (``Device["DISK:/path/file"]``) for weights and data; no renderer. Never chosen
  automatically.
"""
from __future__ import annotations
from ember.device.base import Compiled, Compiler
from ember.device.registration import (PLUGIN_API_VERSION, BackendInfo, CompilerRegistry, DeviceRegistry,
                                       RendererRegistry, hookimpl)
from ember.renderer import Renderer

@hookimpl
def ember_backend_info() -> BackendInfo:
  from ember import __version__
  # priority -1: on a tie in device priority, an installed backend's device wins over core's
  return BackendInfo(name="core", api_version=PLUGIN_API_VERSION, requires_core=f"=={__version__}", priority=-1,
                     description="core's built-in devices: PYTHON (interpreter), NULL (no-op), DISK (files)")

def _null_device(device: str, renderer: Renderer | None, compiler: Compiler | None) -> Compiled:
  from ember.device.null import NullDevice
  return NullDevice(device, renderer, compiler)

def _python_device(device: str, renderer: Renderer | None, compiler: Compiler | None) -> Compiled:
  from ember.device.python import PythonDevice
  return PythonDevice(device, renderer, compiler)

def _disk_device(device: str, renderer: Renderer | None, compiler: Compiler | None) -> Compiled:
  from ember.device.disk import DiskDevice
  return DiskDevice(device, renderer, compiler)

def _python_renderer(arch: str) -> Renderer:
  from ember.device.python import PythonRenderer
  renderer = PythonRenderer()
  if arch: renderer.arch = arch  # NULL::gfx1100 asks for a target; the interpreter's code does not depend on it
  return renderer

def _python_compiler(renderer: Renderer) -> Compiler:
  from ember.device.python import PythonCompiler
  return PythonCompiler()

@hookimpl
def ember_register_devices(registry: DeviceRegistry) -> None:
  registry.add("PYTHON", _python_device, priority=0)
  registry.add("NULL", _null_device, priority=-1)
  registry.add("DISK", _disk_device, priority=-1)

@hookimpl
def ember_register_renderers(registry: RendererRegistry) -> None:
  registry.add("PYTHON", "PYTHON", _python_renderer)
  registry.add("NULL", "PYTHON", _python_renderer)

@hookimpl
def ember_register_compilers(registry: CompilerRegistry) -> None:
  registry.add("PYTHON", "PYTHON", _python_compiler)
  registry.add("NULL", "PYTHON", _python_compiler)
