"""The CUDA C of every corpus kernel, built for the host through the shim, matches the PYTHON reference device."""
from __future__ import annotations
import pytest
from ember.dtype import dtypes
from ember.testing import KERNEL_CORPUS
from ember.testing.hostshim import (GROUP_CASES, check_casts, check_corpus_kernel, check_group_case,
                                    check_over_covering_math)
from nv_kernels import CORPUS_DTYPES, run_on_shim
from ember_nv.renderer import CUDARenderer

@pytest.mark.parametrize("dt", CORPUS_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(KERNEL_CORPUS))
def test_corpus_kernel_runs_like_python(name: str, dt) -> None: check_corpus_kernel(name, dt, run_on_shim)

def test_over_covering_grid_and_math() -> None: check_over_covering_math(run_on_shim)

def test_casts_between_dtypes() -> None:
  check_casts(run_on_shim, (dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.float64,
                            dtypes.bool))

@pytest.mark.parametrize("name", list(GROUP_CASES))
def test_group_reductions_run_like_python(name: str) -> None:
  """Shared memory, __syncthreads and __shfl_xor_sync, with a block's threads on host threads."""
  check_group_case(name, CUDARenderer(), run_on_shim)
