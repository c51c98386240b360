"""The AMD device: `probe_amd` (what `ember_probe` answers), `AMDDevice`, the HCQ device over the PM4/SDMA queues driven
by the MOCK interface (`MockAMDGPU`), and the choice between it and the KFD interface (`kfd.AMDKFDDevice`: the amdgpu
kernel driver's /dev/kfd and render node). `kfd.py` is imported only when /dev/kfd exists or a KFD device is opened;
nothing here runs at `import ember`.
"""
from __future__ import annotations
import ctypes
import os
from ember.plugin import (BufferSpec, CompileError, Compiled, Compiler, DeviceError, HCQAllocator, HCQBuffer,
                          HCQCompiled, HCQProgram, ProbeResult, Renderer, shim_arg_layout)
from ember_amd.mock import HostShimCompiler, MockAMDGPU
from ember_amd.queue import AMDComputeQueue, AMDCopyQueue

KFD_PATH = "/dev/kfd"

def probe_amd(interface: str) -> ProbeResult:
  """MOCK needs nothing; the KFD interface needs the driver node, access to it and a supported GPU in its topology."""
  if interface.startswith("MOCK"): return ProbeResult(True, "MOCK+AMD: software GPU executing the PM4/SDMA rings")
  if not os.path.exists(KFD_PATH):
    return ProbeResult(False, f"no AMD KFD driver ({KFD_PATH} not found: no AMD GPU, or the amdgpu kernel module is "
                              "not loaded); use DEV=MOCK+AMD to run the AMD queues without one, or DEV=NULL::gfx1100 "
                              "to compile AMD code")
  from ember_amd.kfd import probe_kfd
  return ProbeResult(*probe_kfd())

def _aligned(size: int, align: int) -> HCQBuffer:
  mem = (ctypes.c_uint8 * (size + align))()
  addr = -(-ctypes.addressof(mem) // align) * align
  return HCQBuffer(addr, size, mem)

class AMDAllocator(HCQAllocator):
  """Device memory: on the MOCK GPU, host memory whose address is the GPU virtual address (256-byte aligned)."""
  def _alloc(self, size: int, options: BufferSpec) -> HCQBuffer: return _aligned(max(size, 1), 256)

class AMDProgram(HCQProgram):
  """A kernel binary uploaded to 256-byte aligned device memory (COMPUTE_PGM_LO holds its address >> 8)."""
  def __init__(self, device: AMDDevice, name: str, lib: bytes) -> None:
    self.code = _aligned(len(lib), 256)
    ctypes.memmove(self.code.va_addr, lib, len(lib))
    self.code_addr, self.rsrc1, self.rsrc2 = self.code.va_addr, 0, 0
    super().__init__(device, name, *device.arg_layout(name, lib))

class AMDDevice(HCQCompiled):
  """DEV=MOCK+AMD: the AMD queues, allocator, programs and graph, executed by `MockAMDGPU`. Kernels are the HIP-style C
  of `HIPRenderer` built for the host through the shim (`HostShimCompiler`); no ROCm is needed."""
  def __init__(self, device: str, renderer: Renderer) -> None:
    self.gpu = MockAMDGPU()
    signals = _aligned(64, 64)
    self._signal_keep = signals
    super().__init__(device, AMDAllocator(self), renderer, HostShimCompiler(),
                     lambda name, lib: AMDProgram(self, name, lib), AMDComputeQueue, AMDCopyQueue, signals)
  def ring_doorbell(self, ring: str, words: list[int]) -> None:
    """Write a queue's packets into the engine's ring and ring its doorbell with the new write pointer."""
    self.gpu.doorbell(ring, self.gpu.rings[ring].write(words))
  def _progress(self) -> None: self.gpu.run_pending()
  def arg_layout(self, name: str, lib: bytes) -> tuple[list[tuple[int, int]], int]:
    """The parameter block of a host-shim kernel, from the source its compiler remembers."""
    return shim_arg_layout(self.compiler, name, lib)

def amd_interface(interface: str) -> type[Compiled]:
  """The device class that drives AMD through `interface`: MOCK (`AMDDevice`) or KFD (`kfd.AMDKFDDevice`)."""
  if interface == "MOCK": return AMDDevice
  if interface == "KFD":
    from ember_amd.kfd import AMDKFDDevice
    return AMDKFDDevice
  raise DeviceError(f"AMD has no interface {interface!r}; use DEV=AMD (KFD, the amdgpu driver) or DEV=MOCK+AMD")

def open_amd_device(device: str, interface: str, renderer: Renderer | None, compiler: Compiler | None) -> Compiled:
  """MOCK+AMD runs the HIP-style C through the host shim; KFD loads the code objects of the selected compiler."""
  if interface.startswith("MOCK"):
    from ember_amd.renderer import HIPRenderer
    if not isinstance(renderer, HIPRenderer):
      raise CompileError(f"MOCK+AMD runs HIP-style C through the host shim; {type(renderer).__name__} output cannot "
                         "run on it; use DEV=MOCK+AMD or DEV=MOCK+AMD:HIP")
    return AMDDevice(device, renderer)
  if renderer is None: raise CompileError("DEV=AMD needs a renderer (AMD:LLVM or AMD:HIP)")
  from ember_amd.kfd import AMDKFDDevice
  return AMDKFDDevice(device, renderer, compiler)

def hip_compiler(renderer: Renderer, interface: str) -> Compiler:
  """The compiler for HIPRenderer output: the host shim on MOCK+AMD, a HIP-capable clang otherwise."""
  if interface.startswith("MOCK"): return HostShimCompiler()
  from ember_amd.compiler import HIPCompiler
  return HIPCompiler(renderer.arch)
