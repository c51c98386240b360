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
import numbers
from abc import ABC, abstractmethod
from typing import Callable, Sequence
from ember import Tensor, TinyJit
from ember.dtype import dtypes
from ember.errors import EmberError
from ember.nn.functional import assign, filled, static_shape

class OptimizerError(EmberError, ValueError):
  """An optimizer was built with no parameters or an invalid hyperparameter."""

def _nonnegative(owner: str, **values: float) -> None:
  # `x < 0` lets NaN through (every comparison with NaN is False): a NaN learning rate turned every weight NaN at the
  # first step, silently
  for key, v in values.items():
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
      what = "learning rate" if key == "lr" else key
      raise OptimizerError(f"{owner}: {what} must be a finite number >= 0, got {v!r}")

class Optimizer(ABC):
  """Base class. `params` may hold model buffers too (requires_grad=False, e.g. BatchNorm running statistics): they
  are not updated, only realized with each step, so their pending updates land. Floating-point tensors whose
  `requires_grad` is None become parameters; integer and bool ones (step counters, index tables) stay buffers."""
  def __init__(self, params: Sequence[Tensor], lr: float, name: str | None = None):
    self.name = name or type(self).__name__  # what errors call it: Adam and AdamW are LAMBs
    for p in params:
      if p.requires_grad is None and dtypes.is_float(p.dtype): p.requires_grad = True
    self.params = _unique([p for p in params if p.requires_grad])
    self.buffers = _unique([p for p in params if not p.requires_grad])
    if not self.params:
      raise OptimizerError(f"{self.name} got no parameters to optimize (none has requires_grad)")
    _nonnegative(self.name, lr=lr)
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

class SGD(Optimizer):
  """torch.optim.SGD: g = grad + wd*p; with momentum b = momentum*b + g, g = b (or g + momentum*b with nesterov);
  p -= lr*g."""
  def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, momentum: float = 0.0, weight_decay: float = 0.0,
               nesterov: bool = False):
    super().__init__(params, lr)
    _nonnegative("SGD", momentum=momentum, weight_decay=weight_decay)
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
               weight_decay: float = 0.0, adam: bool = False, decoupled: bool = True, name: str | None = None):
    super().__init__(params, lr, name)
    for key, b in (("b1", b1), ("b2", b2)):
      if not 0 <= b < 1: raise OptimizerError(f"{self.name}: {key} must be in [0, 1), got {b}")
    _nonnegative(self.name, eps=eps, weight_decay=weight_decay)
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

def _betas(name: str, b1: float, b2: float, betas: tuple[float, float] | None) -> tuple[float, float]:
  """torch spells (b1, b2) as `betas=`: either, not both."""
  if betas is None: return b1, b2
  if (b1, b2) != (0.9, 0.999): raise OptimizerError(f"{name}: pass betas=(b1, b2) or b1=/b2=, not both")
  if len(betas) != 2: raise OptimizerError(f"{name}: betas must be a pair (b1, b2), got {betas!r}")
  return float(betas[0]), float(betas[1])

def Adam(params: Sequence[Tensor], lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         weight_decay: float = 0.0, *, betas: tuple[float, float] | None = None) -> LAMB:
  """torch.optim.Adam (weight_decay is an L2 penalty added to the gradient); `betas=` as torch spells (b1, b2)."""
  b1, b2 = _betas("Adam", b1, b2, betas)
  return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True, decoupled=False, name="Adam")

def AdamW(params: Sequence[Tensor], lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01, *, betas: tuple[float, float] | None = None) -> LAMB:
  """torch.optim.AdamW (decoupled weight decay: p *= 1 - lr*wd before the Adam step); `betas=` as torch spells it."""
  b1, b2 = _betas("AdamW", b1, b2, betas)
  return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True, decoupled=True, name="AdamW")

