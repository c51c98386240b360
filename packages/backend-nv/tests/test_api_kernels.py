"""The CUDA C of the kernels the Tensor API produces (elementwise math and activations, reductions, softmax, matmul,
convolution, pooling, gather/scatter, cumulative ops, sort/topk, losses and a backward pass), built for the host
through the shim, matches the PYTHON reference device. Every kernel is rendered first and all of them are built by one
C++ compiler call (`shim_bundle`), which the disk cache keeps."""
from __future__ import annotations
from typing import Any, Callable
import numpy as np
import pytest
from ember.codegen import get_program
from ember.dtype import dtypes
from ember.tensor import Tensor
from ember.testing import tolerance
from nv_kernels import run_schedule_on_shim
from ember.plugin import HostKernel, load_shim
from ember_nv.compiler import NVShimBundleCompiler, bundle_symbol, shim_bundle
from ember_nv.renderer import CUDARenderer

rng = np.random.default_rng(0)
def rand(*shape: int) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)
X, Y = rand(4, 6), rand(4, 6)
POS = np.abs(rand(4, 6)) + 0.1
INTS = rng.integers(-9, 9, (4, 6)).astype(np.int32)
IDX = rng.integers(0, 6, (4, 3)).astype(np.int32)
TARGET = rng.integers(0, 6, (4,)).astype(np.int32)

def T(a: np.ndarray) -> Tensor: return Tensor(a, device="PYTHON")

def _conv_cross_entropy_grad() -> Tensor:
  x = T(rand(2, 3, 6, 6))
  w = T(rand(4, 3, 3, 3)).requires_grad_()
  x.conv2d(w, padding=1).relu().mean((2, 3)).cross_entropy(T(TARGET[:2] % 4)).backward()  # 4 classes: targets 0-3
  assert w.grad is not None
  return w.grad

CASES: dict[str, Callable[[], Tensor]] = {
  "exp_log_sqrt": lambda: T(X).exp() + T(POS).log() * T(POS).sqrt(),
  "trig": lambda: T(X).sin() + T(X).cos() + (T(X) * 0.3).tan() + T(X).atan(),
  "tanh_sigmoid_erf": lambda: T(X).tanh() + T(X).sigmoid() + T(X).erf(),
  "activations": lambda: (T(X).gelu() + T(X).silu() + T(X).elu(0.7) + T(X).leaky_relu(0.2) + T(X).hardswish()
                          + T(X).softplus() + T(X).mish()),
  "round_sign_abs": lambda: (T(X) * 3).round() + T(X).sign() + T(X).abs() + T(X).floor() + T(X).ceil(),
  "pow_div_where": lambda: (T(POS) ** T(X)) / T(Y) + (T(X) > 0).where(T(X), T(X) * 0.1),
  "int_math": lambda: (T(INTS) // 3 + T(INTS) % 4) * 2 - T(INTS).maximum(T(INTS[::-1].copy())),
  "int_bitwise": lambda: (T(INTS) & 5) | (T(INTS) ^ 3),
  "half_math": lambda: (T(X).cast(dtypes.float16) * T(Y).cast(dtypes.float16)).exp().sum(1),
  "bfloat16_softmax": lambda: T(X).cast(dtypes.bfloat16).softmax(1),
  "sum_max_mean_min": lambda: T(X).sum(1) + T(X).max(1) + T(X).mean(1) + T(X).min(1),
  "var_std": lambda: T(X).var(0) + T(X).std(0),
  "prod_logsumexp": lambda: T(X).prod(1) + T(X).logsumexp(1),
  "argmax_argmin": lambda: T(X).argmax(1) * 10 + T(X).argmin(0).sum(),
  "any_all": lambda: (T(X) > 0).any(1) & (T(X) > -5).all(1),
  "softmax": lambda: T(X).softmax(1),
  "log_softmax": lambda: T(X).log_softmax(0),
  "matmul": lambda: T(rand(5, 7)) @ T(rand(7, 3)),
  "batched_matmul": lambda: T(rand(2, 3, 4)) @ T(rand(2, 4, 5)),
  "conv2d": lambda: T(rand(2, 3, 7, 6)).conv2d(T(rand(4, 3, 3, 3)), T(rand(4)), stride=2, padding=1),
  "conv2d_groups_dilation": lambda: T(rand(1, 4, 6, 5)).conv2d(T(rand(6, 2, 3, 2)), groups=2, dilation=(1, 2),
                                                                padding=(1, 0)),
  "max_pool2d": lambda: T(rand(2, 2, 6, 6)).max_pool2d(kernel_size=2),
  "avg_pool2d": lambda: T(rand(2, 2, 7, 7)).avg_pool2d(kernel_size=3, stride=2, padding=1),
  "gather": lambda: T(X).gather(1, T(IDX)),
  "scatter": lambda: T(np.zeros((4, 6), np.float32)).scatter(1, T(IDX), T(rand(4, 3))),
  "one_hot_masked_fill": lambda: T(TARGET).one_hot(6).float() + T(X).masked_fill(T(X > 0.5), -1.0),
  "cumsum": lambda: T(X).cumsum(1),
  "cumsum_int": lambda: T(INTS).cumsum(0),
  "cummax": lambda: T(X).cummax(1)[0],
  "sort_values": lambda: T(X).sort(1)[0],
  "sort_indices_descending": lambda: T(X).sort(0, descending=True)[1],
  "topk": lambda: T(X).topk(3, 1)[0],
  "cross_entropy": lambda: T(X).cross_entropy(T(TARGET)),
  "nll_loss": lambda: T(X).log_softmax(1).nll_loss(T(TARGET)),
  "bce_logits": lambda: T(X).binary_crossentropy_logits(T((Y > 0).astype(np.float32))),
  "conv_cross_entropy_grad": _conv_cross_entropy_grad,
}

class Built:
  """Every case's tensor and schedule, and the host build of every distinct kernel source (one bundle)."""
  def __init__(self) -> None:
    renderer = CUDARenderer()
    self.cases: dict[str, tuple[Tensor, list[Any]]] = {}
    sources: dict[str, int] = {}
    for name, build in CASES.items():
      t = build()
      items = t.schedule()
      self.cases[name] = (t, items)
      for it in items:
        if it.kind == "kernel": sources.setdefault(get_program(it.ast, renderer).src, len(sources))
    self.sources = list(sources)
    lib = load_shim(NVShimBundleCompiler().compile_cached(shim_bundle(self.sources)))
    self.kernels = {src: HostKernel(lib, bundle_symbol(i)) for src, i in sources.items()}
    self.ran: set[str] = set()
  def kernel(self, spec: Any) -> HostKernel:
    self.ran.add(spec.src)
    return self.kernels[spec.src]

@pytest.fixture(scope="module")
def built() -> Built: return Built()

@pytest.mark.parametrize("name", list(CASES))
def test_api_kernels_run_like_python(built: Built, name: str) -> None:
  t, items = built.cases[name]
  got = run_schedule_on_shim(items, t.dtype, tuple(t.shape), built.kernel)  # before PYTHON realises the buffers
  want = t.numpy()
  if dtypes.is_float(t.dtype):  # float32 math through libm vs the reference's: a few ulps, more for emulated dtypes
    rtol, atol = max((1e-5, 1e-5), tolerance(t.dtype))
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
  else: np.testing.assert_array_equal(got, want)

def test_the_slice_is_broad_and_every_kernel_ran(built: Built) -> None:
  # runs after the cases (pytest keeps file order): each distinct kernel source was executed at least once
  assert len(built.sources) >= 50, f"only {len(built.sources)} distinct kernels in the API slice"
  assert built.ran == set(built.sources), f"{len(set(built.sources) - built.ran)} kernels were built but never run"
