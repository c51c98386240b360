"""nn.optim.Muon against a numpy reference of its update (momentum, Newton-Schulz, decoupled weight decay)."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor
from ember.nn.optim import Muon, OptimizerError

RNG = np.random.default_rng(0)
W, B, X, T = (RNG.standard_normal(s).astype(np.float32) for s in ((3, 4), (3,), (8, 4), (8, 3)))

def _ns(g: np.ndarray, steps: int, coeffs: tuple[float, ...], eps: float = 1e-7) -> np.ndarray:
  if g.shape[0] > g.shape[1]: return _ns(g.T, steps, coeffs, eps).T
  x = g / (np.sqrt((g * g).sum()) + eps)
  for _ in range(steps):
    gram = x @ x.T
    term, out = x, coeffs[0] * x
    for c in coeffs[1:]:
      term = gram @ term
      out = out + c * term
    x = out
  return x

def _grads(w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """d/dw, d/db of mean((X @ w.T + b - T)^2)."""
  err = 2 * (X @ w.T + b - T) / err_size
  return err.T @ X, err.sum(0)
err_size = T.size

@pytest.mark.parametrize("nesterov,momentum,wd", [(True, 0.95, 0.1), (False, 0.9, 0.0), (False, 0.0, 0.05)])
def test_muon_matches_numpy_reference(nesterov, momentum, wd):
  lr, steps, coeffs = 0.02, 6, (3.4445, -4.775, 2.0315)
  w, b = Tensor(W.copy(), requires_grad=True), Tensor(B.copy(), requires_grad=True)
  opt = Muon([w, b], lr=lr, momentum=momentum, weight_decay=wd, nesterov=nesterov)
  ref = [W.astype(np.float64), B.astype(np.float64)]
  bufs = [np.zeros_like(p) for p in ref]
  for _ in range(steps):
    opt.zero_grad()
    ((Tensor(X) @ w.T + b - Tensor(T)).square().mean()).backward()
    opt.step()
    for i, g in enumerate(_grads(*ref)):
      if momentum:
        bufs[i] = momentum * bufs[i] + g
        g = g + momentum * bufs[i] if nesterov else bufs[i]
      u = _ns(g.reshape(g.shape[0], -1), 5, coeffs).reshape(g.shape)
      ref[i] = ref[i] - lr * u - lr * wd * ref[i]
  np.testing.assert_allclose(w.numpy(), ref[0], atol=2e-4)
  np.testing.assert_allclose(b.numpy(), ref[1], atol=2e-4)

def test_muon_rejects_bad_hyperparameters():
  p = Tensor(W.copy(), requires_grad=True)
  with pytest.raises(OptimizerError, match="momentum"): Muon([p], momentum=-1)
  with pytest.raises(OptimizerError, match="nesterov"): Muon([p], momentum=0.0, nesterov=True)
  with pytest.raises(OptimizerError, match="ns_coefficients"): Muon([p], ns_coefficients=())
