"""Elementwise math and activations of ember.Tensor against torch (values, output dtype and gradients)."""
from __future__ import annotations
import math
from typing import Any, Callable
import numpy as np
import pytest
from ember import Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torch_oracle import check  # noqa: E402

rng = np.random.default_rng(0)
X = rng.uniform(-3, 3, (3, 5)).astype(np.float32)
Y = rng.uniform(0.5, 2.5, (3, 5)).astype(np.float32) * np.sign(rng.standard_normal((3, 5))).astype(np.float32)
UNIT = rng.uniform(-0.95, 0.95, (3, 5)).astype(np.float32)
POS = rng.uniform(1.05, 4, (3, 5)).astype(np.float32)
INTS = rng.integers(-9, 9, (3, 5)).astype(np.int32)

UNARY = [
  ("log10", lambda t: t.abs().log10() if isinstance(t, Tensor) else t.abs().log10(), X),
  ("tan", None, UNIT), ("asin", None, UNIT), ("acos", None, UNIT), ("atan", None, X * 3), ("sinh", None, X),
  ("cosh", None, X), ("asinh", None, X * 4), ("acosh", None, POS), ("atanh", None, UNIT), ("erf", None, X),
  ("sign", None, X), ("relu6", lambda t: t.relu6() if isinstance(t, Tensor) else F.relu6(t), X * 3),
  ("leaky_relu", lambda t: t.leaky_relu(0.2) if isinstance(t, Tensor) else F.leaky_relu(t, 0.2), X),
  ("elu", lambda t: t.elu(0.7) if isinstance(t, Tensor) else F.elu(t, 0.7), X),
  ("celu", lambda t: t.celu(1.5) if isinstance(t, Tensor) else F.celu(t, 1.5), X),
  ("selu", lambda t: t.selu() if isinstance(t, Tensor) else F.selu(t), X),
  ("silu", lambda t: t.silu() if isinstance(t, Tensor) else F.silu(t), X),
  ("gelu", lambda t: t.gelu() if isinstance(t, Tensor) else F.gelu(t), X),
  ("gelu_tanh", lambda t: t.gelu("tanh") if isinstance(t, Tensor) else F.gelu(t, approximate="tanh"), X),
  ("quick_gelu", lambda t: t.quick_gelu() if isinstance(t, Tensor) else t * torch.sigmoid(1.702 * t), X),
  ("hardswish", lambda t: t.hardswish() if isinstance(t, Tensor) else F.hardswish(t), X * 2),
  ("hardsigmoid", lambda t: t.hardsigmoid() if isinstance(t, Tensor) else F.hardsigmoid(t), X * 2),
  ("hardtanh", lambda t: t.hardtanh(-0.5, 1.5) if isinstance(t, Tensor) else F.hardtanh(t, -0.5, 1.5), X),
  ("mish", lambda t: t.mish() if isinstance(t, Tensor) else F.mish(t), X),
  ("softsign", lambda t: t.softsign() if isinstance(t, Tensor) else F.softsign(t), X),
  ("softplus", lambda t: t.softplus(2.0, 3.0) if isinstance(t, Tensor) else F.softplus(t, 2.0, 3.0), X),
  ("logsigmoid", lambda t: t.logsigmoid() if isinstance(t, Tensor) else F.logsigmoid(t), X * 10),
  ("round", lambda t: (t * 2).round() if isinstance(t, Tensor) else (t * 2).round(), np.round(X * 2) / 2),
  ("round_decimals", lambda t: t.round(1) if isinstance(t, Tensor) else t.round(decimals=1), X),
  ("log1p", None, UNIT), ("expm1", None, X), ("tanh", None, X),
  ("mish", lambda t: t.mish() if isinstance(t, Tensor) else F.mish(t), X * 4),
]

@pytest.mark.parametrize("name,fn,data", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name: str, fn: Callable[[Any], Any] | None, data: np.ndarray) -> None:
  f = fn if fn is not None else (lambda t: getattr(t, name)())
  check(f, f, data, atol=2e-5, rtol=2e-5, grad_tol=5e-4)

