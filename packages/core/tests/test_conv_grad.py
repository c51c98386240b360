"""conv2d's gradients are convolutions (custom_gradient): values against torch for every padding/stride/dilation form,
and the backward schedule never writes the per-window gradient (N, *out, *kernel, Cin) that autograd would."""
import numpy as np
import pytest
import torch
from ember import Tensor, dtypes
from ember.gradient import custom_gradient
from ember.errors import GradientError

CASES = [  # (input shape, weight shape, conv kwargs)
  ((2, 3, 9, 9), (4, 3, 3, 3), {}),
  ((2, 3, 9, 9), (4, 3, 3, 3), {"stride": 2}),
  ((2, 3, 10, 9), (4, 3, 3, 2), {"stride": (2, 3), "padding": (1, 2)}),
  ((1, 2, 11, 11), (3, 2, 3, 3), {"dilation": 2, "padding": 2}),
  ((2, 3, 9, 9), (4, 3, 3, 3), {"stride": 3, "dilation": 2}),
  ((2, 3, 8, 8), (2, 3, 4, 4), {"padding": "same"}),
  ((2, 4, 7), (3, 4, 3), {"stride": 2, "padding": 1}),
  ((1, 2, 5, 6, 5), (2, 2, 2, 3, 2), {"padding": 1}),
]

def _torch_conv(x, w, kw):
  F = torch.nn.functional
  return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[w.ndim - 2](x, w, **kw)

@pytest.mark.parametrize("xs,ws,kw", CASES)
def test_conv_gradients_match_torch(xs, ws, kw) -> None:
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal(xs, np.float32), rng.standard_normal(ws, np.float32)
  b = rng.standard_normal(ws[0], np.float32)
  X, W, B = (Tensor(a, requires_grad=True) for a in (x, w, b))
  y = X.conv2d(W, B, **kw)
  (y * y).sum().backward()
  tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
  ty = _torch_conv(tx, tw, kw) + tb.reshape(1, -1, *([1] * (len(ws) - 2)))
  (ty * ty).sum().backward()
  np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
  for e, t in ((X, tx), (W, tw), (B, tb)):
    np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-3)

def test_asymmetric_padding_gradient() -> None:
  rng = np.random.default_rng(1)
  x, w = rng.standard_normal((1, 2, 6, 7), np.float32), rng.standard_normal((3, 2, 3, 3), np.float32)
  X, W = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  X.conv2d(W, padding=(1, 0, 2, 1)).sum().backward()  # F.pad order: left, right, top, bottom
  tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  torch.nn.functional.conv2d(torch.nn.functional.pad(tx, (1, 0, 2, 1)), tw).sum().backward()
  np.testing.assert_allclose(X.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(W.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)

def test_integer_input_gets_only_a_weight_gradient() -> None:
  x = np.arange(2 * 1 * 6 * 6, dtype=np.uint8).reshape(2, 1, 6, 6)
  w = np.random.default_rng(2).standard_normal((2, 1, 3, 3)).astype(np.float32)
  W = Tensor(w, requires_grad=True)
  Tensor(x).conv2d(W).sum().backward()
  tw = torch.tensor(w, requires_grad=True)
  torch.nn.functional.conv2d(torch.tensor(x).float(), tw).sum().backward()
  np.testing.assert_allclose(W.grad.numpy(), tw.grad.numpy(), rtol=1e-5)

def test_backward_writes_no_per_window_gradient() -> None:
  n, cin, cout, k, size = 4, 8, 8, 5, 16
  X = Tensor.randn(n, cin, size, size, requires_grad=True)
  W = Tensor.randn(cout, cin, k, k, requires_grad=True)
  X.conv2d(W).sum().backward()
  out = size - k + 1
  per_window = n * out * out * k * k * cin
  sizes = [b.size for it in Tensor.schedule(X.grad, W.grad) for b in it.bufs]
  assert max(sizes) < per_window, (max(sizes), per_window)

def test_custom_gradient_checks_its_count() -> None:
  x = Tensor([1.0, 2.0], requires_grad=True)
  y = custom_gradient(x * 2, (x,), lambda g, a: (g, g))
  with pytest.raises(GradientError, match="2 gradients for 1 inputs"):
    y.sum().backward()

def test_custom_gradient_replaces_the_derived_one() -> None:
  x = Tensor([1.0, -2.0, 3.0], requires_grad=True)
  y = custom_gradient(x.round(), (x,), lambda g, a: (g,))  # a straight-through estimator
  (y * Tensor([1.0, 2.0, 3.0])).sum().backward()
  np.testing.assert_array_equal(y.numpy(), [1.0, -2.0, 3.0])
  np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0, 3.0])
  assert y.dtype is dtypes.float32
