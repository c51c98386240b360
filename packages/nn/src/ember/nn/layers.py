"""Layers: plain classes whose Tensor attributes are their parameters (found by `ember.nn.state.get_state_dict`).

Parameters are initialised as PyTorch initialises them and are realized buffers, so optimizers can `assign` into them.
State-dict keys match PyTorch's (`weight`, `bias`, `running_mean`, `running_var`, `num_batches_tracked`).
"""
from __future__ import annotations
import abc
import math
import numbers
from typing import Any, Callable, Sequence
from ember import Tensor
from ember.dtype import dtypes
from ember.errors import ArgumentError, DTypeError, IndexRangeError, ShapeError
from ember.nn import functional as F
from ember.nn.functional import static_shape
from ember.nn.module import Buffer, Module, Parameter

def _param(t: Tensor) -> Tensor: return Parameter(t)

def _positive(layer: str, **sizes: Any) -> None:
  """A layer's sizes (features, channels, kernel dims, groups) are ints >= 1: a typed error naming the bad one."""
  for name, v in sizes.items():
    for x in (v if isinstance(v, (tuple, list)) else (v,)):
      if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < 1:
        raise ShapeError(f"{layer}: {name} must be a positive int (or ints), got {v!r}")
def _buffer(t: Tensor) -> Tensor: return Buffer(t)

class Linear(Module):
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

class _ConvNd(Module):
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

class _ConvTransposeNd(Module):
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

class BatchNorm(Module):
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
    training = self.training
    if training or not self.track_running_stats:
      mean = x.mean(axes, keepdim=True)
      centered = x - mean
      var = centered.square().mean(axes, keepdim=True)
      if training and self.track_running_stats:
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

class LayerNorm(Module):
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

class RMSNorm(Module):
  """x / sqrt(mean(x^2) + eps) * weight over the last dim (torch.nn.RMSNorm, eps defaulting to 1e-6)."""
  def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
    _positive("RMSNorm", dim=dim)
    self.eps = eps
    self.weight = _param(F.filled((dim,), 1.0)) if elementwise_affine else None
  def __call__(self, x: Tensor) -> Tensor:
    return F.rms_norm(x, F.static_shape(x, "RMSNorm")[-1:], self.weight, self.eps)

class GroupNorm(Module):
  """Normalise each of `num_groups` channel groups of (N, C, ...) inputs, then an affine per channel."""
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    _positive("GroupNorm", num_groups=num_groups, num_channels=num_channels)
    if num_channels % num_groups:
      raise ShapeError(f"GroupNorm: num_groups={num_groups} must divide num_channels={num_channels}")
    self.num_groups, self.eps = num_groups, eps
    self.weight = _param(F.filled((num_channels,), 1.0)) if affine else None
    self.bias = _param(F.filled((num_channels,), 0.0)) if affine else None
  def __call__(self, x: Tensor) -> Tensor: return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

class InstanceNorm(Module):
  """Normalise each channel of each sample over its spatial dims (torch's InstanceNorm1d/2d without running stats)."""
  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = False):
    _positive("InstanceNorm", num_features=num_features)
    self.num_features, self.eps = num_features, eps
    self.weight = _param(F.filled((num_features,), 1.0)) if affine else None
    self.bias = _param(F.filled((num_features,), 0.0)) if affine else None
  def __call__(self, x: Tensor) -> Tensor: return F.group_norm(x, self.num_features, self.weight, self.bias, self.eps)

class Embedding(Module):
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

class Dropout(Module):
  """Zero elements with probability p in training mode (scaling the rest by 1/(1-p)); the identity in eval mode."""
  def __init__(self, p: float = 0.5):
    if not 0 <= p <= 1: raise ArgumentError(f"Dropout probability must be in [0, 1], got {p}")
    self.p = p
  def __call__(self, x: Tensor) -> Tensor: return F.dropout(x, self.p, training=self.training)

class LSTMCell(Module):
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

class Sequential(Module, list):
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

# ** torch's stateless modules: callables holding their arguments (no parameters) **

class _Stateless(Module):
  def __repr__(self) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
    return f"{type(self).__name__}({args})"

class Identity(_Stateless):
  def __init__(self, *args: Any, **kwargs: Any): pass  # torch ignores its arguments
  def __call__(self, x: Tensor) -> Tensor: return x

class ReLU(_Stateless):
  def __call__(self, x: Tensor) -> Tensor: return x.relu()

class SiLU(_Stateless):
  def __call__(self, x: Tensor) -> Tensor: return x.silu()

