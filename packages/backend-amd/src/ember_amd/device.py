"""The AMD device: `probe_amd` (what `ember_probe` answers) and the choice of interface for the HCQ device
(`open_amd_device`): MOCK (`mock.AMDMockDevice`, the software GPU executing the PM4/SDMA rings) or KFD
(`kfd.AMDKFDDevice`: the amdgpu kernel driver's /dev/kfd and render node). `kfd.py` is imported only when /dev/kfd
exists or a KFD device is opened; nothing here runs at `import ember`.
"""
from __future__ import annotations
import os
from typing import Callable
from ember.plugin import CompileError, Compiler, DeviceError, HCQCompiled, ProbeResult, Renderer
from ember_amd.mock import AMDMockDevice
from ember_amd.renderer import HIPRenderer

KFD_PATH = "/dev/kfd"

def probe_amd(interface: str) -> ProbeResult:
  """MOCK needs nothing; the KFD interface needs the driver node, access to it and a supported GPU in its topology."""
  if interface.startswith("MOCK"): return ProbeResult(True, "MOCK+AMD: software GPU executing the PM4/SDMA rings")
  if not os.path.exists(KFD_PATH):
    return ProbeResult(False, f"no AMD KFD driver ({KFD_PATH} not found: no AMD GPU, or the amdgpu kernel module is "
                              "not loaded); use DEV=MOCK+AMD to run the AMD queues without one, or DEV=NULL::gfx1100 "
                              "to compile AMD code")
  from ember_amd.kfd import probe_kfd
  return probe_kfd()

def amd_interface(interface: str) -> Callable[..., HCQCompiled]:
  """The device class that drives AMD through `interface`: MOCK (`AMDMockDevice`) or KFD (`kfd.AMDKFDDevice`)."""
  if interface == "MOCK": return AMDMockDevice
  if interface == "KFD":
    from ember_amd.kfd import AMDKFDDevice
    return AMDKFDDevice
  raise DeviceError(f"AMD has no interface {interface!r}; use DEV=AMD (KFD, the amdgpu driver) or DEV=MOCK+AMD")

def open_amd_device(device: str, interface: str, renderer: Renderer | None, compiler: Compiler | None) -> HCQCompiled:
  """MOCK+AMD runs the HIP-style C through the host shim; KFD loads the code objects of the selected compiler."""
  if interface.startswith("MOCK"):
    if not isinstance(renderer, HIPRenderer):
      raise CompileError(f"MOCK+AMD runs HIP-style C through the host shim; {type(renderer).__name__} output cannot "
                         "run on it; use DEV=MOCK+AMD or DEV=MOCK+AMD:HIP")
    return AMDMockDevice(device, renderer)
  if renderer is None: raise CompileError("DEV=AMD needs a renderer (AMD:LLVM or AMD:HIP)")
  from ember_amd.kfd import AMDKFDDevice
  return AMDKFDDevice(device, renderer, compiler)
