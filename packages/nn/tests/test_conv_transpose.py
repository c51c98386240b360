"""ConvTranspose1d/2d against torch: forward values, input and parameter gradients, PyTorch's initialisation bounds."""
from __future__ import annotations
import math
import numpy as np
import pytest
from ember import Tensor
from ember.errors import ShapeError
from ember.nn import ConvTranspose1d, ConvTranspose2d
from ember.nn.state import get_state_dict

torch = pytest.importorskip("torch")

def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def _check(layer, ref, x_np: np.ndarray, atol: float = 1e-4) -> None:
  with torch.no_grad():
    for name, t in get_state_dict(layer).items(): ref.get_parameter(name).copy_(torch.from_numpy(t.numpy()))
  x = Tensor(x_np, requires_grad=True)
  out = layer(x)
  w = _rand(*out.shape, seed=1)
  (out * Tensor(w)).sum().backward()
  xt = torch.tensor(x_np, requires_grad=True)
  out_t = ref(xt)
  (out_t * torch.from_numpy(w)).sum().backward()
  assert out.shape == tuple(out_t.shape)
  np.testing.assert_allclose(out.numpy(), out_t.detach().numpy(), atol=atol, rtol=1e-5)
  np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), atol=atol, rtol=1e-4)
  for name, p in get_state_dict(layer).items():
    np.testing.assert_allclose(p.grad.numpy(), ref.get_parameter(name).grad.numpy(), atol=atol, rtol=1e-4,
                               err_msg=name)

@pytest.mark.parametrize("kwargs", [dict(stride=2, padding=1, output_padding=1),
                                    dict(stride=(2, 3), groups=2, dilation=(1, 2), bias=False),
                                    dict(stride=2, padding=(0, 2), kernel_size=(2, 4))])
def test_conv_transpose2d_matches_torch(kwargs):
  kwargs = {"kernel_size": 3, **kwargs}
  layer, ref = ConvTranspose2d(4, 6, **kwargs), torch.nn.ConvTranspose2d(4, 6, **kwargs)
  _check(layer, ref, _rand(2, 4, 5, 4))

@pytest.mark.parametrize("kwargs", [dict(), dict(stride=3, padding=2, output_padding=1, groups=3)])
def test_conv_transpose1d_matches_torch(kwargs):
  layer, ref = ConvTranspose1d(3, 6, 4, **kwargs), torch.nn.ConvTranspose1d(3, 6, 4, **kwargs)
  _check(layer, ref, _rand(2, 3, 7))

def test_conv_transpose_init_and_errors():
  layer = ConvTranspose2d(64, 8, 3, groups=2)
  w = layer.weight.numpy()
  assert w.shape == (64, 4, 3, 3) and layer.bias.shape == (8,)
  bound = 1 / math.sqrt(4 * 9)  # torch: fan_in = weight.size(1) * kernel area
  assert np.abs(w).max() <= bound and abs(w.std() - bound / math.sqrt(3)) < 0.1 * bound
  assert np.abs(layer.bias.numpy()).max() <= bound
  with pytest.raises(ShapeError, match="groups=3"): ConvTranspose2d(4, 6, 3, groups=3)
  with pytest.raises(ShapeError, match="spatial dims"): layer(Tensor.ones(1, 64, 5))
  with pytest.raises(ShapeError, match="in_channels"): ConvTranspose1d(2, 3, 3)(Tensor.ones(1, 5, 6))
