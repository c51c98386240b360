"""Shape and data movement: Reshape, Transpose, Slice, Concat, Split, Pad, Expand, Tile, Gather/Scatter families,
constants (Constant, ConstantOfShape, Range, EyeLike, OneHot) and Trilu, NonZero, Compress, DepthToSpace.

Shape-like inputs (a Reshape's shape, a Slice's starts) are read as Python ints: ember shapes are static, so reading
them realizes the (small) tensors they come from."""
from __future__ import annotations
import math
from typing import Any
from ember import Tensor, dtypes
from ember.errors import ShapeError
from ember.nn.onnx.errors import UnsupportedOpError
from ember.nn.onnx.registry import NodeContext, onnx_op
from ember.nn.onnx.ops.common import dim, dims, axes_of, axis as norm_axis, ints, scalar

def _reshape(x: Tensor, shape: list[int], allowzero: int) -> Tensor:
  new = [dim(x, i) if d == 0 and not allowzero else d for i, d in enumerate(shape)]
  if -1 in new:
    known = math.prod(d for d in new if d != -1)
    new[new.index(-1)] = math.prod(dims(x)) // known if known else 0
  return x.reshape(new)

@onnx_op("Reshape")
def reshape_1(x: Tensor, shape: list[int] | None = None, consumed_inputs: Any = None) -> Tensor:
  return _reshape(x, list(shape or []), 0)

@onnx_op("Reshape", since=5)
def reshape(x: Tensor, shape: Tensor, allowzero: int = 0) -> Tensor: return _reshape(x, ints(shape) or [], allowzero)

@onnx_op("Flatten")
def flatten(x: Tensor, axis: int = 1) -> Tensor:
  a = axis + x.ndim if axis < 0 else axis
  return x.reshape(math.prod(dims(x)[:a]), math.prod(dims(x)[a:]))

@onnx_op("Transpose")
def transpose(x: Tensor, perm: list[int] | None = None) -> Tensor:
  return x.permute(*(perm if perm is not None else range(x.ndim - 1, -1, -1)))

def _squeeze(x: Tensor, axes: list[int] | None) -> Tensor:
  if axes is None: return x.reshape([d for d in x.shape if d != 1])
  ax = set(axes_of(axes, x.ndim))
  bad = [a for a in ax if x.shape[a] != 1]
  if bad: raise ShapeError(f"Squeeze axes {sorted(bad)} of shape {x.shape} are not of size 1")
  return x.reshape([d for i, d in enumerate(x.shape) if i not in ax])

@onnx_op("Squeeze")
def squeeze_1(x: Tensor, axes: list[int] | None = None) -> Tensor: return _squeeze(x, axes)
@onnx_op("Squeeze", since=13)
def squeeze(x: Tensor, axes: Tensor | None = None) -> Tensor: return _squeeze(x, ints(axes))

def _unsqueeze(x: Tensor, axes: list[int]) -> Tensor:
  rank = x.ndim + len(axes)
  ax = set(axes_of(axes, rank))
  new, it = [], iter(x.shape)
  for i in range(rank): new.append(1 if i in ax else next(it))
  return x.reshape(new)

@onnx_op("Unsqueeze")
def unsqueeze_1(x: Tensor, axes: list[int]) -> Tensor: return _unsqueeze(x, axes)
@onnx_op("Unsqueeze", since=13)
def unsqueeze(x: Tensor, axes: Tensor) -> Tensor: return _unsqueeze(x, ints(axes) or [])

@onnx_op("Concat")
def concat(*xs: Tensor, axis: int = 1) -> Tensor:
  a = norm_axis(axis, xs[0].ndim)
  parts = [x for x in xs if x.shape[a] != 0] or [xs[0]]
  return parts[0].cat(*parts[1:], dim=a) if len(parts) > 1 else parts[0]

