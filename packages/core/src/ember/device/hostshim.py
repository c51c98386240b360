"""The host shim: GPU-style C/C++ kernels (CUDA, HIP) compiled for the host CPU and run over their whole grid.

A backend without its GPU (the MOCK interfaces) runs its renderer's kernels here. The kernel source is compiled by the
system C++ compiler with a *dialect* header force-included: it defines the GPU keywords away and the block/thread id
builtins as thread-local globals. A generated launcher, `symbol(params, gx, gy, gz, lx, ly, lz)`, reads each kernel
argument from a parameter block and calls the kernel once per (block, thread) of the grid, setting those globals first.
Kernels without block-level sync run their threads one after another. A kernel that uses shared memory, barriers or
warp shuffles (`ShimDialect.sync_markers` in its source) runs each thread of a block on its own host thread: shared
arrays are function statics (one per kernel, reused block after block), `ember_sync()` is a C++20 barrier over the
block's threads, and a shuffle writes its value to an exchange slot, meets the others, reads the partner's slot and
meets them again. Every thread walks the blocks in the same order with a barrier after each, so blocks never overlap.

Shared memory is emulated faithfully, not just made to work: host threads racing through a kernel with a missing
barrier may well happen to produce the right numbers, so every shared array is checked (`check_shared`, `SHIM_SYNC`).
Each access is compared with the element's earlier accesses in the same workgroup between the same two barriers; two
threads there, one of them writing, is a race, and the launch raises `SharedMemoryError` naming the array, element and
threads. So do reads of elements no thread of the workgroup wrote (stale data of an earlier block) and indices outside
the array. The emulation's own meeting points (shuffles, matrix instructions) do not count as barriers.

The parameter block is the one the GPU ABIs (CUDA `__global__` parameters, the HSA kernarg segment) use for these
kernels: arguments in order, each aligned to its own size (`aligned_layout`). Everything that differs between
backends (the header, the kernel prefix their renderer writes, the id builtins) is a `ShimDialect`.
"""
from __future__ import annotations
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Iterable
from ember.helpers import content_hash
from ember.device.base import Compiler
from ember.errors import CompileError, DeviceError

