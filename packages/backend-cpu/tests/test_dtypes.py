"""Constants, casts and bitcasts of every dtype on both CPU renderers, against numpy (bf16/fp8 by definition)."""
from __future__ import annotations
import math
import numpy as np
import pytest
from ember.plugin import AxisType, DType, UOp, dtypes
from cpu_kernels import (RENDERERS, EMULATED, as_values, const, decode, elementwise, encode, end, linear, np_dtype,
                         param, run)

ALL = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
       dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.float32, dtypes.float64]

CONSTS: dict[DType, list] = {
  dtypes.bool: [True, False],
  dtypes.int8: [-128, 127, -1], dtypes.uint8: [255, 0], dtypes.int16: [-32768, 32767], dtypes.uint16: [65535],
  dtypes.int32: [-2 ** 31, 2 ** 31 - 1, -7], dtypes.uint32: [2 ** 32 - 1, 2 ** 31],
  dtypes.int64: [-2 ** 63, 2 ** 63 - 1, 2 ** 40 + 1, -5], dtypes.uint64: [2 ** 64 - 1, 2 ** 63],
  dtypes.float16: [0.1, 65504.0, -math.inf, math.nan, 2.0 ** -24, -0.0],
  dtypes.float32: [0.1, -0.0, math.inf, -math.inf, math.nan, 3.4028234663852886e38, 2.0 ** -149, -2.5, 1 / 3],
  dtypes.float64: [0.1, 1e-310, 1.7976931348623157e308, -math.inf, math.nan, 1 / 3, -1e-5],
  dtypes.bfloat16: [0.1, -3.0e38, math.inf, math.nan, 1.5, -0.0078125],
  dtypes.fp8e4m3: [0.1, 448.0, -448.0, 2.0 ** -9, math.nan, -1.75],
  dtypes.fp8e5m2: [0.1, 57344.0, math.inf, -math.inf, 2.0 ** -16, -3.0],
}

def expected_const(v: float | int | bool, dt: DType) -> np.ndarray:
  if dt in EMULATED: return encode(np.array([v], np.float32), dt)
  return np.array([v]).astype(np_dtype(dt))

@pytest.mark.parametrize("kind", RENDERERS)
def test_constants(kind: str) -> None:
  items = [(dt, v) for dt in ALL for v in CONSTS[dt]]
  outs = [param(k, dt, 1) for k, (dt, _) in enumerate(items)]
  prog = linear(*[o.index(const(dtypes.int32, 0)).store(UOp.const(dt, v)) for o, (dt, v) in zip(outs, items)])
  got = run(kind, prog, [np.zeros(1, np_dtype(dt)) for dt, _ in items])
  for g, (dt, v) in zip(got, items):
    np.testing.assert_array_equal(as_values(g, dt), as_values(expected_const(v, dt), dt), err_msg=f"{dt} {v!r}")
    if dt not in EMULATED and dtypes.is_float(dt) and v == 0: assert np.signbit(g[0]) == np.signbit(v), f"{dt} {v!r}"

def src_values(dt: DType) -> np.ndarray:
  """Buffer contents of `dt` to cast: both signs, fractions, and (for ints) values that wrap in narrower ints."""
  if dt is dtypes.bool: return np.array([True, False, True, False])
  if dtypes.is_float(dt):
    x = np.array([0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 7.75, -7.75, 100.0, -100.0, 0.099, 3.0, 120.0, -120.0, 1.0],
                 np.float32)
    return encode(x, dt) if dt in EMULATED else x.astype(np_dtype(dt))
  info = np.iinfo(np_dtype(dt))
  x = [0, 1, -1, 2, 100, -100, 127, -128, 300, -300, 70000, info.min, info.max, 255, 65535, 2 ** 31]
  return np.array([v for v in x if info.min <= v <= info.max], dtype=object).astype(np_dtype(dt))

def expected_cast(values: np.ndarray, src: DType, dst: DType) -> tuple[np.ndarray, np.ndarray]:
  """(what a C cast gives, which entries C defines): float->int is defined when the truncated value fits."""
  x = as_values(values, src)
  with np.errstate(all="ignore"):
    if dst in EMULATED: want = encode(x.astype(np.float32), dst)
    else: want = x.astype(np_dtype(dst))
  defined = np.ones(len(x), bool)
  if dtypes.is_float(src) and dtypes.is_int(dst):
    info = np.iinfo(np_dtype(dst))
    defined = (np.trunc(x.astype(np.float64)) >= info.min) & (np.trunc(x.astype(np.float64)) <= info.max)
  return want, defined

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("src", ALL, ids=lambda d: d.name)
def test_casts(kind: str, src: DType) -> None:
  values = src_values(src)
  prog = elementwise([lambda x, d=dst: x.cast(d) for dst in ALL], [src], ALL, len(values))
  got = run(kind, prog, [np.zeros(len(values), np_dtype(d)) for d in ALL] + [values])
  for g, dst in zip(got, ALL):
    want, defined = expected_cast(values, src, dst)
    np.testing.assert_array_equal(as_values(g, dst)[defined], as_values(want, dst)[defined], err_msg=f"{src} -> {dst}")

BITCASTS = [(dtypes.float32, dtypes.int32), (dtypes.float32, dtypes.uint32), (dtypes.int32, dtypes.float32),
            (dtypes.float16, dtypes.int16), (dtypes.uint16, dtypes.float16), (dtypes.uint16, dtypes.bfloat16),
            (dtypes.bfloat16, dtypes.uint16), (dtypes.bfloat16, dtypes.int16), (dtypes.bfloat16, dtypes.float16),
            (dtypes.float16, dtypes.bfloat16), (dtypes.uint8, dtypes.fp8e4m3), (dtypes.fp8e4m3, dtypes.uint8),
            (dtypes.fp8e5m2, dtypes.int8), (dtypes.int8, dtypes.fp8e5m2), (dtypes.fp8e4m3, dtypes.fp8e5m2),
            (dtypes.float64, dtypes.int64), (dtypes.uint64, dtypes.float64), (dtypes.int8, dtypes.uint8)]

@pytest.mark.parametrize("kind", RENDERERS)
def test_bitcasts(kind: str) -> None:
  n, rng = 32, np.random.default_rng(7)
  ins = []
  for src, _ in BITCASTS:  # random finite values: bf16/fp8 registers hold floats, so NaN bits would come back canonical
    vals = rng.normal(0, 50, n).astype(np.float32)
    if src in EMULATED: ins.append(encode(vals, src))
    elif dtypes.is_float(src): ins.append(vals.astype(np_dtype(src)))
    else: ins.append(rng.integers(0, 256, n * src.itemsize, dtype=np.uint8).view(np_dtype(src)))
  fns = [lambda *loads, k=k, dst=dst: loads[k].bitcast(dst) for k, (_, dst) in enumerate(BITCASTS)]
  prog = elementwise(fns, [s for s, _ in BITCASTS], [d for _, d in BITCASTS], n)
  got = run(kind, prog, [np.zeros(n, np_dtype(d)) for _, d in BITCASTS] + ins)
  for g, x, (src, dst) in zip(got, ins, BITCASTS):
    np.testing.assert_array_equal(as_values(g, dst), as_values(x.view(np_dtype(dst)), dst), err_msg=f"{src} -> {dst}")

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("dt", EMULATED, ids=lambda d: d.name)
def test_emulated_rounding_every_code(kind: str, dt: DType) -> None:
  """float32 -> bits rounds to nearest even, saturates (e4m3fn) or overflows to inf: checked at every midpoint."""
  codes = np.arange(1 << dt.bitsize, dtype=np.int64).astype(np_dtype(dt))
  vals = decode(codes, dt).astype(np.float64)
  finite = np.sort(np.unique(vals[np.isfinite(vals)]))
  mids = (finite[:-1] + finite[1:]) / 2
  with np.errstate(over="ignore"):  # bfloat16's max * 4 is beyond float32: inf, on purpose
    probes = np.concatenate([finite, mids, np.nextafter(mids.astype(np.float32), np.float32(np.inf)), finite * 1.0001,
                             [np.inf, -np.inf, np.nan, finite[-1] * 1.01, finite[-1] * 4, 1e-45]]).astype(np.float32)
  rng = UOp.range(len(probes), 0, AxisType.LOOP)
  out, inp = param(0, dt, len(probes)), param(1, dtypes.float32, len(probes))
  prog = linear(out.index(rng).store(inp.index(rng).load().cast(dt)), end(rng))
  got = run(kind, prog, [np.zeros(len(probes), np_dtype(dt)), probes])[0]
  np.testing.assert_array_equal(decode(got, dt), decode(encode(probes, dt), dt))
