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
from typing import Callable, Sequence, cast
from ember import Tensor
from ember.dtype import DType, dtypes
from ember.errors import ArgumentError, DTypeError, ShapeError

Ints = int | Sequence[int]  # a size per spatial dim, or one for all of them
Sizes = int | None | Sequence[int | None]  # adaptive pooling's output size: None keeps that dim's input size

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

# ** shared argument handling **

_REDUCTIONS = ("none", "mean", "sum")

def _check_reduction(reduction: str, fn: str, allowed: tuple[str, ...] = _REDUCTIONS) -> None:
  if reduction not in allowed:
    raise ArgumentError(f"{fn}: reduction must be one of {', '.join(map(repr, allowed))}, got {reduction!r}")

def _reduce(loss: Tensor, reduction: str) -> Tensor:
  """A checked reduction name applied to a per-element loss."""
  if reduction == "sum": return loss.sum()
  return loss.mean() if reduction == "mean" else loss

def _same_size(a: Tensor, b: Tensor, fn: str, what: str = "target") -> None:
  if a.shape != b.shape:
    raise ShapeError(f"{fn}: {what} size {b.shape} must be the same as the input size {a.shape}")

def _result(x: Tensor, out: Tensor, inplace: bool) -> Tensor:
  """torch's `inplace=True`: the result is written into `x` (Tensor.assign, lazy like every in-place method) and `x`
  is returned."""
  return x.assign(out) if inplace else out

def _ntuple(v: Ints, n: int, name: str) -> tuple[int, ...]:
  ret = (int(v),) * n if isinstance(v, int) else tuple(int(a) for a in v)
  if len(ret) == 1 and n > 1: ret = ret * n
  if len(ret) != n: raise ShapeError(f"{name} {tuple(ret)} needs 1 or {n} entries, one per spatial dim")
  return ret

def _check_p(p: float, fn: str) -> None:
  if not 0 <= p <= 1: raise ArgumentError(f"{fn}: probability p must be in [0, 1], got {p}")

# ** activations: torch.nn.functional's names and argument order over the one Tensor implementation **
# Where torch and tinygrad disagree (gelu's default, dropout's `training`, cross_entropy's class dim), these follow
# torch; the Tensor methods are the implementation. `inplace=True` writes the result into the input (Tensor.assign).

def softmax(input: Tensor, dim: int | None = -1, dtype: DType | None = None) -> Tensor:
  """softmax along `dim` (None: the last dim; torch then picks a legacy implicit dim and warns)."""
  return input.softmax(dim, dtype)
def log_softmax(input: Tensor, dim: int | None = -1, dtype: DType | None = None) -> Tensor:
  return input.log_softmax(dim, dtype)
def softmin(input: Tensor, dim: int | None = -1, dtype: DType | None = None) -> Tensor: return input.softmin(dim, dtype)
def gelu(input: Tensor, approximate: str = "none") -> Tensor: return input.gelu(approximate)
def silu(input: Tensor, inplace: bool = False) -> Tensor: return _result(input, input.silu(), inplace)
def mish(input: Tensor, inplace: bool = False) -> Tensor: return _result(input, input.mish(), inplace)
def relu(input: Tensor, inplace: bool = False) -> Tensor: return _result(input, input.relu(), inplace)
def relu6(input: Tensor, inplace: bool = False) -> Tensor: return _result(input, input.relu6(), inplace)
def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
  return _result(input, input.elu(alpha), inplace)
def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
  if alpha == 0: raise ArgumentError("celu: alpha must not be 0 (it divides input)")
  return _result(input, input.celu(alpha), inplace)
def selu(input: Tensor, inplace: bool = False) -> Tensor: return _result(input, input.selu(), inplace)
def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
  return _result(input, input.leaky_relu(negative_slope), inplace)
def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
  if min_val > max_val: raise ArgumentError(f"hardtanh: min_val {min_val} must not exceed max_val {max_val}")
  return _result(input, input.hardtanh(min_val, max_val), inplace)
def hardswish(input: Tensor, inplace: bool = False) -> Tensor: return _result(input, input.hardswish(), inplace)
def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor: return _result(input, input.hardsigmoid(), inplace)
def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
  return input.softplus(beta, threshold)
def softsign(input: Tensor) -> Tensor: return input.softsign()
def logsigmoid(input: Tensor) -> Tensor: return input.logsigmoid()
def sigmoid(input: Tensor) -> Tensor: return input.sigmoid()
def tanh(input: Tensor) -> Tensor: return input.tanh()
def tanhshrink(input: Tensor) -> Tensor: return input - input.tanh()

def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
  """input where input > threshold, else `value`."""
  return _result(input, (input > threshold).where(input, value), inplace)

def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
  """input where |input| > lambd, else 0."""
  return (input.abs() > lambd).where(input, 0)

def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
  """input - lambd above lambd, input + lambd below -lambd, 0 between."""
  if lambd < 0: raise ArgumentError(f"softshrink: lambd must be >= 0, got {lambd}")
  return (input > lambd).where(input - lambd, (input < -lambd).where(input + lambd, 0))

def glu(input: Tensor, dim: int = -1) -> Tensor:
  """a * sigmoid(b) for the two halves a, b of `dim`."""
  if input.ndim == 0: raise ShapeError("glu does not take a 0-d tensor")
  d = input._resolve_dim(dim)
  if input.shape[d] % 2 != 0: raise ShapeError(f"glu halves dim {d}, so its size must be even; got shape {input.shape}")
  a, b = input.chunk(2, d)
  return a * b.sigmoid()

def prelu(input: Tensor, weight: Tensor) -> Tensor:
  """Leaky ReLU with a learned slope: one (weight of one element) or one per channel (dim 1)."""
  channels = input.shape[1] if input.ndim >= 2 else 1
  if weight.numel() not in (1, channels):
    raise ShapeError(f"prelu: weight of {weight.numel()} elements must have 1 or {channels} (the channels of input "
                     f"{input.shape})")
  w = weight.reshape(1, -1, *([1] * (input.ndim - 2))) if weight.numel() > 1 else weight.reshape(())
  return (input > 0).where(input, w * input)

def rrelu(input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,
          inplace: bool = False) -> Tensor:
  """Randomized leaky ReLU: in training each negative element gets a slope drawn from U(lower, upper), otherwise the
  slope is (lower + upper) / 2."""
  if lower > upper: raise ArgumentError(f"rrelu: lower {lower} must not exceed upper {upper}")
  if not training: return leaky_relu(input, (lower + upper) / 2, inplace)
  slope = (Tensor.rand(*input.shape, device=input.device, dtype=input.dtype) * (upper - lower) + lower).contiguous()
  return _result(input, (input >= 0).where(input, input * slope), inplace)

def relu_(input: Tensor) -> Tensor: return relu(input, inplace=True)
def elu_(input: Tensor, alpha: float = 1.0) -> Tensor: return elu(input, alpha, inplace=True)
def celu_(input: Tensor, alpha: float = 1.0) -> Tensor: return celu(input, alpha, inplace=True)
def selu_(input: Tensor) -> Tensor: return selu(input, inplace=True)
def leaky_relu_(input: Tensor, negative_slope: float = 0.01) -> Tensor:
  return leaky_relu(input, negative_slope, inplace=True)
def hardtanh_(input: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
  return hardtanh(input, min_val, max_val, inplace=True)
def threshold_(input: Tensor, threshold: float, value: float) -> Tensor:
  return input.assign((input > threshold).where(input, value))
def rrelu_(input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False) -> Tensor:
  return rrelu(input, lower, upper, training, inplace=True)

def gumbel_softmax(logits: Tensor, tau: float = 1.0, hard: bool = False, eps: float = 1e-10, dim: int = -1) -> Tensor:
  """softmax((logits + g) / tau) with Gumbel(0, 1) noise g. `hard`: the one-hot of the argmax in the forward pass and
  the soft sample's gradient (straight-through). `eps` is unused, as in torch."""
  # -log(Exp(1)) samples, in a buffer of their own: the random bits computed once, not in every kernel reading them
  gumbels = (-(-Tensor.rand(*logits.shape, device=logits.device).clip(min=1e-20).log()).log()).contiguous()
  y_soft = ((logits + gumbels) / tau).softmax(dim)
  if not hard: return y_soft
  d = y_soft._resolve_dim(dim)
  n = static_shape(y_soft, "gumbel_softmax")[d]
  y_hard = (y_soft.argmax(d, keepdim=True) == Tensor.arange(n, device=logits.device).reshape(
    *([1] * d), n, *([1] * (y_soft.ndim - d - 1)))).cast(y_soft.dtype)
  return y_hard - y_soft.detach() + y_soft

def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
  """torch's one_hot: integer class indices -> a new last dim of size num_classes, in the indices' int dtype."""
  return tensor.one_hot(num_classes)
def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
  return input.normalize(p, dim, eps)

# ** dropout **

def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
  """torch.nn.functional.dropout: applied when `training` is true (torch's default), whatever the global mode;
  `nn.Dropout` passes the global training mode."""
  return _result(input, input.dropout(p, training=training), inplace)

def _alpha_mix(x: Tensor, keep: Tensor, p: float) -> Tensor:
  """torch's alpha dropout: dropped values go to SELU's negative saturation and an affine map keeps the mean and
  variance."""
  alpha = 1.7580993408473766  # -(SELU's scale * alpha)
  a = 1 / math.sqrt((alpha * alpha * p + 1) * (1 - p))
  return x * keep * a + (keep - 1) * (alpha * a) + alpha * a * p

def _masked_dropout(x: Tensor, p: float, training: bool, inplace: bool, noise_dims: int, alpha: bool,
                    fn: str) -> Tensor:
  """Dropout with one draw per index of the first `noise_dims` dims, broadcast over the rest (all dims: elementwise;
  (N, C): whole channels)."""
  _check_p(p, fn)
  if not training or p == 0: return x
  if p == 1: return _result(x, x * 0, inplace)
  noise = Tensor.rand(*x.shape[:noise_dims], *([1] * (x.ndim - noise_dims)), device=x.device)
  keep = (noise >= p).cast(x.dtype).contiguous()
  return _result(x, _alpha_mix(x, keep, p) if alpha else x * keep * (1 / (1 - p)), inplace)

def _channel_dropout(x: Tensor, p: float, training: bool, inplace: bool, spatial: int, fn: str) -> Tensor:
  if x.ndim not in (spatial + 1, spatial + 2):
    raise ShapeError(f"{fn} needs a {spatial + 1}-d (C, *spatial) or {spatial + 2}-d (N, C, *spatial) input, got shape "
                     f"{x.shape}")
  # unbatched input draws per channel; torch reads a 3-d dropout2d input as (N, C, L), and so does this
  batched = x.ndim == spatial + 2 or spatial == 2
  return _masked_dropout(x, p, training, inplace, 2 if batched else 1, False, fn)

def dropout1d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
  """Zeroes whole channels of (N, C, L) or (C, L) input with probability p, scaling the rest by 1 / (1 - p)."""
  return _channel_dropout(input, p, training, inplace, 1, "dropout1d")
def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
  """Zeroes whole channels of (N, C, H, W) input; a 3-d input is read as (N, C, L), as torch does."""
  return _channel_dropout(input, p, training, inplace, 2, "dropout2d")
def dropout3d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
  return _channel_dropout(input, p, training, inplace, 3, "dropout3d")

def alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
  """Dropout for SELU networks (torch's formula), off unless `training` (torch's default here)."""
  return _masked_dropout(input, p, training, inplace, input.ndim, True, "alpha_dropout")

def feature_alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
  """alpha_dropout with one draw per (N, C) channel."""
  return _masked_dropout(input, p, training, inplace, min(2, input.ndim), True, "feature_alpha_dropout")
# ** losses **

def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
  """torch.nn.functional.cross_entropy: logits (N, C, ...) or (C,), class dim 1, against class indices or class
  probabilities."""
  _check_reduction(reduction, "cross_entropy")
  return input.cross_entropy(target, reduction, label_smoothing, weight=weight, ignore_index=ignore_index)

def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
             reduction: str = "mean") -> Tensor:
  """Negative log likelihood of log-probabilities (N, C, ...) or (C,) at class indices; `weight` weighs classes and
  the mean divides by the summed weight of the targets that are not `ignore_index`."""
  _check_reduction(reduction, "nll_loss")
  return input.nll_loss(target, weight, ignore_index, reduction)

