"""Reductions (ReduceSum ... ReduceLogSumExp, ArgMax/ArgMin), scans (CumSum) and TopK.

ReduceSum takes its axes as an input from opset 13, the other Reduce ops from opset 18; before that they are an
attribute. A reduction over an empty dim gives the op's identity (0 for sums, 1 for products, -inf for max ...), as
the ONNX reference does."""
from __future__ import annotations
import math
from typing import Any, Callable
from ember import Tensor, dtypes
from ember.nn.onnx.registry import onnx_op
from ember.nn.onnx.ops.common import dim, dims, axes_of, axis as norm_axis, const_like, highest, ints, lowest, scalar

def _reduce(x: Tensor, axes: list[int] | None, keepdims: int, noop_with_empty_axes: int,
            fn: Callable[[Tensor, tuple[int, ...], bool], Tensor], empty: Callable[[Tensor], Any]) -> Tensor:
  if not axes:
    if noop_with_empty_axes: return x
    axes = list(range(x.ndim))
  ax = tuple(sorted(set(axes_of(axes, x.ndim))))
  if any(x.shape[a] == 0 for a in ax):
    shape = [1 if i in ax else s for i, s in enumerate(dims(x)) if keepdims or i not in ax]
    return const_like(x, empty(x), shape)
  return fn(x, ax, bool(keepdims))

REDUCERS: dict[str, tuple[Callable[[Tensor, tuple[int, ...], bool], Tensor], Callable[[Tensor], Any]]] = {
  "ReduceSum": (lambda x, a, k: x.sum(a, keepdim=k), lambda x: 0),
  "ReduceMean": (lambda x, a, k: x.mean(a, keepdim=k), lambda x: math.nan),
  "ReduceProd": (lambda x, a, k: x.prod(a, keepdim=k), lambda x: 1),
  "ReduceMax": (lambda x, a, k: (x.any(a, keepdim=k) if x.dtype == dtypes.bool else x.max(a, keepdim=k)),
                lambda x: False if x.dtype == dtypes.bool else lowest(x.dtype)),
  "ReduceMin": (lambda x, a, k: (x.all(a, keepdim=k) if x.dtype == dtypes.bool else x.min(a, keepdim=k)),
                lambda x: True if x.dtype == dtypes.bool else highest(x.dtype)),
  "ReduceL1": (lambda x, a, k: x.abs().sum(a, keepdim=k), lambda x: 0),
  "ReduceL2": (lambda x, a, k: x.cast(_acc(x)).square().sum(a, keepdim=k).sqrt(), lambda x: 0),
  "ReduceSumSquare": (lambda x, a, k: x.square().sum(a, keepdim=k), lambda x: 0),
  "ReduceLogSum": (lambda x, a, k: x.cast(_acc(x)).sum(a, keepdim=k).log(), lambda x: -math.inf),
  "ReduceLogSumExp": (lambda x, a, k: x.cast(_acc(x)).logsumexp(a, keepdim=k), lambda x: -math.inf),
}

def _acc(x: Tensor) -> Any: return x.dtype if dtypes.is_float(x.dtype) and x.dtype.itemsize >= 4 else dtypes.float32

def _attr_axes(fn: Any, empty: Any) -> Callable[..., Tensor]:
  def reduce_attr(x: Tensor, axes: list[int] | None = None, keepdims: int = 1, noop_with_empty_axes: int = 0) -> Tensor:
    return _reduce(x, axes, keepdims, noop_with_empty_axes, fn, empty).cast(x.dtype)
  return reduce_attr

def _input_axes(fn: Any, empty: Any) -> Callable[..., Tensor]:
  def reduce_input(x: Tensor, axes: Tensor | None = None, keepdims: int = 1, noop_with_empty_axes: int = 0) -> Tensor:
    return _reduce(x, ints(axes), keepdims, noop_with_empty_axes, fn, empty).cast(x.dtype)
  return reduce_input

for _name, (_fn, _empty) in REDUCERS.items():
  onnx_op(_name)(_attr_axes(_fn, _empty))
  onnx_op(_name, since=13 if _name == "ReduceSum" else 18)(_input_axes(_fn, _empty))

def _arg(x: Tensor, axis: int, keepdims: int, select_last_index: int, largest: bool) -> Tensor:
  a = norm_axis(axis, x.ndim)
  v = x.cast(dtypes.uint8) if x.dtype == dtypes.bool else x
  def first(t: Tensor) -> Tensor:
    return (t.argmax if largest else t.argmin)(a, keepdim=bool(keepdims)).cast(dtypes.int64)
  # the last of equal extremes is the first one of the flipped tensor
  return (dim(x, a) - 1) - first(v.flip(a)) if select_last_index else first(v)

@onnx_op("ArgMax")
def arg_max(x: Tensor, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> Tensor:
  return _arg(x, axis, keepdims, select_last_index, True)

@onnx_op("ArgMin")
def arg_min(x: Tensor, axis: int = 0, keepdims: int = 1, select_last_index: int = 0) -> Tensor:
  return _arg(x, axis, keepdims, select_last_index, False)

@onnx_op("CumSum", since=11)
def cum_sum(x: Tensor, axis: Tensor, exclusive: int = 0, reverse: int = 0) -> Tensor:
  a = norm_axis(int(scalar(axis)), x.ndim)
  if reverse: x = x.flip(a)
  out = x.cumsum(a).cast(x.dtype)
  if exclusive:
    n = dim(x, a)
    out = out.pad([(1, 0) if i == a else (0, 0) for i in range(x.ndim)]).shrink(
      [(0, n) if i == a else None for i in range(x.ndim)])
  return out.flip(a) if reverse else out

@onnx_op("CumProd", since=26)
def cum_prod(x: Tensor, axis: Tensor, exclusive: int = 0, reverse: int = 0) -> Tensor:
  a = norm_axis(int(scalar(axis)), x.ndim)
  if reverse: x = x.flip(a)
  if exclusive:  # a leading 1, the last element dropped
    n = dim(x, a)
    x = x.pad([(1, 0) if i == a else (0, 0) for i in range(x.ndim)], value=1).shrink(
      [(0, n) if i == a else None for i in range(x.ndim)])
  out = x.cumprod(a).cast(x.dtype)
  return out.flip(a) if reverse else out

def _topk(x: Tensor, k: int, axis: int, largest: int, sorted: int) -> tuple[Tensor, Tensor]:  # noqa: A002
  a = norm_axis(axis, x.ndim)
  values, indices = x.topk(k, dim=a, largest=bool(largest), sorted=True)
  return values, indices.cast(dtypes.int64)

@onnx_op("TopK")
def top_k_1(x: Tensor, k: int, axis: int = -1) -> tuple[Tensor, Tensor]: return _topk(x, k, axis, 1, 1)

@onnx_op("TopK", since=10)
def top_k_10(x: Tensor, k: Tensor, axis: int = -1, largest: int = 1, sorted: int = 1) -> tuple[Tensor, Tensor]:  # noqa: A002
  return _topk(x, int(scalar(k)), axis, largest, sorted)
