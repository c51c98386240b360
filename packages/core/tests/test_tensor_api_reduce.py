"""Creation helpers, reductions and scans of ember.Tensor against torch/numpy (values, dtypes, gradients)."""
from __future__ import annotations
import math
from typing import Any
import numpy as np
import pytest
from ember import Tensor, dtypes

torch = pytest.importorskip("torch")

from torch_oracle import check  # noqa: E402

rng = np.random.default_rng(0)
X = rng.standard_normal((3, 4, 5)).astype(np.float32)
INTS = rng.integers(-5, 5, (4, 6)).astype(np.int32)

# ** creation **
def test_like_constructors() -> None:
  t = Tensor(INTS)
  assert t.zeros_like().dtype == dtypes.int32 and t.zeros_like().numpy().tolist() == np.zeros_like(INTS).tolist()
  assert t.ones_like(dtype=dtypes.float16).dtype == dtypes.float16
  np.testing.assert_array_equal(Tensor(X).full_like(2.5).numpy(), np.full_like(X, 2.5))
  e = Tensor(X).empty_like()
  assert e.shape == X.shape and e.dtype == dtypes.float32

@pytest.mark.parametrize("start,stop,steps", [(0, 1, 5), (-3.5, 7.25, 11), (2, -2, 4), (1, 1, 1), (0, 1, 0)])
def test_linspace(start: float, stop: float, steps: int) -> None:
  ours = Tensor.linspace(start, stop, steps)
  assert ours.dtype == dtypes.float32
  np.testing.assert_allclose(ours.numpy(), torch.linspace(start, stop, steps).numpy(), rtol=1e-6, atol=1e-6)

@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(indexing: str) -> None:
  a, b, c = [1, 2], [3, 4, 5], [6, 7, 8, 9]
  ours = Tensor(a).meshgrid(Tensor(b), Tensor(c), indexing=indexing)
  want = torch.meshgrid(torch.tensor(a), torch.tensor(b), torch.tensor(c), indexing=indexing)
  for o, w in zip(ours, want): np.testing.assert_array_equal(o.numpy(), w.numpy())
  with pytest.raises(ValueError): Tensor(a).meshgrid(Tensor(b), indexing="yx")

def test_random_constructors_are_seeded_and_in_range() -> None:
  Tensor.manual_seed(3)
  r1 = Tensor.randint(200, low=-3, high=4).numpy()
  Tensor.manual_seed(3)
  assert (Tensor.randint(200, low=-3, high=4).numpy() == r1).all()
  assert r1.dtype == np.int32 and r1.min() >= -3 and r1.max() <= 3 and len(set(r1.tolist())) == 7
  u = Tensor.uniform(2000, low=-2.0, high=6.0).numpy()
  assert u.min() >= -2.0 and u.max() < 6.0 and abs(u.mean() - 2.0) < 0.25
  n = Tensor.normal(4000, mean=3.0, std=0.5).numpy()
  assert abs(n.mean() - 3.0) < 0.05 and abs(n.std() - 0.5) < 0.05
  g = Tensor.glorot_uniform(40, 60).numpy()
  assert np.abs(g).max() <= math.sqrt(6 / 100) and np.abs(g).max() > 0.8 * math.sqrt(6 / 100)
  s = Tensor.scaled_uniform(30, 30).numpy()
  assert np.abs(s).max() <= 1 / 30
  ku = Tensor.kaiming_uniform(50, 40, a=0.0).numpy()
  bound = math.sqrt(3) * math.sqrt(2) / math.sqrt(40)
  assert np.abs(ku).max() <= bound and abs(ku.std() - bound / math.sqrt(3)) < 0.03
  kn = Tensor.kaiming_normal(80, 50, a=0.0).numpy()
  assert abs(kn.std() - math.sqrt(2 / 50)) < 0.02
  assert Tensor.uniform(3, dtype=dtypes.float16).dtype == dtypes.float16
  with pytest.raises(ValueError): Tensor.randint(3, low=2, high=2)

# ** reductions **
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)])
@pytest.mark.parametrize("correction", [0, 1, 2])
def test_var_std(axis: Any, correction: int) -> None:
  dim = axis if axis is not None else None
  check(lambda t: t.var(axis, correction=correction), lambda t: torch.var(t, dim=dim, correction=correction), X)
  check(lambda t: t.std(axis, keepdim=True, correction=correction),
        lambda t: torch.std(t, dim=dim, correction=correction, keepdim=True), X)

def test_var_mean_std_mean() -> None:
  for ours, ref in ((Tensor.var_mean, torch.var_mean), (Tensor.std_mean, torch.std_mean)):
    a, b = ours(Tensor(X), 1, keepdim=True, correction=0)
    ra, rb = ref(torch.tensor(X), 1, keepdim=True, correction=0)
    np.testing.assert_allclose(a.numpy(), ra.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), rb.numpy(), rtol=1e-5, atol=1e-6)
  assert Tensor(INTS).var().dtype == dtypes.float32

@pytest.mark.parametrize("axis", [None, 0, 1])
def test_any_all(axis: Any) -> None:
  data = np.array([[0, 1, 0], [0, 0, 0], [2, 3, 4]], dtype=np.int32)
  for name in ("any", "all"):
    ours = getattr(Tensor(data), name)(axis, keepdim=axis is not None)
    want = getattr(np, name)(data, axis=axis, keepdims=axis is not None)
    assert ours.dtype == dtypes.bool
    np.testing.assert_array_equal(ours.numpy(), want)

