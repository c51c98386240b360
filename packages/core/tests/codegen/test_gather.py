"""Tensor indexing by an index tensor is a one-hot reduction in the graph; codegen collapses it to one guarded load,
so its cost grows with the output, not with the size of the indexed dimension."""
import numpy as np
import pytest
from ember import Tensor, Device
from ember.codegen import get_program
from ember.dtype import dtypes
from ember.uop.ops import Ops

def _programs(t: Tensor, device: str = "PYTHON"):
  kernels = [it for it in t.schedule() if it.kind == "kernel"]
  return [get_program(it.ast, Device[device].renderer, device) for it in kernels]

@pytest.mark.parametrize("rows", [64, 4096])
def test_row_gather_work_does_not_grow_with_rows(rows: int) -> None:
  x = Tensor(np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)).realize()
  idx = Tensor(np.array([3, 0, 7, 5, 63, 1, 2, 9], np.int32)).realize()
  specs = _programs(x[idx])
  ops = sum(s.estimates.ops for s in specs)
  # a gather of 8 rows of 16 floats: a few ops per output element, whatever `rows` is (one-hot: 2 * 8 * 16 * rows)
  assert ops <= 8 * 16 * 16, (rows, ops)
  assert not any(u.op is Ops.RANGE and u.src[0].op is Ops.CONST and u.src[0].arg == rows for s in specs
                 for u in s.uops), "the one-hot range over the indexed dimension survived"

@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_gather_values_with_negative_and_repeated_indices(dtype) -> None:
  rng = np.random.default_rng(0)
  xn = rng.integers(-50, 50, size=(300, 5)).astype(dtype)
  ind = rng.integers(-300, 300, size=(7, 3)).astype(np.int32)
  ind[0, 0] = ind[0, 1] = 4
  np.testing.assert_array_equal(Tensor(xn)[Tensor(ind)].numpy(), xn[ind])
  np.testing.assert_array_equal(Tensor(xn)[:, Tensor(ind[0] % 5)].numpy(), xn[:, ind[0] % 5])

def test_gather_of_a_computed_tensor_and_its_gradient() -> None:
  xn = np.random.default_rng(1).standard_normal((50, 4)).astype(np.float32)
  ind = np.array([1, 1, 49, 0], np.int32)
  x = Tensor(xn, requires_grad=True)
  y = (x.exp() * 2)[Tensor(ind)]
  np.testing.assert_allclose(y.numpy(), (np.exp(xn) * 2)[ind], rtol=1e-6)
  y.sum().backward()
  expect = np.zeros_like(xn)
  np.add.at(expect, ind, np.exp(xn[ind]) * 2)
  np.testing.assert_allclose(x.grad.numpy(), expect, rtol=1e-5)

def test_bool_gather_and_max_identity() -> None:
  xn = np.array([[True, False], [False, False], [True, True]])
  ind = np.array([2, 0, 1], np.int32)
  np.testing.assert_array_equal(Tensor(xn)[Tensor(ind)].numpy(), xn[ind])
  assert Tensor(xn)[Tensor(ind)].dtype is dtypes.bool
