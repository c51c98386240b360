"""The parts of the Metal runtime that run anywhere: the plugin wiring and probe, what `DEV=METAL` does without
Metal, and the Objective-C message marshalling, checked against a recording stand-in for libobjc (it records what
would be sent; it computes nothing)."""
from __future__ import annotations
import ctypes
import json
import os
import subprocess
import sys
import pytest
from ember.device.registry import BackendRegistry, BackendSource, _Device
from ember.plugin import CompilerRegistry, DeviceError, DeviceRegistry, ProbeResult, RendererRegistry
import ember_metal.plugin as metal_plugin
from ember_metal.device import encode_launch, kernel_var_widths, probe_metal, wait_command_buffer
from ember_metal.objc import NSUInteger, ObjC
from objc_fake import RecordingLibObjC

not_macos = pytest.mark.skipif(sys.platform == "darwin", reason="checks the behaviour on platforms without Metal")
SRC_PATH = os.pathsep.join(p for p in sys.path if p)  # the subprocesses see the same packages as this process

def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": SRC_PATH, **env})

# ** plugin and probe **

def test_plugin_registers_device_renderer_and_compiler() -> None:
  info = metal_plugin.ember_backend_info()
  assert info.name == "metal" and info.priority > 10  # preferred over the CPU where it is usable
  devices, renderers, compilers = DeviceRegistry("metal"), RendererRegistry("metal"), CompilerRegistry("metal")
  metal_plugin.ember_register_devices(devices)
  metal_plugin.ember_register_renderers(renderers)
  metal_plugin.ember_register_compilers(compilers)
  assert [e.name for e in devices.entries] == ["METAL"]
  assert [(e.device, e.name) for e in renderers.entries] == [("METAL", "MSL")]
  assert [(e.device, e.renderer) for e in compilers.entries] == [("METAL", "MSL")]
  assert type(renderers.entries[0].factory("")).__name__ == "MetalRenderer"
  assert metal_plugin.ember_probe("CPU") is None

@not_macos
def test_probe_says_why_metal_is_unavailable() -> None:
  probed = probe_metal()
  assert isinstance(probed, ProbeResult) and not probed.ok
  assert "macOS" in probed.reason and sys.platform in probed.reason
  assert metal_plugin.ember_probe("METAL") == probed

@not_macos
def test_opening_metal_fails_with_the_probe_reason() -> None:
  source = BackendSource("metal", "ember_metal.plugin", "ember-backend-metal", "0.1.0")
  device = _Device(BackendRegistry([source], strict=True))
  with pytest.raises(DeviceError, match="METAL.*unavailable.*macOS"): device["METAL"]

@not_macos
def test_dev_metal_fails_with_the_reason() -> None:
  proc = _python("from ember.tensor import Tensor\nTensor([1.0, 2.0]).realize()",
                 DEV="METAL", EMBER_PLUGINS="metal=ember_metal.plugin")
  assert proc.returncode != 0
  assert "DeviceError" in proc.stderr and "Metal needs macOS" in proc.stderr, proc.stderr[-2000:]

def test_importing_and_registering_loads_nothing() -> None:
  code = """
import json, sys
import ember_metal.plugin as p
from ember.plugin import CompilerRegistry, DeviceRegistry, RendererRegistry
p.ember_register_devices(DeviceRegistry("metal"))
p.ember_register_renderers(RendererRegistry("metal"))
p.ember_register_compilers(CompilerRegistry("metal"))
print(json.dumps(sorted(m for m in sys.modules if m.startswith("ember_metal"))))
"""
  proc = _python(code)
  assert proc.returncode == 0, proc.stderr
  assert json.loads(proc.stdout) == ["ember_metal", "ember_metal.plugin"]

# ** the calling convention read back from the source **

def test_kernel_var_widths_needs_the_kernel() -> None:
  with pytest.raises(DeviceError, match="no kernel named k2"): kernel_var_widths("kernel void k1() {\n}\n", "k2")
  src = "kernel void k(device float* data0 [[buffer(0)]], constant long& a [[buffer(1)]], " \
        "constant int& b [[buffer(2)]], uint3 gid [[threadgroup_position_in_grid]]) {\n}\n"
  assert kernel_var_widths(src, "k") == [8, 4]

# ** Objective-C marshalling, against a recording libobjc (`objc_fake.py`) **

def test_send_derives_the_prototype_and_checks_arguments() -> None:
  lib = RecordingLibObjC()
  objc = ObjC(lib)
  objc.send(0x42, "setBuffer:offset:atIndex:", ctypes.c_void_p(5), NSUInteger(16), NSUInteger(2), restype=None)
  assert lib.calls == [(0x42, "setBuffer:offset:atIndex:", (5, 16, 2))]
  with pytest.raises(TypeError, match="ctypes values"): objc.send(0x42, "objectAtIndex:", 0)
  with pytest.raises(TypeError, match="takes 2 arguments, got 1"): objc.send(0x42, "a:b:", NSUInteger(1))
  with pytest.raises(DeviceError, match="sent to nil"): objc.send(None, "release")
  assert objc.sel("release") == objc.sel("release")  # selectors are registered once

def test_encode_launch_binds_buffers_then_variable_bytes_and_dispatches() -> None:
  lib = RecordingLibObjC({"commandBuffer": 0x77, "retain": 0x77})
  objc = ObjC(lib)
  queue, pipeline = 0x10, 0x20
  command_buffer = encode_launch(objc, queue, pipeline, [(0x30, 0), (0x40, 64)], [(7, 4), (-(1 << 40), 8)],
                                 (3, 1, 1), (256, 1, 1))
  names = [name for _, name, _ in lib.calls]
  assert names == ["commandBuffer", "retain", "computeCommandEncoder", "setComputePipelineState:",
                   "setBuffer:offset:atIndex:", "setBuffer:offset:atIndex:", "setBytes:length:atIndex:",
                   "setBytes:length:atIndex:", "dispatchThreadgroups:threadsPerThreadgroup:", "endEncoding", "commit"]
  calls = {(name, values) for _, name, values in lib.calls}
  assert ("setComputePipelineState:", (pipeline,)) in calls
  assert ("setBuffer:offset:atIndex:", (0x30, 0, 0)) in calls and ("setBuffer:offset:atIndex:", (0x40, 64, 1)) in calls
  assert ("setBytes:length:atIndex:", ((7).to_bytes(4, sys.byteorder, signed=True), 4, 2)) in calls
  assert ("setBytes:length:atIndex:", ((-(1 << 40)).to_bytes(8, sys.byteorder, signed=True), 8, 3)) in calls
  assert ("dispatchThreadgroups:threadsPerThreadgroup:", ((3, 1, 1), (256, 1, 1))) in calls
  receivers = {name: receiver for receiver, name, _ in lib.calls}
  assert receivers["commandBuffer"] == queue
  assert command_buffer == 0x77
  assert receivers["retain"] == receivers["computeCommandEncoder"] == receivers["commit"] == 0x77
  assert lib.pools == ["push", "pop"]  # the encoder and the autoreleased command buffer live in one pool

def test_a_failed_command_buffer_raises_metals_description() -> None:
  lib = RecordingLibObjC({"status": 5, "UTF8String": b"Execution of the command buffer was aborted"})
  objc = ObjC(lib)
  with pytest.raises(DeviceError, match="command buffer failed: Execution of the command buffer was aborted"):
    wait_command_buffer(objc, 0x99)
  assert [name for _, name, _ in lib.calls][-1] == "release"  # released even when it failed
