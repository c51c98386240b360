"""Argument spellings and edge cases torch and tinygrad accept (issue 17), against torch 2.13: values, dtypes, shapes
and the gradients of every float input. Index results are int32 in ember where torch gives int64 (`dtype=`)."""
from __future__ import annotations
import functools
import warnings
from typing import Any, Callable
import numpy as np
import pytest
from ember import Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torch_oracle import check, check_raises_like_torch  # noqa: E402

rng = np.random.default_rng(17)
def rand(*shape: int) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)
def ints(*shape: int, low: int = -9, high: int = 9) -> np.ndarray:
  return rng.integers(low, high, shape).astype(np.int32)
def E(a: Any) -> Tensor: return Tensor(np.asarray(a))
def T(a: Any) -> Any: return torch.tensor(np.asarray(a))

NAN = np.array([1.0, np.nan, -2.0, 3.0, np.nan, 0.5], np.float32)
INF_PAIRS = (np.array([np.inf, -np.inf, 5.0, -5.0, 0.0, -0.0, 3.0, -4.0, 4.0], np.float32),
             np.array([0.7, 0.7, np.inf, np.inf, np.inf, -np.inf, -np.inf, 2.0, -2.0], np.float32))
# one NaN per row and column: torch's max(dim) sends the gradient to one index, ember's to every maximum
WITH_NAN = np.array([[1.0, np.nan, -2.0], [3.0, 0.5, 7.0], [np.nan, 4.0, 1.0]], np.float32)
X3 = rand(2, 3, 4)

