"""MOCK+AMD end to end: Tensor ops through the PM4/SDMA rings, signals and the HCQ graph; DEV=AMD fails with the
reason; DEV=NULL::gfx1100 compiles AMD code objects without running them."""
from __future__ import annotations
import ctypes
import os
import subprocess
import numpy as np
import pytest
from ember.testing.hostshim import check_graph_replay, check_tensor_ops, run_python, selected_device

ENV = {"EMBER_PLUGINS": "amd=ember_amd.plugin", "EMBER_STRICT_BACKENDS": "1"}

@pytest.fixture(scope="module")
def mock_amd():
  with selected_device("MOCK+AMD", "AMD") as dev: yield dev  # selects like DEV=MOCK+AMD

def test_tensor_ops_match_numpy(mock_amd) -> None:
  check_tensor_ops("AMD")
  assert mock_amd.gpu.executed["compute"] > 0 and mock_amd.gpu.executed["sdma"] > 0

def test_pm4_release_wait_and_barrier(mock_amd) -> None:
  from ember_amd.queue import AMDComputeQueue, DATA_SEL_32
  dev = mock_amd
  word, gate = dev.timer_signals
  word.value = 0xaaaaaaaa_bbbbbbbb
  q = AMDComputeQueue()
  q._release(word, 0x11111111_22222222, DATA_SEL_32)  # data_sel 1: only the low 32 bits are written
  q.submit(dev)
  assert word.value == 0xaaaaaaaa_22222222
  gate.value = 0
  start = dict(dev.gpu.executed)
  value = dev.next_timeline()
  AMDComputeQueue().wait(gate, 5).memory_barrier().signal(dev.timeline_signal, value).submit(dev)
  assert dev.timeline_signal.value == value - 1  # stalled on WAIT_REG_MEM
  gate.value = 5
  dev.synchronize()
  assert dev.timeline_signal.value == value
  assert dev.gpu.executed["compute"] - start["compute"] == 3  # WAIT_REG_MEM, ACQUIRE_MEM, RELEASE_MEM

def test_sdma_copies_fences_and_polls(mock_amd) -> None:
  from ember_amd.queue import AMDCopyQueue, SDMA_MAX_COPY
  dev = mock_amd
  n = SDMA_MAX_COPY + 4096  # two COPY_LINEAR packets
  src, dst = dev.allocator.alloc(n), dev.allocator.alloc(n)
  data = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
  ctypes.memmove(src.va_addr, data.ctypes.data, n)
  start = dev.gpu.executed["sdma"]
  value = dev.next_timeline()
  q = AMDCopyQueue().wait(dev.timeline_signal, value - 1).copy(dst.va_addr, src.va_addr, n - 8)
  q.signal(dev.timeline_signal, (1 << 40) + value).submit(dev)  # a 64-bit value: two FENCE packets
  assert dev.timeline_signal.value == (1 << 40) + value
  got = np.frombuffer(ctypes.string_at(dst.va_addr, n), np.uint8)
  np.testing.assert_array_equal(got[:n - 8], data[:n - 8])
  assert not got[n - 8:].any()
  assert dev.gpu.executed["sdma"] - start == 5  # POLL_REGMEM, 2 COPY_LINEAR, 2 FENCE
  dev.timeline_signal.value = value  # back to the device's own timeline

def test_hcq_graph_replays_with_swapped_buffers(mock_amd) -> None: check_graph_replay(mock_amd, "AMD")

def _run(code: str, dev: str) -> subprocess.CompletedProcess: return run_python(code, {**ENV, "DEV": dev})

@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="this machine has the AMD KFD driver")
def test_amd_without_kfd_fails_with_the_reason() -> None:
  proc = _run("from ember.tensor import Tensor\nTensor([1.0]).numpy()", "AMD")
  assert proc.returncode != 0 and "DeviceError" in proc.stderr and "/dev/kfd not found" in proc.stderr, proc.stderr

def test_null_with_an_amd_arch_compiles_code_objects() -> None:
  code = """
from ember.device import Device
from ember.codegen import get_program
from ember.tensor import Tensor
from ember_amd.elf import parse_code_object
dev = Device["NULL"]
t = Tensor([1.0, 2.0, 3.0], device="NULL") * 3
item = [it for it in t.schedule() if it.kind == "kernel"][0]
spec = get_program(item.ast, dev.renderer)
co = parse_code_object(dev.compiler.compile(spec.src))
print(type(dev.renderer).__name__, co.target, sorted(co.kernels) == [spec.name], t.numpy().tolist())
"""
  for arch in ("gfx1100", "gfx950"):
    proc = _run(code, f"NULL::{arch}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["AMDLLVMRenderer", f"amdgcn-amd-amdhsa--{arch}", "True", "[0.0,", "0.0,", "0.0]"]
  proc = _run("from ember.device import Device\nprint(type(Device['NULL'].renderer).__name__)", "NULL")
  assert proc.stdout.strip() == "PythonRenderer", proc.stderr  # DEV=NULL without an AMD arch keeps its own renderer

def test_llvm_renderer_is_refused_on_mock() -> None:
  proc = _run("from ember.tensor import Tensor\nTensor([1.0]).numpy()", "MOCK+AMD:LLVM")
  assert proc.returncode != 0 and "MOCK+AMD runs HIP-style C" in proc.stderr, proc.stderr

def test_importing_ember_loads_nothing_of_the_backend() -> None:
  code = "import sys, ember\nprint(sorted(m for m in sys.modules if m.startswith('ember_amd')))"
  proc = run_python(code, ENV)
  assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr
