"""ember.renderer.emulate: bfloat16 and fp8 as integer code on raw bits. The rewritten program runs on the PYTHON
interpreter (it then holds only ints and float32) against numpy oracles built from each format's definition."""
from __future__ import annotations
import numpy as np
import pytest
from ember.renderer.emulate import EMULATED_FLOATS, emulate_floats
from ember.device.python import PythonCompiler, PythonProgram, PythonRenderer
from ember.dtype import DType, PtrDType, dtypes
from ember.renderer.cstyle import CStyleLanguage
from ember.testing import format_values
from ember.testing.programs import end, linear, param
from ember.uop.ops import AxisType, UOp

FORMATS = [dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2]
STORAGE = {dtypes.bfloat16: np.uint16, dtypes.fp8e4m3: np.uint8, dtypes.fp8e5m2: np.uint8}

def values(dt: DType) -> np.ndarray: return format_values(dt)

def nearest(x: np.ndarray, dt: DType) -> np.ndarray:
  """Round to nearest, ties to the even code; e4m3fn saturates to its max, the others overflow to inf."""
  table = values(dt)
  mags = table[: len(table) // 2]  # the non-negative codes, in value order: a value's index is its code
  finite = mags[np.isfinite(mags)]
  if dt is not dtypes.fp8e4m3: finite = np.append(finite, 2 * finite[-1] - (finite[-1] - finite[-2]))  # inf's place
  ax = np.minimum(np.abs(x), finite[-1])
  hi = np.clip(np.searchsorted(finite, ax), 1, len(finite) - 1)
  lo = hi - 1
  pick = np.where((ax - finite[lo] < finite[hi] - ax) | ((ax - finite[lo] == finite[hi] - ax) & (lo % 2 == 0)), lo, hi)
  out = np.where(pick == len(mags[np.isfinite(mags)]), np.inf, finite[pick])
  return np.where(np.isnan(x), np.nan, np.copysign(out, x))

def run_emulated(prog: list[UOp], bufs: list[np.ndarray]) -> None:
  emulated = emulate_floats(prog, CStyleLanguage())  # a renderer without native bfloat16/fp8
  assert not any(u.dtype in EMULATED_FLOATS or (isinstance(u.dtype, PtrDType) and u.dtype.base in EMULATED_FLOATS)
                 for u in emulated)
  PythonProgram("k", PythonCompiler().compile_cached(PythonRenderer().render(emulated, "k")))(
    *(memoryview(b).cast("B") for b in bufs), vals=())

def same(got: np.ndarray, want: np.ndarray) -> None:
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])

@pytest.mark.parametrize("dt", FORMATS, ids=lambda d: d.name)
def test_load_decodes_every_code(dt: DType) -> None:
  step = 7 if dt is dtypes.bfloat16 else 1  # every 7th bfloat16 code: all exponents and both signs
  codes = np.arange(0, 1 << dt.bitsize, step).astype(STORAGE[dt])
  out, inp = param(0, dtypes.float32, len(codes)), param(1, dt, len(codes))
  rng = UOp.range(len(codes), 0, AxisType.LOOP)
  got = np.zeros(len(codes), np.float32)
  run_emulated(linear(out.index(rng).store(inp.index(rng).load().cast(dtypes.float32)), end(rng)), [got, codes])
  with np.errstate(invalid="ignore"): wide = got.astype(np.float64)  # signalling NaNs quieten
  same(wide, values(dt)[codes.astype(np.int64)])

@pytest.mark.parametrize("dt", FORMATS, ids=lambda d: d.name)
def test_store_rounds_to_nearest_even(dt: DType) -> None:
  table = values(dt)
  finite = np.unique(table[np.isfinite(table)])
  mids = (finite[:-1] + finite[1:]) / 2  # ties: exact in float32 for every format here
  with np.errstate(over="ignore"):
    probes = np.concatenate([finite, mids, np.nextafter(mids.astype(np.float32), np.float32(np.inf)), finite * 1.0001,
                             [np.inf, -np.inf, np.nan, finite[-1] * 1.01, finite[-1] * 4, 1e-45]]).astype(np.float32)
  out, inp = param(0, dt, len(probes)), param(1, dtypes.float32, len(probes))
  rng = UOp.range(len(probes), 0, AxisType.LOOP)
  got = np.zeros(len(probes), STORAGE[dt])
  run_emulated(linear(out.index(rng).store(inp.index(rng).load().cast(dt)), end(rng)), [got, probes])
  same(values(dt)[got.astype(np.int64)], nearest(probes.astype(np.float64), dt))

def test_programs_without_emulated_floats_are_left_alone() -> None:
  out, inp = param(0, dtypes.float32, 4), param(1, dtypes.float16, 4)
  rng = UOp.range(4, 0, AxisType.LOOP)
  prog = linear(out.index(rng).store(inp.index(rng).load().cast(dtypes.float32) * 2), end(rng))
  assert emulate_floats(prog, CStyleLanguage()) is prog
  bf16 = linear(param(0, dtypes.bfloat16, 4).index(rng).store(UOp.const(dtypes.bfloat16, 1.5)), end(rng))
  assert emulate_floats(bf16, PythonRenderer()) is bf16  # the interpreter computes bfloat16 itself
