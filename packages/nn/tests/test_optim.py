"""Optimizers against torch.optim over 10 steps of a small two-layer model, LAMB against a numpy reference."""
from __future__ import annotations
from typing import Any, Callable
import numpy as np
import pytest
from ember import Tensor
from ember.nn import BatchNorm1d, Linear
from ember.nn.optim import (LAMB, SGD, Adagrad, Adam, AdamW, CosineAnnealingLR, ExponentialLR, LambdaLR, LinearLR,
                            MultiStepLR, OptimizerError, OptimizerGroup, RMSprop, StepLR, clip_grad_norm_,
                            clip_grad_value_)
from ember.nn.state import get_parameters

torch = pytest.importorskip("torch")

STEPS = 10
RNG = np.random.default_rng(0)
W1, B1, W2 = (RNG.standard_normal(s).astype(np.float32) for s in ((5, 4), (5,), (3, 5)))
X = RNG.standard_normal((8, 4)).astype(np.float32)
T = RNG.standard_normal((8, 3)).astype(np.float32)

def _ember_run(make_opt: Callable[[list[Tensor]], Any], steps: int = STEPS) -> list[np.ndarray]:
  w1, b1, w2 = (Tensor(a.copy(), requires_grad=True) for a in (W1, B1, W2))
  opt = make_opt([w1, b1, w2])
  for _ in range(steps):
    opt.zero_grad()
    loss = (((Tensor(X) @ w1.T + b1).tanh() @ w2.T) - Tensor(T)).square().mean()
    loss.backward()
    opt.step()
  return [w1.numpy(), b1.numpy(), w2.numpy()]

def _torch_run(make_opt: Callable[[list[Any]], Any], steps: int = STEPS) -> list[np.ndarray]:
  w1, b1, w2 = (torch.tensor(a.copy(), requires_grad=True) for a in (W1, B1, W2))
  opt = make_opt([w1, b1, w2])
  for _ in range(steps):
    opt.zero_grad()
    loss = ((((torch.from_numpy(X) @ w1.T + b1).tanh() @ w2.T) - torch.from_numpy(T)) ** 2).mean()
    loss.backward()
    opt.step()
  return [w1.detach().numpy(), b1.detach().numpy(), w2.detach().numpy()]

CASES = {
  "sgd": (lambda p: SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
  "sgd_momentum_wd": (lambda p: SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
                      lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01)),
  "sgd_nesterov": (lambda p: SGD(p, lr=0.05, momentum=0.8, nesterov=True),
                   lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True)),
  "adam": (lambda p: Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
  "adam_l2": (lambda p: Adam(p, lr=0.01, weight_decay=0.1), lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1)),
  "adamw": (lambda p: AdamW(p, lr=0.01, b1=0.8, weight_decay=0.1),
            lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.8, 0.999), weight_decay=0.1)),
  "adam_betas": (lambda p: Adam(p, lr=0.01, betas=(0.7, 0.99)),
                 lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.7, 0.99))),
  "rmsprop": (lambda p: RMSprop(p, lr=0.01), lambda p: torch.optim.RMSprop(p, lr=0.01)),
  "rmsprop_centered_momentum_wd": (lambda p: RMSprop(p, lr=0.01, alpha=0.9, momentum=0.5, centered=True,
                                                     weight_decay=0.1),
                                   lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, momentum=0.5, centered=True,
                                                                 weight_decay=0.1)),
  "adagrad": (lambda p: Adagrad(p, lr=0.1), lambda p: torch.optim.Adagrad(p, lr=0.1)),
  "adagrad_decay_wd_init": (lambda p: Adagrad(p, lr=0.1, lr_decay=0.05, weight_decay=0.1,
                                              initial_accumulator_value=0.2),
                            lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.05, weight_decay=0.1,
                                                          initial_accumulator_value=0.2)),
}

@pytest.mark.parametrize("case", list(CASES))
def test_optimizer_matches_torch(case):
  ours, ref = CASES[case]
  for a, b in zip(_ember_run(ours), _torch_run(ref)): np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)

