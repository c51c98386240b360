"""Layers: plain classes whose Tensor attributes are their parameters (found by `ember.nn.state.get_state_dict`).

Parameters are initialised as PyTorch initialises them and are realized buffers, so optimizers can `assign` into them.
State-dict keys match PyTorch's (`weight`, `bias`, `running_mean`, `running_var`, `num_batches_tracked`).
"""
from __future__ import annotations
import math
import numbers
from typing import Any, Callable, Sequence
from ember import Tensor
from ember.dtype import dtypes
from ember.errors import ArgumentError, DTypeError, IndexRangeError, ShapeError
from ember.nn import functional as F
from ember.nn.functional import static_shape

def _param(t: Tensor) -> Tensor: return t.requires_grad_(True)

def _positive(layer: str, **sizes: Any) -> None:
  """A layer's sizes (features, channels, kernel dims, groups) are ints >= 1: a typed error naming the bad one."""
  for name, v in sizes.items():
    for x in (v if isinstance(v, (tuple, list)) else (v,)):
      if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1:
        raise ShapeError(f"{layer}: {name} must be a positive int (or ints), got {v!r}")
def _buffer(t: Tensor) -> Tensor: return t.requires_grad_(False)

class Linear:
  """y = x @ weight.T + bias, weight (out_features, in_features).

  >>> Linear(3, 2)(Tensor.ones(4, 3)).shape
  (4, 2)
  """
  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    _positive("Linear", in_features=in_features, out_features=out_features)
    bound = 1 / math.sqrt(in_features)
    self.weight = _param(F.kaiming_uniform(out_features, in_features))
    self.bias = _param(F.uniform(out_features, low=-bound, high=bound)) if bias else None
  def __call__(self, x: Tensor) -> Tensor:
    if x.shape[-1] != self.weight.shape[1]:
      raise ShapeError(f"Linear expects inputs with last dim {self.weight.shape[1]}, got shape {x.shape}")
    out = x @ self.weight.T
    return out + self.bias if self.bias is not None else out

