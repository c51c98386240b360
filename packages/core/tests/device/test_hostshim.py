"""The host shim's workgroup emulation checks shared memory like a GPU's race detector would: a kernel missing a
barrier, reading shared memory its workgroup never wrote or indexing a shared array out of bounds raises, and the same
kernel with its barriers runs and computes what numpy does."""
from __future__ import annotations
import ctypes
import shutil
import numpy as np
import pytest
from ember.device.hostshim import HostKernel, HostShimCompiler, SharedMemoryError, ShimDialect, check_shared
from ember.errors import DeviceError

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                                reason="the host shim needs g++ or clang++")

DIALECT = ShimDialect("TEST", "test kernels", 'extern "C" __global__ void ',
                      "static thread_local unsigned tid, bid;\n#define __syncthreads() ember_sync()\n",
                      "tid = tx; bid = bx;")

# block b reverses its 64 inputs through shared memory, then adds its neighbour's input of the reversed order in a
# second round over the same array: two barriers per round, four places a missing one shows
REVERSE = """extern "C" __global__ void reverse(float* out, const float* in) {
  __shared__ float tile[64];
  for (int round = 0; round < 2; round++) {
    tile[tid] = in[bid * 64 + tid] * (round + 1);
    __syncthreads();  // B1
    float v = tile[63 - tid] + tile[(tid + 1) % 64];
    __syncthreads();  // B2
    out[(bid * 2 + round) * 64 + tid] = v;
  }
}
"""

def _run(src: str, blocks: int = 3) -> np.ndarray:
  x = np.random.default_rng(0).standard_normal(blocks * 64).astype(np.float32)
  out = np.zeros(blocks * 2 * 64, np.float32)
  kernel = HostKernel(HostShimCompiler(DIALECT).compile(src))
  params = np.array([out.ctypes.data, x.ctypes.data], np.uint64).tobytes()
  kernel.run(params, (blocks, 1, 1), (64, 1, 1))
  return out

def _oracle(blocks: int = 3) -> np.ndarray:
  x = np.random.default_rng(0).standard_normal(blocks * 64).astype(np.float32).reshape(blocks, 64)
  rounds = [(x * r)[:, ::-1] + np.roll(x * r, -1, axis=1) for r in (1, 2)]
  return np.stack(rounds, axis=1).reshape(-1)

def test_kernel_with_its_barriers_runs() -> None:
  np.testing.assert_allclose(_run(REVERSE), _oracle(), rtol=1e-6)

@pytest.mark.parametrize("barrier", ["B1", "B2"])
def test_a_removed_barrier_is_detected(barrier: str) -> None:
  """B1 missing: a thread reads an element another thread writes between the same barriers; B2 missing: the next
  round overwrites an element another thread still reads (the write-after-read a loop's trailing barrier prevents)."""
  src = REVERSE.replace(f"__syncthreads();  // {barrier}", "")
  with pytest.raises(SharedMemoryError, match=r"race: tile\[\d+\] is .* between the same two barriers") as err:
    _run(src)
  assert isinstance(err.value, DeviceError) and isinstance(err.value, RuntimeError)

def test_read_of_unwritten_shared_memory_is_detected() -> None:
  """Block 1 reads what block 0 left in the array (on a GPU: whatever its SM's shared memory held)."""
  src = REVERSE.replace("tile[tid] = in[bid * 64 + tid] * (round + 1);",
                        "if (bid == 0) tile[tid] = in[bid * 64 + tid] * (round + 1);")
  with pytest.raises(SharedMemoryError, match="no thread of its workgroup wrote it"): _run(src)

def test_out_of_bounds_shared_index_is_detected() -> None:
  with pytest.raises(SharedMemoryError, match=r"tile\[64\] is out of bounds .*64 elements"):
    _run(REVERSE.replace("tile[(tid + 1) % 64]", "tile[tid + 1]"))

def test_a_launch_after_an_error_starts_clean() -> None:
  """The error is taken by the launch that raised it: the next launch of a correct build reports nothing."""
  with pytest.raises(SharedMemoryError): _run(REVERSE.replace("__syncthreads();  // B1", ""))
  np.testing.assert_allclose(_run(REVERSE), _oracle(), rtol=1e-6)

def test_check_shared_rewrites_only_array_declarations() -> None:
  src = "__shared__ unsigned int t0[8];\n__shared__ float a[4], b[4];\n#define __shared__ x\n"
  assert check_shared(src).splitlines() == ['__shared__ ember_shared<unsigned int, 8> t0{"t0"};',
                                            "__shared__ float a[4], b[4];", "#define __shared__ x"]
  assert check_shared("threadgroup half t[2];", "threadgroup") == 'threadgroup ember_shared<half, 2> t{"t"};'

def test_unthreaded_builds_report_nothing() -> None:
  src = 'extern "C" __global__ void twice(float* out) { out[bid * 4 + tid] = 2.0f; }\n'
  out = np.zeros(8, np.float32)
  HostKernel(HostShimCompiler(DIALECT).compile(src)).run(np.array([out.ctypes.data], np.uint64).tobytes(), (2, 1, 1),
                                                         (4, 1, 1))
  np.testing.assert_array_equal(out, 2.0)
  assert ctypes.sizeof(ctypes.c_void_p) == 8
