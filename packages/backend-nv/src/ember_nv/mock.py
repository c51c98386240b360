"""The MOCK side of the NV backend: a host build of the CUDA C kernels, and a software GPU that executes the command
stream the NV queues write.

*The host shim.* `CUDARenderer` output compiled by the system C++ compiler: `blockIdx`/`threadIdx` are thread-local
globals that a generated launcher sets while it loops over every block and thread of the grid; `__syncthreads` is a
no-op (the kernels use no shared memory yet, so running the threads of a block one after another is exact);
`cuda_fp16.h` is replaced by a header that maps `half` to the compiler's `_Float16`. The launcher reads the kernel
arguments from a parameter block laid out like the CUDA ABI's (`kernel_arg_layout`), which is what the MOCK GPU finds
in memory behind a QMD.

*The MOCK GPU* (`MockNVGPU`) owns a flat host "VRAM", decodes GPFIFO entries into pushbuffer methods (semaphore
release/acquire, copy engine launches, QMD compute launches) and performs them; see `ember_nv.queue` for the packet
formats.
"""
from __future__ import annotations
import ctypes
import os
import re
import subprocess
import tempfile
from ember.plugin import CompileError, Compiler, DeviceError

SHIM_HEADER = r"""
#include <math.h>
#include <string.h>
#include <stdint.h>
struct ember_uint3 { unsigned int x, y, z; };
static thread_local ember_uint3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __syncthreads() ((void)0)
template <typename D, typename S> static inline D ember_bits(S x) { D r; memcpy(&r, &x, sizeof(r)); return r; }
static inline float __int_as_float(int x) { return ember_bits<float>(x); }
static inline int __float_as_int(float x) { return ember_bits<int>(x); }
static inline float __uint_as_float(unsigned int x) { return ember_bits<float>(x); }
static inline unsigned int __float_as_uint(float x) { return ember_bits<unsigned int>(x); }
static inline double __longlong_as_double(long long x) { return ember_bits<double>(x); }
static inline long long __double_as_longlong(double x) { return ember_bits<long long>(x); }
"""

FP16_HEADER = r"""
typedef _Float16 half;
static inline half __float2half(float x) { return (half)x; }
static inline float __half2float(half x) { return (float)x; }
static inline short __half_as_short(half x) { return ember_bits<short>(x); }
static inline half __short_as_half(short x) { return ember_bits<half>(x); }
static inline unsigned short __half_as_ushort(half x) { return ember_bits<unsigned short>(x); }
static inline half __ushort_as_half(unsigned short x) { return ember_bits<half>(x); }
"""

_kernel_re = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\)')

def kernel_signature(src: str) -> tuple[str, list[str]]:
  """The name and the parameter types of the (single) kernel in CUDARenderer output."""
  if (m := _kernel_re.search(src)) is None:
    raise CompileError('no `extern "C" __global__ void` kernel in the source; the host shim runs CUDARenderer output')
  params = [p.strip() for p in m.group(2).split(",") if p.strip()]
  return m.group(1), [p.rsplit(" ", 1)[0].replace("const ", "").strip() for p in params]

def shim_launcher(src: str, symbol: str = "ember_launch") -> str:
  """C++ that runs the kernel over a grid: `symbol(params, grid xyz, block xyz)`; each argument is read from the
  parameter block at its offset, every argument aligned to its own size."""
  name, types = kernel_signature(src)
  lines = [f'extern "C" void {symbol}(const unsigned char *params, unsigned gx, unsigned gy, unsigned gz, '
           'unsigned lx, unsigned ly, unsigned lz) {', "  size_t off = 0;"]
  for i, t in enumerate(types):
    lines += [f"  off = (off + sizeof({t}) - 1) / sizeof({t}) * sizeof({t});",
              f"  {t} a{i}; memcpy(&a{i}, params + off, sizeof({t})); off += sizeof({t});"]
  call = f"{name}({', '.join(f'a{i}' for i in range(len(types)))});"
  lines += ["  gridDim = {gx, gy, gz}; blockDim = {lx, ly, lz};",
            "  for (unsigned bz = 0; bz < gz; bz++) for (unsigned by = 0; by < gy; by++)",
            "  for (unsigned bx = 0; bx < gx; bx++) for (unsigned tz = 0; tz < lz; tz++)",
            "    for (unsigned ty = 0; ty < ly; ty++) for (unsigned tx = 0; tx < lx; tx++) {",
            f"      blockIdx = {{bx, by, bz}}; threadIdx = {{tx, ty, tz}}; {call}", "    }", "}"]
  return "\n".join(lines) + "\n"

