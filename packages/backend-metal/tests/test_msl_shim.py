"""Every kernel of a corpus of real ember programs, rendered by MetalRenderer, compiled for the host through the C++
shim (`shim/metal_stdlib`) and run there, against the PYTHON reference device running the same kernel on the same
inputs.

The corpus is the conformance kit's (`ember.testing.KERNEL_CORPUS`) over the dtypes Metal supports, plus Tensor
programs that reach the rest of the renderer: transcendentals, NaN through MAX, multi-threadgroup grids with a clamped
tail, casts and bitcasts, integer bit ops, multi-kernel programs (softmax, cumsum, argmax), and a DEFINE_VAR.
Each kernel is checked on its own: its inputs are snapshotted right before the reference runs it.
"""
from __future__ import annotations
import math
import tempfile
from dataclasses import dataclass
from typing import Callable, Iterator
import numpy as np
import pytest
from ember.codegen import get_program
from ember.device import Device
from ember.device.python import from_storage, round_to_format, to_storage
from ember.engine.realize import run_schedule
from ember.plugin import AxisType, DType, Ops, ProgramSpec, PtrDType, UOp, dtypes
from ember.tensor import Tensor
from ember.testing import KERNEL_CORPUS, sample, tensor, tolerance
from ember.testing.hostshim import GROUP_CASES
from ember.testing.tensorcore import TC_CASES, cases_for, check_tensor_core_case
from ember_metal.renderer import MetalRenderer
import msl_shim

REF = "PYTHON"
RENDERER = MetalRenderer()
KIT_DTYPES = (dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.int16,
              dtypes.uint32, dtypes.int64, dtypes.bool, dtypes.fp8e4m3)

pytestmark = pytest.mark.skipif(msl_shim.find_cxx() is None, reason="the MSL shim needs g++ or clang++ on PATH")

def _f(shape: tuple[int, ...], seed: int, dt: DType = dtypes.float32, positive: bool = False) -> Tensor:
  return tensor(sample(shape, dt, seed, positive=positive), dt, REF)

def _with_nans() -> Tensor:
  x = sample((6, 9), dtypes.float32, 11)
  x[1, 3], x[4, 0], x[5, 8] = math.nan, math.nan, math.inf
  return Tensor(x.astype(np.float32), device=REF)

def _ints(shape: tuple[int, ...], seed: int, dt: DType, lo: int, hi: int) -> Tensor:
  return Tensor(np.random.default_rng(seed).integers(lo, hi, shape).astype(dt.fmt), device=REF)

