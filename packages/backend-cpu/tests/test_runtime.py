"""The CPU allocator, the compilers (errors, disk cache) and the plugin hooks."""
from __future__ import annotations
import ctypes
import os
import sqlite3
import numpy as np
import pytest
from ember import helpers
from ember.helpers import CacheWarning, Context
from ember.plugin import AxisType, BufferSpec, CompileError, UOp, dtypes
import ember_cpu.plugin as cpu_plugin
from ember_cpu import compiler as cpu_compiler
from ember_cpu.compiler import ClangCompiler, LLVMCompiler
from ember_cpu.device import CPUAllocator, CPUDevice, CPUProgram, LLVMProgram
from ember_cpu.renderer import ClangRenderer, CPULLVMRenderer
from cpu_kernels import RENDERERS, device, end, linear, param

# ** allocator **

@pytest.mark.parametrize("size", [1, 7, 64, 1000, 3 << 20])
def test_alloc_is_aligned_and_zero_copy(size: int) -> None:
  alloc = CPUAllocator()
  buf = alloc.alloc(size)
  assert ctypes.addressof(buf) % 64 == 0
  view = alloc._as_buffer(buf)
  assert view.nbytes == size
  data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
  view[:] = data.tobytes()  # written through the zero-copy view ...
  out = np.empty(size, np.uint8)
  alloc._copyout(memoryview(out), buf)  # ... and read back by a copy
  np.testing.assert_array_equal(out, data)

def test_alloc_past_the_address_space_is_a_typed_out_of_memory_error() -> None:
  # mmap's ENOMEM (an OSError) becomes ember's OutOfMemoryError, a MemoryError the LRU allocator frees its cache on
  from ember.errors import OutOfMemoryError
  with pytest.raises(OutOfMemoryError, match=r"CPUAllocator: out of memory allocating 4096\.0 PiB"):
    CPUAllocator().alloc(2 ** 62)

def test_copyin_from_read_only_and_writable_memory() -> None:
  alloc = CPUAllocator()
  buf = alloc.alloc(8)
  alloc._copyin(buf, memoryview(b"abcdefgh"))
  assert bytes(alloc._as_buffer(buf)) == b"abcdefgh"
  alloc._copyin(buf, memoryview(bytearray(b"12345678")))
  assert bytes(alloc._as_buffer(buf)) == b"12345678"

def test_offset_views_share_memory() -> None:
  alloc = CPUAllocator()
  base = alloc.alloc(32)
  alloc._copyin(base, memoryview(bytes(range(32))))
  view = alloc._offset(base, 8, 16)
  assert bytes(alloc._as_buffer(view)) == bytes(range(16, 24))
  alloc._copyin(view, memoryview(b"\xff" * 8))
  assert bytes(alloc._as_buffer(base))[16:24] == b"\xff" * 8
  assert bytes(alloc._as_buffer(base))[:16] == bytes(range(16))

def test_external_pointer_and_lru_reuse() -> None:
  alloc = CPUAllocator()
  host = np.arange(16, dtype=np.uint8)
  ext = alloc.alloc(16, BufferSpec(external_ptr=host.ctypes.data))
  alloc._copyin(ext, memoryview(b"\x07" * 16))
  assert (host == 7).all()
  buf = alloc.alloc(100)
  alloc.free(buf, 100)
  with Context(LRU=1):
    assert alloc.alloc(100) is buf

# ** compilers **

def _program() -> list[UOp]:
  out = param(0, dtypes.float32, 8)
  rng = UOp.range(8, 0, AxisType.THREAD)
  return linear(out.index(rng).store(rng.cast(dtypes.float32) * 0.5), end(rng))

