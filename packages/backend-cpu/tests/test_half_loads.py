"""Half values read into float kernels: every one of the 65536 float16 bit patterns widened to float32 and float64 on
both CPU renderers gives numpy's value (NaNs stay NaNs with their sign). The C renderer widens half with integer and
float operations its compiler vectorises, not with C's `_Float16` conversion, which gcc 12 runs one value at a
time."""
from __future__ import annotations
from typing import Iterator
import numpy as np
import pytest
from cpu_kernels import reopened_cpu
from ember import Tensor
from ember.codegen import get_program
from ember.dtype import dtypes
from ember.testing.hostshim import selected_device

@pytest.fixture(params=["CPU:C", "CPU:LLVM"])
def cpu(request: pytest.FixtureRequest) -> Iterator[str]:
  with reopened_cpu(request.param): yield request.param

ALL_HALVES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)

@pytest.mark.parametrize("wide", [dtypes.float32, dtypes.float64])
def test_every_half_widens_exactly(cpu: str, wide: object) -> None:
  x = Tensor(ALL_HALVES, device="CPU")
  got = (x.cast(wide) * 1).numpy()  # * 1: a kernel that loads the halves, not a copy
  want = ALL_HALVES.astype(got.dtype)
  nan = np.isnan(want)
  np.testing.assert_array_equal(np.isnan(got), nan)
  np.testing.assert_array_equal(np.signbit(got[nan]), np.signbit(want[nan]))
  np.testing.assert_array_equal(got[~nan].view(np.uint8), want[~nan].view(np.uint8))  # exact, signed zeros too

def test_half_reductions_match_numpy(cpu: str) -> None:
  rng = np.random.default_rng(0)
  a = rng.standard_normal((96, 200)).astype(np.float16)
  b = rng.standard_normal((200,)).astype(np.float32)
  got = (Tensor(a, device="CPU").float() * Tensor(b, device="CPU")).sum(-1).numpy()
  np.testing.assert_allclose(got, (a.astype(np.float32) * b).sum(-1), rtol=1e-5, atol=1e-4)

def test_c_kernels_widen_half_from_its_bits() -> None:
  with selected_device("CPU:C", "CPU") as dev:
    t = Tensor(ALL_HALVES[:256].reshape(16, 16), device="CPU").float().sum(-1)
    ast = [it for it in t.schedule() if it.kind != "copy"][-1].ast
    src = get_program(ast, dev.renderer).src
  assert "_Float16" in src and "(float)" not in src, src
