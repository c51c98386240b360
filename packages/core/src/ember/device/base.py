"""The runtime interfaces every device implements: Allocator, Compiler, Program, Compiled, and the Buffer users hold.

A backend subclasses these (through `ember.plugin`, which re-exports them):

* `Allocator.alloc(size, options) -> opaque handle`, `_free`, `_copyin(handle, memoryview)`,
  `_copyout(memoryview, handle)`, optionally `_as_buffer(handle) -> memoryview` for zero-copy host access and
  `_offset(handle, size, offset)` for views.
* `Compiler.compile(src) -> bytes`; `compile_cached` adds a content-addressed sqlite disk cache.
* `Program(name, lib)` loads a compiled binary; calling it runs the kernel:
  `prg(*bufs, global_size=(..), local_size=(..), vals=(..), wait=False) -> seconds | None`.
* `Compiled(device, allocator, renderer, compiler, runtime)` ties them together; `Device["CPU"]` returns one.
"""
from __future__ import annotations
import contextlib
import ctypes
import errno
from abc import ABC, abstractmethod
import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Protocol, cast
import ember.profiler as profiler
from ember.dtype import DType, dtypes
from ember.errors import CompileError, DeviceError, OutOfMemoryError
from ember.helpers import LRU, content_hash, diskcache_get, diskcache_put, CACHELEVEL

@dataclass(frozen=True)
class BufferSpec:
  """Allocation options: `host` memory the CPU can map, `nolru` to bypass the free-buffer cache, `external_ptr`."""
  host: bool = False
  nolru: bool = False
  external_ptr: int | None = None
  uncached: bool = False
  cpu_access: bool = False

def _bytes(n: int) -> str:
  """n bytes as a person reads it: 1 KiB = 1024 bytes."""
  if n < 1024: return f"{n} bytes"
  size = n / 1024
  for unit in ("KiB", "MiB", "GiB", "TiB"):
    if size < 1024: return f"{size:.1f} {unit} ({n} bytes)"
    size /= 1024
  return f"{size:.1f} PiB ({n} bytes)"

class Allocator(ABC):
  """Allocates device memory. Subclasses implement `_alloc`, `_free`, `_copyin`, `_copyout`."""
  supports_copy_from_disk: bool = False
  def alloc(self, size: int, options: BufferSpec | None = None) -> Any:
    if not isinstance(size, int) or size < 0:
      raise DeviceError(f"{type(self).__name__}.alloc: size must be a non-negative int, got {size!r}")
    try: return self._alloc(size, options or BufferSpec())
    except OutOfMemoryError: raise
    # mmap's ENOMEM is an OSError; a plain MemoryError names no size; a size past the address space (2^80 bytes) is
    # an OverflowError of ctypes or mmap
    except (MemoryError, OSError, OverflowError) as e:
      if isinstance(e, OSError) and e.errno not in (errno.ENOMEM, errno.EOVERFLOW, errno.EFBIG): raise
      why = f" ({e})" if str(e) else ""
      raise OutOfMemoryError(f"{type(self).__name__}: out of memory allocating {_bytes(size)}{why}; free tensors "
                             "you no longer need, or use smaller shapes or batches") from e
  def free(self, opaque: Any, size: int, options: BufferSpec | None = None) -> None:
    self._free(opaque, options or BufferSpec())
  @abstractmethod
  def _alloc(self, size: int, options: BufferSpec) -> Any: """Allocate `size` bytes; return the device's handle."""
  def _free(self, opaque: Any, options: BufferSpec) -> None:  # noqa: B027  optional: the default frees nothing
    """Release a handle (memory that the GC frees needs nothing)."""
  @abstractmethod
  def _copyin(self, dest: Any, src: memoryview) -> None: """Copy host bytes into the device buffer `dest`."""
  @abstractmethod
  def _copyout(self, dest: memoryview, src: Any) -> None: """Copy the device buffer `src` into host bytes."""
  # optional: _as_buffer(opaque) -> memoryview, _offset(opaque, size, offset) -> opaque