SHIM_SYNC = r"""
#include <barrier>
#include <mutex>
#include <stdio.h>
#include <thread>
#include <vector>
static std::barrier<>* ember_barrier = nullptr;
static thread_local unsigned ember_tid = 0;
alignas(16) static unsigned char ember_exchange[1024 * 8];
// what the shared-memory checks compare: the workgroup (of which launch) a host thread runs, and the barriers it has
// passed in that workgroup
static thread_local unsigned long long ember_gen = 0;
static thread_local unsigned ember_phase = 0;
static unsigned long long ember_next_gen = 1;
static std::mutex ember_check_lock;
static char ember_error[1024];
static char ember_unwritten[1024];  // a read of an element nobody wrote yet: an error unless it turns out to be a race
static unsigned long long ember_unwritten_gen = 0;
static unsigned ember_unwritten_phase = 0;
// a launch takes one workgroup id per block from here (the launcher calls it before it starts the threads)
static inline unsigned long long ember_launch_gens(unsigned long long blocks) {
  unsigned long long first = ember_next_gen;
  ember_next_gen += blocks;
  return first;
}
static inline void ember_begin_workgroup(unsigned long long gen) { ember_gen = gen; ember_phase = 0; }
// every thread of the workgroup meets here: the emulation's own exchanges (shuffles, matrix instructions), no barrier
// of the kernel's (the hardware gives those no memory ordering for shared memory)
static inline void ember_rendezvous() { if (ember_barrier) ember_barrier->arrive_and_wait(); }
template <typename T> static inline T ember_exchange_with(T v, unsigned partner) {
  T* slots = (T*)ember_exchange;
  slots[ember_tid] = v;
  ember_rendezvous();
  T r = slots[partner];
  ember_rendezvous();
  return r;
}
template <typename T> static inline T ember_shuffle_xor(T v, unsigned mask) {
  return ember_exchange_with(v, ember_tid ^ mask);
}
// Shared memory with its accesses checked. Each element remembers who last wrote it and who read it, in which
// workgroup and between which two barriers (phase). Two threads touching an element between the same two barriers,
// one of them writing, is a race (its result depends on the order the GPU runs the threads in); reading an element
// no thread of this workgroup wrote reads garbage; an index outside the array is out of bounds. The first such
// access is recorded for the host (ember_take_error) and the kernel goes on with the value in memory.
struct ember_cell { unsigned long long wgen, rgen; unsigned wphase, rphase; int writer, reader; };
enum { EMBER_NOBODY = -1, EMBER_SEVERAL = -2 };
template <typename... A> static inline void ember_report(const char* fmt, A... args) {
  if (!ember_error[0]) snprintf(ember_error, sizeof(ember_error), fmt, args...);
}
static inline bool ember_in_bounds(const char* name, long i, long n) {
  if (i >= 0 && i < n) return true;
  std::lock_guard<std::mutex> hold(ember_check_lock);
  ember_report("shared memory %s[%ld] is out of bounds (thread %d; the array has %ld elements)", name, i,
               (int)ember_tid, n);
  return false;
}
static inline void ember_check_write(ember_cell& c, const char* name, long i) {
  std::lock_guard<std::mutex> hold(ember_check_lock);
  int t = (int)ember_tid;
  bool wrote = c.wgen == ember_gen && c.wphase == ember_phase, read = c.rgen == ember_gen && c.rphase == ember_phase;
  if (wrote && c.writer != t)
    ember_report("shared memory race: %s[%ld] is written by threads %d and %d between the same two barriers", name, i,
                 c.writer, t);
  else if (read && c.reader == EMBER_SEVERAL)
    ember_report("shared memory race: %s[%ld] is read by several threads and written by thread %d between the same two "
                 "barriers; a barrier is missing between the reads and the write", name, i, t);
  else if (read && c.reader != t)
    ember_report("shared memory race: %s[%ld] is read by thread %d and written by thread %d between the same two "
                 "barriers; a barrier is missing between the read and the write", name, i, c.reader, t);
  c.wgen = ember_gen; c.wphase = ember_phase; c.writer = t;
}
static inline void ember_check_read(ember_cell& c, const char* name, long i) {
  std::lock_guard<std::mutex> hold(ember_check_lock);
  int t = (int)ember_tid;
  if (c.wgen != ember_gen && !ember_unwritten[0]) {  // a write by another thread before the barrier makes it a race
    snprintf(ember_unwritten, sizeof(ember_unwritten), "shared memory %s[%ld] is read by thread %d but no thread of "
             "its workgroup wrote it", name, i, t);
    ember_unwritten_gen = ember_gen;
    ember_unwritten_phase = ember_phase;
  }
  else if (c.wgen == ember_gen && c.wphase == ember_phase && c.writer != t)
    ember_report("shared memory race: %s[%ld] is written by thread %d and read by thread %d between the same two "
                 "barriers; a barrier is missing between the write and the read", name, i, c.writer, t);
  bool read = c.rgen == ember_gen && c.rphase == ember_phase;
  if (!read) { c.rgen = ember_gen; c.rphase = ember_phase; c.reader = t; }
  else if (c.reader != t) c.reader = EMBER_SEVERAL;
}
// the kernel's workgroup barrier: shared memory accesses before it and after it are ordered. A read of an element
// that no thread wrote before the barrier is reported here (a race with a write in the same phase was reported first)
static inline void ember_sync() {
  ember_rendezvous();
  ember_phase++;
  std::lock_guard<std::mutex> hold(ember_check_lock);
  // only a read of the phase that just ended: a thread of the next workgroup may have recorded one of its own already
  if (!ember_unwritten[0] || ember_unwritten_gen != ember_gen || ember_unwritten_phase + 1 != ember_phase) return;
  if (!ember_error[0]) snprintf(ember_error, sizeof(ember_error), "%s", ember_unwritten);
  ember_unwritten[0] = 0;
}
template <typename T> struct ember_shared_ref {
  T* p;
  ember_cell* c;
  const char* name;
  long i;
  operator T() const { ember_check_read(*c, name, i); return *p; }
  ember_shared_ref& operator=(T v) { ember_check_write(*c, name, i); *p = v; return *this; }
  ember_shared_ref& operator=(const ember_shared_ref& o) { return *this = (T)o; }
};
// the first error of the last launch, for the host (HostKernel.run), cleared for the next launch
extern "C" int ember_take_error(char* out, int size) {
  int n = snprintf(out, size, "%s", ember_error);
  ember_error[0] = ember_unwritten[0] = 0;
  return n;
}
template <typename T, long N> struct ember_shared {
  const char* name;
  T data[N];
  ember_cell cells[N];
  T spill;
  ember_cell spill_cell;
  ember_shared_ref<T> operator[](long i) {
    if (!ember_in_bounds(name, i, N)) return {&spill, &spill_cell, name, i};
    return {&data[i], &cells[i], name, i};
  }
  // `array + offset`, for helpers that take a pointer into shared memory (Metal's simdgroup_load/store)
  struct span {
    ember_shared* s;
    long offset;
    ember_shared_ref<T> operator[](long i) const { return (*s)[offset + i]; }
  };
  span operator+(long offset) { return {this, offset}; }
};
"""
"""The workgroup emulation of threaded launches (one host thread per GPU thread): the barrier (`ember_sync`), the
register exchanges (`ember_exchange_with`, `ember_shuffle_xor`) and checked shared memory (`ember_shared`, what
`ShimDialect.check_shared` turns each shared array into). Other shims (the Metal test shim) include it too."""

