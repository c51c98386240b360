"""The HIP-style C of every corpus kernel, built for the host through the shim, matches the PYTHON reference device."""
from __future__ import annotations
import pytest
from ember.dtype import dtypes
from ember.testing import KERNEL_CORPUS
from ember.testing.hostshim import (GROUP_CASES, ShimRunner, check_casts, check_corpus_kernel, check_group_case,
                                    check_over_covering_math)
from amd_kernels import CORPUS_DTYPES, run_on_shim
from ember_amd.compiler import AMDShimCompiler
from ember_amd.renderer import HIPRenderer, kernarg_layout

@pytest.mark.parametrize("dt", CORPUS_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(KERNEL_CORPUS))
def test_corpus_kernel_runs_like_python(name: str, dt) -> None: check_corpus_kernel(name, dt, run_on_shim)

def test_over_covering_grid_and_math() -> None: check_over_covering_math(run_on_shim)

def test_casts_between_dtypes() -> None:
  check_casts(run_on_shim, (dtypes.int8, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.float64, dtypes.bool))

@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])  # wave32 and wave64
@pytest.mark.parametrize("name", list(GROUP_CASES))
def test_group_reductions_run_like_python(name: str, arch: str) -> None:
  """LDS, s_barrier and ds_bpermute, with a workgroup's threads on host threads."""
  runner = ShimRunner(lambda: HIPRenderer(arch), kernarg_layout, AMDShimCompiler)
  check_group_case(name, HIPRenderer(arch), runner.run)
