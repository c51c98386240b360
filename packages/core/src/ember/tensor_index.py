"""`Tensor.__getitem__`: ints, slices with steps, None, Ellipsis and tensor/list indices, as movement ops + gathers."""
from __future__ import annotations
from typing import Any, TYPE_CHECKING
import numpy as np
from ember.errors import AxisError, IndexingError, IndexRangeError
from ember.dtype import dtypes
from ember.uop.ops import Ops, UOp, int_size
if TYPE_CHECKING:
  from ember.tensor import Tensor

class HostIndex:
  """A list/tuple index into one dim, its values known on the host: range-checked there (no sync), never again.
  `mask_len`: the length of the dim a bool mask's level covers (the dim must be that long)."""
  __slots__ = ("values", "mask_len")
  def __init__(self, values: np.ndarray, mask_len: int | None = None) -> None:
    self.values, self.mask_len = values, mask_len

def _host_indices(i: list | tuple | np.ndarray) -> list[HostIndex]:
  """A list (or tuple, nested) inside an index as torch reads it: ints index one dim; bools are a mask over as many
  dims as the list has levels (its True positions, one HostIndex per dim). Anything else is refused: an int32 cast
  would have turned 0.5 into 0 and True into 1, a silently different selection."""
  try: arr = np.asarray(i)
  except ValueError as e: raise IndexingError(f"a list index must be rectangular (all rows one length): {e}") from None
  if arr.size == 0: return [HostIndex(np.zeros(arr.shape, np.int64))]
  if arr.dtype == np.bool_: return [HostIndex(np.asarray(p, np.int64), n) for p, n in zip(np.nonzero(arr), arr.shape)]
  if arr.dtype.kind not in "iu" or arr.dtype == object:
    kinds = sorted({type(v).__name__ for v in arr.reshape(-1).tolist()})
    raise IndexingError(f"list indices must hold ints (or bools, a mask), got {', '.join(kinds)}; convert them first")
  return [HostIndex(arr.astype(np.int64))]

def _norm_index(indices: Any) -> list[Any]:
  idx: list[Any] = []
  for i in (list(indices) if isinstance(indices, tuple) else [indices]):
    if isinstance(i, (list, tuple)) or (isinstance(i, np.ndarray) and i.ndim > 0): idx.extend(_host_indices(i))
    elif getattr(i, "dtype", None) is dtypes.bool and hasattr(i, "uop"):  # a bool Tensor: a mask, read on the host
      if not data_checks_run():
        raise IndexingError("a boolean mask tensor cannot index inside a TinyJit capture or an ember.function trace: "
                            "the result's shape depends on the mask's values; use where() or masked_fill() there")
      idx.extend(_host_indices(i.numpy()))
    else: idx.append(i)
  if sum(1 for i in idx if i is Ellipsis) > 1: raise IndexingError("an index can only have a single ellipsis ('...')")
  return idx