EXTRA: dict[str, Callable[[], Tensor]] = {
  "exp_log_f32": lambda: _f((5, 7), 20).exp() + _f((5, 7), 21, positive=True).log(),
  "sin_sqrt_f32": lambda: _f((64,), 22).sin() * _f((64,), 23, positive=True).sqrt(),
  "tanh_sigmoid_f16": lambda: _f((4, 8), 24, dtypes.float16).tanh() + _f((4, 8), 25, dtypes.float16).sigmoid(),
  "exp2_bf16": lambda: _f((3, 5), 26, dtypes.bfloat16).exp2(),
  "reciprocal_trunc_f32": lambda: _f((9,), 27, positive=True).reciprocal() + (_f((9,), 28) * 3).trunc(),
  "max_reduce_nan": lambda: _with_nans().max(1),
  "maximum_nan": lambda: _with_nans().maximum(_f((6, 9), 12)),
  "big_elementwise_tail": lambda: (_f((10, 100), 29) * 2 + 1).relu(),  # 1000 threads: 4 threadgroups, clamped tail
  "big_matmul": lambda: _f((33, 17), 30) @ _f((17, 40), 31),
  "matmul_f16": lambda: _f((8, 16), 32, dtypes.float16) @ _f((16, 8), 33, dtypes.float16),
  "softmax": lambda: _f((8, 33), 34).softmax(-1),
  "mean_var": lambda: _f((6, 10), 35).var(1) + _f((6, 10), 36).mean(1),
  "cumsum": lambda: _f((4, 12), 37).cumsum(1),
  "argmax": lambda: _f((5, 11), 38).argmax(1),
  "conv2d": lambda: _f((1, 2, 6, 6), 39).conv2d(_f((3, 2, 3, 3), 40), padding=1),
  "pad_flip_permute": lambda: _f((3, 4, 5), 41).permute(2, 0, 1).pad(((0, 1), (2, 0), (1, 1))).flip(1).contiguous(),
  "cat_repeat_slice": lambda: Tensor.cat(_f((2, 3), 42), _f((4, 3), 43)).repeat(2, 2)[1::2, ::3].contiguous(),
  "tril_where": lambda: (_f((7, 7), 44).tril() > 0).where(_f((7, 7), 45), -1.0),
  "cast_f32_to_int": lambda: (_f((20,), 46) * 10).cast(dtypes.int32),
  "cast_int_to_half": lambda: _ints((20,), 47, dtypes.int32, -3000, 3000).cast(dtypes.float16),
  "cast_to_bool_and_back": lambda: _f((16,), 48).relu().cast(dtypes.bool).cast(dtypes.float32),
  "cast_f32_bf16_fp8": lambda: _f((32,), 49).cast(dtypes.bfloat16).cast(dtypes.fp8e4m3).cast(dtypes.float32),
  "bitcast_f32_i32": lambda: _f((10,), 50).bitcast(dtypes.int32) + 1,
  "bitcast_half_i16": lambda: _f((10,), 51, dtypes.float16).bitcast(dtypes.int16),
  "int8_wraps": lambda: _ints((16,), 52, dtypes.int8, -128, 127) * 3 + 100,
  "int_divmod_shift": lambda: (_ints((24,), 53, dtypes.int32, 0, 1000) // 7) +
                              (_ints((24,), 54, dtypes.int32, 0, 1000) % 9) +
                              (_ints((24,), 55, dtypes.int32, 0, 1 << 20) >> 3) +
                              (_ints((24,), 56, dtypes.int32, 0, 99) << 2),
  "bitwise_uint8": lambda: (_ints((16,), 57, dtypes.uint8, 0, 255) ^ _ints((16,), 58, dtypes.uint8, 0, 255)) &
                           _ints((16,), 59, dtypes.uint8, 0, 255) | 3,
  "int64_sum": lambda: _ints((4, 9), 60, dtypes.int64, -(1 << 40), 1 << 40).sum(0),
  "compare_eq_ne": lambda: (_ints((12,), 61, dtypes.int32, 0, 4) == _ints((12,), 62, dtypes.int32, 0, 4)) |
                           (_f((12,), 63) != _f((12,), 63)),
}

# reductions long enough to be shared by a threadgroup: threadgroup memory, barriers and simd_shuffle_xor
EXTRA.update({f"group_{name}": build for name, build in GROUP_CASES.items()})
# float32 matmuls on simdgroup_float8x8 (ember.codegen.tensorcore), checked against PYTHON like every case here
# the float32-output ones: a half output the PYTHON device accumulates in half (the float32 accumulators of the
# simdgroup matmul differ by that rounding); test_simdgroup_matmuls_match_numpy_and_python checks every case
EXTRA.update({f"tc_{name}": (lambda name=name: TC_CASES[name][1]()[0]) for name in cases_for(RENDERER)
              if TC_CASES[name][1]()[0].dtype is dtypes.float32})

def _kit_case(builder: Callable[[str, DType], Tensor], dt: DType) -> Callable[[], Tensor]:
  return lambda: builder(REF, dt)

def _kit_cases() -> dict[str, Callable[[], Tensor]]:
  return {f"kit_{name}_{dt.name}": _kit_case(builder, dt)
          for name, builder in KERNEL_CORPUS.items() for dt in KIT_DTYPES}

def _var_kernel() -> tuple[UOp, int]:
  """out[i] = n * sum(in[i*8 + j] for j < n), an AST with a DEFINE_VAR as the reduce bound and as a value."""
  n = UOp.variable("n", 1, 8)
  out, inp = UOp(Ops.PARAM, dtypes.float32.ptr(6), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(48), arg=1)
  i, j = UOp.range(6, 0, AxisType.GLOBAL), UOp.range(n, 1, AxisType.REDUCE)
  total = UOp(Ops.REDUCE, dtypes.float32, (inp.index(i * 8 + j).load(), j), Ops.ADD)
  return UOp(Ops.SINK, dtypes.void, (out.index(i).store(total * n.cast(dtypes.float32)),)), 5

def _fp8_matmul(inputs: list[np.ndarray]) -> dict[int, np.ndarray]:
  a = round_to_format(inputs[1].reshape(4, 5), dtypes.fp8e4m3).astype(np.float64)
  b = round_to_format(inputs[2].reshape(5, 3), dtypes.fp8e4m3).astype(np.float64)
  return {0: to_storage(round_to_format(a @ b, dtypes.fp8e4m3), dtypes.fp8e4m3).reshape(-1)}

# A matmul in an emulated format accumulates in float32 here (docs/linear-program.md: no native type, computed in
# float32), while PYTHON rounds the accumulator to fp8 after every step; with fp8's 3 mantissa bits that differs by far
# more than an ulp where terms cancel. These kernels are checked against numpy following the documented semantics:
# inputs rounded to fp8, the sum exact, the result rounded to fp8 once.
def _f16_matmul(inputs: list[np.ndarray]) -> dict[int, np.ndarray]:
  """A half matmul on half simdgroup matrices: exact products summed in float32, rounded to half once."""
  a, b = inputs[1].reshape(8, 16).astype(np.float64), inputs[2].reshape(16, 8).astype(np.float64)
  return {0: (a @ b).astype(np.float16).reshape(-1)}

Oracle = Callable[[list[np.ndarray]], dict[int, np.ndarray]]
FLOAT32_ACCUMULATION: dict[str, Oracle] = {"kit_matmul_fp8e4m3": _fp8_matmul, "matmul_f16": _f16_matmul}

@dataclass
class Kernel:
  """One kernel of a case: its MSL program, its buffers before the reference ran it, and the reference's outputs."""
  case: str
  spec: ProgramSpec
  inputs: list[np.ndarray]
  expected: dict[int, np.ndarray]
  vals: tuple[int, ...] = ()

def _schedule_kernels(case: str, t: Tensor) -> Iterator[Kernel]:
  for item in t.schedule():
    if item.kind != "kernel":
      run_schedule([item])
      continue
    assert item.ast is not None
    spec = get_program(item.ast, RENDERER)
    inputs = [b.ensure_allocated().numpy().copy() for b in item.bufs]
    run_schedule([item])
    yield Kernel(case, spec, inputs, {slot: item.bufs[slot].numpy() for slot in spec.outs})

def _var_case() -> Kernel:
  ast, value = _var_kernel()
  ref = Device[REF]
  ref_spec = get_program(ast, ref.renderer, REF)
  assert ref.compiler is not None
  prg = ref.runtime(ref_spec.name, ref.compiler.compile(ref_spec.src))
  x = sample((48,), dtypes.float32, 64).astype(np.float32)
  bufs = [ref.allocator.alloc(24), ref.allocator.alloc(x.nbytes)]
  ref.allocator._copyin(bufs[1], x.data.cast("B"))
  prg(*bufs, global_size=tuple(ref_spec.global_size or (1, 1, 1)), vals=(value,))
  out = np.empty(6, np.float32)
  ref.allocator._copyout(out.data.cast("B"), bufs[0])
  return Kernel("define_var", get_program(ast, RENDERER), [np.zeros(6, np.float32), x], {0: out}, (value,))

@pytest.fixture(scope="module")
def corpus() -> tuple[list[Kernel], msl_shim.ShimLibrary]:
  kernels = [k for name, build in {**_kit_cases(), **EXTRA}.items() for k in _schedule_kernels(name, build())]
  kernels.append(_var_case())
  with tempfile.TemporaryDirectory(prefix="ember_msl_") as tmp:
    return kernels, msl_shim.build([k.spec for k in kernels], RENDERER, tmp)

def _values(bits: np.ndarray, dt: DType) -> np.ndarray:
  return from_storage(bits, dt).astype(np.float64) if dtypes.is_float(dt) else bits

def _check(kernel: Kernel, index: int, lib: msl_shim.ShimLibrary) -> None:
  bufs = [a.copy() for a in kernel.inputs]
  oracle = FLOAT32_ACCUMULATION.get(kernel.case)
  expected = oracle(kernel.inputs) if oracle is not None else kernel.expected
  lib.run(index, bufs, kernel.vals)
  params = msl_shim.buffer_dtypes(kernel.spec)
  # intermediates of a narrow float may stay in float32 here (docs/linear-program.md): results agree to the coarsest
  # float format the kernel computes in, like the kit's `assert_matches(computed_in=...)`
  floats = {u.dtype for u in kernel.spec.uops if isinstance(u.dtype, DType) and not isinstance(u.dtype, PtrDType)
            and dtypes.is_float(u.dtype)}
  coarsest = max((tolerance(dt) for dt in floats), default=(0.0, 0.0))
  for slot, want in expected.items():
    dt, context = params[slot].base, f"{kernel.case}: kernel {kernel.spec.name}, buffer {slot}\n{kernel.spec.src}"
    if not dtypes.is_float(dt):
      np.testing.assert_array_equal(bufs[slot], want, err_msg=context)
      continue
    rtol, atol = max(tolerance(dt), coarsest)
    np.testing.assert_allclose(_values(bufs[slot], dt), _values(want, dt), rtol=rtol, atol=atol, equal_nan=True,
                               err_msg=context)

@pytest.mark.parametrize("case", [*_kit_cases(), *EXTRA, "define_var"])
def test_kernel_matches_python_device(corpus: tuple[list[Kernel], msl_shim.ShimLibrary], case: str) -> None:
  kernels, lib = corpus
  mine = [(i, k) for i, k in enumerate(kernels) if k.case == case]
  assert mine, f"{case} scheduled no kernel"
  for index, kernel in mine: _check(kernel, index, lib)

def test_corpus_uses_the_gpu_features(corpus: tuple[list[Kernel], msl_shim.ShimLibrary]) -> None:
  """The corpus really reaches what it claims to: several threadgroups with a clamped tail, every transcendental,
  a variable, half and emulated formats, group reductions (threadgroup memory, barriers, SIMD shuffles)."""
  specs = [k.spec for k in corpus[0]]
  assert any((s.global_size or [1])[0] > 1 for s in specs)
  tail = [s for s in specs if s.name.startswith("E_10_100")]
  assert tail and all((s.global_size or [1])[0] * (s.local_size or [1])[0] > 1000 for s in tail)
  src = "\n".join(s.src for s in specs)
  for needle in ("metal::exp2(", "metal::log2(", "metal::precise::sin(", "metal::sqrt(", "metal::trunc(",
                 "metal::isnan(", "as_type<", "device const half*", "device ushort*", "constant int& n [[buffer(2)]]",
                 "(int)gid.x", "(int)lid.x", "threadgroup float temp", "threadgroup long temp",
                 "threadgroup_barrier(mem_flags::mem_threadgroup);", "simd_shuffle_xor(",
                 "simdgroup_multiply_accumulate(", "simdgroup_load(", "simdgroup_store("):
    assert needle in src, needle

@pytest.mark.parametrize("name", cases_for(RENDERER))
def test_simdgroup_matmuls_match_numpy_and_python(name: str) -> None:
  """The float32 simdgroup matmul cases against their float64 numpy oracle too (and that the opt applies)."""
  def run(t: Tensor) -> np.ndarray:
    kernels = list(_schedule_kernels(name, t))
    with tempfile.TemporaryDirectory(prefix="ember_msl_") as tmp:
      lib = msl_shim.build([k.spec for k in kernels], RENDERER, tmp)
      for i, k in enumerate(kernels):
        bufs = [a.copy() for a in k.inputs]
        lib.run(i, bufs, k.vals)
    return bufs[0].reshape(tuple(int(s) for s in t.shape))
  check_tensor_core_case(name, RENDERER, run)