def test_unary_special_values() -> None:
  specials = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-4, -1e-4, 40.0, -40.0], dtype=np.float32)
  for name in ("atan", "sign", "erf", "sinh", "asinh", "isnan", "isfinite", "round", "softplus", "logsigmoid", "tanh"):
    ref = getattr(F, name) if name in ("softplus", "logsigmoid") else getattr(torch.Tensor, name)
    np.testing.assert_allclose(getattr(Tensor(specials), name)().numpy(), ref(torch.tensor(specials)).numpy(),
                               rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=name)
  np.testing.assert_array_equal(np.signbit(Tensor(specials).round().numpy()), np.signbit(np.round(specials)))
  for pos, neg in ((True, True), (True, False), (False, True)):
    ours = Tensor(specials).isinf(detect_positive=pos, detect_negative=neg).numpy()
    want = (np.isposinf(specials) & pos) | (np.isneginf(specials) & neg)
    np.testing.assert_array_equal(ours, want)

# relative accuracy where a function is tiny or its argument is, against torch in float64 (the exact values of the
# float32 inputs): what a naive float32 formula loses (tanh(1e-8) was 0 as 2 * sigmoid(2e-8) - 1, softplus(-30) 0 as
# log(1 + 9e-14), logsigmoid(10) off by 4e-4)
TAILS = np.array([-100, -30, -20, -12, -10, -3, -1, -0.6, -0.5, -0.3, -1e-3, -1e-8, 0, 1e-10, 1e-6, 2e-4, 0.1, 0.49,
                  0.5, 1, 3, 10, 20], dtype=np.float32)

@pytest.mark.parametrize("name", ["log1p", "expm1", "tanh", "asinh", "atanh", "softplus", "logsigmoid", "mish",
                                  "logaddexp"])
def test_relative_accuracy_in_the_tails(name: str) -> None:
  x = TAILS
  if name == "log1p": x = np.concatenate([x[x > -1], [-1.0, np.inf]]).astype(np.float32)
  if name == "atanh": x = np.concatenate([x[np.abs(x) < 1], [-0.999, 0.9999, 1.0, -1.0]]).astype(np.float32)
  if name == "expm1": x = x[np.abs(x) <= 12]  # beyond, exp's own rounding (x * log2(e)) is the error
  t = torch.tensor(x, dtype=torch.float64, requires_grad=True)  # the exact values of float32 inputs
  ref_fn = {"softplus": F.softplus, "logsigmoid": F.logsigmoid, "mish": F.mish,
            "logaddexp": lambda v: torch.logaddexp(v, torch.zeros_like(v))}.get(name, getattr(torch, name, None))
  want = ref_fn(t)
  want.sum().backward()
  e = Tensor(x, requires_grad=True)
  got = e.logaddexp(0.0) if name == "logaddexp" else getattr(e, name)()
  got.sum().backward()
  tiny = np.abs(want.detach().numpy()) < 1e-37  # subnormal in float32: relative error means nothing there
  np.testing.assert_allclose(np.where(tiny, 0, got.numpy()), np.where(tiny, 0, want.detach().numpy()), rtol=2e-6,
                             atol=0, err_msg=name)
  # atol: float64 torch rounds 1 - tanh(30)^2 to 0 (the gradient is 3.5e-26)
  np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=2e-5, atol=1e-15, err_msg=f"{name} gradient")

def test_round_half_to_even() -> None:
  halves = np.arange(-6.5, 7, 1.0, dtype=np.float32)
  np.testing.assert_array_equal(Tensor(halves).round().numpy(), np.round(halves))
  assert Tensor([3, -2]).round().dtype == dtypes.int32

BINARY = [
  ("fmod", lambda a, b: a.fmod(b) if isinstance(a, Tensor) else torch.fmod(a, b)),
  ("copysign", lambda a, b: a.copysign(b) if isinstance(a, Tensor) else torch.copysign(a, b)),
  ("logaddexp", lambda a, b: a.logaddexp(b) if isinstance(a, Tensor) else torch.logaddexp(a, b)),
  ("lerp", lambda a, b: a.lerp(b, 0.3) if isinstance(a, Tensor) else torch.lerp(a, b, 0.3)),
  ("lerp_hi", lambda a, b: a.lerp(b, 0.8) if isinstance(a, Tensor) else torch.lerp(a, b, 0.8)),
  ("clip_tensor", lambda a, b: a.clip(b, b + 1) if isinstance(a, Tensor) else torch.clamp(a, b, b + 1)),
]

