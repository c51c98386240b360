"""Stateless neural-network ops in torch.nn.functional's argument order: activations, losses, normalisation,
convolution and pooling (done by the Tensor methods), dropout, initialisation, and the in-place update the optimizers
and BatchNorm use.

Everything here builds lazy Tensor graphs, so gradients come from the core autograd and the ops fuse like any other.

>>> from ember import Tensor
>>> log_softmax(Tensor([[1.0, 2.0, 3.0]])).exp().sum().item()  # doctest: +ELLIPSIS
1.0...
"""
from __future__ import annotations
import math
from typing import Sequence, cast
from ember import Tensor
from ember.dtype import DType, dtypes
from ember.errors import ShapeError

def static_shape(t: Tensor, what: str = "ember.nn") -> tuple[int, ...]:
  """The tensor's shape as ints; layers need concrete sizes."""
  dims = tuple(s for s in t.shape if isinstance(s, int))
  if len(dims) != len(t.shape): raise ShapeError(f"{what} needs a concrete shape, got symbolic shape {t.shape}")
  return dims

# ** in-place update **

def assign(target: Tensor, value: Tensor) -> Tensor:
  """`target.assign(value)` (lazy: the write happens when `target` is realized), for targets that may still hold an
  earlier pending assign (a BatchNorm statistic updated by two forward passes before a step): that one is realized
  first, so the write goes to the same buffer instead of a copy of it."""
  if not target.is_realized: target.realize()
  return target.assign(value)

# ** initialisation (as PyTorch does it) **

def uniform(*shape: int, low: float = 0.0, high: float = 1.0, dtype: DType | None = None,
            device: str | None = None) -> Tensor:
  """Samples from U[low, high), realized into a fresh buffer."""
  u = Tensor.rand(*shape, device=device, dtype=dtypes.float32)
  return (u * (high - low) + low).cast(dtype or dtypes.default_float).contiguous().realize()

def normal(*shape: int, mean: float = 0.0, std: float = 1.0, dtype: DType | None = None,
           device: str | None = None) -> Tensor:
  """Samples from N(mean, std^2), realized into a fresh buffer."""
  n = Tensor.randn(*shape, device=device, dtype=dtypes.float32)
  return (n * std + mean).cast(dtype or dtypes.default_float).contiguous().realize()

def kaiming_uniform(*shape: int, a: float = math.sqrt(5), fan_in: int | None = None, dtype: DType | None = None,
                    device: str | None = None) -> Tensor:
  """torch.nn.init.kaiming_uniform_ with leaky-relu slope `a`: U(-b, b), b = sqrt(6 / ((1 + a^2) fan_in))."""
  fan = fan_in if fan_in is not None else math.prod(shape[1:])
  bound = math.sqrt(6.0 / ((1 + a * a) * fan))
  return uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device)

def filled(shape: tuple[int, ...], value: float | int, dtype: DType | None = None, device: str | None = None) -> Tensor:
  """A realized buffer filled with `value` (parameters and running statistics must be real buffers to be assigned)."""
  return Tensor.full(shape, value, dtype=dtype or dtypes.default_float, device=device).contiguous().realize()

# ** activations and losses: torch.nn.functional's names and argument order over the one Tensor implementation **
# Where torch and tinygrad disagree (gelu's default, dropout's `training`, cross_entropy's class dim), these follow
# torch; the Tensor methods are the implementation.

def softmax(x: Tensor, dim: int = -1, dtype: DType | None = None) -> Tensor: return x.softmax(dim, dtype)
def log_softmax(x: Tensor, dim: int = -1, dtype: DType | None = None) -> Tensor: return x.log_softmax(dim, dtype)
def gelu(x: Tensor, approximate: str = "none") -> Tensor: return x.gelu(approximate)
def silu(x: Tensor) -> Tensor: return x.silu()
def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor: return x.leaky_relu(negative_slope)
def one_hot(x: Tensor, num_classes: int = -1) -> Tensor:
  """torch's one_hot: integer class indices -> a new last dim of size num_classes, in the indices' int dtype."""
  return x.one_hot(num_classes)
def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor: return x.normalize(p, dim, eps)

