"""Functional ops against torch.nn.functional (losses, pooling, conv variants) and numpy (softmax, one_hot)."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor
from ember.errors import DTypeError, ShapeError
from ember.nn import functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional

def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def test_softmax_and_log_softmax_match_numpy():
  x = _rand(3, 7) * 20  # large logits: the max is subtracted first
  e = np.exp(x - x.max(-1, keepdims=True))
  np.testing.assert_allclose(F.softmax(Tensor(x)).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
  expected = TF.log_softmax(torch.from_numpy(x), 0).numpy()
  np.testing.assert_allclose(F.log_softmax(Tensor(x), 0).numpy(), expected, atol=1e-5)

@pytest.mark.parametrize("kwargs", [dict(), dict(label_smoothing=0.1), dict(ignore_index=2), dict(reduction="sum"),
                                    dict(reduction="none")])
def test_cross_entropy_matches_torch(kwargs):
  logits, labels = _rand(6, 5), np.array([0, 2, 4, 1, 2, 3], dtype=np.int32)
  x = Tensor(logits, requires_grad=True)
  loss = F.cross_entropy(x, Tensor(labels), **kwargs)
  xt = torch.tensor(logits, requires_grad=True)
  loss_t = TF.cross_entropy(xt, torch.from_numpy(labels.astype(np.int64)), **kwargs)
  np.testing.assert_allclose(loss.numpy(), loss_t.detach().numpy(), atol=1e-5, rtol=1e-5)
  loss.sum().backward()
  loss_t.sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), atol=1e-6)

def test_cross_entropy_and_one_hot_errors():
  with pytest.raises(ShapeError): F.cross_entropy(Tensor.ones(4, 3), Tensor([1, 2]))
  with pytest.raises(DTypeError, match="int tensor"): F.one_hot(Tensor([1.0]), 3)
  labels = np.array([2, 0, 1], dtype=np.int64)
  np.testing.assert_array_equal(F.one_hot(Tensor(labels), 3).numpy(), TF.one_hot(torch.from_numpy(labels), 3).numpy())

def test_functional_follows_torch_defaults():
  """gelu is exact by default, normalize is the Lp normalisation, dropout applies unless training=False, and
  cross_entropy takes the class dim 1 with ignore_index -100: torch's meanings of these names."""
  x = _rand(3, 4, 5)
  xt = torch.from_numpy(x)
  np.testing.assert_allclose(F.gelu(Tensor(x)).numpy(), TF.gelu(xt).numpy(), atol=1e-5)
  np.testing.assert_allclose(F.normalize(Tensor(x)).numpy(), TF.normalize(xt).numpy(), atol=1e-6)
  np.testing.assert_allclose(F.normalize(Tensor(x), p=1.0, dim=2).numpy(), TF.normalize(xt, p=1.0, dim=2).numpy(),
                             atol=1e-6)
  assert (F.dropout(Tensor.ones(64), 0.5).numpy() == 0).any()
  np.testing.assert_array_equal(F.dropout(Tensor(x), 0.5, training=False).numpy(), x)
  labels = np.array([[1, -100, 3, 0, 2], [3, 2, -100, 1, 0], [0, 0, 1, 1, 2]], dtype=np.int64)  # (N, d1), C = 4
  got = F.cross_entropy(Tensor(x), Tensor(labels.astype(np.int32)))
  np.testing.assert_allclose(got.numpy(), TF.cross_entropy(xt, torch.from_numpy(labels)).numpy(), atol=1e-6)

@pytest.mark.parametrize("kernel,stride,padding", [(2, None, 0), (3, 2, 1), ((3, 2), (1, 2), (1, 0))])
def test_pooling_matches_torch(kernel, stride, padding):
  x = _rand(2, 3, 7, 6)
  xe, xt = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
  out, out_t = F.max_pool2d(xe, kernel, stride, padding), TF.max_pool2d(xt, kernel, stride, padding)
  np.testing.assert_allclose(out.numpy(), out_t.detach().numpy())
  out.sum().backward()
  out_t.sum().backward()
  np.testing.assert_allclose(xe.grad.numpy(), xt.grad.numpy())
  np.testing.assert_allclose(F.avg_pool2d(Tensor(x), kernel, stride, padding).numpy(),
                             TF.avg_pool2d(torch.from_numpy(x), kernel, stride, padding).numpy(), atol=1e-6)

def test_conv3d_and_dilated_conv_match_torch():
  x, w = _rand(1, 2, 5, 4, 6), _rand(3, 2, 2, 3, 2, seed=1)
  expected = TF.conv3d(torch.from_numpy(x), torch.from_numpy(w), stride=(1, 2, 1), padding=1).numpy()
  np.testing.assert_allclose(F.conv(Tensor(x), Tensor(w), stride=(1, 2, 1), padding=1).numpy(), expected, atol=1e-5)
  x2, w2 = _rand(2, 4, 9, 9), _rand(4, 1, 3, 3, seed=2)  # depthwise, dilated
  expected = TF.conv2d(torch.from_numpy(x2), torch.from_numpy(w2), dilation=2, groups=4, padding=2).numpy()
  out = F.conv2d(Tensor(x2), Tensor(w2), dilation=2, groups=4, padding=2)
  np.testing.assert_allclose(out.numpy(), expected, atol=1e-5)
  with pytest.raises(ShapeError, match="input channels 4"): F.conv2d(Tensor(x2), Tensor(_rand(4, 2, 3, 3)))

def test_activations_match_torch():
  x = _rand(4, 5) * 3
  xt = torch.from_numpy(x)
  np.testing.assert_allclose(F.gelu(Tensor(x), approximate="tanh").numpy(), TF.gelu(xt, approximate="tanh").numpy(),
                             atol=1e-5)
  np.testing.assert_allclose(F.silu(Tensor(x)).numpy(), TF.silu(xt).numpy(), atol=1e-5)
  np.testing.assert_allclose(F.leaky_relu(Tensor(x), 0.2).numpy(), TF.leaky_relu(xt, 0.2).numpy(), atol=1e-6)

def test_assign_writes_the_same_buffer_after_pending_readers():
  target = Tensor(np.arange(4, dtype=np.float32)).contiguous().realize()
  buf = target.uop.base
  reader = target * 10  # lazy, reads the old contents
  F.assign(target, target + 1).realize()
  np.testing.assert_array_equal(reader.numpy(), np.arange(4) * 10)
  np.testing.assert_array_equal(target.numpy(), np.arange(4) + 1)
  assert target.uop.base is buf
  with pytest.raises(ShapeError, match="assign shape mismatch"): F.assign(target, Tensor.ones(3))
