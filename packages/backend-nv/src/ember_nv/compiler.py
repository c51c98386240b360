"""The NV compilers: NVRTC (through ctypes) for CUDA C, ptxas for PTX, both producing a cubin for one `sm_XX`; and the
host shim build of the CUDA C that the MOCK+NV device runs.

NVRTC is looked up in the `nvidia-cuda-nvrtc` wheel (`pip install ember-backend-nv[nvrtc]`), then in the CUDA toolkit
(`CUDA_HOME`, `/usr/local/cuda`), then on the loader path. ptxas is looked up the same way. Neither needs a GPU.

*The host shim* (`NVShimCompiler`): `CUDARenderer` output compiled by the system C++ compiler through core's host
shim (`ember.plugin.HostShimCompiler`): `blockIdx`/`threadIdx` are thread-local globals that a generated launcher sets
while it loops over every block and thread of the grid; `__syncthreads` is the shim's block barrier; `cuda_fp16.h` is
replaced by a header that maps `half` to the compiler's `_Float16`. The launcher reads the kernel arguments from a
parameter block laid out like the CUDA ABI's (`kernel_arg_layout`), which is what the MOCK GPU finds in memory behind a
QMD.
"""
from __future__ import annotations
import ctypes
import functools
import glob
import importlib.util
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from ember.plugin import CompileError, Compiler, HostShimCompiler, Renderer, ShimDialect
from ember_nv.renderer import DEFAULT_ARCH, parse_arch

def _numbered(src: str) -> str: return "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(src.splitlines()))

def _toolkit_dirs() -> list[str]:
  roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
  return [r for r in roots if r and os.path.isdir(r)]

def wheel_files(*parts: str) -> list[str]:
  """Files matching `nvidia/*/<parts>` in the NVIDIA pip wheels (the `nvidia` namespace package), if installed."""
  spec = importlib.util.find_spec("nvidia")
  roots = list(spec.submodule_search_locations or []) if spec is not None else []
  return [p for root in roots for p in glob.glob(os.path.join(root, "*", *parts))]

def cuda_include_dirs() -> list[str]:
  """Directories holding cuda_fp16.h (kernels with half include it): the NVIDIA wheels', then the toolkit's."""
  dirs = [os.path.dirname(p) for p in wheel_files("include", "cuda_fp16.h")]
  toolkit = [os.path.join(root, "include") for root in _toolkit_dirs()]
  return dirs + [d for d in toolkit if os.path.exists(os.path.join(d, "cuda_fp16.h"))]

def nvrtc_candidates() -> list[str]:
  """Where libnvrtc may be, most specific first: the pip wheel, the toolkit, then the plain soname."""
  found = sorted(wheel_files("lib", "libnvrtc.so*"), reverse=True)
  for root in _toolkit_dirs():
    found += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so*")), reverse=True)
  found = [f for f in found if "builtins" not in os.path.basename(f) and "alt" not in os.path.basename(f)]
  return found + ["libnvrtc.so"]

@functools.cache
def load_nvrtc() -> ctypes.CDLL:
  """libnvrtc, or a CompileError that says how to install it."""
  errors = []
  for path in nvrtc_candidates():
    try: lib = ctypes.CDLL(path)
    except OSError as e:
      errors.append(f"{path}: {e}")
      continue
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                       ctypes.c_void_p, ctypes.c_void_p]
    lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    for fn in ("nvrtcGetProgramLogSize", "nvrtcGetPTXSize", "nvrtcGetCUBINSize"):
      getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    for fn in ("nvrtcGetProgramLog", "nvrtcGetPTX", "nvrtcGetCUBIN"):
      getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    return lib
  raise CompileError("NVRTC (libnvrtc.so) not found; install it with `pip install ember-backend-nv[nvrtc]` "
                     f"(the nvidia-cuda-nvrtc wheel) or install the CUDA toolkit. Tried: {'; '.join(errors)}")

def nvrtc_version() -> tuple[int, int]:
  lib, major, minor = load_nvrtc(), ctypes.c_int(), ctypes.c_int()
  lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
  return major.value, minor.value

def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
  if status != 0: raise CompileError(f"NVRTC {what} failed: {lib.nvrtcGetErrorString(status).decode()}")

def _get(lib: ctypes.CDLL, prog: ctypes.c_void_p, size_fn: str, data_fn: str) -> bytes:
  size = ctypes.c_size_t()
  _check(lib, getattr(lib, size_fn)(prog, ctypes.byref(size)), size_fn)
  buf = ctypes.create_string_buffer(size.value)
  _check(lib, getattr(lib, data_fn)(prog, buf), data_fn)
  return buf.raw