@pytest.mark.parametrize("name,fn", BINARY, ids=[b[0] for b in BINARY])
def test_binary(name: str, fn: Callable[[Any, Any], Any]) -> None:
  check(fn, fn, X, Y)

def test_binary_broadcast_and_ints() -> None:
  check(lambda a, b: a.fmod(b), torch.fmod, X, Y[:1])
  check(lambda a, b: a.fmod(b), torch.fmod, INTS, np.where(INTS == 0, 3, INTS)[::-1].copy())
  check(lambda a: a.clip(-1, 2), lambda a: torch.clamp(a, -1, 2), X)
  check(lambda a: a.clamp(min_=0), lambda a: torch.clamp(a, min=0), INTS)
  check(lambda a: a.sign(), torch.sign, INTS)
  neg_zero = np.array([-0.0, 0.0, -1.0], dtype=np.float32)
  signs = np.signbit(Tensor([2.0, 2.0, 2.0]).copysign(Tensor(neg_zero)).numpy())
  np.testing.assert_array_equal(signs, [True, False, True])
  np.testing.assert_array_equal(Tensor(np.array([2], np.uint8)).copysign(Tensor(np.array([1], np.uint32))).numpy(), [2])

def test_clip_with_infinite_bounds_keeps_values() -> None:
  # the NaN check summed x and both bounds: -inf + inf made every value NaN
  x = np.array([0.5, -3.0, np.inf, -np.inf, np.nan, 1e30], dtype=np.float32)
  for lo, hi in ((-np.inf, np.inf), (-np.inf, 2.0), (0.0, np.inf)):
    np.testing.assert_array_equal(Tensor(x).clip(lo, hi).numpy(), torch.clamp(torch.tensor(x), lo, hi).numpy())
  check(lambda a: a.clip(-np.inf, np.inf), lambda a: torch.clamp(a, -np.inf, np.inf), X)  # values and gradient

def test_logaddexp_infinities() -> None:
  a = np.array([-np.inf, np.inf, -np.inf, 1000.0, 0.0], dtype=np.float32)
  b = np.array([-np.inf, np.inf, 2.0, 1000.0, -1000.0], dtype=np.float32)
  np.testing.assert_allclose(Tensor(a).logaddexp(Tensor(b)).numpy(), np.logaddexp(a, b), rtol=1e-6)

def test_isclose() -> None:
  a = np.array([1.0, 1.0, np.nan, np.inf, -np.inf, 1e-9, 100.0], dtype=np.float32)
  b = np.array([1.0 + 1e-6, 1.1, np.nan, np.inf, np.inf, 0.0, 100.001], dtype=np.float32)
  for rtol, atol, equal_nan in ((1e-5, 1e-8, False), (1e-3, 0.0, True), (0.0, 0.2, False)):
    ours = Tensor(a).isclose(Tensor(b), rtol=rtol, atol=atol, equal_nan=equal_nan).numpy()
    want = torch.isclose(torch.tensor(a), torch.tensor(b), rtol=rtol, atol=atol, equal_nan=equal_nan).numpy()
    np.testing.assert_array_equal(ours, want)
  assert Tensor([1, 2]).isclose(Tensor([1, 3])).tolist() == [True, False]

def test_logical_and_bitwise() -> None:
  a, b = np.array([0, 1, 2, 0], np.int32), np.array([0, 0, 3, 5], np.int32)
  for name in ("logical_and", "logical_or", "logical_xor"):
    np.testing.assert_array_equal(getattr(Tensor(a), name)(Tensor(b)).numpy(), getattr(np, name)(a, b), err_msg=name)
  np.testing.assert_array_equal(Tensor(a).bitwise_not().numpy(), np.invert(a))
  np.testing.assert_array_equal(Tensor(np.array([True, False])).bitwise_not().numpy(), [False, True])

@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_family(axis: int) -> None:
  check(lambda t: t.softmax(axis), lambda t: torch.softmax(t, axis), X * 3)
  check(lambda t: t.log_softmax(dim=axis), lambda t: torch.log_softmax(t, axis), X * 3)
  check(lambda t: t.softmin(axis), lambda t: F.softmin(t, axis), X)
  check(lambda t: t.normalize(dim=axis), lambda t: F.normalize(t, dim=axis), X)
  check(lambda t: t.normalize(p=3.0, dim=axis), lambda t: F.normalize(t, p=3.0, dim=axis), X)