SHIM_PRELUDE = r"""
#include <math.h>
#include <string.h>
#include <stdint.h>
#define __global__
#define __device__
#define __shared__ static
#ifdef EMBER_THREADED
""" + SHIM_SYNC + r"""
#else
// a build whose kernels have no sync markers runs their threads one after another and never syncs or exchanges:
// reaching these is a shim bug, so it traps instead of returning a wrong value
static const unsigned ember_tid = 0;
static inline void ember_sync() { __builtin_trap(); }
static inline void ember_rendezvous() { __builtin_trap(); }
template <typename T> static inline T ember_exchange_with(T v, unsigned) { __builtin_trap(); return v; }
template <typename T> static inline T ember_shuffle_xor(T v, unsigned) { __builtin_trap(); return v; }
extern "C" int ember_take_error(char* out, int size) { if (size > 0) out[0] = 0; return 0; }
#endif
"""
"""Force-included ahead of every dialect header: libm, memcpy, fixed-width ints, the GPU qualifiers defined away,
shared arrays as statics, and in builds compiled with EMBER_THREADED (sources that contain a sync marker; the C++
thread headers are heavy) the workgroup emulation `SHIM_SYNC`. `ember_take_error` hands the host the first shared
memory error of the last launch."""

def check_shared(src: str, qualifier: str = "__shared__") -> str:
  """`src` with every shared array declaration `<qualifier> T name[N];` turned into a checked one (`ember_shared`,
  see `SHIM_SYNC`): the launch then reports races, reads of unwritten elements and out-of-bounds indices."""
  decl = re.compile(re.escape(qualifier) + r" ([\w ]+?) (\w+)\[(\d+)\];")
  return decl.sub(lambda m: f'{qualifier} ember_shared<{m[1]}, {m[3]}> {m[2]}{{"{m[2]}"}};', src)

class SharedMemoryError(DeviceError):
  """A kernel run by the host shim raced on shared memory (two threads between the same barriers, one writing), read
  shared memory its workgroup never wrote, or indexed a shared array out of bounds: on a GPU its result would depend
  on thread timing or garbage. The message names the array, the element and the threads."""

