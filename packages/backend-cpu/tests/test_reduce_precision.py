"""Long float sums on both CPU renderers: ones(n).sum() is exact while n fits float32's integers (ones(2**31+8).sum()
gave 134217728 = 8 * 2**24 on DEV=CPU), and long random sums are far closer to numpy's float64 sum than one float32
accumulator gets."""
from __future__ import annotations
from typing import Iterator
import numpy as np
import pytest
from cpu_kernels import reopened_cpu
from ember import Tensor

@pytest.fixture(params=["CPU:C", "CPU:LLVM"])
def cpu(request: pytest.FixtureRequest) -> Iterator[str]:
  with reopened_cpu(request.param): yield "CPU"

def test_ones_sum_is_exact_up_to_2_24(cpu: str) -> None:
  for n in (2 ** 24, 2 ** 24 + 7, 3 * 2 ** 23 + 5):
    assert Tensor.ones(n, device=cpu).sum().item() == float(np.float32(n)), n
  got = Tensor.ones(2 ** 24 + 4, 2, device=cpu).sum(0).numpy()
  np.testing.assert_array_equal(got, np.full(2, 2 ** 24 + 4, np.float32))

def test_long_random_sum_error(cpu: str) -> None:
  u = np.random.default_rng(0).uniform(0, 1, 2 ** 22).astype(np.float32)
  exact = u.astype(np.float64).sum()
  naive = abs(float(np.cumsum(u, dtype=np.float32)[-1]) - exact) / exact
  got = abs(Tensor(u, device=cpu).sum().item() - exact) / exact
  assert got < 1e-6 and got < naive / 20, (got, naive)

def test_sum_of_more_ones_than_int32_counts() -> None:
  # the case (no buffer: ones is a constant); the exact count 2**31+8 rounds to float32 2**31, as torch gives
  assert Tensor.ones(2 ** 31 + 8, device="CPU").sum().item() == float(np.float32(2 ** 31 + 8))