class Sigmoid(_Stateless):
  def __call__(self, x: Tensor) -> Tensor: return x.sigmoid()

class Tanh(_Stateless):
  def __call__(self, x: Tensor) -> Tensor: return x.tanh()

class GELU(_Stateless):
  def __init__(self, approximate: str = "none"): self.approximate = approximate
  def __call__(self, x: Tensor) -> Tensor: return x.gelu(approximate=self.approximate)

class LeakyReLU(_Stateless):
  def __init__(self, negative_slope: float = 0.01): self.negative_slope = negative_slope
  def __call__(self, x: Tensor) -> Tensor: return x.leaky_relu(self.negative_slope)

class ELU(_Stateless):
  def __init__(self, alpha: float = 1.0): self.alpha = alpha
  def __call__(self, x: Tensor) -> Tensor: return x.elu(self.alpha)

class Softmax(_Stateless):
  def __init__(self, dim: int | None = None): self.dim = dim
  def __call__(self, x: Tensor) -> Tensor: return x.softmax(-1 if self.dim is None else self.dim)

class LogSoftmax(_Stateless):
  def __init__(self, dim: int | None = None): self.dim = dim
  def __call__(self, x: Tensor) -> Tensor: return x.log_softmax(-1 if self.dim is None else self.dim)

class Flatten(_Stateless):
  """Flattens dims start_dim..end_dim (torch's defaults keep the batch dim)."""
  def __init__(self, start_dim: int = 1, end_dim: int = -1): self.start_dim, self.end_dim = start_dim, end_dim
  def __call__(self, x: Tensor) -> Tensor: return x.flatten(self.start_dim, self.end_dim)

