"""Test helpers for tensor cores (ember.codegen.tensorcore): matmul kernels that run on a warp's matrix instructions,
checked through a backend's host shim (which emulates the instruction from its documented fragment layout) against
numpy and the PYTHON reference device.

Unlike the kit's package module, this one imports ember when it is imported: only a backend's tests import it.
"""
from __future__ import annotations
from typing import Callable
import numpy as np
from ember.dtype import DType, dtypes
from ember.renderer import Renderer
from ember.tensor import Tensor
from ember.testing import REFERENCE_DEVICE
from ember.testing.hostshim import programs
from ember.uop.ops import Ops

def _half(seed: int, *shape: int) -> np.ndarray:
  return np.random.default_rng(seed).uniform(-1.0, 1.0, shape).astype(np.float16)

def _t(x: np.ndarray) -> Tensor: return Tensor(x, device=REFERENCE_DEVICE)

def _f64(x: np.ndarray) -> np.ndarray: return x.astype(np.float64)

def _f32_out() -> tuple[Tensor, np.ndarray]:
  a, b = _half(1, 32, 64), _half(2, 64, 48)
  return _t(a).float() @ _t(b).float(), _f64(a) @ _f64(b)

def _half_out() -> tuple[Tensor, np.ndarray]:
  a, b = _half(3, 32, 64), _half(4, 64, 48)
  return _t(a) @ _t(b), _f64(a) @ _f64(b)

def _batched() -> tuple[Tensor, np.ndarray]:
  a, b = _half(5, 3, 16, 32), _half(6, 3, 32, 64)
  return _t(a).float() @ _t(b).float(), _f64(a) @ _f64(b)

def _transposed_b() -> tuple[Tensor, np.ndarray]:
  a, bt = _half(7, 48, 32), _half(8, 16, 32)  # B stored (N, K): its k stride is 1
  return _t(a).float() @ _t(bt).float().T, _f64(a) @ _f64(bt).T

def _epilogue() -> tuple[Tensor, np.ndarray]:
  a, b = _half(9, 16, 48), _half(10, 48, 32)
  bias = np.random.default_rng(11).uniform(-4.0, 4.0, 32).astype(np.float32)
  return ((_t(a).float() @ _t(b).float()) + Tensor(bias, device=REFERENCE_DEVICE)).relu(), \
    np.maximum(_f64(a) @ _f64(b) + bias, 0)

def _bfloat16() -> tuple[Tensor, np.ndarray]:
  a, b = _half(12, 32, 32), _half(13, 32, 16)
  x, y = _t(a).cast(dtypes.bfloat16), _t(b).cast(dtypes.bfloat16)
  # the oracle rounds the inputs to bfloat16 like the kernel: the top 16 bits of the float32, to nearest even
  def bf16(v: np.ndarray) -> np.ndarray:
    bits = v.astype(np.float32).view(np.uint32).astype(np.int64)
    rounded = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16 << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)
  return x.float() @ y.float(), bf16(a) @ bf16(b)

def _float(seed: int, *shape: int) -> np.ndarray:
  return np.random.default_rng(seed).uniform(-1.0, 1.0, shape).astype(np.float32)

def _f32() -> tuple[Tensor, np.ndarray]:
  a, b = _float(14, 32, 64), _float(15, 64, 48)
  return _t(a) @ _t(b), _f64(a) @ _f64(b)

def _f32_batched_bias() -> tuple[Tensor, np.ndarray]:
  a, b, bias = _float(16, 2, 16, 24), _float(17, 2, 24, 40), _float(18, 40)
  return _t(a) @ _t(b) + _t(bias), _f64(a) @ _f64(b) + bias

TC_CASES: dict[str, tuple[DType, Callable[[], tuple[Tensor, np.ndarray]]]] = {
  "f16_to_f32_32x64x48": (dtypes.float16, _f32_out),
  "f16_32x64x48": (dtypes.float16, _half_out),
  "f16_batched_3x16x32x64": (dtypes.float16, _batched),
  "f16_transposed_b_48x32x16": (dtypes.float16, _transposed_b),
  "f16_bias_relu_16x48x32": (dtypes.float16, _epilogue),
  "bf16_to_f32_32x32x16": (dtypes.bfloat16, _bfloat16),
  "f32_32x64x48": (dtypes.float32, _f32),
  "f32_batched_bias_2x16x24x40": (dtypes.float32, _f32_batched_bias),
}
"""Matmuls over the input dtype whose shapes fit the matrix instructions (M, N, K dividing 16 x 8 x 16 and
16 x 16 x 16): float32 and float16 outputs, a batch, B stored transposed, an epilogue (bias + relu) after the
reduction, bfloat16 inputs, float32 inputs (8 x 8 x 8 simdgroup matrices). Each gives the tensor (built on the
reference device) and a float64 numpy oracle."""

def cases_for(renderer: Renderer) -> list[str]:
  """The TC_CASES whose input dtype one of `renderer`'s tensor cores takes."""
  from ember.codegen.tensorcore import tensor_core
  dts = {tensor_core(name).dtype_in for name in renderer.tensor_cores}
  return [name for name, (dt, _) in TC_CASES.items() if dt in dts]

def check_tensor_core_case(name: str, renderer: Renderer, run: Callable[[Tensor], np.ndarray]) -> None:
  """TC_CASES[name], run by `run`, matches its numpy oracle and the reference device; its matmul kernel runs on a
  matrix instruction on `renderer` (so the test fails if the opt stops applying)."""
  t, oracle = TC_CASES[name][1]()
  assert any(u.op is Ops.WMMA for spec in programs(t, renderer) for u in spec.uops), \
    f"{name}: no matrix instruction on {renderer}"
  got = run(t).astype(np.float64)
  # exact products summed in float32; a float16 output adds its own rounding (and the reference rounds products)
  rtol, atol = (2e-3, 2e-3) if t.dtype is dtypes.float16 else (1e-5, 1e-5)
  np.testing.assert_allclose(got, oracle, rtol=rtol, atol=atol)
  np.testing.assert_allclose(got, t.numpy().astype(np.float64), rtol=rtol, atol=atol)

__all__ = ["TC_CASES", "cases_for", "check_tensor_core_case"]
