"""The torch oracle the Tensor API tests share: run a function on ember and on torch, compare values, dtypes and the
gradients of every float input (torch 2.13 CPU; tests importing this skip without it)."""
from __future__ import annotations
from typing import Any, Callable
import warnings
import numpy as np
import pytest
from ember import Tensor

torch = pytest.importorskip("torch")

def check(ours: Callable[..., Any], ref: Callable[..., Any], *arrays: np.ndarray, tol: float = 1e-5,
          atol: float | None = None, rtol: float | None = None, grad: bool = True, grad_tol: float = 1e-4,
          dtype: Any = None) -> None:
  """Run `ours` on ember tensors and `ref` on torch tensors built from `arrays`; `dtype` overrides torch's output dtype
  (e.g. int32 indices where torch gives int64)."""
  atol, rtol = (tol if atol is None else atol), (tol if rtol is None else rtol)
  floats = [a.dtype.kind == "f" for a in arrays]
  ts = [Tensor(a, requires_grad=f or None) for a, f in zip(arrays, floats)]
  tt = [torch.tensor(a, requires_grad=f and grad) for a, f in zip(arrays, floats)]
  out, expected = ours(*ts), ref(*tt)
  got, want = out.numpy(), expected.detach().numpy()
  assert got.dtype == (dtype or want.dtype), f"dtype {got.dtype} != torch {dtype or want.dtype}"
  assert got.shape == want.shape, f"shape {got.shape} != torch {want.shape}"
  np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, equal_nan=True)
  if not (grad and any(floats) and got.dtype.kind == "f" and got.size): return
  seed = np.random.default_rng(1).standard_normal(got.shape).astype(got.dtype)
  (out * Tensor(seed)).sum().backward()
  (expected * torch.tensor(seed)).sum().backward()
  for t, r, f in zip(ts, tt, floats):
    if not f: continue
    assert t.grad is not None and t.grad.dtype == t.dtype
    np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), atol=grad_tol, rtol=grad_tol)

def _raised(fn: Callable[[], Any]) -> BaseException | None:
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      fn()
  except Exception as e:  # noqa: BLE001 -- the exception is what the test compares
    return e
  return None

def check_raises_like_torch(name: str, ours: Callable[[], Any], ref: Callable[[], Any]) -> None:
  """`ours` (ember) must raise an EmberError that is an instance of the builtin class `ref` (torch) raises."""
  from ember.errors import EmberError
  want = _raised(ref)
  assert want is not None, f"torch accepts {name}: the case is not a bad call"
  got = _raised(ours)
  assert got is not None, f"ember accepted {name}; torch raises {type(want).__name__}: {want}"
  assert isinstance(got, EmberError), f"{name}: ember raised a foreign {type(got).__name__}: {got}"
  assert isinstance(got, type(want)), f"{name}: ember's {type(got).__name__} is not a {type(want).__name__}"
