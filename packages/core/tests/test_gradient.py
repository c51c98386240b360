"""Autograd: the gradient of every primitive against central finite differences of the numpy function (float64),
a 2-layer MLP forward and backward against hand-written numpy backprop, and the errors autograd raises."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor, dtypes
from ember.errors import GradientError

rng = np.random.default_rng(7)

def numeric_grad(f, xs: list[np.ndarray], w: np.ndarray, eps: float = 1e-6) -> list[np.ndarray]:
  grads = []
  for i, x in enumerate(xs):
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
      plus = [a.copy() for a in xs]
      minus = [a.copy() for a in xs]
      plus[i][idx] += eps
      minus[i][idx] -= eps
      g[idx] = ((f(*plus) * w).sum() - (f(*minus) * w).sum()) / (2 * eps)
    grads.append(g)
  return grads

def check(f_t, f_np, *shapes, positive: bool = False, atol: float = 1e-6):
  xs = [rng.standard_normal(s) for s in shapes]
  if positive: xs = [np.abs(x) + 0.5 for x in xs]
  out = f_np(*xs)
  w = rng.standard_normal(np.shape(out))
  ts = [Tensor(x, dtype=dtypes.float64, requires_grad=True) for x in xs]
  loss = (f_t(*ts) * Tensor(w, dtype=dtypes.float64)).sum()
  loss.backward()
  for t, g in zip(ts, numeric_grad(f_np, xs, w)):
    assert t.grad is not None and t.grad.shape == t.shape
    np.testing.assert_allclose(t.grad.numpy(), g, rtol=1e-5, atol=atol)

UNARY = [
  ("neg", lambda t: -t, lambda a: -a, False), ("exp", Tensor.exp, np.exp, False), ("log", Tensor.log, np.log, True),
  ("log2", Tensor.log2, np.log2, True), ("exp2", Tensor.exp2, np.exp2, False), ("sqrt", Tensor.sqrt, np.sqrt, True),
  ("sin", Tensor.sin, np.sin, False), ("cos", Tensor.cos, np.cos, False),
  ("reciprocal", Tensor.reciprocal, lambda a: 1 / a, True), ("relu", Tensor.relu, lambda a: np.maximum(a, 0), False),
  ("sigmoid", Tensor.sigmoid, lambda a: 1 / (1 + np.exp(-a)), False), ("tanh", Tensor.tanh, np.tanh, False),
  ("square", Tensor.square, np.square, False), ("abs", Tensor.abs, np.abs, False),
  ("pow3", lambda t: t ** 3, lambda a: a ** 3, False), ("pow_half", lambda t: t ** 0.5, lambda a: a ** 0.5, True),
]

@pytest.mark.parametrize("name,ft,fn,pos", UNARY, ids=[u[0] for u in UNARY])
def test_unary_gradients(name, ft, fn, pos):
  check(ft, fn, (3, 4), positive=pos)

BINARY = [
  ("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b), ("div", lambda a, b: a / b),
  ("maximum", lambda a, b: a.maximum(b) if isinstance(a, Tensor) else np.maximum(a, b)),
  ("minimum", lambda a, b: a.minimum(b) if isinstance(a, Tensor) else np.minimum(a, b)),
]

@pytest.mark.parametrize("name,fn", BINARY, ids=[b[0] for b in BINARY])
def test_binary_gradients(name, fn):
  check(fn, fn, (3, 4), (3, 4))

@pytest.mark.parametrize("sa,sb", [((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 1), (3, 4))])
def test_broadcast_gradients_sum_over_expanded_dims(sa, sb):
  check(lambda a, b: a * b + a, lambda a, b: a * b + a, sa, sb)

def test_where_gradient():
  check(lambda a, b: (a > 0).where(a * 2, b), lambda a, b: np.where(a > 0, a * 2, b), (3, 4), (3, 4))

@pytest.mark.parametrize("axis", [None, 0, 1, (0, 2)])
def test_reduce_gradients(axis):
  check(lambda a: a.sum(axis), lambda a: a.sum(axis=axis), (2, 3, 4))
  check(lambda a: a.mean(axis), lambda a: a.mean(axis=axis), (2, 3, 4))
  check(lambda a: a.max(axis), lambda a: a.max(axis=axis), (2, 3, 4))
  check(lambda a: a.prod(axis), lambda a: a.prod(axis=axis), (2, 3, 4))

def test_max_gradient_splits_between_ties():
  x = Tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]], requires_grad=True)
  x.max(1).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [1, 0, 0]])

def test_prod_gradient_with_zeros():
  x = Tensor([[2.0, 0.0, 3.0], [1.0, 4.0, 5.0]], requires_grad=True)
  x.prod(1).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [[0, 6, 0], [20, 5, 4]])

MOVEMENT = [
  ("reshape", lambda a: a.reshape(4, 6), lambda a: a.reshape(4, 6)),
  ("permute", lambda a: a.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
  ("expand", lambda a: a[:, :1].expand(2, 5, 4), lambda a: np.broadcast_to(a[:, :1], (2, 5, 4))),
  ("pad", lambda a: a.pad(((1, 0), (0, 2), (1, 1))), lambda a: np.pad(a, ((1, 0), (0, 2), (1, 1)))),
  ("shrink", lambda a: a.shrink(((0, 1), (1, 3), (2, 4))), lambda a: a[0:1, 1:3, 2:4]),
  ("flip", lambda a: a.flip((0, 2)), lambda a: a[::-1, :, ::-1]),
  ("getitem", lambda a: a[1, ::2, 1:], lambda a: a[1, ::2, 1:]),
  ("cat", lambda a: Tensor.cat(a, a * 2, dim=1), lambda a: np.concatenate([a, a * 2], axis=1)),
]

@pytest.mark.parametrize("name,ft,fn", MOVEMENT, ids=[m[0] for m in MOVEMENT])
def test_movement_gradients(name, ft, fn):
  check(ft, fn, (2, 3, 4))

@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 2)), ((4,), (4, 3))])
def test_matmul_gradient(sa, sb):
  check(lambda a, b: a @ b, lambda a, b: a @ b, sa, sb)

def test_cast_gradient_flows_back_to_the_parameter_dtype():
  x = Tensor([1.0, 2.0], dtype=dtypes.float32, requires_grad=True)
  (x.cast(dtypes.float64) * 3).sum().backward()
  assert x.grad.dtype is dtypes.float32
  np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])

def test_gradient_accumulates_and_detach_blocks_it():
  x = Tensor([1.0, 2.0], requires_grad=True)
  (x * x).sum().backward()
  (x * 3).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [2 * 1 + 3, 2 * 2 + 3])
  y = Tensor([1.0, 2.0], requires_grad=True)
  (y * y.detach()).sum().backward()
  np.testing.assert_allclose(y.grad.numpy(), [1.0, 2.0])

def test_gradient_api():
  x = Tensor([1.0, 2.0, 3.0])
  y = Tensor([4.0, 5.0, 6.0])
  gx, gy = (x * y).sum().gradient(x, y)
  np.testing.assert_allclose(gx.numpy(), [4, 5, 6])
  np.testing.assert_allclose(gy.numpy(), [1, 2, 3])
  (g,) = (x * y).gradient(x, gradient=Tensor([1.0, 0.0, 2.0]))
  np.testing.assert_allclose(g.numpy(), [4, 0, 12])

def test_gradient_errors():
  x = Tensor([1.0, 2.0], requires_grad=True)
  with pytest.raises(GradientError):
    (x * 2).backward()  # not a scalar and no gradient given
  with pytest.raises(GradientError):
    (Tensor([1.0]) * 2).sum().backward()  # nothing requires grad
  with pytest.raises(GradientError):
    (x * 2).sum().gradient(Tensor([5.0]))  # not in the graph

def test_eye_matmul_backward():  # seeds-digest item 45
  x = Tensor.eye(3, requires_grad=True)
  y = Tensor([[2.0, 0.0, -2.0]])
  y.matmul(x).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), np.repeat(np.array([[2.0], [0.0], [-2.0]]), 3, axis=1))

# ** a 2-layer MLP, forward and backward, against numpy backprop **

def _mlp_data():
  r = np.random.default_rng(42)
  x = r.standard_normal((8, 5)).astype(np.float32)
  w1 = (r.standard_normal((5, 16)) * 0.5).astype(np.float32)
  b1 = (r.standard_normal(16) * 0.1).astype(np.float32)
  w2 = (r.standard_normal((16, 3)) * 0.5).astype(np.float32)
  b2 = (r.standard_normal(3) * 0.1).astype(np.float32)
  y = r.standard_normal((8, 3)).astype(np.float32)
  return x, w1, b1, w2, b2, y

def _mlp_numpy(x, w1, b1, w2, b2, y):
  h_pre = x @ w1 + b1
  h = np.maximum(h_pre, 0)
  out = h @ w2 + b2
  loss = ((out - y) ** 2).mean()
  d_out = 2 * (out - y) / out.size
  d_w2, d_b2 = h.T @ d_out, d_out.sum(0)
  d_h = d_out @ w2.T * (h_pre > 0)
  d_w1, d_b1 = x.T @ d_h, d_h.sum(0)
  return out, loss, (d_w1, d_b1, d_w2, d_b2)

def _mlp_ember(device: str):
  x, w1, b1, w2, b2, y = _mlp_data()
  params = [Tensor(p, device=device, requires_grad=True) for p in (w1, b1, w2, b2)]
  tw1, tb1, tw2, tb2 = params
  out = (Tensor(x, device=device) @ tw1 + tb1).relu() @ tw2 + tb2
  loss = ((out - Tensor(y, device=device)) ** 2).mean()
  loss.backward()
  return out, loss, params

def test_mlp_forward_backward_matches_numpy_on_python():
  out, loss, params = _mlp_ember("PYTHON")
  ref_out, ref_loss, ref_grads = _mlp_numpy(*(a.astype(np.float64) for a in _mlp_data()))
  np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(loss.item(), ref_loss, rtol=1e-5, atol=1e-5)
  for p, g in zip(params, ref_grads):
    np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-5, atol=1e-5)

def test_mlp_schedules_on_null():
  out, loss, params = _mlp_ember("NULL")
  sched = loss.schedule(*(p.grad for p in params))
  kernels = [it for it in sched if it.kind == "kernel"]
  assert kernels and all(it.device == "NULL" for it in kernels)
  loss.realize(*(p.grad for p in params))  # compiles and "runs" every kernel on NULL
  assert all(p.grad.shape == p.shape for p in params)