class _ConvNd:
  ndim: int
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
               stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1,
               groups: int = 1, bias: bool = True):
    _positive(type(self).__name__, in_channels=in_channels, out_channels=out_channels, kernel_size=kernel_size,
              groups=groups)
    if in_channels % groups or out_channels % groups:
      raise ShapeError(f"{type(self).__name__}: groups={groups} must divide in_channels={in_channels} "
                       f"and out_channels={out_channels}")
    kernel = (kernel_size,) * self.ndim if isinstance(kernel_size, int) else tuple(kernel_size)
    self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
    fan_in = in_channels // groups * math.prod(kernel)
    self.weight = _param(F.kaiming_uniform(out_channels, in_channels // groups, *kernel, fan_in=fan_in))
    bound = 1 / math.sqrt(fan_in)
    self.bias = _param(F.uniform(out_channels, low=-bound, high=bound)) if bias else None
  def __call__(self, x: Tensor) -> Tensor:
    return F.conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

class Conv1d(_ConvNd):
  """torch.nn.Conv1d: x (N, Cin, L) -> (N, Cout, L_out)."""
  ndim = 1

class Conv2d(_ConvNd):
  """torch.nn.Conv2d: x (N, Cin, H, W) -> (N, Cout, H_out, W_out).

  >>> Conv2d(1, 4, 3, padding=1)(Tensor.ones(2, 1, 5, 5)).shape
  (2, 4, 5, 5)
  """
  ndim = 2

class Conv3d(_ConvNd):
  """torch.nn.Conv3d: x (N, Cin, D, H, W) -> (N, Cout, D_out, H_out, W_out)."""
  ndim = 3

class _ConvTransposeNd:
  ndim: int
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
               stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
               output_padding: int | Sequence[int] = 0, groups: int = 1, bias: bool = True,
               dilation: int | Sequence[int] = 1):
    _positive(type(self).__name__, in_channels=in_channels, out_channels=out_channels, kernel_size=kernel_size,
              groups=groups)
    if in_channels % groups or out_channels % groups:
      raise ShapeError(f"{type(self).__name__}: groups={groups} must divide in_channels={in_channels} "
                       f"and out_channels={out_channels}")
    kernel = (kernel_size,) * self.ndim if isinstance(kernel_size, int) else tuple(kernel_size)
    if len(kernel) != self.ndim:
      raise ShapeError(f"{type(self).__name__} needs {self.ndim} kernel sizes, got kernel_size={kernel_size}")
    self.stride, self.padding, self.output_padding = stride, padding, output_padding
    self.dilation, self.groups = dilation, groups
    # torch computes fan_in from weight dim 1 (out_channels / groups) for transposed convolutions
    fan_in = out_channels // groups * math.prod(kernel)
    self.weight = _param(F.kaiming_uniform(in_channels, out_channels // groups, *kernel, fan_in=fan_in))
    bound = 1 / math.sqrt(fan_in)
    self.bias = _param(F.uniform(out_channels, low=-bound, high=bound)) if bias else None
  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim != self.ndim + 2:
      raise ShapeError(f"{type(self).__name__} expects (N, C, {self.ndim} spatial dims) inputs, got shape {x.shape}")
    return F.conv_transpose(x, self.weight, self.bias, self.stride, self.padding, self.output_padding, self.groups,
                            self.dilation)

class ConvTranspose1d(_ConvTransposeNd):
  """torch.nn.ConvTranspose1d: x (N, Cin, L) -> (N, Cout, L_out), weight (Cin, Cout/groups, K).

  >>> ConvTranspose1d(2, 3, 4, stride=2)(Tensor.ones(1, 2, 5)).shape
  (1, 3, 12)
  """
  ndim = 1

class ConvTranspose2d(_ConvTransposeNd):
  """torch.nn.ConvTranspose2d: x (N, Cin, H, W) -> (N, Cout, H_out, W_out), weight (Cin, Cout/groups, KH, KW), with
  H_out = (H - 1) * stride - 2 * padding + dilation * (KH - 1) + output_padding + 1.

  >>> ConvTranspose2d(1, 4, 3, stride=2, padding=1, output_padding=1)(Tensor.ones(2, 1, 5, 5)).shape
  (2, 4, 10, 10)
  """
  ndim = 2

class BatchNorm:
  """Batch normalisation over the channel dim 1 of (N, C, ...) inputs (torch's BatchNorm1d/2d/3d).

  In training mode (`Tensor.training` or `Context(TRAINING=1)`) it normalises with the batch statistics and, with
  `track_running_stats`, assigns the updated running mean/variance (unbiased) lazily; they are realized with the
  optimizer step (pass the model's buffers to the optimizer: `get_parameters(model)` includes them). In eval mode it
  normalises with the running statistics.
  """
  def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
               track_running_stats: bool = True):
    _positive(type(self).__name__, num_features=num_features)
    self.num_features, self.eps, self.momentum = num_features, eps, momentum
    self.track_running_stats = track_running_stats
    self.weight = _param(F.filled((num_features,), 1.0)) if affine else None
    self.bias = _param(F.filled((num_features,), 0.0)) if affine else None
    if track_running_stats:
      self.running_mean = _buffer(F.filled((num_features,), 0.0))
      self.running_var = _buffer(F.filled((num_features,), 1.0))
      self.num_batches_tracked = _buffer(F.filled((), 0, dtype=dtypes.int64))
  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 2 or x.shape[1] != self.num_features:
      raise ShapeError(f"BatchNorm({self.num_features}) expects (N, {self.num_features}, ...) inputs, "
                       f"got shape {x.shape}")
    axes = (0,) + tuple(range(2, x.ndim))
    view = (1, self.num_features) + (1,) * (x.ndim - 2)
    if Tensor.is_training() or not self.track_running_stats:
      mean = x.mean(axes, keepdim=True)
      centered = x - mean
      var = centered.square().mean(axes, keepdim=True)
      if Tensor.is_training() and self.track_running_stats:
        count = math.prod(static_shape(x, "BatchNorm")[a] for a in axes)
        if count < 2:
          raise ShapeError(f"BatchNorm in training mode needs more than one value per channel, got shape {x.shape}")
        m = self.momentum
        unbiased = var.detach().reshape(self.num_features) * (count / (count - 1))
        F.assign(self.running_mean, (1 - m) * self.running_mean + m * mean.detach().reshape(self.num_features))
        F.assign(self.running_var, (1 - m) * self.running_var + m * unbiased)
        F.assign(self.num_batches_tracked, self.num_batches_tracked + 1)
      out = centered * (var + self.eps).rsqrt()
    else:
      out = (x - self.running_mean.reshape(view)) * (self.running_var.reshape(view) + self.eps).rsqrt()
    if self.weight is not None: out = out * self.weight.reshape(view)
    return out + self.bias.reshape(view) if self.bias is not None else out

BatchNorm1d = BatchNorm
BatchNorm2d = BatchNorm
BatchNorm3d = BatchNorm

class LayerNorm:
  """Normalise over the trailing `normalized_shape` dims, then scale and shift elementwise (torch.nn.LayerNorm)."""
  def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
               bias: bool = True):
    self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    _positive("LayerNorm", normalized_shape=self.normalized_shape)
    self.eps = eps
    self.weight = _param(F.filled(self.normalized_shape, 1.0)) if elementwise_affine else None
    self.bias = _param(F.filled(self.normalized_shape, 0.0)) if elementwise_affine and bias else None
  def __call__(self, x: Tensor) -> Tensor:
    return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

class RMSNorm:
  """x / sqrt(mean(x^2) + eps) * weight over the last dim (torch.nn.RMSNorm, eps defaulting to 1e-6)."""
  def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
    _positive("RMSNorm", dim=dim)
    self.eps = eps
    self.weight = _param(F.filled((dim,), 1.0)) if elementwise_affine else None
  def __call__(self, x: Tensor) -> Tensor: return F.rms_norm(x, self.weight, self.eps)

class GroupNorm:
  """Normalise each of `num_groups` channel groups of (N, C, ...) inputs, then an affine per channel."""
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    _positive("GroupNorm", num_groups=num_groups, num_channels=num_channels)
    if num_channels % num_groups:
      raise ShapeError(f"GroupNorm: num_groups={num_groups} must divide num_channels={num_channels}")
    self.num_groups, self.eps = num_groups, eps
    self.weight = _param(F.filled((num_channels,), 1.0)) if affine else None
    self.bias = _param(F.filled((num_channels,), 0.0)) if affine else None
  def __call__(self, x: Tensor) -> Tensor: return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

class InstanceNorm:
  """Normalise each channel of each sample over its spatial dims (torch's InstanceNorm1d/2d without running stats)."""
  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = False):
    _positive("InstanceNorm", num_features=num_features)
    self.num_features, self.eps = num_features, eps
    self.weight = _param(F.filled((num_features,), 1.0)) if affine else None
    self.bias = _param(F.filled((num_features,), 0.0)) if affine else None
  def __call__(self, x: Tensor) -> Tensor: return F.group_norm(x, self.num_features, self.weight, self.bias, self.eps)