def linear_cross_entropy(input: Tensor, linear_weight: Tensor, target: Tensor, *, linear_bias: Tensor | None = None,
                         weight: Tensor | None = None, reduction: str = "mean", ignore_index: int | None = None,
                         label_smoothing: float = 0.0) -> Tensor:
  """cross_entropy(linear(input, linear_weight, linear_bias), target, ...), torch's reference form (no chunking: the
  logits are one lazy graph). ignore_index None ignores no class."""
  logits = linear(input, linear_weight, linear_bias)
  return cross_entropy(logits, target, weight, -100 if ignore_index is None else ignore_index, reduction,
                       label_smoothing)

def _weighted(loss: Tensor, weight: Tensor | None, x: Tensor, reduction: str, fn: str) -> Tensor:
  """torch's `weight=` of mse_loss and l1_loss: the same size as the input; the mean divides by the summed weight."""
  if weight is None: return _reduce(loss, reduction)
  _same_size(x, weight, fn, "weight")
  weighted = loss * weight
  return weighted.sum() / weight.sum() if reduction == "mean" else _reduce(weighted, reduction)

def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean", weight: Tensor | None = None) -> Tensor:
  """(input - target)^2 (broadcast, as torch does after a warning)."""
  _check_reduction(reduction, "mse_loss")
  return _weighted((input - target).square(), weight, input, reduction, "mse_loss")

def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean", weight: Tensor | None = None) -> Tensor:
  """|input - target|."""
  _check_reduction(reduction, "l1_loss")
  return _weighted((input - target).abs(), weight, input, reduction, "l1_loss")

def smooth_l1_loss(input: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
  """0.5 d^2 / beta where |d| < beta, |d| - beta / 2 elsewhere (d = input - target; beta 0 is the L1 loss)."""
  _check_reduction(reduction, "smooth_l1_loss")
  if beta < 0: raise ArgumentError(f"smooth_l1_loss: beta must be >= 0, got {beta}")
  d = input - target
  if beta == 0: return _reduce(d.abs(), reduction)
  return _reduce((d.abs() < beta).where(d.square() * (0.5 / beta), d.abs() - 0.5 * beta), reduction)

def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: Tensor | None = None) -> Tensor:
  """0.5 d^2 where |d| < delta, delta (|d| - delta / 2) elsewhere; `weight` scales each element (the mean is the
  plain mean of the weighted losses, as in torch)."""
  _check_reduction(reduction, "huber_loss")
  if delta <= 0: raise ArgumentError(f"huber_loss: delta must be > 0, got {delta}")
  d = input - target
  loss = (d.abs() < delta).where(d.square() * 0.5, (d.abs() - 0.5 * delta) * delta)
  if weight is not None:
    _same_size(input, weight, "huber_loss", "weight")
    loss = loss * weight
  return _reduce(loss, reduction)

def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                         reduction: str = "mean") -> Tensor:
  """-(t log p + (1 - t) log(1 - p)) for probabilities p = input, each log clamped at -100 as in torch; `weight`
  broadcasts over the loss."""
  _check_reduction(reduction, "binary_cross_entropy")
  _same_size(input, target, "binary_cross_entropy")
  loss = input.binary_crossentropy(target, "none")
  return _reduce(loss if weight is None else loss * weight, reduction)

def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
  """Binary cross-entropy of sigmoid(input), computed stably from the logits; `pos_weight` scales the positive term (per
  class, broadcast over the last dim), `weight` each element."""
  _check_reduction(reduction, "binary_cross_entropy_with_logits")
  _same_size(input, target, "binary_cross_entropy_with_logits")
  loss = input.binary_crossentropy_logits(target, "none", pos_weight)
  return _reduce(loss if weight is None else loss * weight, reduction)

def kl_div(input: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
  """KL(target || exp(input)) pointwise: target (log target - input), 0 where target is 0. `input` holds
  log-probabilities (and `target` too with `log_target`). reduction="batchmean" divides the sum by the batch size (the
  KL divergence; torch's "mean" divides by the element count)."""
  _check_reduction(reduction, "kl_div", (*_REDUCTIONS, "batchmean"))
  if log_target: loss = target.exp() * (target - input)
  else: loss = target * (target == 0).where(1, target).log() - target * input  # xlogy(t, t): 0 at t == 0, NaN below
  if reduction == "batchmean": return loss.sum() / (input.shape[0] if input.ndim else 1)
  return _reduce(loss, reduction)

def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True, full: bool = False, eps: float = 1e-8,
                     reduction: str = "mean") -> Tensor:
  """Poisson negative log likelihood of rate exp(input) (`log_input`) or input, with Stirling's term for targets > 1
  when `full`."""
  _check_reduction(reduction, "poisson_nll_loss")
  loss = input.exp() - target * input if log_input else input - target * (input + eps).log()
  if full:
    t = (target > 1).where(target, 1)  # the term is 0 for targets <= 1; 1 keeps its logs finite there
    loss = loss + (target > 1).where(t * t.log() - t + 0.5 * (2 * math.pi * t).log(), 0)
  return _reduce(loss, reduction)

def gaussian_nll_loss(input: Tensor, target: Tensor, var: Tensor | float, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean") -> Tensor:
  """0.5 (log var + (input - target)^2 / var) (+ 0.5 log 2 pi when `full`), var clamped at `eps` (the gradient passes
  the clamp, as in torch). `var`: the input's shape, that shape less its last dim, one dim of size 1, or a float. A
  negative float var is refused; a tensor's entries are not checked (that would wait for the device)."""
  _check_reduction(reduction, "gaussian_nll_loss")
  if isinstance(var, (int, float)):
    if var < 0: raise ArgumentError(f"gaussian_nll_loss: var must be >= 0, got {var}")
    v = Tensor.full(input.shape, float(var), dtype=input.dtype, device=input.device)
  else: v = var
  if v.shape != input.shape:
    if v.shape == input.shape[:-1]: v = v.unsqueeze(-1)
    elif not (v.ndim == input.ndim and sum(b for a, b in zip(input.shape, v.shape) if a != b) == 1):
      raise ShapeError(f"gaussian_nll_loss: var of shape {v.shape} does not fit input {input.shape}: give the input's "
                       "shape, that shape without its last dim, or a size-1 dim in place of one of its dims")
  v = v + (v.maximum(eps) - v).detach()
  loss = 0.5 * (v.log() + (input - target).square() / v)
  return _reduce(loss + 0.5 * math.log(2 * math.pi) if full else loss, reduction)

def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                        reduction: str = "mean") -> Tensor:
  """max(0, -target (input1 - input2) + margin), target in {1, -1}."""
  _check_reduction(reduction, "margin_ranking_loss")
  if not input1.ndim == input2.ndim == target.ndim:
    raise ShapeError(f"margin_ranking_loss: input1 {input1.shape}, input2 {input2.shape} and target {target.shape} "
                     "must have the same number of dims")
  return _reduce((-target * (input1 - input2) + margin).relu(), reduction)

def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0, reduction: str = "mean") -> Tensor:
  """input where target is 1, max(0, margin - input) where target is -1 (torch adds both terms for other targets)."""
  _check_reduction(reduction, "hinge_embedding_loss")
  loss = (target != 1).where((margin - input).relu(), 0) + (target != -1).where(input, 0)
  return _reduce(loss, reduction)