def aligned_layout(sizes: Iterable[int]) -> tuple[list[tuple[int, int]], int]:
  """(offset, size) of each argument, every one aligned to its own size, and the block's total size."""
  layout, offset = [], 0
  for size in sizes:
    offset = -(-offset // size) * size
    layout.append((offset, size))
    offset += size
  return layout, offset

def c_param_size(ctype: str) -> int:
  """The size in bytes of a kernel parameter of C type `ctype` on a 64-bit target (pointers are 8)."""
  if ctype.endswith("*") or "long long" in ctype or ctype == "double": return 8
  if "short" in ctype or ctype == "half": return 2
  if "char" in ctype or ctype == "bool": return 1
  return 4

def signature_layout(types: list[str]) -> tuple[list[tuple[int, int]], int]:
  """The parameter block of a kernel with these C parameter types (see `aligned_layout`)."""
  return aligned_layout(c_param_size(t) for t in types)

@dataclass(frozen=True)
class ShimDialect:
  """What one backend's kernel C needs to build and run on the host.

  `backend` names it in messages and cache keys; `renderer` is the renderer whose output it runs; `kernel_prefix` is
  what that renderer writes before a kernel's name; `header` is force-included after `SHIM_PRELUDE` and defines the id
  builtins as thread-local globals; `set_ids` is the C statement that sets them from the block (`bx`, `by`, `bz`) and
  thread (`tx`, `ty`, `tz`) indices; `prologue` runs once per launch with the grid (`gx`..) and block (`lx`..) sizes;
  `include_files` are (name, text) headers put on the include path (replacing toolkit headers the source includes);
  a kernel whose source contains one of `sync_markers` gets the threaded launcher."""
  backend: str
  renderer: str
  kernel_prefix: str
  header: str
  set_ids: str
  prologue: str = ""
  include_files: tuple[tuple[str, str], ...] = ()
  sync_markers: tuple[str, ...] = ("__shared__", "__syncthreads", "__shfl")
  kernel_re: re.Pattern[str] = field(init=False, repr=False, compare=False)
  def __post_init__(self) -> None:
    object.__setattr__(self, "kernel_re", re.compile(re.escape(self.kernel_prefix) + r"(\w+)\(([^)]*)\)"))

  def signature(self, src: str) -> tuple[str, list[str]]:
    """The name and the C parameter types (without `const`) of the first kernel in `src`."""
    if (m := self.kernel_re.search(src)) is None:
      raise CompileError(f"no `{self.kernel_prefix.strip()}` kernel in the source; the {self.backend} host shim runs "
                         f"{self.renderer} output")
    params = [p.strip() for p in m.group(2).split(",") if p.strip()]
    return m.group(1), [p.rsplit(" ", 1)[0].replace("const ", "").strip() for p in params]

  def threaded(self, src: str) -> bool:
    """Whether kernels of `src` sync (one of `sync_markers` appears): they get the threaded launcher and build."""
    return any(marker in src for marker in self.sync_markers)

  def launcher(self, src: str, symbol: str = "ember_launch") -> str:
    """C++ that runs the kernel of `src` over a grid: `symbol(params, grid xyz, block xyz)`, each argument read from
    `params` at its `signature_layout` offset."""
    name, types = self.signature(src)
    layout, _ = signature_layout(types)
    lines = [f'extern "C" void {symbol}(const unsigned char *params, unsigned gx, unsigned gy, unsigned gz, '
             'unsigned lx, unsigned ly, unsigned lz) {']
    for i, (t, (offset, _)) in enumerate(zip(types, layout)):
      lines.append(f"  {t} a{i}; memcpy(&a{i}, params + {offset}, sizeof({t}));")
    call = f"{name}({', '.join(f'a{i}' for i in range(len(types)))});"
    if self.threaded(src):  # a host thread per GPU thread, a barrier per block
      lines += ["  unsigned n = lx * ly * lz;", "  std::barrier<> bar(n);", "  ember_barrier = &bar;",
                "  unsigned long long gen0 = ember_launch_gens((unsigned long long)gx * gy * gz);",
                "  std::vector<std::thread> workers;",
                "  for (unsigned t = 0; t < n; t++) workers.emplace_back([&, t]() {",
                "    unsigned tx = t % lx, ty = (t / lx) % ly, tz = t / (lx * ly);", "    ember_tid = t;",
                *([f"    {self.prologue}"] if self.prologue else []),
                "    for (unsigned bz = 0; bz < gz; bz++) for (unsigned by = 0; by < gy; by++)",
                "    for (unsigned bx = 0; bx < gx; bx++) {",
                "      ember_begin_workgroup(gen0 + ((unsigned long long)bz * gy + by) * gx + bx);",
                f"      {self.set_ids} {call}", "      ember_sync();",
                "    }", "  });", "  for (auto& w : workers) w.join();", "  ember_barrier = nullptr;", "}"]
      return "\n".join(lines) + "\n"
    if self.prologue: lines.append(f"  {self.prologue}")
    lines += ["  for (unsigned bz = 0; bz < gz; bz++) for (unsigned by = 0; by < gy; by++)",
              "  for (unsigned bx = 0; bx < gx; bx++) for (unsigned tz = 0; tz < lz; tz++)",
              "    for (unsigned ty = 0; ty < ly; ty++) for (unsigned tx = 0; tx < lx; tx++) {",
              f"      {self.set_ids} {call}", "    }", "}"]
    return "\n".join(lines) + "\n"

def find_cxx(cxx: str | None, backend: str) -> str:
  """`cxx`, or the first of g++, clang++, c++ on PATH."""
  found = cxx or next((p for n in ("g++", "clang++", "c++") if (p := shutil.which(n)) is not None), None)
  if found is None:
    raise CompileError(f"the {backend} host shim needs a C++ compiler (g++ or clang++) on PATH; install one")
  return found

class HostShimCompiler(Compiler):
  """Kernel C of `dialect` -> a host shared object holding the kernel and its launcher `ember_launch`.

  It remembers the source of every binary it returns, so a MOCK device can lay out the parameter block of a binary it
  is handed (`arg_layout`)."""
  binary_format = "host-shim-so"
  def __init__(self, dialect: ShimDialect, cxx: str | None = None) -> None:
    self.dialect, self.cxx = dialect, find_cxx(cxx, dialect.backend)
    self.sources: dict[str, str] = {}  # sha256 of a binary -> its source
    # the binary also holds the headers and the launcher: the cache table is keyed by them (and by this module's code,
    # which writes the launcher), not only by the kernel source
    version = content_hash(repr(dialect), SHIM_PRELUDE, open(__file__, encoding="utf-8").read())[:16]
    super().__init__(f"compile_{dialect.backend.lower()}_shim_{os.path.basename(self.cxx)}_{version}")

  def compile(self, src: str) -> bytes: return self.remember(src, self.build(src + "\n" + self.dialect.launcher(src)))
  def compile_cached(self, src: str) -> bytes: return self.remember(src, super().compile_cached(src))
  def remember(self, src: str, lib: bytes) -> bytes:
    self.sources[hashlib.sha256(lib).hexdigest()] = src
    return lib

  def arg_layout(self, name: str, lib: bytes) -> tuple[list[tuple[int, int]], int]:
    """The parameter block of the kernel `name` in `lib`, a binary this compiler built."""
    src = self.sources.get(hashlib.sha256(lib).hexdigest())
    if src is None:
      raise DeviceError(f"MOCK+{self.dialect.backend} has no source for kernel {name}; compile it through this device")
    return signature_layout(self.dialect.signature(src)[1])

  def build(self, full: str) -> bytes:
    """A complete C++ translation unit (kernels and launchers) -> the bytes of a shared object; threaded builds check
    their shared memory (`check_shared`)."""
    tag = self.dialect.backend.lower()
    with tempfile.TemporaryDirectory(prefix=f"ember_{tag}shim_") as tmp:
      for fname, text in (("ember_shim.h", SHIM_PRELUDE + self.dialect.header), *self.dialect.include_files):
        with open(os.path.join(tmp, fname), "w") as f: f.write(text)
      out = os.path.join(tmp, "kernel.so")
      threaded = ["-DEMBER_THREADED"] if self.dialect.threaded(full) else []
      if threaded: full = check_shared(full)  # every shared array checked (races, unwritten reads, bounds)
      cmd = [self.cxx, "-x", "c++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", *threaded,
             "-ffp-contract=off", "-fwrapv",
             "-include", os.path.join(tmp, "ember_shim.h"), "-I", tmp, "-", "-o", out]
      try: proc = subprocess.run(cmd, input=full.encode(), capture_output=True, timeout=300)
      except (OSError, subprocess.SubprocessError) as e: raise CompileError(f"running {self.cxx} failed: {e}") from e
      if proc.returncode != 0:
        numbered = "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(full.splitlines()))
        raise CompileError(f"{self.cxx} rejected the {self.dialect.backend} host shim build:\n"
                           f"{proc.stderr.decode(errors='replace')}\nsource:\n{numbered}")
      with open(out, "rb") as f: return f.read()

def shim_arg_layout(compiler: Compiler | None, name: str, lib: bytes) -> tuple[list[tuple[int, int]], int]:
  """The parameter block of kernel `name` in `lib`, asked of the device's `compiler`, which must have built it."""
  if not isinstance(compiler, HostShimCompiler):
    raise DeviceError(f"kernel {name}: this device runs host shim builds only; its compiler is "
                      f"{type(compiler).__name__}")
  return compiler.arg_layout(name, lib)

def load_shim(lib: bytes) -> ctypes.CDLL:
  """A shim build (shared object bytes) loaded into this process."""
  with tempfile.NamedTemporaryFile(prefix="ember_shim_", suffix=".so", delete=False) as f: f.write(lib)
  try: return ctypes.CDLL(f.name)
  except OSError as e: raise DeviceError(f"cannot load a host shim kernel: {e}") from e
  finally: os.unlink(f.name)

class HostKernel:
  """A shim build loaded into this process: `run(params, grid, block)` executes the whole grid through the launcher
  `symbol`. `params` is the parameter block, as bytes or as the address of host memory holding it."""
  def __init__(self, lib: bytes | ctypes.CDLL, symbol: str = "ember_launch") -> None:
    self.lib = lib if isinstance(lib, ctypes.CDLL) else load_shim(lib)
    try: self.fxn = getattr(self.lib, symbol)
    except AttributeError as e: raise DeviceError(f"the host shim build has no launcher {symbol}: {e}") from e
    self.fxn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6
    self.fxn.restype = None
    self.take_error = getattr(self.lib, "ember_take_error", None)  # builds of other shims may lack it
    if self.take_error is not None:
      self.take_error.argtypes, self.take_error.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_int
  def run(self, params: bytes | int, grid: tuple[int, int, int], block: tuple[int, int, int]) -> None:
    """Run the grid; a SharedMemoryError if the launch raced on shared memory (see `SHIM_SYNC`)."""
    self.fxn(params, *grid, *block)
    raise_shared_memory_error(self.take_error)

def raise_shared_memory_error(take_error: Callable[..., int] | None) -> None:
  """Raise the SharedMemoryError a shim build recorded in its last launch, if any (`take_error` is the build's
  `ember_take_error`)."""
  if take_error is None: return
  buf = ctypes.create_string_buffer(1024)
  if take_error(buf, len(buf)) > 0:
    raise SharedMemoryError(f"{buf.value.decode(errors='replace')} (run by the host shim, which checks every shared "
                            "memory access of a workgroup between its barriers); add the missing barrier "
                            "(__syncthreads / threadgroup_barrier) or fix the index")

__all__ = ["SHIM_SYNC", "SHIM_PRELUDE", "check_shared", "SharedMemoryError", "raise_shared_memory_error",
           "aligned_layout", "c_param_size", "signature_layout", "ShimDialect", "find_cxx", "HostShimCompiler",
           "shim_arg_layout", "load_shim", "HostKernel"]