class RMSprop(Optimizer):
  """torch.optim.RMSprop: g += wd*p; v = alpha*v + (1-alpha)*g^2; with `centered` the running mean a of g is
  subtracted (v - a^2); u = g / (sqrt(v) + eps); with momentum b = momentum*b + u, u = b; p -= lr*u."""
  def __init__(self, params: Sequence[Tensor], lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
               weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False):
    super().__init__(params, lr)
    if not 0 <= alpha <= 1: raise OptimizerError(f"RMSprop: alpha must be in [0, 1], got {alpha}")
    _nonnegative("RMSprop", momentum=momentum, eps=eps, weight_decay=weight_decay)
    self.alpha, self.eps, self.weight_decay, self.momentum, self.centered = alpha, eps, weight_decay, momentum, centered
    self.square_avg = self._zeros_like_params()
    self.grad_avg = self._zeros_like_params() if centered else []
    self.bufs = self._zeros_like_params() if momentum else []
  def _update(self, i: int, p: Tensor, g: Tensor) -> Tensor:
    g = g.float()
    if self.weight_decay: g = g + self.weight_decay * p.detach().float()
    flat = g.flatten()
    v = assign(self.square_avg[i], self.alpha * self.square_avg[i] + (1 - self.alpha) * flat.square())
    if self.centered:
      a = assign(self.grad_avg[i], self.alpha * self.grad_avg[i] + (1 - self.alpha) * flat)
      v = v - a.square()
    u = flat / (v.sqrt() + self.eps)
    if self.momentum: u = assign(self.bufs[i], self.momentum * self.bufs[i] + u)
    return p.detach().float() - self.lr * u.reshape(p.shape)

class Adagrad(Optimizer):
  """torch.optim.Adagrad: g += wd*p; step t counts from 1; clr = lr / (1 + (t-1)*lr_decay); s += g^2;
  p -= clr * g / (sqrt(s) + eps)."""
  def __init__(self, params: Sequence[Tensor], lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
               initial_accumulator_value: float = 0.0, eps: float = 1e-10):
    super().__init__(params, lr)
    _nonnegative("Adagrad", lr_decay=lr_decay, weight_decay=weight_decay,
                 initial_accumulator_value=initial_accumulator_value, eps=eps)
    self.lr_decay, self.weight_decay, self.eps = lr_decay, weight_decay, eps
    self.sums = [self._slot(math.prod(static_shape(p, "optimizer")), initial_accumulator_value, p.device)
                 for p in self.params]
    self.steps = self._slot(1, 0.0, self.params[0].device)  # steps taken, advanced once per step
    self.state.extend([*self.sums, self.steps])
  def schedule_step(self) -> list[Tensor]:
    assign(self.steps, self.steps + 1)
    return super().schedule_step()
  def _update(self, i: int, p: Tensor, g: Tensor) -> Tensor:
    g = g.float()
    if self.weight_decay: g = g + self.weight_decay * p.detach().float()
    clr = self.lr / (1 + (self.steps.reshape(()) - 1) * self.lr_decay)
    flat = g.flatten()
    total = assign(self.sums[i], self.sums[i] + flat.square())
    return p.detach().float() - clr * (flat / (total.sqrt() + self.eps)).reshape(p.shape)

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
    _nonnegative("Muon", momentum=momentum, weight_decay=weight_decay)
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
    Tensor.realize(*_unique([t for o in self.optimizers for t in o.schedule_step()]))

# ** learning-rate schedules (torch.optim.lr_scheduler): each step() writes the new rate into the optimizer's lr tensor,
# which a TinyJit-captured step reads when it replays **

class LRScheduler(ABC):
  """Base of the schedules: `step()` after each optimizer step (or epoch) advances `last_epoch` and sets the
  optimizer's learning rate to `get_lr()`; `get_last_lr()` returns [that rate] as torch does."""
  def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
    if not isinstance(optimizer, Optimizer):
      raise OptimizerError(f"{type(self).__name__} schedules an Optimizer, got {type(optimizer).__name__}")
    self.optimizer, self.base_lr = optimizer, float(optimizer.lr.item())
    self.last_epoch = last_epoch
    self._last_lr = self.base_lr
    self.step()
  @abstractmethod
  def get_lr(self) -> float:
    """The rate at `last_epoch`."""
  def step(self) -> None:
    self.last_epoch += 1
    self._last_lr = float(self.get_lr())
    self.optimizer.lr.assign(Tensor.full((), self._last_lr, dtype=dtypes.float32, device=self.optimizer.lr.device))
    self.optimizer.lr.realize()
  def get_last_lr(self) -> list[float]: return [self._last_lr]