def soft_margin_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
  """log(1 + exp(-target input)), target in {1, -1}."""
  _check_reduction(reduction, "soft_margin_loss")
  return _reduce((-target * input).logaddexp(0), reduction)

def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                          reduction: str = "mean") -> Tensor:
  """1 - cos(input1, input2) where target is 1, max(0, cos - margin) where it is -1; cos over the last dim of (N, D) or
  (D,) inputs."""
  _check_reduction(reduction, "cosine_embedding_loss")
  if input1.shape != input2.shape or input1.ndim not in (1, 2) or target.ndim != input1.ndim - 1:
    raise ShapeError(f"cosine_embedding_loss: inputs (N, D) or (D,) of one shape and target (N,) or (), got "
                     f"{input1.shape}, {input2.shape} and {target.shape}")
  eps = 1e-12  # torch's: added to each squared norm
  cos = (input1 * input2).sum(-1) / ((input1.square().sum(-1) + eps) * (input2.square().sum(-1) + eps)).sqrt()
  loss = (target == 1).where(1 - cos, 0) + (target == -1).where((cos - margin).relu(), 0)
  return _reduce(loss, reduction)

def _vector_norm(x: Tensor, p: float, dim: int, keepdim: bool = False) -> Tensor:
  if p == math.inf: return x.abs().max(dim, keepdim=keepdim)
  if p == -math.inf: return x.abs().min(dim, keepdim=keepdim)
  if p == 0: return (x != 0).cast(x.dtype).sum(dim, keepdim=keepdim)
  if p == 2: return x.square().sum(dim, keepdim=keepdim).sqrt()
  if p == 1: return x.abs().sum(dim, keepdim=keepdim)
  return x.abs().pow(p).sum(dim, keepdim=keepdim).pow(1 / p)

def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
  """The p-norm of x1 - x2 + eps over the last dim (the inputs broadcast)."""
  if p < 0: raise ArgumentError(f"pairwise_distance: p must be >= 0, got {p}")
  return _vector_norm(x1 - x2 + eps, p, max(x1.ndim, x2.ndim) - 1, keepdim)

def pdist(input: Tensor, p: float = 2.0) -> Tensor:
  """The p-norm distances between the rows of an (N, M) input, for each pair i < j in row-major order."""
  if input.ndim != 2: raise ShapeError(f"pdist needs a 2-d (N, M) input, got shape {input.shape}")
  if p < 0: raise ArgumentError(f"pdist: p must be >= 0, got {p}")
  n = static_shape(input, "pdist")[0]
  pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
  if not pairs: return Tensor.zeros(0, dtype=input.dtype, device=input.device)
  # only the pairs: a full (N, N) matrix would hold the zero diagonal, whose norm has no gradient
  rows_i = Tensor([i for i, _ in pairs], dtype=dtypes.int32, device=input.device)
  rows_j = Tensor([j for _, j in pairs], dtype=dtypes.int32, device=input.device)
  return _vector_norm(input[rows_i] - input[rows_j], p, 1)

def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
  """sum(x1 * x2) / (max(||x1||, eps) max(||x2||, eps)) along `dim` (the inputs broadcast)."""
  n1 = x1.square().sum(dim, keepdim=True).sqrt().maximum(eps)
  n2 = x2.square().sum(dim, keepdim=True).sqrt().maximum(eps)
  return ((x1 / n1) * (x2 / n2)).sum(dim)

def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0, p: float = 2,
                        eps: float = 1e-6, swap: bool = False, reduction: str = "mean") -> Tensor:
  """max(0, margin + d(anchor, positive) - d(anchor, negative)) with the pairwise p-norm distance d; `swap` uses
  min(d(a, n), d(p, n)) as the negative distance."""
  _check_reduction(reduction, "triplet_margin_loss")
  if not anchor.ndim == positive.ndim == negative.ndim:
    raise ShapeError(f"triplet_margin_loss: anchor {anchor.shape}, positive {positive.shape} and negative "
                     f"{negative.shape} must have the same number of dims")
  if margin <= 0: raise ArgumentError(f"triplet_margin_loss: margin must be > 0, got {margin}")
  d_pos = pairwise_distance(anchor, positive, p, eps)
  d_neg = pairwise_distance(anchor, negative, p, eps)
  if swap: d_neg = d_neg.minimum(pairwise_distance(positive, negative, p, eps))
  return _reduce((margin + d_pos - d_neg).relu(), reduction)

def triplet_margin_with_distance_loss(anchor: Tensor, positive: Tensor, negative: Tensor, *,
                                      distance_function: Callable[[Tensor, Tensor], Tensor] | None = None,
                                      margin: float = 1.0, swap: bool = False, reduction: str = "mean") -> Tensor:
  """triplet_margin_loss with any distance (pairwise_distance by default)."""
  _check_reduction(reduction, "triplet_margin_with_distance_loss")
  if margin <= 0: raise ArgumentError(f"triplet_margin_with_distance_loss: margin must be > 0, got {margin}")
  dist = distance_function if distance_function is not None else pairwise_distance
  d_pos, d_neg = dist(anchor, positive), dist(anchor, negative)
  if swap: d_neg = d_neg.minimum(dist(positive, negative))
  return _reduce((margin + d_pos - d_neg).relu(), reduction)

def _class_pick(x: Tensor, target: Tensor, fn: str) -> tuple[Tensor, Tensor]:
  """(N, C) scores and (N,) class indices -> the one-hot mask (N, C) (the indices checked) and the target scores
  (N, 1)."""
  if not dtypes.is_int(target.dtype):
    raise DTypeError(f"{fn}: target must hold int class indices, got {target.dtype!r}")
  if x.ndim != 2 or target.shape != x.shape[:1]:
    raise ShapeError(f"{fn}: input (N, C) or (C,) needs target (N,) or (), got {x.shape} and {target.shape}")
  onehot = target.one_hot(static_shape(x, fn)[1]).cast(dtypes.bool)
  return onehot, onehot.where(x, 0).sum(1, keepdim=True)

def multi_margin_loss(input: Tensor, target: Tensor, p: int = 1, margin: float = 1.0, weight: Tensor | None = None,
                      reduction: str = "mean") -> Tensor:
  """Multi-class hinge loss: sum over classes i != y of max(0, margin - input[y] + input[i])^p / C, times weight[y]."""
  _check_reduction(reduction, "multi_margin_loss")
  if p not in (1, 2): raise ArgumentError(f"multi_margin_loss: p must be 1 or 2, got {p}")
  unbatched = input.ndim <= 1
  xs, ts = (input.reshape(1, -1), target.reshape(1)) if unbatched else (input, target)
  onehot, picked = _class_pick(xs, ts, "multi_margin_loss")
  z = (margin - picked + xs).relu()
  if p == 2: z = z.square()
  if weight is not None: z = z * onehot.where(weight.reshape(1, -1), 0).sum(1, keepdim=True)
  loss = onehot.where(0, z).sum(1) / xs.shape[1]
  return _reduce(loss.reshape(()) if unbatched else loss, reduction)

def multilabel_margin_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
  """Multi-label hinge loss: target holds class indices per sample, ended by the first -1; the loss sums
  max(0, 1 - (input[y] - input[i])) over its classes y and the classes i not in it, over C."""
  _check_reduction(reduction, "multilabel_margin_loss")
  if target.shape != input.shape or input.ndim not in (1, 2):
    raise ShapeError(f"multilabel_margin_loss: input and target must both be (N, C) or (C,), got {input.shape} and "
                     f"{target.shape}")
  xs, ts = (input.reshape(1, -1), target.reshape(1, -1)) if input.ndim == 1 else (input, target)
  c = static_shape(xs, "multilabel_margin_loss")[1]
  valid = (ts != -1).cast(dtypes.int32).cumprod(1).cast(dtypes.bool)  # the targets before the first -1  (N, J)
  onehot = valid.unsqueeze(-1).where(valid.where(ts, 0).one_hot(c), 0).cast(dtypes.bool)  # (N, J, C)
  is_target = onehot.any(1, keepdim=True)  # (N, 1, C)
  picked = onehot.where(xs.unsqueeze(1), 0).sum(-1, keepdim=True)  # input[y_j]  (N, J, 1)
  hinge = (1 - picked + xs.unsqueeze(1)).relu()
  loss = (valid.unsqueeze(-1) & is_target.logical_not()).where(hinge, 0).sum((1, 2)) / c
  return _reduce(loss.reshape(()) if input.ndim == 1 else loss, reduction)

def multilabel_soft_margin_loss(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                reduction: str = "mean") -> Tensor:
  """The mean over classes (the last dim) of the binary cross-entropy of sigmoid(input) against 0/1 targets."""
  _check_reduction(reduction, "multilabel_soft_margin_loss")
  loss = -(target * input.logsigmoid() + (1 - target) * (-input).logsigmoid())
  if weight is not None: loss = loss * weight
  return _reduce(loss.sum(-1) / input.shape[-1], reduction)

# ** linear layers and embeddings **

def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
  """input @ weight.T + bias with torch's (out_features, in_features) weight (Tensor.linear takes (in, out))."""
  if weight.ndim not in (1, 2): raise ShapeError(f"linear needs a 1-d or 2-d weight, got shape {weight.shape}")
  out = input @ (weight.transpose(0, 1) if weight.ndim == 2 else weight)
  return out if bias is None else out + bias

def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
  """input1^T A_o input2 + b_o for each output o: input1 (..., in1), input2 (..., in2), weight (out, in1, in2)."""
  if weight.ndim != 3 or input1.shape[-1] != weight.shape[1] or input2.shape[-1] != weight.shape[2] \
     or input1.shape[:-1] != input2.shape[:-1]:
    raise ShapeError(f"bilinear: inputs (..., in1) {input1.shape} and (..., in2) {input2.shape} with the same leading "
                     f"dims need a weight (out, in1, in2), got {weight.shape}")
  out = Tensor.einsum("...i,oij,...j->...o", input1, weight, input2)
  return out if bias is None else out + bias

