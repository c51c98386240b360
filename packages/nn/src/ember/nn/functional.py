"""Stateless neural-network ops composed from Tensor primitives: activations, losses, normalisation, convolution and
pooling, dropout, initialisation, and the in-place update the optimizers and BatchNorm use.

Everything here builds lazy Tensor graphs, so gradients come from the core autograd and the ops fuse like any other.

>>> from ember import Tensor
>>> log_softmax(Tensor([[1.0, 2.0, 3.0]])).exp().sum().item()  # doctest: +ELLIPSIS
1.0...
"""
from __future__ import annotations
import math
from typing import Sequence
from ember.dtype import DType, dtypes
from ember.errors import DTypeError, ShapeError
from ember.helpers import TRAINING, prod
from ember.tensor import Tensor, _is_contiguous_buffer, _is_done, all_tensors
from ember.uop.ops import Ops, UOp

def is_training() -> bool:
  """Training mode: `Tensor.training = True` or `Context(TRAINING=1)` (BatchNorm batch statistics, Dropout)."""
  return bool(Tensor.training) or bool(TRAINING)

# ** in-place update **

def assign(target: Tensor, value: Tensor) -> Tensor:
  """Write `value` into `target`'s buffer (lazily: it happens when `target` is realized) and return `target`.

  Same contract as `Tensor.assign`; kept here because core's assign looks its pending readers up with `==` (an
  elementwise Tensor op) instead of identity, which raises for any other live non-scalar tensor.
  """
  if value.shape != target.shape: raise ShapeError(f"assign shape mismatch: target {target.shape} <- value {value.shape}")
  if value.device != target.device:
    raise ShapeError(f"assign device mismatch: target on {target.device}, value on {value.device}; move one with .to()")
  if not _is_done(target.uop): target.realize()  # an earlier pending assign lands in the buffer first
  if not _is_contiguous_buffer(target.uop): target.replace(target.contiguous()).realize()
  value = value.cast(target.dtype)
  bufs = target.uop.buffers
  # anything still lazy that reads the old contents must run before they are overwritten
  readers = [t for t in list(all_tensors) if t is not target and t is not value and not _is_done(t.uop) and t.uop.buffers & bufs]
  if readers: Tensor.realize(*readers)
  target.uop = UOp(Ops.ASSIGN, target.dtype, (target.uop, value.uop))
  return target

# ** initialisation (as PyTorch does it) **

def uniform(*shape: int, low: float = 0.0, high: float = 1.0, dtype: DType | None = None, device: str | None = None) -> Tensor:
  """Samples from U[low, high), realized into a fresh buffer."""
  u = Tensor.rand(*shape, device=device, dtype=dtypes.float32)
  return (u * (high - low) + low).cast(dtype or dtypes.default_float).contiguous().realize()

def normal(*shape: int, mean: float = 0.0, std: float = 1.0, dtype: DType | None = None, device: str | None = None) -> Tensor:
  """Samples from N(mean, std^2), realized into a fresh buffer."""
  n = Tensor.randn(*shape, device=device, dtype=dtypes.float32)
  return (n * std + mean).cast(dtype or dtypes.default_float).contiguous().realize()

def kaiming_uniform(*shape: int, a: float = math.sqrt(5), fan_in: int | None = None, dtype: DType | None = None,
                    device: str | None = None) -> Tensor:
  """torch.nn.init.kaiming_uniform_ with leaky-relu slope `a`: U(-b, b), b = sqrt(6 / ((1 + a^2) fan_in))."""
  fan = fan_in if fan_in is not None else prod(shape[1:])
  bound = math.sqrt(6.0 / ((1 + a * a) * fan))
  return uniform(*shape, low=-bound, high=bound, dtype=dtype, device=device)

def filled(shape: tuple[int, ...], value: float | int, dtype: DType | None = None, device: str | None = None) -> Tensor:
  """A realized buffer filled with `value` (parameters and running statistics must be real buffers to be assigned)."""
  return Tensor.full(shape, value, dtype=dtype or dtypes.default_float, device=device).contiguous().realize()

# ** activations and losses **

def softmax(x: Tensor, axis: int = -1) -> Tensor:
  e = (x - x.max(axis, keepdim=True).detach()).exp()
  return e / e.sum(axis, keepdim=True)

def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
  shifted = x - x.max(axis, keepdim=True).detach()
  return shifted - shifted.exp().sum(axis, keepdim=True).log()

def gelu(x: Tensor) -> Tensor:
  """The tanh approximation of GELU."""
  return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())

def silu(x: Tensor) -> Tensor: return x * x.sigmoid()

def leaky_relu(x: Tensor, slope: float = 0.01) -> Tensor: return (x > 0).where(x, x * slope)