class MaxPool2d(_Stateless):
  def __init__(self, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, return_indices: bool = False,
               ceil_mode: bool = False):
    self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation
    self.return_indices, self.ceil_mode = return_indices, ceil_mode
  def __call__(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
    return x.max_pool2d(self.kernel_size, self.stride, dilation=self.dilation, padding=self.padding,
                        ceil_mode=self.ceil_mode, return_indices=self.return_indices)

class AvgPool2d(_Stateless):
  def __init__(self, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0, ceil_mode: bool = False, count_include_pad: bool = True):
    self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad = (
      kernel_size, stride, padding, ceil_mode, count_include_pad)
  def __call__(self, x: Tensor) -> Tensor:
    return x.avg_pool2d(self.kernel_size, self.stride, self.padding, ceil_mode=self.ceil_mode,
                        count_include_pad=self.count_include_pad)

class Upsample(_Stateless):
  def __init__(self, size: int | Sequence[int] | None = None, scale_factor: float | Sequence[float] | None = None,
               mode: str = "nearest", align_corners: bool | None = None):
    self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners
  def __call__(self, x: Tensor) -> Tensor:
    return x.interpolate(self.size, mode=self.mode, align_corners=bool(self.align_corners),
                         scale_factor=self.scale_factor)

class ModuleList(Module, list):
  """Layers held in a list (state-dict keys are the indices, as torch's `layers.0.weight`); not callable."""
  def __init__(self, modules: Sequence[Any] = ()):
    super().__init__(modules)

# ** attention and recurrent layers, with torch's parameter names and layouts (their state dicts load as they are) **

class MultiheadAttention(Module):
  """torch.nn.MultiheadAttention (same embed dim for query, key and value): `in_proj_weight` (3E, E), `in_proj_bias`,
  `out_proj` (a Linear). Returns (output, attention weights averaged over the heads, or per head with
  average_attn_weights=False; None when need_weights=False, which runs the fused attention)."""
  def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
               batch_first: bool = False):
    _positive("MultiheadAttention", embed_dim=embed_dim, num_heads=num_heads)
    if embed_dim % num_heads:
      raise ShapeError(f"MultiheadAttention: embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
    self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
    bound = math.sqrt(6 / (embed_dim + 3 * embed_dim))  # xavier_uniform over (3E, E), as torch
    self.in_proj_weight = _param(F.uniform(3 * embed_dim, embed_dim, low=-bound, high=bound))
    self.in_proj_bias = _param(Tensor.zeros(3 * embed_dim).contiguous().realize()) if bias else None
    self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
    if bias: self.out_proj.bias = _param(Tensor.zeros(embed_dim).contiguous().realize())  # torch zeroes both biases

  def __call__(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
               need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
               is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
    batched = query.ndim == 3
    if not batched: query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
    elif self.batch_first: query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    L, N, E = static_shape(query, "MultiheadAttention")
    S = static_shape(key, "MultiheadAttention")[0]
    if E != self.embed_dim or key.shape[-1] != E or value.shape[-1] != E:
      raise ShapeError(f"MultiheadAttention({self.embed_dim}) got query/key/value of shapes {query.shape}, "
                       f"{key.shape}, {value.shape}")
    H, D = self.num_heads, E // self.num_heads
    w, b = self.in_proj_weight, self.in_proj_bias
    def project(x: Tensor, k: int, length: int) -> Tensor:  # (length, N, E) -> (N, H, length, D)
      y = x @ w[k * E:(k + 1) * E].T
      if b is not None: y = y + b[k * E:(k + 1) * E]
      return y.reshape(length, N, H, D).permute(1, 2, 0, 3)
    q, k, v = project(query, 0, L), project(key, 1, S), project(value, 2, S)
    mask = None  # additive float mask (N or 1, H or 1, L, S)
    if attn_mask is not None:
      m = attn_mask if attn_mask.ndim == 2 else attn_mask.reshape(N, H, L, S)
      mask = m.where(float("-inf"), 0.0) if m.dtype is dtypes.bool else m
    elif is_causal:
      mask = Tensor.ones(L, S, dtype=dtypes.bool, device=query.device).triu(1).where(float("-inf"), 0.0)
    if key_padding_mask is not None:
      kp = key_padding_mask.reshape(N, 1, 1, S)
      pad = kp.where(float("-inf"), 0.0) if kp.dtype is dtypes.bool else kp
      mask = pad if mask is None else mask + pad
    p = self.dropout if self.training else 0.0
    if need_weights:
      scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)
      if mask is not None: scores = scores + mask
      attn = scores.softmax(-1)
      out = F.dropout(attn, p, training=p > 0) @ v
      weights: Tensor | None = attn.mean(1) if average_attn_weights else attn
    else:
      out, weights = q.scaled_dot_product_attention(k, v, attn_mask=mask, dropout_p=p), None
    out = self.out_proj(out.permute(2, 0, 1, 3).reshape(L, N, E))
    if not batched: return out.squeeze(1), (weights.squeeze(0) if weights is not None else None)
    return (out.transpose(0, 1) if self.batch_first else out), weights

class _RNNBase(Module, abc.ABC):
  """torch's multi-layer RNN/LSTM/GRU: parameters weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k} (and
  `_reverse` ones when bidirectional), gates stacked as torch stacks them; inputs (T, N, F) or (N, T, F) with
  batch_first, or unbatched (T, F). The time loop is unrolled into the graph (T steps)."""
  GATES = 1
  def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
               batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False):
    _positive(type(self).__name__, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers)
    if not 0 <= dropout <= 1: raise ArgumentError(f"{type(self).__name__} dropout must be in [0, 1], got {dropout}")
    self.input_size, self.hidden_size, self.num_layers, self.bias = input_size, hidden_size, num_layers, bias
    self.batch_first, self.dropout, self.bidirectional = batch_first, dropout, bidirectional
    bound, dirs, g = 1 / math.sqrt(hidden_size), 2 if bidirectional else 1, self.GATES * hidden_size
    for layer in range(num_layers):
      for suffix in ("", "_reverse")[:dirs]:
        fan_in = input_size if layer == 0 else hidden_size * dirs
        setattr(self, f"weight_ih_l{layer}{suffix}", _param(F.uniform(g, fan_in, low=-bound, high=bound)))
        setattr(self, f"weight_hh_l{layer}{suffix}", _param(F.uniform(g, hidden_size, low=-bound, high=bound)))
        if bias:
          setattr(self, f"bias_ih_l{layer}{suffix}", _param(F.uniform(g, low=-bound, high=bound)))
          setattr(self, f"bias_hh_l{layer}{suffix}", _param(F.uniform(g, low=-bound, high=bound)))

  @abc.abstractmethod
  def _cell(self, x: Tensor, state: tuple[Tensor, ...], name: str) -> tuple[Tensor, ...]:
    """One time step of layer/direction `name` ("l0", "l1_reverse"): the new state, its first entry the output."""

  def _gates(self, x: Tensor, h: Tensor, name: str) -> tuple[Tensor, Tensor]:
    gi, gh = x @ getattr(self, f"weight_ih_{name}").T, h @ getattr(self, f"weight_hh_{name}").T
    if self.bias: gi, gh = gi + getattr(self, f"bias_ih_{name}"), gh + getattr(self, f"bias_hh_{name}")
    return gi, gh

  def _run(self, x: Tensor, state: tuple[Tensor, ...] | None) -> tuple[Tensor, tuple[Tensor, ...]]:
    batched = x.ndim == 3
    if x.ndim not in (2, 3): raise ShapeError(f"{type(self).__name__} expects (T, N, F) or (T, F) input, got {x.shape}")
    if not batched: x = x.unsqueeze(1)
    elif self.batch_first: x = x.transpose(0, 1)
    T, N, feat = static_shape(x, type(self).__name__)
    if feat != self.input_size:
      raise ShapeError(f"{type(self).__name__}({self.input_size}, ...) got input features {feat} (shape {x.shape})")
    dirs = 2 if self.bidirectional else 1
    n_state = 2 if self.GATES == 4 else 1
    if state is None:
      zeros = Tensor.zeros(self.num_layers * dirs, N, self.hidden_size, device=x.device, dtype=x.dtype)
      state = (zeros,) * n_state
    elif not batched: state = tuple(s.unsqueeze(1) for s in state)
    want = (self.num_layers * dirs, N, self.hidden_size)
    for s in state:
      if tuple(s.shape) != want:
        raise ShapeError(f"{type(self).__name__}: hidden state shape {s.shape}, expected {want}")
    finals: list[list[Tensor]] = [[] for _ in range(n_state)]
    for layer in range(self.num_layers):
      outs = []
      for d, suffix in enumerate(("", "_reverse")[:dirs]):
        st = tuple(s[layer * dirs + d] for s in state)
        steps = range(T - 1, -1, -1) if d else range(T)
        ys: list[Tensor | None] = [None] * T
        for t in steps:
          st = self._cell(x[t], st, f"l{layer}{suffix}")
          ys[t] = st[0]
        outs.append(Tensor.stack(*[y for y in ys if y is not None], dim=0))
        for i, s in enumerate(st): finals[i].append(s)
      x = outs[0] if dirs == 1 else Tensor.cat(*outs, dim=-1)
      if self.dropout and layer < self.num_layers - 1 and self.training:
        x = F.dropout(x, self.dropout, training=True)
    out_state = tuple(Tensor.stack(*f, dim=0) for f in finals)
    if not batched: return x.squeeze(1), tuple(s.squeeze(1) for s in out_state)
    return (x.transpose(0, 1) if self.batch_first else x), out_state