def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
  """The rows of `weight` (num_embeddings, dim) at the int ids `input`. `padding_idx`: that row gets no gradient.
  `max_norm`: the looked-up rows whose `norm_type`-norm exceeds it are rescaled in `weight` itself (in place, as
  torch does). `scale_grad_by_freq`: each row's gradient is divided by how often its id occurs in `input`. `sparse`
  gradients do not exist here: the gradient is dense."""
  if not dtypes.is_int(input.dtype):
    raise DTypeError(f"embedding needs integer ids, got {input.dtype!r}; cast them with .int()")
  if weight.ndim != 2: raise ShapeError(f"embedding needs a 2-d weight (num_embeddings, dim), got {weight.shape}")
  num = static_shape(weight, "embedding")[0]
  if padding_idx is not None:
    if not -num <= padding_idx < num:
      raise ArgumentError(f"embedding: padding_idx {padding_idx} must be within [-{num}, {num}) for {num} embeddings")
    padding_idx = padding_idx % num
  # a one-hot matmul, as nn.Embedding: one_hot checks the ids (torch raises for one outside the table)
  onehot = input.one_hot(num).cast(weight.dtype)
  if max_norm is not None:
    used = onehot.reshape(-1, num).sum(0).reshape(num, 1) > 0
    norms = _vector_norm(weight.detach(), norm_type, 1, keepdim=True)
    scale = (used & (norms > max_norm)).where(max_norm / (norms + 1e-7), 1)
    assign(weight, weight.detach() * scale)
  rows = onehot @ weight
  if scale_grad_by_freq:
    flat = input.flatten()
    counts = (input.unsqueeze(-1) == flat).sum(-1).cast(weight.dtype).unsqueeze(-1)
    rows = rows / counts + rows.detach() * (1 - 1 / counts)  # value unchanged, gradient divided by the count
  if padding_idx is not None: rows = (input != padding_idx).unsqueeze(-1).where(rows, rows.detach())
  return rows