class LRUAllocator(Allocator):
  """Keeps freed buffers by (size, options) and hands them out again: allocation is the slow part on most devices."""
  def __init__(self) -> None:
    self.cache: dict[tuple[int, BufferSpec], list[Any]] = defaultdict(list)
  def alloc(self, size: int, options: BufferSpec | None = None) -> Any:
    options = options or BufferSpec()
    if len(cached := self.cache.get((size, options), [])): return cached.pop()
    try: return super().alloc(size, options)
    except MemoryError:
      self.free_cache()
      return super().alloc(size, options)
  def free_cache(self) -> None:
    for (_, options), opaques in self.cache.items():
      for opaque in opaques: self._free(opaque, options)
      opaques.clear()
  def free(self, opaque: Any, size: int, options: BufferSpec | None = None) -> None:
    options = options or BufferSpec()
    if LRU.value and not options.nolru and options.external_ptr is None: self.cache[(size, options)].append(opaque)
    else: self._free(opaque, options)

class MemoryStats:
  """Bytes held by allocated Buffers (views excluded, an allocator's cache of freed blocks excluded), all devices
  together, and the most held at once since `reset_peak()`: what a step really needs at its peak."""
  used: int = 0
  peak: int = 0
  @staticmethod
  def reset_peak() -> None: MemoryStats.peak = MemoryStats.used
  @staticmethod
  def _add(nbytes: int) -> None:
    MemoryStats.used += nbytes
    if MemoryStats.used > MemoryStats.peak: MemoryStats.peak = MemoryStats.used

