"""QDOT (UOp.qdot, the quantised row dot product of decode matvecs) against a numpy oracle of its arithmetic: 4-bit
codes (Q4_0's zero point, Q4_1's offset) and 8-bit codes (Q8_0's +128 zero point), one and two activation planes,
odd row counts and several block counts, on the CPU's C renderer (the VNNI path on this host, the plain loop on a
baseline x86-64-v2 target), its LLVM renderer and the PYTHON interpreter; and the spec and errors of the op."""
from __future__ import annotations
from typing import Iterator
import numpy as np
import pytest
from ember import Tensor, UOp
from ember.device import Device
from ember.dtype import dtypes
from ember.errors import DTypeError, ShapeError
from ember.testing.hostshim import selected_device
from ember.uop.ops import AxisType, Ops, QDOT_PLANE
from ember.uop.spec import check_kernel_node
from ember_cpu.compiler import _is_x86

TARGETS = ["CPU:C", "CPU:LLVM", "PYTHON", *(["CPU:C:x86-64-v2"] if _is_x86() else [])]

@pytest.fixture(params=TARGETS)
def device(request: pytest.FixtureRequest) -> Iterator[str]:
  if request.param == "PYTHON":
    yield "PYTHON"
    return
  opened = dict(Device._opened)
  Device._opened.pop("CPU", None)  # reopen CPU with the renderer (and target) that DEV selects
  try:
    with selected_device(request.param, "CPU"): yield "CPU"
  finally:
    Device._opened.clear()
    Device._opened.update(opened)

def qdot_case(rows: int, blocks: int, bits: int, offset: bool, planes: int, vectors: int, seed: int
              ) -> list[np.ndarray]:
  """Random packed codes, scales, (offsets,) activation planes, their scales and block sums."""
  rng = np.random.default_rng(seed)
  codes = rng.integers(0, 1 << bits, (rows, blocks, 32)).astype(np.uint8)
  packed = (codes[..., :16] | (codes[..., 16:] << 4)) if bits == 4 else codes
  scale, mo = rng.standard_normal((2, rows, blocks)).astype(np.float32)
  xq = rng.integers(-127, 128, (vectors, blocks * planes * 32)).astype(np.int8)
  xd = rng.random((vectors, blocks)).astype(np.float32)
  xs = rng.standard_normal((vectors, blocks)).astype(np.float32)
  return [packed, scale, xq, xd, xs, *([mo] if offset else [])]

def oracle(arrays: list[np.ndarray], bits: int, zero: int, planes: int) -> np.ndarray:
  """UOp.qdot's formula in float64, (vectors, rows)."""
  packed, scale, xq, xd, xs = (a.astype(np.float64) if a.dtype == np.float32 else a for a in arrays[:5])
  rows, blocks, vectors = scale.shape[0], scale.shape[1], xq.shape[0]
  codes = np.concatenate([packed & 15, packed >> 4], axis=-1) if bits == 4 else packed
  q = xq.astype(np.float64).reshape(vectors, blocks, planes, 32)
  q = (q * (float(QDOT_PLANE) ** -np.arange(planes)).reshape(1, 1, planes, 1)).sum(2)
  dots = np.einsum("rbe,vbe->vrb", codes.reshape(rows, blocks, 32).astype(np.float64), q)
  per_block = scale * (xd[:, None] * dots - zero * xs[:, None])
  if len(arrays) == 6: per_block = per_block + arrays[5].astype(np.float64) * xs[:, None]
  return per_block.sum(-1)

def run_qdot(arrays: list[np.ndarray], blocks: int, bits: int, zero: int, planes: int, device: str) -> np.ndarray:
  rows, vectors = arrays[0].shape[0], arrays[2].shape[0]
  def kernel(out: UOp, codes: UOp, scale: UOp, xq: UOp, xd: UOp, xs: UOp, *mo: UOp) -> UOp:
    row, i = UOp.range(rows, 0, AxisType.GLOBAL), UOp.range(vectors, 1, AxisType.LOOP)
    codes, scale = codes.reshape(rows, codes.size // rows), scale.reshape(rows, blocks)
    value = UOp.qdot(codes[row, 0], scale[row, 0], xq[i, 0], xd[i, 0], xs[i, 0], blocks, bits, zero,
                     mo[0][row, 0] if mo else None, planes)
    return out[i, row].store(value).end(i, row).sink()
  ins = [Tensor(np.ascontiguousarray(a), device=device) for a in arrays]
  return Tensor.custom_kernel(Tensor.empty(vectors, rows, device=device), *ins, fxn=kernel)[0].numpy()

@pytest.mark.parametrize("bits, zero, offset", [(4, 8, False), (4, 0, True), (8, 128, False), (8, 3, True)],
                         ids=["q4_0", "q4_1", "q8_0", "q8_zero_and_offset"])
@pytest.mark.parametrize("planes", [1, 2, 3])
def test_qdot_matches_numpy(device: str, bits: int, zero: int, offset: bool, planes: int) -> None:
  for rows, blocks, vectors, seed in ((37, 1, 1, 0), (5, 18, 3, 1), (67, 7, 2, 2)):
    arrays = qdot_case(rows, blocks, bits, offset, planes, vectors, seed)
    got, want = run_qdot(arrays, blocks, bits, zero, planes, device), oracle(arrays, bits, zero, planes)
    # the integer sums are exact; the float sums over blocks differ from float64 only by rounding
    scale = np.abs(want).max() + 1
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * scale * blocks)

