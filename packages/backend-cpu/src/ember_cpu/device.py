"""The CPU device: host memory, and kernels loaded into this process and run on a shared thread pool."""
from __future__ import annotations
import ctypes
import mmap
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from ember.plugin import BufferSpec, Compiled, Compiler, DeviceError, LRUAllocator, Renderer
from ember_cpu.renderer import ARGFMT_SUFFIX, cpu_threads

ALIGN = 64
_MMAP_MIN = 1 << 20  # from here on, fresh pages from mmap: page aligned and zeroed lazily

class CPUAllocator(LRUAllocator):
  """Host memory, 64-byte aligned. A handle is a ctypes byte array; its address is what kernels receive."""
  def _alloc(self, size: int, options: BufferSpec) -> Any:
    if options.external_ptr is not None: return (ctypes.c_uint8 * size).from_address(options.external_ptr)
    if size >= _MMAP_MIN: return (ctypes.c_uint8 * size).from_buffer(mmap.mmap(-1, size))
    raw = (ctypes.c_uint8 * (size + ALIGN))()
    return (ctypes.c_uint8 * size).from_buffer(raw, -ctypes.addressof(raw) % ALIGN)  # the view keeps `raw` alive
  def _as_buffer(self, opaque: Any) -> memoryview: return memoryview(opaque).cast("B")
  def _offset(self, opaque: Any, size: int, offset: int) -> Any:
    return (ctypes.c_uint8 * size).from_buffer(opaque, offset)
  def _copyin(self, dest: Any, src: memoryview) -> None:
    if src.readonly: memoryview(dest).cast("B")[:src.nbytes] = src.cast("B")  # ctypes cannot take a read-only address
    else: ctypes.memmove(dest, ctypes.addressof(ctypes.c_char.from_buffer(src)), src.nbytes)
  def _copyout(self, dest: memoryview, src: Any) -> None:
    ctypes.memmove(ctypes.addressof(ctypes.c_char.from_buffer(dest)), src, dest.nbytes)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()

def _thread_pool() -> ThreadPoolExecutor:
  global _pool
  with _pool_lock:
    if _pool is None: _pool = ThreadPoolExecutor(max_workers=cpu_threads(), thread_name_prefix="ember_cpu")
    return _pool

_ctypes_of = {"P": ctypes.c_void_p, "i": ctypes.c_int32, "q": ctypes.c_int64}

def _address(buf: Any) -> int: return buf if isinstance(buf, int) else ctypes.addressof(buf)

def load_shared_object(lib: bytes, what: str) -> ctypes.CDLL:
  """A shared object's bytes loaded into this process (`what` names it in the error)."""
  with tempfile.NamedTemporaryFile(prefix="ember_", suffix=".so", delete=False) as f: f.write(lib)
  try: return ctypes.CDLL(f.name)
  except OSError as e: raise DeviceError(f"cannot load the shared object of {what}: {e}") from e
  finally: os.unlink(f.name)  # the mapping stays valid after the file is gone