def _lamb_reference(lr: float, b1: float, b2: float, eps: float, wd: float) -> list[np.ndarray]:
  """LAMB in float64 numpy with torch computing the gradients."""
  params = [a.astype(np.float64) for a in (W1, B1, W2)]
  m = [np.zeros_like(p) for p in params]
  v = [np.zeros_like(p) for p in params]
  for t in range(1, STEPS + 1):
    ts = [torch.tensor(p, requires_grad=True) for p in params]
    hidden = (torch.from_numpy(X).double() @ ts[0].T + ts[1]).tanh()
    loss = ((hidden @ ts[2].T - torch.from_numpy(T).double()) ** 2).mean()
    loss.backward()
    for i, p in enumerate(params):
      g = ts[i].grad.numpy()
      m[i] = b1 * m[i] + (1 - b1) * g
      v[i] = b2 * v[i] + (1 - b2) * g * g
      up = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps) + wd * p
      r1, r2 = np.linalg.norm(p), np.linalg.norm(up)
      params[i] = p - lr * (r1 / r2 if r1 > 0 and r2 > 0 else 1.0) * up
  return params

def test_lamb_matches_reference():
  ours = _ember_run(lambda p: LAMB(p, lr=0.02, weight_decay=0.01))
  for a, b in zip(ours, _lamb_reference(0.02, 0.9, 0.999, 1e-6, 0.01)):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)

def test_optimizer_group_matches_torch_param_groups():
  ours = _ember_run(lambda p: OptimizerGroup(AdamW([p[0], p[2]], lr=0.01, weight_decay=0.2),
                                             AdamW([p[1]], lr=0.01, weight_decay=0.0)))
  groups = lambda p: [{"params": [p[0], p[2]], "weight_decay": 0.2}, {"params": [p[1]], "weight_decay": 0.0}]
  ref = _torch_run(lambda p: torch.optim.AdamW(groups(p), lr=0.01))
  for a, b in zip(ours, ref): np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)

def test_step_skips_params_without_grad_and_zero_grad_clears():
  a, b = Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0], requires_grad=True)
  opt = SGD([a, b], lr=0.5)
  (a * a).sum().backward()
  opt.step()
  np.testing.assert_allclose(a.numpy(), [1.0 - 0.5 * 2.0, 2.0 - 0.5 * 4.0])
  np.testing.assert_allclose(b.numpy(), [3.0])
  opt.zero_grad()
  assert a.grad is None and b.grad is None

def test_step_realizes_batchnorm_running_stats(training):
  lin, bn = Linear(3, 4), BatchNorm1d(4)
  opt = SGD(get_parameters([lin, bn]), lr=0.1)
  assert bn.running_mean in opt.buffers and lin.weight in opt.params
  x = np.random.default_rng(3).standard_normal((6, 3)).astype(np.float32)
  h = x @ lin.weight.numpy().T + lin.bias.numpy()
  bn(lin(Tensor(x))).sum().backward()
  opt.step()
  assert bn.running_mean.uop.is_realized
  np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * h.mean(0), atol=1e-5)
  np.testing.assert_allclose(bn.running_var.numpy(), 0.9 + 0.1 * h.var(0, ddof=1), atol=1e-5)

def test_optimizer_errors():
  with pytest.raises(OptimizerError, match="no parameters"): SGD([Tensor([1.0]).requires_grad_(False)])
  with pytest.raises(OptimizerError, match="nesterov"): SGD([Tensor([1.0])], nesterov=True)
  with pytest.raises(OptimizerError, match="b1"): Adam([Tensor([1.0])], b1=1.0)
  # errors name the optimizer the user called (Adam and AdamW are LAMBs underneath), for every bad setting torch refuses
  with pytest.raises(OptimizerError, match="^Adam: learning rate"): Adam([Tensor([1.0])], lr=-1)
  with pytest.raises(OptimizerError, match="^AdamW: eps"): AdamW([Tensor([1.0])], eps=-1e-8)
  with pytest.raises(OptimizerError, match="^Adam: weight_decay"): Adam([Tensor([1.0])], weight_decay=-0.1)
  with pytest.raises(OptimizerError, match="^LAMB: b2"): LAMB([Tensor([1.0])], b2=-0.5)
  # NaN passed every `x < 0` check and turned each weight NaN at the first step; inf likewise; and SGD took a
  # negative momentum or weight decay, which torch refuses
  nan, inf = float("nan"), float("inf")
  for make, what in ((lambda: SGD([Tensor([1.0])], lr=nan), "^SGD: learning rate"),
                     (lambda: Adam([Tensor([1.0])], lr=inf), "^Adam: learning rate"),
                     (lambda: AdamW([Tensor([1.0])], weight_decay=nan), "^AdamW: weight_decay"),
                     (lambda: SGD([Tensor([1.0])], momentum=-0.9), "^SGD: momentum"),
                     (lambda: SGD([Tensor([1.0])], weight_decay=nan), "^SGD: weight_decay"),
                     (lambda: Adagrad([Tensor([1.0])], eps=nan), "^Adagrad: eps")):
    with pytest.raises(OptimizerError, match=what + " must be a finite number >= 0"): make()