_fp16_include = re.compile(r"^#include <cuda_fp16\.h>\n", re.M)

def bundle_symbol(i: int) -> str: return f"ember_launch_{i}"

def shim_bundle(srcs: list[str]) -> str:
  """Several CUDARenderer kernels as one C++ translation unit, so one compiler call builds them all: kernel `i` sits in
  `namespace ember_k<i>` with its `extern "C"` dropped (equal kernel names and helpers do not clash) and is run by
  the launcher `bundle_symbol(i)`; cuda_fp16.h is included once, ahead of every namespace."""
  parts = ["#include <cuda_fp16.h>"] if any(_fp16_include.search(src) for src in srcs) else []
  for i, src in enumerate(srcs):
    body = _fp16_include.sub("", src).replace('extern "C" __global__ void ', "__global__ void ", 1)
    parts += [f"namespace ember_k{i} {{", body, shim_launcher(src, bundle_symbol(i)), f"}}  // namespace ember_k{i}"]
  return "\n".join(parts) + "\n"

class HostShimCompiler(Compiler):
  """CUDA C (CUDARenderer output) -> a host shared object through the shim header and g++/clang++."""
  binary_format = "host-shim-so"
  def __init__(self, cxx: str | None = None) -> None:
    import shutil
    found = cxx or next((p for n in ("g++", "clang++", "c++") if (p := shutil.which(n)) is not None), None)
    if found is None: raise CompileError("the NV host shim needs a C++ compiler (g++ or clang++) on PATH; install one")
    self.cxx = found
    super().__init__(f"compile_nv_shim_{os.path.basename(found)}")
  def compile(self, src: str) -> bytes: return self.build(src + "\n" + shim_launcher(src))
  def build(self, full: str) -> bytes:
    """A complete C++ translation unit (kernels and launchers) -> the bytes of a shared object."""
    with tempfile.TemporaryDirectory(prefix="ember_nvshim_") as tmp:
      with open(os.path.join(tmp, "cuda_fp16.h"), "w") as f: f.write(FP16_HEADER)
      with open(os.path.join(tmp, "ember_shim.h"), "w") as f: f.write(SHIM_HEADER)
      out = os.path.join(tmp, "kernel.so")
      cmd = [self.cxx, "-x", "c++", "-std=c++17", "-O1", "-shared", "-fPIC", "-ffp-contract=off", "-fwrapv",
             "-include", os.path.join(tmp, "ember_shim.h"), "-I", tmp, "-", "-o", out]
      try: proc = subprocess.run(cmd, input=full.encode(), capture_output=True, timeout=300)
      except (OSError, subprocess.SubprocessError) as e: raise CompileError(f"running {self.cxx} failed: {e}") from e
      if proc.returncode != 0:
        numbered = "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(full.splitlines()))
        raise CompileError(f"{self.cxx} rejected the host shim build:\n{proc.stderr.decode(errors='replace')}\n"
                           f"source:\n{numbered}")
      with open(out, "rb") as f: return f.read()

class HostShimBundleCompiler(HostShimCompiler):
  """A `shim_bundle` translation unit (launchers included) -> one shared object; `compile_cached` keeps it on disk."""
  def __init__(self, cxx: str | None = None) -> None:
    super().__init__(cxx)
    self.cachekey = f"{self.cachekey}_bundle"
  def compile(self, src: str) -> bytes: return self.build(src)

def load_shim(lib: bytes) -> ctypes.CDLL:
  """A shim build (shared object bytes) loaded into this process."""
  with tempfile.NamedTemporaryFile(prefix="ember_nvshim_", suffix=".so", delete=False) as f: f.write(lib)
  try: return ctypes.CDLL(f.name)
  except OSError as e: raise DeviceError(f"cannot load a host shim kernel: {e}") from e
  finally: os.unlink(f.name)

class HostKernel:
  """A shim build loaded into this process: `run(params, global_size, local_size)` executes the whole grid through
  the launcher `symbol` (`bundle_symbol(i)` for kernel `i` of a bundle)."""
  def __init__(self, lib: bytes | ctypes.CDLL, symbol: str = "ember_launch") -> None:
    self.lib = lib if isinstance(lib, ctypes.CDLL) else load_shim(lib)
    try: self.fxn = getattr(self.lib, symbol)
    except AttributeError as e: raise DeviceError(f"the host shim build has no launcher {symbol}: {e}") from e
    self.fxn.argtypes = [ctypes.c_char_p] + [ctypes.c_uint] * 6
    self.fxn.restype = None
  def run(self, params: bytes, global_size: tuple[int, int, int], local_size: tuple[int, int, int]) -> None:
    self.fxn(params, *global_size, *local_size)