def test_softmax_is_stable_and_kernel_count() -> None:
  big = np.array([[1000.0, 1001.0, -1000.0]], dtype=np.float32)
  np.testing.assert_allclose(Tensor(big).softmax().numpy(), torch.softmax(torch.tensor(big), -1).numpy(), rtol=1e-6)
  assert len(Tensor(X).softmax().schedule()) <= 3

def test_relu_family_gradient_dtype_half() -> None:
  t = Tensor(X.astype(np.float16), requires_grad=True)
  t.gelu().sum().backward()
  assert t.grad is not None and t.grad.dtype == dtypes.float16
  assert math.isclose(Tensor([2.0], dtype=dtypes.float16).silu().item(), 2 / (1 + math.exp(-2)), rel_tol=2e-3)

INPLACE: list[tuple[str, tuple[Any, ...]]] = [
  ("add_", (1.5,)), ("sub_", (0.5,)), ("mul_", (2.0,)), ("div_", (4.0,)), ("pow_", (2.0,)), ("neg_", ()), ("abs_", ()),
  ("exp_", ()), ("log_", ()), ("sqrt_", ()), ("floor_", ()), ("ceil_", ()), ("round_", ()), ("relu_", ()),
  ("sigmoid_", ()), ("tanh_", ()), ("clamp_", (0.2, 0.9)), ("clip_", (0.2, 0.9)),
]

@pytest.mark.parametrize("name,args", INPLACE, ids=[n for n, _ in INPLACE])
def test_torch_inplace_methods_write_into_the_tensor(name: str, args: tuple[Any, ...]) -> None:
  # torch's x.op_(...) writes the result into x's memory and returns x (they raised AttributeError)
  x = np.abs(np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)) + 0.1
  ours, theirs = Tensor(x.copy()).realize(), torch.tensor(x.copy())
  assert getattr(ours, name)(*args) is ours
  getattr(theirs, name)(*args)
  np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-7)

def test_inplace_alpha_copy_and_masked_fill_and_jit() -> None:
  from ember import TinyJit
  x = np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32)
  ours, theirs = Tensor(x.copy()).realize(), torch.tensor(x.copy())
  ours.add_(Tensor(x), alpha=-0.25).masked_fill_(ours > 0.5, 0.5)
  theirs.add_(torch.tensor(x), alpha=-0.25).masked_fill_(theirs > 0.5, 0.5)
  np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)
  ours.copy_(Tensor(x[0]))  # broadcast over the rows, as torch's copy_
  np.testing.assert_array_equal(ours.numpy(), theirs.copy_(torch.tensor(x[0])).numpy())
  p = Tensor(x.copy()).realize()
  step = TinyJit(lambda: p.sub_(p * 0.1).realize())
  for _ in range(4): step()
  np.testing.assert_allclose(p.numpy(), x * 0.9 ** 4, rtol=1e-5)  # each replay updated the same buffer

def test_torch_keyword_spellings() -> None:
  x = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
  e, t = Tensor(x), torch.tensor(x)
  pairs = [(e.flip(dims=[0, 2]), t.flip(dims=[0, 2])), (e.permute(dims=(2, 0, 1)), t.permute(dims=(2, 0, 1))),
           (e.add(e, alpha=2.0), t.add(t, alpha=2.0)), (e.sub(1.0, alpha=3), t.sub(1.0, alpha=3)), (e.mT, t.mT),
           (e.new_full((2,), 3.0), t.new_full((2,), 3.0)), (e.new_zeros(2, 3), t.new_zeros(2, 3)),
           (e.new_ones((1, 2)), t.new_ones((1, 2))), (e.new_tensor([1.0, 2.0]), t.new_tensor([1.0, 2.0]))]
  for ours, theirs in pairs:
    assert ours.shape == tuple(theirs.shape)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)
  assert e.dim() == t.dim() and e.to(dtypes.float16).dtype is dtypes.float16
  assert e.to("CPU", "half").dtype is dtypes.float16 and e.to("CPU").dtype is dtypes.float32
