"""Movement ops: reshape, permute, expand, pad, shrink, flip, cat, gather, scatter, sort ...

A mixin of `ember.tensor.Tensor`. This module cannot import ember.tensor (which imports it to define Tensor);
ember.tensor hands it `Tensor`, `_const_uop`, `_norm_padding` ... once Tensor exists (`LATE_NAMES`)."""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, Any, Sequence
import numpy as np
from ember.dtype import check_scalar_fits, dtypes, least_upper_dtype, strong_dtype
from ember.errors import AxisError, DTypeError, ShapeError
from ember.helpers import prod
from ember.uop.ops import Ops, UOp, int_shape, int_size, sint
from ember.tensor_index import check_index_range

if TYPE_CHECKING:
  from ember.tensor import (Tensor, _const_uop, _norm_padding, _reshape, _shape_arg, _sym_eq, _tensor_seq,
                            broadcast_shape)

LATE_NAMES = ('Tensor', '_const_uop', '_norm_padding', '_reshape', '_shape_arg', '_sym_eq', '_tensor_seq',
              'broadcast_shape')

class MovementMixin:
  __slots__ = ()  # Tensor's own slots stay the only instance fields
  # ** movement **
  def reshape(self: Tensor, shape: Any, *args: Any) -> Tensor:
    new_shape = _shape_arg((shape, *args))
    if (neg := [i for i, s in enumerate(new_shape) if s == -1]):
      if len(neg) > 1: raise ShapeError(f"reshape {self.shape} -> {new_shape}: only one dimension can be -1")
      known = prod(s for s in new_shape if s != -1)
      if known == 0 or self.numel() % known != 0:
        raise ShapeError(f"cannot reshape {self.shape} ({self.numel()} elements) to {new_shape}")
      new_shape = tuple(self.numel() // known if s == -1 else s for s in new_shape)
    if any(isinstance(s, int) and s < 0 for s in new_shape): raise ShapeError(f"reshape to negative dims {new_shape}")
    if not _sym_eq(prod(new_shape), self.numel()):
      raise ShapeError(f"cannot reshape {self.shape} ({self.numel()} elements) to {new_shape} "
                       f"({prod(new_shape)} elements)")
    if new_shape == self.shape: return self
    if self.sharding is not None: return self.sharding.reshape(self, new_shape)
    return Tensor(_reshape(self.uop, new_shape), requires_grad=self.requires_grad)
  def view(self: Tensor, *shape: Any) -> Tensor: return self.reshape(*shape)
  def permute(self: Tensor, order: Any = None, *args: Any, dims: Any = None) -> Tensor:
    if dims is not None:  # torch's keyword
      if order is not None or args: raise ShapeError("permute takes its order once: positionally or as dims=")
      order = dims
    if order is None: raise ShapeError(f"permute needs an order of the {self.ndim} dims")
    dims = (order, *args) if args else ((order,) if isinstance(order, int) else tuple(order))
    perm = tuple(self._resolve_dim(d) for d in dims)
    if sorted(perm) != list(range(self.ndim)):
      raise ShapeError(f"permute order {perm} is not a permutation of {self.ndim} dims (shape {self.shape}); name "
                       "each dim once")
    if perm == tuple(range(self.ndim)): return self
    if self.sharding is not None: return self.sharding.permute(self, perm)
    return Tensor(UOp(Ops.PERMUTE, self.dtype, (self.uop,), perm), requires_grad=self.requires_grad)
  def expand(self: Tensor, shape: Any = (), *args: Any) -> Tensor:
    new_shape = _shape_arg((shape, *args))
    if len(new_shape) < self.ndim: raise ShapeError(f"cannot expand {self.shape} to fewer dims {new_shape}")
    base = self.reshape((1,) * (len(new_shape) - self.ndim) + self.shape) if len(new_shape) > self.ndim else self
    lead = len(new_shape) - self.ndim
    if any(isinstance(ns, int) and (ns < -1 or (ns == -1 and i < lead)) for i, ns in enumerate(new_shape)):
      raise ShapeError(f"cannot expand {self.shape} to {new_shape}: sizes must be >= 0, and -1 (keep) only for "
                       "existing dims")
    final = tuple(s if ns == -1 else ns for s, ns in zip(base.shape, new_shape))
    for s, ns in zip(base.shape, final):
      if s != ns and s != 1: raise ShapeError(f"cannot expand {self.shape} to {new_shape}: dim {s} is not 1")
    if final == base.shape: return base
    if base.sharding is not None: return base.sharding.expand(base, final)
    return Tensor(UOp(Ops.EXPAND, self.dtype, (base.uop,), final), requires_grad=self.requires_grad)
  def pad(self: Tensor, padding: Sequence[Any], mode: str = "constant", value: float = 0.0) -> Tensor:
    """Pad with `padding` as ((before, after), ...) per dim, or torch-style flat (last dim first)."""
    pads = _norm_padding(padding, self.ndim)
    for d, ((b, a), s) in enumerate(zip(pads, self.shape)):
      if isinstance(s, int) and isinstance(b, int) and isinstance(a, int) and s + min(b, 0) + min(a, 0) < 0:
        raise ShapeError(f"pad {tuple(padding)}: dim {d} has {s} elements, and its padding ({b}, {a}) crops "
                         f"{-min(b, 0) - min(a, 0)}; negative padding crops at most the elements there are")
    if self.sharding is not None: return self.sharding.pad(self, pads, mode, value)
    if mode != "constant": return self._pad_mode(pads, mode)
    if all(b == 0 and a == 0 for b, a in pads): return self
    if any(b < 0 or a < 0 for b, a in pads):
      shrink = tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pads, self.shape))
      return self.shrink(shrink).pad(tuple((max(b, 0), max(a, 0)) for b, a in pads), value=value)
    x = self
    if value != 0:
      dt = least_upper_dtype(self.dtype, dtypes.from_py(value))
      x = self.cast(dt)
      everywhere = Tensor.full(self.shape, True, dtype=dtypes.bool, device=self.device)
      mask = Tensor(UOp(Ops.PAD, dtypes.bool, (everywhere.uop,), tuple(pads)))
      padded = Tensor(UOp(Ops.PAD, dt, (x.uop,), tuple(pads)), requires_grad=self.requires_grad)
      return mask.where(padded, value)
    return Tensor(UOp(Ops.PAD, x.dtype, (x.uop,), tuple(pads)), requires_grad=self.requires_grad)
  def _pad_mode(self: Tensor, pads: list[tuple[int, int]], mode: str) -> Tensor:
    """reflect/replicate/circular padding of any dims of any rank, with F.pad's rules: negative amounts crop first, and
    the positive ones then pad from the cropped tensor (reflect needs amounts < the dim size, circular <= it)."""
    if mode not in ("reflect", "replicate", "circular"):
      raise ShapeError(f"unknown pad mode {mode!r}; use constant, reflect, replicate or circular")
    x = self.shrink(tuple((max(-b, 0), s - max(-a, 0)) for (b, a), s in zip(pads, self.shape)))
    for d, (b, a) in enumerate((max(b, 0), max(a, 0)) for b, a in pads):
      if b == 0 and a == 0: continue
      n = int_size(x.shape[d], "pad")
      if n == 0: raise ShapeError(f"{mode} padding of dim {d} needs it non-empty (shape {self.shape}); use constant")
      if mode == "reflect" and (b >= n or a >= n):
        raise ShapeError(f"reflect padding ({b}, {a}) must be smaller than dim {d} of size {n} (shape {self.shape})")
      if mode == "circular" and (b > n or a > n):
        raise ShapeError(f"circular padding ({b}, {a}) wraps around dim {d} of size {n} more than once")
      if mode == "reflect": before, after = x._slice_dim(d, 1, b + 1).flip(d), x._slice_dim(d, n - 1 - a, n - 1).flip(d)
      elif mode == "circular": before, after = x._slice_dim(d, n - b, n), x._slice_dim(d, 0, a)
      else:
        edge = [x._slice_dim(d, i, i + 1) for i in (0, n - 1)]
        sized = [tuple(k if j == d else s for j, s in enumerate(x.shape)) for k in (b, a)]
        before, after = (e.expand(shape) for e, shape in zip(edge, sized))
      x = Tensor.cat(*(t for t in (before, x, after) if t.shape[d] != 0), dim=d)
    return x
  def shrink(self: Tensor, arg: Sequence[tuple[sint, sint] | None]) -> Tensor:
    bounds = tuple((0, s) if a is None else (a[0], a[1]) for a, s in zip(arg, self.shape))
    if len(arg) != self.ndim:
      raise ShapeError(f"shrink needs one (begin, end) per dim: {len(arg)} given for shape {self.shape}")
    for (b, e), s in zip(bounds, self.shape):
      if isinstance(b, int) and isinstance(e, int) and isinstance(s, int) and not 0 <= b <= e <= s:
        raise ShapeError(f"shrink {bounds} is out of range of shape {self.shape}")
    if bounds == tuple((0, s) for s in self.shape): return self
    if self.sharding is not None: return self.sharding.shrink(self, bounds)
    return Tensor(UOp(Ops.SHRINK, self.dtype, (self.uop,), bounds), requires_grad=self.requires_grad)
  def flip(self: Tensor, axis: Any = None, *args: Any, dims: Any = None) -> Tensor:
    if dims is not None:  # torch's keyword
      if axis is not None or args: raise ShapeError("flip takes its dims once: positionally or as dims=")
      axis = dims
    if axis is None: raise ShapeError("flip needs the dims to flip")
    dims = (axis, *args) if args else ((axis,) if isinstance(axis, int) else tuple(axis))
    axes = {self._resolve_dim(a) for a in dims}
    if len(axes) != len(dims): raise ShapeError(f"flip dims {dims} name a dim more than once (shape {self.shape})")
    if not axes: return self
    if self.sharding is not None: return self.sharding.flip(self, tuple(sorted(axes)))
    flips = tuple(i in axes for i in range(self.ndim))
    return Tensor(UOp(Ops.FLIP, self.dtype, (self.uop,), flips), requires_grad=self.requires_grad)
  def _resolve_dim(self: Tensor, dim: int, extra: int = 0) -> int:
    total = self.ndim + extra
    if not isinstance(dim, (int, np.integer)) or not -max(total, 1) <= dim < max(total, 1):
      raise AxisError(f"dim {dim} is out of range for a tensor of {self.ndim} dims (shape {self.shape})")
    return int(dim) + total if dim < 0 else int(dim)
  @property
  def T(self: Tensor) -> Tensor: return self.transpose()
  def transpose(self: Tensor, dim0: int = 1, dim1: int = 0) -> Tensor:
    order = list(range(self.ndim))
    d0, d1 = self._resolve_dim(dim0), self._resolve_dim(dim1)
    order[d0], order[d1] = order[d1], order[d0]
    return self.permute(order)
  def dim(self: Tensor) -> int:
    """The number of dims (torch's name for `ndim`)."""
    return self.ndim
  @property
  def mT(self: Tensor) -> Tensor:
    """The last two dims swapped (a batch of transposed matrices)."""
    if self.ndim < 2: raise ShapeError(f"mT needs at least 2 dims, got shape {self.shape}")
    return self.transpose(-2, -1)
  def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    s, e = self._resolve_dim(start_dim), self._resolve_dim(end_dim)
    return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])
  def unsqueeze(self: Tensor, dim: int) -> Tensor:
    d = self._resolve_dim(dim, extra=1)
    return self.reshape(self.shape[:d] + (1,) + self.shape[d:])
  def squeeze(self: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
    """Drop size-1 dims: all of them, or those of `dim` (an int or a tuple/list of them) that have size 1.

    >>> Tensor.ones(1, 3, 1).squeeze((0, 1)).shape
    (3, 1)
    """
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    # a 0-d tensor takes dim 0 or -1, as if it had one dim of size 1
    resolved = [self._resolve_dim(d) for d in dims] if self.ndim else [self._resolve_dim(d, extra=1) for d in dims]
    if len(set(resolved)) != len(resolved):
      raise ShapeError(f"squeeze dims {dims} name a dim more than once (shape {self.shape})")
    drop = {d for d in resolved if self.ndim and self.shape[d] == 1}
    return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in drop))

  def __getitem__(self: Tensor, indices: Any) -> Tensor:
    """Basic and advanced indexing with numpy/torch semantics: ints, slices with steps, None, Ellipsis, and int
    tensors or lists (broadcast together; boolean masks are not supported, use masked_select).

    >>> Tensor([[1, 2, 3], [4, 5, 6]])[1, ::-2].tolist()
    [6, 4]
    """
    from ember.tensor_index import getitem
    return getitem(self, indices)
  def __setitem__(self: Tensor, indices: Any, value: Any) -> None:
    """Write `value` (broadcast to the indexed region, cast to this dtype) into the indexed elements, in place: the
    whole tensor is reassigned as where(mask, value, self), so the buffer and its readers see the update.

    >>> t = Tensor.zeros(4).contiguous().realize()
    >>> t[1:3] = 5.0
    >>> t.tolist()
    [0.0, 5.0, 5.0, 0.0]
    """
    from ember.tensor_index import setitem
    setitem(self, indices, value)

  def cat(self: Tensor, *others: Tensor, dim: int = 0) -> Tensor:
    """Join tensors along `dim`: `Tensor.cat(a, b)` or `a.cat(b)`; every other dim must match.

    >>> Tensor.cat(Tensor([[1, 2]]), Tensor([[3, 4]]), dim=0).tolist()
    [[1, 2], [3, 4]]
    """
    if isinstance(self, (list, tuple)) and len(others) == 1 and isinstance(others[0], int):  # torch.cat(ts, dim)
      dim, others = others[0], ()
    tensors = _tensor_seq(self, others, "cat")
    first = tensors[0]
    d = first._resolve_dim(dim)
    for t in tensors[1:]:
      if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != d):
        raise ShapeError(f"cat: shapes {first.shape} and {t.shape} differ outside dim {d}")
    total = sum(t.shape[d] for t in tensors)
    dt = least_upper_dtype(*(t.dtype for t in tensors))
    out: Tensor | None = None
    offset: sint = 0
    for t in tensors:
      pads: list[tuple[sint, sint]] = [(0, 0)] * first.ndim
      pads[d] = (offset, total - offset - t.shape[d])
      offset += t.shape[d]
      part = t.cast(dt).pad(pads)
      out = part if out is None else out + part
    assert out is not None
    return out
  def stack(self: Tensor, *others: Tensor, dim: int = 0) -> Tensor:
    """Join same-shape tensors along a new dim `dim`: `Tensor.stack([a, b])`, `Tensor.stack(a, b)` or `a.stack(b)`.

    >>> Tensor.stack([Tensor([1, 2]), Tensor([3, 4])], dim=1).tolist()
    [[1, 3], [2, 4]]
    """
    if isinstance(self, (list, tuple)) and len(others) == 1 and isinstance(others[0], int):  # torch.stack(ts, dim)
      dim, others = others[0], ()
    ts = _tensor_seq(self, others, "stack")
    d = ts[0]._resolve_dim(dim, extra=1)
    return Tensor.cat(*[t.unsqueeze(d) for t in ts], dim=d)
  def _slice_dim(self: Tensor, dim: int, start: sint, stop: sint) -> Tensor:
    return self.shrink(tuple((start, stop) if i == dim else (0, s) for i, s in enumerate(self.shape)))
  def repeat(self: Tensor, repeats: Any, *args: Any) -> Tensor:
    """Tile the tensor `repeats[i]` times along each dim (torch.Tensor.repeat; extra leading repeats add dims).

    >>> Tensor([1, 2]).repeat(2, 2).tolist()
    [[1, 2, 1, 2], [1, 2, 1, 2]]
    """
    reps = _shape_arg((repeats, *args))
    if len(reps) < self.ndim:
      raise ShapeError(f"repeat needs at least {self.ndim} repeats for shape {self.shape}, got {reps}")
    base = self.reshape((1,) * (len(reps) - self.ndim) + self.shape)
    inter = [v for s in base.shape for v in (1, s)]
    tiled = [v for r, s in zip(reps, base.shape) for v in (r, s)]
    return base.reshape(inter).expand(tiled).reshape(tuple(r * s for r, s in zip(reps, base.shape)))
  def repeat_interleave(self: Tensor, repeats: int, dim: int | None = None) -> Tensor:
    """Repeat each element `repeats` times along `dim` (the flattened tensor if None).

    >>> Tensor([1, 2]).repeat_interleave(2).tolist()
    [1, 1, 2, 2]
    """
    if not isinstance(repeats, int) or repeats < 0:
      raise ShapeError(f"repeat_interleave needs a non-negative int repeats (tensor repeats have a data-dependent "
                       f"shape), got {repeats!r}")
    x = self.flatten() if dim is None else self
    d = 0 if dim is None else x._resolve_dim(dim)
    out = x.unsqueeze(d + 1).expand(*x.shape[:d + 1], repeats, *x.shape[d + 1:])
    return out.reshape(*x.shape[:d], x.shape[d] * repeats, *x.shape[d + 1:])
  def split(self: Tensor, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    """Split along `dim` into pieces of `sizes` (an int: equal pieces, the last may be smaller; a list: those sizes).

    >>> [t.tolist() for t in Tensor([1, 2, 3, 4, 5]).split(2)]
    [[1, 2], [3, 4], [5]]
    """
    d = self._resolve_dim(dim)
    n = int_size(self.shape[d], "split")
    if isinstance(sizes, int):
      if sizes <= 0: raise ShapeError(f"split size must be positive, got {sizes}")
      sizes = [min(sizes, n - i) for i in range(0, n, sizes)] or [0]
    if sum(sizes) != n:
      raise ShapeError(f"split sizes {list(sizes)} sum to {sum(sizes)}, not dim {d} of shape {self.shape}")
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    return tuple(self._slice_dim(d, o, o + s) for o, s in zip(offsets, sizes))
  def chunk(self: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """Split into `chunks` pieces of ceil(n / chunks) along `dim` (possibly fewer pieces, like torch.chunk).

    >>> [t.tolist() for t in Tensor([1, 2, 3, 4, 5]).chunk(2)]
    [[1, 2, 3], [4, 5]]
    """
    if chunks <= 0: raise ShapeError(f"chunk needs chunks > 0, got {chunks}")
    d = self._resolve_dim(dim)
    return self.split(max(1, -(-int_size(self.shape[d], "chunk") // chunks)), d)
  def unfold(self: Tensor, dim: int, size: int, step: int) -> Tensor:
    """Sliding windows of `size` with stride `step` along `dim`; the window becomes a new last dim (Tensor.unfold).

    >>> Tensor([1, 2, 3, 4, 5]).unfold(0, 2, 2).tolist()
    [[1, 2], [3, 4]]
    """
    d = self._resolve_dim(dim)
    n = int_size(self.shape[d], "unfold")
    if size > n or size < 0 or step <= 0:
      raise ShapeError(f"unfold size {size}, step {step} do not fit dim {d} of shape {self.shape}")
    count = (n - size) // step + 1
    wins = [self._slice_dim(d, k * step, k * step + size) for k in range(count)]
    out = wins[0].stack(*wins[1:], dim=d)  # (..., count, size, ...)
    return out.permute([i for i in range(out.ndim) if i != d + 1] + [d + 1])
  def diag(self: Tensor, diagonal: int = 0) -> Tensor:
    """1-d input: a square matrix with it on the `diagonal`; 2-d input: that diagonal as a 1-d tensor (torch.diag).

    >>> Tensor([1, 2]).diag().tolist()
    [[1, 0], [0, 2]]
    """
    if self.ndim == 2: return self.diagonal(diagonal)
    if self.ndim != 1: raise ShapeError(f"diag needs a 1-d or 2-d tensor, got shape {self.shape}")
    n = int_size(self.shape[0], "diag")
    eye = Tensor.arange(n, device=self.device).reshape(n, 1) == Tensor.arange(n, device=self.device).reshape(1, n)
    mat = eye.where(self.reshape(1, n), self._zero())
    k = abs(diagonal)
    return mat.pad(((0, k), (k, 0)) if diagonal >= 0 else ((k, 0), (0, k)))
  def _zero(self: Tensor) -> Any: return False if self.dtype is dtypes.bool else 0
  def diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The `offset` diagonal of the (dim1, dim2) planes, as a new last dim (torch.diagonal).

    >>> Tensor([[1, 2], [3, 4]]).diagonal().tolist()
    [1, 4]
    """
    d1, d2 = self._resolve_dim(dim1), self._resolve_dim(dim2)
    if d1 == d2: raise ShapeError(f"diagonal dims must differ, got dim1={dim1}, dim2={dim2} for shape {self.shape}")
    x = self.permute([i for i in range(self.ndim) if i not in (d1, d2)] + [d1, d2])
    rows, cols = int_size(x.shape[-2], "diagonal"), int_size(x.shape[-1], "diagonal")
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    length = max(0, min(rows - r0, cols - c0))
    lead = x.shape[:-2]
    if length == 0: return x.shrink(tuple((0, s) for s in lead) + ((0, 0), (0, 0))).reshape(*lead, 0)
    x = x.shrink(tuple((0, s) for s in lead) + ((r0, r0 + length), (c0, c0 + length)))
    # flat index i * (L + 1) is element (i, i): pad the flattened plane by L and view it as rows of L + 1
    flat = x.reshape(*lead, length * length).pad(((0, 0),) * len(lead) + ((0, length),))
    diag_rows = flat.reshape(*lead, length, length + 1)
    return diag_rows.shrink(tuple((0, s) for s in lead) + ((0, length), (0, 1))).reshape(*lead, length)
  def _tri_mask(self: Tensor, diagonal: int, lower: bool) -> Tensor:
    if self.ndim < 2: raise ShapeError(f"tril/triu need at least 2 dims, got shape {self.shape}")
    r, c = int_size(self.shape[-2], "triu/tril"), int_size(self.shape[-1], "triu/tril")
    rows = Tensor.arange(r, device=self.device).reshape(r, 1)
    cols = Tensor.arange(c, device=self.device).reshape(1, c)
    return (cols - rows <= diagonal) if lower else (cols - rows >= diagonal)
  def tril(self: Tensor, diagonal: int = 0) -> Tensor:
    """Keep the lower triangle (col - row <= diagonal) of the last two dims, zero the rest.

    >>> Tensor([[1, 2], [3, 4]]).tril().tolist()
    [[1, 0], [3, 4]]
    """
    return self._tri_mask(diagonal, True).where(self, self._zero())
  def triu(self: Tensor, diagonal: int = 0) -> Tensor:
    """Keep the upper triangle (col - row >= diagonal) of the last two dims, zero the rest.

    >>> Tensor([[1, 2], [3, 4]]).triu().tolist()
    [[1, 2], [0, 4]]
    """
    return self._tri_mask(diagonal, False).where(self, self._zero())
  def roll(self: Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
    """Rotate elements by `shifts` along `dims` (the flattened tensor when dims is None), like torch.roll.

    >>> Tensor([1, 2, 3, 4]).roll(1).tolist()
    [4, 1, 2, 3]
    """
    if dims is None: return self.flatten().roll(shifts, 0).reshape(self.shape)
    sh = [shifts] if isinstance(shifts, int) else list(shifts)
    ds = [dims] if isinstance(dims, int) else list(dims)
    if len(sh) != len(ds): raise ShapeError(f"roll needs as many shifts as dims, got shifts={sh}, dims={ds}")
    x = self
    for s, dim in zip(sh, ds):
      d = x._resolve_dim(dim)
      n = int_size(x.shape[d], "roll")
      if n == 0 or s % n == 0: continue
      k = s % n
      x = Tensor.cat(x._slice_dim(d, n - k, n), x._slice_dim(d, 0, n - k), dim=d)
    return x
  def unflatten(self: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
    """Split dim `dim` into `sizes` (one may be -1).

    >>> Tensor.arange(6).unflatten(0, (2, 3)).shape
    (2, 3)
    """
    d = self._resolve_dim(dim)
    return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1:])
  def _check_index_tensor(self: Tensor, index: Tensor, dim: int, op: str) -> None:
    if not dtypes.is_int(index.dtype): raise DTypeError(f"{op} index must be an int tensor, got {index.dtype!r}")
    if index.ndim != self.ndim:
      raise ShapeError(f"{op}: index shape {index.shape} must have as many dims as input {self.shape}")
    for i, (a, b) in enumerate(zip(int_shape(index.shape, op), int_shape(self.shape, op))):
      if i != dim and a > b:
        raise ShapeError(f"{op}: index shape {index.shape} exceeds input shape {self.shape} at dim {i}")
  def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
    """out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (torch.gather); out has index's shape.

    >>> Tensor([[1, 2], [3, 4]]).gather(1, Tensor([[1, 0], [0, 0]])).tolist()
    [[2, 1], [3, 3]]
    """
    if self.ndim == 0 and index.ndim == 0:  # torch treats a 0-d input and index as 1-d of one element
      self._resolve_dim(dim, extra=1)
      return self.reshape(1).gather(0, index.reshape(1)).reshape(())
    d = self._resolve_dim(dim)
    self._check_index_tensor(index, d, "gather")
    check_index_range(index, int_size(self.shape[d], "gather"), f"gather along dim {d}", low=0)
    return self._gather(d, index)
  def _gather(self: Tensor, d: int, index: Tensor) -> Tensor:
    """gather along resolved dim `d` of indices known to lie in it (an index outside selects zero)."""
    n = int_size(self.shape[d], "gather")
    x = self.shrink(tuple((0, n) if i == d else (0, s) for i, s in enumerate(index.shape)))
    xb = x.unsqueeze(-1).transpose(d, -1)  # dim d -> 1, values of dim d on the new last axis
    onehot = index.unsqueeze(-1) == Tensor.arange(n, device=self.device, dtype=index.dtype)
    picked = onehot.where(xb, self._zero())
    return picked.max(-1) if self.dtype is dtypes.bool else picked.sum(-1, dtype=picked.dtype)
  def _scatter_mask(self: Tensor, d: int, index: Tensor) -> Tensor:
    """(*index.shape, n): True where index[p] == m, n the size of dim `d` of self."""
    n = int_size(self.shape[d], "scatter")
    return index.unsqueeze(-1) == Tensor.arange(n, device=self.device, dtype=index.dtype)
  def _scatter_place(self: Tensor, d: int, index: Tensor, per_pos: Tensor) -> Tensor:
    """Move the trailing n axis of a (*index.shape-with-dim-d-reduced-to-1, n) tensor onto dim d, padded to self."""
    placed = per_pos.transpose(d, -1).squeeze(-1)
    return placed.pad(tuple((0, 0) if i == d else (0, s - t) for i, (s, t) in enumerate(zip(self.shape, placed.shape))))
  def _src_like(self: Tensor, src: Any, index: Tensor) -> Tensor:
    if isinstance(src, Tensor):
      if src.ndim != index.ndim or any(a > b for a, b in zip(int_shape(index.shape, "scatter"),
                                                              int_shape(src.shape, "scatter"))):
        raise ShapeError(f"scatter: src shape {src.shape} must cover index shape {index.shape}")
      return src.shrink(tuple((0, s) for s in index.shape)).cast(self.dtype)
    return Tensor.full(index.shape, src, dtype=self.dtype, device=self.device)
  def scatter(self: Tensor, dim: int, index: Tensor, src: Any, reduce: str | None = None) -> Tensor:
    """Write src[p] to self[..., index[p], ...] along `dim` (torch.scatter). With duplicate indices the last write
    wins; `reduce="add"` or `"multiply"` combines instead.

    >>> Tensor.zeros(3).scatter(0, Tensor([2, 0]), Tensor([5.0, 7.0])).tolist()
    [7.0, 0.0, 5.0]
    """
    if reduce is not None:
      mode = {"add": "sum", "multiply": "prod"}.get(reduce)
      if mode is None: raise ShapeError(f"scatter reduce must be None, 'add' or 'multiply', got {reduce!r}")
      return self.scatter_reduce(dim, index, src, mode)
    d = self._resolve_dim(dim)
    self._check_index_tensor(index, d, "scatter")
    check_index_range(index, int_size(self.shape[d], "scatter"), f"scatter along dim {d}", low=0)
    return self._scatter(d, index, src)
  def _scatter(self: Tensor, d: int, index: Tensor, src: Any) -> Tensor:
    """scatter along resolved dim `d` of indices known to lie in it (an index outside writes nowhere)."""
    values = self._src_like(src, index)
    mask = self._scatter_mask(d, index)  # (*I, n)
    k = int_size(index.shape[d], "scatter")
    pos = Tensor.arange(k, device=self.device, dtype=dtypes.int32).reshape((k,) + (1,) * (index.ndim - d))
    last = mask.where(pos, -1).max(d, keepdim=True)  # the last p along d that writes m
    chosen = mask & (pos == last)
    written = self._scatter_place(d, index, chosen.any(d, keepdim=True))
    total = chosen.where(values.unsqueeze(-1), self._zero())
    total = total.max(d, keepdim=True) if self.dtype is dtypes.bool else total.sum(d, keepdim=True, dtype=self.dtype)
    return written.where(self._scatter_place(d, index, total), self)
  def scatter_reduce(self: Tensor, dim: int, index: Tensor, src: Any, reduce: str, include_self: bool = True) -> Tensor:
    """Combine src[p] into self[..., index[p], ...] along `dim` with `reduce` in sum|prod|mean|amax|amin
    (torch.scatter_reduce); `include_self=False` ignores self's old value where something is written.

    >>> Tensor([1.0, 1.0]).scatter_reduce(0, Tensor([0, 0, 1]), Tensor([2.0, 3.0, 4.0]), "sum").tolist()
    [6.0, 5.0]
    """
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
      raise ShapeError(f"scatter_reduce reduce must be sum, prod, mean, amax or amin, got {reduce!r}")
    d = self._resolve_dim(dim)
    self._check_index_tensor(index, d, "scatter_reduce")
    check_index_range(index, int_size(self.shape[d], "scatter_reduce"), f"scatter_reduce along dim {d}", low=0)
    return self._scatter_reduce(d, index, src, reduce, include_self)
  def _scatter_reduce(self: Tensor, d: int, index: Tensor, src: Any, reduce: str, include_self: bool) -> Tensor:
    """scatter_reduce along resolved dim `d` of indices known to lie in it (an index outside writes nowhere)."""
    values = self._src_like(src, index).unsqueeze(-1)
    mask = self._scatter_mask(d, index)
    count = self._scatter_place(d, index, mask.cast(dtypes.int32).sum(d, keepdim=True))
    written = count > 0
    dt = self.dtype
    if reduce in ("sum", "mean"):
      part = self._scatter_place(d, index, mask.where(values, 0).sum(d, keepdim=True, dtype=dt))
      out = part + self if include_self else part
      if reduce == "mean":
        n = count + 1 if include_self else count.maximum(1)
        out = out // n if dtypes.is_int(dt) else out / n
    elif reduce == "prod":
      part = self._scatter_place(d, index, mask.where(values, 1).prod(d, keepdim=True, dtype=dt))
      out = part * self if include_self else part
    else:
      fill = dtypes.min(dt) if reduce == "amax" else dtypes.max(dt)
      if dtypes.is_float(dt): fill = -math.inf if reduce == "amax" else math.inf
      sel = mask.where(values, fill)
      red = sel.max(d, keepdim=True) if reduce == "amax" else sel.min(d, keepdim=True)
      part = self._scatter_place(d, index, red)
      out = (part.maximum(self) if reduce == "amax" else part.minimum(self)) if include_self else part
    return written.where(out.cast(dt), self)
  def index_select(self: Tensor, dim: int, index: Tensor) -> Tensor:
    """The entries of a 1-d int `index` along `dim` (torch.index_select): dim `dim` of the result has len(index).

    >>> Tensor([[1, 2], [3, 4], [5, 6]]).index_select(0, Tensor([2, 0])).tolist()
    [[5, 6], [1, 2]]
    """
    d = self._resolve_dim(dim)
    if not dtypes.is_int(index.dtype): raise DTypeError(f"index_select index must be int, got {index.dtype!r}")
    if index.ndim > 1: raise AxisError(f"index_select index must be 0-d or 1-d, got shape {index.shape}")
    return self[(slice(None),) * d + (index.reshape(-1),)]
  def one_hot(self: Tensor, num_classes: int = -1) -> Tensor:
    """One-hot encoding along a new last dim, in this tensor's int dtype (`num_classes=-1`: max + 1).

    >>> Tensor([0, 2]).one_hot(3).tolist()
    [[1, 0, 0], [0, 0, 1]]
    """
    if not dtypes.is_int(self.dtype):
      raise DTypeError(f"one_hot needs an int tensor of class indices, got {self.dtype!r}")
    if num_classes == -1:
      if self.numel() == 0: raise ShapeError("one_hot cannot infer num_classes from an empty tensor; pass num_classes")
      num_classes = int(self.max().item()) + 1
    if not isinstance(num_classes, int) or num_classes < 0:
      raise ShapeError(f"one_hot num_classes must be -1 (the largest index + 1) or a size >= 0, got {num_classes!r}")
    check_index_range(self, num_classes, f"one_hot with {num_classes} classes", low=0)
    return self._one_hot(num_classes)
  def _one_hot(self: Tensor, num_classes: int) -> Tensor:
    """one_hot of indices known to lie in [0, num_classes) (one outside gives a row of zeros)."""
    dt = strong_dtype(self.dtype)
    return (self.unsqueeze(-1) == Tensor.arange(num_classes, device=self.device, dtype=dt)).cast(dt)
  def masked_fill(self: Tensor, mask: Tensor, value: Any) -> Tensor:
    """`value` where `mask` is True, self elsewhere; the dtype stays self's.

    >>> Tensor([1, 2, 3]).masked_fill(Tensor([True, False, True]), 0).tolist()
    [0, 2, 0]
    """
    if mask.dtype is not dtypes.bool: raise DTypeError(f"masked_fill mask must be bool, got {mask.dtype!r}")
    check_scalar_fits(value, self.dtype, "masked_fill")
    v = value.cast(self.dtype) if isinstance(value, Tensor) else Tensor(_const_uop(value, self.dtype, self.device))
    return mask.where(v, self)
  def _flat_true_positions(self: Tensor, count: int) -> Tensor:
    """Flat positions of the first `count` True entries of this bool tensor (-1 for missing rows), as int32."""
    flat = self.flatten()
    n = int_size(flat.shape[0], "nonzero")
    rank = flat.cast(dtypes.int32).cumsum() - 1
    k = Tensor.arange(count, device=self.device, dtype=dtypes.int32).reshape(count, 1)
    hit = flat.reshape(1, n) & (rank.reshape(1, n) == k)  # (count, n)
    pos = Tensor.arange(n, device=self.device, dtype=dtypes.int32).reshape(1, n)
    return hit.any(1).where(hit.where(pos, 0).sum(1, dtype=dtypes.int32), -1)
  def masked_select(self: Tensor, mask: Tensor, size: int | None = None, fill_value: Any = 0) -> Tensor:
    """The elements where `mask` (broadcast to self) is True, as a 1-d tensor. Without `size` its length depends on
    the data, so this realizes `mask`; with `size` it has that length (no sync): the first `size` selected elements,
    then `fill_value`.

    >>> Tensor([1, 2, 3]).masked_select(Tensor([True, False, True])).tolist()
    [1, 3]
    >>> Tensor([1, 2, 3]).masked_select(Tensor([True, False, True]), size=4, fill_value=-1).tolist()
    [1, 3, -1, -1]
    """
    if mask.dtype is not dtypes.bool: raise DTypeError(f"masked_select mask must be bool, got {mask.dtype!r}")
    if size is not None and size < 0: raise ShapeError(f"masked_select size must be >= 0, got {size}")
    shp = broadcast_shape(self.shape, mask.shape)
    x, m = self._broadcast_to(shp).flatten(), mask._broadcast_to(shp).flatten()
    count = size if size is not None else int(m.cast(dtypes.int32).sum().item())
    if count == 0: return Tensor.empty(0, dtype=strong_dtype(self.dtype), device=self.device)
    pos = m._flat_true_positions(count)  # -1 past the last selected element
    picked = x[pos.maximum(0)] if x.shape[0] else Tensor.full((count,), fill_value, dtype=x.dtype, device=x.device)
    return picked if size is None else (pos < 0).where(Tensor.full((count,), fill_value, dtype=x.dtype,
                                                                  device=x.device), picked)
  def nonzero(self: Tensor, size: int | None = None, fill_value: int = -1) -> Tensor:
    """Indices of the nonzero elements, shape (count, ndim), int32, in row-major order. Without `size` the count is
    read from the data (a sync); with `size` the result has exactly that many rows, padded with `fill_value`.

    >>> Tensor([[0, 1], [2, 0]]).nonzero().tolist()
    [[0, 1], [1, 0]]
    """
    if size is not None and size < 0: raise ShapeError(f"nonzero size must be >= 0, got {size}")
    m = self != 0
    count = size if size is not None else int(m.cast(dtypes.int32).sum().item())
    # a 0-d tensor has no coordinates: one empty row when it is nonzero (torch)
    if count == 0 or self.ndim == 0: return Tensor.empty(count, self.ndim, dtype=dtypes.int32, device=self.device)
    flat = m._flat_true_positions(count)
    coords = []
    stride = 1
    for s in reversed(self.shape):
      coords.append((flat // stride) % int_size(s, "nonzero"))
      stride *= int_size(s, "nonzero")
    ret = Tensor.stack(*reversed(coords), dim=1)
    return (flat < 0).unsqueeze(1).where(fill_value, ret).cast(dtypes.int32)
  def _sort_rank(self: Tensor, d: int, descending: bool) -> Tensor:
    """Stable rank of each element along the last axis of a (..., n) tensor: NaN sorts as the largest value."""
    n = int_size(self.shape[-1], "sort")
    a, b = self.unsqueeze(-1), self.unsqueeze(-2)  # (..., i, 1) vs (..., 1, j)
    if dtypes.is_float(self.dtype):
      a_nan, b_nan = a.isnan(), b.isnan()
      b_before = ((b > a) | (b_nan & a_nan.logical_not())) if descending else ((b < a) | (a_nan & b_nan.logical_not()))
      ties = (a == b) | (a_nan & b_nan)
    else:
      b_before = (b > a) if descending else (b < a)
      ties = a == b
    i = Tensor.arange(n, device=self.device, dtype=dtypes.int32)
    earlier = i.reshape(1, n) < i.reshape(n, 1)  # (i, j): j < i
    return (b_before | (ties & earlier)).cast(dtypes.int32).sum(-1, dtype=dtypes.int32)
  def sort(self: Tensor, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    """Stable sort along `dim`: (values, int32 indices). NaN sorts as the largest value, like torch.

    >>> [t.tolist() for t in Tensor([3, 1, 2]).sort()]
    [[1, 2, 3], [1, 2, 0]]
    """
    if self.ndim == 0: return self, Tensor(0, dtype=dtypes.int32, device=self.device)
    d = self._resolve_dim(dim)
    x = self.transpose(d, -1) if self.ndim > 1 else self
    n = int_size(x.shape[-1], "sort")
    rank = x.detach()._sort_rank(d, descending)  # (..., n): where element i lands
    slot = rank.unsqueeze(-2) == Tensor.arange(n, device=self.device, dtype=dtypes.int32).reshape(n, 1)  # (..., r, i)
    vals = slot.where(x.unsqueeze(-2), x._zero())
    vals = vals.max(-1) if x.dtype is dtypes.bool else vals.sum(-1, dtype=x.dtype)
    idx = slot.where(Tensor.arange(n, device=self.device, dtype=dtypes.int32), 0).sum(-1, dtype=dtypes.int32)
    if self.ndim > 1: vals, idx = vals.transpose(d, -1), idx.transpose(d, -1)
    return vals, idx
  def argsort(self: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
    """The int32 indices that sort the tensor along `dim` (stable).

    >>> Tensor([3, 1, 2]).argsort().tolist()
    [1, 2, 0]
    """
    return self.sort(dim, descending)[1]
  def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Tensor, Tensor]:
    """The `k` largest (or smallest) elements along `dim` and their int32 indices, always in sorted order (which
    `sorted=False` also allows).

    >>> [t.tolist() for t in Tensor([1, 5, 3]).topk(2)]
    [[5, 3], [1, 2]]
    """
    d = self._resolve_dim(dim) if self.ndim else 0
    n = int_size(self.shape[d], "topk") if self.ndim else 1
    if not 0 <= k <= n: raise ShapeError(f"topk k={k} is out of range for dim {d} of size {n} (shape {self.shape})")
    vals, idx = self.sort(d, descending=largest)
    if self.ndim == 0: return vals, idx
    return vals._slice_dim(d, 0, k), idx._slice_dim(d, 0, k)
