"""The Metal runtime on real hardware: these run only on a Mac with a Metal GPU (the macOS CI job) and skip elsewhere.
Results are compared with the PYTHON reference device on the same inputs."""
from __future__ import annotations
import numpy as np
import pytest
from ember_metal.device import probe

usable, reason = probe()
pytestmark = pytest.mark.skipif(not usable, reason=f"no Metal device here: {reason}")

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