class RNN(_RNNBase):
  """torch.nn.RNN: h' = tanh (or relu) of x W_ih.T + b_ih + h W_hh.T + b_hh. Returns (output, h_n)."""
  def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
               bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False):
    if nonlinearity not in ("tanh", "relu"):
      raise ArgumentError(f"RNN nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    self.nonlinearity = nonlinearity
    super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional)
  def _cell(self, x: Tensor, state: tuple[Tensor, ...], name: str) -> tuple[Tensor, ...]:
    gi, gh = self._gates(x, state[0], name)
    return ((gi + gh).tanh() if self.nonlinearity == "tanh" else (gi + gh).relu(),)
  def __call__(self, x: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
    out, (h,) = self._run(x, None if hx is None else (hx,))
    return out, h

class LSTM(_RNNBase):
  """torch.nn.LSTM (gates input, forget, cell, output). Returns (output, (h_n, c_n))."""
  GATES = 4
  def _cell(self, x: Tensor, state: tuple[Tensor, ...], name: str) -> tuple[Tensor, ...]:
    h, c = state
    gi, gh = self._gates(x, h, name)
    n = self.hidden_size
    i, f, g, o = ((gi + gh)[:, k * n:(k + 1) * n] for k in range(4))
    c_new = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return o.sigmoid() * c_new.tanh(), c_new
  def __call__(self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    out, (h, c) = self._run(x, hx)
    return out, (h, c)

class GRU(_RNNBase):
  """torch.nn.GRU (gates reset, update, new; the reset gate scales W_hn h + b_hn, as torch). Returns (output, h_n)."""
  GATES = 3
  def _cell(self, x: Tensor, state: tuple[Tensor, ...], name: str) -> tuple[Tensor, ...]:
    h = state[0]
    gi, gh = self._gates(x, h, name)
    n = self.hidden_size
    r = (gi[:, :n] + gh[:, :n]).sigmoid()
    z = (gi[:, n:2 * n] + gh[:, n:2 * n]).sigmoid()
    new = (gi[:, 2 * n:] + r * gh[:, 2 * n:]).tanh()
    return ((1 - z) * new + z * h,)
  def __call__(self, x: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
    out, (h,) = self._run(x, None if hx is None else (hx,))
    return out, h