def _split(x: Tensor, split: list[int] | None, axis: int, n_out: int, num_outputs: int | None = None) -> list[Tensor]:
  a = norm_axis(axis, x.ndim)
  size = dim(x, a)
  if not split:
    if num_outputs is not None:  # opset 18: chunks of ceil(size / n), the last one smaller
      step = -(-size // num_outputs)
      split = [min(step, size - i * step) for i in range(num_outputs)]
    else: split = [size // n_out + (1 if i < size % n_out else 0) for i in range(n_out)]
  if sum(split) != size: raise ShapeError(f"Split sizes {split} do not add up to dim {a} of size {size}")
  out, start = [], 0
  for s in split:
    out.append(x.shrink([(start, start + s) if i == a else None for i in range(x.ndim)]))
    start += s
  return out

@onnx_op("Split", ctx=True)
def split_1(x: Tensor, split_in: Tensor | None = None, axis: int = 0, split: list[int] | None = None, *,
            ctx: NodeContext) -> list[Tensor]:
  return _split(x, split or ints(split_in), axis, len(ctx.outputs))
@onnx_op("Split", since=13, ctx=True)
def split_13(x: Tensor, split: Tensor | None = None, axis: int = 0, num_outputs: int | None = None, *,
             ctx: NodeContext) -> list[Tensor]:
  return _split(x, ints(split), axis, len(ctx.outputs), num_outputs)

def _slice(x: Tensor, starts: list[int], ends: list[int], axes: list[int] | None, steps: list[int] | None) -> Tensor:
  index: list[Any] = [slice(None)] * x.ndim
  for i, a in enumerate(axes_of(axes if axes is not None else range(len(starts)), x.ndim)):
    step = steps[i] if steps else 1
    if step == 0: raise ShapeError("Slice steps must not be 0")
    index[a] = slice(starts[i], ends[i], step)
  return x[tuple(index)] if index else x

@onnx_op("Slice")
def slice_1(x: Tensor, starts: list[int], ends: list[int], axes: list[int] | None = None) -> Tensor:
  return _slice(x, starts, ends, axes, None)
@onnx_op("Slice", since=10)
def slice_10(x: Tensor, starts: Tensor, ends: Tensor, axes: Tensor | None = None,
             steps: Tensor | None = None) -> Tensor:
  return _slice(x, ints(starts) or [], ints(ends) or [], ints(axes), ints(steps))

@onnx_op("Expand", since=8)
def expand(x: Tensor, shape: Tensor) -> Tensor:
  want = ints(shape) or []
  rank = max(len(want), x.ndim)
  xs = [1] * (rank - x.ndim) + dims(x)
  ds = [1] * (rank - len(want)) + want
  out = [a if b == 1 else b for a, b in zip(xs, ds)]
  return x.reshape(xs).expand(out)

@onnx_op("Tile")
def tile(x: Tensor, repeats: Tensor, *legacy: Tensor) -> Tensor:
  reps = ints(repeats) or []
  if legacy:  # opset 1: Tile(input, tiles, axis) repeats one axis
    reps = [int(scalar(repeats)) if i == int(scalar(legacy[0])) else 1 for i in range(x.ndim)]
  return x.repeat(reps) if reps else x

def _pad(x: Tensor, pads: list[int], mode: str, value: Any, axes: list[int] | None = None) -> Tensor:
  ax = axes_of(axes, x.ndim) if axes is not None else list(range(x.ndim))
  pairs = [(0, 0)] * x.ndim
  for i, a in enumerate(ax): pairs[a] = (pads[i], pads[i + len(ax)])
  if mode == "constant": return x.pad(pairs, value=value).cast(x.dtype)
  if mode not in ("reflect", "edge", "wrap"): raise UnsupportedOpError(f"Pad mode {mode!r}")
  return x.pad(pairs, mode={"edge": "replicate", "wrap": "circular"}.get(mode, mode))

@onnx_op("Pad")
def pad_1(x: Tensor, paddings: list[int] | None = None, pads: list[int] | None = None, mode: str = "constant",
          value: float = 0.0) -> Tensor:
  return _pad(x, list(pads if pads is not None else paddings or []), mode, value)
@onnx_op("Pad", since=11)
def pad_11(x: Tensor, pads: Tensor, constant_value: Tensor | None = None, axes: Tensor | None = None,
           mode: str = "constant") -> Tensor:
  value = scalar(constant_value) if constant_value is not None and constant_value.numel() else 0
  return _pad(x, ints(pads) or [], mode, value, ints(axes))

def _index_on(x: Tensor, axis: int, index: Tensor) -> Tensor:
  """numpy's x.take(index, axis): negative indices count from the end."""
  n = dim(x, axis)
  index = (index < 0).where(index + n, index)
  return x[(slice(None),) * axis + (index,)]

@onnx_op("Gather")
def gather(x: Tensor, indices: Tensor, axis: int = 0) -> Tensor:
  return _index_on(x, norm_axis(axis, x.ndim), indices)

@onnx_op("GatherElements", since=11)
def gather_elements(x: Tensor, indices: Tensor, axis: int = 0) -> Tensor:
  a = norm_axis(axis, x.ndim)
  return x.gather(a, (indices < 0).where(indices + dim(x, a), indices))

@onnx_op("GatherND", since=11)
def gather_nd(x: Tensor, indices: Tensor, batch_dims: int = 0) -> Tensor:
  k = dim(indices, -1)
  batch = dims(x)[:batch_dims]
  nb = math.prod(batch)
  xb = x.reshape(nb, *x.shape[batch_dims:])
  ib = indices.reshape(nb, -1, k) if indices.numel() else indices.reshape(nb, 0, k)
  sizes = dims(xb)[1:1 + k]
  idx = ib.cast(dtypes.int64)
  idx = (idx < 0).where(idx + Tensor(sizes, dtype=dtypes.int64, device=x.device), idx)
  b = Tensor.arange(nb, dtype=dtypes.int64, device=x.device).reshape(nb, 1).expand(nb, dim(ib, 1))
  picked = xb[(b, *(idx[:, :, j] for j in range(k)))]  # (nb, m, *rest)
  return picked.reshape(*batch, *indices.shape[batch_dims:-1], *x.shape[batch_dims + k:])

def _scatter_reduce_name(reduction: str) -> str:
  names = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}
  if reduction not in names: raise UnsupportedOpError(f"scatter reduction {reduction!r}")
  return names[reduction]

@onnx_op("ScatterElements", since=11)
def scatter_elements(x: Tensor, indices: Tensor, updates: Tensor, axis: int = 0, reduction: str = "none") -> Tensor:
  a = norm_axis(axis, x.ndim)
  idx = (indices < 0).where(indices + dim(x, a), indices)
  if reduction == "none": return x.scatter(a, idx, updates)
  return x.scatter_reduce(a, idx, updates, _scatter_reduce_name(reduction), include_self=True).cast(x.dtype)

onnx_op("Scatter", since=9)(scatter_elements)

@onnx_op("ScatterND", since=11)
def scatter_nd(x: Tensor, indices: Tensor, updates: Tensor, reduction: str = "none") -> Tensor:
  k = dim(indices, -1)
  lead = dims(x)[:k]
  rest = dims(x)[k:]
  idx = indices.reshape(-1, k).cast(dtypes.int64)
  n = dim(idx, 0)
  if n == 0: return x
  strides = [math.prod(lead[j + 1:]) for j in range(k)]
  flat = sum(((idx[:, j] < 0).where(idx[:, j] + lead[j], idx[:, j]) * strides[j] for j in range(k)),
             Tensor.zeros(n, dtype=dtypes.int64, device=x.device))
  xf = x.reshape(math.prod(lead), *rest)
  uf = updates.reshape(n, *rest)
  where_ = flat.reshape(n, *([1] * len(rest))).expand(n, *rest)
  if reduction == "none": out = xf.scatter(0, where_, uf)
  else: out = xf.scatter_reduce(0, where_, uf, _scatter_reduce_name(reduction), include_self=True).cast(x.dtype)
  return out.reshape(x.shape)

@onnx_op("Constant")
def constant(value: Tensor | None = None, value_float: float | None = None, value_floats: list[float] | None = None,
             value_int: int | None = None, value_ints: list[int] | None = None, value_string: str | None = None,
             value_strings: list[str] | None = None, sparse_value: Any = None) -> Tensor:
  if value is not None: return value
  if value_float is not None: return Tensor(value_float, dtype=dtypes.float32)
  if value_floats is not None: return Tensor(value_floats, dtype=dtypes.float32)
  if value_int is not None: return Tensor(value_int, dtype=dtypes.int64)
  if value_ints is not None: return Tensor(value_ints, dtype=dtypes.int64)
  raise UnsupportedOpError("Constant of strings or of a sparse tensor: ember has no string or sparse tensors")

@onnx_op("ConstantOfShape", since=9)
def constant_of_shape(shape: Tensor, value: Tensor | None = None) -> Tensor:
  out_shape = ints(shape) or []
  if value is None: return Tensor.full(tuple(out_shape), 0.0, dtype=dtypes.float32, device=shape.device)
  v = value.reshape(-1)[0].item() if value.ndim else value.item()
  return Tensor.full(tuple(out_shape), v, dtype=value.dtype, device=shape.device)

@onnx_op("Range", since=11)
def range_(start: Tensor, limit: Tensor, delta: Tensor) -> Tensor:
  s, e, d = scalar(start), scalar(limit), scalar(delta)
  n = max(math.ceil((e - s) / d), 0)
  return (Tensor.arange(n, dtype=start.dtype, device=start.device) * d + s).cast(start.dtype) if n else \
    Tensor.zeros(0, dtype=start.dtype, device=start.device)

@onnx_op("EyeLike", since=9)
def eye_like(x: Tensor, dtype: int | None = None, k: int = 0) -> Tensor:
  from ember.nn.onnx.model import to_dtype
  dt = to_dtype(dtype, "EyeLike dtype") if dtype is not None else x.dtype
  rows, cols = dims(x)
  r = Tensor.arange(rows, device=x.device).reshape(rows, 1)
  return (r + k == Tensor.arange(cols, device=x.device).reshape(1, cols)).cast(dt)

@onnx_op("Trilu", since=14)
def trilu(x: Tensor, k: Tensor | None = None, upper: int = 1) -> Tensor:
  kk = int(scalar(k)) if k is not None else 0
  return x.triu(kk) if upper else x.tril(kk)

@onnx_op("OneHot", since=9)
def one_hot(indices: Tensor, depth: Tensor, values: Tensor, axis: int = -1) -> Tensor:
  n = int(scalar(depth))
  a = norm_axis(axis, indices.ndim + 1)
  idx = indices.cast(dtypes.int64)
  idx = (idx < 0).where(idx + n, idx).unsqueeze(a)
  classes = Tensor.arange(n, dtype=dtypes.int64, device=indices.device).reshape(
    [n if i == a else 1 for i in range(indices.ndim + 1)])
  off, on = values[0], values[1]
  return (idx == classes).where(on, off).cast(values.dtype)

@onnx_op("NonZero", since=9)
def non_zero(x: Tensor) -> Tensor:
  return (x if x.ndim else x.reshape(1)).nonzero().cast(dtypes.int64).T.contiguous()

@onnx_op("Compress", since=9)
def compress(x: Tensor, condition: Tensor, axis: int | None = None) -> Tensor:
  if axis is None: x, a = x.reshape(-1), 0
  else: a = norm_axis(axis, x.ndim)
  keep = [i for i, c in enumerate(condition.reshape(-1).tolist()) if c and i < dim(x, a)]
  if not keep: return x.shrink([(0, 0) if i == a else None for i in range(x.ndim)])
  return _index_on(x, a, Tensor(keep, dtype=dtypes.int64, device=x.device))

@onnx_op("DepthToSpace")
def depth_to_space(x: Tensor, blocksize: int, mode: str = "DCR") -> Tensor:
  b, c, h, w = dims(x)
  s = blocksize
  if mode == "DCR": y = x.reshape(b, s, s, c // (s * s), h, w).permute(0, 3, 4, 1, 5, 2)
  else: y = x.reshape(b, c // (s * s), s, s, h, w).permute(0, 1, 4, 2, 5, 3)
  return y.reshape(b, c // (s * s), h * s, w * s)

@onnx_op("SpaceToDepth")
def space_to_depth(x: Tensor, blocksize: int, mode: str = "DCR") -> Tensor:
  b, c, h, w = dims(x)
  s = blocksize
  blocks = x.reshape(b, c, h // s, s, w // s, s)
  # DCR: output channel (block row, block col, c); CRD: (c, block row, block col)
  y = blocks.permute(0, 3, 5, 1, 2, 4) if mode == "DCR" else blocks.permute(0, 1, 3, 5, 2, 4)
  return y.reshape(b, c * s * s, h // s, w // s)

@onnx_op("ReverseSequence", since=10)
def reverse_sequence(x: Tensor, sequence_lens: Tensor, batch_axis: int = 1, time_axis: int = 0) -> Tensor:
  t, nb = dim(x, time_axis), dim(x, batch_axis)
  lens = sequence_lens.cast(dtypes.int64).reshape([nb if i == batch_axis else 1 for i in range(x.ndim)])
  pos = Tensor.arange(t, dtype=dtypes.int64, device=x.device).reshape([t if i == time_axis else 1
                                                                        for i in range(x.ndim)])
  src = (pos < lens).where(lens - 1 - pos, pos)
  shape = dims(x)
  return x.gather(time_axis, src.expand(shape))

@onnx_op("CenterCropPad", since=18)
def center_crop_pad(x: Tensor, shape: Tensor, axes: list[int] | None = None) -> Tensor:
  sizes = ints(shape) or []
  ax = axes_of(axes, x.ndim) if axes is not None else list(range(x.ndim))
  for a, s in zip(ax, sizes):
    n = dim(x, a)
    if s < n:
      begin = (n - s) // 2
      x = x.shrink([(begin, begin + s) if i == a else None for i in range(x.ndim)])
    elif s > n:
      before = (s - n) // 2
      x = x.pad([(before, s - n - before) if i == a else (0, 0) for i in range(x.ndim)])
  return x
