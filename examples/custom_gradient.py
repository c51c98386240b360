"""Custom gradients: kernels that bring their own backward (`grad_fxn`), and a function whose gradient ember derives.

  DEV=CPU python examples/custom_gradient.py

* `silu`: a fused SiLU kernel whose backward is a second hand-written kernel (dx = g * s * (1 + x * (1 - s)));
* `ste_round`: rounding with a straight-through gradient (the forward rounds, the backward passes g unchanged);
* `swiglu`: an `@ember.function(precompile=True, precompile_backward=True)` built from both: traced once per input
  shape, then its forward and its backward (derived through both kernels' gradients) each scheduled once and replayed.

Prints each gradient's largest difference from the same computation in plain Tensor ops.
"""
from __future__ import annotations
import numpy as np
import ember
from ember import Tensor, UOp, dtypes
from ember.uop.ops import AxisType

def _elementwise(out: UOp, *ins: UOp, fn) -> UOp:
  i = UOp.range(out.shape[0], 0, AxisType.GLOBAL)
  return out[i].store(fn(*(x[i].cast(dtypes.float32) for x in ins)).cast(out.dtype)).end(i).sink()

def _sigmoid(x: UOp) -> UOp: return (1.0 + (-x).exp()).reciprocal()

def silu_kernel(out: UOp, x: UOp) -> UOp: return _elementwise(out, x, fn=lambda v: v * _sigmoid(v))

def silu_backward_kernel(dx: UOp, x: UOp, g: UOp) -> UOp:
  def grad(v: UOp, gv: UOp) -> UOp:
    s = _sigmoid(v)
    return gv * s * (1.0 + v * (1.0 - s))
  return _elementwise(dx, x, g, fn=grad)

def _silu_grad(grad: UOp, kernel: UOp) -> tuple[UOp | None, ...]:
  """The backward of `silu`'s kernel: its sources are (output buffer, x); the gradient of x is a kernel too."""
  x, g = Tensor(kernel.src[1]), Tensor(grad)
  dx = Tensor.custom_kernel(Tensor.empty(*x.shape, dtype=x.dtype, device=x.device), x, g, fxn=silu_backward_kernel)[0]
  return (None, dx.uop)

def silu(x: Tensor) -> Tensor:
  """x * sigmoid(x) as one kernel, with a hand-written backward kernel."""
  flat = x.reshape(-1)
  out = Tensor.empty(*flat.shape, dtype=x.dtype, device=x.device)
  return Tensor.custom_kernel(out, flat, fxn=silu_kernel, grad_fxn=_silu_grad)[0].reshape(x.shape)

def round_kernel(out: UOp, x: UOp) -> UOp:
  i = UOp.range(out.shape[0], 0, AxisType.GLOBAL)
  v = x[i]
  r = (v + 0.5).trunc()  # round half away from zero, for v >= 0; mirrored below
  return out[i].store(v.lt(0).where(-((-v + 0.5).trunc()), r)).end(i).sink()

def ste_round(x: Tensor) -> Tensor:
  """x rounded (half away from zero) in the forward pass; the gradient passes through unchanged."""
  flat = x.reshape(-1)
  out = Tensor.empty(*flat.shape, dtype=x.dtype, device=x.device)
  return Tensor.custom_kernel(out, flat, fxn=round_kernel, grad_fxn=lambda g, k: (None, g))[0].reshape(x.shape)

@ember.function(precompile=True, precompile_backward=True)
def swiglu(x: Tensor, w_gate: Tensor, w_up: Tensor) -> Tensor:
  """A gated MLP activation from the two custom kernels (a reusable, traced-once block)."""
  return silu(x @ w_gate) * ste_round(x @ w_up)

def main() -> dict[str, float]:
  rng = np.random.default_rng(0)
  x_np = rng.standard_normal((4, 8)).astype(np.float32)
  wg_np, wu_np = (rng.standard_normal((8, 6)).astype(np.float32) for _ in range(2))
  errs = {}
  for name, ours, ref in (("silu", silu, lambda t: t.silu()),
                          ("ste_round", ste_round, lambda t: t + (t.round() - t).detach())):
    a, b = Tensor(x_np, requires_grad=True), Tensor(x_np, requires_grad=True)
    (ours(a) * a).sum().backward()
    (ref(b) * b).sum().backward()
    errs[name] = float(np.abs(a.grad.numpy() - b.grad.numpy()).max())
  errs["swiglu"] = 0.0
  for _ in range(3):  # the trace, then replays of the forward and of the backward
    x, wg, wu = (Tensor(a, requires_grad=True) for a in (x_np, wg_np, wu_np))
    swiglu(x, wg, wu).sum().backward()
    xr, wgr, wur = (Tensor(a, requires_grad=True) for a in (x_np, wg_np, wu_np))
    ((xr @ wgr).silu() * ((xr @ wur) + ((xr @ wur).round() - (xr @ wur)).detach())).sum().backward()
    errs["swiglu"] = max(errs["swiglu"], *(float(np.abs(p.grad.numpy() - r.grad.numpy()).max())
                                           for p, r in ((x, xr), (wg, wgr), (wu, wur))))
  for name, err in errs.items(): print(f"{name:10s} max |grad - reference grad| = {err:.2e}")
  return errs

if __name__ == "__main__":
  main()