def test_qdot_extreme_codes_do_not_overflow(device: str) -> None:
  """The largest codes times the largest activations in every plane: the int32 block sums stay exact."""
  arrays = qdot_case(3, 4, 8, False, 3, 1, 3)
  arrays[0][:] = 255
  for q in (127, -127):
    arrays[2][:] = q
    np.testing.assert_allclose(run_qdot(arrays, 4, 8, 0, 3, device), oracle(arrays, 8, 0, 3), rtol=1e-6)

def test_qdot_rows_split_over_threads() -> None:
  """A matvec big enough to split: its row loop becomes the CPU's THREAD range (the op counts as its multiply-adds)."""
  from ember.codegen.handwritten import handwritten_program
  from ember_cpu.renderer import ClangRenderer
  arrays = qdot_case(3072, 18, 4, True, 2, 1, 4)
  ins = [Tensor(np.ascontiguousarray(a)) for a in arrays]
  def kernel(out: UOp, codes: UOp, scale: UOp, xq: UOp, xd: UOp, xs: UOp, mo: UOp) -> UOp:
    row = UOp.range(3072, 0, AxisType.GLOBAL)
    codes, scale, mo = codes.reshape(3072, 18 * 16), scale.reshape(3072, 18), mo.reshape(3072, 18)
    return out[0, row].store(UOp.qdot(codes[row, 0], scale[row, 0], xq[0, 0], xd[0, 0], xs[0, 0], 18, 4, 0, mo[row, 0],
                                      2)).end(row).sink()
  y = Tensor.custom_kernel(Tensor.empty(1, 3072), *ins, fxn=kernel)[0]
  ast = next(n for n in y.uop.toposort() if n.op is Ops.CUSTOM_KERNEL).arg.ast
  prog = handwritten_program(ast, ClangRenderer())
  assert any(u.op is Ops.RANGE and u.arg[1] is AxisType.THREAD for u in prog.uops)
  assert "EMBER_DPBUSD" in prog.src and "ember_qdot4_z0_p2_m(" in prog.src

def test_qdot_spec_and_errors() -> None:
  buf = lambda dt, slot: UOp.placeholder(64, dt, slot)[0]  # noqa: E731
  srcs = (buf(dtypes.uint8, 0), buf(dtypes.float32, 1), buf(dtypes.int8, 2), buf(dtypes.float32, 3),
          buf(dtypes.float32, 4))
  good = UOp.qdot(*srcs, blocks=2, bits=4, zero=8)
  assert good.dtype is dtypes.float32 and good.arg == (2, 4, 8, 1) and check_kernel_node(good)
  assert not check_kernel_node(good.replace(arg=(2, 5, 8, 1)))
  assert not check_kernel_node(good.replace(src=(srcs[1], *srcs[1:])))
  with pytest.raises(DTypeError, match="qdot's xq is the address of a"):
    UOp.qdot(srcs[0], srcs[1], buf(dtypes.uint8, 2), srcs[3], srcs[4], blocks=2, bits=4)
  with pytest.raises(DTypeError, match="qdot's codes"):
    UOp.qdot(srcs[0].load(), *srcs[1:], blocks=2, bits=4)
  with pytest.raises(ValueError, match="4 or 8 bits"):
    UOp.qdot(*srcs, blocks=2, bits=6)
  with pytest.raises(ValueError, match="1 to 3 int8 planes"):
    UOp.qdot(*srcs, blocks=2, bits=4, planes=4)
  with pytest.raises(ShapeError, match="block count"):
    UOp.qdot(*srcs, blocks=0, bits=4)