# name -> (ember fn, torch fn, inputs, check keyword arguments)
CASES: dict[str, tuple[Callable[..., Any], Callable[..., Any], tuple[np.ndarray, ...], dict[str, Any]]] = {
  # ** clip / clamp with one bound and tensor bounds **
  "clip_min_only": (lambda t: t.clip(-0.5), lambda t: t.clamp(min=-0.5), (rand(3, 4),), {}),
  "clip_max_only": (lambda t: t.clip(None, 0.5), lambda t: t.clamp(max=0.5), (rand(3, 4),), {}),
  "clamp_min_kw": (lambda t: t.clamp(min=-0.5), lambda t: t.clamp(min=-0.5), (rand(3, 4),), {}),
  "clamp_max_kw": (lambda t: t.clamp(max=0.25), lambda t: t.clamp(max=0.25), (rand(3, 4),), {}),
  "clip_tensor_bounds": (lambda t, lo, hi: t.clip(lo, hi), lambda t, lo, hi: t.clamp(lo, hi),
                         (rand(3, 4), rand(4) - 0.5, rand(3, 1) + 0.5), {}),
  "clip_tensor_min_only": (lambda t, lo: t.clamp(min=lo), lambda t, lo: t.clamp(min=lo), (rand(3, 4), rand(3, 4)), {}),
  "clip_tensor_max_only": (lambda t, hi: t.clamp(max=hi), lambda t, hi: t.clamp(max=hi), (rand(3, 4), rand(4)), {}),
  "clip_min_gt_max": (lambda t: t.clip(1.0, -1.0), lambda t: t.clamp(1.0, -1.0), (rand(5),), {}),
  "clip_nan": (lambda t: t.clip(-1.0, 1.0), lambda t: t.clamp(-1.0, 1.0), (NAN,), {}),
  "clip_nan_tensor_bound": (lambda t, lo: t.clip(lo), lambda t, lo: t.clamp(min=lo), (rand(6), NAN), {}),
  "clip_int_min": (lambda t: t.clip(0), lambda t: t.clamp(min=0), (ints(7),), {}),
  "clip_int_max_only": (lambda t: t.clamp(max=3), lambda t: t.clamp(max=3), (ints(7),), {}),
  "clip_int_float_bound": (lambda t: t.clip(-1.5, 2.5), lambda t: t.clamp(-1.5, 2.5), (ints(7),), {}),
  "clip_at_bound_grad": (lambda t: t.clip(0.0, 1.0), lambda t: t.clamp(0.0, 1.0),
                         (np.array([0.0, 1.0, 0.5, -1.0, 2.0], np.float32),), {}),
  # ** div rounding modes **
  "div_trunc_float": (lambda a, b: a.div(b, rounding_mode="trunc"), lambda a, b: a.div(b, rounding_mode="trunc"),
                      (rand(4, 5) * 10, rand(4, 5)), {}),
  "div_floor_float": (lambda a, b: a.div(b, rounding_mode="floor"), lambda a, b: a.div(b, rounding_mode="floor"),
                      (rand(4, 5) * 10, rand(5)), {}),
  "div_floor_exact": (lambda a: a.div(0.1, rounding_mode="floor"), lambda a: a.div(0.1, rounding_mode="floor"),
                      (np.array([1.0, -1.0, 0.3, 7.0, -0.7], np.float32),), {}),
  "floordiv_op_float": (lambda a: a // 0.1, lambda a: a // 0.1, (np.array([1.0, -1.0, 0.7, 3.0], np.float32),),
                        {"grad": False}),  # torch's floor_divide has no derivative
  "remainder_float": (lambda a, b: a % b, lambda a, b: a % b,
                      (np.array([1.0, -1.0, 0.7, 3.0, 5.5], np.float32),
                       np.array([0.1, 0.1, -0.1, 0.3, -2.0], np.float32)),
                      {}),
  # infinite operands as torch (Python's divmod): inf // b and inf % b are NaN; a // inf is 0 or -1, a % inf a or inf
  "floordiv_infinities": (lambda a, b: a // b, lambda a, b: a // b, INF_PAIRS, {"grad": False}),
  "remainder_infinities": (lambda a, b: a % b, lambda a, b: a % b, INF_PAIRS, {"grad": False}),
  "div_trunc_int": (lambda a, b: a.div(b, rounding_mode="trunc"), lambda a, b: a.div(b, rounding_mode="trunc"),
                    (ints(4, 5), ints(4, 5, low=1, high=5) * np.array([1, -1, 1, -1, 1], np.int32)), {}),
  "div_floor_int": (lambda a, b: a.div(b, rounding_mode="floor"), lambda a, b: a.div(b, rounding_mode="floor"),
                    (ints(4, 5), ints(5, low=1, high=5) * np.array([1, -1, 1, -1, 1], np.int32)), {}),
  "div_floor_int_scalar": (lambda a: a.div(-3, rounding_mode="floor"), lambda a: a.div(-3, rounding_mode="floor"),
                           (ints(9),), {}),
  "div_floor_int_by_float": (lambda a: a.div(2.5, rounding_mode="floor"), lambda a: a.div(2.5, rounding_mode="floor"),
                             (ints(9),), {}),
  "div_trunc_int_by_float": (lambda a: a.div(2.5, rounding_mode="trunc"), lambda a: a.div(2.5, rounding_mode="trunc"),
                             (ints(9),), {}),
  "div_true_int": (lambda a, b: a.div(b), lambda a, b: a.div(b), (ints(6), ints(6, low=1, high=4)), {}),
  "div_floor_by_zero_float": (lambda a, b: a.div(b, rounding_mode="floor"),
                              lambda a, b: a.div(b, rounding_mode="floor"),
                              (np.array([1.0, -1.0, 0.0], np.float32), np.zeros(3, np.float32)), {}),
  "div_trunc_by_zero_float": (lambda a, b: a.div(b, rounding_mode="trunc"),
                              lambda a, b: a.div(b, rounding_mode="trunc"),
                              (np.array([1.0, -1.0, 0.0], np.float32), np.zeros(3, np.float32)), {}),
  # ** squeeze of several dims, permute/reshape/view/expand/repeat/flip spellings **
  "squeeze_tuple": (lambda t: t.squeeze((0, 2)), lambda t: t.squeeze((0, 2)), (rand(1, 3, 1, 4, 1),), {}),
  "squeeze_tuple_neg": (lambda t: t.squeeze((-1, 1)), lambda t: t.squeeze((-1, 1)), (rand(1, 3, 1, 4, 1),), {}),
  "squeeze_tuple_non1": (lambda t: t.squeeze((1, 2)), lambda t: t.squeeze((1, 2)), (rand(1, 3, 1, 4, 1),), {}),
  "squeeze_list": (lambda t: t.squeeze([0, 4]), lambda t: t.squeeze([0, 4]), (rand(1, 3, 1, 4, 1),), {}),
  "squeeze_empty_tuple": (lambda t: t.squeeze(()), lambda t: t.squeeze(()), (rand(1, 3, 1),), {}),
  "squeeze_0d": (lambda t: t.squeeze(0), lambda t: t.squeeze(0), (np.array(2.0, np.float32),), {}),
  "squeeze_0d_neg": (lambda t: t.squeeze(-1), lambda t: t.squeeze(-1), (np.array(2.0, np.float32),), {}),
  "permute_neg": (lambda t: t.permute(-1, 0, -2), lambda t: t.permute(-1, 0, -2), (X3,), {}),
  "permute_tuple": (lambda t: t.permute((2, 0, 1)), lambda t: t.permute((2, 0, 1)), (X3,), {}),
  "permute_list": (lambda t: t.permute([1, 2, 0]), lambda t: t.permute([1, 2, 0]), (X3,), {}),
  "permute_0d": (lambda t: t.permute(()), lambda t: t.permute(()), (np.array(2.0, np.float32),), {}),
  "reshape_neg1": (lambda t: t.reshape(-1, 6), lambda t: t.reshape(-1, 6), (X3,), {}),
  "reshape_tuple": (lambda t: t.reshape((4, -1)), lambda t: t.reshape((4, -1)), (X3,), {}),
  "reshape_list": (lambda t: t.reshape([2, 2, -1, 3]), lambda t: t.reshape([2, 2, -1, 3]), (X3,), {}),
  "reshape_to_0d": (lambda t: t.reshape(()), lambda t: t.reshape(()), (rand(1, 1),), {}),
  "reshape_zero_size": (lambda t: t.reshape(3, 0, 5), lambda t: t.reshape(3, 0, 5), (rand(2, 0, 3),), {}),
  "reshape_flat": (lambda t: t.reshape(-1), lambda t: t.reshape(-1), (X3,), {}),
  "view_varargs": (lambda t: t.view(6, 4), lambda t: t.view(6, 4), (X3,), {}),
  "view_tuple": (lambda t: t.view((3, -1)), lambda t: t.view((3, -1)), (X3,), {}),
  "view_list_neg": (lambda t: t.view([-1]), lambda t: t.view([-1]), (X3,), {}),
  "expand_neg1": (lambda t: t.expand(-1, 4, -1), lambda t: t.expand(-1, 4, -1), (rand(3, 1, 2),), {}),
  "expand_tuple_new": (lambda t: t.expand((2, 3, 4, 2)), lambda t: t.expand((2, 3, 4, 2)), (rand(3, 1, 2),), {}),
  "expand_list_neg": (lambda t: t.expand([5, -1, -1, 2]), lambda t: t.expand([5, -1, -1, 2]), (rand(3, 1, 2),), {}),
  "expand_0d": (lambda t: t.expand(2, 3), lambda t: t.expand(2, 3), (np.array(1.5, np.float32),), {}),
  "expand_to_zero": (lambda t: t.expand(0, 3), lambda t: t.expand(0, 3), (rand(1, 3),), {}),
  "repeat_tuple": (lambda t: t.repeat((2, 1, 3)), lambda t: t.repeat((2, 1, 3)), (rand(3, 2),), {}),
  "repeat_list": (lambda t: t.repeat([1, 2]), lambda t: t.repeat([1, 2]), (rand(3, 2),), {}),
  "repeat_zero": (lambda t: t.repeat(0, 2), lambda t: t.repeat(0, 2), (rand(3, 2),), {}),
  "repeat_0d": (lambda t: t.repeat(3), lambda t: t.repeat(3), (np.array(1.5, np.float32),), {}),
  "flip_neg": (lambda t: t.flip(-1), lambda t: t.flip(-1), (X3,), {}),
  "flip_tuple": (lambda t: t.flip((0, 2)), lambda t: t.flip((0, 2)), (X3,), {}),
  "flip_list": (lambda t: t.flip([1, -1]), lambda t: t.flip([1, -1]), (X3,), {}),
  "flip_varargs": (lambda t: t.flip(0, 1), lambda t: t.flip(0, 1), (X3,), {}),
  "flip_empty": (lambda t: t.flip(()), lambda t: t.flip(()), (X3,), {}),
  # ** stack / cat of tuples, lists and many inputs **
  "cat_list": (lambda a, b: Tensor.cat([a, b], dim=1), lambda a, b: torch.cat([a, b], 1), (rand(2, 3), rand(2, 4)), {}),
  "cat_tuple": (lambda a, b: Tensor.cat((a, b), dim=-1), lambda a, b: torch.cat((a, b), -1), (rand(2, 3), rand(2, 1)),
                {}),
  "cat_method_list": (lambda a, b, c: a.cat([b, c]), lambda a, b, c: torch.cat([a, b, c]),
                      (rand(1, 3), rand(2, 3), rand(3, 3)), {}),
  "cat_single": (lambda a: Tensor.cat([a]), lambda a: torch.cat([a]), (rand(2, 3),), {}),
  "cat_zero_size": (lambda a, b: Tensor.cat([a, b], 0), lambda a, b: torch.cat([a, b]), (rand(0, 3), rand(2, 3)), {}),
  "cat_mixed_dtypes": (lambda a, b: Tensor.cat([a, b]), lambda a, b: torch.cat([a, b]), (rand(2), ints(3)), {}),
  "stack_list": (lambda a, b: Tensor.stack([a, b], dim=1), lambda a, b: torch.stack([a, b], 1),
                 (rand(2, 3), rand(2, 3)), {}),
  "stack_tuple_neg": (lambda a, b: Tensor.stack((a, b), dim=-1), lambda a, b: torch.stack((a, b), -1),
                      (rand(2, 3), rand(2, 3)), {}),
  "stack_method_list": (lambda a, b, c: a.stack([b, c]), lambda a, b, c: torch.stack([a, b, c]),
                        (rand(3), rand(3), rand(3)), {}),
  "stack_0d": (lambda a, b: Tensor.stack([a, b]), lambda a, b: torch.stack([a, b]),
               (np.array(1.0, np.float32), np.array(2.0, np.float32)), {}),
  "cat_100": (lambda *ts: Tensor.cat(list(ts), dim=1), lambda *ts: torch.cat(ts, 1),
              tuple(rand(2, 1 + i % 3) for i in range(100)), {}),
  "stack_100": (lambda *ts: Tensor.stack(ts, dim=0), lambda *ts: torch.stack(ts, 0), tuple(rand(3) for _ in range(100)),
                {}),
  # ** pad modes at every rank torch supports **
  **{f"pad_{mode}_{len(shape)}d_{'_'.join(map(str, pads))}": (
      functools.partial(lambda t, m, p: t.pad(p, mode=m), m=mode, p=pads),
      functools.partial(lambda t, m, p: F.pad(t, p, mode=m), m=mode, p=pads), (rand(*shape),), {})
    for mode in ("reflect", "replicate", "circular")
    for shape, pads in (((2, 5), (2, 1)), ((2, 3, 5), (1, 3)), ((2, 4, 5), (2, 1, 0, 3)), ((1, 2, 4, 5), (1, 2, 3, 1)),
                        ((1, 2, 3, 4, 5), (1, 2, 0, 2, 2, 1)), ((2, 3, 4, 5), (1, 1, 2, 2, 1, 0)),
                        ((2, 3, 4), (-1, 2)), ((2, 3, 5), (2, -2)))},
  "pad_constant_value": (lambda t: t.pad((1, 2, 0, 1), value=-3.5), lambda t: F.pad(t, (1, 2, 0, 1), value=-3.5),
                         (rand(2, 3),), {}),
  "pad_constant_negative": (lambda t: t.pad((-1, 2, 1, -1)), lambda t: F.pad(t, (-1, 2, 1, -1)), (rand(3, 4),), {}),
  "pad_reflect_int": (lambda t: t.pad((2, 1), mode="reflect"), lambda t: F.pad(t, (2, 1), mode="reflect"),
                      (ints(2, 4),), {}),
  # ** dot / matmul rules **
  "dot_1d": (lambda a, b: a.dot(b), lambda a, b: torch.dot(a, b), (rand(5), rand(5)), {}),
  "matmul_1d_2d": (lambda a, b: a @ b, lambda a, b: a @ b, (rand(4), rand(4, 3)), {}),
  "matmul_2d_1d": (lambda a, b: a @ b, lambda a, b: a @ b, (rand(3, 4), rand(4)), {}),
  "matmul_1d_3d": (lambda a, b: a.matmul(b), lambda a, b: a.matmul(b), (rand(4), rand(2, 4, 3)), {}),
  "matmul_3d_1d": (lambda a, b: a.matmul(b), lambda a, b: a.matmul(b), (rand(2, 3, 4), rand(4)), {}),
  "matmul_broadcast": (lambda a, b: a @ b, lambda a, b: a @ b, (rand(2, 1, 3, 4), rand(5, 4, 2)), {}),
  "matmul_int": (lambda a, b: a @ b, lambda a, b: a @ b, (ints(3, 4), ints(4, 2)), {}),
  "matmul_zero_inner": (lambda a, b: a @ b, lambda a, b: a @ b, (rand(3, 0), rand(0, 2)), {}),
  # ** einsum **
  "einsum_trace": (lambda a: Tensor.einsum("ii", a), lambda a: torch.einsum("ii", a), (rand(4, 4),), {}),
  "einsum_diag_keep": (lambda a: Tensor.einsum("ii->i", a), lambda a: torch.einsum("ii->i", a), (rand(4, 4),), {}),
  "einsum_batch_diag": (lambda a: Tensor.einsum("bii->bi", a), lambda a: torch.einsum("bii->bi", a), (rand(2, 3, 3),),
                        {}),
  "einsum_iij": (lambda a: Tensor.einsum("iij->j", a), lambda a: torch.einsum("iij->j", a), (rand(3, 3, 2),), {}),
  "einsum_ell_front": (lambda a, b: Tensor.einsum("...ij,...jk->...ik", a, b),
                       lambda a, b: torch.einsum("...ij,...jk->...ik", a, b), (rand(2, 3, 4), rand(2, 4, 5)), {}),
  "einsum_ell_bcast": (lambda a, b: Tensor.einsum("...ij,...jk", a, b), lambda a, b: torch.einsum("...ij,...jk", a, b),
                       (rand(2, 1, 3, 4), rand(5, 4, 2)), {}),
  "einsum_ell_mid": (lambda a: Tensor.einsum("i...j->j...i", a), lambda a: torch.einsum("i...j->j...i", a),
                     (rand(2, 3, 4, 5),), {}),
  "einsum_ell_sum": (lambda a: Tensor.einsum("...i->i", a), lambda a: torch.einsum("...i->i", a), (rand(2, 3, 4),), {}),
  "einsum_ell_out_none": (lambda a: Tensor.einsum("ij->...", a), lambda a: torch.einsum("ij->...", a), (rand(2, 3),),
                          {}),
  "einsum_upper_and_ell": (lambda a, b: Tensor.einsum("...A,...A->...", a, b),
                           lambda a, b: torch.einsum("...A,...A->...", a, b), (rand(2, 3, 4), rand(3, 4)), {}),
  "einsum_ell_empty": (lambda a, b: Tensor.einsum("...i,...i->...", a, b),
                       lambda a, b: torch.einsum("...i,...i->...", a, b), (rand(4), rand(4)), {}),
  "einsum_implicit_order": (lambda a, b: Tensor.einsum("ba,ac", a, b), lambda a, b: torch.einsum("ba,ac", a, b),
                            (rand(3, 4), rand(4, 2)), {}),
  "einsum_outer3": (lambda a, b, c: Tensor.einsum("i,j,k->kji", a, b, c),
                    lambda a, b, c: torch.einsum("i,j,k->kji", a, b, c), (rand(2), rand(3), rand(4)), {}),
  "einsum_list_operands": (lambda a, b: Tensor.einsum("ij,jk", [a, b]), lambda a, b: torch.einsum("ij,jk", [a, b]),
                           (rand(2, 3), rand(3, 2)), {}),
  "einsum_size1_bcast": (lambda a, b: Tensor.einsum("ij,ij->ij", a, b), lambda a, b: torch.einsum("ij,ij->ij", a, b),
                         (rand(3, 1), rand(3, 4)), {}),
  "einsum_spaces": (lambda a, b: Tensor.einsum("i j , j k -> i k", a, b),
                    lambda a, b: torch.einsum("i j , j k -> i k", a, b), (rand(2, 3), rand(3, 2)), {}),
  "einsum_int": (lambda a, b: Tensor.einsum("ij,jk->ik", a, b), lambda a, b: torch.einsum("ij,jk->ik", a, b),
                 (ints(2, 3), ints(3, 2)), {}),
  # ** sum / prod with dtype= **
  "sum_dtype_f64": (lambda t: t.sum(dtype=dtypes.float64), lambda t: t.sum(dtype=torch.float64), (rand(3, 4),), {}),
  "sum_int_dtype_f32": (lambda t: t.sum(1, dtype=dtypes.float32), lambda t: t.sum(1, dtype=torch.float32),
                        (ints(3, 4),), {}),
  "sum_bool_dtype": (lambda t: (t > 0).sum(0, dtype=dtypes.int16), lambda t: (t > 0).sum(0, dtype=torch.int16),
                     (rand(3, 4),), {}),
  "sum_half_dtype_f32": (lambda t: t.half().sum(dtype=dtypes.float32), lambda t: t.half().sum(dtype=torch.float32),
                         (rand(3, 4),), {"tol": 1e-3}),
  "sum_dtype_str": (lambda t: t.sum(0, keepdim=True, dtype="float64"),
                    lambda t: t.sum(0, keepdim=True, dtype=torch.float64), (rand(3, 4),), {}),
  "prod_dtype": (lambda t: t.prod(1, dtype=dtypes.float64), lambda t: t.prod(1, dtype=torch.float64), (rand(3, 4),),
                 {}),
  "prod_int_dtype_f32": (lambda t: t.prod(0, dtype=dtypes.float32), lambda t: t.prod(0, dtype=torch.float32),
                         (ints(3, 4),), {}),
  "prod_int": (lambda t: t.prod(1), lambda t: t.prod(1), (ints(3, 4, low=-3, high=4),), {"dtype": np.int32}),
  "sum_int8_wraps_not": (lambda t: t.cast(dtypes.int8).sum(), lambda t: t.to(torch.int8).sum(),
                         (ints(40, low=100, high=127),), {"dtype": np.int32}),
  # ** shifts with tensor or int operands **
  "lshift_int": (lambda t: t << 3, lambda t: t << 3, (ints(6, low=0, high=100),), {}),
  "rshift_int": (lambda t: t >> 2, lambda t: t >> 2, (ints(6, low=-100, high=100),), {}),
  "lshift_tensor": (lambda a, b: a << b, lambda a, b: a << b, (ints(6, low=0, high=100), ints(6, low=0, high=8)), {}),
  "rshift_tensor": (lambda a, b: a >> b, lambda a, b: a >> b, (ints(6, low=-100, high=100), ints(6, low=0, high=8)),
                    {}),
  "rlshift_int": (lambda b: 3 << b, lambda b: 3 << b, (ints(6, low=0, high=8),), {}),
  "rrshift_int": (lambda b: 1000 >> b, lambda b: 1000 >> b, (ints(6, low=0, high=8),), {}),
  "lshift_broadcast": (lambda a, b: a << b, lambda a, b: a << b, (ints(3, 1, low=0, high=50), ints(4, low=0, high=5)),
                       {}),
  "lshift_method": (lambda a, b: a.lshift(b), lambda a, b: a << b, (ints(5, low=0, high=50), ints(5, low=0, high=5)),
                    {}),
  "rshift_method_int": (lambda a: a.rshift(1), lambda a: a >> 1, (ints(5, low=-50, high=50),), {}),
  "lshift_wide": (lambda a, b: a << b, lambda a, b: a << b,
                  (ints(4, low=1, high=5), np.array([31, 32, 33, 40], np.int32)),
                  {}),
  "rshift_wide": (lambda a, b: a >> b, lambda a, b: a >> b,
                  (np.array([-5, 5, -1, 7], np.int32), np.array([31, 32, 35, 40], np.int32)), {}),
  "shift_uint8": (lambda a: (a.cast(dtypes.uint8) << 3) >> 1, lambda a: (a.to(torch.uint8) << 3) >> 1,
                  (ints(5, low=0, high=255),), {"dtype": np.uint8}),
  # ** argmin / argmax / min / max / minimum / maximum with NaN and ints **
  "argmax_nan": (lambda t: t.argmax(), lambda t: t.argmax(), (NAN,), {"dtype": np.int32}),
  "argmin_nan": (lambda t: t.argmin(), lambda t: t.argmin(), (NAN,), {"dtype": np.int32}),
  "argmax_nan_axis": (lambda t: t.argmax(1), lambda t: t.argmax(1), (WITH_NAN,), {"dtype": np.int32}),
  "argmin_nan_axis0": (lambda t: t.argmin(0, keepdim=True), lambda t: t.argmin(0, keepdim=True), (WITH_NAN,),
                       {"dtype": np.int32}),
  "max_nan": (lambda t: t.max(), lambda t: t.max(), (NAN,), {}),
  "min_nan": (lambda t: t.min(), lambda t: t.min(), (NAN,), {}),
  "max_nan_axis": (lambda t: t.max(1), lambda t: t.max(1).values, (WITH_NAN,), {}),
  "min_nan_axis": (lambda t: t.min(0), lambda t: t.min(0).values, (WITH_NAN,), {}),
  "maximum_nan": (lambda a, b: a.maximum(b), lambda a, b: torch.maximum(a, b), (NAN, rand(6)), {}),
  "minimum_nan": (lambda a, b: a.minimum(b), lambda a, b: torch.minimum(a, b), (rand(6), NAN), {}),
  "maximum_ties_grad": (lambda a, b: a.maximum(b), lambda a, b: torch.maximum(a, b),
                        (np.array([1.0, 2.0, 3.0], np.float32), np.array([1.0, 1.0, 4.0], np.float32)), {}),
  "minimum_ties_grad": (lambda a, b: a.minimum(b), lambda a, b: torch.minimum(a, b),
                        (np.array([1.0, 2.0, 3.0], np.float32), np.array([1.0, 1.0, 4.0], np.float32)), {}),
  "maximum_int": (lambda a, b: a.maximum(b), lambda a, b: torch.maximum(a, b), (ints(7), ints(7)), {}),
  "minimum_int": (lambda a, b: a.minimum(b), lambda a, b: torch.minimum(a, b), (ints(7), ints(7)), {}),
  "minimum_int_min": (lambda a, b: a.minimum(b), lambda a, b: torch.minimum(a, b),
                      (np.array([-2**31, 5, -2**31], np.int32), np.array([0, -2**31, 3], np.int32)), {}),
  "max_int_min": (lambda t: t.min(), lambda t: t.min(), (np.array([-2**31, 5, 7], np.int32),), {}),
  "argmin_int_min": (lambda t: t.argmin(), lambda t: t.argmin(), (np.array([3, -2**31, 5, -2**31], np.int32),),
                     {"dtype": np.int32}),
  "minimum_bcast_scalar": (lambda a: a.minimum(0.5), lambda a: torch.minimum(a, torch.tensor(0.5)), (NAN,), {}),
  "argmax_int": (lambda t: t.argmax(0), lambda t: t.argmax(0), (ints(4, 3),), {"dtype": np.int32}),
  "argmin_bool": (lambda t: (t > 0).argmin(1), lambda t: (t > 0).to(torch.uint8).argmin(1), (rand(4, 5),),
                  {"dtype": np.int32}),
  # ** diagonal offsets and dims **
  **{f"diagonal_{off}_{d1}_{d2}": (
      functools.partial(lambda t, o, a, b: t.diagonal(o, a, b), o=off, a=d1, b=d2),
      functools.partial(lambda t, o, a, b: torch.diagonal(t, o, a, b), o=off, a=d1, b=d2), (rand(3, 4, 5),), {})
    for off, d1, d2 in ((0, 0, 1), (2, 0, 2), (-2, 2, 0), (1, -1, -3), (-1, -2, -1), (4, 0, 1), (-3, 0, 1),
                        (9, 1, 2), (-9, 1, 2), (0, 2, 1))},
  # ** gather with broadcast-shaped (smaller) indices **
  "gather_small_index": (lambda t: t.gather(1, E(np.array([[0, 2], [1, 1]], np.int32))),
                         lambda t: t.gather(1, torch.tensor([[0, 2], [1, 1]])), (rand(3, 4),), {}),
  "gather_small_index_dim0": (lambda t: t.gather(0, E(np.array([[2], [0]], np.int32))),
                              lambda t: t.gather(0, torch.tensor([[2], [0]])), (rand(3, 4),), {}),
  "gather_neg_dim_3d": (lambda t: t.gather(-2, E(np.array([[[1, 0]], [[2, 2]]], np.int32))),
                        lambda t: t.gather(-2, torch.tensor([[[1, 0]], [[2, 2]]])), (rand(2, 3, 4),), {}),
  "gather_larger_on_dim": (lambda t: t.gather(1, E(np.array([[0, 3, 3, 1, 2, 0]], np.int32))),
                           lambda t: t.gather(1, torch.tensor([[0, 3, 3, 1, 2, 0]])), (rand(3, 4),), {}),
  "gather_neg_index_value": (lambda t: t.gather(1, E(np.array([[0, 1]], np.int32))),
                             lambda t: t.gather(1, torch.tensor([[0, 1]])), (rand(2, 2),), {}),
  "gather_int": (lambda t: t.gather(1, E(np.array([[0], [2], [1]], np.int32))),
                 lambda t: t.gather(1, torch.tensor([[0], [2], [1]])), (ints(3, 4),), {}),
  "gather_0d": (lambda t: t.gather(0, E(np.array(0, np.int32))), lambda t: t.gather(0, torch.tensor(0)),
                (np.array(3.0, np.float32),), {}),
  # ** scatter with tensor src and reduce, scatter_reduce in every mode **
  "scatter_src_bigger": (lambda t, s: t.scatter(1, E(np.array([[0, 2], [3, 1]], np.int32)), s),
                         lambda t, s: t.scatter(1, torch.tensor([[0, 2], [3, 1]]), s), (rand(3, 4), rand(3, 5)),
                         {"grad": False}),  # torch 2.13's backward rejects a src larger than index
  "scatter_add_dup": (lambda t, s: t.scatter(0, E(np.array([[0, 1, 0], [0, 1, 0]], np.int32)), s, reduce="add"),
                      lambda t, s: t.scatter(0, torch.tensor([[0, 1, 0], [0, 1, 0]]), s, reduce="add"),
                      (rand(2, 3), rand(2, 3)), {"grad": False}),
  "scatter_mul_dup": (lambda t, s: t.scatter(1, E(np.array([[0, 0, 1]], np.int32)), s, reduce="multiply"),
                      lambda t, s: t.scatter(1, torch.tensor([[0, 0, 1]]), s, reduce="multiply"),
                      (rand(2, 3), rand(2, 3)), {"grad": False}),
  "scatter_scalar_add": (lambda t: t.scatter(1, E(np.array([[0, 0, 1]], np.int32)), 2.0, reduce="add"),
                         lambda t: t.scatter(1, torch.tensor([[0, 0, 1]]), 2.0, reduce="add"), (rand(2, 3),),
                         {"grad": False}),
  "scatter_int_add": (lambda t, s: t.scatter(0, E(np.array([[1, 1], [1, 0]], np.int32)), s, reduce="add"),
                      lambda t, s: t.scatter(0, torch.tensor([[1, 1], [1, 0]]), s, reduce="add"),
                      (ints(2, 2), ints(2, 2)), {}),
  **{f"scatter_reduce_{mode}_{inc}": (
      functools.partial(lambda t, s, m, i: t.scatter_reduce(1, E(np.array([[0, 2, 0, 2], [1, 1, 1, 3]], np.int32)), s,
                                                            m, include_self=i), m=mode, i=inc),
      functools.partial(lambda t, s, m, i: t.scatter_reduce(1, torch.tensor([[0, 2, 0, 2], [1, 1, 1, 3]]), s, m,
                                                            include_self=i), m=mode, i=inc),
      (rand(2, 5), rand(2, 4)), {"grad": mode in ("sum", "mean")})
    for mode in ("sum", "prod", "mean", "amax", "amin") for inc in (True, False)},
  **{f"scatter_reduce_int_{mode}_{inc}": (
      functools.partial(lambda t, s, m, i: t.scatter_reduce(0, E(np.array([0, 2, 0, 2, 1], np.int32)), s, m,
                                                            include_self=i), m=mode, i=inc),
      functools.partial(lambda t, s, m, i: t.scatter_reduce(0, torch.tensor([0, 2, 0, 2, 1]), s, m,
                                                            include_self=i), m=mode, i=inc),
      (ints(4), ints(5)), {})
    for mode in ("sum", "prod", "mean", "amax", "amin") for inc in (True, False)},
  # ** interpolate on uint8 keeps uint8 **
  **{f"interpolate_uint8_{mode}": (
      functools.partial(lambda t, m: t.cast(dtypes.uint8).interpolate(size=(5, 7), mode=m), m=mode),
      functools.partial(lambda t, m: F.interpolate(t.to(torch.uint8), size=(5, 7), mode=m), m=mode),
      (ints(1, 2, 3, 4, low=0, high=255),), {"atol": 1, "rtol": 0})
    for mode in ("bilinear", "nearest", "nearest-exact")},
  "interpolate_uint8_bilinear_ac": (lambda t: t.cast(dtypes.uint8).interpolate(size=(7, 3), mode="bilinear",
                                                                                  align_corners=True),
                                    lambda t: F.interpolate(t.to(torch.uint8), size=(7, 3), mode="bilinear",
                                                            align_corners=True),
                                    (ints(2, 1, 4, 5, low=0, high=255),), {"atol": 1, "rtol": 0}),
  # ** sdpa: causal with L != S, masks, scale, gqa **
  "sdpa_causal_short_q": (lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
                          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                          (rand(1, 2, 3, 4), rand(1, 2, 6, 4), rand(1, 2, 6, 5)), {}),
  "sdpa_causal_long_q": (lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
                         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                         (rand(2, 5, 4), rand(2, 3, 4), rand(2, 3, 2)), {}),
  "sdpa_bool_mask_bcast": (lambda q, k, v: q.scaled_dot_product_attention(k, v,
                                                                          attn_mask=E(np.tril(np.ones((4, 4), bool)))),
                           lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                          attn_mask=T(np.tril(np.ones((4, 4), bool)))),
                           (rand(2, 2, 4, 3), rand(2, 2, 4, 3), rand(2, 2, 4, 3)), {}),
  "sdpa_float_mask_scale": (lambda q, k, v, m: q.scaled_dot_product_attention(k, v, attn_mask=m, scale=0.7,
                                                                              dropout_p=0.0),
                            lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.7),
                            (rand(2, 3, 4), rand(2, 5, 4), rand(2, 5, 3), rand(3, 5)), {}),
  "sdpa_gqa_causal": (lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True, enable_gqa=True),
                      lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                      (rand(1, 4, 3, 4), rand(1, 2, 5, 4), rand(1, 2, 5, 4)), {}),
  # ** avg_pool2d / max_unpool2d edge shapes **
  "avg_pool_divisor": (lambda t: t.avg_pool2d(2, divisor_override=3), lambda t: F.avg_pool2d(t, 2, divisor_override=3),
                       (rand(1, 2, 5, 4),), {}),
  "avg_pool_divisor_pad": (lambda t: t.avg_pool2d(3, 2, 1, ceil_mode=True, divisor_override=2),
                           lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, divisor_override=2),
                           (rand(1, 1, 6, 5),), {}),
  "avg_pool_ceil_nopad": (lambda t: t.avg_pool2d(2, ceil_mode=True), lambda t: F.avg_pool2d(t, 2, ceil_mode=True),
                          (rand(1, 1, 5, 5),), {}),
  "avg_pool_ceil_excl": (lambda t: t.avg_pool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                         lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                         (rand(2, 1, 6, 6),), {}),
  "avg_pool_3d_input": (lambda t: t.avg_pool2d((2, 2)), lambda t: F.avg_pool2d(t, (2, 2)), (rand(2, 4, 6),), {}),
  "avg_pool_1x1": (lambda t: t.avg_pool2d(1), lambda t: F.avg_pool2d(t, 1), (rand(1, 2, 3, 3),), {}),
  "avg_pool_stride_big": (lambda t: t.avg_pool2d(2, stride=5), lambda t: F.avg_pool2d(t, 2, stride=5),
                          (rand(1, 1, 7, 7),), {}),
  "avg_pool_int_stride_tuple": (lambda t: t.avg_pool2d((3, 1), stride=(1, 2), padding=(1, 0)),
                                lambda t: F.avg_pool2d(t, (3, 1), stride=(1, 2), padding=(1, 0)), (rand(1, 1, 4, 5),),
                                {}),
  # ** conv2d padding spellings **
  "conv_same_odd": (lambda x, w: x.conv2d(w, padding="same"), lambda x, w: F.conv2d(x, w, padding="same"),
                    (rand(1, 2, 5, 6), rand(3, 2, 3, 3)), {}),
  "conv_same_even": (lambda x, w: x.conv2d(w, padding="same"), lambda x, w: F.conv2d(x, w, padding="same"),
                     (rand(1, 2, 5, 6), rand(3, 2, 2, 4)), {}),
  "conv_same_dilation": (lambda x, w: x.conv2d(w, padding="same", dilation=2),
                         lambda x, w: F.conv2d(x, w, padding="same", dilation=2), (rand(1, 2, 7, 6), rand(3, 2, 2, 3)),
                         {}),
  "conv_same_1d": (lambda x, w: x.conv2d(w, padding="same"), lambda x, w: F.conv1d(x, w, padding="same"),
                   (rand(2, 2, 9), rand(3, 2, 4)), {}),
  "conv_valid": (lambda x, w: x.conv2d(w, padding="valid"), lambda x, w: F.conv2d(x, w, padding="valid"),
                 (rand(1, 2, 5, 6), rand(3, 2, 3, 3)), {}),
  "conv_padding_tuple": (lambda x, w: x.conv2d(w, padding=(2, 1)), lambda x, w: F.conv2d(x, w, padding=(2, 1)),
                         (rand(1, 2, 5, 6), rand(3, 2, 3, 3)), {}),
}

