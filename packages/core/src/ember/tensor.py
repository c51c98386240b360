"""The lazy Tensor front end: every op builds a UOp graph; nothing runs until `realize()`, `numpy()`, `item()`...

The primitives here (creation, elementwise with broadcasting and weak-dtype promotion, reductions, movement ops,
matmul, autograd) are what the rest of the API composes from.
"""
from __future__ import annotations
import math
import weakref
from typing import Any, Sequence
import numpy as np
from ember.dtype import DType, dtypes, least_upper_dtype, least_upper_float, strong_dtype, sum_acc_dtype, to_dtype
from ember.errors import AxisError, DTypeError, GradientError, ShapeError, DeviceError
from ember.helpers import prod, SEED
from ember.uop.ops import Ops, UOp, BufferArg, GroupOp, next_unique, sint

all_tensors: weakref.WeakSet[Tensor] = weakref.WeakSet()

def _canon_device(device: str | None) -> str:
  from ember.device import Device
  return Device.canonicalize(device) if device is not None else Device.DEFAULT

def _buffer_uop(device: str, size: int, dtype: DType) -> UOp:
  return UOp(Ops.BUFFER, dtype, (), BufferArg(next_unique(), device, size))

def _const_uop(value: Any, dtype: DType, device: str, shape: tuple[sint, ...] = ()) -> UOp:
  c = UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=device),), dtype.const(value))
  if not shape: return c
  ones = UOp(Ops.RESHAPE, dtype, (c,), (1,) * len(shape))
  return ones if all(s == 1 for s in shape) else UOp(Ops.EXPAND, dtype, (ones,), tuple(shape))

def _np_to_dtype(arr: np.ndarray) -> DType:
  if arr.dtype == np.bool_: return dtypes.bool
  return dtypes.from_np(arr.dtype)

def broadcast_shape(*shapes: tuple[sint, ...]) -> tuple[sint, ...]:
  ndim = max(len(s) for s in shapes)
  padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
  out = []
  for dims in zip(*padded):
    non1 = {d for d in dims if not (isinstance(d, int) and d == 1)}
    if len(non1) > 1: raise ShapeError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot broadcast: dims {dims} differ")
    out.append(non1.pop() if non1 else 1)
  return tuple(out)