def nvrtc_compile(src: str, arch: str, output: str = "cubin", name: str = "kernel.cu") -> bytes:
  """Compile CUDA C with NVRTC for `arch` (`sm_XX`); `output` is "cubin" or "ptx". Errors quote the source lines."""
  lib = load_nvrtc()
  prog = ctypes.c_void_p()
  _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None), "create")
  try:
    target = arch if output == "cubin" else arch.replace("sm_", "compute_")
    opts = [f"--gpu-architecture={target}".encode(), b"-std=c++17", b"--fmad=false"]
    opts += [f"-I{d}".encode() for d in cuda_include_dirs()]
    copts = (ctypes.c_char_p * len(opts))(*opts)
    status = lib.nvrtcCompileProgram(prog, len(opts), copts)
    if status != 0:
      log = _get(lib, prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog").rstrip(b"\0").decode(errors="replace")
      hint = ""
      if "cuda_fp16.h" in log and not cuda_include_dirs():
        hint = "\nfix: kernels with half include cuda_fp16.h; install the CUDA toolkit headers or set CUDA_HOME\n"
      raise CompileError(f"NVRTC rejected a kernel for {arch}:\n{log}{hint}\nsource:\n{_numbered(src)}")
    if output == "ptx": return _get(lib, prog, "nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0")
    return _get(lib, prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
  finally:
    lib.nvrtcDestroyProgram(ctypes.byref(prog))

class NVRTCCompiler(Compiler):
  """CUDA C -> cubin for one `sm_XX` with NVRTC; `ptx=True` stops at PTX (for the driver to JIT)."""
  def __init__(self, arch: str = DEFAULT_ARCH, ptx: bool = False) -> None:
    parse_arch(arch)
    self.arch, self.output = arch, "ptx" if ptx else "cubin"
    self.binary_format = self.output
    major, minor = nvrtc_version()
    super().__init__(f"compile_nvrtc_{major}_{minor}_{arch}_{self.output}")
  def compile(self, src: str) -> bytes: return nvrtc_compile(src, self.arch, self.output)

def find_ptxas() -> str | None:
  """ptxas from the CUDA toolkit or PATH, or None."""
  for root in _toolkit_dirs():
    if os.path.exists(path := os.path.join(root, "bin", "ptxas")): return path
  return shutil.which("ptxas")

@functools.cache
def _ptxas_version(ptxas: str) -> str:
  out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=30).stdout
  return out.strip().splitlines()[-1]

class PTXCompiler(Compiler):
  """PTX text -> cubin for one `sm_XX` with ptxas."""
  binary_format = "cubin"
  def __init__(self, arch: str = DEFAULT_ARCH) -> None:
    parse_arch(arch)
    if (ptxas := find_ptxas()) is None:
      raise CompileError("ptxas not found (looked in $CUDA_HOME/bin, /usr/local/cuda/bin and PATH); install the CUDA "
                         "toolkit, or use DEV=NV:CUDA (NVRTC)")
    self.arch, self.ptxas = arch, ptxas
    super().__init__(f"compile_ptxas_{arch}_{hashlib.sha256(_ptxas_version(ptxas).encode()).hexdigest()[:12]}")
  def compile(self, src: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="ember_ptx_") as tmp:
      out = os.path.join(tmp, "kernel.cubin")
      inp = os.path.join(tmp, "kernel.ptx")
      with open(inp, "w") as f: f.write(src)
      try: proc = subprocess.run([self.ptxas, f"-arch={self.arch}", "-o", out, inp], capture_output=True, timeout=300)
      except (OSError, subprocess.SubprocessError) as e: raise CompileError(f"running {self.ptxas} failed: {e}") from e
      if proc.returncode != 0:
        raise CompileError(f"ptxas rejected a kernel for {self.arch}:\n{proc.stderr.decode(errors='replace')}\n"
                           f"source:\n{_numbered(src)}")
      with open(out, "rb") as f: return f.read()

# ** the host shim (MOCK+NV) **

SHIM_HEADER = r"""
struct ember_uint3 { unsigned int x, y, z; };
static thread_local ember_uint3 blockIdx, threadIdx, blockDim, gridDim;
#define __forceinline__ inline
#define __restrict__ __restrict
#define __syncthreads() ember_sync()
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int mask) { return ember_shuffle_xor(v, mask); }
template <typename D, typename S> static inline D ember_bits(S x) { D r; memcpy(&r, &x, sizeof(r)); return r; }
static inline float __int_as_float(int x) { return ember_bits<float>(x); }
static inline int __float_as_int(float x) { return ember_bits<int>(x); }
static inline float __uint_as_float(unsigned int x) { return ember_bits<float>(x); }
static inline unsigned int __float_as_uint(float x) { return ember_bits<unsigned int>(x); }
static inline double __longlong_as_double(long long x) { return ember_bits<double>(x); }
static inline long long __double_as_longlong(double x) { return ember_bits<long long>(x); }
"""

def _mma_wrapper(name: str, arg_type: str) -> str:
  a = ", ".join(f"{arg_type} a{i}" for i in range(8))
  b = ", ".join(f"{arg_type} b{i}" for i in range(4))
  return (f"static inline void __ember_wmma_{name}(float* d, {a}, {b}) {{\n"
          f"  const float a[8] = {{{', '.join(f'(float)a{i}' for i in range(8))}}};\n"
          f"  const float b[4] = {{{', '.join(f'(float)b{i}' for i in range(4))}}};\n"
          "  ember_mma_m16n8k16(d, a, b);\n}\n")

SHIM_HEADER += r"""
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16} for a warp of host threads (the threaded launcher runs a block's
// threads together): each lane writes its fragment elements into its warp's A (16x16) and B (16x8) tiles where the PTX
// ISA puts them (groupID = lane >> 2, threadID_in_group = lane % 4; A: row groupID (+8 for a2,a3,a6,a7), col
// 2*threadID_in_group + (i & 1) (+8 for a4..a7); B: row 2*threadID_in_group + (i & 1) (+8 for b2,b3), col groupID),
// the block syncs, and each lane computes its D elements (row groupID (+8 for d2,d3), col 2*threadID_in_group +
// (i & 1)) with exact products and float sums; a second sync lets the tiles be reused.
static float ember_mma_a[32][16][16], ember_mma_b[32][16][8];
static inline void ember_mma_m16n8k16(float* d, const float* a, const float* b) {
  unsigned lane = ember_tid % 32, warp = ember_tid / 32, group = lane >> 2, tig = lane % 4;
  for (unsigned i = 0; i < 8; i++)
    ember_mma_a[warp][group + ((i >> 1) & 1) * 8][tig * 2 + (i & 1) + (i >> 2) * 8] = a[i];
  for (unsigned i = 0; i < 4; i++) ember_mma_b[warp][tig * 2 + (i & 1) + (i >> 1) * 8][group] = b[i];
  ember_rendezvous();
  for (unsigned i = 0; i < 4; i++) {
    unsigned row = group + (i >> 1) * 8, col = tig * 2 + (i & 1);
    float sum = 0.0f;
    for (unsigned k = 0; k < 16; k++) sum += ember_mma_a[warp][row][k] * ember_mma_b[warp][k][col];
    d[i] = sum;
  }
  ember_rendezvous();
}
""" + _mma_wrapper("mma_m16n8k16_f16_f32", "_Float16") + _mma_wrapper("mma_m16n8k16_bf16_f32", "float")

FP16_HEADER = r"""
typedef _Float16 half;
static inline half __float2half(float x) { return (half)x; }
static inline float __half2float(half x) { return (float)x; }
static inline short __half_as_short(half x) { return ember_bits<short>(x); }
static inline half __short_as_half(short x) { return ember_bits<half>(x); }
static inline unsigned short __half_as_ushort(half x) { return ember_bits<unsigned short>(x); }
static inline half __ushort_as_half(unsigned short x) { return ember_bits<half>(x); }
"""

NV_SHIM = ShimDialect("NV", "CUDARenderer", 'extern "C" __global__ void ', SHIM_HEADER,
                      "blockIdx = {bx, by, bz}; threadIdx = {tx, ty, tz};",
                      "gridDim = {gx, gy, gz}; blockDim = {lx, ly, lz};", (("cuda_fp16.h", FP16_HEADER),),
                      sync_markers=("__shared__", "__syncthreads", "__shfl", "__ember_wmma_"))
"""CUDA C on the host: `blockIdx`/`threadIdx`/`blockDim`/`gridDim` are the shim's thread-local globals, cuda_fp16.h is
`FP16_HEADER`; kernels with shared memory, barriers, shuffles or matrix instructions run a block's threads together."""

def kernel_signature(src: str) -> tuple[str, list[str]]:
  """The name and the parameter types of the (single) kernel in CUDARenderer output."""
  return NV_SHIM.signature(src)

def shim_launcher(src: str, symbol: str = "ember_launch") -> str:
  """C++ that runs the kernel over a grid: `symbol(params, grid xyz, block xyz)`; each argument is read from the
  parameter block at its offset, every argument aligned to its own size."""
  return NV_SHIM.launcher(src, symbol)

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

class NVShimCompiler(HostShimCompiler):
  """CUDA C (CUDARenderer output) -> a host shared object through the shim header and g++/clang++ (MOCK+NV)."""
  def __init__(self, cxx: str | None = None) -> None: super().__init__(NV_SHIM, cxx)

class NVShimBundleCompiler(NVShimCompiler):
  """A `shim_bundle` translation unit (launchers included) -> one shared object; `compile_cached` keeps it on disk."""
  def __init__(self, cxx: str | None = None) -> None:
    super().__init__(cxx)
    self.cachekey = f"{self.cachekey}_bundle"
  def compile(self, src: str) -> bytes: return self.build(src)

def cuda_compiler(renderer: Renderer, interface: str) -> Compiler:
  """The compiler for CUDARenderer output on the NV device: the host shim on MOCK+NV (it runs the kernels on the host
  and needs no NVRTC), NVRTC on the hardware interface."""
  return NVShimCompiler() if interface.startswith("MOCK") else NVRTCCompiler(renderer.arch)
