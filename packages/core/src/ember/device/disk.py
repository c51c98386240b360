"""The DISK device: `disk:/path/to/file` memory-maps a file so tensors read from and write to it lazily.

A base buffer maps the first `nbytes` of the file (creating or extending the file when it is writable); views
(`Buffer.view`) address regions further in, which is how weights are read out of one large file. DISK only moves
bytes: it has no renderer or compiler and refuses to run kernels.
"""
from __future__ import annotations
import mmap
import os
import stat
import weakref
from dataclasses import dataclass
from typing import NoReturn
from ember.device.base import Allocator, Buffer, BufferSpec, Compiled, Compiler
from ember.dtype import dtypes
from ember.errors import DeviceError
from ember.renderer import Renderer

@dataclass(frozen=True, eq=False)
class DiskMapping:
  """A region of a mapped file: `offset` bytes into it, `size` bytes long, `mv` the mapped memory itself."""
  path: str
  offset: int
  size: int
  mv: memoryview
  mapping: mmap.mmap | None

def disk_path(device: str) -> str:
  """The file of a `disk:<path>` device string."""
  prefix, sep, path = device.partition(":")
  if prefix.upper() != "DISK" or not sep or not path:
    raise DeviceError(f"DISK device strings look like 'disk:/path/to/file', got {device!r}")
  return os.path.expanduser(path)

class DiskAllocator(Allocator):
  """Maps regions of one file. Memory is released when the last view of a mapping is gone; `free` flushes writes."""
  def __init__(self, path: str):
    self.path = path
  def _alloc(self, size: int, options: BufferSpec) -> DiskMapping:
    if size == 0: return DiskMapping(self.path, 0, 0, memoryview(bytearray(0)), None)  # mmap cannot map 0 bytes
    writable = not os.path.exists(self.path) or os.access(self.path, os.W_OK)
    try: fd = os.open(self.path, os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY, 0o644)
    except OSError as e:
      raise DeviceError(f"DISK cannot open {self.path!r}: {e.strerror}; check the path and its permissions") from e
    try:
      file_size = os.fstat(fd).st_size
      if file_size < size:
        if not writable:
          raise DeviceError(f"DISK file {self.path!r} has {file_size} bytes, a buffer of {size} bytes does not fit, "
                            "and the file is read-only; use a smaller buffer or a writable file")
        os.ftruncate(fd, size)
      mapping = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    except OSError as e:
      raise DeviceError(f"DISK cannot map {size} bytes of {self.path!r}: {e.strerror}") from e
    finally:
      os.close(fd)  # the mapping keeps its own reference to the file
    return DiskMapping(self.path, 0, size, memoryview(mapping), mapping)
  def _free(self, opaque: DiskMapping, options: BufferSpec) -> None:
    if opaque.mapping is not None and not opaque.mv.readonly: opaque.mapping.flush()
  def _as_buffer(self, src: DiskMapping) -> memoryview: return src.mv
  def _offset(self, buf: DiskMapping, size: int, offset: int) -> DiskMapping:
    return DiskMapping(buf.path, buf.offset + offset, size, buf.mv[offset:offset + size], buf.mapping)
  def _copyin(self, dest: DiskMapping, src: memoryview) -> None:
    if dest.mv.readonly: raise DeviceError(f"DISK file {dest.path!r} is read-only; cannot write {src.nbytes} bytes")
    dest.mv[:] = src
  def _copyout(self, dest: memoryview, src: DiskMapping) -> None: dest[:] = src.mv

class DiskDevice(Compiled):
  """A file as a device. It has no renderer or compiler: kernels must run on a compute device after a copy."""
  def __init__(self, device: str, renderer: Renderer | None = None, compiler: Compiler | None = None):
    if renderer is not None or compiler is not None:
      raise DeviceError(f"DISK device {device!r} cannot run kernels, so it takes no renderer or compiler")
    self.path = disk_path(device)
    super().__init__(device, DiskAllocator(self.path), None, None, self._no_kernels)
  def _no_kernels(self, name: str, lib: bytes) -> NoReturn:
    raise DeviceError(f"DISK device {self.device!r} cannot run kernels (asked to load {name!r}); it only maps a file. "
                      "Copy the tensor to a compute device first, e.g. `t.to('CPU')`")

# the whole-file base buffer of each file tensors were made over, while any of them lives: the tensors over one file
# share one mapping. Keyed by the file's identity and size, so a file rewritten since is mapped afresh.
_file_buffers: weakref.WeakValueDictionary[tuple[str, int, int, int], Buffer] = weakref.WeakValueDictionary()

def file_buffer(path: str) -> Buffer:
  """The uint8 base Buffer over all of the file at `path` on its DISK device (mapped when first used); tensors over
  byte ranges of the file are views of it (`Buffer.view`). Raises `DeviceError` when the file cannot be read."""
  path = os.path.abspath(os.path.expanduser(path))
  try: st = os.stat(path)
  except OSError as e: raise DeviceError(f"DISK cannot open {path!r}: {e.strerror}; check the path") from e
  if not stat.S_ISREG(st.st_mode): raise DeviceError(f"DISK maps regular files, and {path!r} is not one")
  key = (path, st.st_ino, st.st_size, st.st_mtime_ns)
  if (buf := _file_buffers.get(key)) is None:
    buf = _file_buffers[key] = Buffer(f"DISK:{path}", st.st_size, dtypes.uint8)
  return buf
