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
import re
from ember.plugin import HostKernel, ShimDialect, load_shim
from ember.plugin import HostShimCompiler as _HostShimCompiler

__all__ = ["SHIM_HEADER", "FP16_HEADER", "NV_SHIM", "kernel_signature", "shim_launcher", "bundle_symbol", "shim_bundle",
           "HostShimCompiler", "HostShimBundleCompiler", "HostKernel", "load_shim"]

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
  ember_sync();
  for (unsigned i = 0; i < 4; i++) {
    unsigned row = group + (i >> 1) * 8, col = tig * 2 + (i & 1);
    float sum = 0.0f;
    for (unsigned k = 0; k < 16; k++) sum += ember_mma_a[warp][row][k] * ember_mma_b[warp][k][col];
    d[i] = sum;
  }
  ember_sync();
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

class HostShimCompiler(_HostShimCompiler):
  """CUDA C (CUDARenderer output) -> a host shared object through the shim header and g++/clang++."""
  def __init__(self, cxx: str | None = None) -> None: super().__init__(NV_SHIM, cxx)

class HostShimBundleCompiler(HostShimCompiler):
  """A `shim_bundle` translation unit (launchers included) -> one shared object; `compile_cached` keeps it on disk."""
  def __init__(self, cxx: str | None = None) -> None:
    super().__init__(cxx)
    self.cachekey = f"{self.cachekey}_bundle"
  def compile(self, src: str) -> bytes: return self.build(src)