def cross_entropy(x: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
  """torch.nn.functional.cross_entropy: logits (N, C, ...) or (C,), class dim 1, against class indices or class
  probabilities."""
  return x.cross_entropy(target, reduction, label_smoothing, weight=weight, ignore_index=ignore_index)

def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
  """torch.nn.functional.dropout: applied when `training` is true (torch's default), whatever the global mode;
  `nn.Dropout` passes the global training mode."""
  return x.dropout(p, training=training)

# ** normalisation **

def _standardize(x: Tensor, axes: tuple[int, ...], eps: float) -> Tensor:
  """(x - mean) / sqrt(var + eps) over `axes`, with the biased variance (as every torch norm layer uses)."""
  centered = x - x.mean(axes, keepdim=True)
  return centered * (centered.square().mean(axes, keepdim=True) + eps).rsqrt()

def layer_norm(x: Tensor, normalized_shape: tuple[int, ...], weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
  n = len(normalized_shape)
  if tuple(x.shape[x.ndim - n:]) != tuple(normalized_shape):
    raise ShapeError(f"layer_norm: input shape {x.shape} does not end with normalized_shape {tuple(normalized_shape)}")
  out = _standardize(x, tuple(range(x.ndim - n, x.ndim)), eps)
  if weight is not None: out = out * weight
  return out + bias if bias is not None else out

def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
  out = x * (x.square().mean(-1, keepdim=True) + eps).rsqrt()
  return out * weight if weight is not None else out

def _channel_view(t: Tensor, ndim: int) -> Tensor: return t.reshape(1, -1, *([1] * (ndim - 2)))  # (1, C, 1, ...)

def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
  if x.ndim < 2 or x.shape[1] % num_groups != 0:
    raise ShapeError(f"group_norm: {num_groups} groups must divide the channel dim of input shape {x.shape}")
  grouped = x.reshape(x.shape[0], num_groups, -1)  # (N, G, C/G * spatial)
  out = _standardize(grouped, (2,), eps).reshape(x.shape)
  if weight is not None: out = out * _channel_view(weight, x.ndim)
  return out + _channel_view(bias, x.ndim) if bias is not None else out

# ** convolution and pooling **

def conv(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | Sequence[int] = 1,
         padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1) -> Tensor:
  """N-d convolution (cross-correlation, as torch's conv1d/2d/3d): x (N, Cin, *S), weight (Cout, Cin/groups, *K).
  `Tensor.conv2d` does the work (it takes the spatial rank from the weight); this is torch's argument order."""
  return x.conv2d(weight, bias, groups=groups, stride=stride, dilation=dilation, padding=padding)

def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | Sequence[int] = 1,
           padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1) -> Tensor:
  if weight.ndim != 4:
    raise ShapeError(f"conv2d needs a 4-d weight (Cout, Cin/groups, KH, KW), got shape {weight.shape}")
  return conv(x, weight, bias, stride, padding, dilation, groups)

def conv_transpose(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | Sequence[int] = 1,
                   padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0, groups: int = 1,
                   dilation: int | Sequence[int] = 1) -> Tensor:
  """N-d transposed convolution in torch's conv_transpose1d/2d argument order: x (N, Cin, *S), weight
  (Cin, Cout/groups, *K). `Tensor.conv_transpose2d` does the work (the spatial rank comes from the weight)."""
  if x.ndim != weight.ndim:
    raise ShapeError(f"conv_transpose: input shape {x.shape} and weight shape {weight.shape} must have the same rank")
  if x.shape[1] != weight.shape[0]:
    raise ShapeError(f"conv_transpose: input has {x.shape[1]} channels but the weight {weight.shape} expects "
                     f"{weight.shape[0]} (weight dim 0 is in_channels)")
  return x.conv_transpose2d(weight, bias, groups=groups, stride=stride, dilation=dilation, padding=padding,
                            output_padding=output_padding)

def max_pool2d(x: Tensor, kernel_size: int | Sequence[int] = 2, stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1) -> Tensor:
  """torch's max_pool2d argument order (stride defaults to the kernel size; padding counts as -inf)."""
  return cast(Tensor, x.max_pool2d(kernel_size, stride, dilation=dilation, padding=padding))

def avg_pool2d(x: Tensor, kernel_size: int | Sequence[int] = 2, stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0) -> Tensor:
  """torch's avg_pool2d with count_include_pad=True (padding counts as 0 in the mean)."""
  return x.avg_pool2d(kernel_size, stride, padding=padding, count_include_pad=True)