class Tensor:
  """A lazy, multi-dimensional array with autograd.

  >>> Tensor([[1.0, 2.0], [3.0, 4.0]]).sum(axis=1).numpy()
  array([3., 7.], dtype=float32)
  """
  __slots__ = ("uop", "requires_grad", "grad", "__weakref__")
  training: bool = False
  no_grad: bool = False

  def __init__(self, data: Any, device: str | tuple[str, ...] | None = None, dtype: DType | str | None = None,
               requires_grad: bool | None = None):
    dt = to_dtype(dtype) if dtype is not None else None
    dev = _canon_device(device) if not isinstance(device, tuple) else device
    if isinstance(data, UOp):
      uop = data
    elif data is None:
      uop = _const_uop(0.0, dt or dtypes.weakfloat, dev)
    elif isinstance(data, (bool, int, float)):
      uop = _const_uop(data, dtypes.from_py(data), dev)
    elif isinstance(data, bytes):
      uop = _from_numpy(np.frombuffer(data, dtype=np.uint8), dev)
    elif isinstance(data, (list, tuple)):
      inferred = dtypes.from_py(data)
      target = dt or inferred
      if target.weak: raise DTypeError(f"a list cannot be stored as weak dtype {target!r}; use a concrete dtype")
      np_dt = target.fmt if target.fmt is not None else np.float32
      try: arr = np.array(data, dtype=np_dt)
      except (ValueError, TypeError) as e: raise ShapeError(f"cannot build a Tensor from a ragged or mixed list: {e}") from e
      uop = _from_numpy(arr, dev, target if target.fmt is not None else None)
    elif isinstance(data, np.ndarray) or np.isscalar(data):
      arr = np.asarray(data)
      if arr.dtype == object: raise DTypeError("cannot build a Tensor from a numpy array of dtype object")
      if arr.shape == (): uop = _const_uop(arr.item(), _np_to_dtype(arr), dev)
      else: uop = _from_numpy(arr, dev)
    elif isinstance(data, Tensor):
      uop = data.uop if data.device == dev else data.to(dev).uop
    else:
      raise DTypeError(f"cannot build a Tensor from {type(data).__name__}; pass a list, scalar, numpy array, bytes or UOp")
    if dt is not None and uop.dtype is not dt: uop = _cast_uop(uop, dt)
    self.uop: UOp = uop
    self.requires_grad: bool | None = requires_grad
    self.grad: Tensor | None = None
    all_tensors.add(self)

  # ** properties **
  @property
  def shape(self) -> tuple[sint, ...]: return self.uop.shape
  @property
  def dtype(self) -> DType: return self.uop.dtype  # type: ignore[return-value]
  @property
  def device(self) -> str:
    d = self.uop.device
    if d is None: raise DeviceError("tensor has no device")
    return d  # type: ignore[return-value]
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> sint: return prod(self.shape)
  def element_size(self) -> int: return strong_dtype(self.dtype).itemsize
  def nbytes(self) -> int: return int(self.numel()) * self.element_size()
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return int(self.shape[0])
  def __repr__(self) -> str: return f"<Tensor {self.shape} {self.dtype!r} on {self.uop.device} realized={self.uop.is_realized}>"
  def __hash__(self) -> int: return id(self)
  def __bool__(self) -> bool:
    if self.numel() != 1: raise ValueError(f"the truth value of a tensor with {self.numel()} elements is ambiguous; use .any() or .all()")
    return bool(self.item())

  # ** realize and data out **
  def schedule(self, *others: Tensor) -> list:
    from ember.schedule import create_schedule
    items, _ = create_schedule([t.uop for t in (self, *others)])
    return items
  def realize(self, *others: Tensor) -> Tensor:
    """Run the kernels that compute this tensor (and `others`); returns self."""
    Tensor._realize_all(self, *others)
    return self
  @staticmethod
  def _realize_all(*tensors: Tensor) -> None:
    from ember.schedule import create_schedule
    from ember.engine.realize import run_schedule
    todo = [t for t in tensors if not _is_done(t.uop)]
    if not todo: return
    items, becomes = create_schedule([t.uop for t in todo])
    run_schedule(items)
    _apply_becomes(becomes)
  def contiguous(self) -> Tensor:
    if self.dtype.weak: return self
    return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)), requires_grad=self.requires_grad)
  def contiguous_backward(self) -> Tensor: return Tensor(UOp(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.uop,)))
  def _buffer(self):
    from ember.schedule import buffer_of
    t = self.cast(strong_dtype(self.dtype)) if self.dtype.weak else self
    t = t if _is_contiguous_buffer(t.uop) else t.contiguous()
    t.realize()
    return buffer_of(t.uop)
  def data(self) -> memoryview:
    buf = self._buffer()
    return memoryview(buf.numpy()).cast("B").cast(_mv_fmt(buf.dtype), self.shape if all(isinstance(s, int) for s in self.shape) and self.shape else (max(int(self.numel()), 0),))
  def numpy(self) -> np.ndarray:
    """The tensor's values as a numpy array (numpy dtype matching the tensor's; bfloat16/fp8 come back as float32)."""
    dt = strong_dtype(self.dtype)
    if any(not isinstance(s, int) for s in self.shape): raise ShapeError(f"cannot read a tensor with symbolic shape {self.shape}")
    if 0 in self.shape: return np.zeros(self.shape, dtype=_np_dtype(dt))
    if dt.fmt is None: return self.cast(dtypes.float32).numpy()
    buf = self._buffer()
    return buf.numpy().view(_np_dtype(dt)).reshape(self.shape)
  def item(self) -> Any:
    if self.numel() != 1: raise ShapeError(f"item() needs a tensor with one element, got shape {self.shape}")
    return self.numpy().reshape(()).item()
  def tolist(self) -> Any: return self.numpy().tolist()
  def to(self, device: str | None) -> Tensor:
    dev = _canon_device(device)
    if dev == self.device: return self
    if self.dtype.weak: raise DTypeError(f"cannot copy a weak {self.dtype!r} tensor to {dev}; cast it to a concrete dtype first")
    src = self if _is_contiguous_buffer(self.uop) else self.contiguous()
    ret = Tensor(UOp(Ops.COPY, self.dtype, (src.uop, UOp(Ops.DEVICE, arg=dev))), requires_grad=self.requires_grad)
    return ret
  def clone(self, device: str | None = None) -> Tensor:
    dt = strong_dtype(self.dtype)
    ret = self.cast(dt).contiguous() if device is None else self.cast(dt).contiguous().to(device)
    return ret if ret is not self else Tensor(UOp(Ops.CONTIGUOUS, dt, (self.uop,)))
  def detach(self) -> Tensor: return Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)), requires_grad=False)
  def requires_grad_(self, requires_grad: bool = True) -> Tensor:
    self.requires_grad = requires_grad
    return self
  def assign(self, x: Any) -> Tensor:
    """Write `x` into this tensor's memory (the same buffer, so TinyJit and optimizers see the update)."""
    other = x if isinstance(x, Tensor) else Tensor(x, device=self.device, dtype=self.dtype)
    if self.dtype.weak:
      self.uop = Tensor(other.uop).cast(strong_dtype(other.dtype)).contiguous().uop if other.dtype.weak else other.contiguous().uop
      return self
    if other.shape != self.shape: raise ShapeError(f"assign shape mismatch: target {self.shape} <- value {other.shape}")
    if other.device != self.device: raise DeviceError(f"assign device mismatch: target on {self.device}, value on {other.device}")
    if not _is_contiguous_buffer(self.uop): self.realize() if _is_buffer_view(self.uop) else self.replace(self.contiguous()).realize()
    value = other.cast(self.dtype) if other.dtype is not self.dtype else other
    _realize_readers_of(self.uop.buffers, exclude=(self, other))
    self.uop = UOp(Ops.ASSIGN, self.dtype, (self.uop, value.uop))
    return self
  def replace(self, x: Tensor) -> Tensor:
    if x.shape != self.shape: raise ShapeError(f"replace shape mismatch: {self.shape} <- {x.shape}")
    self.uop = x.uop
    return self

  # ** creation **
  @staticmethod
  def empty(*shape: Any, device: str | None = None, dtype: DType | str | None = None, **kwargs: Any) -> Tensor:
    shp = _shape_arg(shape)
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    dev = _canon_device(device)
    n = prod(shp)
    return Tensor(_reshape(_buffer_uop(dev, int(n), dt), shp), **kwargs)
  @staticmethod
  def full(shape: Any, fill_value: Any, device: str | None = None, dtype: DType | str | None = None, **kwargs: Any) -> Tensor:
    shp = _shape_arg((shape,) if isinstance(shape, int) else tuple(shape))
    dt = to_dtype(dtype) if dtype is not None else strong_dtype(dtypes.from_py(fill_value))
    return Tensor(_const_uop(fill_value, dt, _canon_device(device), shp), **kwargs)
  @staticmethod
  def zeros(*shape: Any, **kwargs: Any) -> Tensor: return Tensor.full(_shape_arg(shape), 0.0, **{"dtype": dtypes.default_float, **kwargs})
  @staticmethod
  def ones(*shape: Any, **kwargs: Any) -> Tensor: return Tensor.full(_shape_arg(shape), 1.0, **{"dtype": dtypes.default_float, **kwargs})
  @staticmethod
  def arange(start: int | float, stop: int | float | None = None, step: int | float = 1, **kwargs: Any) -> Tensor:
    if stop is None: start, stop = 0, start
    if step == 0: raise ValueError("arange step must not be zero")
    n = max(math.ceil((stop - start) / step), 0)
    dt = to_dtype(kwargs.pop("dtype")) if "dtype" in kwargs else (dtypes.default_float if any(isinstance(v, float) for v in (start, stop, step)) else dtypes.default_int)
    if n == 0: return Tensor.empty(0, dtype=dt, **kwargs)
    # cumulative sum of ones along a padded/reshaped axis: index math, no data
    ones = Tensor.full((n,), step, dtype=dt, **kwargs)
    return ones._cumsum0() + (start - step)
  @staticmethod
  def eye(n: int, m: int | None = None, **kwargs: Any) -> Tensor:
    m = n if m is None else m
    dt = to_dtype(kwargs.pop("dtype")) if "dtype" in kwargs else dtypes.default_float
    rows = Tensor.arange(n, **kwargs).reshape(n, 1)
    cols = Tensor.arange(m, **kwargs).reshape(1, m)
    return (rows == cols).cast(dt)
  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    """Seed the counter-based RNG: the same seed gives the same stream of random tensors."""
    _rng_state[0], _rng_state[1] = seed, 0
  @staticmethod
  def _threefry_bits(n: int, device: str | None) -> Tensor:
    """n uint32 random words from a counter-based hash (Philox-like mixing of (seed, counter, index))."""
    seed, counter = _rng_state
    _rng_state[1] += 1
    idx = Tensor.arange(n, device=device, dtype=dtypes.uint32)
    key = (seed * 0x9E3779B9 + counter * 0x85EBCA6B + 0x6A09E667) & 0xFFFFFFFF
    x = idx ^ Tensor(key, device=device, dtype=dtypes.uint32)
    for mult, shift in ((0x7FEB352D, 15), (0x846CA68B, 16), (0x9E3779B1, 13), (0xC2B2AE35, 16)):
      x = (x ^ (x >> shift)) * mult
    return x ^ (x >> 15)
  @staticmethod
  def rand(*shape: Any, device: str | None = None, dtype: DType | str | None = None, **kwargs: Any) -> Tensor:
    """Uniform samples in [0, 1)."""
    shp = _shape_arg(shape)
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    n = int(prod(shp))
    bits = Tensor._threefry_bits(max(n, 1), device)
    # 23 random mantissa bits under exponent 0 give a float in [1, 2)
    f = ((bits >> 9) | 0x3F800000).bitcast(dtypes.float32) - 1.0
    return f[:n].reshape(shp).cast(dt).requires_grad_(kwargs.get("requires_grad")) if n else Tensor.empty(*shp, device=device, dtype=dt)
  @staticmethod
  def randn(*shape: Any, dtype: DType | str | None = None, **kwargs: Any) -> Tensor:
    """Standard normal samples (Box-Muller over two uniform streams)."""
    shp = _shape_arg(shape)
    u = Tensor.rand(2, *shp, dtype=dtypes.float32, device=kwargs.get("device"))
    r = (1 - u[0]).log().mul(-2).sqrt()
    ret = r * (u[1] * (2 * math.pi)).cos()
    return ret.cast(to_dtype(dtype) if dtype is not None else dtypes.default_float).requires_grad_(kwargs.get("requires_grad"))

  # ** movement **
  def reshape(self, shape: Any, *args: Any) -> Tensor:
    new_shape = _shape_arg((shape, *args) if args else ((shape,) if isinstance(shape, int) else tuple(shape)))
    if (neg := [i for i, s in enumerate(new_shape) if s == -1]):
      if len(neg) > 1: raise ShapeError(f"reshape {self.shape} -> {new_shape}: only one dimension can be -1")
      known = prod(s for s in new_shape if s != -1)
      if known == 0 or self.numel() % known != 0: raise ShapeError(f"cannot reshape {self.shape} ({self.numel()} elements) to {new_shape}")
      new_shape = tuple(self.numel() // known if s == -1 else s for s in new_shape)
    if any(isinstance(s, int) and s < 0 for s in new_shape): raise ShapeError(f"reshape to negative dims {new_shape}")
    if prod(new_shape) != self.numel(): raise ShapeError(f"cannot reshape {self.shape} ({self.numel()} elements) to {new_shape} ({prod(new_shape)} elements)")
    return self if new_shape == self.shape else Tensor(_reshape(self.uop, new_shape), requires_grad=self.requires_grad)
  def view(self, *shape: Any) -> Tensor: return self.reshape(*shape)
  def permute(self, order: Any, *args: Any) -> Tensor:
    perm = tuple(self._resolve_dim(d) for d in ((order, *args) if args else ((order,) if isinstance(order, int) else tuple(order))))
    if sorted(perm) != list(range(self.ndim)): raise AxisError(f"permute order {perm} is not a permutation of {self.ndim} dims")
    return self if perm == tuple(range(self.ndim)) else Tensor(UOp(Ops.PERMUTE, self.dtype, (self.uop,), perm), requires_grad=self.requires_grad)
  def expand(self, shape: Any, *args: Any) -> Tensor:
    new_shape = _shape_arg((shape, *args) if args else ((shape,) if isinstance(shape, int) else tuple(shape)))
    if len(new_shape) < self.ndim: raise ShapeError(f"cannot expand {self.shape} to fewer dims {new_shape}")
    base = self.reshape((1,) * (len(new_shape) - self.ndim) + self.shape) if len(new_shape) > self.ndim else self
    final = tuple(s if ns == -1 else ns for s, ns in zip(base.shape, new_shape))
    for s, ns in zip(base.shape, final):
      if s != ns and s != 1: raise ShapeError(f"cannot expand {self.shape} to {new_shape}: dim {s} is not 1")
    return base if final == base.shape else Tensor(UOp(Ops.EXPAND, self.dtype, (base.uop,), final), requires_grad=self.requires_grad)
  def pad(self, padding: Sequence[Any], mode: str = "constant", value: float = 0.0) -> Tensor:
    """Pad with `padding` as ((before, after), ...) per dim, or torch-style flat (last dim first)."""
    pads = _norm_padding(padding, self.ndim)
    if mode != "constant": return self._pad_mode(pads, mode)
    if all(b == 0 and a == 0 for b, a in pads): return self
    if any(b < 0 or a < 0 for b, a in pads):
      shrink = tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pads, self.shape))
      return self.shrink(shrink).pad(tuple((max(b, 0), max(a, 0)) for b, a in pads), value=value)
    x = self
    if value != 0:
      dt = least_upper_dtype(self.dtype, dtypes.from_py(value))
      x = self.cast(dt)
      mask = Tensor(UOp(Ops.PAD, dtypes.bool, (Tensor.full(self.shape, True, dtype=dtypes.bool, device=self.device).uop,), tuple(pads)))
      padded = Tensor(UOp(Ops.PAD, dt, (x.uop,), tuple(pads)), requires_grad=self.requires_grad)
      return mask.where(padded, value)
    return Tensor(UOp(Ops.PAD, x.dtype, (x.uop,), tuple(pads)), requires_grad=self.requires_grad)
  def _pad_mode(self, pads: list[tuple[int, int]], mode: str) -> Tensor:
    if mode not in ("reflect", "replicate", "circular"): raise ValueError(f"unknown pad mode {mode!r}; use constant, reflect, replicate or circular")
    x = self
    for d, (b, a) in enumerate(pads):
      if b == 0 and a == 0: continue
      n = x.shape[d]
      if mode == "reflect" and (b >= n or a >= n): raise ShapeError(f"reflect padding ({b}, {a}) must be smaller than dim {d} of size {n}")
      if mode == "circular" and (b > n or a > n): raise ShapeError(f"circular padding ({b}, {a}) is larger than dim {d} of size {n}")
      idx = list(range(-b, n + a))
      if mode == "reflect": idx = [-i if i < 0 else (2 * (n - 1) - i if i >= n else i) for i in idx]
      elif mode == "replicate": idx = [min(max(i, 0), n - 1) for i in idx]
      else: idx = [i % n for i in idx]
      x = Tensor.cat(*[x.shrink(tuple((i, i + 1) if k == d else (0, s) for k, s in enumerate(x.shape))) for i in idx], dim=d)
    return x
  def shrink(self, arg: Sequence[tuple[sint, sint] | None]) -> Tensor:
    bounds = tuple((0, s) if a is None else (a[0], a[1]) for a, s in zip(arg, self.shape))
    if len(arg) != self.ndim: raise ShapeError(f"shrink needs one (begin, end) per dim: {len(arg)} given for shape {self.shape}")
    for (b, e), s in zip(bounds, self.shape):
      if isinstance(b, int) and isinstance(e, int) and isinstance(s, int) and not 0 <= b <= e <= s:
        raise ShapeError(f"shrink {bounds} is out of range of shape {self.shape}")
    if bounds == tuple((0, s) for s in self.shape): return self
    return Tensor(UOp(Ops.SHRINK, self.dtype, (self.uop,), bounds), requires_grad=self.requires_grad)
  def flip(self, axis: Any, *args: Any) -> Tensor:
    axes = {self._resolve_dim(a) for a in ((axis, *args) if args else ((axis,) if isinstance(axis, int) else tuple(axis)))}
    if not axes: return self
    return Tensor(UOp(Ops.FLIP, self.dtype, (self.uop,), tuple(i in axes for i in range(self.ndim))), requires_grad=self.requires_grad)
  def _resolve_dim(self, dim: int, extra: int = 0) -> int:
    total = self.ndim + extra
    if not isinstance(dim, (int, np.integer)) or not -max(total, 1) <= dim < max(total, 1):
      raise AxisError(f"dim {dim} is out of range for a tensor of {self.ndim} dims (shape {self.shape})")
    return int(dim) + total if dim < 0 else int(dim)
  @property
  def T(self) -> Tensor: return self.transpose()
  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    order = list(range(self.ndim))
    d0, d1 = self._resolve_dim(dim0), self._resolve_dim(dim1)
    order[d0], order[d1] = order[d1], order[d0]
    return self.permute(order)
  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    s, e = self._resolve_dim(start_dim), self._resolve_dim(end_dim)
    return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])
  def unsqueeze(self, dim: int) -> Tensor:
    d = self._resolve_dim(dim, extra=1)
    return self.reshape(self.shape[:d] + (1,) + self.shape[d:])
  def squeeze(self, dim: int | None = None) -> Tensor:
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    d = self._resolve_dim(dim)
    return self if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1:])

  def __getitem__(self, indices: Any) -> Tensor:
    from ember.tensor_index import getitem
    return getitem(self, indices)

  @staticmethod
  def cat(*tensors: Tensor, dim: int = 0) -> Tensor:
    first = tensors[0]
    d = first._resolve_dim(dim)
    for t in tensors[1:]:
      if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != d):
        raise ShapeError(f"cat: shapes {first.shape} and {t.shape} differ outside dim {d}")
    total = sum(t.shape[d] for t in tensors)
    dt = least_upper_dtype(*(t.dtype for t in tensors))
    out: Tensor | None = None
    offset = 0
    for t in tensors:
      pads = [(0, 0)] * first.ndim
      pads[d] = (offset, total - offset - t.shape[d])
      offset += t.shape[d]
      part = t.cast(dt).pad(pads)
      out = part if out is None else out + part
    assert out is not None
    return out
  def stack(self, *others: Tensor, dim: int = 0) -> Tensor:
    ts = (self, *others)
    d = self._resolve_dim(dim, extra=1)
    return Tensor.cat(*[t.unsqueeze(d) for t in ts], dim=d)

  # ** elementwise **
  def _const_like(self, x: Any) -> Tensor: return Tensor(_const_uop(x, dtypes.from_py(x), self.device))
  def _broadcasted(self, y: Any, reverse: bool = False) -> tuple[Tensor, Tensor]:
    other = y if isinstance(y, Tensor) else Tensor(_const_uop(y, dtypes.from_py(y), self.device)) if isinstance(y, (bool, int, float)) \
      else Tensor(y, device=self.device)
    if other.device != self.device: raise DeviceError(f"operands on different devices: {self.device} and {other.device}; move one with .to()")
    dt = least_upper_dtype(self.dtype, other.dtype)
    a, b = self.cast(dt), other.cast(dt)
    shp = broadcast_shape(a.shape, b.shape)
    a, b = a._broadcast_to(shp), b._broadcast_to(shp)
    return (b, a) if reverse else (a, b)
  def _broadcast_to(self, shape: tuple[sint, ...]) -> Tensor:
    if self.shape == shape: return self
    return self.reshape((1,) * (len(shape) - self.ndim) + self.shape).expand(shape)
  def _alu(self, op: Ops, *srcs: Tensor) -> Tensor:
    out_dtype = dtypes.bool if op in GroupOp.Comparison else self.dtype
    if op in GroupOp.Bitwise and any(dtypes.is_float(s.dtype) for s in (self, *srcs)):
      raise DTypeError(f"{op.name.lower()} needs int or bool operands, got {' and '.join(repr(s.dtype) for s in (self, *srcs))}")
    rg = any(t.requires_grad for t in (self, *srcs)) or None
    return Tensor(UOp(op, out_dtype, tuple(t.uop for t in (self, *srcs))), requires_grad=rg)
  def cast(self, dtype: DType | str) -> Tensor:
    dt = to_dtype(dtype)
    return self if self.dtype is dt else Tensor(_cast_uop(self.uop, dt), requires_grad=self.requires_grad)
  def bitcast(self, dtype: DType | str) -> Tensor:
    dt = to_dtype(dtype)
    if self.dtype.weak or dt.weak: raise DTypeError(f"bitcast needs concrete dtypes, got {self.dtype!r} -> {dt!r}")
    if dt.itemsize != self.dtype.itemsize:
      if not self.shape or (self.shape[-1] * self.dtype.itemsize) % dt.itemsize != 0:
        raise ShapeError(f"bitcast {self.dtype!r} -> {dt!r}: last dim of shape {self.shape} does not divide")
      src = self if _is_contiguous_buffer(self.uop) else self.contiguous()
      return Tensor(UOp(Ops.BITCAST, dt, (src.uop,)))
    return self if self.dtype is dt else Tensor(UOp(Ops.BITCAST, dt, (self.uop,)))
  def float(self) -> Tensor: return self.cast(dtypes.float32)
  def half(self) -> Tensor: return self.cast(dtypes.float16)
  def int(self) -> Tensor: return self.cast(dtypes.int32)
  def long(self) -> Tensor: return self.cast(dtypes.int64)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)
  def double(self) -> Tensor: return self.cast(dtypes.float64)

  def add(self, x: Any, reverse: bool = False) -> Tensor: return _binop(Ops.ADD, self, x, reverse)
  def sub(self, x: Any, reverse: bool = False) -> Tensor:
    a, b = self._broadcasted(x, reverse)
    if a.dtype is dtypes.bool: raise DTypeError("subtraction of bool tensors is not supported; use logical_xor or cast to int")
    return a._alu(Ops.SUB, b)
  def mul(self, x: Any, reverse: bool = False) -> Tensor: return _binop(Ops.MUL, self, x, reverse)
  def div(self, x: Any, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
    a, b = self._broadcasted(x, reverse)
    if rounding_mode == "trunc":
      return a._alu(Ops.IDIV, b) if dtypes.is_int(a.dtype) else (a.cast(least_upper_float(a.dtype)) / b).trunc().cast(a.dtype)
    if rounding_mode == "floor":
      if dtypes.is_int(a.dtype): return a._floordiv(b)
      return (a / b).floor()
    if rounding_mode is not None: raise ValueError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    ft = least_upper_float(a.dtype)
    return a.cast(ft)._alu(Ops.FDIV, b.cast(ft))
  def _floordiv(self, b: Tensor) -> Tensor:
    q = self._alu(Ops.IDIV, b)
    # C division truncates: step down where the signs differ and there is a remainder
    fix = (self._alu(Ops.MOD, b) != 0) & ((self < 0) != (b < 0))
    return fix.where(q - 1, q)
  def mod(self, x: Any, reverse: bool = False) -> Tensor:
    a, b = self._broadcasted(x, reverse)
    if dtypes.is_int(a.dtype):
      r = a._alu(Ops.MOD, b)
      return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)
    return a - (a / b).floor() * b
  def neg(self) -> Tensor:
    if self.dtype is dtypes.bool: return self.logical_not()
    return self._alu(Ops.NEG)
  def maximum(self, x: Any) -> Tensor:
    a, b = self._broadcasted(x)
    return a._alu(Ops.MAX, b)
  def minimum(self, x: Any) -> Tensor:
    a, b = self._broadcasted(x)
    if a.dtype is dtypes.bool: return a & b
    return -((-a)._alu(Ops.MAX, -b)) if not dtypes.is_unsigned(a.dtype) else (a < b).where(a, b)
  def where(self, x: Any, y: Any) -> Tensor:
    if self.dtype is not dtypes.bool: raise DTypeError(f"where condition must be bool, got {self.dtype!r}; compare it first (e.g. t != 0)")
    xs = x if isinstance(x, Tensor) else Tensor(_const_uop(x, dtypes.from_py(x), self.device))
    ys = y if isinstance(y, Tensor) else Tensor(_const_uop(y, dtypes.from_py(y), self.device))
    dt = least_upper_dtype(xs.dtype, ys.dtype)
    shp = broadcast_shape(self.shape, xs.shape, ys.shape)
    c, a, b = self._broadcast_to(shp), xs.cast(dt)._broadcast_to(shp), ys.cast(dt)._broadcast_to(shp)
    rg = a.requires_grad or b.requires_grad or None
    return Tensor(UOp(Ops.WHERE, dt, (c.uop, a.uop, b.uop)), requires_grad=rg)
  def _cmp(self, op: Ops, x: Any, reverse: bool = False) -> Tensor:
    a, b = self._broadcasted(x, reverse)
    return a._alu(op, b)
  def __lt__(self, x: Any) -> Tensor: return self._cmp(Ops.CMPLT, x)
  def __gt__(self, x: Any) -> Tensor: return self._cmp(Ops.CMPLT, x, reverse=True)
  def __le__(self, x: Any) -> Tensor: return self._cmp(Ops.CMPLT, x, reverse=True).logical_not()
  def __ge__(self, x: Any) -> Tensor: return self._cmp(Ops.CMPLT, x).logical_not()
  def __eq__(self, x: Any) -> Tensor: return self._cmp(Ops.CMPEQ, x)  # type: ignore[override]
  def __ne__(self, x: Any) -> Tensor: return self._cmp(Ops.CMPNE, x)  # type: ignore[override]
  def logical_not(self) -> Tensor: return self.cast(dtypes.bool)._alu(Ops.CMPNE, Tensor(_const_uop(True, dtypes.bool, self.device))._broadcast_to(self.shape))
  def bitwise_and(self, x: Any) -> Tensor: return _binop(Ops.AND, self, x)
  def bitwise_or(self, x: Any) -> Tensor: return _binop(Ops.OR, self, x)
  def bitwise_xor(self, x: Any) -> Tensor: return _binop(Ops.XOR, self, x)
  def lshift(self, x: Any) -> Tensor: return _shift(Ops.SHL, self, x)
  def rshift(self, x: Any) -> Tensor: return _shift(Ops.SHR, self, x)

  # ** unary math **
  def _float_unary(self, op: Ops) -> Tensor:
    ft = least_upper_float(self.dtype)
    return self.cast(ft)._alu(op)
  def exp2(self) -> Tensor: return self._float_unary(Ops.EXP2)
  def log2(self) -> Tensor: return self._float_unary(Ops.LOG2)
  def sin(self) -> Tensor: return self._float_unary(Ops.SIN)
  def sqrt(self) -> Tensor: return self._float_unary(Ops.SQRT)
  def reciprocal(self) -> Tensor: return self._float_unary(Ops.RECIPROCAL)
  def trunc(self) -> Tensor: return self if dtypes.is_int(self.dtype) or self.dtype is dtypes.bool else self._alu(Ops.TRUNC)
  def exp(self) -> Tensor: return self.mul(1 / math.log(2)).exp2() if dtypes.is_float(self.dtype) else self.cast(least_upper_float(self.dtype)).exp()
  def log(self) -> Tensor: return self.log2().mul(math.log(2))
  def cos(self) -> Tensor: return (math.pi / 2 - self.cast(least_upper_float(self.dtype))).sin()
  def tanh(self) -> Tensor: return 2.0 * (2.0 * self).sigmoid() - 1.0
  def sigmoid(self) -> Tensor:
    x = self.cast(least_upper_float(self.dtype))
    return (1 + (x * (-1 / math.log(2))).exp2()).reciprocal()
  def relu(self) -> Tensor: return self.maximum(0)
  def abs(self) -> Tensor: return self if dtypes.is_unsigned(self.dtype) or self.dtype is dtypes.bool else (self < 0).where(-self, self)
  def floor(self) -> Tensor:
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    return (self < t).where(t - 1, t)
  def ceil(self) -> Tensor:
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    return (self > t).where(t + 1, t)
  def square(self) -> Tensor: return self * self
  def rsqrt(self) -> Tensor: return self.sqrt().reciprocal()

  # ** reductions **
  def _reduce_axes(self, axis: Any) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    return tuple(sorted({self._resolve_dim(a) for a in axes}))
  def _reduce(self, op: Ops, axis: Any = None, keepdim: bool = False) -> Tensor:
    axes = self._reduce_axes(axis)
    if self.ndim == 0: return self
    if any(self.shape[a] == 0 for a in axes):
      ident = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: dtypes.min(self.dtype)}[op]
      if op is Ops.MAX: raise ShapeError(f"max/min of an empty dimension: shape {self.shape}, axes {axes}")
      out_shape = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
      ret = Tensor.full(out_shape, ident, dtype=self.dtype, device=self.device)
    else:
      ret = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (op, axes)), requires_grad=self.requires_grad) if axes else self
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))
  def sum(self, axis: Any = None, keepdim: bool = False, dtype: DType | None = None) -> Tensor:
    acc = to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype)
    ret = self.cast(acc)._reduce(Ops.ADD, axis, keepdim)
    return ret.cast(self.dtype) if dtype is None and self.dtype in (dtypes.float16, dtypes.bfloat16) else ret
  def prod(self, axis: Any = None, keepdim: bool = False, dtype: DType | None = None) -> Tensor:
    return self.cast(to_dtype(dtype) if dtype is not None else strong_dtype(self.dtype))._reduce(Ops.MUL, axis, keepdim)
  def max(self, axis: Any = None, keepdim: bool = False) -> Tensor: return self.cast(strong_dtype(self.dtype))._reduce(Ops.MAX, axis, keepdim)
  def min(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    x = self.cast(strong_dtype(self.dtype))
    if dtypes.is_unsigned(x.dtype): return dtypes.max(x.dtype) - (dtypes.max(x.dtype) - x).max(axis, keepdim)
    if x.dtype is dtypes.bool: return x.logical_not().max(axis, keepdim).logical_not()
    return -((-x).max(axis, keepdim))
  def mean(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    x = self.cast(least_upper_float(strong_dtype(self.dtype)))
    n = prod(s for i, s in enumerate(self.shape) if i in self._reduce_axes(axis)) if self.ndim else 1
    out = x.sum(axis, keepdim)
    return out.div(n) if n != 0 else out * math.nan
  def _cumsum0(self) -> Tensor:
    """Inclusive cumulative sum along a 1-d tensor, as a reduction over a padded, expanded window (index math only)."""
    n = self.shape[0]
    # (n, 2n-1) rows that are x shifted right by i; summing the first n columns of row i gives sum(x[:i+1])
    padded = self.pad(((n - 1, 0),))
    windows = padded.reshape(1, 2 * n - 1).expand(n, 2 * n - 1).reshape(n * (2 * n - 1))
    windows = windows.pad(((0, n),)).reshape(n, 2 * n).shrink(((0, n), (0, n)))
    return windows.sum(1)

  # ** linear algebra **
  def dot(self, w: Tensor) -> Tensor:
    """Matrix product with numpy/torch broadcasting semantics; 1-d operands are promoted and squeezed."""
    if self.ndim == 0 or w.ndim == 0: raise ShapeError(f"dot needs at least 1-d operands, got shapes {self.shape} and {w.shape}")
    x, y = self, w
    if x.shape[-1] != y.shape[-min(y.ndim, 2)]:
      raise ShapeError(f"shape mismatch in matmul: {self.shape} @ {w.shape}; inner dims {x.shape[-1]} != {y.shape[-min(y.ndim, 2)]}")
    dt = least_upper_dtype(x.dtype, y.dtype)
    x = x.reshape(*x.shape[:-1], *([1] * min(x.ndim - 1, y.ndim - 1, 1)), x.shape[-1])
    y = y.reshape(*y.shape[:-2], *([1] * min(x.ndim - 1, y.ndim - 1, 1)), *y.shape[-min(y.ndim, 2):]).transpose(-1, -min(y.ndim, 2))
    return (x.cast(dt) * y.cast(dt)).sum(-1, dtype=sum_acc_dtype(dt) if not dtypes.is_float(dt) else None).cast(dt)
  def matmul(self, x: Tensor, reverse: bool = False) -> Tensor: return x.dot(self) if reverse else self.dot(x)

  # ** operators **
  def __neg__(self) -> Tensor: return self.neg()
  def __add__(self, x: Any) -> Tensor: return self.add(x)
  def __radd__(self, x: Any) -> Tensor: return self.add(x, True)
  def __sub__(self, x: Any) -> Tensor: return self.sub(x)
  def __rsub__(self, x: Any) -> Tensor: return self.sub(x, True)
  def __mul__(self, x: Any) -> Tensor: return self.mul(x)
  def __rmul__(self, x: Any) -> Tensor: return self.mul(x, True)
  def __truediv__(self, x: Any) -> Tensor: return self.div(x)
  def __rtruediv__(self, x: Any) -> Tensor: return self.div(x, True)
  def __floordiv__(self, x: Any) -> Tensor: return self.div(x, rounding_mode="floor")
  def __rfloordiv__(self, x: Any) -> Tensor: return self.div(x, True, rounding_mode="floor")
  def __mod__(self, x: Any) -> Tensor: return self.mod(x)
  def __rmod__(self, x: Any) -> Tensor: return self.mod(x, True)
  def __matmul__(self, x: Tensor) -> Tensor: return self.matmul(x)
  def __rmatmul__(self, x: Tensor) -> Tensor: return self.matmul(x, True)
  def __and__(self, x: Any) -> Tensor: return self.bitwise_and(x)
  def __rand__(self, x: Any) -> Tensor: return _binop(Ops.AND, self, x, True)
  def __or__(self, x: Any) -> Tensor: return self.bitwise_or(x)
  def __ror__(self, x: Any) -> Tensor: return _binop(Ops.OR, self, x, True)
  def __xor__(self, x: Any) -> Tensor: return self.bitwise_xor(x)
  def __rxor__(self, x: Any) -> Tensor: return _binop(Ops.XOR, self, x, True)
  def __lshift__(self, x: Any) -> Tensor: return self.lshift(x)
  def __rshift__(self, x: Any) -> Tensor: return self.rshift(x)
  def __invert__(self) -> Tensor:
    if self.dtype is dtypes.bool: return self.logical_not()
    if not dtypes.is_int(self.dtype): raise DTypeError(f"~ needs an int or bool tensor, got {self.dtype!r}")
    return self ^ -1 if not dtypes.is_unsigned(self.dtype) else self ^ dtypes.max(self.dtype)
  def __pow__(self, x: Any) -> Tensor: return self.pow(x)
  def __rpow__(self, x: Any) -> Tensor: return self.pow(x, True)
  def pow(self, x: Any, reverse: bool = False) -> Tensor:
    base, exponent = self._broadcasted(x, reverse)
    if dtypes.is_int(base.dtype) and dtypes.is_int(exponent.dtype) and not reverse and isinstance(x, int) and x >= 0:
      ret = Tensor.full(base.shape, 1, dtype=base.dtype, device=base.device) if x == 0 else base
      for _ in range(max(x - 1, 0)): ret = ret * base
      return ret
    ft = least_upper_float(base.dtype)
    b, e = base.cast(ft), exponent.cast(ft)
    mag = (e * b.abs().log2()).exp2()
    # negative base: defined for integral exponents, sign from the exponent's parity
    e_int = e.trunc() == e
    odd = (e.abs() - 2 * (e.abs() * 0.5).trunc()) == 1
    neg_res = e_int.where(odd.where(-mag, mag), math.nan)
    ret = (b < 0).where(neg_res, mag)
    ret = ((b == 0) & (e == 0)).where(1.0, ret)
    if dtypes.is_int(base.dtype): return ret.cast(base.dtype)
    return ret

  # ** autograd **
  def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
    """d(self)/d(target) for each target. `self` must be a scalar unless `gradient` is given."""
    from ember.gradient import compute_gradient
    if gradient is None:
      if self.numel() != 1: raise GradientError(f"gradient of a tensor of shape {self.shape} needs an explicit gradient argument")
      gradient = Tensor(1.0, device=self.device, dtype=self.dtype if dtypes.is_float(self.dtype) else dtypes.default_float).expand(self.shape)
    grads = compute_gradient(self.uop, gradient.uop, {t.uop for t in targets})
    out = []
    for t in targets:
      g = grads.get(t.uop)
      if g is None: raise GradientError(f"tensor {t.shape} {t.dtype!r} is not part of the graph of this output")
      out.append(Tensor(g).cast(t.dtype) if dtypes.is_float(t.dtype) else Tensor(g))
    return out
  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Fill `.grad` of every tensor with requires_grad in this graph (accumulating into existing grads)."""
    graph = self.uop.toposort()
    targets = [t for t in list(all_tensors) if t.requires_grad and t.uop in graph]
    if not targets: raise GradientError("backward(): no tensor in this graph has requires_grad=True")
    grads = self.gradient(*targets, gradient=gradient)
    for t, g in zip(targets, grads):
      if g.shape != t.shape: raise GradientError(f"internal gradient shape mismatch {g.shape} vs {t.shape}")
      t.grad = g if t.grad is None else (t.grad + g)
    return self

def _binop(op: Ops, x: Tensor, y: Any, reverse: bool = False) -> Tensor:
  a, b = x._broadcasted(y, reverse)
  return a._alu(op, b)

def _shift(op: Ops, x: Tensor, y: Any) -> Tensor:
  if not dtypes.is_int(x.dtype): raise DTypeError(f"shift needs an int tensor, got {x.dtype!r}")
  other = y if isinstance(y, Tensor) else Tensor(_const_uop(y, dtypes.from_py(y), x.device))
  if not dtypes.is_int(other.dtype): raise DTypeError(f"shift amount must be an int, got {other.dtype!r}")
  shp = broadcast_shape(x.shape, other.shape)
  dt = x.dtype if not x.dtype.weak else least_upper_dtype(x.dtype, other.dtype)
  return x.cast(dt)._broadcast_to(shp)._alu(op, other.cast(dt)._broadcast_to(shp))

def _cast_uop(u: UOp, dt: DType) -> UOp:
  if u.dtype is dt: return u
  if u.op is Ops.CONST and not dt.weak: return u.replace(dtype=dt, arg=dt.const(u.arg))
  return UOp(Ops.CAST, dt, (u,))

def _reshape(u: UOp, shape: tuple[sint, ...]) -> UOp:
  return u if u.shape == shape else UOp(Ops.RESHAPE, u.dtype, (u,), tuple(shape))

def _shape_arg(shape: tuple[Any, ...]) -> tuple[sint, ...]:
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
  out = []
  for s in shape:
    if isinstance(s, (int, np.integer)): out.append(int(s))
    elif isinstance(s, UOp): out.append(s)
    else: raise ShapeError(f"shape entries must be ints, got {type(s).__name__} in {shape}")
  return tuple(out)

def _norm_padding(padding: Sequence[Any], ndim: int) -> list[tuple[int, int]]:
  if all(isinstance(p, (tuple, list)) or p is None for p in padding):
    if len(padding) != ndim: raise ShapeError(f"padding {padding} needs one (before, after) pair per dim ({ndim})")
    return [(0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding]
  if len(padding) % 2 or len(padding) // 2 > ndim: raise ShapeError(f"flat padding {padding} must have an even length <= 2*ndim")
  pairs = [(0, 0)] * ndim
  for i in range(len(padding) // 2): pairs[ndim - 1 - i] = (int(padding[2 * i]), int(padding[2 * i + 1]))
  return pairs

def _from_numpy(arr: np.ndarray, device: str, dtype: DType | None = None) -> UOp:
  from ember.schedule import attach_buffer
  from ember.device.base import Buffer
  dt = dtype or _np_to_dtype(arr)
  arr = np.ascontiguousarray(arr, dtype=dt.fmt) if dt.fmt is not None else np.ascontiguousarray(arr)
  uop = _buffer_uop(device, arr.size, dt)
  buf = Buffer(device, arr.size, dt)
  if arr.size: buf.copyin(memoryview(arr).cast("B"))
  attach_buffer(uop, buf)
  return _reshape(uop, tuple(arr.shape)) if arr.shape != (arr.size,) else uop

def _np_dtype(dt: DType) -> Any: return np.dtype(dt.fmt) if dt.fmt is not None else np.float32
def _mv_fmt(dt: DType) -> str: return dt.fmt if dt.fmt is not None else {1: "B", 2: "H"}[dt.itemsize]

def _is_contiguous_buffer(u: UOp) -> bool:
  """A BUFFER, possibly reshaped: the tensor's elements are the buffer's, in order."""
  while u.op is Ops.RESHAPE: u = u.src[0]
  return u.op is Ops.BUFFER

def _is_buffer_view(u: UOp) -> bool: return u.base.op is Ops.BUFFER and all(n.op in GroupOp.Movement or n.op is Ops.BUFFER for n in u.toposort())

def _is_done(u: UOp) -> bool:
  return _is_contiguous_buffer(u) or u.op is Ops.CONST or (u.op in GroupOp.Movement and u.base.op is Ops.CONST) or u.dtype.weak and u.base.op is Ops.CONST

def _apply_becomes(becomes: dict[UOp, UOp]) -> None:
  if not becomes: return
  for t in list(all_tensors):
    if t.uop in becomes: t.uop = becomes[t.uop]
    elif not _is_done(t.uop) and any(b in becomes for b in t.uop.toposort()): t.uop = t.uop.substitute(becomes)

def _realize_readers_of(bufs: frozenset[UOp], exclude: tuple[Tensor, ...]) -> None:
  """Before a buffer is overwritten, run the pending computations that still read its old value."""
  pending = [t for t in list(all_tensors) if t not in exclude and not _is_done(t.uop) and t.uop.buffers & bufs]
  if pending: Tensor._realize_all(*pending)

_rng_state = [SEED.value, 0]