class Buffer:
  """A device allocation of `size` elements of `dtype`. Allocated on first use; a view shares its base's memory."""
  _buf: Any  # the allocator's handle; set by allocate()
  def __init__(self, device: str, size: int, dtype: DType, options: BufferSpec | None = None,
               base: Buffer | None = None, offset: int = 0, initial_value: bytes | None = None):
    if dtype.weak:
      raise DeviceError(f"cannot allocate a buffer of weak dtype {dtype!r}; cast to a concrete dtype first")
    self.device, self.size, self.dtype, self.options, self.offset = device, size, dtype, options, offset
    self._base = base
    # writes to the memory (kernel outputs, copies, copy-ins), counted on the base buffer: a copy derived from it (a
    # matmul operand packed once, ember.schedule.pack_is_fresh) is stale once the count moves. `exposed`: a host view
    # of the memory was handed out (as_buffer), through which writes go uncounted
    self.writes, self.exposed = 0, False
    if base is not None and base._base is not None: raise DeviceError("a buffer view must be made from a base buffer")
    if base is not None and offset + self.nbytes > base.nbytes:
      raise DeviceError(f"buffer view [{offset}:{offset + self.nbytes}] is out of range of its base of "
                        f"{base.nbytes} bytes")
    if initial_value is not None:
      self.allocate()
      self.copyin(memoryview(initial_value))
  @property
  def base(self) -> Buffer: return self._base if self._base is not None else self
  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  @property
  def is_allocated(self) -> bool: return hasattr(self, "_buf")
  def ensure_allocated(self) -> Buffer: return self if self.is_allocated else self.allocate()
  @functools.cached_property
  def allocator(self) -> Allocator:
    from ember.device.registry import Device
    return Device[self.device].allocator
  def allocate(self, opaque: Any = None) -> Buffer:
    if self.is_allocated: raise DeviceError("buffer is already allocated")
    if self._base is not None:
      self._base.ensure_allocated()
      offset_fn = getattr(self.allocator, "_offset", None)
      if offset_fn is None: raise DeviceError(f"{type(self.allocator).__name__} does not support buffer views")
      self._buf = offset_fn(self._base._buf, self.nbytes, self.offset)
    else:
      self._buf = opaque if opaque is not None else self._alloc()
      MemoryStats._add(self.nbytes)
    return self
  def _alloc(self) -> Any:
    allocator = self.allocator  # opens the device on first use: not part of the allocation's time
    if not profiler.enabled: return allocator.alloc(self.nbytes, self.options)
    with profiler.span("alloc", f"alloc {self.nbytes} B", self.device, "memory", bytes=self.nbytes):
      return allocator.alloc(self.nbytes, self.options)
  def __del__(self) -> None:
    if not hasattr(self, "_buf") or self._base is not None: return
    MemoryStats.used -= self.nbytes
    with contextlib.suppress(Exception):  # interpreter shutdown may have torn down the allocator already
      self.allocator.free(self._buf, self.nbytes, self.options)
  def __repr__(self) -> str:
    offset = f" offset:{self.offset}" if self._base is not None else ""
    return f"<buf device:{self.device} size:{self.size} dtype:{self.dtype!r}{offset}>"
  def as_buffer(self) -> memoryview | None:
    """A zero-copy host view of the memory, if the allocator offers one."""
    fn = getattr(self.allocator, "_as_buffer", None)
    if fn is None: return None
    self.base.exposed = True
    return fn(self.ensure_allocated()._buf)
  def copyin(self, mv: memoryview) -> Buffer:
    mv = mv.cast("B") if mv.nbytes else mv
    if mv.nbytes != self.nbytes: raise DeviceError(f"copyin of {mv.nbytes} bytes into a buffer of {self.nbytes} bytes")
    self.ensure_allocated()
    self.base.writes += 1
    if mv.nbytes and profiler.enabled:
      with profiler.span("copy", f"copyin {mv.nbytes} B", self.device, "copy", bytes=mv.nbytes):
        self.allocator._copyin(self._buf, mv)
    elif mv.nbytes: self.allocator._copyin(self._buf, mv)
    return self
  def copyout(self, mv: memoryview) -> memoryview:
    mv = mv.cast("B") if mv.nbytes else mv
    if mv.nbytes != self.nbytes: raise DeviceError(f"copyout of a buffer of {self.nbytes} bytes into {mv.nbytes} bytes")
    self.ensure_allocated()
    if mv.nbytes:
      from ember.device.registry import Device
      Device[self.device].synchronize()
      if not profiler.enabled: self.allocator._copyout(mv, self._buf)
      else:
        with profiler.span("copy", f"copyout {mv.nbytes} B", self.device, "copy", bytes=mv.nbytes):
          self.allocator._copyout(mv, self._buf)
    return mv
  def view(self, size: int, dtype: DType, offset: int) -> Buffer:
    return Buffer(self.device, size, dtype, base=self.base, offset=self.offset + offset)
  def numpy(self) -> Any:
    import numpy as np
    from ember.dtype import dtypes as dts
    np_dt = _np_storage_dtype(self.dtype)
    out: Any  # an ndarray; its buffer protocol is not in numpy's stubs
    if self.dtype == dts.void: out = np.empty(0, np.uint8)
    else: out = np.empty(self.nbytes // max(np.dtype(np_dt).itemsize, 1), dtype=np_dt)
    self.copyout(memoryview(out).cast("B"))
    return out

def _np_storage_dtype(dt: DType) -> Any:
  """The numpy dtype that holds a buffer's bytes: the dtype itself, or raw bits for bfloat16/fp8."""
  if dt.fmt is not None: return dt.fmt
  return {1: "B", 2: "H"}[dt.itemsize]

class Compiler(ABC):
  """Turns rendered source into a binary. `cachekey` names the disk-cache table; None disables caching.

  `binary_format` tells a device's runtime how to load the output (e.g. "elf-so", "llvm-ir", "ptx", "cubin").
  """
  binary_format: str = "bytes"
  # `compile` may run on several threads at once (it runs a separate process, say): the engine then compiles a new
  # schedule's kernels side by side while it generates the next ones' code
  parallel_compile: bool = False
  def __init__(self, cachekey: str | None = None):
    self.cachekey = cachekey
  @abstractmethod
  def compile(self, src: str) -> bytes: """Compile rendered source to the bytes this device's runtime loads."""
  def compile_cached(self, src: str) -> bytes:
    key = content_hash(src)
    cached = diskcache_get(self.cachekey, key) if self.cachekey is not None and CACHELEVEL.value >= 1 else None
    if isinstance(cached, bytes): return cached  # its checksum matched: a damaged binary is recompiled, never loaded
    try: lib = self.compile(src)
    except CompileError: raise
    except Exception as e: raise CompileError(f"{type(self).__name__} failed: {e}") from e
    if self.cachekey is not None and CACHELEVEL.value >= 1: diskcache_put(self.cachekey, key, lib)
    return lib
  # `compile_together` builds several kernels into one binary that holds them all (one compiler process for a batch of
  # small kernels instead of one each: starting the compiler and linking cost more than their code)
  batch_compile: bool = False
  # `compile_batch` also takes kernels whose names repeat (each gets its own binary out of the one compile)
  batch_repeated_names: bool = False
  def compile_together(self, srcs: list[str]) -> bytes:
    """One binary defining every kernel of `srcs` (their names distinct); compilers with `batch_compile` define it."""
    raise CompileError(f"{type(self).__name__} compiles one kernel at a time (batch_compile is False)")
  def compile_batch(self, srcs: list[str]) -> list[bytes]:
    """A binary for each kernel of `srcs` out of one compile: here the one `compile_together` builds, shared by all
    (their names distinct); compilers with `batch_repeated_names` build one per kernel whatever the names."""
    return [self.compile_together(srcs)] * len(srcs)
  def compile_batch_cached(self, srcs: list[str]) -> list[bytes]:
    """The binaries of `srcs` through the disk cache: the ones not cached are built by one `compile_batch`, each
    cached under its own source. A batch the compiler rejects is compiled kernel by kernel, so the error names the
    kernel at fault."""
    if len(srcs) == 1 or not self.batch_compile: return [self.compile_cached(src) for src in srcs]
    caching = self.cachekey is not None and CACHELEVEL.value >= 1
    keys = [content_hash(src) for src in srcs]
    libs = [diskcache_get(cast(str, self.cachekey), key) if caching else None for key in keys]
    todo = [i for i, lib in enumerate(libs) if not isinstance(lib, bytes)]
    built: list[bytes] | None = None
    if len(todo) > 1:
      try: built = self.compile_batch([srcs[i] for i in todo])
      except CompileError: built = None
    for j, i in enumerate(todo):
      libs[i] = self.compile_cached(srcs[i]) if built is None else built[j]
      if built is not None and caching: diskcache_put(cast(str, self.cachekey), keys[i], built[j])
    return cast(list[bytes], libs)
  def disassemble(self, lib: bytes) -> str: return f"<{len(lib)} bytes; {type(self).__name__} has no disassembler>"

class Program(Protocol):
  """A loaded kernel. `vals` are the values of the kernel's symbolic variables, in the order of its DEFINE_VARs."""
  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None: ...

class Compiled:
  """A device: its allocator, the renderer and compiler selected for it, and the runtime that loads binaries."""
  def __init__(self, device: str, allocator: Allocator, renderer: Any, compiler: Compiler | None,
               runtime: Callable[[str, bytes], Program], graph: Any = None):
    self.device, self.allocator, self.renderer, self.compiler = device, allocator, renderer, compiler
    self.runtime, self.graph = runtime, graph
  holds_data: bool = True  # False for devices that keep no memory contents (NULL)
  def synchronize(self) -> None:
    """Wait until every queued command on this device has finished (synchronous devices have nothing to wait for)."""
  def finalize(self) -> None:
    """Called at interpreter exit: release device resources."""
  def launch_timestamps_ns(self) -> tuple[int, int] | None:
    """The device timer (ns) at the start and the end of the last kernel launched with `wait=True`, for devices that
    time kernels with their own clock (the profiler then uses these over host times); None: the device has none."""
    return None
  def timer_ns(self) -> int:
    """The device timer now in ns, where `launch_timestamps_ns` is not None: the profiler aligns it with the host."""
    raise DeviceError(f"{self.device} has no device timer; its kernels are timed on the host")
  def __repr__(self) -> str: return f"<{type(self).__name__} {self.device} renderer={type(self.renderer).__name__}>"

def from_mv(mv: memoryview, to_type: Any = ctypes.c_char) -> Any:
  """A ctypes array over a memoryview's memory (no copy)."""
  return ctypes.cast(ctypes.addressof(to_type.from_buffer(mv)), ctypes.POINTER(to_type * len(mv))).contents

def mv_address(mv: memoryview) -> int: return ctypes.addressof(ctypes.c_char.from_buffer(mv))

__all__ = ["BufferSpec", "Allocator", "LRUAllocator", "MemoryStats", "Buffer", "Compiler", "Program", "Compiled",
           "from_mv", "mv_address", "dtypes"]