def embedding_bag(input: Tensor, weight: Tensor, offsets: Tensor | None = None, max_norm: float | None = None,
                  norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                  per_sample_weights: Tensor | None = None, include_last_offset: bool = False,
                  padding_idx: int | None = None) -> Tensor:
  """Sums, means or maxima of bags of embeddings (an empty bag gives zeros). 2-d ids (B, N): one bag per row. 1-d ids
  need `offsets`, the start of each bag (with `include_last_offset` one more entry, the end of the last bag); they are
  used on the device as they are, not checked. `per_sample_weights` scales each row (mode "sum" only); ids equal to
  `padding_idx` are left out of their bag. `sparse` gradients do not exist here: the gradient is dense."""
  if mode not in ("sum", "mean", "max"):
    raise ArgumentError(f"embedding_bag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
  if per_sample_weights is not None and mode != "sum":
    raise ArgumentError(f"embedding_bag: per_sample_weights only work with mode='sum', got mode={mode!r}")
  if per_sample_weights is not None and per_sample_weights.shape != input.shape:
    raise ShapeError(f"embedding_bag: per_sample_weights {per_sample_weights.shape} must match the ids {input.shape}")
  if input.ndim == 2:
    if offsets is not None: raise ShapeError("embedding_bag: offsets must be None for 2-d input (one bag per row)")
    member = Tensor.ones(input.shape, dtype=dtypes.bool, device=input.device)  # (B, N): bag b is row b
    ids, psw = input, per_sample_weights
  elif input.ndim == 1:
    if offsets is None or offsets.ndim != 1:
      raise ShapeError(f"embedding_bag: 1-d input needs 1-d offsets, got {None if offsets is None else offsets.shape}")
    n = static_shape(input, "embedding_bag")[0]
    bags = static_shape(offsets, "embedding_bag")[0] - int(include_last_offset)
    pos = Tensor.arange(n, device=input.device, dtype=offsets.dtype).reshape(1, n)
    bag_of = (pos >= offsets[:bags].reshape(bags, 1)).sum(0, dtype=dtypes.int32) - 1  # each id's bag  (N,)
    member = bag_of.reshape(1, n) == Tensor.arange(bags, device=input.device, dtype=dtypes.int32).reshape(bags, 1)
    if include_last_offset: member = member & (pos < offsets[bags])
    ids = input.reshape(1, n)  # one row that every bag picks from
    psw = None if per_sample_weights is None else per_sample_weights.reshape(1, n)
  else: raise ShapeError(f"embedding_bag needs 1-d or 2-d ids, got shape {input.shape}")
  rows = embedding(ids, weight, None, max_norm, norm_type, scale_grad_by_freq)  # (1 or B, N, D)
  if padding_idx is not None: member = member & (ids != padding_idx % weight.shape[0])
  if psw is not None: rows = rows * psw.unsqueeze(-1)
  keep = member.unsqueeze(-1)  # (B, N, 1)
  if mode == "max": return member.any(1, keepdim=True).where(keep.where(rows, -math.inf).max(1), 0)
  summed = keep.where(rows, 0).sum(1)  # (B, D)
  if mode == "sum": return summed
  return summed / member.sum(1, keepdim=True).maximum(1).cast(summed.dtype)

# ** normalisation **

def _standardize(x: Tensor, axes: tuple[int, ...], eps: float) -> Tensor:
  """(x - mean) / sqrt(var + eps) over `axes`, with the biased variance (as every torch norm layer uses)."""
  centered = x - x.mean(axes, keepdim=True)
  return centered * (centered.square().mean(axes, keepdim=True) + eps).rsqrt()

def layer_norm(input: Tensor, normalized_shape: Ints, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
  shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
  n = len(shape)
  if tuple(input.shape[input.ndim - n:]) != shape:
    raise ShapeError(f"layer_norm: input shape {input.shape} does not end with normalized_shape {shape}")
  out = _standardize(input, tuple(range(input.ndim - n, input.ndim)), eps)
  if weight is not None: out = out * weight
  return out + bias if bias is not None else out

def rms_norm(input: Tensor, normalized_shape: Ints, weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
  """input / sqrt(mean(input^2) + eps) over the trailing `normalized_shape` dims, times `weight`; eps None is the
  machine epsilon of input's dtype (torch's default)."""
  shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
  n = len(shape)
  if tuple(input.shape[input.ndim - n:]) != shape:
    raise ShapeError(f"rms_norm: input shape {input.shape} does not end with normalized_shape {shape}")
  if eps is None: eps = 2.0 ** -dtypes.finfo(input.dtype if dtypes.is_float(input.dtype) else dtypes.default_float)[1]
  out = input * (input.square().mean(tuple(range(input.ndim - n, input.ndim)), keepdim=True) + eps).rsqrt()
  return out * weight if weight is not None else out

def _channel_view(t: Tensor, ndim: int) -> Tensor: return t.reshape(1, -1, *([1] * (ndim - 2)))  # (1, C, 1, ...)

def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
  if input.ndim < 2 or input.shape[1] % num_groups != 0:
    raise ShapeError(f"group_norm: {num_groups} groups must divide the channel dim of input shape {input.shape}")
  grouped = input.reshape(input.shape[0], num_groups, -1)  # (N, G, C/G * spatial)
  out = _standardize(grouped, (2,), eps).reshape(input.shape)
  if weight is not None: out = out * _channel_view(weight, input.ndim)
  return out + _channel_view(bias, input.ndim) if bias is not None else out

def _affine(out: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
  if weight is not None: out = out * _channel_view(weight, out.ndim)
  return out + _channel_view(bias, out.ndim) if bias is not None else out

def _update_running(running: Tensor | None, stat: Tensor, momentum: float) -> None:
  """running = (1 - momentum) running + momentum stat, written into the running buffer."""
  if running is not None: assign(running, (1 - momentum) * running + momentum * stat.detach().cast(running.dtype))

def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
  """Normalises each channel (dim 1) of (N, C, ...) input: in training with the batch's mean and biased variance,
  updating the running statistics given (with the unbiased variance, in place, as torch); otherwise with the running
  statistics."""
  if input.ndim < 2: raise ShapeError(f"batch_norm needs (N, C, ...) input, got shape {input.shape}")
  axes = (0, *range(2, input.ndim))
  count = input.numel() // input.shape[1]
  if not training:
    if running_mean is None or running_var is None:
      raise ArgumentError("batch_norm: running_mean and running_var are needed unless training=True")
    inv = (running_var + eps).rsqrt()
    return _affine((input - _channel_view(running_mean, input.ndim)) * _channel_view(inv, input.ndim), weight, bias)
  if count <= 1:
    raise ShapeError(f"batch_norm: expected more than 1 value per channel when training, got input shape {input.shape}")
  mean = input.mean(axes, keepdim=True)
  var = (input - mean).square().mean(axes, keepdim=True)
  _update_running(running_mean, mean.reshape(-1), momentum)
  _update_running(running_var, var.reshape(-1) * (count / (count - 1)), momentum)
  return _affine((input - mean) * (var + eps).rsqrt(), weight, bias)

def instance_norm(input: Tensor, running_mean: Tensor | None = None, running_var: Tensor | None = None,
                  weight: Tensor | None = None, bias: Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
  """Normalises each (sample, channel) of (N, C, *spatial) input over its spatial dims; the running statistics given
  are updated with the batch mean of the instance statistics. `use_input_stats=False` uses the running ones."""
  if input.ndim < 3: raise ShapeError(f"instance_norm needs (N, C, *spatial) input, got shape {input.shape}")
  if not use_input_stats: return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
  axes = tuple(range(2, input.ndim))
  count = input.numel() // (input.shape[0] * input.shape[1])
  if count <= 1:
    raise ShapeError(f"instance_norm: expected more than 1 spatial element per channel, got input shape {input.shape}")
  mean = input.mean(axes, keepdim=True)
  var = (input - mean).square().mean(axes, keepdim=True)
  _update_running(running_mean, mean.mean(0).reshape(-1), momentum)
  _update_running(running_var, var.mean(0).reshape(-1) * (count / (count - 1)), momentum)
  return _affine((input - mean) * (var + eps).rsqrt(), weight, bias)

def local_response_norm(input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> Tensor:
  """input / (k + alpha / size * sum of input^2 over the `size` neighbouring channels)^beta (channels dim 1; the window
  runs from c - size // 2 to c + (size - 1) // 2, zeros beyond the edges)."""
  if input.ndim < 3: raise ShapeError(f"local_response_norm needs (N, C, *spatial) input, got shape {input.shape}")
  if size < 1: raise ArgumentError(f"local_response_norm: size must be >= 1, got {size}")
  c = input.shape[1]
  sq = input.square().pad(((0, 0), (size // 2, (size - 1) // 2), *([(0, 0)] * (input.ndim - 2))))
  window = sq.shrink(((0, sq.shape[0]), (0, c), *((0, s) for s in sq.shape[2:])))
  for j in range(1, size): window = window + sq.shrink(((0, sq.shape[0]), (j, j + c), *((0, s) for s in sq.shape[2:])))
  return input / (window * (alpha / size) + k).pow(beta)

# ** convolution **

def _batched(x: Tensor, spatial: int, fn: str) -> tuple[Tensor, bool]:
  """(N, C, *spatial) as is, or unbatched (C, *spatial) with a batch dim of 1 added (torch takes both)."""
  if x.ndim == spatial + 2: return x, False
  if x.ndim == spatial + 1: return x.unsqueeze(0), True
  raise ShapeError(f"{fn} needs a {spatial + 1}-d (C, *spatial) or {spatial + 2}-d (N, C, *spatial) input, got shape "
                   f"{x.shape}")

def conv(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Ints = 1,
         padding: Ints | str = 0, dilation: Ints = 1, groups: int = 1) -> Tensor:
  """N-d convolution (cross-correlation, as torch's conv1d/2d/3d): input (N, Cin, *S) or (Cin, *S), weight
  (Cout, Cin/groups, *K); padding an int, one per dim, "same" or "valid". `Tensor.conv2d` does the work (it takes the
  spatial rank from the weight); this is torch's argument order."""
  xb, unbatched = _batched(input, weight.ndim - 2, f"conv{weight.ndim - 2}d")
  out = xb.conv2d(weight, bias, groups=groups, stride=stride, dilation=dilation, padding=padding)
  return out.squeeze(0) if unbatched else out

def _conv_nd(x: Tensor, weight: Tensor, bias: Tensor | None, stride: Ints,
             padding: Ints | str, dilation: Ints, groups: int, nd: int) -> Tensor:
  if weight.ndim != nd + 2:
    raise ShapeError(f"conv{nd}d needs a {nd + 2}-d weight (Cout, Cin/groups, *kernel), got shape {weight.shape}")
  return conv(x, weight, bias, stride, padding, dilation, groups)

def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Ints = 1,
           padding: Ints | str = 0, dilation: Ints = 1, groups: int = 1) -> Tensor:
  return _conv_nd(input, weight, bias, stride, padding, dilation, groups, 1)
def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Ints = 1,
           padding: Ints | str = 0, dilation: Ints = 1, groups: int = 1) -> Tensor:
  return _conv_nd(input, weight, bias, stride, padding, dilation, groups, 2)
def conv3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Ints = 1,
           padding: Ints | str = 0, dilation: Ints = 1, groups: int = 1) -> Tensor:
  return _conv_nd(input, weight, bias, stride, padding, dilation, groups, 3)

def conv_transpose(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Ints = 1,
                   padding: Ints = 0, output_padding: Ints = 0, groups: int = 1,
                   dilation: Ints = 1) -> Tensor:
  """N-d transposed convolution in torch's conv_transpose1d/2d/3d argument order: input (N, Cin, *S) or (Cin, *S),
  weight (Cin, Cout/groups, *K). `Tensor.conv_transpose2d` does the work (the spatial rank comes from the weight)."""
  xb, unbatched = _batched(input, weight.ndim - 2, f"conv_transpose{weight.ndim - 2}d")
  if xb.shape[1] != weight.shape[0]:
    raise ShapeError(f"conv_transpose: input has {xb.shape[1]} channels but the weight {weight.shape} expects "
                     f"{weight.shape[0]} (weight dim 0 is in_channels)")
  st = _ntuple(stride, weight.ndim - 2, "stride")
  dl = _ntuple(dilation, weight.ndim - 2, "dilation")
  if any(o >= max(s, d) for o, s, d in zip(_ntuple(output_padding, weight.ndim - 2, "output_padding"), st, dl)):
    raise ShapeError(f"conv_transpose: output_padding {output_padding} must be smaller than the stride {st} or the "
                     f"dilation {dl} in each dim")
  out = xb.conv_transpose2d(weight, bias, groups=groups, stride=stride, dilation=dilation, padding=padding,
                            output_padding=output_padding)
  return out.squeeze(0) if unbatched else out

def conv_tbc(input: Tensor, weight: Tensor, bias: Tensor, pad: int = 0) -> Tensor:
  """1-d convolution of time-major input (T, B, Cin) with weight (K, Cin, Cout), `pad` steps of zeros on both ends:
  (T', B, Cout)."""
  if input.ndim != 3 or weight.ndim != 3:
    raise ShapeError(f"conv_tbc needs (T, B, Cin) input and a (K, Cin, Cout) weight, got {input.shape} and "
                     f"{weight.shape}")
  return conv1d(input.permute(1, 2, 0), weight.permute(2, 1, 0), bias, padding=pad).permute(2, 0, 1)

def _conv_transpose_nd(x: Tensor, weight: Tensor, bias: Tensor | None, stride: Ints,
                       padding: Ints, output_padding: Ints, groups: int,
                       dilation: Ints, nd: int) -> Tensor:
  if weight.ndim != nd + 2:
    raise ShapeError(f"conv_transpose{nd}d needs a {nd + 2}-d weight (Cin, Cout/groups, *kernel), got shape "
                     f"{weight.shape}")
  return conv_transpose(x, weight, bias, stride, padding, output_padding, groups, dilation)

def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Ints = 1,
                     padding: Ints = 0, output_padding: Ints = 0, groups: int = 1,
                     dilation: Ints = 1) -> Tensor:
  return _conv_transpose_nd(input, weight, bias, stride, padding, output_padding, groups, dilation, 1)
def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Ints = 1,
                     padding: Ints = 0, output_padding: Ints = 0, groups: int = 1,
                     dilation: Ints = 1) -> Tensor:
  return _conv_transpose_nd(input, weight, bias, stride, padding, output_padding, groups, dilation, 2)
def conv_transpose3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Ints = 1,
                     padding: Ints = 0, output_padding: Ints = 0, groups: int = 1,
                     dilation: Ints = 1) -> Tensor:
  return _conv_transpose_nd(input, weight, bias, stride, padding, output_padding, groups, dilation, 3)

def unfold(input: Tensor, kernel_size: Ints, dilation: Ints = 1,
           padding: Ints = 0, stride: Ints = 1) -> Tensor:
  """im2col: the sliding (kh, kw) blocks of (N, C, H, W) (or (C, H, W)) input as columns, (N, C * kh * kw, L), L the
  number of block positions."""
  xb, unbatched = _batched(input, 2, "unfold")
  k, d = _ntuple(kernel_size, 2, "kernel_size"), _ntuple(dilation, 2, "dilation")
  p, s = _ntuple(padding, 2, "padding"), _ntuple(stride, 2, "stride")
  xp = xb.pad(((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
  out_sp = [(i - dd * (kk - 1) - 1) // ss + 1 for i, kk, dd, ss in zip(xp.shape[2:], k, d, s)]
  if any(o <= 0 for o in out_sp):
    raise ShapeError(f"unfold: kernel {k} (dilation {d}) does not fit the padded input {tuple(xp.shape[2:])}")
  rows = [slice(i * d[0], i * d[0] + (out_sp[0] - 1) * s[0] + 1, s[0]) for i in range(k[0])]
  cols = [slice(j * d[1], j * d[1] + (out_sp[1] - 1) * s[1] + 1, s[1]) for j in range(k[1])]
  blocks = [xp[:, :, r, c] for r in rows for c in cols]  # each (N, C, oh, ow)
  n, c = xb.shape[:2]
  out = Tensor.stack(*blocks, dim=2).reshape(n, c * k[0] * k[1], out_sp[0] * out_sp[1])  # (N, C*kh*kw, L)
  return out.squeeze(0) if unbatched else out

def fold(input: Tensor, output_size: Ints, kernel_size: Ints,
         dilation: Ints = 1, padding: Ints = 0, stride: Ints = 1) -> Tensor:
  """col2im, the inverse layout of `unfold`: columns (N, C * kh * kw, L) summed back into (N, C, *output_size) where
  the blocks overlap."""
  if input.ndim not in (2, 3):
    raise ShapeError(f"fold needs (N, C*kh*kw, L) or (C*kh*kw, L) input, got shape {input.shape}")
  xb = input.unsqueeze(0) if input.ndim == 2 else input
  size, k = _ntuple(output_size, 2, "output_size"), _ntuple(kernel_size, 2, "kernel_size")
  d, p, s = _ntuple(dilation, 2, "dilation"), _ntuple(padding, 2, "padding"), _ntuple(stride, 2, "stride")
  blocks = [(o + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for o, pp, dd, kk, ss in zip(size, p, d, k, s)]
  kk_all = k[0] * k[1]
  if xb.shape[1] % kk_all != 0 or xb.shape[2] != blocks[0] * blocks[1] or min(blocks) <= 0:
    raise ShapeError(f"fold: input {input.shape} needs C * {kk_all} rows and {blocks[0]} * {blocks[1]} block columns "
                     f"for output_size {size}, kernel {k}, dilation {d}, padding {p}, stride {s}")
  n, c = static_shape(xb, "fold")[0], static_shape(xb, "fold")[1] // kk_all
  # a transposed convolution with one-hot kernels puts each block's values back at their positions and sums overlaps
  eye = Tensor.eye(kk_all, dtype=input.dtype, device=input.device).reshape(kk_all, 1, *k)
  weight = eye.repeat(c, 1, 1, 1)  # (C*kh*kw, 1, kh, kw), groups C
  extra = [o + 2 * pp - ((b - 1) * ss + dd * (kk - 1) + 1) for o, pp, b, ss, dd, kk in zip(size, p, blocks, s, d, k)]
  cols = xb.reshape(n, c * kk_all, *blocks)
  out = cols.conv_transpose2d(weight, groups=c, stride=s, dilation=d, padding=p, output_padding=extra)
  return out.squeeze(0) if input.ndim == 2 else out

def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
  """(*, C r^2, H, W) -> (*, C, H r, W r)."""
  r = upscale_factor
  if input.ndim < 3 or input.shape[-3] % (r * r) != 0:
    raise ShapeError(f"pixel_shuffle: input (*, C * {r}^2, H, W) needs a channel dim divisible by {r * r}, got shape "
                     f"{input.shape}")
  *lead, c, h, w = input.shape
  out = input.reshape(*lead, c // (r * r), r, r, h, w)
  nl = len(lead)
  out = out.permute(*range(nl), nl, nl + 3, nl + 1, nl + 4, nl + 2)  # (*, C, H, r, W, r)
  return out.reshape(*lead, c // (r * r), h * r, w * r)

def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
  """(*, C, H r, W r) -> (*, C r^2, H, W)."""
  r = downscale_factor
  if input.ndim < 3 or input.shape[-2] % r != 0 or input.shape[-1] % r != 0:
    raise ShapeError(f"pixel_unshuffle: input (*, C, H * {r}, W * {r}) needs H and W divisible by {r}, got shape "
                     f"{input.shape}")
  *lead, c, h, w = input.shape
  nl = len(lead)
  out = input.reshape(*lead, c, h // r, r, w // r, r).permute(*range(nl), nl, nl + 2, nl + 4, nl + 1, nl + 3)
  return out.reshape(*lead, c * r * r, h // r, w // r)

def channel_shuffle(input: Tensor, groups: int) -> Tensor:
  """(N, g * k, *) -> the channels of each group interleaved: (N, k * g, *)."""
  if input.ndim < 3 or input.shape[1] % groups != 0:
    raise ShapeError(f"channel_shuffle: {groups} groups must divide the channels of (N, C, *) input {input.shape}")
  n, c = input.shape[:2]
  return input.reshape(n, groups, c // groups, *input.shape[2:]).transpose(1, 2).reshape(input.shape)
native_channel_shuffle = channel_shuffle

# ** pooling **

def _pool_nd(x: Tensor, nd: int, fn: str) -> None:
  if x.ndim not in (nd + 1, nd + 2):
    raise ShapeError(f"{fn} needs a {nd + 1}-d (C, *spatial) or {nd + 2}-d (N, C, *spatial) input, got shape {x.shape}")

def _max_pool(x: Tensor, nd: int, kernel_size: Ints, stride: Ints | None,
              padding: Ints, dilation: Ints, ceil_mode: bool, return_indices: bool,
              fn: str) -> Tensor | tuple[Tensor, Tensor]:
  _pool_nd(x, nd, fn)
  st = None if stride is None or (not isinstance(stride, int) and len(stride) == 0) else _ntuple(stride, nd, "stride")
  return x.max_pool2d(_ntuple(kernel_size, nd, "kernel_size"), st, _ntuple(dilation, nd, "dilation"),
                      _ntuple(padding, nd, "padding"), ceil_mode, return_indices)

def max_pool1d(input: Tensor, kernel_size: Ints, stride: Ints | None = None,
               padding: Ints = 0, dilation: Ints = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
  """torch's max_pool1d (stride defaults to the kernel size; padding counts as -inf; indices index the input's L)."""
  return _max_pool(input, 1, kernel_size, stride, padding, dilation, ceil_mode, return_indices, "max_pool1d")
def max_pool2d(input: Tensor, kernel_size: Ints = 2, stride: Ints | None = None,
               padding: Ints = 0, dilation: Ints = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
  """torch's max_pool2d argument order (stride defaults to the kernel size; padding counts as -inf)."""
  return _max_pool(input, 2, kernel_size, stride, padding, dilation, ceil_mode, return_indices, "max_pool2d")
def max_pool3d(input: Tensor, kernel_size: Ints, stride: Ints | None = None,
               padding: Ints = 0, dilation: Ints = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
  return _max_pool(input, 3, kernel_size, stride, padding, dilation, ceil_mode, return_indices, "max_pool3d")

def _avg_pool(x: Tensor, nd: int, kernel_size: Ints, stride: Ints | None,
              padding: Ints, ceil_mode: bool, count_include_pad: bool, divisor_override: int | None,
              fn: str) -> Tensor:
  _pool_nd(x, nd, fn)
  st = None if stride is None or (not isinstance(stride, int) and len(stride) == 0) else _ntuple(stride, nd, "stride")
  return x.avg_pool2d(_ntuple(kernel_size, nd, "kernel_size"), st, _ntuple(padding, nd, "padding"), ceil_mode,
                      count_include_pad, divisor_override)

def avg_pool1d(input: Tensor, kernel_size: Ints, stride: Ints | None = None,
               padding: Ints = 0, ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
  return _avg_pool(input, 1, kernel_size, stride, padding, ceil_mode, count_include_pad, None, "avg_pool1d")
def avg_pool2d(input: Tensor, kernel_size: Ints = 2, stride: Ints | None = None,
               padding: Ints = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
  """torch's avg_pool2d (with count_include_pad, padding counts as 0 in the mean)."""
  return _avg_pool(input, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, "avg_pool2d")
def avg_pool3d(input: Tensor, kernel_size: Ints, stride: Ints | None = None,
               padding: Ints = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
  return _avg_pool(input, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, "avg_pool3d")

def _lp_pool(x: Tensor, nd: int, norm_type: float, kernel_size: Ints,
             stride: Ints | None, ceil_mode: bool, fn: str) -> Tensor:
  """(sum over each window of x^p)^(1/p), as torch computes it: the window mean of x^p times the kernel size."""
  k = _ntuple(kernel_size, nd, "kernel_size")
  out = _avg_pool(x.pow(norm_type), nd, k, stride, 0, ceil_mode, True, None, fn)
  return (out.sign() * out.abs().relu() * math.prod(k)).pow(1.0 / norm_type)

def lp_pool1d(input: Tensor, norm_type: float, kernel_size: Ints, stride: Ints | None = None,
              ceil_mode: bool = False) -> Tensor:
  return _lp_pool(input, 1, norm_type, kernel_size, stride, ceil_mode, "lp_pool1d")
def lp_pool2d(input: Tensor, norm_type: float, kernel_size: Ints, stride: Ints | None = None,
              ceil_mode: bool = False) -> Tensor:
  return _lp_pool(input, 2, norm_type, kernel_size, stride, ceil_mode, "lp_pool2d")
def lp_pool3d(input: Tensor, norm_type: float, kernel_size: Ints, stride: Ints | None = None,
              ceil_mode: bool = False) -> Tensor:
  return _lp_pool(input, 3, norm_type, kernel_size, stride, ceil_mode, "lp_pool3d")

def max_pool1d_with_indices(input: Tensor, kernel_size: Ints, stride: Ints | None = None, padding: Ints = 0,
                            dilation: Ints = 1, ceil_mode: bool = False) -> tuple[Tensor, Tensor]:
  return cast(tuple[Tensor, Tensor], max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, True))
def max_pool2d_with_indices(input: Tensor, kernel_size: Ints, stride: Ints | None = None, padding: Ints = 0,
                            dilation: Ints = 1, ceil_mode: bool = False) -> tuple[Tensor, Tensor]:
  return cast(tuple[Tensor, Tensor], max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True))
def max_pool3d_with_indices(input: Tensor, kernel_size: Ints, stride: Ints | None = None, padding: Ints = 0,
                            dilation: Ints = 1, ceil_mode: bool = False) -> tuple[Tensor, Tensor]:
  return cast(tuple[Tensor, Tensor], max_pool3d(input, kernel_size, stride, padding, dilation, ceil_mode, True))

def _max_unpool(x: Tensor, indices: Tensor, nd: int, kernel_size: Ints,
                stride: Ints | None, padding: Ints,
                output_size: Sequence[int] | None, fn: str) -> Tensor:
  _pool_nd(x, nd, fn)
  st = None if stride is None else _ntuple(stride, nd, "stride")
  return x.max_unpool2d(indices, _ntuple(kernel_size, nd, "kernel_size"), st, 1, _ntuple(padding, nd, "padding"),
                        output_size)

def max_unpool1d(input: Tensor, indices: Tensor, kernel_size: Ints, stride: Ints | None = None,
                 padding: Ints = 0, output_size: Sequence[int] | None = None) -> Tensor:
  """The inverse of max_pool1d(return_indices=True): each value at its index, zeros elsewhere."""
  return _max_unpool(input, indices, 1, kernel_size, stride, padding, output_size, "max_unpool1d")
def max_unpool2d(input: Tensor, indices: Tensor, kernel_size: Ints, stride: Ints | None = None,
                 padding: Ints = 0, output_size: Sequence[int] | None = None) -> Tensor:
  return _max_unpool(input, indices, 2, kernel_size, stride, padding, output_size, "max_unpool2d")
def max_unpool3d(input: Tensor, indices: Tensor, kernel_size: Ints, stride: Ints | None = None,
                 padding: Ints = 0, output_size: Sequence[int] | None = None) -> Tensor:
  return _max_unpool(input, indices, 3, kernel_size, stride, padding, output_size, "max_unpool3d")

def adaptive_max_pool1d_with_indices(input: Tensor, output_size: Ints) -> tuple[Tensor, Tensor]:
  return cast(tuple[Tensor, Tensor], adaptive_max_pool1d(input, output_size, True))
def adaptive_max_pool2d_with_indices(input: Tensor, output_size: Sizes) -> tuple[Tensor, Tensor]:
  return cast(tuple[Tensor, Tensor], adaptive_max_pool2d(input, output_size, True))
def adaptive_max_pool3d_with_indices(input: Tensor, output_size: Sizes) -> tuple[Tensor, Tensor]:
  return cast(tuple[Tensor, Tensor], adaptive_max_pool3d(input, output_size, True))

def _adaptive_sizes(x: Tensor, nd: int, output_size: Sizes, fn: str) -> list[int]:
  _pool_nd(x, nd, fn)
  outs = [output_size] * nd if output_size is None or isinstance(output_size, int) else list(output_size)
  if len(outs) == 1 and nd > 1: outs = outs * nd
  if len(outs) != nd: raise ShapeError(f"{fn}: output_size {output_size} needs 1 or {nd} entries")
  sizes = [i if o is None else int(o) for o, i in zip(outs, static_shape(x, fn)[-nd:])]
  if any(o <= 0 for o in sizes): raise ShapeError(f"{fn}: output_size {tuple(sizes)} must be positive in every dim")
  return sizes

def _window_mask(i: int, o: int, device: str | tuple[str, ...]) -> Tensor:
  """(o, i) bool: output j pools inputs floor(j i / o) .. ceil((j + 1) i / o) - 1 (torch's adaptive windows)."""
  rows = [[(j * i) // o <= a < -(-((j + 1) * i) // o) for a in range(i)] for j in range(o)]
  return Tensor(rows, dtype=dtypes.bool, device=device)

def _adaptive_avg(x: Tensor, nd: int, output_size: Sizes, fn: str) -> Tensor:
  sizes = _adaptive_sizes(x, nd, output_size, fn)
  out = x if dtypes.is_float(x.dtype) else x.cast(dtypes.default_float)
  for j, o in enumerate(sizes):
    ax = x.ndim - nd + j
    mask = _window_mask(static_shape(out, fn)[ax], o, x.device)
    moved = out.transpose(ax, -1).unsqueeze(-2)  # (..., 1, i)
    pooled = mask.where(moved, 0).sum(-1) / mask.sum(-1).cast(out.dtype)  # (..., o)
    out = pooled.transpose(ax, -1)
  return out

def adaptive_avg_pool1d(input: Tensor, output_size: Ints) -> Tensor:
  """Mean over windows chosen so the last dim becomes `output_size` (torch's window rule)."""
  return _adaptive_avg(input, 1, output_size, "adaptive_avg_pool1d")
def adaptive_avg_pool2d(input: Tensor, output_size: Sizes) -> Tensor:
  return _adaptive_avg(input, 2, output_size, "adaptive_avg_pool2d")
def adaptive_avg_pool3d(input: Tensor, output_size: Sizes) -> Tensor:
  return _adaptive_avg(input, 3, output_size, "adaptive_avg_pool3d")

def _adaptive_max(x: Tensor, nd: int, output_size: Sizes, return_indices: bool,
                  fn: str) -> Tensor | tuple[Tensor, Tensor]:
  sizes = _adaptive_sizes(x, nd, output_size, fn)
  spatial = static_shape(x, fn)[x.ndim - nd:]
  # one (prod(out), prod(in)) mask over the flattened spatial dims: the max and the flat index of its first occurrence
  mask = _window_mask(spatial[0], sizes[0], x.device)
  for i, o in zip(spatial[1:], sizes[1:]):
    mask = (mask.reshape(mask.shape[0], 1, -1, 1) & _window_mask(i, o, x.device).reshape(1, o, 1, i))
    mask = mask.reshape(mask.shape[0] * o, -1)
  low = -math.inf if dtypes.is_float(x.dtype) else dtypes.min(x.dtype)
  windows = mask.where(x.flatten(x.ndim - nd).unsqueeze(-2), low)  # (..., prod(out), prod(in))
  lead = x.shape[:x.ndim - nd]
  values = windows.max(-1).reshape(*lead, *sizes)
  if not return_indices: return values
  return values, windows.detach().argmax(-1).reshape(*lead, *sizes)

def adaptive_max_pool1d(input: Tensor, output_size: Ints,
                        return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
  """Max over windows chosen so the last dim becomes `output_size`; with `return_indices`, each max's index in L."""
  return _adaptive_max(input, 1, output_size, return_indices, "adaptive_max_pool1d")
def adaptive_max_pool2d(input: Tensor, output_size: Sizes,
                        return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
  return _adaptive_max(input, 2, output_size, return_indices, "adaptive_max_pool2d")
def adaptive_max_pool3d(input: Tensor, output_size: Sizes,
                        return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
  return _adaptive_max(input, 3, output_size, return_indices, "adaptive_max_pool3d")

# ** padding, resizing, attention **

def pad(input: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
  """torch's F.pad: `pad` pairs from the last dim backwards (left, right, top, bottom, ...); negative amounts crop;
  modes constant (with `value`), reflect, replicate, circular."""
  if len(pad) % 2 != 0 or len(pad) // 2 > input.ndim:
    raise ShapeError(f"pad: {tuple(pad)} needs an even count of at most 2 * {input.ndim} entries for shape "
                     f"{input.shape}")
  if mode != "constant" and value:
    raise ArgumentError(f"pad: value {value} applies to mode 'constant' only, got mode {mode!r}")
  return input.pad(tuple(pad), mode, 0.0 if value is None else value)

_INTERPOLATE_RANK = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}

def interpolate(input: Tensor, size: Ints | None = None, scale_factor: float | Sequence[float] | None = None,
                mode: str = "nearest", align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
  """Resize the spatial dims of (N, C, *spatial) input to `size` or by `scale_factor`: modes nearest, nearest-exact,
  linear (3-d input), bilinear (4-d), trilinear (5-d) and area (adaptive average pooling). bicubic and antialias are
  not implemented (ArgumentError)."""
  if (size is None) == (scale_factor is None):
    raise ArgumentError("interpolate: give exactly one of size and scale_factor")
  if antialias: raise ArgumentError("interpolate: antialias=True is not implemented; downsample with mode='area'")
  if mode in ("nearest", "nearest-exact", "area") and align_corners is not None:
    raise ArgumentError(f"interpolate: align_corners only applies to linear modes, not mode {mode!r}")
  if mode in _INTERPOLATE_RANK and input.ndim != _INTERPOLATE_RANK[mode] + 2:
    raise ShapeError(f"interpolate: mode {mode!r} needs {_INTERPOLATE_RANK[mode] + 2}-d input, got shape {input.shape}")
  nd = input.ndim - 2
  if scale_factor is not None and (recompute_scale_factor or mode == "area"):
    factors = [float(scale_factor)] * nd if isinstance(scale_factor, (int, float)) else [float(f) for f in scale_factor]
    if len(factors) != nd: raise ShapeError(f"interpolate: scale_factor {scale_factor} needs {nd} entries")
    size, scale_factor = [int(math.floor(i * f)) for i, f in zip(static_shape(input, "interpolate")[2:], factors)], None
  if mode == "area":
    if nd < 1: raise ShapeError(f"interpolate needs (N, C, *spatial) input, got shape {input.shape}")
    return _adaptive_avg(input, nd, size, "interpolate (mode='area')")
  return input.interpolate(size, mode, bool(align_corners), scale_factor)

def upsample(input: Tensor, size: Ints | None = None, scale_factor: float | Sequence[float] | None = None,
             mode: str = "nearest", align_corners: bool | None = None) -> Tensor:
  """The old name of `interpolate`."""
  return interpolate(input, size, scale_factor, mode, align_corners)
def upsample_nearest(input: Tensor, size: Ints | None = None,
                     scale_factor: float | Sequence[float] | None = None) -> Tensor:
  return interpolate(input, size, scale_factor, "nearest")
def upsample_bilinear(input: Tensor, size: Ints | None = None,
                      scale_factor: float | Sequence[float] | None = None) -> Tensor:
  """Bilinear resizing with align_corners=True (what this old name always meant)."""
  return interpolate(input, size, scale_factor, "bilinear", True)

def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
  """softmax(q k^T * scale + mask) v over (..., L, E) queries; a bool mask keeps where True, a float one is added."""
  return query.scaled_dot_product_attention(key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

# ** sampling grids and CTC **

def _grid_line(n: int, align_corners: bool) -> list[float]:
  """torch's normalised pixel positions in [-1, 1]: the corner pixels' centres (align_corners) or their outer edges."""
  if n <= 1: return [0.0] * n
  step = [-1 + 2 * i / (n - 1) for i in range(n)]
  return step if align_corners else [v * (n - 1) / n for v in step]

def affine_grid(theta: Tensor, size: Sequence[int], align_corners: bool | None = None) -> Tensor:
  """The sampling grid of a batch of affine maps: theta (N, 2, 3) for size (N, C, H, W) gives (N, H, W, 2) (x, y)
  positions; theta (N, 3, 4) for size (N, C, D, H, W) gives (N, D, H, W, 3)."""
  spatial = [int(s) for s in size[2:]]
  nd = len(spatial)
  if nd not in (2, 3) or tuple(theta.shape) != (int(size[0]), nd, nd + 1):
    raise ShapeError(f"affine_grid: theta must be (N, 2, 3) for a 4-d size or (N, 3, 4) for a 5-d size with N = size[0]"
                     f", got theta {theta.shape} and size {tuple(size)}")
  ac = bool(align_corners)
  lines = [Tensor(_grid_line(n, ac), dtype=theta.dtype, device=theta.device) for n in spatial]  # D/H/W order
  # (*spatial, nd + 1): x varies along the last dim, y along the one before (and z before that), then a 1
  parts = []
  for j in range(nd):
    ax = nd - 1 - j  # coordinate j (x first) runs along spatial dim ax
    shape = [1] * nd
    shape[ax] = spatial[ax]
    parts.append(lines[ax].reshape(shape).expand(*spatial))
  base = Tensor.stack(*parts, Tensor.ones(*spatial, dtype=theta.dtype, device=theta.device), dim=-1)
  flat = base.reshape(1, -1, nd + 1)  # (1, prod(spatial), nd + 1)
  return (flat @ theta.transpose(1, 2)).reshape(theta.shape[0], *spatial, nd)

def _reflect(coord: Tensor, twice_low: int, twice_high: int) -> Tensor:
  """torch's reflect_coordinates: `coord` mirrored at low and high until it lies in [low, high]."""
  if twice_low == twice_high: return coord * 0
  low, span = twice_low / 2, (twice_high - twice_low) / 2
  dist = (coord - low).abs()
  extra, flips = dist.fmod(span), (dist / span).floor()
  return (flips.fmod(2) == 0).where(extra + low, span - extra + low)

def _source_index(coord: Tensor, size: int, padding_mode: str, align_corners: bool) -> Tensor:
  """A normalised grid coordinate in [-1, 1] as a pixel position of a dim of `size`, with torch's padding modes."""
  pos = (coord + 1) / 2 * (size - 1) if align_corners else ((coord + 1) * size - 1) / 2
  if padding_mode == "border": return pos.clip(0, size - 1)
  if padding_mode == "reflection":
    pos = _reflect(pos, 0, 2 * (size - 1)) if align_corners else _reflect(pos, -1, 2 * size - 1)
    return pos.clip(0, size - 1)
  return pos

def grid_sample(input: Tensor, grid: Tensor, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: bool | None = None) -> Tensor:
  """Samples (N, C, H, W) input at the (input, y) positions of grid (N, Hout, Wout, 2), normalised to [-1, 1]: mode
  bilinear or nearest, padding_mode zeros, border or reflection. 5-d input and bicubic are not implemented."""
  if mode not in ("bilinear", "nearest"):
    raise ArgumentError(f"grid_sample: mode must be 'bilinear' or 'nearest' (bicubic is not implemented), got {mode!r}")
  if padding_mode not in ("zeros", "border", "reflection"):
    raise ArgumentError(f"grid_sample: padding_mode must be 'zeros', 'border' or 'reflection', got {padding_mode!r}")
  if input.ndim != 4 or grid.ndim != 4 or grid.shape[-1] != 2 or grid.shape[0] != input.shape[0]:
    raise ShapeError(f"grid_sample needs (N, C, H, W) input and an (N, Hout, Wout, 2) grid, got {input.shape} and "
                     f"{grid.shape} (5-d input is not implemented)")
  n, c, h, w = static_shape(input, "grid_sample")
  out_sp = static_shape(grid, "grid_sample")[1:3]
  ac = bool(align_corners)
  ix = _source_index(grid[..., 0], w, padding_mode, ac).reshape(n, 1, -1)  # (N, 1, Hout * Wout)
  iy = _source_index(grid[..., 1], h, padding_mode, ac).reshape(n, 1, -1)
  flat = input.reshape(n, c, h * w)
  def tap(px: Tensor, py: Tensor) -> Tensor:  # input at integer positions, 0 outside
    inside = (px >= 0) & (px <= w - 1) & (py >= 0) & (py <= h - 1)
    idx = (py.clip(0, h - 1) * w + px.clip(0, w - 1)).cast(dtypes.int32).expand(n, c, px.shape[-1])
    return inside.where(flat.gather(2, idx), 0)
  if mode == "nearest": out = tap(ix.round().detach(), iy.round().detach())
  else:
    x0, y0 = ix.floor().detach(), iy.floor().detach()
    fx, fy = ix - x0, iy - y0
    out = (tap(x0, y0) * (1 - fx) * (1 - fy) + tap(x0 + 1, y0) * fx * (1 - fy) + tap(x0, y0 + 1) * (1 - fx) * fy +
           tap(x0 + 1, y0 + 1) * fx * fy)
  return out.reshape(n, c, *out_sp)

def _lengths(v: Tensor | Sequence[int], device: str | tuple[str, ...], what: str) -> Tensor:
  t = v if isinstance(v, Tensor) else Tensor([int(a) for a in v], dtype=dtypes.int32, device=device)
  if not dtypes.is_int(t.dtype): raise DTypeError(f"ctc_loss: {what} must be ints, got {t.dtype!r}")
  return t.reshape(-1).cast(dtypes.int32)

def ctc_loss(log_probs: Tensor, targets: Tensor, input_lengths: Tensor | Sequence[int],
             target_lengths: Tensor | Sequence[int], blank: int = 0, reduction: str = "mean",
             zero_infinity: bool = False) -> Tensor:
  """Connectionist Temporal Classification loss of log-probabilities (T, N, C) (or (T, C)) against targets (N, S)
  padded, or all targets concatenated (sum(target_lengths),). The forward recursion runs over the T time steps in
  log space, one small kernel per step (so long sequences make many kernels); the lengths stay on the device.
  reduction "mean" divides each loss by its target length first. An impossible alignment gives inf (0 with
  `zero_infinity`, gradient 0 too)."""
  _check_reduction(reduction, "ctc_loss")
  unbatched = log_probs.ndim == 2
  lp = log_probs.unsqueeze(1) if unbatched else log_probs
  if lp.ndim != 3: raise ShapeError(f"ctc_loss needs (T, N, C) or (T, C) log_probs, got shape {log_probs.shape}")
  if not dtypes.is_int(targets.dtype): raise DTypeError(f"ctc_loss: targets must be ints, got {targets.dtype!r}")
  steps, n, c = static_shape(lp, "ctc_loss")
  if not 0 <= blank < c: raise ArgumentError(f"ctc_loss: blank {blank} must be a class index in [0, {c})")
  in_len = _lengths(input_lengths, lp.device, "input_lengths")
  tgt_len = _lengths(target_lengths, lp.device, "target_lengths")
  if in_len.shape != (n,) or tgt_len.shape != (n,):
    raise ShapeError(f"ctc_loss: input_lengths {in_len.shape} and target_lengths {tgt_len.shape} need {n} entries")
  tg = targets.reshape(1, -1) if unbatched else targets
  if tg.ndim == 2:
    if tg.shape[0] != n: raise ShapeError(f"ctc_loss: padded targets {targets.shape} need {n} rows")
    padded = tg.cast(dtypes.int32)
  else:  # concatenated: row b is targets[offset_b:offset_b + length_b], padded to the total length
    total = static_shape(tg, "ctc_loss")[0]
    offsets = tgt_len.cumsum(0) - tgt_len
    idx = (offsets.reshape(n, 1) + Tensor.arange(total, device=lp.device, dtype=dtypes.int32).reshape(1, total))
    padded = tg.cast(dtypes.int32)[idx.clip(0, max(total - 1, 0))]
  s = static_shape(padded, "ctc_loss")[1]
  k = 2 * s + 1
  # the extended label sequence: blank, l1, blank, l2, ..., blank  (N, K)
  ext = Tensor.stack(Tensor.full((n, s), blank, dtype=dtypes.int32, device=lp.device), padded, dim=2).reshape(n, 2 * s)
  ext = ext.pad(((0, 0), (0, 1)), value=blank)
  pos = Tensor.arange(k, device=lp.device, dtype=dtypes.int32).reshape(1, k)
  skip = (pos >= 2) & (ext != blank) & (ext != ext.pad(((0, 0), (2, 0)), value=blank)[:, :k])
  emit = lp.float().gather(2, ext.reshape(1, n, k).expand(steps, n, k))  # (T, N, K)
  neg = -1e30  # log 0 that stays finite: -inf would make NaN gradients through the unreachable states
  def shift(a: Tensor, by: int) -> Tensor: return a.pad(((0, 0), (by, 0)), value=neg)[:, :k]
  def logsumexp(*terms: Tensor) -> Tensor:
    top = terms[0]
    for t in terms[1:]: top = top.maximum(t)
    top = top.detach()
    total_exp = (terms[0] - top).exp()
    for t in terms[1:]: total_exp = total_exp + (t - top).exp()
    return top + total_exp.log()
  alpha = (pos < 2).where(emit[0], neg)
  for t in range(1, steps):
    step = logsumexp(alpha, shift(alpha, 1), skip.where(shift(alpha, 2), neg)) + emit[t]
    # a buffer per step, and one per step of the gradient: each step reads the last one three times, so one fused
    # graph would grow as 3^T
    alpha = (in_len.reshape(n, 1) > t).where(step, alpha).contiguous().contiguous_backward()
  ends = (pos == 2 * tgt_len.reshape(n, 1)) | ((pos == 2 * tgt_len.reshape(n, 1) - 1) & (tgt_len.reshape(n, 1) > 0))
  masked = ends.where(alpha, neg)
  top = masked.max(1, keepdim=True).detach()
  nll = -(top + (masked - top).exp().sum(1, keepdim=True).log()).reshape(n)
  impossible = nll > 1e29
  nll = impossible.where(0 if zero_infinity else math.inf, nll)
  if reduction == "mean": return (nll / tgt_len.maximum(1).cast(nll.dtype)).mean()
  if reduction == "sum": return nll.sum()
  return nll.reshape(()) if unbatched else nll
