"""Reductions and scans: sum/max/mean/var/std, arg reductions, cumulative ops.

A mixin of `ember.tensor.Tensor`. This module cannot import ember.tensor (which imports it to define Tensor);
ember.tensor hands it `PyBool`, `PyFloat`, `PyInt` ... once Tensor exists (`LATE_NAMES`)."""
from __future__ import annotations
import functools
import math
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, TypeVar, cast
import numpy as np
from ember.dtype import DType, dtypes, least_upper_float, narrow_float, strong_dtype, sum_acc_dtype, to_dtype
from ember.errors import ArgumentError, EmptyReductionError, ShapeError
from ember.helpers import prod
from ember.uop.ops import Ops, UOp, int_size

if TYPE_CHECKING:
  from ember.tensor import (PyBool, PyFloat, PyInt, SPLIT_REDUCE_MIN, SUM_CHUNK, SUM_CHUNK_MIN, Tensor)

LATE_NAMES = ('PyBool', 'PyFloat', 'PyInt', 'SPLIT_REDUCE_MIN', 'SUM_CHUNK', 'SUM_CHUNK_MIN', 'Tensor')

class ValuesIndices(NamedTuple):
  """What torch's max(dim=)/min(dim=) return (torch.return_types.max): the values and the int32 indices."""
  values: Tensor
  indices: Tensor

_F = TypeVar("_F", bound=Callable[..., Any])
_NO_DIM: Any = object()

def takes_dim(indices_of: str | None = None) -> Callable[[_F], _F]:
  """Let a reduction take torch's `dim=` keyword for its `axis`. With `indices_of` ("argmax"/"argmin"), a call with
  `dim=` returns torch's (values, indices) pair as torch's max(dim=)/min(dim=) do; `axis=` or a positional axis keeps
  tinygrad's values-only result."""
  def wrap(fn: _F) -> _F:
    @functools.wraps(fn)
    def with_dim(self: Tensor, *args: Any, dim: Any = _NO_DIM, **kwargs: Any) -> Any:
      if dim is _NO_DIM: return fn(self, *args, **kwargs)
      if args or "axis" in kwargs:
        raise ArgumentError(f"{fn.__name__}() takes its dims once: as axis= (or positionally) or as dim=, not both")
      out = fn(self, axis=dim, **kwargs)
      if indices_of is None: return out
      if dim is None: raise ArgumentError(f"{fn.__name__}(dim=None): pass a dim, or call {fn.__name__}() for all")
      return ValuesIndices(out, getattr(self, indices_of)(dim, kwargs.get("keepdim", False)))
    return cast(_F, with_dim)
  return wrap

