"""The Metal runtime on real hardware: these run only on a Mac with a Metal GPU (the macOS CI job) and skip elsewhere.
Results are compared with the PYTHON reference device on the same inputs."""
from __future__ import annotations
import numpy as np
import pytest
from ember_metal.device import probe_metal

PROBED = probe_metal()
pytestmark = pytest.mark.skipif(not PROBED.ok, reason=f"no Metal device here: {PROBED.reason}")

@pytest.fixture(scope="module")
def metal() -> str:
  """The device string; the backend is found through its installed entry point (the nox session installs it)."""
  from ember.device import Device
  Device["METAL"]
  return "METAL"

@pytest.mark.parametrize("kernel", ["elementwise", "reduce", "movement", "gated_pad", "matmul"])
@pytest.mark.parametrize("dtype_name", ["float32", "float16", "int32", "bfloat16"])
def test_corpus_matches_python(metal: str, kernel: str, dtype_name: str) -> None:
  from ember.dtype import to_dtype
  from ember.testing import KERNEL_CORPUS, assert_matches
  dt = to_dtype(dtype_name)
  assert_matches(KERNEL_CORPUS[kernel](metal, dt), KERNEL_CORPUS[kernel]("PYTHON", dt), f"{kernel} {dt!r}",
                 computed_in=dt)

def test_a_large_grid_and_nan_max(metal: str) -> None:
  from ember.tensor import Tensor
  x = np.random.default_rng(0).standard_normal((300, 70)).astype(np.float32)
  x[5, 5] = np.nan
  out = (Tensor(x, device=metal).exp() * 2).max(1).numpy()
  want = (np.exp(x) * 2).max(1)
  np.testing.assert_allclose(out, want, rtol=2e-5, equal_nan=True)

def test_kernel_time_and_zero_copy(metal: str) -> None:
  from ember.device import Device
  from ember.engine.realize import get_runner
  from ember.tensor import Tensor
  t = Tensor(np.arange(4096, dtype=np.float32), device=metal) + 1
  (item,) = [it for it in t.schedule() if it.kind == "kernel"]
  runner = get_runner(metal, item.ast)
  elapsed = runner(item.bufs, {}, wait=True)
  assert elapsed is not None and 0 < elapsed < 10
  view = item.bufs[0].as_buffer()
  assert view is not None
  np.testing.assert_array_equal(np.frombuffer(view, np.float32), np.arange(4096, dtype=np.float32) + 1)
  assert Device[metal].allocator is not None

def test_a_compile_error_is_typed(metal: str) -> None:
  from ember.device import Device
  from ember.plugin import CompileError
  compiler = Device[metal].compiler
  assert compiler is not None
  with pytest.raises(CompileError, match="Metal rejected a kernel"): compiler.compile("kernel void broken( {")

def test_jit_replays_through_an_indirect_command_buffer(metal: str) -> None:
  from ember import TinyJit
  from ember.tensor import Tensor
  from ember_metal.device import MetalGraph
  @TinyJit
  def f(a: Tensor, b: Tensor) -> Tensor:
    return ((a @ b).relu() + a.sum()).contiguous()
  rng = np.random.default_rng(4)
  for _ in range(5):
    a, b = rng.standard_normal((9, 7)).astype(np.float32), rng.standard_normal((7, 5)).astype(np.float32)
    out = f(Tensor(a, device=metal).realize(), Tensor(b, device=metal).realize())
    np.testing.assert_allclose(out.numpy(), np.maximum(a @ b, 0) + a.sum(), rtol=1e-4, atol=1e-4)
  assert isinstance(f.graph, MetalGraph) and len(f.graph.commands) == len(f.captured)

def test_the_compiler_output_loads(metal: str) -> None:
  """A metallib from `xcrun metal` when Xcode's Metal toolchain is installed, else checked source; both run."""
  from ember.device import Device
  from ember.engine.realize import get_runner
  from ember.tensor import Tensor
  from ember_metal.compiler import MetalCompiler, unpack_program
  compiler = Device[metal].compiler
  assert isinstance(compiler, MetalCompiler)
  t = Tensor(np.arange(300, dtype=np.float32), device=metal).sqrt() * 3
  (item,) = [it for it in t.schedule() if it.kind == "kernel"]
  runner = get_runner(metal, item.ast)
  src, metallib = unpack_program(runner.lib)
  assert src == runner.spec.src and (metallib is not None) == compiler.toolchain.available()
  runner(item.bufs, {}, wait=True)
  np.testing.assert_allclose(item.bufs[0].numpy(), np.sqrt(np.arange(300, dtype=np.float32)) * 3, rtol=1e-6)