class Embedding:
  """A lookup table: integer ids (...) -> rows of weight (vocab_size, embed_size), as (..., embed_size).

  >>> Embedding(10, 4)(Tensor([[1, 2, 3]])).shape
  (1, 3, 4)
  """
  def __init__(self, vocab_size: int, embed_size: int):
    _positive("Embedding", vocab_size=vocab_size, embed_size=embed_size)
    self.vocab_size, self.embed_size = vocab_size, embed_size
    self.weight = _param(F.normal(vocab_size, embed_size))
  def __call__(self, idx: Tensor) -> Tensor:
    if not dtypes.is_int(idx.dtype):
      raise DTypeError(f"Embedding needs integer ids, got {idx.dtype!r}; cast them with .int()")
    # a one-hot matmul: differentiable with respect to the table, and it fuses into one reduction. one_hot checks the
    # ids (torch raises for an id outside the table; a one-hot row of zeros would be a silently wrong embedding)
    try: onehot = idx.one_hot(self.vocab_size)
    except IndexRangeError as e: raise IndexRangeError(f"Embedding of {self.vocab_size} ids: {e}") from None
    return onehot.cast(self.weight.dtype) @ self.weight

class Dropout:
  """Zero elements with probability p in training mode (scaling the rest by 1/(1-p)); the identity in eval mode."""
  def __init__(self, p: float = 0.5):
    if not 0 <= p <= 1: raise ArgumentError(f"Dropout probability must be in [0, 1], got {p}")
    self.p = p
  def __call__(self, x: Tensor) -> Tensor: return F.dropout(x, self.p, training=Tensor.is_training())

class LSTMCell:
  """One LSTM step (torch.nn.LSTMCell): (x, (h, c)) -> (h', c'), gates ordered input, forget, cell, output."""
  def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
    _positive("LSTMCell", input_size=input_size, hidden_size=hidden_size)
    bound = 1 / math.sqrt(hidden_size)
    self.hidden_size = hidden_size
    self.weight_ih = _param(F.uniform(4 * hidden_size, input_size, low=-bound, high=bound))
    self.weight_hh = _param(F.uniform(4 * hidden_size, hidden_size, low=-bound, high=bound))
    self.bias_ih = _param(F.uniform(4 * hidden_size, low=-bound, high=bound)) if bias else None
    self.bias_hh = _param(F.uniform(4 * hidden_size, low=-bound, high=bound)) if bias else None
  def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    if hc is None:
      zeros = Tensor.zeros(x.shape[0], self.hidden_size, device=x.device, dtype=x.dtype)
      hc = (zeros, zeros)
    h, c = hc
    gates = x @ self.weight_ih.T + h @ self.weight_hh.T
    if self.bias_ih is not None and self.bias_hh is not None: gates = gates + self.bias_ih + self.bias_hh
    n = self.hidden_size
    i, f, g, o = (gates[:, k * n:(k + 1) * n] for k in range(4))
    c_new = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return o.sigmoid() * c_new.tanh(), c_new

class Sequential(list):
  """Layers (or any callables) applied in order; state-dict keys are the indices, as in torch (`0.weight`).

  >>> model = Sequential(Linear(4, 8), Tensor.relu, Linear(8, 2))
  >>> model(Tensor.ones(3, 4)).shape
  (3, 2)
  """
  def __init__(self, *layers: Callable[..., Any]):
    super().__init__(layers)
  def __call__(self, x: Any) -> Any:
    for layer in self: x = layer(x)
    return x
