"""Layers against torch (forward values and gradients), with the torch module holding the same weights."""
from __future__ import annotations
import math
import numpy as np
import pytest
from ember import Context, Tensor, dtypes
from ember.errors import ShapeError, DTypeError, IndexRangeError
from ember.nn import (BatchNorm2d, BatchNorm1d, Conv1d, Conv2d, Dropout, Embedding, GroupNorm, InstanceNorm, LayerNorm,
                      Linear, LSTMCell, RMSNorm, Sequential)
from ember.nn.state import get_state_dict

torch = pytest.importorskip("torch")

def _copy_into(torch_module, layer) -> None:
  with torch.no_grad():
    for name, t in get_state_dict(layer).items():
      is_param = name in dict(torch_module.named_parameters())
      target = torch_module.get_parameter(name) if is_param else torch_module.get_buffer(name)
      target.copy_(torch.from_numpy(t.numpy()))

def _check_grads(layer, torch_module, x_np: np.ndarray, atol: float = 1e-5, **call) -> None:
  """Forward, then backward of sum(out * fixed random weights); compare the output and every gradient."""
  x = Tensor(x_np, requires_grad=True)
  out = layer(x, **call)
  w = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
  (out * Tensor(w)).sum().backward()
  xt = torch.tensor(x_np, requires_grad=True)
  out_t = torch_module(xt, **call)
  (out_t * torch.from_numpy(w)).sum().backward()
  np.testing.assert_allclose(out.numpy(), out_t.detach().numpy(), atol=atol, rtol=1e-5)
  np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), atol=atol, rtol=1e-4)
  for name, p in get_state_dict(layer).items():
    if p.requires_grad:
      expected = torch_module.get_parameter(name).grad.numpy()
      np.testing.assert_allclose(p.grad.numpy(), expected, atol=atol, rtol=1e-4, err_msg=name)

def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def test_linear_matches_torch():
  layer, ref = Linear(6, 4), torch.nn.Linear(6, 4)
  _copy_into(ref, layer)
  _check_grads(layer, ref, _rand(5, 6))

def test_linear_init_bounds_and_no_bias():
  layer = Linear(100, 30, bias=False)
  w = layer.weight.numpy()
  assert layer.bias is None and w.shape == (30, 100)
  # torch's kaiming_uniform(a=sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)): std = bound / sqrt(3)
  bound = 1 / math.sqrt(100)
  assert np.abs(w).max() <= bound and abs(w.std() - bound / math.sqrt(3)) < 0.1 * bound
  with pytest.raises(ShapeError, match="last dim 100"): layer(Tensor.ones(2, 99))

@pytest.mark.parametrize("kwargs", [dict(), dict(stride=2, padding=1), dict(groups=2, dilation=(2, 1), padding=(1, 0))])
def test_conv2d_matches_torch(kwargs):
  layer, ref = Conv2d(4, 6, 3, **kwargs), torch.nn.Conv2d(4, 6, 3, **kwargs)
  _copy_into(ref, layer)
  _check_grads(layer, ref, _rand(2, 4, 7, 6), atol=1e-4)

def test_conv1d_matches_torch():
  layer, ref = Conv1d(3, 5, 4, stride=2, padding=2), torch.nn.Conv1d(3, 5, 4, stride=2, padding=2)
  _copy_into(ref, layer)
  _check_grads(layer, ref, _rand(2, 3, 11), atol=1e-4)

def test_batchnorm_training_matches_torch(training):
  layer, ref = BatchNorm2d(3), torch.nn.BatchNorm2d(3)
  _copy_into(ref, layer)
  _check_grads(layer, ref, _rand(4, 3, 5, 5), atol=1e-4)
  # a second batch: running statistics follow torch's (momentum 0.1, unbiased variance)
  x2 = _rand(4, 3, 5, 5, seed=2) * 2 + 1
  layer(Tensor(x2)).realize()
  ref(torch.from_numpy(x2))
  Tensor.realize(layer.running_mean, layer.running_var, layer.num_batches_tracked)
  np.testing.assert_allclose(layer.running_mean.numpy(), ref.running_mean.numpy(), atol=1e-5)
  np.testing.assert_allclose(layer.running_var.numpy(), ref.running_var.numpy(), atol=1e-5)
  assert layer.num_batches_tracked.item() == ref.num_batches_tracked.item() == 2

def test_batchnorm_eval_uses_running_stats():
  layer, ref = BatchNorm1d(4), torch.nn.BatchNorm1d(4).eval()
  with torch.no_grad():
    ref.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
    ref.running_var.copy_(torch.tensor([1.5, 0.25, 4.0, 1.0]))
    ref.weight.copy_(torch.tensor([1.0, 2.0, -1.0, 0.5]))
  _copy_into(ref, layer)
  x = _rand(6, 4)
  np.testing.assert_allclose(layer(Tensor(x)).numpy(), ref(torch.from_numpy(x)).detach().numpy(), atol=1e-5)
  # Context(TRAINING=1) switches to batch statistics, as Tensor.training does
  with Context(TRAINING=1):
    out = layer(Tensor(x)).numpy()
  np.testing.assert_allclose(out, ref.train()(torch.from_numpy(x)).detach().numpy(), atol=1e-5)

def test_layernorm_matches_torch():
  layer, ref = LayerNorm((3, 5)), torch.nn.LayerNorm((3, 5))
  with torch.no_grad():
    ref.weight.copy_(torch.from_numpy(_rand(3, 5, seed=3)))
    ref.bias.copy_(torch.from_numpy(_rand(3, 5, seed=4)))
  _copy_into(ref, layer)
  _check_grads(layer, ref, _rand(2, 3, 5))

