"""ember's CPU backend: wiring only. Heavy modules are imported inside the hooks, when the CPU is first used."""
from __future__ import annotations
from ember.plugin import (PLUGIN_API_VERSION, BackendInfo, Compiled, Compiler, CompilerRegistry, DeviceRegistry,
                          ProbeResult, Renderer, RendererRegistry, hookimpl)

@hookimpl
def ember_backend_info() -> BackendInfo:
  return BackendInfo(name="cpu", api_version=PLUGIN_API_VERSION, requires_core=">=0.1,<0.2", priority=10,
                     description="host CPU: C through clang/gcc or LLVM IR through llvmlite, threads over cores")

@hookimpl
def ember_register_devices(registry: DeviceRegistry) -> None:
  def cpu_device(device: str, renderer: Renderer | None, compiler: Compiler | None) -> Compiled:
    from ember_cpu.device import CPUDevice
    return CPUDevice(device, renderer, compiler)
  registry.add("CPU", cpu_device, priority=10)

@hookimpl
def ember_register_renderers(registry: RendererRegistry) -> None:
  from ember_cpu.compiler import find_c_compiler
  def c_renderer(arch: str) -> Renderer:
    from ember_cpu.renderer import ClangRenderer
    return ClangRenderer(arch)
  def llvm_renderer(arch: str) -> Renderer:
    from ember_cpu.renderer import CPULLVMRenderer
    return CPULLVMRenderer(arch)
  # plain DEV=CPU takes C where a C compiler exists, else LLVM
  registry.add("CPU", "C", c_renderer, priority=10 if find_c_compiler() is not None else 1)
  registry.add("CPU", "LLVM", llvm_renderer, priority=5)

@hookimpl
def ember_register_compilers(registry: CompilerRegistry) -> None:
  def c_compiler(renderer: Renderer) -> Compiler:
    from ember_cpu.compiler import ClangCompiler
    return ClangCompiler(arch=renderer.arch)
  def llvm_compiler(renderer: Renderer) -> Compiler:
    from ember_cpu.compiler import LLVMCompiler
    return LLVMCompiler(renderer.arch)
  registry.add("CPU", "C", c_compiler)
  registry.add("CPU", "LLVM", llvm_compiler)

@hookimpl
def ember_probe(device: str) -> ProbeResult | None:
  if device.split(":")[0].upper() != "CPU": return None
  import importlib.util
  from ember_cpu.compiler import find_c_compiler
  cc, has_llvmlite = find_c_compiler(), importlib.util.find_spec("llvmlite") is not None
  if cc is None and not has_llvmlite:
    return ProbeResult(ok=False, reason="no C compiler (gcc, clang or cc on PATH) and no llvmlite; "
                                        "install clang or gcc, or `pip install llvmlite`")
  return ProbeResult(ok=True, reason=f"C: {cc or 'no compiler'}; LLVM: {'llvmlite' if has_llvmlite else 'missing'}")
