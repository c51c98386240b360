"""The HIP-style C of every corpus kernel, built for the host through the shim, matches the PYTHON reference device."""
from __future__ import annotations
import numpy as np
import pytest
from ember.dtype import dtypes
from ember.testing import KERNEL_CORPUS, tolerance
from amd_kernels import EMULATED, CORPUS_DTYPES, corpus_tensor, run_on_shim

@pytest.mark.parametrize("dt", CORPUS_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("name", list(KERNEL_CORPUS))
def test_corpus_kernel_runs_like_python(name: str, dt) -> None:
  t = corpus_tensor(name, dt)
  got = run_on_shim(t)
  want = t.numpy()  # PYTHON realises the same graph
  rtol, atol = max(tolerance(t.dtype), tolerance(dt))  # emulated dtypes compute their intermediates in float32
  if dt in EMULATED:  # the reference rounds every partial sum: cancellation leaves errors of the size of the terms
    atol = max(atol, rtol * float(np.nanmax(np.abs(want.astype(np.float64)))))
  np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)

def test_over_covering_grid_and_math() -> None:
  # 1000 elements: not a multiple of the workgroup, so the clamped tail threads run too; exp2/log2/sin decomposed
  from ember.tensor import Tensor
  x = np.random.default_rng(0).uniform(0.5, 4.0, 1000).astype(np.float32)
  t = (Tensor(x, device="PYTHON").exp2() + Tensor(x, device="PYTHON").log2() * Tensor(x, device="PYTHON").sqrt()
       + Tensor(x, device="PYTHON").sin())
  np.testing.assert_allclose(run_on_shim(t), np.exp2(x) + np.log2(x) * np.sqrt(x) + np.sin(x), rtol=1e-5, atol=1e-5)

def test_casts_between_dtypes() -> None:
  from ember.tensor import Tensor
  x = np.array([-3.75, -1.5, -0.25, 0.0, 0.5, 1.25, 2.5, 100.75], np.float32)
  for dt in (dtypes.int8, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.float64, dtypes.bool):
    got = run_on_shim(Tensor(x, device="PYTHON").cast(dt))
    np.testing.assert_array_equal(got, x.astype(np.float64).astype(np.dtype(dt.fmt)), err_msg=dt.name)