@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name: str) -> None:
  ours, ref, arrays, kw = CASES[name]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torch's scatter(reduce=) deprecation
    check(ours, ref, *arrays, **kw)

# ** creation: arange / linspace / meshgrid dtypes **

CREATION: dict[str, tuple[Callable[[], Tensor], Callable[[], Any], Any]] = {
  "arange_int": (lambda: Tensor.arange(5), lambda: torch.arange(5, dtype=torch.int32), None),
  "arange_int_step": (lambda: Tensor.arange(10, 1, -3), lambda: torch.arange(10, 1, -3, dtype=torch.int32), None),
  "arange_float_start": (lambda: Tensor.arange(0.5, 4), lambda: torch.arange(0.5, 4), None),
  "arange_float_step": (lambda: Tensor.arange(0, 2, 0.25), lambda: torch.arange(0, 2, 0.25), None),
  "arange_float_neg_step": (lambda: Tensor.arange(1, -1, -0.3), lambda: torch.arange(1, -1, -0.3), None),
  "arange_dtype_float": (lambda: Tensor.arange(5, dtype=dtypes.float32), lambda: torch.arange(5, dtype=torch.float32),
                         None),
  "arange_dtype_int_float_args": (lambda: Tensor.arange(0.5, 5.5, 1.5, dtype=dtypes.int32),
                                  lambda: torch.arange(0.5, 5.5, 1.5, dtype=torch.int32), None),
  "arange_dtype_f64": (lambda: Tensor.arange(1, 2, 0.1, dtype=dtypes.float64),
                       lambda: torch.arange(1, 2, 0.1, dtype=torch.float64), None),
  "arange_dtype_int16": (lambda: Tensor.arange(-3, 7, 2, dtype=dtypes.int16),
                         lambda: torch.arange(-3, 7, 2, dtype=torch.int16), None),
  "arange_dtype_uint8": (lambda: Tensor.arange(250, 256, dtype=dtypes.uint8),
                         lambda: torch.arange(250, 256, dtype=torch.uint8), None),
  "arange_empty": (lambda: Tensor.arange(3, 3), lambda: torch.arange(3, 3, dtype=torch.int32), None),
  "arange_big_float": (lambda: Tensor.arange(0, 1000, 0.1), lambda: torch.arange(0, 1000, 0.1), None),
  "linspace_int_dtype": (lambda: Tensor.linspace(0, 10, 5, dtype=dtypes.int32),
                         lambda: torch.linspace(0, 10, 5, dtype=torch.int32), None),
  "linspace_int_dtype_neg": (lambda: Tensor.linspace(-7, 3, 6, dtype=dtypes.int32),
                             lambda: torch.linspace(-7, 3, 6, dtype=torch.int32), None),
  "linspace_int_args": (lambda: Tensor.linspace(0, 10, 4), lambda: torch.linspace(0, 10, 4), None),
  "linspace_f64": (lambda: Tensor.linspace(-1, 1, 7, dtype=dtypes.float64),
                   lambda: torch.linspace(-1, 1, 7, dtype=torch.float64), None),
  "linspace_one": (lambda: Tensor.linspace(2, 5, 1), lambda: torch.linspace(2, 5, 1), None),
  "linspace_zero": (lambda: Tensor.linspace(2, 5, 0), lambda: torch.linspace(2, 5, 0), None),
  "linspace_reverse": (lambda: Tensor.linspace(5, -5, 11), lambda: torch.linspace(5, -5, 11), None),
  "linspace_uint8": (lambda: Tensor.linspace(0, 255, 9, dtype=dtypes.uint8),
                     lambda: torch.linspace(0, 255, 9, dtype=torch.uint8), None),
}

