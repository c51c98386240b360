"""Optimizers: each `step()` builds one fused update expression per parameter, assigns it into the parameter's
buffer, and realizes every parameter, optimizer state and model buffer together in one schedule.

Hyperparameters that change over training (the learning rate, Adam's running beta powers) are tensors, so a
TinyJit-captured step replays with their current values.

>>> from ember.nn import Linear
>>> from ember.nn.state import get_parameters
>>> model = Linear(4, 2)
>>> opt = Adam(get_parameters(model), lr=1e-3)
"""
from __future__ import annotations
import math
from abc import ABC, abstractmethod
from typing import Callable, Sequence
from ember import Tensor, TinyJit
from ember.dtype import dtypes
from ember.errors import EmberError
from ember.nn.functional import assign, filled, static_shape

class OptimizerError(EmberError, ValueError):
  """An optimizer was built with no parameters or an invalid hyperparameter."""

class Optimizer(ABC):
  """Base class. `params` may hold model buffers too (requires_grad=False, e.g. BatchNorm running statistics): they
  are not updated, only realized with each step, so their pending updates land. Tensors whose `requires_grad` is
  None become parameters."""
  def __init__(self, params: Sequence[Tensor], lr: float):
    for p in params:
      if p.requires_grad is None: p.requires_grad = True
    self.params = _unique([p for p in params if p.requires_grad])
    self.buffers = _unique([p for p in params if not p.requires_grad])
    if not self.params:
      raise OptimizerError(f"{type(self).__name__} got no parameters to optimize (none has requires_grad)")
    if lr < 0: raise OptimizerError(f"{type(self).__name__}: learning rate must be >= 0, got {lr}")
    device = self.params[0].device
    self.lr = filled((), lr, dtype=dtypes.float32, device=device)
    self.state: list[Tensor] = []  # per-parameter slots, realized with the parameters

  def zero_grad(self) -> None:
    """Drop every parameter's gradient (the next backward() starts from zero)."""
    for p in self.params: p.grad = None

  def step(self) -> None:
    """Update every parameter that has a gradient, and realize the parameters, the state and the buffers together."""
    Tensor.realize(*self.schedule_step())

  def schedule_step(self) -> list[Tensor]:
    """Assign the updates lazily and return the tensors to realize (what `OptimizerGroup` realizes in one go)."""
    _realize_pending_readers(self.params)
    for i, p in enumerate(self.params):
      if p.grad is None: continue
      if p.grad.shape != p.shape:
        raise OptimizerError(f"gradient shape {p.grad.shape} does not match parameter shape {p.shape}")
      assign(p, self._update(i, p, p.grad.detach()).cast(p.dtype))
    return [*self.params, *self.state, *self.buffers, self.lr]

  @abstractmethod
  def _update(self, i: int, p: Tensor, g: Tensor) -> Tensor:
    """The new value of parameter `i` given its gradient `g` (may assign this parameter's state slots)."""

  def _zeros_like_params(self) -> list[Tensor]:
    # flat slots: core's scheduler cannot yet read back, in the same schedule, an assign into a reshaped buffer
    slots = [self._slot(math.prod(static_shape(p, "optimizer")), 0.0, p.device) for p in self.params]
    self.state.extend(slots)
    return slots

  @staticmethod
  def _slot(size: int, value: float, device: str) -> Tensor:
    return filled((size,), value, dtype=dtypes.float32, device=device).requires_grad_(False)

def _unique(ts: list[Tensor]) -> list[Tensor]: return list({id(t): t for t in ts}.values())

def _realize_pending_readers(params: list[Tensor]) -> None:
  """Run, in one schedule, everything still lazy that reads the parameters (their gradients, the loss ...): otherwise
  each parameter's assign would realize them separately before overwriting its buffer."""
  pending = Tensor.pending_readers(*params)
  pending += [p.grad for p in params if p.grad is not None and not p.grad.is_realized]
  if pending: Tensor.realize(*_unique(pending))

