"""Kernels of little work compile at gcc's -O1 with its vectorisers (ember_cpu.renderer.SMALL_KERNEL_OPS): what the C
source asks for, and results against numpy / torch (the command line's float flags still hold under the attribute)."""
from __future__ import annotations
import numpy as np
import torch
from ember import Tensor
from ember.device import Device

def _src(out: Tensor) -> str:
  from ember.codegen import get_program
  return get_program(out.schedule()[-1].ast, Device["CPU"].renderer).src

def test_small_elementwise_not_contracted() -> None:
  """x*y + z of a (16, 10) kernel at -O1 still rounds the product before the add (-ffp-contract=off): equal to
  numpy's float32 arithmetic bit for bit, where a fused multiply-add differs in the last bit for most of these."""
  rng = np.random.default_rng(3)
  x, y, z = (rng.standard_normal((16, 10)).astype(np.float32) for _ in range(3))
  out = Tensor(x) * Tensor(y) + Tensor(z)
  assert 'optimize("O1", "tree-vectorize")' in _src(out)
  want = x * y + z
  fused = (x.astype(np.float64) * y + z).astype(np.float32)
  assert (fused != want).any()  # the test tells contraction apart
  np.testing.assert_array_equal(out.numpy(), want)

def test_small_reductions_match_torch() -> None:
  """A bias gradient's column sum (256, 10) and a row max at -O1, against torch."""
  x = np.random.default_rng(4).standard_normal((256, 10)).astype(np.float32)
  s, m = Tensor(x).sum(0), Tensor(x).max(1)
  assert 'optimize("O1"' in _src(s) and 'optimize("O1"' in _src(m)
  np.testing.assert_allclose(s.numpy(), torch.from_numpy(x).sum(0).numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(m.numpy(), torch.from_numpy(x).max(1).values.numpy())

def test_large_kernels_stay_at_o3() -> None:
  """A (1024, 1024) add and a 128^3 matmul keep the command line's -O3 (no attribute)."""
  rng = np.random.default_rng(5)
  a, b = (rng.standard_normal((1024, 1024)).astype(np.float32) for _ in range(2))
  out = Tensor(a) + Tensor(b)
  assert "optimize(" not in _src(out)
  np.testing.assert_array_equal(out.numpy(), a + b)
  p, q = (rng.standard_normal((128, 128)).astype(np.float32) for _ in range(2))
  mm = Tensor(p) @ Tensor(q)
  assert "optimize(" not in _src(mm)
  np.testing.assert_allclose(mm.numpy(), (torch.from_numpy(p) @ torch.from_numpy(q)).numpy(), rtol=1e-4, atol=1e-4)