@pytest.mark.parametrize("name", list(CREATION))
def test_creation_matches_torch(name: str) -> None:
  ours, ref, _ = CREATION[name]
  got, want = ours().numpy(), ref().numpy()
  assert got.dtype == want.dtype, f"dtype {got.dtype} != torch {want.dtype}"
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("shapes", [((3,), (4,)), ((2,), (3,), (4,)), ((5,),), ((1,), (3,)), ((0,), (2,)),
                                    ((2,), (3,), (1,), (2,))])
def test_meshgrid(indexing: str, shapes: tuple[tuple[int, ...], ...]) -> None:
  arrays = [rand(*s) for s in shapes]
  ts = [Tensor(a, requires_grad=True) for a in arrays]
  tt = [torch.tensor(a, requires_grad=True) for a in arrays]
  ours, want = ts[0].meshgrid(*ts[1:], indexing=indexing), torch.meshgrid(*tt, indexing=indexing)
  assert len(ours) == len(want)
  for o, w in zip(ours, want): np.testing.assert_array_equal(o.numpy(), w.detach().numpy())
  seeds = [rand(*w.shape) for w in want]
  if not all(s.size for s in seeds): return
  sum(((o * Tensor(s)).sum() for o, s in zip(ours, seeds)), Tensor(0.0)).backward()
  sum(((w * torch.tensor(s)).sum() for w, s in zip(want, seeds))).backward()
  for t, r in zip(ts, tt):
    assert t.grad is not None
    np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-5, atol=1e-5)

