"""Hand-written kernels (Tensor.custom_kernel, examples/custom_*.py) on MOCK+NV: GLOBAL and LOCAL ranges are the
grid's blocks and threads, LOCAL placeholders block-shared memory with barriers, REG placeholders registers; every
example kernel against numpy, and a kernel of one warp matrix instruction (UOp.wmma)."""
from __future__ import annotations
from pathlib import Path
import pytest
from ember.testing.custom_kernels import check_custom_kernels, check_wmma
from ember.testing.hostshim import selected_device

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

@pytest.mark.skipif(not EXAMPLES.is_dir(), reason=f"{EXAMPLES} is absent (examples/ lives at the repository root)")
def test_example_kernels_match_numpy_on_mock_nv() -> None:
  with selected_device("MOCK+NV", "NV"): check_custom_kernels("NV", EXAMPLES)

def test_wmma_tile_on_mock_nv() -> None:
  with selected_device("MOCK+NV", "NV"): check_wmma("NV")