def _strided(x: Tensor, dim: int, start: int, stop: int, step: int) -> Tensor:
  """Elements start, start+step, ... (< stop for step > 0) of dim, via shrink/flip/reshape (no copies)."""
  n = int_size(x.shape[dim], "a strided slice")
  if step < 0:
    x = x.flip(dim)
    start, stop, step = n - 1 - start, n - 1 - stop, -step
  count = max(0, -(-(stop - start) // step))
  end = min(start + count * step, n) if count else start
  x = x.shrink(tuple((start, end) if i == dim else (0, s) for i, s in enumerate(x.shape)))
  if step == 1 or count == 0: return x
  # pad the dim to count*step, view it as (count, step) and keep column 0
  length = x.shape[dim]
  x = x.pad(tuple((0, count * step - length) if i == dim else (0, 0) for i in range(x.ndim)))
  x = x.reshape(x.shape[:dim] + (count, step) + x.shape[dim + 1:])
  x = x.shrink(tuple((0, 1) if i == dim + 1 else (0, s) for i, s in enumerate(x.shape)))
  return x.reshape(x.shape[:dim + 1] + x.shape[dim + 2:])

def getitem(x: Tensor, indices: Any) -> Tensor:
  from ember.tensor import Tensor
  idx = _norm_index(indices)
  consumed = sum(1 for i in idx if i is not None and i is not Ellipsis and not isinstance(i, (bool, np.bool_)))
  if consumed > x.ndim: raise AxisError(f"too many indices for tensor of shape {x.shape}: {consumed} given")
  if any(i is Ellipsis for i in idx):
    e = next(k for k, i in enumerate(idx) if i is Ellipsis)  # identity: `in`/index() would call Tensor.__eq__
    idx = idx[:e] + [slice(None)] * (x.ndim - consumed) + idx[e + 1:]
  else:
    idx = idx + [slice(None)] * (x.ndim - consumed)
  out = x
  dim = 0
  tensor_dims: list[tuple[int, Tensor]] = []
  checked: set[int] = set()  # dims whose (list) index was range-checked on the host
  squeeze: list[int] = []
  for i in idx:
    if i is None or isinstance(i, (bool, np.bool_)):  # True adds a dim as None does; False one of size 0 (torch)
      out = out.unsqueeze(dim)
      if i is not None and not i:
        out = out.shrink(tuple((0, 0) if k == dim else (0, n) for k, n in enumerate(out.shape)))
      dim += 1
    elif isinstance(i, slice) and any(isinstance(v, UOp) for v in (i.start, i.stop)):
      # symbolic bounds (a bound Variable): a plain shrink, e.g. the filled part of a KV cache `cache[:, :pos+1]`
      if i.step not in (None, 1): raise IndexingError("a slice with symbolic bounds must have step 1")
      lo, hi = (0 if i.start is None else i.start), (out.shape[dim] if i.stop is None else i.stop)
      out = out.shrink(tuple((lo, hi) if k == dim else (0, s) for k, s in enumerate(out.shape)))
      dim += 1
    elif isinstance(i, slice):
      if i.step == 0: raise IndexingError("slice step cannot be zero")
      start, stop, step = i.indices(int_size(out.shape[dim], "a slice with int bounds"))
      out = _strided(out, dim, start, stop, step)
      dim += 1
    elif isinstance(i, int) or (hasattr(i, "__index__") and not isinstance(i, (Tensor, list, tuple))):
      n = int_size(out.shape[dim], "an int index")
      v = int(i)
      if not -n <= v < n: raise AxisError(f"index {v} is out of bounds for dim {dim} of size {n}")
      v = v + n if v < 0 else v
      out = out.shrink(tuple((v, v + 1) if k == dim else (0, s) for k, s in enumerate(out.shape)))
      squeeze.append(dim)
      dim += 1
    elif isinstance(i, HostIndex):
      n = int_size(out.shape[dim], "a list index")
      if i.mask_len is not None and i.mask_len != n:
        raise IndexRangeError(f"a mask of length {i.mask_len} cannot index dim {dim} of size {n}: one bool per element")
      if i.values.size and not (-n <= int(i.values.min()) and int(i.values.max()) < n):
        bad = next(int(v) for v in i.values.reshape(-1) if not -n <= int(v) < n)
        raise IndexRangeError(f"a list index into dim {dim} of size {n}: index {bad} is out of range [{-n}, {n})")
      tensor_dims.append((dim, Tensor(i.values.astype(np.int32), device=x.device)))
      checked.add(dim)
      dim += 1
    elif isinstance(i, Tensor):
      if not dtypes.is_int(i.dtype): raise AxisError(f"tensor indices must be int, got {i.dtype!r}; cast with .int()")
      tensor_dims.append((dim, i))
      dim += 1
    elif isinstance(i, UOp):
      out = out.shrink(tuple((i, i + 1) if k == dim else (0, s) for k, s in enumerate(out.shape)))
      squeeze.append(dim)
      dim += 1
    else:
      raise IndexingError(f"unsupported index type {type(i).__name__}: index with ints, slices, None, ..., lists or "
                          "int/bool Tensors")
  if tensor_dims: out = _gather_dims(out, tensor_dims, squeeze, checked)
  elif squeeze: out = out.reshape(tuple(s for k, s in enumerate(out.shape) if k not in squeeze))
  return out

def data_checks_run() -> bool:
  """Whether checks that read tensor data (index ranges, multinomial weights) run now: not while TinyJit captures
  (its replays could not run them) nor while an `ember.function` body is traced (its inputs are stand-in buffers then,
  their contents arbitrary)."""
  from ember.engine.jit import capturing
  from ember.function import _tracing
  return not (capturing() or _tracing[0])

HOST_CHECK_MAX = 1 << 22  # index tensors up to this many elements that are already one buffer are checked on the host

def check_index_range(index: Tensor, size: int, what: str, low: int | None = None, skip: int | None = None) -> None:
  """IndexRangeError when int tensor `index` holds a value outside [low, size) (low defaults to -size: negative
  indices count from the end), other than `skip` (an ignore_index): what torch checks, where ember's one-hot gathers
  would read zeros and its scatters write nowhere. The check reads the indices (a sync), only where `data_checks_run`;
  in a replay such an index selects zeros. `what` starts the message."""
  if not data_checks_run() or not all(isinstance(s, int) for s in index.shape) or index.numel() == 0: return
  lo = -size if low is None else low
  if index.is_realized and index.numel() <= HOST_CHECK_MAX:  # numpy() copies it out, with no kernel
    # already in memory (a batch's targets, ids read from a file): read on the host, with no kernel to schedule,
    # compile and wait for (a cold first call of a train step waited ~90 ms of gcc for this check's kernel alone)
    flat = index.numpy().reshape(-1).astype(np.int64)
    bad_np = (flat < lo) | (flat >= size)
    if skip is not None: bad_np &= flat != skip
    if not bad_np.any(): return
    raise IndexRangeError(f"{what}: index {int(flat[np.argmax(bad_np)])} is out of range [{lo}, {size})")
  bad = (index < lo) | (index >= size)
  if skip is not None: bad = bad & (index != skip)
  if not bad.any().item(): return
  flat = index.flatten().numpy()
  value = next(int(v) for v in flat if not lo <= int(v) < size and int(v) != skip)
  raise IndexRangeError(f"{what}: index {value} is out of range [{lo}, {size})")

def _gather_dims(x: Tensor, tensor_dims: list[tuple[int, Tensor]], squeeze: list[int],
                 checked: frozenset[int] | set[int] = frozenset()) -> Tensor:
  """Advanced indexing: broadcast the index tensors together; the indexed dims are replaced by the index shape,
  placed where the first indexed dim was (numpy rules for adjacent indices) or in front (non-adjacent)."""
  from ember.tensor import Tensor, broadcast_shape
  dims = [d for d, _ in tensor_dims]
  ishape = broadcast_shape(*(t.shape for _, t in tensor_dims))
  # one-hot select per indexed dim: sum over that dim of (idx == arange) * x
  for d, t in tensor_dims:
    n = int_size(x.shape[d], "a tensor index")
    if d not in checked: check_index_range(t, n, f"a tensor index into dim {d} of size {n}")
  others = [k for k in range(x.ndim) if k not in dims]
  xp = x.permute(dims + others)  # (*indexed, *others)
  other_shape = tuple(xp.shape[len(dims):])
  ret = xp.reshape((1,) * len(ishape) + tuple(xp.shape))
  for j, (d, t) in enumerate(tensor_dims):
    n = int_size(x.shape[d], "a tensor index")
    ti = t.cast(dtypes.int32)
    ti = (ti < 0).where(ti + n, ti)._broadcast_to(ishape)
    onehot = ti.reshape(*ishape, 1) == Tensor.arange(n, device=x.device).reshape((1,) * len(ishape) + (n,))
    # ret: (*ishape, n_j, rest...) -> select along the first remaining indexed axis
    oh = onehot.reshape(*ishape, n, *([1] * (len(tensor_dims) - j - 1 + len(other_shape))))
    if ret.dtype is dtypes.bool: ret = oh.where(ret, False).max(len(ishape))
    else: ret = oh.where(ret, 0).sum(len(ishape), dtype=ret.dtype)
  # ret: (*ishape, *other_shape); other dims carry the squeezed int-indexed dims too
  keep_other = [k for k in others if k not in squeeze]
  # tuples, not *args: a 0-d index into a 1-d tensor leaves no dims at all
  ret = ret.reshape((*ishape, *[x.shape[k] for k in others]))
  ret = ret.reshape((*ishape, *[x.shape[k] for k in keep_other])) if squeeze else ret
  adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
  if adjacent and dims[0] > 0:
    before = len([k for k in keep_other if k < dims[0]])
    nb = len(ishape)
    order = list(range(nb, nb + before)) + list(range(nb)) + list(range(nb + before, ret.ndim))
    ret = ret.permute(order)
  return ret

def _basic_region(x: Tensor, idx: list[Any]) -> list[tuple[int, int]] | None:
  """For indices of ints, unit-step slices, None and Ellipsis: the (start, stop) each dim of x keeps; None otherwise."""
  consumed = sum(1 for i in idx if i is not None and i is not Ellipsis and not isinstance(i, (bool, np.bool_)))
  if consumed > x.ndim: raise AxisError(f"too many indices for tensor of shape {x.shape}: {consumed} given")
  if any(i is Ellipsis for i in idx):
    e = next(k for k, i in enumerate(idx) if i is Ellipsis)  # identity: `in`/index() would call Tensor.__eq__
    idx = idx[:e] + [slice(None)] * (x.ndim - consumed) + idx[e + 1:]
  region: list[tuple[int, int]] = []
  for i in idx:
    if i is None: continue
    n = int_size(x.shape[len(region)], "an assignment into a tensor")
    if isinstance(i, slice):
      start, stop, step = i.indices(n)
      if step != 1: return None
      region.append((start, max(start, stop)))
    elif isinstance(i, int) and not isinstance(i, bool):
      if not -n <= i < n: raise AxisError(f"index {i} is out of bounds for dim {len(region)} of size {n}")
      v = i + n if i < 0 else i
      region.append((v, v + 1))
    else:
      return None
  return region + [(0, int_size(s, "an assignment into a tensor")) for s in x.shape[len(region):]]

def setitem(x: Tensor, indices: Any, value: Any) -> None:
  """x[indices] = value as one full-size masked assign: where(mask, value placed at the indexed elements, x)."""
  from ember.tensor import Tensor
  # land a pending write first: the new value is computed from x's current contents
  if x.uop.op is Ops.ASSIGN: x.realize()
  idx = _norm_index(indices)
  target = getitem(x, indices)
  v = value if isinstance(value, Tensor) else Tensor(value, device=x.device, dtype=x.dtype)
  v = v.cast(x.dtype)._broadcast_to(target.shape)
  region = _basic_region(x, idx)
  if region is not None:
    # unit-step slices and ints: pad the value (and a mask) out to the full shape
    v = v.reshape(tuple(e - b for b, e in region))
    pads = tuple((b, int_size(s, "an assignment into a tensor") - e) for (b, e), s in zip(region, x.shape))
    mask = Tensor.full(v.shape, True, dtype=dtypes.bool, device=x.device).pad(pads)
    new = mask.where(v.pad(pads), x)
  else:
    # steps and tensor indices: scatter into the flattened tensor at the flat positions those indices select
    n = int_size(x.numel(), "an assignment into a tensor")
    # contiguous: the positions come out of a gather reduction; computing them once keeps the scatter kernel simple
    positions = getitem(Tensor.arange(n, device=x.device, dtype=dtypes.int32).reshape(x.shape), indices).contiguous()
    new = x.flatten()._scatter(0, positions.flatten(), v.flatten()).reshape(x.shape)  # positions lie in x
  x.assign(new.cast(x.dtype))
