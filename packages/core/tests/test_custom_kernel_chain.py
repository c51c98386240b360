"""Custom kernels chained: a kernel's output (its input's buffer after it ran) feeds the next kernel as it is, with no
copy into a buffer of its own (the decode matvecs' activation quantiser feeds its three outputs to QDOT kernels)."""
from __future__ import annotations
import numpy as np
from ember import Device, GlobalCounters, Tensor, UOp
from ember.uop.ops import AxisType

def _scale_kernel(factor: float):
  def scale(out: UOp, x: UOp) -> UOp:
    i = UOp.range(x.shape[0], 0, AxisType.GLOBAL)
    return out[i].store(x[i] * factor).end(i).sink()
  return scale

def _add(out: UOp, a: UOp, b: UOp) -> UOp:
  i = UOp.range(a.shape[0], 0, AxisType.GLOBAL)
  return out[i].store(a[i] + b[i]).end(i).sink()

def test_custom_kernel_output_feeds_the_next_without_a_copy() -> None:
  for device in sorted({Device.DEFAULT, "PYTHON"}):
    x = Tensor(np.arange(8, dtype=np.float32), device=device).realize()
    GlobalCounters.reset()
    doubled = Tensor.custom_kernel(Tensor.empty(8, device=device), x, fxn=_scale_kernel(2.0))[0]
    tripled = Tensor.custom_kernel(Tensor.empty(8, device=device), x, fxn=_scale_kernel(3.0))[0]
    total = Tensor.custom_kernel(Tensor.empty(8, device=device), doubled, tripled, fxn=_add)[0]
    np.testing.assert_array_equal(total.numpy(), np.arange(8) * 5.0)
    assert GlobalCounters.kernel_count == 3  # the three kernels, no copies of their outputs
