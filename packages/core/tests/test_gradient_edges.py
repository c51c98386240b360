"""Autograd at the edges, against torch 2.13: graphs with zero-size tensors or constant-valued ops (their gradient is
zeros, never "not part of the graph"), the gradient at kinks, activations at |x| ~ 1e3 and 1e30, and comparisons
inside a graph."""
from __future__ import annotations
from typing import Any, Callable
import numpy as np
import pytest
from ember import Tensor

torch = pytest.importorskip("torch")
F = torch.nn.functional

def _both(ours: Callable[..., Any], ref: Callable[..., Any], *arrays: np.ndarray, tol: float = 1e-5) -> None:
  """Forward values and the gradients of sum(out * seed) for every input, ember against torch."""
  ts = [Tensor(a, requires_grad=True) for a in arrays]
  tt = [torch.tensor(a, requires_grad=True) for a in arrays]
  out, want = ours(*ts), ref(*tt)
  assert out.shape == tuple(want.shape)
  np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=tol, atol=tol, equal_nan=True)
  seed = np.random.default_rng(7).uniform(0.5, 1.5, tuple(want.shape)).astype(np.float32)
  (out * Tensor(seed)).sum().backward()
  (want * torch.tensor(seed)).sum().backward()
  for t, r in zip(ts, tt):
    expected = r.grad.numpy() if r.grad is not None else np.zeros(r.shape, np.float32)
    assert t.grad is not None and t.grad.shape == tuple(r.shape)
    np.testing.assert_allclose(t.grad.numpy(), expected, rtol=tol, atol=tol, equal_nan=True)

EMPTY = np.zeros((0, 3), np.float32)
VEC = np.array([-2.0, -1.0, 0.0, 0.5, 1.0, 2.0], np.float32)

# ** graphs whose value does not depend on the input: the gradient is zeros of the input's shape **
CONSTANT_VALUED = {
  "sum_empty": (lambda x: x.sum(), lambda x: x.sum(), EMPTY),
  "sum_empty_axis": (lambda x: x.sum(0), lambda x: x.sum(0), EMPTY),
  "mean_empty": (lambda x: x.mean(), lambda x: x.mean(), EMPTY),
  "mean_empty_axis": (lambda x: x.mean(0), lambda x: x.mean(0), EMPTY),
  "prod_empty_axis": (lambda x: x.prod(0), lambda x: x.prod(0), EMPTY),
  "mul_empty": (lambda x: x * 2, lambda x: x * 2, EMPTY),
  "reshape_empty": (lambda x: x.reshape(3, 0).sum(1), lambda x: x.reshape(3, 0).sum(1), EMPTY),
  "expand_empty": (lambda x: x.reshape(1, 0, 3).expand(4, 0, 3).sum(), lambda x: x.expand(4, 0, 3).sum(), EMPTY),
  "empty_slice": (lambda x: x[2:2].sum(), lambda x: x[2:2].sum(), VEC),
  "empty_slice_plus": (lambda x: x[3:1].sum() + x[1:3].sum(), lambda x: x[3:1].sum() + x[1:3].sum(), VEC),
  "pow_zero": (lambda x: x ** 0, lambda x: x ** 0, VEC),
  "std_empty": (lambda x: x.std(0), lambda x: x.std(0), np.zeros((2, 0), np.float32)),
  "cumsum_empty": (lambda x: x.cumsum(0), lambda x: x.cumsum(0), EMPTY),
  "softmax_empty": (lambda x: x.softmax(0), lambda x: x.softmax(0), EMPTY),
  "logsumexp_empty": (lambda x: x.logsumexp(0), lambda x: x.logsumexp(0), EMPTY),
  "roll_empty": (lambda x: x.roll(1, 0).sum(), lambda x: x.roll(1, 0).sum(), EMPTY),
  "cat_empty": (lambda x: Tensor.cat(x, x + 1, dim=0).sum(), lambda x: torch.cat([x, x + 1]).sum(), EMPTY),
  "unfold": (lambda x: x.unfold(0, 2, 3), lambda x: x.unfold(0, 2, 3), VEC),
  "roll": (lambda x: x.roll(2, 0), lambda x: x.roll(2, 0), VEC),
  "expand": (lambda x: x.reshape(6, 1).expand(6, 3), lambda x: x.reshape(6, 1).expand(6, 3), VEC),
}

