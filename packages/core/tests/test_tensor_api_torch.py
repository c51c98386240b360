"""The torch.Tensor methods of ember/tensor_ops/torch_compat.py against torch 2.13 (values, dtypes, shapes, gradients,
NaN/inf, empty tensors, negative dims, and the errors bad arguments raise). Indices and counts are int32 in ember
(torch: int64): those cases compare with dtype=np.int32."""
from __future__ import annotations
import math
from typing import Any, Callable
import numpy as np
import pytest
import ember
from ember import Tensor, TinyJit, dtypes
from ember.errors import EmberError, ShapeError

torch = pytest.importorskip("torch")

from torch_oracle import check, check_raises_like_torch  # noqa: E402

rng = np.random.default_rng(0)
X = rng.standard_normal((3, 4)).astype(np.float32)
Y = rng.standard_normal((3, 4)).astype(np.float32)
X3 = rng.standard_normal((2, 3, 4)).astype(np.float32)
INTS = rng.integers(-6, 7, (3, 5)).astype(np.int32)
NAN, INF = math.nan, math.inf
SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, INF, -INF, NAN, 1e-30, -2.5, 3e38], np.float32)
I32 = np.int32

def T(a: Any) -> Any:
  return torch.tensor(a)

# the listed torch.Tensor names ported code calls (trapezoid, trapz, searchsorted and bucketize are torch functions)
NAMES = """absolute addcdiv addcmul addmm amax amin aminmax arccos arcsin arctan arccosh arcsinh arctanh argwhere atan2
arctan2 baddbmm bincount bmm broadcast_to bucketize clamp_max clamp_min count_nonzero cov cross deg2rad rad2deg
diag_embed diff dist divide dsplit hsplit vsplit equal erfc expand_as fill_ zero_ fix fliplr flipud float_power
floor_divide fmax fmin frac frexp ldexp gcd lcm ger outer inner vdot greater greater_equal less less_equal not_equal
hardshrink heaviside histc hypot index_add index_copy index_fill isneginf isposinf isreal kron kthvalue logaddexp2 logit
masked_scatter matrix_power median nanmedian mode mm mv moveaxis movedim msort multiply subtract true_divide negative
positive nan_to_num nanmean nansum narrow norm quantile nanquantile ravel remainder reshape_as view_as type_as rot90
scatter_add searchsorted select sgn signbit sinc swapaxes swapdims t take take_along_dim tensor_split tile trace trapz
trapezoid unbind unique unique_consecutive xlogy logdet slogdet inverse det""".split()

def test_every_listed_name_exists_with_a_docstring() -> None:
  missing = [n for n in NAMES if not hasattr(Tensor, n)]
  assert not missing, missing
  assert all(getattr(Tensor, n).__doc__ for n in NAMES)

