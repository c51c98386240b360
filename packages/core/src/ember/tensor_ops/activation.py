"""Activation functions, softmax and normalisation.

A mixin of `ember.tensor.Tensor`. This module cannot import ember.tensor (which imports it to define Tensor);
ember.tensor hands it `PyFloat`, `PyInt`, `Tensor` once Tensor exists (`LATE_NAMES`)."""
from __future__ import annotations
import math
from typing import TYPE_CHECKING
from ember.dtype import DType, dtypes, narrow_float
from ember.errors import ArgumentError

if TYPE_CHECKING:
  from ember.tensor import (PyFloat, PyInt, Tensor)

LATE_NAMES = ('PyFloat', 'PyInt', 'Tensor')

class ActivationMixin:
  __slots__ = ()  # Tensor's own slots stay the only instance fields
  # ** activations **
  def relu6(self: Tensor) -> Tensor:
    """min(max(x, 0), 6).

    >>> Tensor([-1.0, 3.0, 7.0]).relu6().tolist()
    [0.0, 3.0, 6.0]
    """
    return self.hardtanh(0, 6)
  def leaky_relu(self: Tensor, neg_slope: PyFloat = 0.01) -> Tensor:
    """x for x > 0, neg_slope * x otherwise.

    >>> Tensor([-2.0, 2.0]).leaky_relu(0.5).tolist()
    [-1.0, 2.0]
    """
    return (self > 0).where(self, self * neg_slope)
  def elu(self: Tensor, alpha: PyFloat = 1.0) -> Tensor:
    """x for x > 0, alpha * (exp(x) - 1) otherwise.

    >>> round(Tensor([-1.0]).elu().item(), 5)
    -0.63212
    """
    return (self > 0).where(self, ((self > 0).where(0, self).exp() - 1) * alpha)
  def celu(self: Tensor, alpha: PyFloat = 1.0) -> Tensor:
    """x for x > 0, alpha * (exp(x / alpha) - 1) otherwise.

    >>> round(Tensor([-1.0]).celu(2.0).item(), 5)
    -0.78694
    """
    return (self > 0).where(self, (((self > 0).where(0, self) / alpha).exp() - 1) * alpha)
  def selu(self: Tensor) -> Tensor:
    """Scaled ELU with the self-normalising constants (alpha ~ 1.6733, scale ~ 1.0507).

    >>> round(Tensor([1.0]).selu().item(), 5)
    1.0507
    """
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    return self.elu(alpha) * scale
  def silu(self: Tensor) -> Tensor:
    """x * sigmoid(x).

    >>> round(Tensor([1.0]).silu().item(), 5)
    0.73106
    """
    return self * self.sigmoid()
  def swish(self: Tensor) -> Tensor:
    """Alias of `silu`.

    >>> round(Tensor([1.0]).swish().item(), 5)
    0.73106
    """
    return self.silu()
  def gelu(self: Tensor, approximate: str = "none") -> Tensor:
    """GELU, exact x * Phi(x) (`approximate="none"`) or the tanh approximation (`"tanh"`).

    >>> round(Tensor([1.0]).gelu().item(), 5)
    0.84134
    """
    if approximate == "tanh":
      return 0.5 * self * (1 + (math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).tanh())
    if approximate != "none": raise ArgumentError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * self * (1 + (self * (1 / math.sqrt(2))).erf())
  def quick_gelu(self: Tensor) -> Tensor:
    """x * sigmoid(1.702 * x).

    >>> round(Tensor([1.0]).quick_gelu().item(), 4)
    0.8458
    """
    return self * (self * 1.702).sigmoid()
  def hardswish(self: Tensor) -> Tensor:
    """x * relu6(x + 3) / 6.

    >>> Tensor([-4.0, 0.0, 4.0]).hardswish().tolist()
    [-0.0, 0.0, 4.0]
    """
    return self * (self + 3).relu6() * (1 / 6)
  def hardsigmoid(self: Tensor) -> Tensor:
    """relu6(x + 3) / 6.

    >>> Tensor([-4.0, 0.0, 4.0]).hardsigmoid().tolist()
    [0.0, 0.5, 1.0]
    """
    return (self + 3).relu6() * (1 / 6)
  def hardtanh(self: Tensor, min_val: PyFloat = -1.0, max_val: PyFloat = 1.0) -> Tensor:
    """Clamp to [min_val, max_val].

    >>> Tensor([-2.0, 0.5, 2.0]).hardtanh().tolist()
    [-1.0, 0.5, 1.0]
    """
    # the gradient is 1 strictly inside (min_val, max_val), 0 at and beyond the bounds (torch's hardtanh, unlike clamp)
    return ((self > min_val) & (self < max_val)).where(self, self.clip(min_val, max_val).detach())
  def softplus(self: Tensor, beta: PyFloat = 1.0, threshold: PyFloat = 20.0) -> Tensor:
    """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold (torch's linear cut-over).

    >>> round(Tensor([0.0]).softplus().item(), 5)
    0.69315
    """
    bx = self * beta
    return (bx > threshold).where(self, bx.logaddexp(0) * (1 / beta))
  def mish(self: Tensor) -> Tensor:
    """x * tanh(softplus(x)).

    >>> round(Tensor([1.0]).mish().item(), 4)
    0.8651
    """
    return self * self.softplus().tanh()
  def softsign(self: Tensor) -> Tensor:
    """x / (1 + |x|).

    >>> Tensor([1.0, -3.0]).softsign().tolist()
    [0.5, -0.75]
    """
    return self / (self.abs() + 1)
  def logsigmoid(self: Tensor) -> Tensor:
    """log(sigmoid(x)), computed stably as -softplus(-x).

    >>> round(Tensor([0.0]).logsigmoid().item(), 5)
    -0.69315
    """
    return -(-self).softplus()
  def _softmax_axis(self: Tensor, axis: PyInt | None, dim: PyInt | None) -> PyInt:
    if dim is not None: return dim
    return -1 if axis is None else axis
  def softmax(self: Tensor, axis: PyInt | None = -1, dtype: DType | str | None = None,
              dim: PyInt | None = None) -> Tensor:
    """exp(x) / sum(exp(x)) along `axis` (`dim=` is an alias), shifted by the max for stability.

    >>> Tensor([[1.0, 1.0]]).softmax().tolist()
    [[0.5, 0.5]]
    """
    ax = self._softmax_axis(axis, dim)
    x = self.cast(dtype) if dtype is not None else self._float()
    e = (x - x._amax(ax, keepdim=True).detach()).exp()
    # one reciprocal per row and a multiply per element (as torch's CPU softmax does): a division per element was a
    # third of the softmax's time on AVX-512 (vdivps), and the results differ from it by at most an ulp
    if narrow_float(x.dtype):  # a half row's sum of exps passes 65504 past 65504 elements: summed in float32, as torch
      return (e * e.sum(ax, keepdim=True, dtype=dtypes.float32).reciprocal()).cast(x.dtype)
    return e * e.sum(ax, keepdim=True).reciprocal()
  def log_softmax(self: Tensor, axis: PyInt | None = -1, dtype: DType | str | None = None,
                  dim: PyInt | None = None) -> Tensor:
    """log(softmax(x)) along `axis`, computed as x - max - log(sum(exp(x - max))).

    >>> round(Tensor([1.0, 1.0]).log_softmax().tolist()[0], 5)
    -0.69315
    """
    ax = self._softmax_axis(axis, dim)
    x = self.cast(dtype) if dtype is not None else self._float()
    shifted = x - x._amax(ax, keepdim=True).detach()
    return shifted - shifted.exp().sum(ax, keepdim=True).log()
  def softmin(self: Tensor, axis: PyInt | None = -1, dtype: DType | str | None = None,
              dim: PyInt | None = None) -> Tensor:
    """softmax(-x).

    >>> Tensor([0.0, 0.0]).softmin().tolist()
    [0.5, 0.5]
    """
    return (-self).softmax(axis, dtype, dim)
  def normalize(self: Tensor, p: PyFloat = 2.0, dim: PyInt = 1, eps: PyFloat = 1e-12) -> Tensor:
    """x / max(||x||_p, eps) along `dim` (torch.nn.functional.normalize).

    >>> [round(v, 4) for v in Tensor([[3.0, 4.0]]).normalize().tolist()[0]]
    [0.6, 0.8]
    """
    x = self._float()
    if narrow_float(x.dtype): return x.float().normalize(p, dim, eps).cast(x.dtype)  # the sum of squares overflows
    norm = x.square().sum(dim, keepdim=True).sqrt() if p == 2 else x.abs().pow(p).sum(dim, keepdim=True).pow(1 / p)
    return x / norm.maximum(eps)