@pytest.mark.parametrize("kind", RENDERERS)
def test_compile_cache_hit(kind: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
  dev = device(kind)
  src = dev.renderer.render(_program(), "cached_kernel")
  with Context(CACHEDB=str(tmp_path / "cache.db"), CACHELEVEL=2):
    lib = dev.compiler.compile_cached(src)
    def no_compile(src: str) -> bytes: raise AssertionError("compile ran although the cache holds this source")
    monkeypatch.setattr(dev.compiler, "compile", no_compile)
    assert dev.compiler.compile_cached(src) == lib
    with pytest.raises(CompileError, match="compile ran"):  # another source misses the cache
      dev.compiler.compile_cached(src + "\n")
  out = np.zeros(8, np.float32)
  prg = dev.runtime("cached_kernel", lib)
  buf = dev.allocator.alloc(32)
  prg(buf, global_size=(2, 1, 1))
  dev.allocator._copyout(memoryview(out).cast("B"), buf)
  np.testing.assert_array_equal(out, np.arange(8, dtype=np.float32) * 0.5)

@pytest.mark.parametrize("kind", RENDERERS)
def test_damaged_cached_binary_is_recompiled_before_loading(kind: str, tmp_path) -> None:
  dev = device(kind)
  src = dev.renderer.render(_program(), "damaged_kernel")
  path = tmp_path / "cache.db"
  with Context(CACHEDB=str(path), CACHELEVEL=2):
    lib = dev.compiler.compile_cached(src)
    flipped = bytearray(lib)
    for i in range(0, len(flipped), 7): flipped[i] ^= 0xA5  # garbage that would crash dlopen or the kernel
    with sqlite3.connect(path) as conn:
      sql = f"UPDATE {helpers._CACHE_TABLE} SET value=? WHERE table_name=?"
      conn.execute(sql, (bytes(flipped), dev.compiler.cachekey))
    with pytest.warns(CacheWarning, match="checksum"): again = dev.compiler.compile_cached(src)
  assert again != bytes(flipped) and len(again) == len(lib)
  out = np.zeros(8, np.float32)
  buf = dev.allocator.alloc(32)
  dev.runtime("damaged_kernel", again)(buf, global_size=(1, 1, 1))
  dev.allocator._copyout(memoryview(out).cast("B"), buf)
  np.testing.assert_array_equal(out, np.arange(8, dtype=np.float32) * 0.5)

def test_cache_keys_differ_per_compiler() -> None:
  assert device("C").compiler.cachekey != device("LLVM").compiler.cachekey
  assert device("C").compiler.cachekey == ClangCompiler().cachekey

def test_c_flags_keep_float_semantics_and_never_enable_amx() -> None:
  flags = device("C").compiler.flags
  assert "-ffp-contract=off" in flags and not any("fast-math" in f or f == "-Ofast" for f in flags)
  if cpu_compiler._is_x86(): assert {"-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"} <= set(flags)
  features = cpu_compiler.host_cpu_features().split(",")  # the LLVM side: every AMX feature is off
  assert not [f for f in features if f.startswith("+amx")]
  if cpu_compiler._is_x86(): assert "-amx-tile" in features  # LLVM lists every x86 feature, on or off

@pytest.mark.parametrize("version, gcc", [
  ("gcc (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.", True),
  ("cc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0\nCopyright (C) 2021 Free Software Foundation, Inc.", True),
  ("Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu", False),
  ("Apple clang version 15.0.0 (clang-1500.3.9.4)\nTarget: arm64-apple-darwin23.4.0", False),
  ("", False),
])
def test_gcc_only_flags_go_to_gcc_alone(version: str, gcc: bool) -> None:
  """-fno-tree-loop-distribution (a quarter of gcc's time on unrolled kernels) is a gcc flag: clang warns on it."""
  assert cpu_compiler._is_gcc(version) is gcc
  flags = device("C").compiler.flags
  assert (set(cpu_compiler.GCC_FLAGS) <= set(flags)) is cpu_compiler._is_gcc(
    cpu_compiler._compiler_version(device("C").compiler.cc))

def test_c_compile_error_names_the_problem() -> None:
  with pytest.raises(CompileError, match="rejected a kernel") as e:
    device("C").compiler.compile("void k(void) { this is not C; }")
  assert "this is not C" in str(e.value)

def test_llvm_compile_error_names_the_problem() -> None:
  with pytest.raises(CompileError, match="LLVM rejected a kernel"):
    device("LLVM").compiler.compile("define void @k() { ret i32 0 }")

def test_no_c_compiler_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(cpu_compiler.shutil, "which", lambda name: None)
  assert cpu_compiler.find_c_compiler() is None
  with pytest.raises(CompileError, match="install one .*DEV=CPU:LLVM"):
    ClangCompiler()

def test_a_compiler_that_cannot_build_kernels_is_skipped(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
  if cpu_compiler.find_c_compiler() is None: pytest.skip("needs a working C compiler on PATH")
  old_gcc = tmp_path / "gcc"  # stands in for a gcc without _Float16: it rejects everything
  old_gcc.write_text("#!/bin/sh\necho \"error: _Float16 is not supported on this target\" >&2\nexit 1\n")
  old_gcc.chmod(0o755)
  monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
  assert cpu_compiler.find_c_compiler() == str(old_gcc)
  assert ClangCompiler().cc != str(old_gcc)  # the next one that works: clang, or cc
  with pytest.raises(CompileError, match="_Float16 is not supported.*install clang >= 15 or gcc >= 12"):
    ClangCompiler(str(old_gcc))

# ** device and plugin wiring **

class _Registry:
  def __init__(self) -> None: self.entries: list[tuple] = []
  def add(self, *args, **kwargs) -> None: self.entries.append((*args, kwargs))

def test_plugin_registers_device_renderers_and_compilers() -> None:
  info = cpu_plugin.ember_backend_info()
  assert info.name == "cpu" and info.priority == 10
  devices, renderers, compilers = _Registry(), _Registry(), _Registry()
  cpu_plugin.ember_register_devices(devices)
  cpu_plugin.ember_register_renderers(renderers)
  cpu_plugin.ember_register_compilers(compilers)
  by_name = {e[1]: e for e in renderers.entries}
  assert set(by_name) == {"C", "LLVM"}
  assert by_name["C"][3]["priority"] > by_name["LLVM"][3]["priority"]  # a C compiler exists here: plain DEV=CPU is C
  assert isinstance(by_name["C"][2](""), ClangRenderer) and isinstance(by_name["LLVM"][2](""), CPULLVMRenderer)
  compiler_of = {e[1]: e[2] for e in compilers.entries}
  name, factory, _ = devices.entries[0]
  for renderer_name, compiler_cls, runtime in (("C", ClangCompiler, CPUProgram), ("LLVM", LLVMCompiler, LLVMProgram)):
    renderer = by_name[renderer_name][2]("")
    dev = factory(name, renderer, compiler_of[renderer_name](renderer))
    assert isinstance(dev, CPUDevice) and isinstance(dev.compiler, compiler_cls) and dev.runtime is runtime

def test_plugin_prefers_llvm_without_a_c_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(cpu_compiler.shutil, "which", lambda name: None)
  renderers = _Registry()
  cpu_plugin.ember_register_renderers(renderers)
  priority = {e[1]: e[3]["priority"] for e in renderers.entries}
  assert priority["LLVM"] > priority["C"]

def test_probe(monkeypatch: pytest.MonkeyPatch) -> None:
  assert cpu_plugin.ember_probe("NV") is None
  assert cpu_plugin.ember_probe("CPU").ok
  monkeypatch.setattr(cpu_compiler.shutil, "which", lambda name: None)
  import importlib.util
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
  result = cpu_plugin.ember_probe("CPU")
  assert not result.ok and "install clang or gcc" in result.reason

def test_device_rejects_unknown_binary_format() -> None:
  from ember.plugin import Compiler, DeviceError
  class PTXish(Compiler):
    binary_format = "ptx"
    def compile(self, src: str) -> bytes: return src.encode()
  with pytest.raises(DeviceError, match="cannot run 'ptx'"):
    CPUDevice("CPU", ClangRenderer(), PTXish())

def test_device_without_a_compiler_says_what_to_install() -> None:
  from ember.plugin import DeviceError
  with pytest.raises(DeviceError, match="no compiler registered.*install clang or gcc"):
    CPUDevice("CPU", ClangRenderer(), None)

def test_new_kernels_compile_side_by_side_off_the_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
  import threading
  from ember import Device, Tensor
  from ember.engine import realize as engine
  dev = Device[Device.DEFAULT]
  if not dev.compiler.parallel_compile: pytest.skip(f"{type(dev.compiler).__name__} compiles on the caller's thread")
  threads: list[int] = []
  real = type(dev.compiler).compile
  def spy(self, src: str) -> bytes:
    threads.append(threading.get_ident())
    return real(self, src)
  monkeypatch.setattr(type(dev.compiler), "compile", spy)
  rng = np.random.default_rng(11)
  a, b = rng.standard_normal((37, 29)).astype(np.float32), rng.standard_normal((29, 41)).astype(np.float32)
  out = ((Tensor(a) @ Tensor(b)).exp().sum(0) + 3.5).sqrt()  # shapes no other test compiles: every kernel is new
  items = [it for it in out.schedule() if it.kind == "kernel"]
  assert len(items) >= 2
  with Context(CACHELEVEL=0):
    engine.compile_ahead(items)
    assert len(threads) >= 2 and threading.main_thread().ident not in threads
    for it in items:  # every runner is there: running the schedule compiles nothing more
      assert engine._key(it.device, dev.renderer, it.program) in engine._runner_cache
    compiled = len(threads)
    np.testing.assert_allclose(out.numpy(), np.sqrt(np.exp(a @ b).sum(0) + 3.5), rtol=1e-4)
    assert len(threads) == compiled

def test_ember_cc_picks_the_c_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
  import shutil
  gcc = shutil.which("gcc")
  if gcc is None: pytest.skip("no gcc on PATH")
  monkeypatch.setenv("EMBER_CC", "gcc")
  assert ClangCompiler().cc == gcc
  monkeypatch.setenv("EMBER_CC", "no-such-compiler-ember")
  with pytest.raises(CompileError, match="EMBER_CC='no-such-compiler-ember' is not a compiler on PATH"): ClangCompiler()
  monkeypatch.delenv("EMBER_CC")
  assert ClangCompiler().cc == gcc  # gcc before clang: the kernels are written for its vectoriser
