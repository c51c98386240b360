"""Tier 6, multi-device: when ``DEV:1`` opens, copies between ``:0`` and ``:1`` and compute on ``:1``. For devices
whose renderer splits kernels over CPU threads: results on 2 threads equal results on 1 thread, bit for bit."""
from __future__ import annotations
import numpy as np
import pytest

pytestmark = pytest.mark.ember_tier("multidevice")

@pytest.fixture(scope="module")
def second_device(ember_device: str) -> str:
  from ember.errors import DeviceError
  from ember.testing import open_device
  head = ember_device.partition(":")[0]
  other = f"{head}:1" if ember_device == head else head
  try: open_device(other)
  except DeviceError as e: pytest.skip(f"{other} does not open, so there is no second device: {e}")
  return other

def test_copy_between_devices(ember_device, ember_capabilities, second_device):
  from ember.tensor import Tensor
  data = np.arange(100, dtype=np.float32).reshape(10, 10) - 50
  a = Tensor(data, device=ember_device)
  b = a.to(second_device).realize()
  assert b.device == second_device and b.shape == (10, 10)
  back = (b + 1).to(ember_device)
  assert back.device == ember_device
  if not ember_capabilities.holds_data: return
  np.testing.assert_array_equal(b.numpy(), data)
  np.testing.assert_array_equal(back.numpy(), data + 1)

def test_compute_on_the_second_device(ember_device, ember_capabilities, second_device):
  from ember.tensor import Tensor
  if not ember_capabilities.holds_data: pytest.skip(f"{ember_device} holds no data")
  a = np.arange(12, dtype=np.float32).reshape(3, 4)
  out = (Tensor(a, device=second_device) @ Tensor(a.T.copy(), device=second_device)).sum(1)
  np.testing.assert_allclose(out.numpy(), (a @ a.T).sum(1), rtol=1e-6)

def _run_with_threads(item, device: str, threads: int) -> tuple[np.ndarray, int]:
  """Compile `item` under NUM_CPU_THREADS=threads, bypassing the runner cache (its key does not include the thread
  count), and run it: (output, threads launched)."""
  from ember.codegen import get_program
  from ember.device.base import Buffer
  from ember.helpers import Context
  from ember.testing import open_device
  dev = open_device(device)
  assert dev.compiler is not None
  with Context(NUM_CPU_THREADS=threads):
    spec = get_program(item.ast, dev.renderer, device)
  prg = dev.runtime(spec.name, dev.compiler.compile(spec.src))
  out = Buffer(device, item.bufs[0].size, item.bufs[0].dtype).ensure_allocated()
  inputs = [b.ensure_allocated() for b in item.bufs[1:]]
  gsize = tuple(spec.global_size) if spec.global_size else (1, 1, 1)
  prg(out._buf, *(b._buf for b in inputs), global_size=gsize, vals=(), wait=True)
  return out.numpy(), gsize[0]

def test_two_threads_equal_one_thread(ember_device, ember_capabilities):
  from ember.tensor import Tensor
  from ember.testing import kernel_items
  if not ember_capabilities.has_threads: pytest.skip(f"{ember_device}'s renderer does not split kernels over threads")
  if not ember_capabilities.holds_data: pytest.skip(f"{ember_device} holds no data")
  x = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
  t = Tensor(x, device=ember_device)
  cases = {"elementwise": (t * 1.5 + 1, x * np.float32(1.5) + 1),
           "reduce": (((t * 1.5).exp() + 1).sum(1), (np.exp(x * np.float32(1.5)) + 1).sum(1))}
  threaded = []
  for name, (out, ref) in cases.items():
    (item,) = kernel_items(out)
    one, launched_one = _run_with_threads(item, ember_device, 1)
    two, launched_two = _run_with_threads(item, ember_device, 2)
    assert launched_one == 1, f"{name}: NUM_CPU_THREADS=1 launched {launched_one} threads"
    if launched_two == 2: threaded.append(name)
    np.testing.assert_array_equal(one.reshape(ref.shape), two.reshape(ref.shape), err_msg=f"{name}: 1 vs 2 threads")
    np.testing.assert_allclose(one.reshape(ref.shape), ref, rtol=1e-4, err_msg=name)
  assert threaded, "NUM_CPU_THREADS=2 never produced a program launched on 2 threads, so nothing was compared"
