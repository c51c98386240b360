"""MOCK+NV end to end: Tensor ops through the NV queues, signals and the HCQ graph; DEV=NV/CUDA fail with the reason."""
from __future__ import annotations
import ctypes
import os
import subprocess
import sys
import numpy as np
import pytest

ENV = {**os.environ, "EMBER_PLUGINS": "nv=ember_nv.plugin", "EMBER_STRICT_BACKENDS": "1"}

@pytest.fixture(scope="module")
def mock_nv():
  from ember.device import Device
  old = (Device._dev, Device._default)
  Device.DEFAULT = "MOCK+NV"  # selects like DEV=MOCK+NV
  yield Device["NV"]
  Device._dev, Device._default = old

def test_tensor_ops_match_numpy(mock_nv) -> None:
  from ember.tensor import Tensor
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(7, 9)).astype(np.float32), rng.normal(size=(9, 5)).astype(np.float32)
  x, y = Tensor(a, device="NV"), Tensor(b, device="NV")
  np.testing.assert_allclose(((x @ y).relu() + 1).numpy(), np.maximum(a @ b, 0) + 1, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(x.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(x.pad(((1, 2), (0, 3))).numpy(), np.pad(a, ((1, 2), (0, 3))))
  from ember.dtype import dtypes
  np.testing.assert_array_equal((x * 3).cast(dtypes.int32).numpy(), (a * 3).astype(np.int32))

def test_queues_signals_and_copies(mock_nv) -> None:
  from ember_nv.queue import NVComputeQueue, NVCopyQueue
  dev = mock_nv
  src, dst = dev.allocator.alloc(64), dev.allocator.alloc(64)
  ctypes.memmove(src.va_addr, bytes(range(64)), 64)
  start = dev.gpu.executed_methods
  value = dev.next_timeline()
  q = NVCopyQueue().wait(dev.timeline_signal, value - 1).copy(dst.va_addr, src.va_addr, 48)
  q.signal(dev.timeline_signal, value).submit(dev)
  dev.synchronize()
  assert ctypes.string_at(dst.va_addr, 64) == bytes(range(48)) + bytes(16)
  assert dev.timeline_signal.value == value
  assert dev.gpu.executed_methods - start == 5  # acquire, 3 copy methods, release
  # a queue that waits on a value nobody has released stays pending, then runs once the signal is released
  gate = dev.timer_signals[0]
  gate.value = 0
  NVComputeQueue().wait(gate, 7).signal(dev.timeline_signal, value + 100).submit(dev)
  assert dev.timeline_signal.value == value
  gate.value = 7
  dev.timeline_signal.wait(value + 100)
  dev.timeline_signal.value = value  # back to the device's own timeline
  dev.gpu.pending.clear()

def test_hcq_graph_replays_with_swapped_buffers(mock_nv) -> None:
  from ember.codegen import get_program
  from ember.device.hcq import HCQGraph
  from ember.tensor import Tensor
  x = Tensor(np.zeros(16, np.float32), device="NV")
  t = (x * 2 + 1)
  item = [it for it in t.schedule() if it.kind == "kernel"][0]
  dev = mock_nv
  spec = get_program(item.ast, dev.renderer)
  prg = dev.runtime(spec.name, dev.compiler.compile_cached(spec.src))
  bufs = [b.ensure_allocated()._buf for b in item.bufs]
  graph = HCQGraph(dev, [(prg, bufs, (), tuple(spec.global_size), tuple(spec.local_size))] * 2)
  for k in range(3):
    new_in = dev.allocator.alloc(64)
    data = np.arange(16, dtype=np.float32) * (k + 1)
    ctypes.memmove(new_in.va_addr, data.tobytes(), 64)
    graph({id(bufs[1]): new_in})
    dev.synchronize()
    out = np.frombuffer(ctypes.string_at(bufs[0].va_addr, 64), np.float32)
    np.testing.assert_array_equal(out, data * 2 + 1)

def _run(code: str, dev: str) -> subprocess.CompletedProcess:
  env = {**ENV, "DEV": dev}
  return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)

@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="this machine has the NVIDIA driver")
@pytest.mark.parametrize("dev,reason", [("NV", "no NVIDIA kernel driver"),
                                        ("CUDA", "no NVIDIA driver (libcuda.so not found)")])
def test_real_devices_fail_with_the_reason(dev: str, reason: str) -> None:
  proc = _run("from ember.tensor import Tensor\nTensor([1.0]).numpy()", dev)
  assert proc.returncode != 0 and "DeviceError" in proc.stderr and reason in proc.stderr, proc.stderr

def test_importing_ember_loads_nothing_of_the_backend() -> None:
  code = "import sys, ember\nprint(sorted(m for m in sys.modules if m.startswith('ember_nv')))"
  proc = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr
