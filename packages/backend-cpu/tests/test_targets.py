"""Every kernel runs on CPUs other than the host: casts between every pair of dtypes (NaN, inf, subnormals, rounding
ties) and half arithmetic, compiled for the host and for baseline targets on both renderers, against numpy; and a
kernel that would call a function nobody defines is a CompileError, not a jump to address 0."""
from __future__ import annotations
import os
import subprocess
import sys
import numpy as np
import pytest
from ember.plugin import AxisType, CompileError, DType, Ops, UOp, dtypes
from ember.renderer.llvmir import JIT_RUNTIME_SYMBOLS
from ember_cpu import compiler as cpu_compiler
from cpu_kernels import (BASELINES, EMULATED, RENDERERS, TARGETS, as_values, device, elementwise, encode, end, linear,
                         np_dtype, param, run)

ALL = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
       dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.float32, dtypes.float64]

# float values where conversions go wrong: NaN and inf, half's subnormals and the ties below them, half's largest
# value and the first that overflows it, ties between half neighbours, a double just above a half tie (rounding it
# to float32 first lands on the tie: double rounding gives the even neighbour, the right answer is the upper one),
# float32's and float64's subnormals
SPECIAL = [0.0, -0.0, 1.0, -2.5, 0.1, np.nan, -np.nan, np.inf, -np.inf, 2.0 ** -24, -(2.0 ** -24), 2.0 ** -25,
           3 * 2.0 ** -25, 2.0 ** -14 - 2.0 ** -24, 6.1e-5, 65504.0, 65519.0, 65520.0, -70000.0, 1 + 2.0 ** -11,
           1 + 3 * 2.0 ** -11, 1 + 2.0 ** -11 + 2.0 ** -40, -(2049 + 2.0 ** -30), 2.0 ** -25 + 2.0 ** -60, 1e-45,
           1e-310, -1e-310, 3.4e38, 1e39, 1.7976931348623157e308, 300.7, -128.9, 255.5, 2.0 ** 31, 2.0 ** 40]

def src_values(dt: DType) -> np.ndarray:
  """Buffer contents of `dt`: the special values for floats, edges and wrapping values for ints."""
  if dt is dtypes.bool: return np.array([True, False, True])
  if dt in EMULATED:
    with np.errstate(over="ignore"): return encode(np.array(SPECIAL).astype(np.float32), dt)
  if dtypes.is_float(dt):
    with np.errstate(over="ignore"): return np.array(SPECIAL).astype(np_dtype(dt))
  info = np.iinfo(np_dtype(dt))
  x = [0, 1, -1, 127, -128, 255, 2049, -2049, 65504, 65520, 70000, 2 ** 24 + 1, 2 ** 31, info.min, info.max]
  return np.array([v for v in x if info.min <= v <= info.max], dtype=object).astype(np_dtype(dt))

def expected_cast(values: np.ndarray, src: DType, dst: DType) -> tuple[np.ndarray, np.ndarray]:
  """(numpy's conversion, where C defines it): float -> int only where the truncated value fits; bfloat16 and fp8 by
  their definition from float32, as the renderers convert them."""
  x = as_values(values, src)
  with np.errstate(all="ignore"):
    want = encode(x.astype(np.float32), dst) if dst in EMULATED else x.astype(np_dtype(dst))
  defined = np.ones(len(x), bool)
  if dtypes.is_float(src) and dtypes.is_int(dst):
    info, t = np.iinfo(np_dtype(dst)), np.trunc(x.astype(np.float64))
    with np.errstate(invalid="ignore"): defined = (t >= info.min) & (t <= info.max)
  return want, defined

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("arch", TARGETS)
@pytest.mark.parametrize("src", ALL, ids=lambda d: d.name)
def test_casts_on_every_target(kind: str, arch: str, src: DType) -> None:
  values = src_values(src)
  prog = elementwise([lambda x, d=dst: x.cast(d) for dst in ALL], [src], ALL, len(values))
  got = run(kind, prog, [np.zeros(len(values), np_dtype(d)) for d in ALL] + [values], arch=arch)
  for g, dst in zip(got, ALL):
    want, defined = expected_cast(values, src, dst)
    msg = f"{src} -> {dst} for {arch}"
    np.testing.assert_array_equal(as_values(g, dst)[defined], as_values(want, dst)[defined], err_msg=msg)
    if dtypes.is_float(dst) and dst not in EMULATED:  # -0.0 stays negative, and every half keeps its exact bits
      np.testing.assert_array_equal(np.signbit(g), np.signbit(want), err_msg=msg)

def _every_half() -> np.ndarray: return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("arch", TARGETS)
def test_every_half_code_and_the_doubles_between_them(kind: str, arch: str) -> None:
  """half -> float32/float64 for all 65536 codes, and double -> half at every midpoint and just beside it."""
  h = _every_half()
  finite = np.unique(h[np.isfinite(h)].astype(np.float64))
  mids = (finite[:-1] + finite[1:]) / 2
  probes = np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), [65520.0, -65520.0]])
  n, m = len(h), len(probes)
  rng = UOp.range(n, 0, AxisType.LOOP)
  rng2 = UOp.range(m, 1, AxisType.LOOP)
  o32, o64, oh, ih, i64 = (param(0, dtypes.float32, n), param(1, dtypes.float64, n), param(2, dtypes.float16, m),
                           param(3, dtypes.float16, n), param(4, dtypes.float64, m))
  x = ih.index(rng).load()
  prog = linear(o32.index(rng).store(x.cast(dtypes.float32)), o64.index(rng).store(x.cast(dtypes.float64)), end(rng),
                oh.index(rng2).store(i64.index(rng2).load().cast(dtypes.float16)), end(rng2))
  got32, got64, goth, _, _ = run(kind, prog, [np.zeros(n, np.float32), np.zeros(n, np.float64),
                                              np.zeros(m, np.float16), h, probes], arch=arch)
  np.testing.assert_array_equal(got32, h.astype(np.float32))
  np.testing.assert_array_equal(np.signbit(got32), np.signbit(h))
  np.testing.assert_array_equal(got64, h.astype(np.float64))
  with np.errstate(over="ignore"): want = probes.astype(np.float16)  # +-65520 round to inf, on purpose
  np.testing.assert_array_equal(goth.view(np.uint16), want.view(np.uint16))