def test_meshgrid_static_and_list() -> None:
  a, b = rand(3), rand(2)
  both = (Tensor.meshgrid(Tensor(a), Tensor(b), indexing="xy"), Tensor.meshgrid([Tensor(a), Tensor(b)], indexing="xy"))
  for ours in both:
    for o, w in zip(ours, torch.meshgrid(torch.tensor(a), torch.tensor(b), indexing="xy")):
      np.testing.assert_array_equal(o.numpy(), w.numpy())

# ** data-dependent shapes: masked_select(size=), nonzero(size=, fill_value=) **

def test_nonzero_size_and_fill_value() -> None:
  data = np.array([[0, 3, 0], [5, 0, 0], [0, 0, 7]], np.int32)
  for size, fill in ((2, -1), (3, 0), (6, -9), (0, -1), (1, 4)):
    got = Tensor(data).nonzero(size=size, fill_value=fill)
    want = torch.tensor(data).nonzero_static(size=size, fill_value=fill)
    assert got.dtype == dtypes.int32 and got.shape == tuple(want.shape)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
  for arr in (np.array(3.0, np.float32), np.array(0.0, np.float32), np.zeros((2, 0), np.float32), rand(4) > 0):
    got, want = Tensor(arr).nonzero(), torch.tensor(arr).nonzero()
    assert got.shape == tuple(want.shape), arr
    np.testing.assert_array_equal(got.numpy(), want.numpy())
  got, want = Tensor(NAN).nonzero(size=8, fill_value=-1), torch.tensor(NAN).nonzero_static(size=8, fill_value=-1)
  np.testing.assert_array_equal(got.numpy(), want.numpy())