class SGD(Optimizer):
  """torch.optim.SGD: g = grad + wd*p; with momentum b = momentum*b + g, g = b (or g + momentum*b with nesterov);
  p -= lr*g."""
  def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, momentum: float = 0.0, weight_decay: float = 0.0,
               nesterov: bool = False):
    super().__init__(params, lr)
    if nesterov and momentum <= 0: raise OptimizerError("SGD: nesterov needs momentum > 0")
    self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
    self.bufs = self._zeros_like_params() if momentum else []
  def _update(self, i: int, p: Tensor, g: Tensor) -> Tensor:
    if self.weight_decay: g = g + self.weight_decay * p.detach()
    if self.momentum:
      slot = self.bufs[i]
      b = assign(slot, self.momentum * slot + g.flatten()).reshape(p.shape)
      g = g + self.momentum * b if self.nesterov else b
    return p.detach() - self.lr * g

class LAMB(Optimizer):
  """LAMB (You et al. 2019): the Adam direction plus decoupled weight decay, scaled per parameter by the trust ratio
  ||p|| / ||update||. `adam=True` drops the trust ratio; Adam and AdamW are this class with fixed settings."""
  def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
               weight_decay: float = 0.0, adam: bool = False, decoupled: bool = True):
    super().__init__(params, lr)
    for name, b in (("b1", b1), ("b2", b2)):
      if not 0 <= b < 1: raise OptimizerError(f"{type(self).__name__}: {name} must be in [0, 1), got {b}")
    self.b1, self.b2, self.eps, self.weight_decay = b1, b2, eps, weight_decay
    self.adam, self.decoupled = adam, decoupled
    device = self.params[0].device
    # b1^t and b2^t, advanced once per step
    self.b1_t, self.b2_t = self._slot(1, 1.0, device), self._slot(1, 1.0, device)
    self.m = self._zeros_like_params()
    self.v = self._zeros_like_params()
    self.state.extend([self.b1_t, self.b2_t])
  def schedule_step(self) -> list[Tensor]:
    assign(self.b1_t, self.b1_t * self.b1)
    assign(self.b2_t, self.b2_t * self.b2)
    return super().schedule_step()
  def _update(self, i: int, p: Tensor, g: Tensor) -> Tensor:
    w = p.detach().float()
    g = g.float()
    if self.weight_decay and not self.decoupled: g = g + self.weight_decay * w  # L2 penalty (torch's Adam)
    flat = g.flatten()
    m = assign(self.m[i], self.b1 * self.m[i] + (1 - self.b1) * flat).reshape(p.shape)
    v = assign(self.v[i], self.b2 * self.v[i] + (1 - self.b2) * flat.square()).reshape(p.shape)
    m_hat = m / (1 - self.b1_t.reshape(()))
    v_hat = v / (1 - self.b2_t.reshape(()))
    up = m_hat / (v_hat.sqrt() + self.eps)
    if self.adam:
      if self.weight_decay and self.decoupled: w = w * (1 - self.lr * self.weight_decay)  # AdamW decays before the step
      return w - self.lr * up
    if self.weight_decay and self.decoupled: up = up + self.weight_decay * w
    w_norm, up_norm = w.square().sum().sqrt(), up.square().sum().sqrt()
    trust = ((w_norm > 0) & (up_norm > 0)).where(w_norm / up_norm, 1.0)
    return w - self.lr * trust * up

def Adam(params: Sequence[Tensor], lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         weight_decay: float = 0.0) -> LAMB:
  """torch.optim.Adam (weight_decay is an L2 penalty added to the gradient)."""
  return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True, decoupled=False)

def AdamW(params: Sequence[Tensor], lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01) -> LAMB:
  """torch.optim.AdamW (decoupled weight decay: p *= 1 - lr*wd before the Adam step)."""
  return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True, decoupled=True)

