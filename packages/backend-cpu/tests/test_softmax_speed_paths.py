"""The code paths behind a fast softmax on CPU:C against numpy and torch: exp2 as integer-op clamping and a polynomial
of fused multiply-adds (plain multiplies and adds on targets without FMA), Tensor.softmax / log_softmax, and the
one-kernel softmax of examples/custom_softmax.py."""
from __future__ import annotations
from pathlib import Path
from typing import Any, Iterator
import numpy as np
import pytest
import torch
from ember import Tensor
from ember.device import Device
from ember.dtype import dtypes
from ember.testing.custom_kernels import load_example
from ember.testing.hostshim import selected_device
from ember_cpu.compiler import _is_x86
from ember_cpu.renderer import has_fma

# the host, and on x86 a baseline without FMA (its exp2 polynomial is multiplies and adds) and one with it
TARGETS = ["CPU:C", *(["CPU:C:x86-64-v2", "CPU:C:x86-64-v3"] if _is_x86() else [])]

@pytest.fixture(params=TARGETS)
def device(request: pytest.FixtureRequest) -> Iterator[str]:
  opened = dict(Device._opened)
  Device._opened.pop("CPU", None)  # reopen CPU with the target DEV selects
  try:
    with selected_device(request.param, "CPU"): yield request.param
  finally:
    Device._opened.clear()
    Device._opened.update(opened)

def _ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
  """|got - want| in float32 spacings at `want` (float64); 0 where got is want rounded to float32 (infs and nans)."""
  with np.errstate(all="ignore"):
    rounded = want.astype(np.float32)
    spacing = np.spacing(np.minimum(np.abs(rounded), np.finfo(np.float32).max)).astype(np.float64)
    err = np.abs(got.astype(np.float64) - want) / spacing
  exact = (got == rounded) | (np.isnan(got) & np.isnan(rounded))
  return np.where(exact, 0.0, np.where(np.isnan(err), np.inf, err))

def _exp2_inputs() -> np.ndarray:
  rng = np.random.default_rng(7)
  dense = np.arange(-152, 130, 2.0 ** -12)  # every exponent from past underflow to past overflow, 1.15M points
  bits = rng.integers(0, 2 ** 32, 1 << 19, dtype=np.uint64).astype(np.uint32).view(np.float32)  # every exponent
  near_zero = rng.uniform(-1, 1, 1 << 18)
  with np.errstate(all="ignore"): return np.concatenate([dense, bits.astype(np.float64), near_zero]).astype(np.float32)

def test_exp2_dense_sweep(device: str) -> None:
  x = _exp2_inputs()
  got = Tensor(x).exp2().numpy()
  with np.errstate(all="ignore"): want = np.exp2(x.astype(np.float64))
  err = _ulp_error(got, want)
  i = int(err.argmax())
  arch = device.split(":")[2] if device.count(":") == 2 else ""
  # with FMA each Horner step rounds once (at most 0.88 ulp over this sweep); without, as the decomposition's own test
  tol = 1.0 if has_fma(arch) else 2.0
  assert err[i] <= tol, f"{err[i]:.2f} ulp at x={x[i]!r}: got {got[i]!r}, want {want[i]!r}"

def test_exp2_specials(device: str) -> None:
  fi = np.finfo(np.float32)
  x = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 128.0, 127.99999, 128.5, 151.0, 152.0, 1e30, fi.max,
                -149.0, -149.5, -150.0, -150.5, -151.0, -152.0, -1e30, -fi.max, -126.0, 1e-30, -1e-30,
                float(fi.smallest_subnormal)], np.float32)
  with np.errstate(all="ignore"): want = np.exp2(x.astype(np.float64)).astype(np.float32)
  np.testing.assert_array_equal(Tensor(x).exp2().numpy(), want)
  with np.errstate(all="ignore"): want_e = np.exp(x.astype(np.float64)).astype(np.float32)
  got_e = Tensor(x).exp().numpy()
  special = ~np.isfinite(want_e) | (want_e == 0) | np.isnan(x)
  np.testing.assert_array_equal(got_e[special], want_e[special])

def test_fma_only_where_the_target_has_it(device: str) -> None:
  from ember.codegen import get_program
  x = Tensor(np.linspace(-4, 4, 64, dtype=np.float32)).realize().exp2()
  src = get_program(x.schedule()[-1].ast, Device["CPU"].renderer).src
  arch = device.split(":")[2] if device.count(":") == 2 else ""
  assert ("fma" in src) == has_fma(arch)

# ** softmax and log_softmax against torch **

def _rows(kind: str, shape: tuple[int, ...]) -> np.ndarray:
  rng = np.random.default_rng(3)
  x = rng.standard_normal(shape).astype(np.float32)
  if kind == "large": return x * 3e3 + 1e4  # exponents far below the row max underflow to 0
  if kind == "small": return x * 1e-6
  if kind == "neginf":  # masked entries, one row masked but for one entry
    x[..., ::3] = -np.inf
    x.reshape(-1, shape[-1])[0, 1:] = -np.inf
    return x
  return x * 10

SHAPES = [(6, 1024), (5, 1000), (3, 33), (2, 3, 17), (4, 16)]