HALF_OPS = [(Ops.ADD, np.add), (Ops.MUL, np.multiply), (Ops.FDIV, np.divide), (Ops.SUB, np.subtract),
            (Ops.MAX, np.maximum), (Ops.CMPLT, np.less)]

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("arch", TARGETS)
def test_half_arithmetic_on_every_target(kind: str, arch: str) -> None:
  """Each half op is correctly rounded (numpy computes it in float32 and rounds once, which is exact for these)."""
  rs = np.random.default_rng(3)
  a = np.concatenate([rs.normal(0, 300, 61), [6e-8, 65504, np.inf, np.nan, -0.0]]).astype(np.float16)
  b = np.concatenate([rs.normal(0, 3, 61), [6e-8, 2, -np.inf, 1, 5e-5]]).astype(np.float16)
  out_dts = [dtypes.bool if op is Ops.CMPLT else dtypes.float16 for op, _ in HALF_OPS] + [dtypes.float16]
  fns = [lambda x, y, op=op: x.alu(op, y) for op, _ in HALF_OPS] + [lambda x, y: x.alu(Ops.SQRT)]
  prog = elementwise(fns, [dtypes.float16, dtypes.float16], out_dts, len(a))
  got = run(kind, prog, [np.zeros(len(a), np_dtype(d)) for d in out_dts] + [a, b], arch=arch)
  with np.errstate(all="ignore"):
    wants = [fn(a, b) for _, fn in HALF_OPS] + [np.sqrt(a)]
  for g, want, name in zip(got, wants, [op.name for op, _ in HALF_OPS] + ["SQRT"]):
    np.testing.assert_array_equal(g, want, err_msg=f"{name} for {arch}")

def _double_to_half_object(arch: str) -> bytes:
  dev = device("LLVM", arch)
  out, inp = param(0, dtypes.float16, 4), param(1, dtypes.float64, 4)
  rng = UOp.range(4, 0, AxisType.LOOP)
  prog = linear(out.index(rng).store(inp.index(rng).load().cast(dtypes.float16)), end(rng))
  return dev.compiler.compile(dev.renderer.render(prog, "k"))

@pytest.mark.skipif(not cpu_compiler._is_x86(), reason="x86-64-v3 is an x86 target")
def test_x86_64_v3_calls_the_jit_runtime_for_double_to_half() -> None:
  """No AVX2 instruction converts double to half: LLVM calls __truncdfhf2, which the JIT runtime defines."""
  called = cpu_compiler.undefined_symbols(_double_to_half_object("x86-64-v3"))
  assert "__truncdfhf2" in called and set(called) <= set(JIT_RUNTIME_SYMBOLS) | {"memset", "memcpy"}

def test_a_call_nobody_defines_is_a_compile_error() -> None:
  src = """declare float @ember_no_such_helper(float)
define void @k(ptr %out, i32 %core_id, i32 %num_cores) {
  %v = call float @ember_no_such_helper(float 1.0)
  store float %v, ptr %out
  ret void
}
@k_argfmt = constant [4 x i8] c"Pii\\00"
"""
  with pytest.raises(CompileError, match="ember_no_such_helper"): device("LLVM").compiler.compile(src)

@pytest.mark.parametrize("kind", RENDERERS)
def test_unknown_cpu_is_a_clear_error(kind: str) -> None:
  with pytest.raises(CompileError, match="no-such-cpu"): device(kind, "no-such-cpu")

@pytest.mark.parametrize("dev", [f"CPU:{kind}:{arch}" for kind in RENDERERS for arch in BASELINES])
def test_tensor_casts_for_a_baseline_target_chosen_by_dev(dev: str) -> None:
  """The issue's crash, through DEV=CPU:<renderer>:<cpu> in a fresh process (a jump to address 0 kills it)."""
  code = ("import numpy as np\nfrom ember import Tensor, Device, dtypes\n"
          "x = np.array([1 / 3, 1 + 2.0 ** -11 + 2.0 ** -40, 65520.0, 2.0 ** -25 + 2.0 ** -60, -0.0, np.nan])\n"
          "got = Tensor(x).cast(dtypes.float16).numpy()\n"
          "assert repr(Device[Device.DEFAULT].renderer).endswith(f'({ARCH!r})'), Device[Device.DEFAULT].renderer\n"
          "np.testing.assert_array_equal(got.view(np.uint16), x.astype(np.float16).view(np.uint16))\n"
          "h = np.array([0.1, 65504, 3e-6], np.float16)\n"
          "np.testing.assert_array_equal((Tensor(h) * 1.5).cast(dtypes.float64).numpy(), (h * np.float16(1.5)))\n")
  env = {**os.environ, "DEV": dev}
  proc = subprocess.run([sys.executable, "-c", f"ARCH = {dev.split(':')[2]!r}\n" + code], env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
