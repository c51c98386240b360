"""MOCK+NV end to end: Tensor ops through the NV queues, signals and the HCQ graph; DEV=NV/CUDA fail with the reason."""
from __future__ import annotations
import ctypes
import json
import os
import subprocess
import sys
import pytest
from ember.testing.hostshim import check_graph_replay, check_tensor_ops, run_python, selected_device

ENV = {"EMBER_PLUGINS": "nv=ember_nv.plugin", "EMBER_STRICT_BACKENDS": "1"}

@pytest.fixture(scope="module")
def mock_nv():
  with selected_device("MOCK+NV", "NV") as dev: yield dev  # selects like DEV=MOCK+NV

def test_tensor_ops_match_numpy(mock_nv) -> None:
  check_tensor_ops("NV")

def test_queues_signals_and_copies(mock_nv) -> None:
  from ember_nv.queue import NVComputeQueue, NVCopyQueue
  dev = mock_nv
  src, dst = dev.allocator.alloc(64), dev.allocator.alloc(64)
  ctypes.memmove(src.va_addr, bytes(range(64)), 64)
  ctypes.memset(dst.va_addr, 0, 64)  # an allocation may reuse freed memory: only the copied bytes may change
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
  assert dev.gpu.pending == 0

def test_hcq_graph_replays_with_swapped_buffers(mock_nv) -> None: check_graph_replay(mock_nv, "NV")

def _run(code: str, dev: str) -> subprocess.CompletedProcess: return run_python(code, {**ENV, "DEV": dev})

@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="this machine has the NVIDIA driver")
@pytest.mark.parametrize("dev,reason", [("NV", "no NVIDIA kernel driver"),
                                        ("CUDA", "no NVIDIA driver (libcuda.so not found)")])
def test_real_devices_fail_with_the_reason(dev: str, reason: str) -> None:
  proc = _run("from ember.tensor import Tensor\nTensor([1.0]).numpy()", dev)
  assert proc.returncode != 0 and "DeviceError" in proc.stderr and reason in proc.stderr, proc.stderr

def test_importing_ember_loads_nothing_of_the_backend() -> None:
  code = "import sys, ember\nprint(sorted(m for m in sys.modules if m.startswith('ember_nv')))"
  proc = run_python(code, ENV)
  assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr

# the nvidia-* wheels hidden from this interpreter, as after `pip install ember-backend-nv` without the nvrtc extra
HIDE_NVIDIA_WHEELS = """
import importlib.machinery, sys
class HideNvidia:
  def find_spec(self, name, path=None, target=None):
    return importlib.machinery.ModuleSpec(name, None) if name.split(".")[0] == "nvidia" else None
sys.meta_path.insert(0, HideNvidia())
"""

@pytest.fixture
def no_nvrtc(tmp_path) -> dict[str, str]:
  """The environment of an interpreter (and its children) that cannot load NVRTC."""
  (tmp_path / "sitecustomize.py").write_text(HIDE_NVIDIA_WHEELS)
  env = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
         "CUDA_HOME": "", "CUDA_PATH": ""}
  proc = run_python("from ember_nv.compiler import load_nvrtc\ntry: load_nvrtc()\nexcept Exception as e: "
                    "print(type(e).__name__)", env)
  if proc.stdout.strip() != "CompileError": pytest.skip("libnvrtc.so is on this machine's loader path")
  return env

def test_mock_runs_without_nvrtc(no_nvrtc) -> None:
  code = ("from ember import Device, Tensor\nprint((Tensor([1.0, 2.0]) * 3 + 1).tolist(), "
          "type(Device['NV'].compiler).__name__)")
  proc = run_python(code, {**no_nvrtc, "DEV": "MOCK+NV"})
  assert proc.returncode == 0 and proc.stdout.split() == ["[4.0,", "7.0]", "NVShimCompiler"], proc.stderr
  proc = run_python("from ember import Tensor\nTensor([1.0]).numpy()", {**no_nvrtc, "DEV": "MOCK+NV:PTX"})
  assert proc.returncode != 0 and "CompileError: MOCK+NV runs CUDA C through the host shim; PTX needs the GPU" \
    in proc.stderr, proc.stderr

def _doctor_interfaces(env: dict[str, str]) -> dict[str, dict[str, object]]:
  proc = subprocess.run([sys.executable, "-m", "ember", "devices", "--json"], env={**os.environ, **env},
                        capture_output=True, text=True, timeout=300)
  report = json.loads(proc.stdout)
  nv = next(b for b in report["backends"] if b["name"] == "nv")
  return {i["name"]: i for d in nv["devices"] if d["name"] == "NV" for i in d["interface_probes"]}

def test_doctor_opens_the_mock_as_it_will_be_used(no_nvrtc) -> None:
  mock = _doctor_interfaces(no_nvrtc)["MOCK"]
  assert mock["ok"] and "compiler NVShimCompiler" in str(mock["reason"]), mock
  # without a C++ compiler the MOCK cannot build its kernels: the doctor says so instead of reporting it usable
  mock = _doctor_interfaces({**ENV, "PATH": os.path.dirname(sys.executable)})["MOCK"]
  assert not mock["ok"] and "needs a C++ compiler" in str(mock["reason"]), mock