def test_masked_select_with_size() -> None:
  x, mask = rand(3, 4), rng.random((3, 4)) > 0.5
  want = torch.tensor(x).masked_select(torch.tensor(mask)).numpy()
  for size in (len(want), len(want) + 3, max(len(want) - 2, 0)):
    got = Tensor(x).masked_select(Tensor(mask), size=size).numpy()
    assert got.shape == (size,)
    n = min(size, len(want))
    np.testing.assert_array_equal(got[:n], want[:n])
    np.testing.assert_array_equal(got[n:], np.zeros(size - n, np.float32))
  got = Tensor(x).masked_select(Tensor(mask[0]), size=20, fill_value=-1.0).numpy()
  want = torch.tensor(x).masked_select(torch.tensor(mask[0])).numpy()
  np.testing.assert_array_equal(got[:len(want)], want)
  np.testing.assert_array_equal(got[len(want):], np.full(20 - len(want), -1.0, np.float32))
  t = Tensor(x, requires_grad=True)
  t.masked_select(Tensor(mask), size=5).sum().backward()
  tt = torch.tensor(x, requires_grad=True)
  flat = np.flatnonzero(mask)[:5]
  want_grad = np.zeros(12, np.float32)
  want_grad[flat] = 1.0
  tt.masked_select(torch.tensor(mask)).sum().backward()
  assert t.grad is not None
  np.testing.assert_array_equal(t.grad.numpy().reshape(-1), want_grad)