@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", list(CONSTANT_VALUED))
def test_gradient_of_constant_valued_and_zero_size_graphs(name: str) -> None:
  ours, ref, x = CONSTANT_VALUED[name]
  _both(ours, ref, x)

def test_gradient_of_pow_zero_is_zero_not_missing() -> None:
  x = Tensor(VEC, requires_grad=True)
  (g,) = (x ** 0).sum().gradient(x)
  np.testing.assert_array_equal(g.numpy(), np.zeros_like(VEC))

# ** kinks: torch's choice of (sub)gradient **
KINK = np.array([-3.0, -1.0, -0.0, 0.0, 1.0, 3.0, 6.0, 7.0], np.float32)
OTHER = np.array([-3.0, 1.0, 0.0, -0.0, 1.0, -2.0, 6.0, 8.0], np.float32)
KINKS = {
  "abs": (lambda x: x.abs(), torch.abs),
  "relu": (lambda x: x.relu(), torch.relu),
  "relu6": (lambda x: x.relu6(), F.relu6),
  "hardtanh": (lambda x: x.hardtanh(), F.hardtanh),
  "hardswish": (lambda x: x.hardswish(), F.hardswish),
  "hardsigmoid": (lambda x: x.hardsigmoid(), F.hardsigmoid),
  "leaky_relu": (lambda x: x.leaky_relu(0.1), lambda x: F.leaky_relu(x, 0.1)),
  "elu": (lambda x: x.elu(), F.elu),
  "clamp": (lambda x: x.clamp(-1.0, 1.0), lambda x: x.clamp(-1.0, 1.0)),
  "clamp_min": (lambda x: x.clamp(0.0), lambda x: x.clamp(0.0)),
  "sign": (lambda x: x.sign() * x, lambda x: x.sign() * x),
  "floor": (lambda x: x.floor() + x, lambda x: x.floor() + x),
  "ceil": (lambda x: x.ceil() * x, lambda x: x.ceil() * x),
  "round": (lambda x: (x * 0.5).round() * x, lambda x: (x * 0.5).round() * x),
  "trunc": (lambda x: x.trunc() * x, lambda x: x.trunc() * x),
  "max_ties": (lambda x: x.abs().max(), lambda x: x.abs().max()),
  "cummax_ties": (lambda x: x.abs().cummax(0)[0], lambda x: x.abs().cummax(0)[0]),
  "cummin_ties": (lambda x: x.abs().cummin(0)[0], lambda x: x.abs().cummin(0)[0]),
}

@pytest.mark.parametrize("name", list(KINKS))
def test_gradient_at_kinks(name: str) -> None:
  ours, ref = KINKS[name]
  _both(ours, ref, KINK)

BINARY_KINKS = {
  "copysign": (lambda x, y: x.copysign(y), torch.copysign),
  "maximum": (lambda x, y: x.maximum(y), torch.maximum),
  "minimum": (lambda x, y: x.minimum(y), torch.minimum),
  "clamp_tensor_min": (lambda x, y: x.clamp(y), lambda x, y: x.clamp(y)),
  "clamp_tensor_max": (lambda x, y: x.clamp(None, y), lambda x, y: x.clamp(None, y)),
}

@pytest.mark.parametrize("name", list(BINARY_KINKS))
def test_gradient_at_binary_kinks(name: str) -> None:
  ours, ref = BINARY_KINKS[name]
  _both(ours, ref, KINK, OTHER)

# ** large magnitudes: finite values and gradients where torch has them **
LARGE = np.array([-1e30, -1e10, -1e3, -100.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 100.0, 1e3, 1e30], np.float32)
ACTIVATIONS = {
  "sigmoid": (lambda x: x.sigmoid(), torch.sigmoid),
  "tanh": (lambda x: x.tanh(), torch.tanh),
  "silu": (lambda x: x.silu(), F.silu),
  "gelu": (lambda x: x.gelu(), F.gelu),
  "quick_gelu": (lambda x: x.quick_gelu(), lambda x: x * torch.sigmoid(1.702 * x)),
  "softplus": (lambda x: x.softplus(), F.softplus),
  "logsigmoid": (lambda x: x.logsigmoid(), F.logsigmoid),
  "elu": (lambda x: x.elu(), F.elu),
  "mish": (lambda x: x.mish(), F.mish),
  "relu6": (lambda x: x.relu6(), F.relu6),
  "hardswish": (lambda x: x.hardswish(), F.hardswish),
  "hardtanh": (lambda x: x.hardtanh(), F.hardtanh),
}