@pytest.mark.parametrize("axis,keepdim", [(None, False), (0, False), (1, True), (-1, False)])
def test_argmax_argmin(axis: Any, keepdim: bool) -> None:
  data = np.array([[1, 5, 5, 0], [7, 7, 2, -1], [0, 0, 0, 0]], dtype=np.int32)
  fl = rng.standard_normal((3, 4)).astype(np.float32)
  for arr in (data, fl):
    for name in ("argmax", "argmin"):
      ours = getattr(Tensor(arr), name)(axis, keepdim)
      ref = getattr(torch.tensor(arr), name)
      want = ref(dim=axis, keepdim=keepdim) if axis is not None else ref()
      assert ours.dtype == dtypes.int32
      np.testing.assert_array_equal(ours.numpy(), want.numpy())
  assert Tensor([1.0, float("nan"), 3.0]).argmax().item() == 1

@pytest.mark.parametrize("axis,keepdim", [(None, False), (1, True), ((0, 2), False)])
def test_logsumexp(axis: Any, keepdim: bool) -> None:
  dim = axis if axis is not None else (0, 1, 2)
  check(lambda t: t.logsumexp(axis, keepdim), lambda t: torch.logsumexp(t, dim=dim, keepdim=keepdim), X * 30)
  np.testing.assert_allclose(Tensor([-math.inf, -math.inf]).logsumexp().numpy(), -np.inf)

# ** scans **
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum_cumprod_logcumsumexp(axis: int) -> None:
  small = (X * 0.9)[:, :3]
  check(lambda t: t.cumsum(axis), lambda t: torch.cumsum(t, axis), small)
  check(lambda t: t.cumprod(axis), lambda t: torch.cumprod(t, axis), small)
  check(lambda t: t.logcumsumexp(axis), lambda t: torch.logcumsumexp(t, axis), small * 20)
  check(lambda t: t.cumsum(axis), lambda t: torch.cumsum(t, axis), INTS[:, :3], dtype=np.int32)

@pytest.mark.parametrize("axis", [0, 1])
def test_cummax_cummin(axis: int) -> None:
  data = np.array([[1, 3, 2, 3, 0], [4, 4, 1, 5, 5], [0, 9, 9, -1, 2]], dtype=np.int32)
  fl = rng.standard_normal((3, 5)).astype(np.float32)
  for name in ("cummax", "cummin"):
    for arr in (data, fl):
      vals, idx = getattr(Tensor(arr), name)(axis)
      want = getattr(torch, name)(torch.tensor(arr), axis)
      np.testing.assert_array_equal(vals.numpy(), want.values.numpy())
      np.testing.assert_array_equal(idx.numpy(), want.indices.numpy())
      assert idx.dtype == dtypes.int32
    check(lambda t, op=name: getattr(t, op)(axis)[0], lambda t, op=name: getattr(torch, op)(t, axis).values, fl)

# ** regressions in the primitives **
def test_abs_of_negative_zero_is_positive() -> None:
  assert not np.signbit(Tensor([-0.0]).abs().numpy()).any()

def test_comparison_after_pow_with_nan_branch() -> None:
  # pow used to embed a NaN constant; its NaN value range folded `p > c` to a constant False
  p = Tensor([2.0, 3.0, -2.0]).pow(1 / 3)
  np.testing.assert_array_equal((p > 1e-12).numpy(), [True, True, False])
  check(lambda t: t.abs().pow(3.0).sum(-1, keepdim=True).pow(1 / 3).maximum(1e-12),
        lambda t: t.abs().pow(3.0).sum(-1, keepdim=True).pow(1 / 3).clamp_min(1e-12), X)

def test_gradient_through_piecewise_constant_ops_is_zero() -> None:
  t = Tensor([1.5, -2.0], requires_grad=True)
  t.sign().sum().backward()
  assert t.grad is not None and t.grad.numpy().tolist() == [0.0, 0.0]

@pytest.mark.parametrize("name", ["sum", "prod", "mean", "var", "std", "any", "all", "argmax", "argmin", "logsumexp",
                                  "cumsum", "cumprod", "logcumsumexp"])
def test_torch_dim_keyword(name: str) -> None:
  # torch code passes dims as dim= (it raised TypeError); ember's own name stays axis=
  kw: dict[str, Any] = {"dim": -1} if name.startswith(("cum", "logcum")) else {"dim": -1, "keepdim": True}
  if name.startswith("arg"):  # int32 indices by design (torch: int64)
    np.testing.assert_array_equal(getattr(Tensor(X), name)(**kw).numpy(), getattr(torch.tensor(X), name)(**kw).numpy())
    return
  check(lambda t: getattr(t, name)(**kw), lambda t: getattr(t, name)(**kw), X)
  if name in ("var", "std"):
    check(lambda t: getattr(t, name)(dim=0, unbiased=False), lambda t: getattr(t, name)(dim=0, unbiased=False), X)

@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_with_dim_return_values_and_indices(name: str, keepdim: bool) -> None:
  # max(dim=)/min(dim=) return torch's (values, indices) pair; axis= keeps the values-only result
  x = X.copy()
  x[0, 1, 2] = x[0, 1, 3]  # a tie: the first index, as torch's CPU kernel
  got, want = getattr(Tensor(x), name)(dim=1, keepdim=keepdim), getattr(torch.tensor(x), name)(dim=1, keepdim=keepdim)
  np.testing.assert_array_equal(got.values.numpy(), want.values.numpy())
  np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
  check(lambda t: getattr(t, name)(dim=2)[0], lambda t: getattr(t, name)(dim=2)[0], X)
  assert getattr(Tensor(x), name)(axis=1).shape == want.values.shape if not keepdim else True
  from ember.errors import ArgumentError
  with pytest.raises(ArgumentError, match="not both"): getattr(Tensor(x), name)(1, dim=1)