def one_hot(labels: Tensor, num_classes: int, dtype: DType | None = None) -> Tensor:
  """(...,) integer labels -> (..., num_classes) with a 1 at each label."""
  if not dtypes.is_int(labels.dtype): raise DTypeError(f"one_hot needs integer labels, got {labels.dtype!r}; cast them with .int()")
  classes = Tensor.arange(num_classes, device=labels.device, dtype=labels.dtype)
  return (labels.unsqueeze(-1) == classes).cast(dtype or dtypes.default_float)

def cross_entropy(logits: Tensor, labels: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int | None = None) -> Tensor:
  """torch.nn.functional.cross_entropy for (N, C) logits (or (C,)) and integer class labels (N,)."""
  if logits.ndim not in (1, 2): raise ShapeError(f"cross_entropy expects (N, C) or (C,) logits, got shape {logits.shape}")
  if labels.shape != logits.shape[:-1]:
    raise ShapeError(f"cross_entropy: labels shape {labels.shape} must be logits shape {logits.shape} without the class dim")
  num_classes = int(logits.shape[-1])
  logp = log_softmax(logits, -1)
  target = one_hot(labels, num_classes, logp.dtype)
  if label_smoothing: target = target * (1 - label_smoothing) + label_smoothing / num_classes
  per_sample = -(logp * target).sum(-1)
  if ignore_index is not None:
    keep = (labels != ignore_index).cast(logp.dtype)
    per_sample = per_sample * keep
    if reduction == "mean": return per_sample.sum() / keep.sum()
  if reduction == "mean": return per_sample.mean()
  if reduction == "sum": return per_sample.sum()
  if reduction == "none": return per_sample
  raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")

def mse_loss(x: Tensor, y: Tensor) -> Tensor: return (x - y).square().mean()

def dropout(x: Tensor, p: float = 0.5) -> Tensor:
  """Zero each element with probability p and scale the rest by 1/(1-p); the identity outside training mode."""
  if not 0 <= p <= 1: raise ValueError(f"dropout probability must be in [0, 1], got {p}")
  if not is_training() or p == 0: return x
  if p == 1: return x * 0
  keep = Tensor.rand(*x.shape, device=x.device) >= p
  return keep.where(x / (1 - p), 0.0).cast(x.dtype)

# ** normalisation **

def normalize(x: Tensor, axes: tuple[int, ...], eps: float) -> Tensor:
  """(x - mean) / sqrt(var + eps) over `axes`, with the biased variance (as every torch norm layer uses)."""
  centered = x - x.mean(axes, keepdim=True)
  return centered * (centered.square().mean(axes, keepdim=True) + eps).rsqrt()