class Muon(Optimizer):
  """Muon (Jordan et al. 2024; tinygrad's `nn.optim.Muon`): SGD momentum whose update is orthogonalised by
  Newton-Schulz before the step, with decoupled weight decay after it. Per parameter, with g its gradient:
  b = momentum*b + g; u = g + momentum*b (nesterov) or b; u = newton_schulz(u as (rows, -1), ns_steps,
  ns_coefficients); p -= lr*u + lr*weight_decay*p. Every parameter's update is viewed as a matrix of its first dim
  by the rest (a 1-d one as a column, which Newton-Schulz normalizes).

  torch.optim.Muon differs: its momentum buffer is an average (lerp), it scales lr by sqrt(max(1, rows/cols)) and
  takes 2-d parameters only.

  >>> from ember.nn import Linear
  >>> opt = Muon([Linear(4, 2).weight], lr=0.02)
  """
  def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, momentum: float = 0.95, weight_decay: float = 0.1,
               ns_steps: int = 5, ns_coefficients: Sequence[float] = (3.4445, -4.775, 2.0315), nesterov: bool = True):
    super().__init__(params, lr)
    if momentum < 0: raise OptimizerError(f"Muon: momentum must be >= 0, got {momentum}")
    if nesterov and momentum <= 0: raise OptimizerError("Muon: nesterov needs momentum > 0")
    if ns_steps < 0: raise OptimizerError(f"Muon: ns_steps must be >= 0, got {ns_steps}")
    if not ns_coefficients: raise OptimizerError("Muon: ns_coefficients needs at least one coefficient")
    self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
    self.ns_steps, self.ns_coefficients = ns_steps, tuple(ns_coefficients)
    self.bufs = self._zeros_like_params() if momentum else []
  def _update(self, i: int, p: Tensor, g: Tensor) -> Tensor:
    g = g.float()
    if self.momentum:
      b = assign(self.bufs[i], self.momentum * self.bufs[i] + g.flatten()).reshape(p.shape)
      g = g + self.momentum * b if self.nesterov else b
    rows = p.shape[0] if p.ndim else 1
    u = g.reshape(rows, -1).newton_schulz(self.ns_steps, self.ns_coefficients).reshape(p.shape)
    w = p.detach().float()
    return w - self.lr * u - self.lr * self.weight_decay * w

class OptimizerGroup:
  """Several optimizers stepped as one: their updates are realized in a single schedule.

  >>> from ember.nn import Linear
  >>> model = Linear(4, 2)
  >>> opt = OptimizerGroup(AdamW([model.weight], weight_decay=0.01), AdamW([model.bias], weight_decay=0.0))
  """
  def __init__(self, *optimizers: Optimizer):
    if not optimizers: raise OptimizerError("OptimizerGroup needs at least one optimizer")
    self.optimizers = list(optimizers)
  def zero_grad(self) -> None:
    for o in self.optimizers: o.zero_grad()
  def step(self) -> None:
    _realize_pending_readers([p for o in self.optimizers for p in o.params])
    Tensor.realize(*_unique([t for o in self.optimizers for t in o.schedule_step()]))

__all__ = ["Optimizer", "OptimizerError", "OptimizerGroup", "SGD", "Adam", "AdamW", "LAMB", "Muon"]

def jit_train_step(model: Callable[[Tensor], Tensor], opt: Optimizer | OptimizerGroup,
                   loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None) -> TinyJit:
  """The usual supervised step, compiled once with TinyJit: zero the grads, `loss_fn(model(x), y)` (cross-entropy by
  default), backward, optimizer step; returns the loss.

  >>> step = jit_train_step(model, Adam(get_parameters(model)))  # doctest: +SKIP
  >>> loss = step(Tensor(x_batch), Tensor(y_batch))              # doctest: +SKIP
  """
  from ember.nn.functional import cross_entropy
  fn = cross_entropy if loss_fn is None else loss_fn
  def step(xb: Tensor, yb: Tensor) -> Tensor:
    opt.zero_grad()
    loss = fn(model(xb), yb)
    loss.backward()
    opt.step()
    return loss
  return TinyJit(step)
