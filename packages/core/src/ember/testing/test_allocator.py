"""Tier 2, allocator round trips: zero-size buffers, bytes in and out, views at offsets, 64 MiB buffers, zero-copy
host access, the LRU cache and copies between this device and the reference device."""
from __future__ import annotations
import numpy as np
import pytest

pytestmark = pytest.mark.ember_tier("allocator")

def _needs_data(caps) -> None:
  if not caps.holds_data: pytest.skip(f"{caps.device} declares that it holds no data (a dry-run device)")

def test_zero_size_buffer(ember_device):
  from ember.device.base import Buffer
  from ember.dtype import dtypes
  buf = Buffer(ember_device, 0, dtypes.float32).allocate()
  assert buf.nbytes == 0 and buf.is_allocated
  buf.copyin(memoryview(b""))
  assert buf.numpy().size == 0

@pytest.mark.parametrize("nbytes", [1, 7, 4096, 4097, 100_003])
def test_bytes_round_trip(ember_device, ember_capabilities, nbytes):
  from ember.device.base import Buffer
  from ember.dtype import dtypes
  _needs_data(ember_capabilities)
  data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
  buf = Buffer(ember_device, nbytes, dtypes.uint8).copyin(data.data)
  out = np.empty(nbytes, np.uint8)
  buf.copyout(out.data)
  np.testing.assert_array_equal(out, data)

def test_every_dtype_round_trips(ember_device, ember_capabilities):
  from ember.device.base import Buffer
  _needs_data(ember_capabilities)
  for dt in ember_capabilities.dtypes:
    raw = np.random.default_rng(dt.itemsize).integers(0, 256, 64 * dt.itemsize, dtype=np.uint8)
    buf = Buffer(ember_device, 64, dt).copyin(raw.data)
    assert buf.numpy().view(np.uint8).tobytes() == raw.tobytes(), f"{dt!r} bytes changed in a round trip"

def test_views_at_offsets(ember_device, ember_capabilities):
  from ember.device.base import Buffer
  from ember.dtype import dtypes
  if not ember_capabilities.supports_views: pytest.skip(f"{ember_device}'s allocator has no _offset (no views)")
  base = Buffer(ember_device, 64, dtypes.int32)
  view = base.view(16, dtypes.int32, 8 * 4)  # elements 8..23
  assert view.base is base and view.nbytes == 64
  view.ensure_allocated()
  if not ember_capabilities.holds_data: return
  data = np.arange(64, dtype=np.int32)
  base.copyin(data.data)
  np.testing.assert_array_equal(view.numpy(), data[8:24])
  view.copyin(np.full(16, -1, np.int32).data)
  expect = data.copy()
  expect[8:24] = -1
  np.testing.assert_array_equal(base.numpy(), expect)
  as_bytes = base.view(8, dtypes.uint8, 3)  # a view at an unaligned byte offset, another dtype
  np.testing.assert_array_equal(as_bytes.numpy(), expect.view(np.uint8)[3:11])

def test_large_buffer_64mib(ember_device, ember_capabilities):
  from ember.device.base import Buffer
  from ember.dtype import dtypes
  n = (64 << 20) // 4
  buf = Buffer(ember_device, n, dtypes.uint32).allocate()
  assert buf.nbytes == 64 << 20
  if not ember_capabilities.holds_data: return
  data = np.arange(n, dtype=np.uint32) * np.uint32(2654435761)
  buf.copyin(data.data)
  out = np.empty(n, np.uint32)
  buf.copyout(out.data)
  assert np.array_equal(out, data)

def test_zero_copy_host_view(ember_device, ember_capabilities):
  from ember.device.base import Buffer
  from ember.dtype import dtypes
  if not ember_capabilities.zero_copy: pytest.skip(f"{ember_device}'s allocator has no _as_buffer (no host mapping)")
  _needs_data(ember_capabilities)
  buf = Buffer(ember_device, 8, dtypes.float32).copyin(np.arange(8, dtype=np.float32).data)
  mv = buf.as_buffer()
  assert mv is not None and mv.nbytes == 32
  np.testing.assert_array_equal(np.frombuffer(mv, dtype=np.float32), np.arange(8, dtype=np.float32))

def test_lru_allocator_reuses_freed_memory(ember_device):
  from ember.device.base import LRUAllocator
  from ember.helpers import LRU
  from ember.testing import open_device
  alloc = open_device(ember_device).allocator
  if not isinstance(alloc, LRUAllocator): pytest.skip(f"{ember_device}'s allocator is not an LRUAllocator")
  if not LRU.value: pytest.skip("LRU=0")
  handle = alloc.alloc(12345)
  alloc.free(handle, 12345)
  assert alloc.alloc(12345) is handle

def test_copies_to_and_from_the_reference_device(ember_device, ember_capabilities):
  from ember.tensor import Tensor
  from ember.testing import REFERENCE_DEVICE
  data = np.arange(37, dtype=np.float32) * 0.5 - 3
  there = Tensor(data, device=REFERENCE_DEVICE).to(ember_device).realize()
  assert there.device == ember_device and there.shape == data.shape
  back = there.to(REFERENCE_DEVICE)
  if not ember_capabilities.holds_data: return
  np.testing.assert_array_equal(back.numpy(), data)
  shifted = (Tensor(data, device=ember_device)[5:20]).to(REFERENCE_DEVICE)  # a copy from an offset
  np.testing.assert_array_equal(shifted.numpy(), data[5:20])
