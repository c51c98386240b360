"""The DISK device: tensors backed by a memory-mapped file."""
from __future__ import annotations
import os
import stat
from pathlib import Path
import numpy as np
import pytest
from ember.device.disk import DiskAllocator, DiskDevice, disk_path
from ember.errors import DeviceError

def host(arr: np.ndarray) -> memoryview:
  """The bytes of a contiguous numpy array, as the runtimes take them (no copy)."""
  return arr.data.cast("B")

def test_device_string_gives_the_path(tmp_path: Path) -> None:
  assert disk_path(f"disk:{tmp_path}/w.bin") == f"{tmp_path}/w.bin"
  assert disk_path("DISK:/a:b") == "/a:b"  # only the first colon separates the device name
  for bad in ("disk:", "disk", "CPU:/x"):
    with pytest.raises(DeviceError, match="disk:/path/to/file"): disk_path(bad)

def test_round_trip_through_a_temp_file(tmp_path: Path) -> None:
  path = tmp_path / "data.bin"
  dev = DiskDevice(f"disk:{path}")
  assert dev.renderer is None and dev.compiler is None
  data = np.random.default_rng(0).normal(size=64).astype(np.float32)
  handle = dev.allocator.alloc(data.nbytes)
  assert path.stat().st_size == data.nbytes  # the file was created at the buffer's size
  dev.allocator._copyin(handle, host(data))
  dev.allocator.free(handle, data.nbytes)  # flushes the mapping
  np.testing.assert_array_equal(np.fromfile(path, np.float32), data)  # the bytes are in the file
  # a fresh device on the same file maps the same bytes back
  again = DiskDevice(f"disk:{path}").allocator
  handle = again.alloc(data.nbytes)
  out = np.empty_like(data)
  again._copyout(host(out), handle)
  np.testing.assert_array_equal(out, data)
  np.testing.assert_array_equal(np.frombuffer(again._as_buffer(handle), np.float32), data)  # zero-copy view

def test_views_read_regions_of_the_file(tmp_path: Path) -> None:
  path = tmp_path / "weights.bin"
  header, weights = np.arange(4, dtype=np.int64), np.arange(10, dtype=np.float32) * 0.5
  path.write_bytes(header.tobytes() + weights.tobytes() + b"tail")
  alloc = DiskAllocator(str(path))
  base = alloc.alloc(os.path.getsize(path))
  view = alloc._offset(base, weights.nbytes, header.nbytes)
  assert view.offset == header.nbytes and view.size == weights.nbytes
  out = np.empty_like(weights)
  alloc._copyout(host(out), view)
  np.testing.assert_array_equal(out, weights)
  alloc._copyin(alloc._offset(base, 8, 0), host(np.array([99], np.int64)))  # writes go to the file
  alloc.free(base, os.path.getsize(path))
  assert np.fromfile(path, np.int64, count=1)[0] == 99

def test_existing_larger_file_is_not_truncated(tmp_path: Path) -> None:
  path = tmp_path / "big.bin"
  path.write_bytes(bytes(range(100)))
  handle = DiskAllocator(str(path)).alloc(10)
  assert bytes(handle.mv) == bytes(range(10)) and path.stat().st_size == 100

def test_extends_a_short_file_with_zeros(tmp_path: Path) -> None:
  path = tmp_path / "short.bin"
  path.write_bytes(b"\x01\x02")
  handle = DiskAllocator(str(path)).alloc(6)
  assert bytes(handle.mv) == b"\x01\x02\x00\x00\x00\x00" and path.stat().st_size == 6

def test_read_only_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  path = tmp_path / "ro.bin"
  path.write_bytes(bytes(16))
  path.chmod(stat.S_IRUSR)
  if os.access(path, os.W_OK):  # root may write anything: make the allocator see the file as read-only anyway
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)
  alloc = DiskAllocator(str(path))
  handle = alloc.alloc(16)
  with pytest.raises(DeviceError, match="read-only"): alloc._copyin(handle, memoryview(bytes(16)))
  with pytest.raises(DeviceError, match="does not fit"): alloc.alloc(32)

def test_missing_directory_is_a_device_error(tmp_path: Path) -> None:
  with pytest.raises(DeviceError, match="cannot open"): DiskAllocator(str(tmp_path / "nope" / "x.bin")).alloc(4)

def test_zero_sized_buffer(tmp_path: Path) -> None:
  handle = DiskAllocator(str(tmp_path / "empty.bin")).alloc(0)
  assert handle.size == 0 and handle.mv.nbytes == 0

def test_disk_cannot_run_kernels(tmp_path: Path) -> None:
  dev = DiskDevice(f"disk:{tmp_path}/k.bin")
  with pytest.raises(DeviceError, match="cannot run kernels"): dev.runtime("E_4", b"")
  with pytest.raises(DeviceError, match="takes no renderer"):
    from ember.device.python import PythonRenderer
    DiskDevice(f"disk:{tmp_path}/k.bin", PythonRenderer())
