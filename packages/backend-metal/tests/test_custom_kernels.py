"""Hand-written kernels (examples/custom_*.py) rendered by MetalRenderer and run on the host through the MSL shim
(threadgroup memory, barriers and every thread of a threadgroup on its own host thread), against numpy."""
from __future__ import annotations
import tempfile
from pathlib import Path
import numpy as np
import pytest
from ember.codegen import get_program
from ember.tensor_ops.custom import _named
from ember.testing.custom_kernels import example_kernels, placeholders
from ember_metal.renderer import MetalRenderer
import msl_shim

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
pytestmark = [pytest.mark.skipif(msl_shim.find_cxx() is None, reason="the MSL shim needs g++ or clang++ on PATH"),
              pytest.mark.skipif(not EXAMPLES.is_dir(), reason=f"{EXAMPLES} is absent (examples/ is at the root)")]

def test_example_kernels_match_numpy_on_the_msl_shim() -> None:
  renderer = MetalRenderer()
  cases = example_kernels(EXAMPLES)
  specs = [get_program(_named(fxn(*placeholders(bufs)), fxn), renderer) for _, fxn, bufs, _ in cases]
  assert any("threadgroup_barrier" in s.src for s in specs)  # the tiled matmul stages its tiles in threadgroup memory
  with tempfile.TemporaryDirectory(prefix="ember_msl_custom_") as tmp:
    lib = msl_shim.build(specs, renderer, tmp)
    for i, (name, _, bufs, expected) in enumerate(cases):
      run_bufs = [b.copy() for b in bufs]
      lib.run(i, run_bufs)
      np.testing.assert_allclose(run_bufs[0], expected, rtol=1e-5, atol=1e-5, err_msg=name)
