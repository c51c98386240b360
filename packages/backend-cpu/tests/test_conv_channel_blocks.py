"""conv2d's implicit GEMM copies its input channels-last in blocks of 32 or 16 channels (N, Cin/blk, *padded, blk) and
reduces over (*kernel, Cin/blk, blk): values and gradients against torch for channel counts that take each block (32,
16, none), with strides, dilations, padding forms, batch 1, 1d/3d, and the grouped path beside it."""
import numpy as np
import pytest
import torch
from ember import Tensor

F = torch.nn.functional

def _torch_conv(x: torch.Tensor, w: torch.Tensor, kw: dict) -> torch.Tensor:
  p = kw.get("padding", 0)
  if isinstance(p, tuple) and len(p) == 2 * (w.ndim - 2):  # asymmetric, F.pad order: torch's conv takes no such form
    x, kw = F.pad(x, p), {k: v for k, v in kw.items() if k != "padding"}
  return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[w.ndim - 2](x, w, **kw)

CASES = [  # (input shape, weight shape, conv kwargs): Cin 64 and 96 take blocks of 32, 48 of 16, 20 and 8 none
  ((2, 64, 12, 11), (24, 64, 3, 3), {"padding": 1}),
  ((1, 96, 9, 9), (20, 96, 3, 3), {"padding": 1}),
  ((2, 48, 10, 10), (17, 48, 3, 3), {"stride": 2, "padding": 1}),
  ((1, 20, 9, 8), (33, 20, 3, 3), {"padding": "same"}),
  ((2, 32, 13, 13), (16, 32, 3, 3), {"dilation": 2, "padding": 2}),
  ((1, 64, 11, 10), (8, 64, 2, 3), {"stride": (2, 1), "padding": (0, 1, 1, 0)}),
  ((1, 8, 7, 7), (16, 8, 1, 1), {}),
  ((3, 64, 15), (16, 64, 5), {"stride": 2, "padding": 2}),
  ((1, 48, 5, 6, 5), (4, 48, 3, 3, 3), {"padding": 1}),
  ((2, 64, 9, 9), (64, 16, 3, 3), {"groups": 4, "padding": 1}),
]

@pytest.mark.parametrize("xs,ws,kw", CASES)
def test_conv_matches_torch(xs: tuple, ws: tuple, kw: dict) -> None:
  rng = np.random.default_rng(1)
  x, w = rng.standard_normal(xs, np.float32), rng.standard_normal(ws, np.float32) * 0.1
  b = rng.standard_normal(ws[0], np.float32)
  y = Tensor(x).conv2d(Tensor(w), Tensor(b), **kw).numpy()
  ty = _torch_conv(torch.tensor(x), torch.tensor(w), kw) + torch.tensor(b).reshape(1, -1, *([1] * (len(ws) - 2)))
  np.testing.assert_allclose(y, ty.numpy(), rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("xs,ws,kw", [CASES[0], CASES[2], CASES[4], CASES[7]])
def test_conv_gradients_match_torch(xs: tuple, ws: tuple, kw: dict) -> None:
  rng = np.random.default_rng(2)
  x, w = rng.standard_normal(xs, np.float32), rng.standard_normal(ws, np.float32) * 0.1
  X, W = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  y = X.conv2d(W, **kw)
  (y * y).sum().backward()
  tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  ty = _torch_conv(tx, tw, kw)
  (ty * ty).sum().backward()
  np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
  assert X.grad is not None and W.grad is not None and tx.grad is not None and tw.grad is not None
  np.testing.assert_allclose(X.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(W.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=2e-3)

def test_conv_batch_of_64_weight_gradient() -> None:
  # the weight gradient is a convolution with the batch as its channels (64, a multiple of the blocks) and windows
  # larger than its output, which keep the channels whole; the input gradient's (8 -> 4 channels) takes none
  rng = np.random.default_rng(3)
  x, w = rng.standard_normal((64, 4, 6, 6), np.float32), rng.standard_normal((8, 4, 3, 3), np.float32) * 0.1
  W = Tensor(w, requires_grad=True)
  Tensor(x).conv2d(W, padding=1).sum().backward()
  tw = torch.tensor(w, requires_grad=True)
  F.conv2d(torch.tensor(x), tw, padding=1).sum().backward()
  assert W.grad is not None and tw.grad is not None
  np.testing.assert_allclose(W.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=2e-3)