# ** elementwise: (ours, torch, arrays, check kwargs) **
def _grid(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  return a.reshape(-1, 1), a.reshape(1, -1)

ELEMENTWISE: dict[str, tuple[Callable[..., Any], Callable[..., Any], tuple[np.ndarray, ...], dict[str, Any]]] = {
  "atan2": (lambda a, b: a.atan2(b), lambda a, b: a.atan2(b), (X, Y), {}),
  "atan2-special": (lambda a, b: a.arctan2(b), lambda a, b: a.arctan2(b), _grid(SPECIAL), {"grad": False}),
  "atan2-int": (lambda a, b: a.atan2(b), lambda a, b: a.atan2(b), (INTS, INTS.T[:3, :1]), {}),
  "hypot": (lambda a, b: a.hypot(b), lambda a, b: a.hypot(b), (X, Y), {}),
  "hypot-special": (lambda a, b: a.hypot(b), lambda a, b: a.hypot(b), _grid(SPECIAL), {"grad": False}),
  "logaddexp2": (lambda a, b: a.logaddexp2(b), lambda a, b: a.logaddexp2(b), (X * 40, Y), {"tol": 2e-5}),
  "xlogy": (lambda a, b: a.xlogy(b.abs()), lambda a, b: a.xlogy(b.abs()), (X, Y), {}),
  "xlogy-special": (lambda a, b: a.xlogy(b), lambda a, b: a.xlogy(b), _grid(SPECIAL), {"grad": False}),
  "sinc": (lambda a: a.sinc(), lambda a: a.sinc(), (np.append(X.ravel(), [0.0, 2.0, -3.5]).astype(np.float32),), {}),
  "deg2rad-int": (lambda a: a.deg2rad(), lambda a: a.deg2rad(), (INTS,), {}),
  "rad2deg": (lambda a: a.rad2deg(), lambda a: a.rad2deg(), (X,), {"tol": 1e-4}),
  "float_power": (lambda a, b: a.float_power(b), lambda a, b: a.float_power(b), (np.abs(X) + 0.5, Y), {}),
  "float_power-int": (lambda a: a.float_power(2), lambda a: a.float_power(2), (INTS,), {}),
  "frac": (lambda a: a.frac(), lambda a: a.frac(), (X * 5,), {}),
  "fix": (lambda a: a.fix(), lambda a: a.fix(), (X * 5,), {}),
  "fmax": (lambda a, b: a.fmax(b), lambda a, b: a.fmax(b), _grid(SPECIAL), {"grad": False}),
  "fmin": (lambda a, b: a.fmin(b), lambda a, b: a.fmin(b), _grid(SPECIAL), {"grad": False}),
  "fmax-grad": (lambda a, b: a.fmax(b), lambda a, b: a.fmax(b), (X, np.where(Y > 0.5, NAN, Y).astype(np.float32)), {}),
  "fmin-int": (lambda a, b: a.fmin(b), lambda a, b: a.fmin(b), (INTS, INTS[::-1].copy()), {}),
  "heaviside": (lambda a, b: a.heaviside(b), lambda a, b: a.heaviside(b), (SPECIAL, np.float32([0.5])),
                {"grad": False}),
  "hardshrink": (lambda a: a.hardshrink(0.7), lambda a: a.hardshrink(0.7), (np.append(X.ravel(), NAN),), {}),
  "nan_to_num": (lambda a: a.nan_to_num(), lambda a: a.nan_to_num(), (SPECIAL,), {}),
  "nan_to_num-args": (lambda a: a.nan_to_num(1.5, posinf=9.0, neginf=-7.0),
                      lambda a: a.nan_to_num(1.5, posinf=9.0, neginf=-7.0), (SPECIAL,), {}),
  "nan_to_num-half": (lambda a: a.half().nan_to_num(), lambda a: a.half().nan_to_num(), (SPECIAL[:7],), {}),
  "signbit": (lambda a: a.signbit(), lambda a: a.signbit(), (SPECIAL,), {}),
  "isposinf": (lambda a: a.isposinf(), lambda a: a.isposinf(), (SPECIAL,), {}),
  "isneginf": (lambda a: a.isneginf(), lambda a: a.isneginf(), (SPECIAL,), {}),
  "isreal": (lambda a: a.isreal(), lambda a: a.isreal(), (SPECIAL,), {}),
  "ldexp": (lambda a, b: a.ldexp(b), lambda a, b: a.ldexp(b), (X, INTS[:, :4].copy()), {"grad": False}),
  # (torch's gradient through a negative int exponent is 0: it computes 2 ** other in ints)
  "ldexp-grad": (lambda a, b: a.ldexp(b), lambda a, b: a.ldexp(b), (X, np.abs(INTS[:, :4])), {}),
  "gcd": (lambda a, b: a.gcd(b), lambda a, b: a.gcd(b), (np.int32([0, 0, 12, -4, 6, 7, 2**30, -36]),
                                                        np.int32([0, 5, 18, 6, -9, 0, 2**29 + 2**28, 48])), {}),
  "gcd-int64-fib": (lambda a, b: a.gcd(b), lambda a, b: a.gcd(b),
                    (np.int64([7540113804746346429, 1 << 62]), np.int64([4660046610375530309, 3 << 40])), {}),
  "lcm": (lambda a, b: a.lcm(b), lambda a, b: a.lcm(b), (np.int32([0, 4, -4, 6, 21]), np.int32([0, 6, 6, 0, -14])), {}),
  "addcmul": (lambda a, b, c: a.addcmul(b, c, value=-0.5), lambda a, b, c: a.addcmul(b, c, value=-0.5), (X, Y, X), {}),
  "addcdiv": (lambda a, b, c: a.addcdiv(b, c, value=2), lambda a, b, c: a.addcdiv(b, c, value=2),
              (X, Y, np.abs(X) + 0.5), {"tol": 1e-4}),
  "logit": (lambda a: a.logit(), lambda a: a.logit(), (np.float32([0.0, 0.1, 0.5, 0.9, 1.0, 1.5, -0.5]),),
            {"grad": False}),
  "logit-grad": (lambda a: a.logit(), lambda a: a.logit(), (np.float32([0.1, 0.5, 0.93]),), {}),
  "logit-eps": (lambda a: a.logit(eps=0.2), lambda a: a.logit(eps=0.2), (np.float32([0.0, 0.1, 0.5, 0.9, 1.0]),), {}),
  "clamp_min-int": (lambda a: a.clamp_min(2.5), lambda a: a.clamp_min(2.5), (INTS,), {}),
  "clamp_max": (lambda a, b: a.clamp_max(b), lambda a, b: a.clamp_max(b), (X, Y[:1]), {}),
  "remainder": (lambda a: a.remainder(-2.5), lambda a: a.remainder(-2.5), (X * 4,), {}),
  "remainder-int": (lambda a: a.remainder(4), lambda a: a.remainder(4), (INTS,), {}),
  "floor_divide": (lambda a, b: a.floor_divide(b), lambda a, b: a.floor_divide(b), (INTS, np.int32([3, -2, 4, 5, -7])),
                   {}),
  "true_divide-int": (lambda a: a.true_divide(4), lambda a: a.true_divide(4), (INTS,), {}),
  "divide-trunc": (lambda a, b: a.divide(b, rounding_mode="trunc"), lambda a, b: a.divide(b, rounding_mode="trunc"),
                   (X * 5, Y), {}),
  "multiply": (lambda a, b: a.multiply(b), lambda a, b: a.multiply(b), (X, Y), {}),
  "subtract": (lambda a, b: a.subtract(b, alpha=3), lambda a, b: a.subtract(b, alpha=3), (X, Y), {}),
  "negative": (lambda a: a.negative(), lambda a: a.negative(), (INTS,), {}),
  "positive": (lambda a: a.positive(), lambda a: a.positive(), (X,), {}),
  "absolute": (lambda a: a.absolute(), lambda a: a.absolute(), (X,), {}),
  "sgn": (lambda a: a.sgn(), lambda a: a.sgn(), (SPECIAL,), {"grad": False}),
  "arc": (lambda a: a.arcsin() + a.arccos() + a.arctan() + a.arcsinh() + a.arctanh(),
          lambda a: a.arcsin() + a.arccos() + a.arctan() + a.arcsinh() + a.arctanh(), (X / 4,), {"tol": 1e-4}),
  "arccosh": (lambda a: a.arccosh(), lambda a: a.arccosh(), (np.abs(X) + 1.5,), {}),
  "compare": (lambda a, b: a.greater(b).int() + 2 * a.greater_equal(b).int() + 4 * a.less(b).int()
              + 8 * a.less_equal(b).int() + 16 * a.not_equal(b).int(),
              lambda a, b: a.greater(b).int() + 2 * a.greater_equal(b).int() + 4 * a.less(b).int()
              + 8 * a.less_equal(b).int() + 16 * a.not_equal(b).int(), _grid(SPECIAL), {}),
}

@pytest.mark.parametrize("case", list(ELEMENTWISE))
def test_elementwise(case: str) -> None:
  ours, ref, arrays, kw = ELEMENTWISE[case]
  check(ours, ref, *arrays, **kw)

def test_half_inputs_round_as_torch_does() -> None:
  # torch computes these in float32 and rounds once (xlogy and logit in half): the same values, bit for bit
  x, y = (rng.standard_normal((2, 64)) * 3).astype(np.float16)
  ops: list[Callable[[Any, Any], Any]] = [lambda a, b: a.sinc(), lambda a, b: a.atan2(b), lambda a, b: a.hypot(b),
                                          lambda a, b: a.logaddexp2(b), lambda a, b: a.xlogy(b.abs()),
                                          lambda a, b: (a.abs() / 10).logit(), lambda a, b: a.erfc()]
  for op in ops:
    got = op(Tensor(x), Tensor(y))
    assert got.dtype == dtypes.float16
    np.testing.assert_array_equal(got.numpy(), op(T(x), T(y)).numpy())

@pytest.mark.parametrize("np_dtype, rtol", [(np.float32, 2e-5), (np.float64, 3e-7)])
def test_erfc_is_relatively_accurate_across_its_domain(np_dtype: type, rtol: float) -> None:
  # float64 torch is the oracle; in the tail 1 - erf(x) would be 0 (float32 past x = 4)
  x = np.concatenate([np.linspace(-6, 9, 301), [0.0, -0.0, 1e-8, 26.5]]).astype(np_dtype)
  want = torch.tensor(x, dtype=torch.float64).erfc().numpy()
  got = Tensor(x).erfc()
  assert got.dtype == dtypes.from_np(np.dtype(np_dtype))
  np.testing.assert_allclose(got.numpy(), want, rtol=rtol, atol=1e-300)
  assert Tensor(np.float32([INF, -INF, NAN])).erfc().numpy().tolist()[:2] == [0.0, 2.0]
  check(lambda a: a.erfc(), lambda a: a.erfc(), X * 2)
  check(lambda a: a.half().erfc(), lambda a: a.half().erfc(), X, tol=2e-3, grad=False)

# (x, float32 and float64 tolerances (rtol, atol) against float64 torch): over each function's domain, poles and tails
SPECIAL_FUNCTIONS = {
  "lgamma": (np.concatenate([np.linspace(0.01, 30, 300), np.geomspace(30, 1e30, 40), np.linspace(-20.1, -0.05, 300),
                             [1.0, 2.0, 0.0, -1.0, -3.0, INF, -INF, NAN, 1e-30]]), (2e-6, 5e-6), (1e-11, 1e-12)),
  "digamma": (np.concatenate([np.linspace(0.01, 30, 300), np.geomspace(30, 1e30, 40), np.linspace(-20.1, -0.05, 300),
                              [1.0, 0.0, -1.0, -3.0, INF, NAN, 1.4616321449683622]]), (5e-5, 2e-6), (1e-10, 5e-12)),
  "erfinv": (np.concatenate([np.linspace(-0.9999, 0.9999, 401), [0.0, -0.0, 1.0, -1.0, 1.5, -2.0, NAN, 1e-10,
                                                                 1 - 2 ** -20]]), (1e-6, 1e-7), (3e-7, 1e-12)),
  "i0": (np.concatenate([np.linspace(-50, 50, 401), [0.0, 3.75, -3.75, 88.0, 89.0, INF, -INF, NAN]]), (5e-6, 0),
         (6e-7, 0)),
}

@pytest.mark.parametrize("name", list(SPECIAL_FUNCTIONS))
def test_special_functions_are_accurate_across_their_domains(name: str) -> None:
  x, tol32, tol64 = SPECIAL_FUNCTIONS[name]
  for np_dtype, (rtol, atol) in ((np.float32, tol32), (np.float64, tol64)):
    xs = x.astype(np_dtype)
    want = getattr(torch.tensor(xs, dtype=torch.float64), name)().numpy()
    got = getattr(Tensor(xs), name)()
    assert got.dtype == dtypes.from_np(np.dtype(np_dtype))
    np.testing.assert_allclose(got.numpy(), want, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"{name} {np_dtype}")
  lo, hi = {"lgamma": (-4.9, 6.0), "digamma": (-4.9, 6.0), "erfinv": (-0.95, 0.95), "i0": (-6.0, 6.0)}[name]
  grid = np.linspace(lo, hi, 40).astype(np.float32)
  grid = grid[np.abs(grid - np.round(grid)) > 0.05] if name in ("lgamma", "digamma") else grid  # off the poles
  check(lambda a: getattr(a, name)(), lambda a: getattr(a, name)(), grid, tol=2e-5, grad_tol=1e-4)
  check(lambda a: getattr(a, name)(), lambda a: getattr(a, name)(), grid.astype(np.float16), tol=2e-3, grad=False)

@pytest.mark.parametrize("np_dtype", [np.float32, np.float64, np.float16])
def test_frexp_is_exact_for_normals_subnormals_and_specials(np_dtype: type) -> None:
  info = np.finfo(np_dtype)
  x = np.array([0.0, -0.0, 1.0, -0.375, 8.0, 1000.5, info.tiny, info.tiny / 8, -info.tiny * 0.75, info.max, INF,
                -INF, NAN], np_dtype)
  check(lambda a: a.frexp()[0], lambda a: a.frexp()[0], x, grad=False)
  check(lambda a: a.frexp()[1], lambda a: a.frexp()[1], x)
  if np_dtype is np.float32: check(lambda a: a.frexp()[0], lambda a: a.frexp()[0], X * 100)  # gradient 2^-exponent

def test_elementwise_refuses_what_torch_refuses() -> None:
  check_raises_like_torch("frac(int)", lambda: Tensor([1, 2]).frac(), lambda: T([1, 2]).frac())
  check_raises_like_torch("hardshrink(int)", lambda: Tensor([1, 2]).hardshrink(), lambda: T([1, 2]).hardshrink())
  check_raises_like_torch("gcd(float)", lambda: Tensor([1.5]).gcd(Tensor([2.0])), lambda: T([1.5]).gcd(T([2.0])))
  check_raises_like_torch("lcm(float)", lambda: Tensor([1.5]).lcm(Tensor([2.0])), lambda: T([1.5]).lcm(T([2.0])))
  check_raises_like_torch("negative(bool)", lambda: Tensor([True]).negative(), lambda: T([True]).negative())
  check_raises_like_torch("positive(bool)", lambda: Tensor([True]).positive(), lambda: T([True]).positive())
  check_raises_like_torch("heaviside dtypes", lambda: Tensor([1.0]).heaviside(Tensor([1.0]).double()),
                          lambda: T([1.0]).heaviside(T([1.0]).double()))
  check_raises_like_torch("addcdiv ints", lambda: Tensor([1]).addcdiv(Tensor([1]), Tensor([2])),
                          lambda: T([1]).addcdiv(T([1]), T([2])))

# ** reductions **
XN = np.where(X > 0.8, NAN, X).astype(np.float32)
XN[2] = NAN  # a row of NaNs
TIES = np.float32([[1, 3, 3, 2], [0, 0, -1, -1], [5, 5, 5, 5]])

REDUCTIONS: dict[str, tuple[Callable[..., Any], Callable[..., Any], tuple[np.ndarray, ...], dict[str, Any]]] = {
  "amax-tuple": (lambda a: a.amax((0, -1), keepdim=True), lambda a: a.amax((0, -1), keepdim=True), (X3,), {}),
  "amax-all": (lambda a: a.amax(), lambda a: a.amax(), (TIES,), {}),  # ties share the gradient evenly
  "amin-neg": (lambda a: a.amin(-1), lambda a: a.amin(-1), (TIES,), {}),
  "amin-nan": (lambda a: a.amin(1), lambda a: a.amin(1), (XN,), {"grad": False}),
  "aminmax": (lambda a: a.aminmax(dim=0)[0] + a.aminmax(dim=0)[1], lambda a: a.aminmax(dim=0)[0] + a.aminmax(dim=0)[1],
              (INTS,), {}),
  "aminmax-all": (lambda a: a.aminmax()[1], lambda a: a.aminmax()[1], (X3,), {}),
  "count_nonzero": (lambda a: a.count_nonzero(), lambda a: a.count_nonzero(), (INTS,), {"dtype": I32}),
  "count_nonzero-dims": (lambda a: a.count_nonzero((0, 2)), lambda a: a.count_nonzero((0, 2)),
                         (np.round(X3),), {"dtype": I32}),
  "nansum": (lambda a: a.nansum(1, keepdim=True), lambda a: a.nansum(1, keepdim=True), (XN,), {}),
  "nansum-int": (lambda a: a.nansum(0), lambda a: a.nansum(0).int(), (INTS,), {}),
  "nanmean": (lambda a: a.nanmean(-1), lambda a: a.nanmean(-1), (XN,), {"grad": False}),
  "nanmean-grad": (lambda a: a.nanmean(-1), lambda a: a.nanmean(-1), (XN[:2].copy(),), {}),
  "nanmean-all": (lambda a: a.nanmean(), lambda a: a.nanmean(), (XN,), {}),
  "median": (lambda a: a.median(), lambda a: a.median(), (X3,), {}),
  "median-dim": (lambda a: a.median(1, keepdim=True)[0], lambda a: a.median(1, keepdim=True)[0], (X3,), {}),
  "median-index": (lambda a: a.median(-1)[1], lambda a: a.median(-1)[1], (X3,), {"dtype": I32}),
  "median-nan": (lambda a: a.median(1)[0], lambda a: a.median(1)[0], (XN,), {"grad": False}),
  "median-nan-index": (lambda a: a.median(1)[1], lambda a: a.median(1)[1], (XN,), {"dtype": I32}),
  "median-int": (lambda a: a.median(0)[0], lambda a: a.median(0)[0], (INTS,), {}),
  "nanmedian": (lambda a: a.nanmedian(1)[0], lambda a: a.nanmedian(1)[0], (XN,), {"grad": False}),
  # (the index in an all-NaN row is the order std::nth_element leaves: not compared)
  "nanmedian-index": (lambda a: a.nanmedian(1)[1], lambda a: a.nanmedian(1)[1], (XN[:2].copy(),), {"dtype": I32}),
  "nanmedian-all": (lambda a: a.nanmedian(), lambda a: a.nanmedian(), (XN,), {}),
  "kthvalue": (lambda a: a.kthvalue(2, 0)[0], lambda a: a.kthvalue(2, 0)[0], (X3,), {}),
  "kthvalue-index": (lambda a: a.kthvalue(4, -1, keepdim=True)[1], lambda a: a.kthvalue(4, -1, keepdim=True)[1],
                     (X3,), {"dtype": I32}),
  "mode": (lambda a: a.mode(1)[0], lambda a: a.mode(1)[0], (TIES,), {}),
  "mode-index": (lambda a: a.mode(0, keepdim=True)[1], lambda a: a.mode(0, keepdim=True)[1], (INTS % 3,),
                 {"dtype": I32}),
  "mode-int": (lambda a: a.mode()[0], lambda a: a.mode()[0], (INTS % 3,), {}),
  "mode-nan": (lambda a: a.mode()[0], lambda a: a.mode()[0], (np.float32([[1, NAN, NAN, 2], [NAN, 1, 1, NAN],
                                                                          [NAN, NAN, NAN, NAN]]),), {"grad": False}),
  "norm": (lambda a: a.norm(), lambda a: a.norm(), (X3,), {}),
  "norm-p": (lambda a: a.norm(3, dim=(0, 2)), lambda a: a.norm(3, dim=(0, 2)), (X3,), {}),
  "norm-inf": (lambda a: a.norm(INF, dim=1, keepdim=True), lambda a: a.norm(INF, dim=1, keepdim=True), (TIES,), {}),
  "norm-ninf": (lambda a: a.norm(-INF, dim=-1), lambda a: a.norm(-INF, dim=-1), (X,), {}),
  "norm-1-0": (lambda a: a.norm(1, 0) + a.norm(0, 0), lambda a: a.norm(1, 0) + a.norm(0, 0), (np.round(X),), {}),
  "norm-zero-row": (lambda a: a.norm(dim=1) + a.norm(2.5, dim=1), lambda a: a.norm(dim=1) + a.norm(2.5, dim=1),
                    (np.float32([[0, 0], [3, -4]]),), {}),
  "dist": (lambda a, b: a.dist(b) + a.dist(b, 1), lambda a, b: a.dist(b) + a.dist(b, 1), (X, Y), {}),
  "diff": (lambda a: a.diff(), lambda a: a.diff(), (X3,), {}),
  "diff-n-dim": (lambda a, b: a.diff(2, 0, prepend=b[:1], append=b), lambda a, b: a.diff(2, 0, prepend=b[:1], append=b),
                 (X, Y), {}),
  "diff-bool": (lambda a: (a > 0).diff(), lambda a: (a > 0).diff(), (X,), {}),
  "diff-int-long-n": (lambda a: a.diff(7), lambda a: a.diff(7), (INTS,), {}),
  "trace": (lambda a: a.trace(), lambda a: a.trace(), (X,), {}),
  "trace-int": (lambda a: a.trace(), lambda a: a.trace().int(), (INTS,), {}),
  "cov": (lambda a: a.cov(), lambda a: a.cov(), (X,), {}),
  "cov-1d": (lambda a: a.cov(correction=0), lambda a: a.cov(correction=0), (X[0],), {}),
  "cov-int": (lambda a: a.cov(), lambda a: a.cov(), (INTS,), {}),
  "cov-weights": (lambda a, w: a.cov(fweights=Tensor([1, 2, 1, 3]), aweights=w),
                  lambda a, w: a.cov(fweights=T([1, 2, 1, 3]), aweights=w), (X, np.abs(Y[0]) + 0.1), {"tol": 1e-4}),
  "histc": (lambda a: a.histc(7), lambda a: a.histc(7), (X3,), {"grad": False}),
  "histc-range": (lambda a: a.histc(4, min=-1, max=1), lambda a: a.histc(4, min=-1, max=1),
                  (np.append(X.ravel(), [NAN, -5.0, 5.0, 1.0]).astype(np.float32),), {"grad": False}),
  "histc-constant": (lambda a: a.histc(4), lambda a: a.histc(4), (np.float32([2, 2, 2]),), {"grad": False}),
  "trapezoid": (lambda a: a.trapezoid(), lambda a: torch.trapezoid(a), (X3,), {}),
  "trapezoid-x": (lambda a, b: a.trapezoid(b[0], dim=1), lambda a, b: torch.trapezoid(a, b[0], dim=1), (X, Y), {}),
  "trapz-dx": (lambda a: a.trapz(dx=0.5, dim=0), lambda a: torch.trapz(a, dx=0.5, dim=0), (X,), {}),
}

@pytest.mark.parametrize("case", list(REDUCTIONS))
def test_reductions(case: str) -> None:
  ours, ref, arrays, kw = REDUCTIONS[case]
  check(ours, ref, *arrays, **kw)

@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantile(interpolation: str) -> None:
  qs = np.float32([0.0, 0.25, 0.5, 0.7, 1.0])
  check(lambda a: a.quantile(Tensor(qs), dim=1, keepdim=True, interpolation=interpolation),
        lambda a: a.quantile(T(qs), dim=1, keepdim=True, interpolation=interpolation), X3)
  check(lambda a: a.quantile(0.4, interpolation=interpolation),
        lambda a: a.quantile(0.4, interpolation=interpolation), X)
  check(lambda a: a.nanquantile(Tensor(qs), dim=-1, interpolation=interpolation),
        lambda a: a.nanquantile(T(qs), dim=-1, interpolation=interpolation), XN, grad=False)
  check(lambda a: a.quantile(0.5, dim=0), lambda a: a.quantile(0.5, dim=0), XN, grad=False)  # NaN rows give NaN

def test_quantile_keepdim_without_dim_and_bad_q() -> None:
  check(lambda a: a.quantile(Tensor([0.5, 0.1]), keepdim=True), lambda a: a.quantile(T([0.5, 0.1]), keepdim=True), X3)
  check_raises_like_torch("q > 1", lambda: Tensor(X).quantile(1.5), lambda: T(X).quantile(1.5))
  check_raises_like_torch("q tensor < 0", lambda: Tensor(X).quantile(Tensor([-0.5])), lambda: T(X).quantile(T([-0.5])))
  check_raises_like_torch("int input", lambda: Tensor(INTS).quantile(0.5), lambda: T(INTS).quantile(0.5))
  check_raises_like_torch("mode", lambda: Tensor(X).quantile(0.5, interpolation="cubic"),
                          lambda: T(X).quantile(0.5, interpolation="cubic"))
  check_raises_like_torch("empty", lambda: Tensor(np.zeros((0,), np.float32)).quantile(0.5),
                          lambda: T(np.zeros((0,), np.float32)).quantile(0.5))

def test_named_tuples_carry_torchs_field_names() -> None:
  x, t = Tensor(X), T(X)
  for name, args, fields in (("median", (1,), ("values", "indices")), ("nanmedian", (0,), ("values", "indices")),
                             ("kthvalue", (2,), ("values", "indices")), ("mode", (), ("values", "indices")),
                             ("frexp", (), ("mantissa", "exponent"))):
    ours, want = getattr(x, name)(*args), getattr(t, name)(*args)
    for f in fields: np.testing.assert_array_equal(getattr(ours, f).numpy(), getattr(want, f).numpy())
  mm = x.aminmax(dim=1)
  np.testing.assert_array_equal(mm.min.numpy(), t.aminmax(dim=1).min.numpy())
  np.testing.assert_array_equal(mm.max.numpy(), t.aminmax(dim=1).max.numpy())
  sl = Tensor(SQ).slogdet()
  np.testing.assert_allclose(sl.logabsdet.numpy(), T(SQ).slogdet().logabsdet.numpy(), rtol=1e-5)
  np.testing.assert_array_equal(sl.sign.numpy(), T(SQ).slogdet().sign.numpy())

def test_reductions_of_empty_tensors_and_0d() -> None:
  e = np.zeros((0, 3), np.float32)
  check(lambda a: a.amax(1), lambda a: a.amax(1), e)
  check(lambda a: a.nansum(0), lambda a: a.nansum(0), e)
  check(lambda a: a.count_nonzero(0), lambda a: a.count_nonzero(0), e, dtype=I32)
  check(lambda a: a.diff(dim=0), lambda a: a.diff(dim=0), e)
  check(lambda a: a.norm(dim=0), lambda a: a.norm(dim=0), e)
  check(lambda a: a.median(), lambda a: a.median(), np.float32(2.5))
  check(lambda a: a.kthvalue(1)[0], lambda a: a.kthvalue(1)[0], np.float32(2.5))
  check_raises_like_torch("amax over empty", lambda: Tensor(e).amax(0), lambda: T(e).amax(0))
  check_raises_like_torch("median over empty", lambda: Tensor(e).median(0), lambda: T(e).median(0))
  check_raises_like_torch("kthvalue k", lambda: Tensor(X).kthvalue(5), lambda: T(X).kthvalue(5))
  check_raises_like_torch("amax dim", lambda: Tensor(X).amax(2), lambda: T(X).amax(2))
  check_raises_like_torch("norm of ints", lambda: Tensor(INTS).norm(), lambda: T(INTS).norm())
  check_raises_like_torch("nanmean of ints", lambda: Tensor(INTS).nanmean(), lambda: T(INTS).nanmean())
  check_raises_like_torch("trace of 3-d", lambda: Tensor(X3).trace(), lambda: T(X3).trace())
  check_raises_like_torch("histc of ints", lambda: Tensor(INTS).histc(), lambda: T(INTS).histc())

def test_histogram() -> None:
  x = np.float32([0.3, 1.7, 2.2, 2.2, 4.9, -1.2, 3.3, 5.0])
  w = np.float32([1, 2, 0.5, 1, 3, 1, 2, 1])
  for bins, kw in ((4, {}), (3, {"range": (0.0, 4.0)}), (5, {"weight": w, "density": True}),
                   (np.float32([-2.0, 0.0, 2.5, 5.0]), {"weight": w})):
    ours = Tensor(x).histogram(Tensor(bins) if isinstance(bins, np.ndarray) else bins,
                               **{k: Tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()})
    want = torch.histogram(T(x), T(bins) if isinstance(bins, np.ndarray) else bins,
                           **{k: T(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()})
    np.testing.assert_allclose(ours.hist.numpy(), want.hist.numpy(), rtol=1e-6)
    np.testing.assert_allclose(ours.bin_edges.numpy(), want.bin_edges.numpy(), rtol=1e-6)
  same = Tensor([2.0, 2.0]).histogram(4)
  np.testing.assert_allclose(same.bin_edges.numpy(), torch.histogram(T([2.0, 2.0]), 4).bin_edges.numpy())
  check_raises_like_torch("histogram of ints", lambda: Tensor([1, 2]).histogram(2),
                          lambda: torch.histogram(T([1, 2]), 2))

@pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta")
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(reduce: str) -> None:
  for include_self in (True, False):
    check(lambda a, s, inc=include_self: a.index_reduce(0, Tensor([2, 0, 2]), s, reduce, include_self=inc),
          lambda a, s, inc=include_self: a.index_reduce(0, T([2, 0, 2]), s, reduce, include_self=inc),
          X3[:1].repeat(3, 0) + 0.5, X3[::-1].copy().repeat(2, 0)[:3])

def test_nextafter_shifts_and_sum_to_size() -> None:
  x = np.float32([1.0, 0.0, -0.0, 2.0, 1.0, INF, NAN, 1.0, -1.5, 1e-45, -3.0])
  y = np.float32([2.0, 1.0, -1.0, 2.0, INF, 0.0, 1.0, NAN, -2.0, 0.0, 5.0])
  for np_dtype in (np.float32, np.float64):
    np.testing.assert_array_equal(Tensor(x.astype(np_dtype)).nextafter(Tensor(y.astype(np_dtype))).numpy(),
                                  T(x.astype(np_dtype)).nextafter(T(y.astype(np_dtype))).numpy())
  check(lambda a: a.bitwise_left_shift(2) + a.bitwise_right_shift(1), lambda a: a.bitwise_left_shift(2)
        + a.bitwise_right_shift(1), INTS)
  for size in ((1, 3, 1), (3, 4), (1,), (2, 1, 4)):
    check(lambda a, sz=size: a.sum_to_size(*sz), lambda a, sz=size: a.sum_to_size(*sz), X3)
  check_raises_like_torch("sum_to_size", lambda: Tensor(X3).sum_to_size(2, 4), lambda: T(X3).sum_to_size(2, 4))

def test_put() -> None:
  check(lambda a, s: a.put(Tensor([[-1, 0], [5, 2]]), s), lambda a, s: a.put(T([[-1, 0], [5, 2]]), s), X,
        Y[:2, :2].copy())
  check(lambda a, s: a.put(Tensor([0, 0, 11]), s, accumulate=True),
        lambda a, s: a.put(T([0, 0, 11]), s, accumulate=True), X, Y[0, :3].copy())
  check_raises_like_torch("put range", lambda: Tensor(X).put(Tensor([12]), Tensor([1.0])),
                          lambda: T(X).put(T([12]), T([1.0])))
  t = Tensor(INTS).contiguous().realize()
  assert t.put_(Tensor([1]), Tensor([99])) is t and t.numpy().ravel()[1] == 99

def test_bincount_reads_the_length_from_the_data() -> None:
  v = np.int32([1, 4, 1, 0, 6, 4, 4])
  w = rng.standard_normal(7).astype(np.float32)
  check(lambda a: a.bincount(), lambda a: a.bincount(), v, dtype=I32)
  check(lambda a: a.bincount(minlength=10), lambda a: a.bincount(minlength=10), v, dtype=I32)
  check(lambda a: a.bincount(Tensor(w)), lambda a: a.bincount(T(w)), v)
  check(lambda a: a.bincount(Tensor(w.astype(np.float16))), lambda a: a.bincount(T(w.astype(np.float16))), v,
        tol=1e-3)
  check(lambda a: a.bincount(minlength=3), lambda a: a.bincount(minlength=3), np.zeros(0, np.int32), dtype=I32)
  check_raises_like_torch("negative", lambda: Tensor([1, -1]).bincount(), lambda: T([1, -1]).bincount())
  check_raises_like_torch("2-d", lambda: Tensor(INTS).bincount(), lambda: T(INTS).bincount())

def test_searchsorted_and_bucketize() -> None:
  seq = np.float32([-1.0, 0.0, 0.0, 1.0, 2.5])
  vals = np.float32([[-2.0, 0.0, 0.5], [2.5, 3.0, 1.0]])
  for r in (False, True):
    check(lambda s, v, r=r: s.searchsorted(v, right=r), lambda s, v, r=r: torch.searchsorted(s, v, right=r), seq, vals,
          dtype=I32)
    check(lambda v, b, r=r: v.bucketize(b, right=r), lambda v, b, r=r: torch.bucketize(v, b, right=r), vals, seq,
          dtype=I32)
  check(lambda s, v: s.searchsorted(v, side="right"), lambda s, v: torch.searchsorted(s, v, side="right"),
        np.sort(X, axis=1), Y, dtype=I32)
  perm = np.int64([3, 0, 4, 1, 2])
  check(lambda s, v: s.searchsorted(v, sorter=Tensor(perm.astype(np.int32))),
        lambda s, v: torch.searchsorted(s, v, sorter=T(perm)), seq[np.argsort(perm)], vals, dtype=I32)
  assert Tensor(seq).searchsorted(0.0).item() == torch.searchsorted(T(seq), 0.0).item()
  check_raises_like_torch("side", lambda: Tensor(seq).searchsorted(Tensor(vals), side="middle"),
                          lambda: torch.searchsorted(T(seq), T(vals), side="middle"))

# ** products **
SQ = rng.standard_normal((2, 3, 3)).astype(np.float32)
PRODUCTS: dict[str, tuple[Callable[..., Any], Callable[..., Any], tuple[np.ndarray, ...], dict[str, Any]]] = {
  "mm": (lambda a, b: a.mm(b), lambda a, b: a.mm(b), (X, Y.T.copy()), {}),
  "mv": (lambda a, b: a.mv(b), lambda a, b: a.mv(b), (X, Y[0]), {}),
  "bmm": (lambda a, b: a.bmm(b), lambda a, b: a.bmm(b), (X3, X3.transpose(0, 2, 1).copy()), {}),
  "addmm": (lambda c, a, b: c.addmm(a, b, beta=0.5, alpha=-2), lambda c, a, b: c.addmm(a, b, beta=0.5, alpha=-2),
            (Y[:, :3].copy(), X, Y.T.copy()), {}),
  "addmm-beta0-nan": (lambda c, a, b: c.addmm(a, b, beta=0), lambda c, a, b: c.addmm(a, b, beta=0),
                      (np.full((1, 3), NAN, np.float32), X, Y.T.copy()), {}),
  "baddbmm": (lambda c, a, b: c.baddbmm(a, b, alpha=0.5), lambda c, a, b: c.baddbmm(a, b, alpha=0.5),
              (SQ, SQ, SQ[::-1].copy()), {}),
  "outer": (lambda a, b: a.outer(b) + a.ger(b), lambda a, b: a.outer(b) + a.ger(b), (X[0], Y[1]), {}),
  "inner": (lambda a, b: a.inner(b), lambda a, b: a.inner(b), (X3, Y), {}),
  "inner-1d-0d": (lambda a, b: a.inner(b[0, 0]), lambda a, b: a.inner(b[0, 0]), (X[0], Y), {}),
  "vdot": (lambda a, b: a.vdot(b), lambda a, b: a.vdot(b), (X[0], Y[0]), {}),
  "kron": (lambda a, b: a.kron(b), lambda a, b: a.kron(b), (X[:2, :3].copy(), X3[:, :2, :2].copy()), {}),
  "kron-int": (lambda a, b: a.kron(b), lambda a, b: a.kron(b), (INTS[0], INTS[:2, :2].copy()), {}),
  "kron-0d": (lambda a, b: a.kron(b), lambda a, b: a.kron(b), (np.float32(2.5), np.float32(-1.5)), {}),
  "cross": (lambda a, b: a.cross(b), lambda a, b: a.cross(b), (X[:, :3].copy(), Y[:, :3].copy()), {}),
  "cross-dim": (lambda a, b: a.cross(b, dim=-1), lambda a, b: a.cross(b, dim=-1),
                (X3[:, :, :3].copy(), Y[None, :1, :3].copy()), {}),
}

@pytest.mark.filterwarnings("ignore:Using torch.cross without specifying the dim")
@pytest.mark.parametrize("case", list(PRODUCTS))
def test_products(case: str) -> None:
  ours, ref, arrays, kw = PRODUCTS[case]
  check(ours, ref, *arrays, **kw)

def test_products_refuse_wrong_shapes() -> None:
  check_raises_like_torch("mm 3-d", lambda: Tensor(X3).mm(Tensor(X)), lambda: T(X3).mm(T(X)))
  check_raises_like_torch("mv", lambda: Tensor(X).mv(Tensor(Y[0, :3])), lambda: T(X).mv(T(Y[0, :3])))
  check_raises_like_torch("bmm batch", lambda: Tensor(X3).bmm(Tensor(SQ[:1])), lambda: T(X3).bmm(T(SQ[:1])))
  check_raises_like_torch("outer 2-d", lambda: Tensor(X).outer(Tensor(X)), lambda: T(X).outer(T(X)))
  check_raises_like_torch("cross size", lambda: Tensor(X).cross(Tensor(Y), dim=1), lambda: T(X).cross(T(Y), dim=1))
  check_raises_like_torch("t 3-d", lambda: Tensor(X3).t(), lambda: T(X3).t())

# ** movement and indexing **
IDX = np.int32([2, 0, 2])
MOVEMENT: dict[str, tuple[Callable[..., Any], Callable[..., Any], tuple[np.ndarray, ...], dict[str, Any]]] = {
  "movedim": (lambda a: a.movedim((0, -1), (-1, 1)), lambda a: a.movedim((0, -1), (-1, 1)), (X3,), {}),
  "moveaxis": (lambda a: a.moveaxis(1, 0), lambda a: a.moveaxis(1, 0), (X3,), {}),
  "movedim-0d": (lambda a: a.movedim(0, -1), lambda a: a.movedim(0, -1), (np.float32(2.0),), {}),
  "swap": (lambda a: a.swapaxes(0, -1) + a.swapdims(-1, 0), lambda a: a.swapaxes(0, -1) + a.swapdims(-1, 0), (X3,), {}),
  "t": (lambda a, b: a.t() + b.t(), lambda a, b: a.t() + b.t(), (X, Y[0, :3].copy()), {}),
  "narrow": (lambda a: a.narrow(-1, -3, 2), lambda a: a.narrow(-1, -3, 2), (X3,), {}),
  "narrow-tensor-start": (lambda a: a.narrow(1, Tensor(1), 2), lambda a: a.narrow(1, T(1), 2), (X3,), {}),
  "select": (lambda a: a.select(1, -1), lambda a: a.select(1, -1), (X3,), {}),
  "unbind": (lambda a: Tensor.stack(*a.unbind(2)[::-1]), lambda a: torch.stack(a.unbind(2)[::-1]), (X3,), {}),
  "tensor_split": (lambda a: a.tensor_split(3, dim=-1)[0] + a.tensor_split(3, dim=-1)[1],
                   lambda a: a.tensor_split(3, dim=-1)[0] + a.tensor_split(3, dim=-1)[1], (X3[..., :3].copy(),), {}),
  "hsplit": (lambda a: a.hsplit(2)[1] * a.hsplit([1])[0], lambda a: a.hsplit(2)[1] * a.hsplit([1])[0],
             (X3[:, :2].copy(),), {}),
  "vsplit": (lambda a: a.vsplit([2])[1], lambda a: a.vsplit([2])[1], (X,), {}),
  "dsplit": (lambda a: a.dsplit(2)[1], lambda a: a.dsplit(2)[1], (X3,), {}),
  "flips": (lambda a: a.fliplr() * a.flipud(), lambda a: a.fliplr() * a.flipud(), (X3,), {}),
  "tile": (lambda a: a.tile((2, 1, 1, 2)), lambda a: a.tile((2, 1, 1, 2)), (X3,), {}),
  "tile-short": (lambda a: a.tile(3), lambda a: a.tile(3), (X,), {}),
  "take": (lambda a: a.take(Tensor([[0, -1], [5, 11]])), lambda a: a.take(T([[0, -1], [5, 11]])), (X,), {}),
  "take_along_dim": (lambda a: a.take_along_dim(Tensor([[0], [2], [1]]), 1),
                     lambda a: a.take_along_dim(T([[0], [2], [1]]), 1), (X,), {}),
  "take_along_dim-bcast": (lambda a: a.take_along_dim(Tensor([[[3, 0]]]), -1),
                           lambda a: a.take_along_dim(T([[[3, 0]]]), -1), (X3,), {}),
  "take_along_dim-flat": (lambda a: a.take_along_dim(Tensor([5, 0])), lambda a: a.take_along_dim(T([5, 0])), (X,), {}),
  "diag_embed": (lambda a: a.diag_embed(), lambda a: a.diag_embed(), (X,), {}),
  "diag_embed-args": (lambda a: a.diag_embed(-2, 0, 2), lambda a: a.diag_embed(-2, 0, 2), (X,), {}),
  "index_add": (lambda a, s: a.index_add(1, Tensor(IDX), s, alpha=2), lambda a, s: a.index_add(1, T(IDX), s, alpha=2),
                (X3, X3[::-1].copy()), {}),
  "index_add-int": (lambda a, s: a.index_add(-1, Tensor(IDX), s), lambda a, s: a.index_add(-1, T(IDX), s),
                    (INTS, INTS[:, :3].copy()), {}),
  "index_copy": (lambda a, s: a.index_copy(0, Tensor([2, 0]), s), lambda a, s: a.index_copy(0, T([2, 0]), s),
                 (X, Y[:2].copy()), {}),
  "index_fill": (lambda a: a.index_fill(-2, Tensor([0, -1]), -1.5), lambda a: a.index_fill(-2, T([0, -1]), -1.5),
                 (X3,), {}),
  "masked_scatter": (lambda a, s: a.masked_scatter(Tensor(X[0] > 0), s), lambda a, s: a.masked_scatter(T(X[0] > 0), s),
                     (X, Y), {}),
  "scatter_add": (lambda a, s: a.scatter_add(1, Tensor([[0, 0], [3, 1], [2, 2]]), s),
                  lambda a, s: a.scatter_add(1, T([[0, 0], [3, 1], [2, 2]]), s), (X, Y[:, :2].copy()), {}),
  "as": (lambda a, b: a.reshape_as(b) + a.view_as(b) + a[:1].expand_as(a).reshape_as(b) + a[0, :3].broadcast_to((4, 3)),
         lambda a, b: a.reshape_as(b) + a.view_as(b) + a[:1].expand_as(a).reshape_as(b) + a[0, :3].broadcast_to((4, 3)),
         (X, np.zeros((4, 3), np.int32)), {}),
  "ravel": (lambda a: a.ravel(), lambda a: a.ravel(), (X3,), {}),
  "type_as": (lambda a, b: a.type_as(b), lambda a, b: a.type_as(b), (X * 3, INTS), {}),
  "msort": (lambda a: a.msort(), lambda a: a.msort(), (X3,), {}),
}

@pytest.mark.parametrize("case", list(MOVEMENT))
def test_movement(case: str) -> None:
  ours, ref, arrays, kw = MOVEMENT[case]
  check(ours, ref, *arrays, **kw)

@pytest.mark.parametrize("k", [-1, 0, 1, 2, 3, 6])
def test_rot90(k: int) -> None:
  check(lambda a: a.rot90(k, (-1, 0)), lambda a: a.rot90(k, (-1, 0)), X3)

def test_splits_follow_numpy_array_split_rules() -> None:
  x = Tensor(X3)
  for spec in (2, 5, [1, 3], [-2], [3, 1], [0, 10], []):
    ours = x.tensor_split(spec, dim=2)
    want = T(X3).tensor_split(spec, dim=2)
    assert len(ours) == len(want)
    for o, w in zip(ours, want): np.testing.assert_array_equal(o.numpy(), w.numpy())
  assert [t.tolist() for t in x.tensor_split(Tensor([1, 3]), dim=2)] == [t.tolist() for t in T(X3).tensor_split(
    T([1, 3]), dim=2)]
  assert [t.shape for t in Tensor.zeros(0, 2).tensor_split(2)] == [(0, 2), (0, 2)]
  check_raises_like_torch("hsplit uneven", lambda: Tensor(X).hsplit(3), lambda: T(X).hsplit(3))
  check_raises_like_torch("vsplit 1-d", lambda: Tensor(X[0]).vsplit(2), lambda: T(X[0]).vsplit(2))
  check_raises_like_torch("dsplit 2-d", lambda: Tensor(X).dsplit(2), lambda: T(X).dsplit(2))
  check_raises_like_torch("sections 0", lambda: Tensor(X).tensor_split(0), lambda: T(X).tensor_split(0))

def test_movement_refuses_bad_arguments() -> None:
  x, t = Tensor(X3), T(X3)
  check_raises_like_torch("narrow start", lambda: x.narrow(0, 3, 0), lambda: t.narrow(0, 3, 0))
  check_raises_like_torch("narrow length", lambda: x.narrow(2, 3, 2), lambda: t.narrow(2, 3, 2))
  check_raises_like_torch("select", lambda: x.select(1, 3), lambda: t.select(1, 3))
  check_raises_like_torch("select dim", lambda: x.select(3, 0), lambda: t.select(3, 0))
  check_raises_like_torch("movedim repeat", lambda: x.movedim((0, 0), (1, 2)), lambda: t.movedim((0, 0), (1, 2)))
  check_raises_like_torch("rot90 same dims", lambda: x.rot90(1, (1, -2)), lambda: t.rot90(1, (1, -2)))
  check_raises_like_torch("fliplr 1-d", lambda: Tensor(X[0]).fliplr(), lambda: T(X[0]).fliplr())
  check_raises_like_torch("diag_embed 0-d", lambda: Tensor(1.0).diag_embed(), lambda: T(1.0).diag_embed())
  check_raises_like_torch("diag_embed dims", lambda: x.diag_embed(0, 1, -3), lambda: t.diag_embed(0, 1, -3))
  check_raises_like_torch("index_add range", lambda: x.index_add(0, Tensor([2]), x[:1]),
                          lambda: t.index_add(0, T([2]), t[:1]))
  check_raises_like_torch("index_add source", lambda: x.index_add(0, Tensor([1]), x), lambda: t.index_add(0, T([1]), t))
  check_raises_like_torch("index_fill float index", lambda: x.index_fill(0, Tensor([1.0]), 0),
                          lambda: t.index_fill(0, T([1.0]), 0))
  check_raises_like_torch("take range", lambda: x.take(Tensor([24])), lambda: t.take(T([24])))
  check_raises_like_torch("index_copy negative", lambda: x.index_copy(0, Tensor([-1]), x[:1]),
                          lambda: t.index_copy(0, T([-1]), t[:1]))
  check_raises_like_torch("index_fill range", lambda: x.index_fill(0, Tensor([-3]), 1.0),
                          lambda: t.index_fill(0, T([-3]), 1.0))
  s, ts = Tensor(1.0), T(1.0)
  for name in ("unbind", "narrow", "tensor_split", "take_along_dim"):
    args: tuple[Any, ...] = {"unbind": (0,), "narrow": (0, 0, 1), "tensor_split": (2,), "take_along_dim": (0, 0)}[name]
    ours_args = tuple(Tensor(a) if name == "take_along_dim" and i == 0 else a for i, a in enumerate(args))
    theirs_args = tuple(T(a) if name == "take_along_dim" and i == 0 else a for i, a in enumerate(args))
    check_raises_like_torch(f"{name} of 0-d", lambda n=name, a=ours_args: getattr(s, n)(*a),
                            lambda n=name, a=theirs_args: getattr(ts, n)(*a))
  check_raises_like_torch("masked_scatter int mask", lambda: x.masked_scatter(Tensor([1]), x),
                          lambda: t.masked_scatter(T([1]), t))

# ** data-dependent shapes, read on the host **
def test_unique_and_unique_consecutive() -> None:
  v = np.int32([[3, 1, 3], [1, 1, 2], [3, 1, 3]])
  for kw in ({}, {"return_inverse": True}, {"return_counts": True}, {"return_inverse": True, "return_counts": True},
             {"dim": 0, "return_inverse": True, "return_counts": True}, {"dim": -1, "return_counts": True}):
    for name in ("unique", "unique_consecutive"):
      ours, want = getattr(Tensor(v), name)(**kw), getattr(T(v), name)(**kw)
      ours, want = (ours, want) if isinstance(ours, tuple) else ((ours,), (want,))
      assert len(ours) == len(want)
      for i, (o, w) in enumerate(zip(ours, want)):
        assert o.dtype == (dtypes.int32 if i else dtypes.int32) and o.shape == tuple(w.shape), (name, kw, i)
        np.testing.assert_array_equal(o.numpy(), w.numpy())
  f = np.float32([2.0, NAN, -0.5, 2.0, NAN])
  np.testing.assert_array_equal(Tensor(f).unique().numpy(), T(f).unique().numpy())  # each NaN is distinct, as in torch
  assert Tensor(np.zeros(0, np.float32)).unique().shape == (0,)
  assert Tensor(f).half().unique().dtype == dtypes.float16

def test_argwhere_and_equal() -> None:
  check(lambda a: a.argwhere(), lambda a: a.argwhere(), INTS, dtype=I32)
  assert Tensor(X).equal(Tensor(X)) and not Tensor(X).equal(Tensor(Y)) and not Tensor(X).equal(Tensor(X[:2]))
  assert Tensor(INTS).equal(Tensor(INTS).float()) == T(INTS).equal(T(INTS).float())
  assert Tensor([NAN]).equal(Tensor([NAN])) == T([NAN]).equal(T([NAN]))

HOST_READS = [lambda t: t.unique(), lambda t: t.argwhere(), lambda t: t.bincount(), lambda t: t.unique_consecutive(),
              lambda t: t.tensor_split(t[:1])[0]]

@pytest.mark.parametrize("op", HOST_READS)
def test_data_dependent_shapes_refuse_inside_a_jit_capture(op: Callable[[Tensor], Tensor]) -> None:
  @TinyJit
  def f(t: Tensor) -> Tensor: return op(t).sum().realize()
  with pytest.raises(ShapeError, match="TinyJit capture") as e:
    for _ in range(3): f(Tensor([1, 2, 2]).realize())
  assert isinstance(e.value, (ValueError, RuntimeError)) and isinstance(e.value, EmberError)

@pytest.mark.parametrize("op", HOST_READS)
def test_data_dependent_shapes_refuse_inside_a_function_trace(op: Callable[[Tensor], Tensor]) -> None:
  @ember.function
  def f(t: Tensor) -> Tensor: return op(t).sum()
  with pytest.raises(ShapeError, match="ember.function trace"): f(Tensor([1, 2, 2]).realize())
  np.testing.assert_array_equal(op(Tensor([1, 2, 2])).numpy(), op(T([1, 2, 2])).numpy())  # outside: read on the host

# ** in place **
def test_fill_and_zero_write_the_same_buffer() -> None:
  t = Tensor(X).contiguous().realize()
  buf = t.buffer()
  assert t.fill_(2.5) is t and t.tolist() == np.full_like(X, 2.5).tolist() and t.buffer() is buf
  t.fill_(Tensor(-1))
  assert (t.numpy() == -1).all() and t.dtype == dtypes.float32
  assert (t.zero_().numpy() == 0).all()
  i = Tensor(INTS).contiguous().realize().fill_(7.9)
  assert i.dtype == dtypes.int32 and (i.numpy() == T(INTS).fill_(7.9).numpy()).all()

INPLACE: list[tuple[str, Callable[[Any], tuple[Any, ...]], np.ndarray]] = [
  ("arccos_", lambda m: (), X / 4), ("erfc_", lambda m: (), X), ("frac_", lambda m: (), X * 3),
  ("sinc_", lambda m: (), X), ("square_", lambda m: (), INTS), ("bitwise_not_", lambda m: (), INTS),
  ("atan2_", lambda m: (m(Y),), X), ("xlogy_", lambda m: (2.0,), X), ("gcd_", lambda m: (m(INTS[::-1].copy()),), INTS),
  ("remainder_", lambda m: (3,), INTS), ("floor_divide_", lambda m: (-2,), INTS), ("lt_", lambda m: (0.5,), X),
  ("greater_equal_", lambda m: (m(Y),), X), ("logical_and_", lambda m: (m(Y),), X),
  ("clamp_min_", lambda m: (0.1,), X), ("subtract_", lambda m: (m(Y),), X), ("nan_to_num_", lambda m: (), SPECIAL),
  ("addcmul_", lambda m: (m(X), m(Y)), X), ("addmm_", lambda m: (m(X), m(Y.T.copy())), X[:, :3].copy()),
  ("index_add_", lambda m: (1, m(np.int64([0, 3])), m(Y[:, :2].copy())), X),
  ("index_fill_", lambda m: (0, m(np.int64([1])), -2.0), X), ("masked_scatter_", lambda m: (m(X > 0), m(Y)), X),
  ("scatter_add_", lambda m: (0, m(np.int64([[2, 1, 0, 0]])), m(Y[:1].copy())), X),
  ("tril_", lambda m: (-1,), X), ("cumsum_", lambda m: (1,), INTS), ("fill_diagonal_", lambda m: (7.0,), X),
]

@pytest.mark.parametrize("name, args, x", INPLACE, ids=[c[0] for c in INPLACE])
def test_in_place_ops_write_the_tensors_buffer(name: str, args: Callable[[Any], tuple[Any, ...]],
                                               x: np.ndarray) -> None:
  ours = Tensor(x).contiguous().realize()
  buf = ours.buffer()
  assert getattr(ours, name)(*args(lambda a: Tensor(a) if isinstance(a, np.ndarray) else a)) is ours
  want = T(x.copy())
  getattr(want, name)(*args(lambda a: T(a) if isinstance(a, np.ndarray) else a))
  assert ours.buffer() is buf and ours.dtype == dtypes.from_np(x.dtype)
  np.testing.assert_allclose(ours.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)

def test_in_place_ops_refuse_results_their_dtype_cannot_hold() -> None:
  for name in ("arccos_", "erfc_", "deg2rad_"):
    check_raises_like_torch(name, lambda n=name: getattr(Tensor(INTS), n)(), lambda n=name: getattr(T(INTS), n)())
  check_raises_like_torch("true_divide_", lambda: Tensor(INTS).true_divide_(2), lambda: T(INTS).true_divide_(2))
  # Tensor's own in-place family (elementwise.py) refuses the same way: these truncated silently
  for name, args in (("exp_", ()), ("sigmoid_", ()), ("div_", (2,)), ("add_", (1.5,)), ("pow_", (0.5,)),
                     ("clamp_", (0.5, 2.5))):
    check_raises_like_torch(name, lambda n=name, a=args: getattr(Tensor(INTS), n)(*a),
                            lambda n=name, a=args: getattr(T(INTS), n)(*a))
  check_raises_like_torch("add_ into bool", lambda: Tensor([True, False]).add_(1), lambda: T([True, False]).add_(1))
  for name, args in (("add_", (2,)), ("mul_", (3,)), ("pow_", (2,)), ("neg_", ()), ("abs_", ()), ("clamp_", (0, 2)),
                     ("div_", (2,)), ("floor_", ()), ("relu_", ())):
    ours, want = Tensor(INTS).contiguous().realize(), T(INTS.copy())
    kw = {"rounding_mode": "floor"} if name == "div_" else {}  # floor division keeps ints
    getattr(ours, name)(*args, **kw)
    getattr(want, name)(*args, **kw)
    assert ours.dtype == dtypes.from_np(INTS.dtype)
    np.testing.assert_array_equal(ours.numpy(), want.numpy())
  # a fill value is cast to the tensor's dtype, as torch casts it
  ours, want, m = Tensor(INTS).contiguous().realize(), T(INTS.copy()), INTS > 2
  ours.masked_fill_(Tensor(m), 1.5)
  want.masked_fill_(T(m), 1.5)
  np.testing.assert_array_equal(ours.numpy(), want.numpy())
  check_raises_like_torch("index_add_ float into int",
                          lambda: Tensor(INTS).index_add_(0, Tensor([0]), Tensor(X[:1, :1])),
                          lambda: T(INTS).index_add_(0, T([0]), T(X[:1, :1])))

def test_in_place_ops_reading_their_own_buffer_elsewhere() -> None:
  # one kernel writing the buffer it reads at other positions read overwritten elements
  sq = np.arange(1, 10, dtype=np.float32).reshape(3, 3)
  ours, want = Tensor(sq).contiguous().realize(), T(sq.copy())
  ours.atan2_(ours.T)
  want.atan2_(want.T.clone())
  np.testing.assert_allclose(ours.numpy(), want.numpy(), rtol=1e-6)
  ours, want = Tensor(sq).contiguous().realize(), T(sq.copy())
  ours.index_add_(0, Tensor([2, 0]), ours[:2])
  want.index_add_(0, T([2, 0]), want[:2].clone())
  np.testing.assert_array_equal(ours.numpy(), want.numpy())

def test_more_products_and_scatters() -> None:
  check(lambda c, m, v: c.addmv(m, v, beta=0.5, alpha=2), lambda c, m, v: c.addmv(m, v, beta=0.5, alpha=2),
        Y[:, 0].copy(), X, Y[0])
  check(lambda c, a, b: c.addr(a, b, alpha=-1), lambda c, a, b: c.addr(a, b, alpha=-1), X, Y[:, 0].copy(), Y[0])
  check(lambda c, a, b: c.addbmm(a, b), lambda c, a, b: c.addbmm(a, b), X[:, :3].copy(), SQ, SQ[::-1].copy())
  check(lambda a: a.corrcoef(), lambda a: a.corrcoef(), X)
  check(lambda a: a.diagflat(-1), lambda a: a.diagflat(-1), X[:2])
  check(lambda a, b: a.slice_scatter(b, 1, 1, None, 2), lambda a, b: a.slice_scatter(b, 1, 1, None, 2), X,
        Y[:, :2].copy())
  check(lambda a, b: a.select_scatter(b, -1, -2), lambda a, b: a.select_scatter(b, -1, -2), X3, X3[..., 0].copy())
  for off, d1, d2 in ((0, 0, 1), (1, 2, 1), (-1, -1, 0)):
    src = T(X3).diagonal(off, d1, d2).numpy() * 3
    check(lambda a, b, o=off, i=d1, j=d2: a.diagonal_scatter(b, o, i, j),
          lambda a, b, o=off, i=d1, j=d2: a.diagonal_scatter(b, o, i, j), X3, src)
  check(lambda a: a.renorm(2, 0, 1.5), lambda a: a.renorm(2, 0, 1.5), X * 2)
  check(lambda a: a.renorm(1, -1, 2.0), lambda a: a.renorm(1, -1, 2.0), X3)
  assert [t.shape for t in Tensor(X3).split_with_sizes([1, 3], -1)] == [tuple(t.shape) for t in
                                                                          T(X3).split_with_sizes([1, 3], -1)]
  x, t = Tensor(X3), T(X3)
  assert (x.nelement(), x.ndimension(), x.is_signed(), x.is_complex(), x.is_same_size(x[0])) == \
    (t.nelement(), t.ndimension(), t.is_signed(), t.is_complex(), t.is_same_size(t[0]))
  assert Tensor([1]).byte().dtype == dtypes.uint8 and Tensor([1]).char().dtype == dtypes.int8
  assert not Tensor([1]).byte().is_signed()
  for rows, wrap in ((7, True), (7, False), (2, False)):
    ours = Tensor.zeros(rows, 3).contiguous().realize().fill_diagonal_(5.0, wrap=wrap)
    np.testing.assert_array_equal(ours.numpy(), torch.zeros(rows, 3).fill_diagonal_(5.0, wrap=wrap).numpy())
  np.testing.assert_array_equal(Tensor.zeros(3, 3, 3).contiguous().realize().fill_diagonal_(1).numpy(),
                                torch.zeros(3, 3, 3).fill_diagonal_(1).numpy())

# ** linear algebra **
WELL = (rng.standard_normal((2, 4, 4)) + 3 * np.eye(4)).astype(np.float32)

@pytest.mark.parametrize("np_dtype", [np.float32, np.float64])
def test_det_slogdet_logdet_inverse(np_dtype: type) -> None:
  a = SQ.astype(np_dtype)
  check(lambda m: m.det(), lambda m: m.det(), a, tol=1e-4)
  check(lambda m: m.slogdet()[0] + m.slogdet()[1], lambda m: m.slogdet()[0] + m.slogdet()[1], a, tol=1e-4)
  check(lambda m: m.logdet(), lambda m: m.logdet(), a, grad=False, tol=1e-4)
  check(lambda m: m.inverse(), lambda m: m.inverse(), WELL.astype(np_dtype), tol=1e-4)

@pytest.mark.filterwarnings("ignore:torch.cholesky is deprecated")
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_and_solves(upper: bool) -> None:
  m = rng.standard_normal((2, 3, 3))
  spd = (m @ m.transpose(0, 2, 1) + 3 * np.eye(3)).astype(np.float32)
  check(lambda a: a.cholesky(upper), lambda a: a.cholesky(upper), spd, tol=1e-5)  # symmetric gradient, as torch's
  lopsided = spd.copy()
  lopsided[:, 0, 2] += 5  # only the lower triangle is read
  check(lambda a: a.cholesky(), lambda a: a.cholesky(), lopsided, grad=False)
  factor = torch.linalg.cholesky(T(spd), upper=upper).numpy()
  check(lambda f: f.cholesky_inverse(upper), lambda f: f.cholesky_inverse(upper), factor, tol=1e-4)
  rhs = rng.standard_normal((3, 2)).astype(np.float32)
  check(lambda b, f: b.cholesky_solve(f, upper), lambda b, f: b.cholesky_solve(f, upper), rhs, factor, tol=1e-4)
  check(lambda a: a.cholesky(upper), lambda a: a.cholesky(upper), np.eye(4, dtype=np.float64) * 4)
  check_raises_like_torch("cholesky of ints", lambda: Tensor(INTS[:3, :3]).cholesky(),
                          lambda: T(INTS[:3, :3]).cholesky())

def test_linalg_edges() -> None:
  perm = np.float32([[0, 1, 0], [0, 0, 1], [1, 0, 0]])  # every pivot needs a row swap
  check(lambda m: m.det(), lambda m: m.det(), perm)
  check(lambda m: m.inverse(), lambda m: m.inverse(), perm)
  singular = np.float32([[1, 2], [2, 4]])
  check(lambda m: m.det(), lambda m: m.det(), singular, grad=False)
  check(lambda m: m.slogdet()[1], lambda m: m.slogdet()[1], singular, grad=False)
  check(lambda m: m.det(), lambda m: m.det(), np.zeros((2, 0, 0), np.float32))
  check(lambda m: m.matrix_power(5), lambda m: m.matrix_power(5), np.int32([[1, 1], [1, 0]]))
  check(lambda m: m.matrix_power(0), lambda m: m.matrix_power(0), SQ)
  check(lambda m: m.matrix_power(-2), lambda m: m.matrix_power(-2), WELL[0], tol=1e-4)
  check(lambda m: m.matrix_power(3), lambda m: m.matrix_power(3), SQ, tol=1e-4)
  check_raises_like_torch("det of ints", lambda: Tensor(INTS[:3, :3]).det(), lambda: T(INTS[:3, :3]).det())
  check_raises_like_torch("det not square", lambda: Tensor(X).det(), lambda: T(X).det())
  check_raises_like_torch("inverse 1-d", lambda: Tensor(X[0]).inverse(), lambda: T(X[0]).inverse())

def test_half_mean_and_var_accumulate_in_float32_as_torch() -> None:
  # 70,000 halves: their sum (and the count) overflow half, which made mean nan and var inf
  a = np.full(70000, 2, np.float16)
  a[::3] = 300
  rows = (np.random.default_rng(3).standard_normal((8, 3000)) * 50).astype(np.float16)
  for x in (a, rows):
    axis = -1
    for name in ("mean", "var", "std"):
      ours, want = getattr(Tensor(x), name)(axis), getattr(T(x), name)(axis)
      assert ours.dtype == dtypes.float16
      np.testing.assert_allclose(ours.numpy().astype(np.float32), want.numpy().astype(np.float32), rtol=2e-3)

def test_half_norms_scans_and_attention_compute_in_float32_as_torch() -> None:
  # a row's sum of squares (and attention scores of 100 products of ~30s) overflow half: normalize gave zeros, norm
  # inf, attention nan; cumsum of half came back float32
  x = (np.random.default_rng(4).standard_normal((4, 5000)) * 30).astype(np.float16)
  ours, want = Tensor(x), T(x)
  def close(a: Tensor, b: Any, rtol: float) -> None:
    assert a.dtype == dtypes.float16
    np.testing.assert_allclose(a.numpy().astype(np.float32), b.numpy().astype(np.float32), rtol=rtol, atol=rtol)
  close(ours.normalize(dim=-1), torch.nn.functional.normalize(want, dim=-1), 5e-3)
  close(ours.norm(dim=-1), want.norm(dim=-1), 5e-3)
  close(ours.cumsum(-1), want.cumsum(-1), 5e-2)
  flat = np.zeros(100000, np.float16)  # 100,000 exps of 0 sum to inf in half: softmax was all zeros
  close(Tensor(flat).softmax(), T(flat).softmax(0), 1e-3)
  q, tq = ours.reshape(1, 4, 50, 100), want.reshape(1, 4, 50, 100)
  close(q.scaled_dot_product_attention(q, q, is_causal=True),
        torch.nn.functional.scaled_dot_product_attention(tq, tq, tq, is_causal=True), 5e-2)

def test_int_fill_values_and_bounds_that_do_not_fit_raise_like_torch() -> None:
  # masked_fill(m, 1000) and clamp(-1000, 1000) of an int8 tensor wrote -24 (the value wrapped); torch refuses both.
  # Arithmetic with such a scalar wraps in both (x + 1000), and stays so
  i8 = np.array([1, -3], np.int8)
  check_raises_like_torch("masked_fill", lambda: Tensor(i8).masked_fill(Tensor([True, False]), 1000),
                          lambda: T(i8).masked_fill(T([True, False]), 1000))
  check_raises_like_torch("clamp", lambda: Tensor(i8).clamp(-1000, 1000), lambda: T(i8).clamp(-1000, 1000))
  check_raises_like_torch("clamp int32", lambda: Tensor(INTS).clamp(0, 2 ** 31), lambda: T(INTS).clamp(0, 2 ** 31))
  np.testing.assert_array_equal(Tensor(i8).clamp(-128, 127).numpy(), T(i8).clamp(-128, 127).numpy())
  np.testing.assert_array_equal((Tensor(i8) + 1000).numpy(), (T(i8) + 1000).numpy())
