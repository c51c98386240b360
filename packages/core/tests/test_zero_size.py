"""Reductions, scans and softmax over zero-length axes against torch 2.13: the identity element, NaN where torch gives
NaN, and an error of torch's builtin class where torch raises."""
from __future__ import annotations
import warnings
from typing import Any, Callable
import numpy as np
import pytest
from ember import Tensor
from ember.errors import EmberError

torch = pytest.importorskip("torch")

SHAPES = [(0,), (0, 3), (3, 0), (2, 0, 3)]

def _values(r: Any) -> Any:
  return r[0] if isinstance(r, tuple) or hasattr(r, "values") and not hasattr(r, "numpy") else r

OPS: dict[str, Callable[[Any], Any]] = {
  "sum": lambda x: x.sum(), "sum_0": lambda x: x.sum(0), "sum_last": lambda x: x.sum(-1),
  "prod": lambda x: x.prod(), "prod_0": lambda x: x.prod(0),
  "mean": lambda x: x.mean(), "mean_0": lambda x: x.mean(0),
  "var": lambda x: x.var(), "var_0": lambda x: x.var(0), "std": lambda x: x.std(), "std_last": lambda x: x.std(-1),
  "all": lambda x: x.all(), "any": lambda x: x.any(), "all_0": lambda x: x.all(0), "any_last": lambda x: x.any(-1),
  "max": lambda x: x.max(), "max_0": lambda x: _values(x.max(0)), "max_last": lambda x: _values(x.max(-1)),
  "min": lambda x: x.min(), "min_0": lambda x: _values(x.min(0)),
  "argmax": lambda x: x.argmax(), "argmax_0": lambda x: x.argmax(0), "argmin_last": lambda x: x.argmin(-1),
  "cumsum_0": lambda x: x.cumsum(0), "cumprod_last": lambda x: x.cumprod(-1),
  "cummax_0": lambda x: x.cummax(0)[0], "cummin_last": lambda x: x.cummin(-1)[0],
  "cummax_idx": lambda x: x.cummax(0)[1],
  "logsumexp_0": lambda x: x.logsumexp(0), "logsumexp_last": lambda x: x.logsumexp(-1),
  "softmax_0": lambda x: x.softmax(0), "log_softmax_last": lambda x: x.log_softmax(-1),
  "logcumsumexp_0": lambda x: x.logcumsumexp(0),
}

def _run(fn: Callable[[Any], Any], x: Any) -> tuple[str, Any]:
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      r = fn(x)
    return "ok", (r.numpy() if isinstance(r, Tensor) else r.detach().numpy())
  except Exception as e:  # noqa: BLE001 -- the exception itself is the result under test
    return "raised", e

@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(OPS))
def test_zero_length_axis_matches_torch(name: str, shape: tuple[int, ...]) -> None:
  a = np.zeros(shape, np.float32)
  ours, want = _run(OPS[name], Tensor(a)), _run(OPS[name], torch.tensor(a))
  if want[0] == "raised":
    assert ours[0] == "raised", f"torch raises {type(want[1]).__name__}, ember returned {ours[1]!r}"
    assert isinstance(ours[1], EmberError) and isinstance(ours[1], type(want[1])), \
      f"ember raised {type(ours[1]).__mro__}, torch {type(want[1]).__name__}"
    return
  assert ours[0] == "ok", f"torch returns a value, ember raised {ours[1]!r}"
  got, expected = ours[1], want[1]
  assert got.shape == expected.shape
  assert got.dtype.kind == expected.dtype.kind, f"dtype {got.dtype} vs torch {expected.dtype}"
  np.testing.assert_array_equal(got, expected)

@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.uint8])
def test_empty_reductions_of_int_and_bool(dtype: Any) -> None:
  a = np.zeros((0, 2), dtype)
  for fn in (lambda x: x.sum(0), lambda x: x.prod(0), lambda x: x.any(0), lambda x: x.all(0), lambda x: x.any()):
    ours, want = fn(Tensor(a)).numpy(), fn(torch.tensor(a)).numpy()
    assert ours.shape == want.shape
    np.testing.assert_array_equal(ours, want)