# ** bad calls: the builtin class torch raises, as an EmberError **

BAD: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
  "reshape_zero_size_neg": (lambda: Tensor.ones(2, 0, 3).reshape(0, -1, 3),
                            lambda: torch.ones(2, 0, 3).reshape(0, -1, 3)),
  "arange_step0": (lambda: Tensor.arange(0, 5, 0), lambda: torch.arange(0, 5, 0)),
  "arange_wrong_sign": (lambda: Tensor.arange(5, 0, 1), lambda: torch.arange(5, 0, 1)),
  "arange_wrong_sign_neg": (lambda: Tensor.arange(0, 5, -1), lambda: torch.arange(0, 5, -1)),
  "arange_float_wrong_sign": (lambda: Tensor.arange(1.0, 0.0, 0.5), lambda: torch.arange(1.0, 0.0, 0.5)),
  "linspace_neg": (lambda: Tensor.linspace(0, 1, -2), lambda: torch.linspace(0, 1, -2)),
  "div_bad_mode": (lambda: Tensor([1.0]).div(2, rounding_mode="round"),
                   lambda: torch.tensor([1.0]).div(2, rounding_mode="round")),
  "clamp_no_bound": (lambda: Tensor([1.0]).clamp(), lambda: torch.tensor([1.0]).clamp()),
  "meshgrid_bad_indexing": (lambda: Tensor([1.0]).meshgrid(Tensor([2.0]), indexing="ji"),
                            lambda: torch.meshgrid(torch.tensor([1.0]), torch.tensor([2.0]), indexing="ji")),
  "meshgrid_2d": (lambda: Tensor.ones(2, 2).meshgrid(Tensor([1.0])),
                  lambda: torch.meshgrid(torch.ones(2, 2), torch.tensor([1.0]), indexing="ij")),
  "squeeze_tuple_oob": (lambda: Tensor.ones(1, 2).squeeze((0, 2)), lambda: torch.ones(1, 2).squeeze((0, 2))),
  "squeeze_tuple_dup": (lambda: Tensor.ones(1, 2).squeeze((0, 0)), lambda: torch.ones(1, 2).squeeze((0, 0))),
  "stack_empty": (lambda: Tensor.stack([]), lambda: torch.stack([])),
  "cat_empty": (lambda: Tensor.cat([]), lambda: torch.cat([])),
  "pad_reflect_too_big": (lambda: Tensor.ones(1, 2, 3).pad((0, 3), mode="reflect"),
                          lambda: F.pad(torch.ones(1, 2, 3), (0, 3), mode="reflect")),
  "pad_circular_wraps": (lambda: Tensor.ones(1, 2, 3).pad((4, 0), mode="circular"),
                         lambda: F.pad(torch.ones(1, 2, 3), (4, 0), mode="circular")),
  "pad_replicate_zero_dim": (lambda: Tensor.ones(1, 2, 0).pad((1, 1), mode="replicate"),
                             lambda: F.pad(torch.ones(1, 2, 0), (1, 1), mode="replicate")),
  "pad_reflect_zero_dim": (lambda: Tensor.ones(1, 0, 3).pad((1, 1, 1, 1), mode="reflect"),
                           lambda: F.pad(torch.ones(1, 0, 3), (1, 1, 1, 1), mode="reflect")),
  "dot_mismatch": (lambda: Tensor.ones(3).dot(Tensor.ones(4)), lambda: torch.dot(torch.ones(3), torch.ones(4))),
  "matmul_1d_mismatch": (lambda: Tensor.ones(3) @ Tensor.ones(4, 2), lambda: torch.ones(3) @ torch.ones(4, 2)),
  "einsum_ell_mismatch": (lambda: Tensor.einsum("...i,...i", Tensor.ones(2, 3), Tensor.ones(4, 3)),
                          lambda: torch.einsum("...i,...i", torch.ones(2, 3), torch.ones(4, 3))),
  "einsum_repeat_size": (lambda: Tensor.einsum("ii->i", Tensor.ones(2, 3)),
                         lambda: torch.einsum("ii->i", torch.ones(2, 3))),
  "einsum_two_arrows": (lambda: Tensor.einsum("i->i->i", Tensor.ones(2)),
                        lambda: torch.einsum("i->i->i", torch.ones(2))),
  "einsum_bad_char": (lambda: Tensor.einsum("i1->i", Tensor.ones(2, 2)),
                      lambda: torch.einsum("i1->i", torch.ones(2, 2))),
  "einsum_two_ellipses": (lambda: Tensor.einsum("...i...->i", Tensor.ones(2, 2)),
                          lambda: torch.einsum("...i...->i", torch.ones(2, 2))),
  "scatter_bad_reduce": (lambda: Tensor.ones(3).scatter(0, Tensor([0]), Tensor([1.0]), reduce="max"),
                         lambda: torch.ones(3).scatter(0, torch.tensor([0]), torch.tensor([1.0]), reduce="max")),
  "scatter_reduce_bad": (lambda: Tensor.ones(3).scatter_reduce(0, Tensor([0]), Tensor([1.0]), "median"),
                         lambda: torch.ones(3).scatter_reduce(0, torch.tensor([0]), torch.tensor([1.0]), "median")),
  "gather_index_too_big": (lambda: Tensor.ones(2, 3).gather(1, Tensor([[0], [0], [0]])),
                           lambda: torch.ones(2, 3).gather(1, torch.tensor([[0], [0], [0]]))),
  "conv_same_stride": (lambda: Tensor.ones(1, 1, 5, 5).conv2d(Tensor.ones(1, 1, 3, 3), stride=2, padding="same"),
                       lambda: F.conv2d(torch.ones(1, 1, 5, 5), torch.ones(1, 1, 3, 3), stride=2, padding="same")),
  "conv_bad_padding_str": (lambda: Tensor.ones(1, 1, 5, 5).conv2d(Tensor.ones(1, 1, 3, 3), padding="full"),
                           lambda: F.conv2d(torch.ones(1, 1, 5, 5), torch.ones(1, 1, 3, 3), padding="full")),
  "conv_padding_len": (lambda: Tensor.ones(1, 1, 5, 5).conv2d(Tensor.ones(1, 1, 3, 3), padding=(1, 1, 1)),
                       lambda: F.conv2d(torch.ones(1, 1, 5, 5), torch.ones(1, 1, 3, 3), padding=(1, 1, 1))),
  "conv_padding_neg": (lambda: Tensor.ones(1, 1, 5, 5).conv2d(Tensor.ones(1, 1, 3, 3), padding=(1, -1)),
                       lambda: F.conv2d(torch.ones(1, 1, 5, 5), torch.ones(1, 1, 3, 3), padding=(1, -1))),
  "avg_pool_pad_big": (lambda: Tensor.ones(1, 1, 4, 4).avg_pool2d(2, padding=2),
                       lambda: F.avg_pool2d(torch.ones(1, 1, 4, 4), 2, padding=2)),
  "avg_pool_divisor0": (lambda: Tensor.ones(1, 1, 4, 4).avg_pool2d(2, divisor_override=0),
                        lambda: F.avg_pool2d(torch.ones(1, 1, 4, 4), 2, divisor_override=0)),
  "unpool_output_size_bad": (lambda: Tensor.ones(1, 1, 2, 2).max_unpool2d(Tensor.zeros(1, 1, 2, 2, dtype=dtypes.int32),
                                                                         2, output_size=(7, 7)),
                             lambda: F.max_unpool2d(torch.ones(1, 1, 2, 2), torch.zeros(1, 1, 2, 2, dtype=torch.int64),
                                                    2, output_size=(7, 7))),
  "unpool_index_outside": (lambda: Tensor.ones(1, 1, 2, 2).max_unpool2d(
                             Tensor.full((1, 1, 2, 2), 17, dtype=dtypes.int32), 2),
                           lambda: F.max_unpool2d(torch.ones(1, 1, 2, 2), torch.full((1, 1, 2, 2), 17), 2)),
  "sdpa_mask_shape": (lambda: Tensor.ones(1, 3, 4).scaled_dot_product_attention(
                        Tensor.ones(1, 5, 4), Tensor.ones(1, 5, 4), attn_mask=Tensor.ones(3, 4)),
                      lambda: F.scaled_dot_product_attention(
                        torch.ones(1, 3, 4), torch.ones(1, 5, 4), torch.ones(1, 5, 4), attn_mask=torch.ones(3, 4))),
  "sdpa_causal_and_mask": (lambda: Tensor.ones(1, 3, 4).scaled_dot_product_attention(
                             Tensor.ones(1, 3, 4), Tensor.ones(1, 3, 4), attn_mask=Tensor.ones(3, 3), is_causal=True),
                           lambda: F.scaled_dot_product_attention(
                             torch.ones(1, 3, 4), torch.ones(1, 3, 4), torch.ones(1, 3, 4), attn_mask=torch.ones(3, 3),
                             is_causal=True)),
}