def test_rmsnorm_groupnorm_instancenorm_match_torch():
  rms, rms_ref = RMSNorm(8), torch.nn.RMSNorm(8, eps=1e-6)
  _copy_into(rms_ref, rms)
  _check_grads(rms, rms_ref, _rand(3, 8))
  gn, gn_ref = GroupNorm(2, 6), torch.nn.GroupNorm(2, 6)
  with torch.no_grad(): gn_ref.weight.copy_(torch.from_numpy(_rand(6, seed=5)))
  _copy_into(gn_ref, gn)
  _check_grads(gn, gn_ref, _rand(2, 6, 3, 3))
  inorm, inorm_ref = InstanceNorm(3), torch.nn.InstanceNorm2d(3)
  x = _rand(2, 3, 4, 4)
  np.testing.assert_allclose(inorm(Tensor(x)).numpy(), inorm_ref(torch.from_numpy(x)).numpy(), atol=1e-5)

def test_embedding_matches_torch():
  layer, ref = Embedding(10, 4), torch.nn.Embedding(10, 4)
  _copy_into(ref, layer)
  ids = np.array([[1, 2, 2], [9, 0, 2]], dtype=np.int32)
  out = layer(Tensor(ids))
  w = _rand(2, 3, 4, seed=6)
  (out * Tensor(w)).sum().backward()
  out_t = ref(torch.from_numpy(ids.astype(np.int64)))
  (out_t * torch.from_numpy(w)).sum().backward()
  np.testing.assert_allclose(out.numpy(), out_t.detach().numpy(), atol=1e-6)
  np.testing.assert_allclose(layer.weight.grad.numpy(), ref.weight.grad.numpy(), atol=1e-5)
  with pytest.raises(DTypeError, match="integer ids"): layer(Tensor([1.0, 2.0]))

def test_lstm_cell_matches_torch():
  cell, ref = LSTMCell(3, 4), torch.nn.LSTMCell(3, 4)
  _copy_into(ref, cell)
  x, h, c = _rand(2, 3), _rand(2, 4, seed=1), _rand(2, 4, seed=2)
  h1, c1 = cell(Tensor(x), (Tensor(h), Tensor(c)))
  h1_t, c1_t = ref(torch.from_numpy(x), (torch.from_numpy(h), torch.from_numpy(c)))
  np.testing.assert_allclose(h1.numpy(), h1_t.detach().numpy(), atol=1e-5)
  np.testing.assert_allclose(c1.numpy(), c1_t.detach().numpy(), atol=1e-5)

def test_dropout(training):
  x = Tensor.ones(50, 40)
  Tensor.manual_seed(7)
  a = Dropout(0.25)(x).numpy()
  b = Dropout(0.25)(x).numpy()
  # survivors are scaled by 1/(1-p); about p of the elements are dropped; the counter gives a new mask per call
  np.testing.assert_allclose(np.unique(a), [0.0, 1 / 0.75], rtol=1e-6)
  assert abs((a == 0).mean() - 0.25) < 0.05
  assert (a != b).any()
  Tensor.training = False
  np.testing.assert_array_equal(Dropout(0.25)(x).numpy(), np.ones((50, 40), np.float32))

def test_sequential_keys_match_torch():
  model = Sequential(Linear(3, 4), Tensor.relu, Linear(4, 2))
  ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
  assert sorted(get_state_dict(model)) == sorted(ref.state_dict())
  _copy_into(ref, model)
  x = _rand(5, 3)
  np.testing.assert_allclose(model(Tensor(x)).numpy(), ref(torch.from_numpy(x)).detach().numpy(), atol=1e-5)

def test_parameters_are_realized_buffers_with_dtype():
  bn = BatchNorm2d(3)
  assert bn.num_batches_tracked.dtype is dtypes.int64 and bn.num_batches_tracked.shape == ()
  assert bn.weight.requires_grad and not bn.running_mean.requires_grad
  assert all(t.uop.is_realized for t in get_state_dict(bn).values())

@pytest.mark.parametrize("make, torch_make", [
  (lambda: Linear(-1, 3), lambda: torch.nn.Linear(-1, 3)),
  (lambda: Conv2d(3, 4, 3, groups=0), lambda: torch.nn.Conv2d(3, 4, 3, groups=0)),
  (lambda: Conv2d(3, -4, 3), lambda: torch.nn.Conv2d(3, -4, 3)),
  (lambda: Embedding(-5, 2), lambda: torch.nn.Embedding(-5, 2)),
  (lambda: BatchNorm2d(-3), lambda: torch.nn.BatchNorm2d(-3)),
  (lambda: LSTMCell(4, -2), lambda: torch.nn.LSTMCell(4, -2)),
])
def test_layers_with_bad_sizes_raise_a_shape_error_like_torch(make, torch_make):
  # torch refuses these too; ember names the layer and the size (it raised math or ZeroDivision errors before)
  with pytest.raises(Exception) as want: torch_make()
  with pytest.raises(ShapeError, match="must be a positive int") as got: make()
  assert isinstance(got.value, type(want.value)), (type(want.value), want.value)

def test_embedding_ids_out_of_range_raise_like_torch():
  # torch raises IndexError; ember's one-hot lookup would have returned a row of zeros
  layer = Embedding(4, 3)
  with pytest.raises(IndexError) as want: torch.nn.Embedding(4, 3)(torch.tensor([[1, 7]]))
  with pytest.raises(IndexRangeError, match="Embedding of 4 ids: .*index 7") as got: layer(Tensor([[1, 7]]))
  assert isinstance(got.value, type(want.value))
  with pytest.raises(IndexRangeError, match="index -1"): layer(Tensor([-1]))

def test_group_norm_with_zero_groups_is_a_shape_error():
  with pytest.raises(ShapeError, match="num_groups must be a positive int"): GroupNorm(0, 4)  # (torch: ZeroDivision)
