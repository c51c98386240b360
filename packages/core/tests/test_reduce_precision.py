"""Long float sums accumulate in chunks (Tensor._chunked_sum), so ones(n).sum() is exact while n fits float32's
integers and the error of long sums grows like log n, not n (ones(2**31+8).sum() gave 134217728 = 8 * 2**24: each
float32 accumulator stalls at 2**24). numpy in float64 is the oracle."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor
from ember.tensor import SUM_CHUNK_MIN

DEVICE = "PYTHON"

@pytest.mark.parametrize("n", [SUM_CHUNK_MIN + 1, 2 ** 24 - 1, 2 ** 24, 2 ** 24 + 7])
def test_ones_sum_is_the_count_rounded_once(n: int) -> None:
  assert Tensor.ones(n, device=DEVICE).sum().item() == float(np.float32(n))  # n itself up to 2**24

def test_ones_sum_over_an_axis_and_a_mean() -> None:
  n = 2 ** 24 + 2
  got = Tensor.ones(2, n // 2, device=DEVICE).permute(1, 0).sum(0).numpy()
  np.testing.assert_array_equal(got, np.full(2, n // 2, np.float32))
  assert Tensor.full((n,), 3.0, device=DEVICE).mean().item() == 3.0

def test_long_random_sums_are_much_closer_than_naive_ones() -> None:
  rng = np.random.default_rng(0)
  u = rng.uniform(0, 1, 2 ** 22).astype(np.float32)
  exact = u.astype(np.float64).sum()
  naive = abs(float(np.cumsum(u, dtype=np.float32)[-1]) - exact) / exact  # one float32 accumulator: ~1e-5
  got = abs(Tensor(u, device=DEVICE).sum().item() - exact) / exact
  assert got < 1e-6 and got < naive / 20, (got, naive)
  x = rng.standard_normal((3, 2 ** 20)).astype(np.float32)
  err = np.abs(Tensor(x, device=DEVICE).sum(1).numpy() - x.astype(np.float64).sum(1)) / np.abs(x).sum(1)
  assert (err < 1e-7).all(), err

def test_chunked_sum_has_gradients() -> None:
  x = Tensor.ones(SUM_CHUNK_MIN + 5, device=DEVICE, requires_grad=True)
  (x * 2).sum().backward()
  assert x.grad is not None
  np.testing.assert_array_equal(x.grad.numpy(), np.full(SUM_CHUNK_MIN + 5, 2, np.float32))
