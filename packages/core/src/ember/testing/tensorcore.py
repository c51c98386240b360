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

def _staged_f16() -> tuple[Tensor, np.ndarray]:
  a, b = _half(19, 64, 64), _half(20, 64, 128)
  return _t(a).float() @ _t(b).float(), _f64(a) @ _f64(b)

def _staged_half_batched() -> tuple[Tensor, np.ndarray]:
  a, b = _half(21, 2, 64, 64), _half(22, 2, 64, 64)
  return _t(a) @ _t(b), _f64(a) @ _f64(b)

def _staged_f32() -> tuple[Tensor, np.ndarray]:
  a, b = _float(23, 64, 64), _float(24, 64, 64)
  return _t(a) @ _t(b), _f64(a) @ _f64(b)

STAGED_CASES: dict[str, tuple[DType, Callable[[], tuple[Tensor, np.ndarray]]]] = {
  "staged_f16_to_f32_64x64x128": (dtypes.float16, _staged_f16),
  "staged_f16_batched_2x64x64x64": (dtypes.float16, _staged_half_batched),
  "staged_f32_64x64x64": (dtypes.float32, _staged_f32),
}
"""Matmuls big enough for blocks of several warps with A and B staged through shared memory (codegen.tensorcore's
`staged_tiles`), small enough to emulate: float32 and float16 outputs, a batch, float32 inputs."""

def cases_for(renderer: Renderer, cases: dict[str, tuple[DType, Callable[[], tuple[Tensor, np.ndarray]]]] = TC_CASES
              ) -> list[str]:
  """The `cases` (TC_CASES by default) whose input dtype one of `renderer`'s tensor cores takes."""
  from ember.codegen.tensorcore import tensor_core
  dts = {tensor_core(name).dtype_in for name in renderer.tensor_cores}
  return [name for name, (dt, _) in cases.items() if dt in dts]

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

def check_staged_case(name: str, renderer: Renderer, run: Callable[[Tensor], np.ndarray]) -> None:
  """STAGED_CASES[name], run by `run` (a shim that checks shared memory), matches its numpy oracle; its matmul kernel
  runs on matrix instructions with both operands staged through shared memory, in a loop that ends with a barrier."""
  t, oracle = STAGED_CASES[name][1]()
  uops = [u for spec in programs(t, renderer) for u in spec.uops]
  assert {Ops.WMMA, Ops.BARRIER} <= {u.op for u in uops}, f"{name}: no staged matrix instructions on {renderer}"
  assert sum(u.op is Ops.DEFINE_LOCAL for u in uops) >= 2 and sum(u.op is Ops.BARRIER for u in uops) >= 2
  got = run(t).astype(np.float64)
  rtol, atol = (2e-3, 2e-3) if t.dtype is dtypes.float16 else (1e-5, 1e-5)
  np.testing.assert_allclose(got, oracle, rtol=rtol, atol=atol)

def check_removed_barriers_detected(renderer: Renderer, barrier: str,
                                    run_edited: Callable[[Tensor, Callable[[str], str]], np.ndarray],
                                    loop_end: bool = True) -> None:
  """The staged matmul's kernel with each of its shared memory barriers (`barrier`, a line of the source) removed in
  turn makes the shim raise SharedMemoryError: the first barrier orders the staging stores before the fragment loads,
  the loop's last line the loads before the next step's stores. `loop_end=False`: a target whose instruction helper
  has barriers of its own after the last fragment load, which order that already (removing the loop's is no race)."""
  import pytest
  from ember.device.hostshim import SharedMemoryError
  name = next(n for n in cases_for(renderer, STAGED_CASES))
  src = programs(STAGED_CASES[name][1]()[0], renderer)[0].src
  lines = [i for i, line in enumerate(src.splitlines()) if line.strip() == barrier]
  assert len(lines) >= 2, f"the staged kernel on {renderer} has {len(lines)} barriers"
  # the first two (the staging barrier and the next) and the last (the loop's): more are a target's instruction
  # helpers repeating themselves (Metal's simdgroup matrices)
  for drop in sorted({*lines[:2], *(lines[-1:] if loop_end else [])}):
    def edit(text: str, drop: int = drop) -> str:
      return "\n".join(line for i, line in enumerate(text.splitlines()) if i != drop) + "\n"
    with pytest.raises(SharedMemoryError, match="race"): run_edited(STAGED_CASES[name][1]()[0], edit)

__all__ = ["TC_CASES", "STAGED_CASES", "cases_for", "check_tensor_core_case", "check_staged_case",
           "check_removed_barriers_detected"]
