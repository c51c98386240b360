"""The AMD device: `probe_amd` (what `ember_probe` answers), and `AMDDevice`, the HCQ device over the PM4/SDMA queues,
driven here by the MOCK interface (`MockAMDGPU`).

The KFD interface (the amdgpu kernel driver's /dev/kfd and /dev/dri/renderD* nodes: memory through
AMDKFD_IOC_ALLOC_MEMORY_OF_GPU / MAP_MEMORY_TO_GPU, rings through AMDKFD_IOC_CREATE_QUEUE, doorbells mapped from the
render node) is not written yet; `DEV=AMD` says so, or says that the driver is absent. Nothing here runs at
`import ember`.
"""
from __future__ import annotations
import ctypes
import os
from ember.plugin import (BufferSpec, CompileError, Compiler, DeviceError, HCQAllocator, HCQBuffer, HCQCompiled,
                          HCQProgram, ProbeResult, Renderer, shim_arg_layout)
from ember_amd.mock import HostShimCompiler, MockAMDGPU
from ember_amd.queue import AMDComputeQueue, AMDCopyQueue

KFD_PATH = "/dev/kfd"

def probe_amd(interface: str) -> ProbeResult:
  """MOCK needs nothing; the hardware interface needs the KFD driver node, and then the KFD runtime of ember."""
  if interface.startswith("MOCK"): return ProbeResult(True, "MOCK+AMD: software GPU executing the PM4/SDMA rings")
  if not os.path.exists(KFD_PATH):
    return ProbeResult(False, f"no AMD KFD driver ({KFD_PATH} not found: no AMD GPU, or the amdgpu kernel module is "
                              "not loaded); use DEV=MOCK+AMD to run the AMD queues without one, or DEV=NULL::gfx1100 "
                              "to compile AMD code")
  return ProbeResult(False, f"{KFD_PATH} exists, but ember's KFD interface (ioctl memory and queue setup) is not "
                            "implemented yet; use DEV=MOCK+AMD, or DEV=NULL::gfx1100 to compile AMD code")

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

def amd_interface(interface: str) -> type[AMDDevice]:
  """The device class that drives AMD through `interface`; only MOCK exists so far."""
  if interface == "MOCK": return AMDDevice
  raise DeviceError(f"the AMD interface {interface!r} is not implemented (the KFD ioctl interface is not written "
                    "yet); use DEV=MOCK+AMD, or DEV=NULL::gfx1100 to compile AMD code")

def open_amd_device(device: str, interface: str, renderer: Renderer | None, compiler: Compiler | None) -> AMDDevice:
  from ember_amd.renderer import HIPRenderer
  if not isinstance(renderer, HIPRenderer):
    raise CompileError(f"MOCK+AMD runs HIP-style C through the host shim; {type(renderer).__name__} output cannot run "
                       "on it; use DEV=MOCK+AMD or DEV=MOCK+AMD:HIP")
  return amd_interface(interface or "KFD")(device, renderer)

def hip_compiler(renderer: Renderer, interface: str) -> Compiler:
  """The compiler for HIPRenderer output: the host shim on MOCK+AMD, a HIP-capable clang otherwise."""
  if interface.startswith("MOCK"): return HostShimCompiler()
  from ember_amd.compiler import HIPCompiler
  return HIPCompiler(renderer.arch)