@pytest.mark.parametrize("name", list(BAD))
def test_bad_call_raises_like_torch(name: str) -> None:
  check_raises_like_torch(name, *BAD[name])

# ** max_unpool2d edge shapes **

UNPOOLS: list[tuple[tuple[int, ...], dict[str, Any], tuple[int, ...] | None]] = [
  ((1, 1, 4, 6), {"kernel_size": 2}, None), ((1, 2, 5, 5), {"kernel_size": 2}, (5, 5)),
  ((2, 1, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1}, (7, 6)),
  ((1, 1, 6, 6), {"kernel_size": 2, "stride": 1}, (1, 1, 6, 6)), ((2, 4, 4), {"kernel_size": 2}, None)]

@pytest.mark.parametrize("shape,kw,out", UNPOOLS)
def test_max_unpool2d_shapes(shape: tuple[int, ...], kw: dict[str, Any], out: tuple[int, ...] | None) -> None:
  x = rand(*shape)
  v, i = Tensor(x).max_pool2d(**kw, return_indices=True)
  tv, ti = F.max_pool2d(torch.tensor(x), **kw, return_indices=True)
  unpool_kw = {k: a for k, a in kw.items() if k in ("kernel_size", "stride", "padding")}
  vv = Tensor(tv.numpy(), requires_grad=True)
  got = vv.max_unpool2d(i, **unpool_kw, output_size=out)
  tvv = tv.detach().clone().requires_grad_(True)
  want = F.max_unpool2d(tvv, ti, **unpool_kw, output_size=out)
  assert got.shape == tuple(want.shape)
  np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
  seed = rand(*want.shape)
  (got * Tensor(seed)).sum().backward()
  (want * torch.tensor(seed)).sum().backward()
  assert vv.grad is not None
  np.testing.assert_allclose(vv.grad.numpy(), tvv.grad.numpy(), rtol=1e-6)

def test_floordiv_and_remainder_keep_torchs_signed_zeros() -> None:
  # torch's zero quotients carry the exact quotient's sign, zero remainders a's (fmod's): -0.0 // -inf is 0.0 (it was
  # -1), -4.0 % 2.0 is -0.0
  a, b = INF_PAIRS
  for got, want in ((Tensor(a) // Tensor(b), torch.tensor(a) // torch.tensor(b)),
                    (Tensor(a) % Tensor(b), torch.tensor(a) % torch.tensor(b))):
    g, w = got.numpy(), want.numpy()
    np.testing.assert_array_equal(g, w)
    finite = ~np.isnan(w)
    np.testing.assert_array_equal(np.signbit(g[finite]), np.signbit(w[finite]))