class _CPUKernel:
  """Runs a loaded kernel: buffers, then vals, then `core_id, num_cores`, on `global_size[0]` threads."""
  name: str
  fxn: Any
  argfmt: str
  def __call__(self, *bufs: Any, global_size: tuple[int, ...] | None = (1, 1, 1),
               local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    if len(self.argfmt) != len(bufs) + len(vals) + 2:
      raise DeviceError(f"kernel {self.name} takes {len(self.argfmt) - 2} buffers and values ({self.argfmt!r}), "
                        f"got {len(bufs)} buffers and {len(vals)} values")
    args = [_address(b) for b in bufs] + list(vals)
    threads = global_size[0] if global_size else 1
    start = time.perf_counter()
    if threads <= 1: self._run_chunk(args, 0, 1)
    else:  # ctypes drops the GIL for the call, so these run in parallel; chunk 0 runs on the calling thread
      pool = _thread_pool()
      futures = [pool.submit(self._run_chunk, args, core_id, threads) for core_id in range(1, threads)]
      self._run_chunk(args, 0, threads)
      for f in futures: f.result()
    return time.perf_counter() - start if wait else None
  def _run_chunk(self, args: list[int], core_id: int, num_cores: int) -> None: self.fxn(*args, core_id, num_cores)

class CPUProgram(_CPUKernel):
  """A kernel compiled to a shared object, loaded into this process with ctypes."""
  def __init__(self, name: str, lib: bytes):
    self.name = name
    self.lib = load_shared_object(lib, f"kernel {name}")
    try:
      self.fxn = getattr(self.lib, name)
      fmt = ctypes.c_char.in_dll(self.lib, name + ARGFMT_SUFFIX)
    except (AttributeError, ValueError) as e:
      raise DeviceError(f"shared object has no kernel {name} with its {name}{ARGFMT_SUFFIX} signature; "
                        "render it with a CPU renderer") from e
    self.argfmt = ctypes.cast(ctypes.addressof(fmt), ctypes.c_char_p).value.decode()  # type: ignore[union-attr]
    self.fxn.argtypes = [_ctypes_of[c] for c in self.argfmt]
    self.fxn.restype = None

_jit_runtime: list[Any] = []  # the engine that holds the JIT runtime's code, alive as long as the process
_jit_runtime_lock = threading.Lock()

def install_jit_runtime() -> None:
  """Compile ember's stand-ins for compiler-rt's helpers (ember.plugin.jit_runtime_ir) once per process and
  make their addresses what every JIT'd kernel's calls of them resolve to."""
  import llvmlite.binding as llvm
  from ember.plugin import JIT_RUNTIME_SYMBOLS, jit_runtime_ir
  from ember_cpu.compiler import new_target_machine
  with _jit_runtime_lock:
    if _jit_runtime: return
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(jit_runtime_ir()), new_target_machine())
    engine.finalize_object()
    for name in JIT_RUNTIME_SYMBOLS: llvm.add_symbol(name, engine.get_function_address(name))
    _jit_runtime.append(engine)

class LLVMProgram(_CPUKernel):
  """A kernel's object code from LLVMCompiler, linked into this process by llvmlite's MCJIT; its argument format is
  the `<name>_argfmt` string the renderer defines next to it."""
  def __init__(self, name: str, lib: bytes):
    import llvmlite.binding as llvm
    from ember_cpu.compiler import new_target_machine
    install_jit_runtime()
    self.name = name
    try: obj = llvm.ObjectFileRef.from_data(lib)
    except RuntimeError as e: raise DeviceError(f"cannot read the object code of kernel {name}: {e}") from e
    self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_target_machine())  # owns machine and code
    self.engine.add_object_file(obj)
    self.engine.finalize_object()
    fn, fmt = self.engine.get_function_address(name), self.engine.get_global_value_address(name + ARGFMT_SUFFIX)
    if not fn or not fmt:
      raise DeviceError(f"object code has no kernel {name} with its {name}{ARGFMT_SUFFIX} signature; "
                        "render it with CPULLVMRenderer")
    self.argfmt = ctypes.string_at(fmt).decode()
    self.fxn = ctypes.CFUNCTYPE(None, *[_ctypes_of[c] for c in self.argfmt])(fn)

class CPUDevice(Compiled):
  """The CPU: host memory, and a runtime chosen by what the compiler produces (a shared object or LLVM IR)."""
  runtimes = {"elf-so": CPUProgram, "llvm-obj": LLVMProgram}
  def __init__(self, device: str, renderer: Renderer | None, compiler: Compiler | None):
    if compiler is None:
      raise DeviceError(f"{device} has no compiler registered for its renderer; install clang or gcc for CPU:C, or "
                        "llvmlite for CPU:LLVM")
    if (runtime := self.runtimes.get(compiler.binary_format)) is None:
      raise DeviceError(f"CPU cannot run {compiler.binary_format!r} binaries from {type(compiler).__name__}; "
                        f"use a compiler that produces one of {sorted(self.runtimes)}")
    from ember_cpu.graph import CPUGraph
    super().__init__(device, CPUAllocator(), renderer, compiler, runtime, graph=CPUGraph)