@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["normal", "large", "small", "neginf"])
def test_softmax_and_log_softmax_match_torch(shape: tuple[int, ...], kind: str) -> None:
  x = _rows(kind, shape)
  t = torch.from_numpy(x)
  np.testing.assert_allclose(Tensor(x).softmax(-1).numpy(), torch.softmax(t, -1).numpy(), rtol=2e-6, atol=1e-7)
  want = torch.log_softmax(t, -1).numpy()
  got = Tensor(x).log_softmax(-1).numpy()
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-5 if kind == "large" else 1e-6)

def test_softmax_fully_masked_row_is_nan_as_torch() -> None:
  x = np.full((2, 20), -np.inf, np.float32)
  x[1] = np.arange(20)
  np.testing.assert_allclose(Tensor(x).softmax(-1).numpy(), torch.softmax(torch.from_numpy(x), -1).numpy(),
                             rtol=1e-6, atol=1e-7)

@pytest.mark.parametrize("cols", [1024, 37])
def test_softmax_half_computes_in_float32(cols: int) -> None:
  x = (np.random.default_rng(5).standard_normal((4, cols)) * 8).astype(np.float16)
  t = torch.from_numpy(x)
  got = Tensor(x).softmax(-1)
  assert got.dtype is dtypes.float16
  np.testing.assert_allclose(got.numpy().astype(np.float32), torch.softmax(t, -1).float().numpy(), rtol=1e-3, atol=1e-5)
  got32 = Tensor(x).softmax(-1, dtype=dtypes.float32)
  assert got32.dtype is dtypes.float32
  np.testing.assert_allclose(got32.numpy(), torch.softmax(t, -1, dtype=torch.float32).numpy(), rtol=2e-6, atol=1e-7)
  np.testing.assert_allclose(Tensor(x).log_softmax(-1).numpy().astype(np.float32),
                             torch.log_softmax(t.float(), -1).half().float().numpy(), rtol=1e-3, atol=2e-3)

# ** the one-kernel softmax of examples/custom_softmax.py **

def _example() -> Any:
  return load_example(Path(__file__).resolve().parents[3] / "examples", "custom_softmax")

@pytest.mark.parametrize("shape", [(64, 1024), (9, 1000), (9, 100), (7, 37)],
                         ids=["lanes16", "lanes8", "lanes4", "lanes1"])
@pytest.mark.parametrize("kind", ["normal", "large", "neginf"])
def test_custom_softmax_matches_torch(shape: tuple[int, int], kind: str) -> None:
  x = _rows(kind, shape)
  got = _example().custom_softmax(Tensor(x)).numpy()
  np.testing.assert_allclose(got, torch.softmax(torch.from_numpy(x), -1).numpy(), rtol=2e-6, atol=1e-7)

# ** the next row's prefetch **

@pytest.mark.parametrize("cols,ahead", [(1024, True), (2048, True), (1000, False), (256, False)])
def test_row_prefetch_only_for_rows_of_a_page(cols: int, ahead: bool) -> None:
  """A row loop over rows of at least 4 KB prefetches the next row in its vector loop and has gcc vectorise its
  other loops at full width (the result is the same)."""
  from ember.codegen import get_program
  x = (np.random.default_rng(9).standard_normal((64, cols)) * 4).astype(np.float32)
  out = Tensor(x).realize().softmax(-1)
  src = get_program(out.schedule()[-1].ast, Device["CPU"].renderer).src
  assert ("__builtin_prefetch" in src) == ahead
  assert ("prefer-vector-width=512" in src) == ahead  # its loops gcc vectorises itself at full width
  # a row of 1000 is summed in 8 lanes, not 16: within 1e-5 of torch, not 2e-6
  np.testing.assert_allclose(out.numpy(), torch.softmax(torch.from_numpy(x), -1).numpy(), rtol=1e-5, atol=1e-7)

# ** reductions over rows that 16 lanes do not divide **

@pytest.mark.parametrize("cols", [1000, 100, 1004])
def test_rows_split_into_half_or_quarter_vectors(cols: int) -> None:
  """A float sum over rows of 1000 (100, 1004) floats splits into 8 (4) partial-sum lanes, and each row's lanes are
  one vector: before, one scalar accumulator per row, a sum at twice torch's time and softmax's exp loop scalar."""
  from ember.codegen import get_program
  x = np.random.default_rng(cols).standard_normal((64, cols)).astype(np.float32)
  out = Tensor(x).realize().sum(-1)
  src = get_program(out.schedule()[-1].ast, Device["CPU"].renderer).src
  assert "_v = " in src and "float acc1 " not in src, f"the partial sums of a row are not vector code:\n{src}"
  np.testing.assert_allclose(out.numpy(), torch.from_numpy(x).sum(-1).numpy(), rtol=1e-5, atol=1e-4)
  t = Tensor(x)
  np.testing.assert_allclose(t.softmax(-1).numpy(), torch.softmax(torch.from_numpy(x), -1).numpy(), rtol=1e-5,
                             atol=1e-7)
  np.testing.assert_allclose(t.mean(0).numpy(), torch.from_numpy(x).mean(0).numpy(), rtol=1e-5, atol=1e-6)