def _chunk_split(summed: list[int]) -> tuple[int, int] | None:
  """Where a long sum over dims `summed` splits into chunks of whole dims: (dim, inner) such that the dims after `dim`
  and `inner` (a divisor of it) hold at most SUM_CHUNK elements, and at least an eighth of that (fewer, and the
  partials would be many). None for one dim (its flat chunks of SUM_CHUNK need no div/mod, and their partials add
  exactly) or where no such split exists (a long dim of awkward size): chunked flat instead."""
  if len(summed) < 2: return None
  run = 1
  for at in reversed(range(len(summed))):
    if run * summed[at] <= SUM_CHUNK:
      run *= summed[at]
      continue
    inner = max(q for q in range(1, SUM_CHUNK // run + 1) if summed[at] % q == 0)
    return (at, inner) if run * inner * 8 >= SUM_CHUNK else None
  return None

class ReduceMixin:
  __slots__ = ()  # Tensor's own slots stay the only instance fields
  # ** reductions **
  def _reduce_axes(self: Tensor, axis: Any) -> tuple[PyInt, ...]:
    if axis is None: return tuple(range(self.ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    resolved = {self._resolve_dim(a) for a in axes}
    if len(resolved) != len(axes): raise ShapeError(f"reduce dims {axes} repeat a dim (shape {self.shape})")
    return tuple(sorted(resolved))
  def _reduce(self: Tensor, op: Ops, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    axes = self._reduce_axes(axis)
    if self.ndim == 0: return self
    if self.sharding is not None: return self.sharding.reduce(self, op, axes, keepdim) if axes else self
    if any(self.shape[a] == 0 for a in axes):
      # a reduction over no elements is one over the identity alone: padded in (max/min/argmax refuse this earlier, see
      # _check_nonempty), so the input stays in the graph and its gradient is zeros of its shape, as in torch
      ident = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: dtypes.min(self.dtype)}[op]
      pads = tuple((0, 1) if i in axes and s == 0 else (0, 0) for i, s in enumerate(self.shape))
      return self.pad(pads, value=ident)._reduce(op, axes, keepdim)
    elif op is Ops.ADD and dtypes.is_float(self.dtype) and (chunked := self._chunked_sum(axes)) is not None:
      ret = chunked
    elif (parts := self._split_reduce_parts(axes)) is not None:
      # a long reduction to one value in two stages: `parts` partial results (one output each: threads and GPU blocks
      # share them), materialised, then reduced; one kernel would run the whole reduction on one thread
      flat = self.reshape(parts, -1)
      part = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (flat.uop,), (op, (1,))), requires_grad=self.requires_grad)
      ret = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (part.contiguous().uop,), (op, (0,))),
                   requires_grad=self.requires_grad).reshape((1,) * self.ndim)
    else:
      if axes: ret = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes)), requires_grad=self.requires_grad)
      else: ret = self
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))
  def _chunked_sum(self: Tensor, axes: tuple[PyInt, ...]) -> Tensor | None:
    """A float sum over more than SUM_CHUNK_MIN elements per output, in stages: each chunk of SUM_CHUNK elements is
    summed into a materialised partial (one output each, so threads and GPU blocks share them), and the partials are
    summed the same way. No accumulator adds more than SUM_CHUNK_MIN values, so the rounding error grows like
    SUM_CHUNK + n / SUM_CHUNK rather than n, and ones(n).sum() is exact while n fits the float's integers (one float32
    accumulator stalls at 2**24: ones(2**31+8).sum() gave 8 * 2**24). The keepdim-shaped sum, or None for short sums."""
    if not all(isinstance(s, int) for s in self.shape): return None
    count = prod(self.shape[a] for a in axes)
    if not isinstance(count, int) or count <= SUM_CHUNK_MIN: return None
    keep = [i for i in range(self.ndim) if i not in axes]
    kept = [s for i, s in enumerate(self.shape) if i in keep and isinstance(s, int)]  # every dim is an int here
    summed = [s for i, s in enumerate(self.shape) if i in axes and isinstance(s, int)]
    if (split := _chunk_split(summed)) is not None:
      # chunks along the summed dims: the innermost ones and `inner` of the next make a chunk, so every element keeps
      # its own index (a flat chunk index split it by div/mod in the inner loop: a conv's weight gradient at a batch
      # of 512 ran at 0.15 GFLOP/s). The chunks are the partials' outer dims: each one's inputs stay in cache while
      # every output takes its partial (a conv's weight gradient reads a chunk of images once, not once per weight)
      at, inner = split
      outer = [*summed[:at], summed[at] // inner]
      x = self.permute(*axes, *keep).reshape(*outer, inner, *summed[at + 1:], *kept)  # (*outer, *chunk, *kept)
      chunk_axes = tuple(range(len(outer), len(outer) + len(summed) - at))
      partial = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (x.uop,), (Ops.ADD, chunk_axes)),
                       requires_grad=self.requires_grad).reshape(*outer, *kept)  # (*outer, *kept)
      total = partial.contiguous()._reduce(Ops.ADD, tuple(range(len(outer))), keepdim=True)
      return total.reshape(tuple(1 if i in axes else s for i, s in enumerate(self.shape)))
    chunks = -(-count // SUM_CHUNK)
    flat = self.permute(*keep, *axes).reshape(*kept, count)  # (*kept, count)
    flat = flat.pad(((0, 0),) * len(kept) + ((0, chunks * SUM_CHUNK - count),)).reshape(*kept, chunks, SUM_CHUNK)
    partial = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (flat.uop,), (Ops.ADD, (len(kept) + 1,))),
                     requires_grad=self.requires_grad).reshape(*kept, chunks)  # (*kept, chunks)
    total = partial.contiguous()._reduce(Ops.ADD, len(kept), keepdim=True)  # the partials, in chunks again if many
    return total.reshape(tuple(1 if i in axes else s for i, s in enumerate(self.shape)))
  def _split_reduce_parts(self: Tensor, axes: tuple[PyInt, ...]) -> PyInt | None:
    """How many partial results a reduction of every element splits into (SPLIT_REDUCE_MIN elements or more, a
    constant shape; the most of 256, 128, ... 2 that divides it into runs of at least 4096), else None."""
    if len(axes) != self.ndim or not all(isinstance(d, int) for d in self.shape): return None
    n = prod(self.shape)
    if not isinstance(n, int) or n < SPLIT_REDUCE_MIN: return None
    return next((c for c in (256, 128, 64, 32, 16, 8, 4, 2) if n % c == 0 and n // c >= 4096), None)
  @takes_dim()
  def sum(self: Tensor, axis: Any = None, keepdim: PyBool = False, dtype: DType | None = None) -> Tensor:
    acc = to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype)
    ret = self.cast(acc)._reduce(Ops.ADD, axis, keepdim)
    return ret.cast(self.dtype) if dtype is None and self.dtype in (dtypes.float16, dtypes.bfloat16) else ret
  @takes_dim()
  def prod(self: Tensor, axis: Any = None, keepdim: PyBool = False, dtype: DType | None = None) -> Tensor:
    # bools and small ints multiply in the sum's accumulator (torch: int64), floats in their own dtype
    if dtype is not None: acc = to_dtype(dtype)
    else: acc = strong_dtype(self.dtype) if dtypes.is_float(self.dtype) else sum_acc_dtype(self.dtype)
    return self.cast(acc)._reduce(Ops.MUL, axis, keepdim)
  def _check_nonempty(self: Tensor, axis: Any, op: str) -> None:
    """max/min/argmax have no identity element: over zero elements they raise, as torch does."""
    if self.ndim and any(self.shape[a] == 0 for a in self._reduce_axes(axis)):
      over = "all dims" if axis is None else f"dim {axis}"
      raise EmptyReductionError(f"{op}() over {over} of shape {self.shape} reduces zero elements and has no identity; "
                                "reduce a non-empty dim")
  def _amax(self: Tensor, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    """max without the empty check: -inf (the dtype's minimum) over zero elements, for softmax and logsumexp."""
    return self.cast(strong_dtype(self.dtype))._reduce(Ops.MAX, axis, keepdim)
  @takes_dim("argmax")
  def max(self: Tensor, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    self._check_nonempty(axis, "max")
    return self._amax(axis, keepdim)
  @takes_dim("argmin")
  def min(self: Tensor, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    self._check_nonempty(axis, "min")
    x = self.cast(strong_dtype(self.dtype))
    # ~x reverses the order of ints (and bools) without the overflow of -x at the minimum int
    if dtypes.is_int(x.dtype) or x.dtype is dtypes.bool: return ~((~x).max(axis, keepdim))
    return -((-x).max(axis, keepdim))
  @takes_dim()
  def mean(self: Tensor, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    x = self.cast(least_upper_float(strong_dtype(self.dtype)))
    n = prod(s for i, s in enumerate(self.shape) if i in self._reduce_axes(axis)) if self.ndim else 1
    # half / bfloat16 / fp8 sum and divide in float32, cast once at the end (as torch): 70,000 halves of 2 summed to
    # inf in half, and the count itself (70,000) is inf there, so their mean was nan
    narrow = narrow_float(x.dtype)
    out = x.sum(axis, keepdim, dtype=dtypes.float32 if narrow else None)
    out = out.div(n) if n != 0 else out * math.nan
    return out.cast(x.dtype) if narrow else out
  def _cumsum0(self: Tensor) -> Tensor:
    """Inclusive cumulative sum along a 1-d tensor, as a reduction over a padded, expanded window (index math only)."""
    n = self.shape[0]
    # (n, 2n-1) rows that are x shifted right by i; summing the first n columns of row i gives sum(x[:i+1])
    padded = self.pad(((n - 1, 0),))
    windows = padded.reshape(1, 2 * n - 1).expand(n, 2 * n - 1).reshape(n * (2 * n - 1))
    windows = windows.pad(((0, n),)).reshape(n, 2 * n).shrink(((0, n), (0, n)))
    return windows.sum(1)
  def _axis_count(self: Tensor, axis: Any) -> PyInt:
    return int(prod(self.shape[a] for a in self._reduce_axes(axis))) if self.ndim else 1
  @takes_dim()
  def var(self: Tensor, axis: Any = None, keepdim: PyBool = False, correction: PyInt | PyFloat = 1, *,
          unbiased: PyBool | None = None) -> Tensor:
    """Variance over `axis`, dividing by N - correction (Bessel's correction by default); torch's older
    `unbiased=False` is `correction=0`.

    >>> Tensor([1.0, 2.0, 3.0, 4.0]).var().item()
    1.6666666269302368
    """
    if unbiased is not None: correction = int(bool(unbiased))
    x = self._float()
    if narrow_float(x.dtype):  # half / bfloat16 / fp8: squares and their sum in float32 (they overflow in half)
      return x.float().var(axis, keepdim, correction).cast(x.dtype)
    dev = x - x.mean(axis, keepdim=True)
    return dev.square().sum(axis, keepdim=keepdim).div(max(0, self._axis_count(axis) - correction))
  @takes_dim()
  def std(self: Tensor, axis: Any = None, keepdim: PyBool = False, correction: PyInt | PyFloat = 1, *,
          unbiased: PyBool | None = None) -> Tensor:
    """Standard deviation over `axis`: sqrt(var).

    >>> Tensor([1.0, 3.0]).std().item()
    1.4142135381698608
    """
    return self.var(axis, keepdim, correction, unbiased=unbiased).sqrt()
  @takes_dim()
  def var_mean(self: Tensor, axis: Any = None, keepdim: PyBool = False,
               correction: PyInt | PyFloat = 1, *, unbiased: PyBool | None = None) -> tuple[Tensor, Tensor]:
    """(var, mean) over `axis`.

    >>> [t.item() for t in Tensor([1.0, 3.0]).var_mean()]
    [2.0, 2.0]
    """
    return self.var(axis, keepdim, correction, unbiased=unbiased), self._float().mean(axis, keepdim)
  @takes_dim()
  def std_mean(self: Tensor, axis: Any = None, keepdim: PyBool = False,
               correction: PyInt | PyFloat = 1, *, unbiased: PyBool | None = None) -> tuple[Tensor, Tensor]:
    """(std, mean) over `axis`.

    >>> [round(t.item(), 4) for t in Tensor([1.0, 3.0]).std_mean()]
    [1.4142, 2.0]
    """
    return self.std(axis, keepdim, correction, unbiased=unbiased), self._float().mean(axis, keepdim)
  @takes_dim()
  def any(self: Tensor, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    """True if any element along `axis` is nonzero.

    >>> Tensor([[0, 1], [0, 0]]).any(axis=1).tolist()
    [True, False]
    """
    return (self != 0).cast(dtypes.uint8)._reduce(Ops.MAX, axis, keepdim).cast(dtypes.bool)
  @takes_dim()
  def all(self: Tensor, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    """True if every element along `axis` is nonzero.

    >>> Tensor([[1, 1], [0, 1]]).all(axis=1).tolist()
    [True, False]
    """
    return (self == 0).any(axis, keepdim).logical_not()
  def _arg_first(self: Tensor, hit: Tensor, axis: PyInt | None, keepdim: PyBool) -> Tensor:
    """The first index along `axis` where `hit` is True (as int32)."""
    if axis is None:
      ret = Tensor._arg_first(self.flatten(), hit.flatten(), 0, False)
      return ret.reshape((1,) * self.ndim) if keepdim else ret
    ax = self._resolve_dim(axis)
    n = int_size(self.shape[ax], "argmax/argmin")
    # count down from n so the max picks the smallest index
    down = Tensor.arange(n, 0, -1, device=self.device, dtype=dtypes.int32).reshape((n,) + (1,) * (self.ndim - ax - 1))
    return (n - hit.where(down, 0).max(ax, keepdim)).cast(dtypes.int32)
  @takes_dim()
  def argmax(self: Tensor, axis: PyInt | None = None, keepdim: PyBool = False) -> Tensor:
    """Index of the first maximum along `axis` (over the flattened tensor if None), as int32. NaN counts as largest.

    >>> Tensor([[1, 5, 5], [7, 2, 0]]).argmax(axis=1).tolist()
    [1, 0]
    """
    if self.ndim == 0: return Tensor(0, dtype=dtypes.int32, device=self.device)
    self._check_nonempty(axis, "argmax")
    x = self.cast(strong_dtype(self.dtype))
    m = x.max(axis, keepdim=True)
    hit = (x == m) | (x.isnan() & m.isnan()) if dtypes.is_float(x.dtype) else x == m
    return self._arg_first(hit, axis, keepdim)
  @takes_dim()
  def argmin(self: Tensor, axis: PyInt | None = None, keepdim: PyBool = False) -> Tensor:
    """Index of the first minimum along `axis`, as int32.

    >>> Tensor([3, 1, 1]).argmin().item()
    1
    """
    if self.ndim == 0: return Tensor(0, dtype=dtypes.int32, device=self.device)
    self._check_nonempty(axis, "argmin")
    x = self.cast(strong_dtype(self.dtype))
    m = x.min(axis, keepdim=True)
    hit = (x == m) | (x.isnan() & m.isnan()) if dtypes.is_float(x.dtype) else x == m
    return self._arg_first(hit, axis, keepdim)
  @takes_dim()
  def logsumexp(self: Tensor, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    """log(sum(exp(x))) over `axis`, shifted by the max so it neither overflows nor underflows.

    >>> round(Tensor([1000.0, 1000.0]).logsumexp().item(), 3)
    1000.693
    """
    x = self._float()
    m = x._amax(axis, keepdim=True).detach()
    m = m.isinf().where(0, m)
    ret = (x - m).exp().sum(axis, keepdim=True).log() + m
    axes = self._reduce_axes(axis)
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))
  def _scan_windows(self: Tensor, axis: PyInt, fill: Any) -> Tensor:
    """(..., n, n) with the scanned axis last: row i holds x[:i+1] and `fill` after it."""
    x = self.transpose(axis, -1) if self.ndim > 1 else self
    n = int_size(x.shape[-1], "a cumulative op")
    j = Tensor.arange(n, device=self.device, dtype=dtypes.int32)
    in_prefix = j.reshape(1, n) <= j.reshape(n, 1)  # (i, j): j <= i
    return in_prefix.where(x.unsqueeze(-2).expand(*x.shape[:-1], n, n), fill)
  def _scan(self: Tensor, op: Ops, axis: PyInt, fill: Any) -> Tensor:
    if self.ndim == 0: return self
    ax = self._resolve_dim(axis)
    if self.shape[ax] == 0: return self
    w = self._scan_windows(ax, fill)
    out = w._reduce(op, -1) if op is not Ops.ADD else w.sum(-1, dtype=w.dtype)
    return out.transpose(ax, -1) if self.ndim > 1 else out
  @takes_dim()
  def cumsum(self: Tensor, axis: PyInt = 0) -> Tensor:
    """Inclusive cumulative sum along `axis` (ints accumulate in at least int32, like the sum's dtype).

    >>> Tensor([1, 2, 3]).cumsum().tolist()
    [1, 3, 6]
    """
    out = self.cast(sum_acc_dtype(self.dtype))._scan(Ops.ADD, axis, 0)
    return out.cast(self.dtype) if narrow_float(self.dtype) else out  # half sums in float32, returns half (torch)
  @takes_dim()
  def cumprod(self: Tensor, axis: PyInt = 0) -> Tensor:
    """Inclusive cumulative product along `axis`.

    >>> Tensor([1, 2, 3]).cumprod().tolist()
    [1, 2, 6]
    """
    out = self.cast(sum_acc_dtype(self.dtype))._scan(Ops.MUL, axis, 1)
    return out.cast(self.dtype) if narrow_float(self.dtype) else out
  def _cum_extreme(self: Tensor, axis: PyInt, largest: PyBool) -> tuple[Tensor, Tensor]:
    src = self.cast(strong_dtype(self.dtype))
    ax = src._resolve_dim(axis) if src.ndim else 0
    if src.ndim == 0: return src, Tensor(0, dtype=dtypes.int32, device=self.device)
    if src.shape[ax] == 0: return src, Tensor.empty(*src.shape, dtype=dtypes.int32, device=self.device)
    x = src.detach()  # the values are gathered from src at the indices below: the gradient goes to that one element
    if largest: vals = x._scan(Ops.MAX, ax, dtypes.min(x.dtype) if not dtypes.is_float(x.dtype) else -math.inf)
    elif dtypes.is_float(x.dtype): vals = -((-x)._cum_extreme(ax, True)[0])
    else: vals = ~((~x)._cum_extreme(ax, True)[0])  # ~ reverses int order without -x's overflow at the minimum int
    # index: the last j <= i where x[j] equals the running extreme (torch's tie rule)
    n = int_size(x.shape[ax], "cummax/cummin")
    xw = x._scan_windows(ax, x.dtype.const(0))  # (..., i, j), entries past i are masked below
    vw = (vals.transpose(ax, -1) if x.ndim > 1 else vals).unsqueeze(-1)
    j = Tensor.arange(n, device=self.device, dtype=dtypes.int32)
    in_prefix = j.reshape(1, n) <= j.reshape(n, 1)
    hit = in_prefix & ((xw == vw) | (xw.isnan() & vw.isnan()) if dtypes.is_float(x.dtype) else xw == vw)
    idx = hit.where(j, -1).max(-1)
    idx = idx.transpose(ax, -1) if x.ndim > 1 else idx
    return (src._gather(ax, idx) if dtypes.is_float(src.dtype) else vals), idx  # idx lies in the axis
  @takes_dim()
  def cummax(self: Tensor, axis: PyInt = 0) -> tuple[Tensor, Tensor]:
    """Running maximum along `axis` and the int32 index where it was reached (the latest on ties, like torch).

    >>> [t.tolist() for t in Tensor([1, 3, 2, 3]).cummax()]
    [[1, 3, 3, 3], [0, 1, 1, 3]]
    """
    return self._cum_extreme(axis, True)
  @takes_dim()
  def cummin(self: Tensor, axis: PyInt = 0) -> tuple[Tensor, Tensor]:
    """Running minimum along `axis` and the int32 index where it was reached.

    >>> [t.tolist() for t in Tensor([3, 1, 2]).cummin()]
    [[3, 1, 1], [0, 1, 1]]
    """
    return self._cum_extreme(axis, False)
  @takes_dim()
  def logcumsumexp(self: Tensor, axis: PyInt = 0) -> Tensor:
    """log(cumsum(exp(x))) along `axis`, each prefix shifted by its own max (no overflow or underflow).

    >>> [round(v, 4) for v in Tensor([0.0, 0.0]).logcumsumexp().tolist()]
    [0.0, 0.6931]
    """
    x = self._float()
    if x.ndim == 0: return x
    ax = x._resolve_dim(axis)
    out = x._scan_windows(ax, -math.inf).logsumexp(-1)
    return out.transpose(ax, -1) if x.ndim > 1 else out