def layer_norm(x: Tensor, normalized_shape: tuple[int, ...], weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
  n = len(normalized_shape)
  if tuple(x.shape[x.ndim - n:]) != tuple(normalized_shape):
    raise ShapeError(f"layer_norm: input shape {x.shape} does not end with normalized_shape {tuple(normalized_shape)}")
  out = normalize(x, tuple(range(x.ndim - n, x.ndim)), eps)
  if weight is not None: out = out * weight
  return out + bias if bias is not None else out

def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
  out = x * (x.square().mean(-1, keepdim=True) + eps).rsqrt()
  return out * weight if weight is not None else out

def _channel_view(t: Tensor, ndim: int) -> Tensor: return t.reshape(1, -1, *([1] * (ndim - 2)))  # (1, C, 1, ...)

def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
  if x.ndim < 2 or x.shape[1] % num_groups != 0:
    raise ShapeError(f"group_norm: {num_groups} groups must divide the channel dim of input shape {x.shape}")
  grouped = x.reshape(x.shape[0], num_groups, -1)  # (N, G, C/G * spatial)
  out = normalize(grouped, (2,), eps).reshape(x.shape)
  if weight is not None: out = out * _channel_view(weight, x.ndim)
  return out + _channel_view(bias, x.ndim) if bias is not None else out

# ** convolution and pooling **

def _tuple(v: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
  out = (v,) * n if isinstance(v, int) else tuple(v)
  if len(out) != n: raise ShapeError(f"{name} {v} needs {n} values, one per spatial dim")
  return out

def _window_last(x: Tensor, k: int, stride: int, dilation: int) -> Tensor:
  """(..., L) -> (..., O, k) with out[..., o, j] = x[..., o*stride + j*dilation], from movement ops only."""
  length = int(x.shape[-1])
  out_len = (length - dilation * (k - 1) - 1) // stride + 1
  if out_len <= 0: raise ShapeError(f"window of {k} (dilation {dilation}) does not fit a spatial dim of {length}")
  lead = x.shape[:-1]
  # k copies of the row laid end to end, re-cut into rows of length L+dilation: row j starts at x[j*dilation]
  rows = x.unsqueeze(-2).expand(*lead, k, length).reshape(*lead, k * length)
  rows = rows.pad(((0, 0),) * len(lead) + ((0, k * dilation),)).reshape(*lead, k, length + dilation)
  span = (out_len - 1) * stride + 1
  rows = rows.shrink(tuple((0, s) for s in lead) + ((0, k), (0, span)))
  if stride > 1:  # keep every stride-th element: pad to out_len*stride, view as (out_len, stride), take column 0
    rows = rows.pad(((0, 0),) * (len(lead) + 1) + ((0, out_len * stride - span),)).reshape(*lead, k, out_len, stride)
    rows = rows.shrink(tuple((0, s) for s in rows.shape[:-1]) + ((0, 1),)).reshape(*lead, k, out_len)
  return rows.transpose(-1, -2)  # (..., O, k)

def windows(x: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
  """(*lead, *spatial) -> (*lead, *out_spatial, *kernel): every sliding window of the trailing spatial dims."""
  nsp = len(kernel)
  lead = x.ndim - nsp
  for i in range(nsp):
    pos = lead + i
    # move spatial dim i last, cut it into (O, k), then put O back at pos and keep k after the previous kernel dims
    order = [d for d in range(x.ndim) if d != pos] + [pos]
    w = _window_last(x.permute(order), kernel[i], stride[i], dilation[i])
    nd = w.ndim  # dims: others (nd-2 of them), O, k
    others = list(range(nd - 2))
    x = w.permute(others[:pos] + [nd - 2] + others[pos:] + [nd - 1])
  return x

def conv(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | Sequence[int] = 1,
         padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1) -> Tensor:
  """N-d convolution (cross-correlation, as torch's conv1d/2d/3d): x (N, Cin, *S), weight (Cout, Cin/groups, *K)."""
  nsp = weight.ndim - 2
  if x.ndim != nsp + 2: raise ShapeError(f"conv: input shape {x.shape} needs {nsp + 2} dims for weight shape {weight.shape}")
  cout, cin_g = int(weight.shape[0]), int(weight.shape[1])
  cin = int(x.shape[1])
  if cin != cin_g * groups or cout % groups != 0:
    raise ShapeError(f"conv: input channels {cin} != weight in-channels {cin_g} x groups {groups} (weight {weight.shape}), "
                     f"or out-channels {cout} not divisible by groups")
  kernel = tuple(int(k) for k in weight.shape[2:])
  st, dil = _tuple(stride, nsp, "stride"), _tuple(dilation, nsp, "dilation")
  pad = _tuple(padding, nsp, "padding")
  xp = x.pad(((0, 0), (0, 0)) + tuple((p, p) for p in pad))
  win = windows(xp, kernel, st, dil)  # (N, Cin, *O, *K)
  out_sp = tuple(int(s) for s in win.shape[2:2 + nsp])
  n = int(x.shape[0])
  win = win.reshape(n, groups, 1, cin_g, *out_sp, *kernel)  # (N, G, 1, Cin/G, *O, *K)
  w = weight.reshape(1, groups, cout // groups, cin_g, *([1] * nsp), *kernel)  # (1, G, Cout/G, Cin/G, *1, *K)
  red = (3,) + tuple(range(4 + nsp, 4 + 2 * nsp))
  out = (win * w).sum(red).reshape(n, cout, *out_sp)
  return out + bias.reshape(1, cout, *([1] * nsp)) if bias is not None else out

def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int | Sequence[int] = 1,
           padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1) -> Tensor:
  if weight.ndim != 4: raise ShapeError(f"conv2d needs a 4-d weight (Cout, Cin/groups, KH, KW), got shape {weight.shape}")
  return conv(x, weight, bias, stride, padding, dilation, groups)

def _pool(x: Tensor, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None, padding: int | Sequence[int],
          dilation: int | Sequence[int], nsp: int, fill: float) -> Tensor:
  kernel = _tuple(kernel_size, nsp, "kernel_size")
  st = kernel if stride is None else _tuple(stride, nsp, "stride")
  pad = _tuple(padding, nsp, "padding")
  lead = ((0, 0),) * (x.ndim - nsp)
  xp = x.pad(lead + tuple((p, p) for p in pad), value=fill) if any(pad) else x
  return windows(xp, kernel, st, _tuple(dilation, nsp, "dilation"))

def max_pool2d(x: Tensor, kernel_size: int | Sequence[int] = 2, stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1) -> Tensor:
  """torch's max_pool2d (stride defaults to the kernel size; padding counts as -inf)."""
  return _pool(x, kernel_size, stride, padding, dilation, 2, -math.inf).max((-2, -1))

def avg_pool2d(x: Tensor, kernel_size: int | Sequence[int] = 2, stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0) -> Tensor:
  """torch's avg_pool2d with count_include_pad=True (padding counts as 0 in the mean)."""
  return _pool(x, kernel_size, stride, padding, 1, 2, 0.0).mean((-2, -1))