SCHEDULES = {
  "lambda": (lambda o: LambdaLR(o, lambda e: 0.9 ** e),
             lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 0.9 ** e)),
  "step": (lambda o: StepLR(o, 3, 0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5)),
  "multistep": (lambda o: MultiStepLR(o, [2, 5, 6], 0.3),
                lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [2, 5, 6], 0.3)),
  "exponential": (lambda o: ExponentialLR(o, 0.8), lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.8)),
  "cosine": (lambda o: CosineAnnealingLR(o, 7, 0.01), lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 7, 0.01)),
  "linear": (lambda o: LinearLR(o, 0.25, 1.0, 4), lambda o: torch.optim.lr_scheduler.LinearLR(o, 0.25, 1.0, 4)),
}

@pytest.mark.parametrize("case", list(SCHEDULES))
def test_lr_schedules_match_torch(case: str) -> None:
  ours_s, theirs_s = SCHEDULES[case]
  w = Tensor(W1.copy(), requires_grad=True)
  opt, topt = SGD([w], lr=0.2), torch.optim.SGD([torch.tensor(W1, requires_grad=True)], lr=0.2)
  ours, theirs = ours_s(opt), theirs_s(topt)
  for _ in range(10):
    assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-6)
    assert opt.lr.item() == pytest.approx(theirs.get_last_lr()[0], rel=1e-6)  # the tensor a JIT'd step reads
    topt.step()
    ours.step()
    theirs.step()

def test_schedule_drives_a_jitted_step() -> None:
  from ember import TinyJit
  w = Tensor(np.ones(3, np.float32), requires_grad=True)
  opt = SGD([w], lr=1.0)
  sched = StepLR(opt, 1, 0.5)
  def step() -> Tensor:
    opt.zero_grad()
    (w * Tensor(np.ones(3, np.float32))).sum().backward()  # gradient 1 everywhere
    opt.step()
    return w
  jit = TinyJit(step)
  for _ in range(4):
    jit()
    sched.step()
  np.testing.assert_allclose(w.numpy(), 1 - (1 + 0.5 + 0.25 + 0.125), rtol=1e-6)  # each replay read the new rate

@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_matches_torch(norm_type: float) -> None:
  ours = [Tensor(a.copy(), requires_grad=True) for a in (W1, B1, W2)]
  theirs = [torch.tensor(a.copy(), requires_grad=True) for a in (W1, B1, W2)]
  for ps, f in ((ours, lambda p: p.square().sum() * 3), (theirs, lambda p: (p ** 2).sum() * 3)):
    for p in ps: f(p).backward()
  total_o = clip_grad_norm_(ours, 1.5, norm_type)
  total_t = torch.nn.utils.clip_grad_norm_(theirs, 1.5, norm_type)
  np.testing.assert_allclose(total_o.numpy(), total_t.numpy(), rtol=1e-5)
  for a, b in zip(ours, theirs): np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-7)
  clip_grad_value_(ours, 0.1)
  torch.nn.utils.clip_grad_value_(theirs, 0.1)
  for a, b in zip(ours, theirs): np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-6)

def test_new_optimizer_arguments_are_checked() -> None:
  w = [Tensor(W1.copy(), requires_grad=True)]
  with pytest.raises(OptimizerError, match="not both"): Adam(w, b1=0.8, betas=(0.9, 0.99))
  with pytest.raises(OptimizerError): RMSprop(w, alpha=1.5)
  with pytest.raises(OptimizerError): Adagrad(w, lr_decay=-1)
  with pytest.raises(OptimizerError): StepLR(SGD(w), 0)
  with pytest.raises(OptimizerError): clip_grad_norm_(w, 1.0, norm_type=0)

def test_integer_tensors_given_to_an_optimizer_stay_buffers() -> None:
  from ember import dtypes
  w, steps = Tensor([1.0, 2.0]), Tensor([0], dtype=dtypes.int32)
  opt = SGD([w, steps], lr=0.5)
  assert w.requires_grad and not steps.requires_grad
  assert opt.params == [w] and opt.buffers == [steps]
  (w * w).sum().backward()
  opt.step()
  assert w.numpy().tolist() == [0.0, 0.0] and steps.numpy().tolist() == [0]