@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activations_are_stable_at_large_magnitudes(name: str) -> None:
  ours, ref = ACTIVATIONS[name]
  _both(ours, ref, LARGE, tol=1e-5)

# ** comparisons inside a graph **
def test_comparisons_carry_no_gradient_and_do_not_break_backward() -> None:
  a, b = np.array([-1.0, 0.0, 2.0, 3.0], np.float32), np.array([1.0, 0.0, 3.0, -3.0], np.float32)
  x, y = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
  masks = [x < y, x != y, x == y, x >= 0, (x > 0).int()]
  assert all(not m.requires_grad for m in masks)
  out = (masks[0].where(x * y, x) + masks[1].float() * y + masks[2].where(0.0, x * x) + masks[4] * x).sum()
  out.backward()
  assert all(m.grad is None for m in masks)
  tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
  ref = (torch.where(tx < ty, tx * ty, tx) + (tx != ty).float() * ty + torch.where(tx == ty, 0.0, tx * tx)
         + (tx > 0).int() * tx).sum()
  ref.backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
  np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy())

def test_unrelated_tensor_is_still_an_error() -> None:
  from ember.errors import GradientError
  x, z = Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0], requires_grad=True)
  with pytest.raises(GradientError): (x * 2).sum().gradient(z)
  with pytest.raises(RuntimeError): (x * 2).sum().gradient(z)  # torch.autograd.grad raises RuntimeError too

@pytest.mark.parametrize("op", ["le", "ge", "lt", "gt"])
def test_ordered_comparisons_with_nan_are_false(op):
  """a <= b is False where either side is NaN (IEEE, torch), not `not (a > b)`."""
  a = np.array([1.0, np.nan, 3.0, np.nan, -0.0], dtype=np.float32)
  b = np.array([1.0, 2.0, np.nan, np.nan, 0.0], dtype=np.float32)
  fn = {"le": lambda x, y: x <= y, "ge": lambda x, y: x >= y, "lt": lambda x, y: x < y, "gt": lambda x, y: x > y}[op]
  np.testing.assert_array_equal(fn(Tensor(a), Tensor(b)).numpy(), fn(torch.from_numpy(a), torch.from_numpy(b)).numpy())
  np.testing.assert_array_equal(fn(Tensor(a), 1.0).numpy(), fn(torch.from_numpy(a), 1.0).numpy())
  ints = np.array([1, 2, 3], dtype=np.int32)
  np.testing.assert_array_equal(fn(Tensor(ints), 2).numpy(), fn(torch.from_numpy(ints), 2).numpy())

@pytest.mark.parametrize("make", [
  lambda: Tensor([1, 2, 3], requires_grad=True),
  lambda: Tensor(np.arange(4, dtype=np.int64)).requires_grad_(),
  lambda: setattr(Tensor([True, False]), "requires_grad", True),
  lambda: Tensor(np.arange(3, dtype=np.uint8), requires_grad=True),
], ids=["list", "requires_grad_", "attribute", "uint8"])
def test_integer_and_bool_tensors_cannot_require_grad(make: Callable[[], Any]):
  # as in torch (RuntimeError there): a gradient through the int -> float cast came back silently as zeros
  from ember.errors import GradientError
  with pytest.raises(GradientError, match="only floating-point tensors"):
    make()
  with pytest.raises(RuntimeError):
    torch.tensor([1, 2, 3], requires_grad=True)

def test_half_and_derived_integer_tensors_keep_autograd():
  x = Tensor(np.array([1.0, -2.0], np.float16), requires_grad=True)
  (x * x).float().sum().backward()
  assert x.grad is not None and x.grad.numpy().tolist() == [2.0, -4.0]
  y = Tensor(np.array([0.5, 1.5], np.float32), requires_grad=True)
  idx = (y * 2).cast("int32")  # an int result of a tracked tensor is simply not tracked
  assert not idx.requires_grad and idx.numpy().tolist() == [1, 3]