class LambdaLR(LRScheduler):
  """lr = base_lr * lr_lambda(epoch)."""
  def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float], last_epoch: int = -1):
    self.lr_lambda = lr_lambda
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> float: return self.base_lr * self.lr_lambda(self.last_epoch)

class StepLR(LRScheduler):
  """lr = base_lr * gamma ** (epoch // step_size)."""
  def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
    if step_size < 1: raise OptimizerError(f"StepLR: step_size must be >= 1, got {step_size}")
    self.step_size, self.gamma = step_size, gamma
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> float: return self.base_lr * self.gamma ** (self.last_epoch // self.step_size)

class MultiStepLR(LRScheduler):
  """lr = base_lr * gamma ** (the number of milestones reached)."""
  def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1):
    self.milestones, self.gamma = sorted(milestones), gamma
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> float: return self.base_lr * self.gamma ** sum(1 for m in self.milestones if m <= self.last_epoch)

class ExponentialLR(LRScheduler):
  """lr = base_lr * gamma ** epoch."""
  def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
    self.gamma = gamma
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> float: return self.base_lr * self.gamma ** self.last_epoch

class CosineAnnealingLR(LRScheduler):
  """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (torch's closed form)."""
  def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
    if T_max < 1: raise OptimizerError(f"CosineAnnealingLR: T_max must be >= 1, got {T_max}")
    self.T_max, self.eta_min = T_max, eta_min
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> float:
    return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2

class LinearLR(LRScheduler):
  """lr = base_lr * (a factor going linearly from start_factor to end_factor over total_iters epochs, then held)."""
  def __init__(self, optimizer: Optimizer, start_factor: float = 1 / 3, end_factor: float = 1.0,
               total_iters: int = 5, last_epoch: int = -1):
    if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
      raise OptimizerError(f"LinearLR: start_factor must be in (0, 1] and end_factor in [0, 1], got {start_factor}, "
                           f"{end_factor}")
    self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> float:
    t = min(self.last_epoch, self.total_iters) / self.total_iters if self.total_iters else 1.0
    return self.base_lr * (self.start_factor + (self.end_factor - self.start_factor) * t)

# ** gradient clipping (torch.nn.utils) **

def clip_grad_norm_(parameters: Sequence[Tensor] | Tensor, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
  """Scale every gradient by max_norm / (total norm + 1e-6) where the norm of all of them together exceeds max_norm
  (lazily: no sync, so it works inside TinyJit); returns the total norm. `error_if_nonfinite` reads the norm (a sync)
  and raises OptimizerError when it is NaN or infinite."""
  if not norm_type > 0: raise OptimizerError(f"clip_grad_norm_: norm_type must be > 0 or inf, got {norm_type}")
  params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
  grads = [p.grad for p in params if p.grad is not None]
  if not grads: return Tensor(0.0)
  if norm_type == math.inf: total = Tensor.stack(*[g.detach().abs().max().float() for g in grads]).max()
  else:
    total = Tensor.stack(*[g.detach().float().abs().pow(norm_type).sum() for g in grads]).sum().pow(1 / norm_type)
  if error_if_nonfinite and not bool(total.isfinite().item()):
    raise OptimizerError(f"clip_grad_norm_: the total {norm_type}-norm of the gradients is {total.item()}")
  scale = (max_norm / (total + 1e-6)).minimum(1.0)
  for p in params:
    if p.grad is not None: p.grad = (p.grad * scale).cast(p.grad.dtype)
  return total

def clip_grad_value_(parameters: Sequence[Tensor] | Tensor, clip_value: float) -> None:
  """Clamp every gradient to [-clip_value, clip_value]."""
  for p in ([parameters] if isinstance(parameters, Tensor) else parameters):
    if p.grad is not None: p.grad = p.grad.clip(-clip_value, clip_value)

__all__ = ["Optimizer", "OptimizerError", "OptimizerGroup", "SGD", "Adam", "AdamW", "LAMB", "Muon", "RMSprop",
           "Adagrad", "LRScheduler", "LambdaLR", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
           "LinearLR", "clip_grad_norm_", "clip_grad_value_"]

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
