"""The lazy Tensor front end: every op builds a UOp graph; nothing runs until `realize()`, `numpy()`, `item()`...

The primitives here (creation, elementwise with broadcasting and weak-dtype promotion, reductions, movement ops,
matmul, autograd) are what the rest of the API composes from.
"""
from __future__ import annotations
import functools
import math
import weakref
from typing import Any, Sequence, TypeAlias
import numpy as np
from ember.dtype import DType, dtypes, least_upper_dtype, least_upper_float, strong_dtype, sum_acc_dtype, to_dtype
from ember.errors import (AxisError, DTypeError, EmptyReductionError, GradientError, ShapeError, DeviceError,
                          ShardingError)
from ember.helpers import prod, SEED
from ember.tensor_extra import TensorExtra
from ember.uop.ops import Ops, UOp, BufferArg, GroupOp, int_shape, int_size, next_unique, sint

# inside `class Tensor` the names int/float/bool are the cast methods; its signatures use these for the builtins
PyInt: TypeAlias = int
PyFloat: TypeAlias = float
PyBool: TypeAlias = bool

# every live tensor that has a graph (`uop`); a sharded tensor has none and is in `sharded_tensors` (by id: a WeakSet
# compares members with ==, which is elementwise on tensors), its shards, Tensors of their own, are here
all_tensors: weakref.WeakSet[Tensor] = weakref.WeakSet()
sharded_tensors: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()

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

def _bound_on(u: UOp, device: str) -> UOp:
  """A value computed from bound Variables (`Variable("n", 1, 9).bind(4)`, or sums of them) placed on `device`: each
  bound value's CONST names the device, so the scheduler can compute the tensor there."""
  dev = UOp(Ops.DEVICE, arg=device)
  binds = [b for b in u.toposort() if b.op is Ops.BIND]
  return u.substitute({b: b.replace(src=(b.src[0], b.src[1].replace(src=(dev,)))) for b in binds}) if binds else u

def _np_to_dtype(arr: np.ndarray) -> DType:
  if arr.dtype == np.bool_: return dtypes.bool
  return dtypes.from_np(arr.dtype)

def broadcast_shape(*shapes: tuple[sint, ...]) -> tuple[sint, ...]:
  ndim = max(len(s) for s in shapes)
  padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
  out = []
  for dims in zip(*padded):
    non1 = {d for d in dims if not (isinstance(d, int) and d == 1)}
    if len(non1) > 1:
      raise ShapeError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot broadcast: dims {dims} differ")
    out.append(non1.pop() if non1 else 1)
  return tuple(out)

# reductions of every element of at least this many elements run in two stages (Tensor._reduce)
SPLIT_REDUCE_MIN = 1 << 20
# a float sum over more than SUM_CHUNK_MIN elements per output adds them in chunks of SUM_CHUNK (Tensor._chunked_sum)
SUM_CHUNK, SUM_CHUNK_MIN = 1 << 12, 1 << 16

class Tensor(TensorExtra):
  """A lazy, multi-dimensional array with autograd.

  >>> Tensor([[1.0, 2.0], [3.0, 4.0]]).sum(axis=1).numpy()
  array([3., 7.], dtype=float32)
  """
  __slots__ = ("uop", "sharding", "requires_grad", "grad", "__weakref__")
  training: bool = False
  no_grad: bool = False

  def __init__(self, data: Any, device: str | tuple[str, ...] | None = None, dtype: DType | str | None = None,
               requires_grad: bool | None = None):
    dt = to_dtype(dtype) if dtype is not None else None
    dev = _canon_device(device) if not isinstance(device, tuple) else device
    if isinstance(data, UOp):
      uop = _bound_on(data, dev) if data.device is None and isinstance(dev, str) else data
    elif isinstance(dev, tuple):
      raise DeviceError(f"Tensor(...) builds on one device, not on {dev}; build it on one device, then replicate it "
                        f"with .to({dev}) or split it with .shard({dev}, axis)")
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
      except (ValueError, TypeError) as e:
        raise ShapeError(f"cannot build a Tensor from a ragged or mixed list: {e}") from e
      uop = _from_numpy(arr, dev, target if target.fmt is not None else None)
      if target.fmt is None: uop = _cast_uop(uop, target)  # bfloat16/fp8: numpy holds float32, the device rounds
    elif isinstance(data, np.ndarray) or np.isscalar(data):
      arr = np.asarray(data)
      if arr.dtype == object: raise DTypeError("cannot build a Tensor from a numpy array of dtype object")
      if arr.shape == (): uop = _const_uop(arr.item(), _np_to_dtype(arr), dev)
      else: uop = _from_numpy(arr, dev)
    elif isinstance(data, Tensor):
      uop = data.uop if data.device == dev else data.to(dev).uop
    else:
      raise DTypeError(f"cannot build a Tensor from {type(data).__name__}; "
                       "pass a list, scalar, numpy array, bytes or UOp")
    if dt is not None and uop.dtype is not dt: uop = _cast_uop(uop, dt)
    if requires_grad and isinstance(dev, str): uop = _leaf_storage(uop, dev)
    self.uop: UOp = uop
    # a sharded tensor's layout (an ember.multi.Sharding: its per-device shards and their axis); it then has no `uop`
    self.sharding: Any = None
    self.requires_grad: bool | None = requires_grad
    self.grad: Tensor | None = None
    all_tensors.add(self)

  # ** properties **
  @property
  def shape(self) -> tuple[sint, ...]: return self.uop.shape if self.sharding is None else self.sharding.shape
  @property
  def dtype(self) -> DType: return _value_dtype(self.uop) if self.sharding is None else self.sharding.dtype
  @property
  def device(self) -> str:
    """The device this tensor lives on (a sharded tensor: the tuple of its shards' devices)."""
    if self.sharding is not None: return self.sharding.devices
    d = self.uop.device
    if d is None: raise DeviceError("tensor has no device")
    return d  # type: ignore[return-value]
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> sint: return prod(self.shape)
  def element_size(self) -> int: return strong_dtype(self.dtype).itemsize
  def nbytes(self) -> int: return int_size(self.numel(), "nbytes") * self.element_size()
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return int_size(self.shape[0], "len()")
  def __repr__(self) -> str:
    if self.sharding is not None: return f"<Tensor {self.shape} {self.dtype!r} {self.sharding!r}>"
    return f"<Tensor {self.shape} {self.dtype!r} on {self.uop.device} realized={self.uop.is_realized}>"
  def __getattr__(self, name: str) -> Any:
    # reached only when normal lookup fails, e.g. for the `uop` a sharded tensor does not have
    if name == "uop" and self.sharding is not None:
      raise ShardingError(f"a tensor sharded over {self.sharding.devices} has one graph per device, not one uop; "
                          "use .shards, or gather it with .to(device)")
    raise AttributeError(f"'Tensor' object has no attribute {name!r}")
  def __hash__(self) -> int: return id(self)
  def __bool__(self) -> bool:
    if self.numel() != 1:
      raise ValueError(f"the truth value of a tensor with {self.numel()} elements is ambiguous; "
                       "use .any() or .all()")
    _check_host_read("bool(tensor)")
    return bool(self.item())

  # ** realize and data out **
  def schedule(self, *others: Tensor) -> list:
    from ember.schedule import create_schedule
    items, _ = create_schedule([t.uop for t in _graph_tensors((self, *others))])
    return items
  def realize(self, *others: Tensor) -> Tensor:
    """Run the kernels that compute this tensor (and `others`); returns self. A sharded tensor runs its shards'."""
    Tensor._realize_all(self, *others)
    return self
  @staticmethod
  def _realize_all(*tensors: Tensor) -> None:
    from ember.schedule import create_schedule
    from ember.engine.realize import run_schedule
    todo = [t for t in _graph_tensors(tensors) if not _is_done(t.uop)]
    if not todo: return
    items, becomes = create_schedule([t.uop for t in todo])
    run_schedule(items)
    _apply_becomes(becomes)
  def contiguous(self) -> Tensor:
    if self.sharding is not None: return self.sharding.contiguous(self)
    if self.dtype.weak: return self
    return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)), requires_grad=self.requires_grad)
  def contiguous_backward(self) -> Tensor:
    if self.sharding is not None: return self.sharding.contiguous_backward(self)
    return Tensor(UOp(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.uop,)))
  def _buffer(self):
    from ember.schedule import buffer_of
    # a pending assign realizes into its own buffer: read that, not a copy of it
    if self.uop.op is Ops.ASSIGN: self.realize()
    t = self.cast(strong_dtype(self.dtype)) if self.dtype.weak else self
    t = t if _is_contiguous_buffer(t.uop) else t.contiguous()
    t.realize()
    return buffer_of(t.uop)
  def data(self) -> memoryview:
    _check_host_read("data()")
    if self.sharding is not None: return self.sharding.data()
    buf = self._buffer()
    shape = int_shape(self.shape, "data()")
    # typeshed's cast() takes literal formats only; _mv_fmt gives the dtype's struct character. 0-d: one item
    return memoryview(buf.numpy()).cast("B").cast(_mv_fmt(buf.dtype), shape or (1,))  # type: ignore[call-overload]
  def numpy(self) -> np.ndarray:
    """The tensor's values as a numpy array (numpy dtype matching the tensor's; bfloat16/fp8 come back as float32)."""
    dt = strong_dtype(self.dtype)
    _check_host_read("numpy()")
    if self.sharding is not None: return self.sharding.numpy()
    shape = int_shape(self.shape, "numpy()")
    if 0 in shape: return np.zeros(shape, dtype=_np_dtype(dt))
    if dt.fmt is None: return self.cast(dtypes.float32).numpy()
    buf = self._buffer()
    return buf.numpy().view(_np_dtype(dt)).reshape(shape)
  def item(self) -> Any:
    if self.numel() != 1: raise ShapeError(f"item() needs a tensor with one element, got shape {self.shape}")
    _check_host_read("item()")
    return self.numpy().reshape(()).item()
  def tolist(self) -> Any:
    _check_host_read("tolist()")
    return self.numpy().tolist()
  def to(self, device: str | tuple[str, ...] | None) -> Tensor:
    """A copy on `device`, or replicated on every device of a tuple (a sharded tensor is gathered first)."""
    if self.sharding is not None: return self.sharding.to(self, device)
    if isinstance(device, tuple): return self.shard(device, None)
    dev = _canon_device(device)
    if dev == self.device: return self
    if self.dtype.weak:
      raise DTypeError(f"cannot copy a weak {self.dtype!r} tensor to {dev}; cast it to a concrete dtype first")
    src = self if _is_contiguous_buffer(self.uop) else self.contiguous()
    ret = Tensor(UOp(Ops.COPY, self.dtype, (src.uop, UOp(Ops.DEVICE, arg=dev))), requires_grad=self.requires_grad)
    return ret
  def shard(self, devices: tuple[str, ...], axis: int | None = None) -> Tensor:
    """Split into contiguous pieces along `axis`, one per device (axis None: a copy on every device). Ops on the
    result run once per device; reductions over the sharded axis allreduce (see `ember.multi`).

    >>> Tensor([1.0, 2.0, 3.0, 4.0]).shard(("PYTHON", "PYTHON:1"), axis=0).sum().item()
    10.0
    """
    from ember.multi import shard_tensor
    return shard_tensor(self, devices, axis)
  def shard_(self, devices: tuple[str, ...], axis: int | None = None) -> Tensor:
    """`shard` in place: this object becomes the sharded tensor (references to it see the shards)."""
    return self.replace(self.shard(devices, axis))
  @staticmethod
  def from_sharding(sharding: Any, requires_grad: bool | None = None) -> Tensor:
    """The tensor held as `sharding` (an `ember.multi.Sharding`: one Tensor per device and the axis they split). It
    has no `uop`, and is listed in `sharded_tensors` instead of `all_tensors`."""
    t = Tensor.__new__(Tensor)
    t.sharding, t.requires_grad, t.grad = sharding, requires_grad, None
    sharded_tensors[id(t)] = t
    return t
  @property
  def shards(self) -> tuple[Tensor, ...]:
    """A sharded tensor's per-device tensors, in device order."""
    return self._sharding_of("shards").shards
  @property
  def axis(self) -> int | None:
    """The axis a sharded tensor is split on (None: every device holds all of it)."""
    return self._sharding_of("axis").axis
  @property
  def devices(self) -> tuple[str, ...]: return self._sharding_of("devices").devices
  @property
  def bounds(self) -> list[tuple[int, int]]:
    """A sharded tensor's (start, end) per shard along its axis."""
    return self._sharding_of("bounds").bounds
  def _sharding_of(self, what: str) -> Any:
    if self.sharding is None:
      raise ShardingError(f".{what} is a sharded tensor's; this one lives on {self.device}: shard it with "
                          ".shard(devices, axis) first")
    return self.sharding
  def clone(self, device: str | None = None) -> Tensor:
    if self.sharding is not None: return self.sharding.clone(self, device)
    dt = strong_dtype(self.dtype)
    ret = self.cast(dt).contiguous() if device is None else self.cast(dt).contiguous().to(device)
    return ret if ret is not self else Tensor(UOp(Ops.CONTIGUOUS, dt, (self.uop,)))
  def detach(self) -> Tensor:
    if self.sharding is not None: return self.sharding.detach()
    return Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)), requires_grad=False)
  def requires_grad_(self, requires_grad: bool | None = True) -> Tensor:
    if requires_grad and self.sharding is None: self.uop = _leaf_storage(self.uop, self.device)
    self.requires_grad = requires_grad
    return self
  def assign(self, x: Any) -> Tensor:
    """Write `x` into this tensor's memory (the same buffer, so TinyJit and optimizers see the update)."""
    if self.sharding is not None: return self.sharding.assign(self, x)
    other = x if isinstance(x, Tensor) else Tensor(x, device=self.device, dtype=self.dtype)
    if self.dtype.weak:
      if other.dtype.weak: self.uop = Tensor(other.uop).cast(strong_dtype(other.dtype)).contiguous().uop
      else: self.uop = other.contiguous().uop
      return self
    if other.shape != self.shape: raise ShapeError(f"assign shape mismatch: target {self.shape} <- value {other.shape}")
    if other.device != self.device:
      raise DeviceError(f"assign device mismatch: target on {self.device}, value on {other.device}")
    # a pending assign (x[a] = 1; x[b] = 2) lands first, so this one writes on top of it
    if self.uop.op is Ops.ASSIGN: self.realize()
    if not _is_contiguous_buffer(self.uop):
      if _is_buffer_view(self.uop): self.realize()
      else: self.replace(self.contiguous()).realize()
    value = other.cast(self.dtype) if other.dtype is not self.dtype else other
    _realize_readers_of(self.uop.buffers, exclude=(self, other))
    self.uop = UOp(Ops.ASSIGN, self.dtype, (self.uop, value.uop))
    return self
  def replace(self, x: Tensor) -> Tensor:
    """This object holds `x`'s value from now on (its graph, or its shards), so references to it see `x`."""
    if x.shape != self.shape: raise ShapeError(f"replace shape mismatch: {self.shape} <- {x.shape}")
    if self.sharding is not None: return self.sharding.replace(self, x)
    if x.sharding is None:
      self.uop = x.uop
      return self
    # it becomes sharded: no graph of its own any more, so it moves from all_tensors to sharded_tensors
    # by identity: WeakSet.discard would compare with Tensor.__eq__ (elementwise); .data is CPython's, not typeshed's
    for ref in [r for r in all_tensors.data if r() is self]: all_tensors.data.discard(ref)  # type: ignore[attr-defined]
    del self.uop
    self.sharding = x.sharding
    sharded_tensors[id(self)] = self
    return self

  # ** creation **
  @staticmethod
  def empty(*shape: Any, device: str | None = None, dtype: DType | str | None = None, **kwargs: Any) -> Tensor:
    if isinstance(device, tuple): return _multi_create(Tensor.empty, device, *shape, dtype=dtype, **kwargs)
    shp = _new_shape(_shape_arg(shape), "empty")
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    dev = _canon_device(device)
    n = prod(shp)
    return Tensor(_reshape(_buffer_uop(dev, int(n), dt), shp), **kwargs)
  @staticmethod
  def full(shape: Any, fill_value: Any, device: str | None = None, dtype: DType | str | None = None,
           **kwargs: Any) -> Tensor:
    if isinstance(device, tuple): return _multi_create(Tensor.full, device, shape, fill_value, dtype=dtype, **kwargs)
    shp = _new_shape(_shape_arg((shape,) if isinstance(shape, int) else tuple(shape)), "full")
    dt = to_dtype(dtype) if dtype is not None else strong_dtype(dtypes.from_py(fill_value))
    return Tensor(_const_uop(fill_value, dt, _canon_device(device), shp), **kwargs)
  @staticmethod
  def zeros(*shape: Any, **kwargs: Any) -> Tensor:
    return Tensor.full(_shape_arg(shape), 0.0, **{"dtype": dtypes.default_float, **kwargs})
  @staticmethod
  def ones(*shape: Any, **kwargs: Any) -> Tensor:
    return Tensor.full(_shape_arg(shape), 1.0, **{"dtype": dtypes.default_float, **kwargs})
  @staticmethod
  def arange(start: int | float, stop: int | float | None = None, step: int | float = 1, **kwargs: Any) -> Tensor:
    """start, start + step, ... up to (not including) stop. Int arguments give the default int dtype, any float one the
    default float; `dtype=` overrides (the values are computed in floats and truncated, like torch).

    >>> Tensor.arange(1, 7, 2).tolist()
    [1, 3, 5]
    """
    if stop is None: start, stop = 0, start
    if step == 0: raise ShapeError(f"arange step must be nonzero, got arange({start}, {stop}, {step})")
    if (step > 0 and start > stop) or (step < 0 and start < stop):
      raise ShapeError(f"arange({start}, {stop}, {step}): the step's sign does not lead from start to stop; flip it")
    n = max(math.ceil((stop - start) / step), 0)
    if kwargs.get("dtype") is not None: dt = to_dtype(kwargs.pop("dtype"))
    elif any(isinstance(v, float) for v in (start, stop, step)): dt = dtypes.default_float
    else: dt = dtypes.default_int
    if n == 0: return Tensor.empty(0, dtype=dt, **kwargs)
    if isinstance(kwargs.get("device"), tuple):
      return _multi_create(Tensor.arange, kwargs.pop("device"), start, stop, step, dtype=dt, **kwargs)
    # the loop index itself (a tensor-level RANGE over a DEVICE): index math, no data, no reduction
    dev = _canon_device(kwargs.pop("device", None))
    idx = Tensor(UOp(Ops.RANGE, dtypes.int32, (UOp(Ops.DEVICE, arg=dev),), n), **kwargs)
    if dtypes.is_int(dt):  # torch truncates float start and step to ints first (the count comes from the floats)
      return (idx.cast(dt) * int(step) + int(start)).cast(dt)
    ft = dt if dtypes.is_float(dt) else dtypes.default_float
    return (idx.cast(ft) * step + start).cast(dt)
  @staticmethod
  def eye(n: int, m: int | None = None, **kwargs: Any) -> Tensor:
    m = n if m is None else m
    _new_shape((n, m), "eye")
    dt = to_dtype(kwargs.pop("dtype")) if "dtype" in kwargs else dtypes.default_float
    requires_grad = kwargs.pop("requires_grad", None)
    rows = Tensor.arange(n, **kwargs).reshape(n, 1)
    cols = Tensor.arange(m, **kwargs).reshape(1, m)
    return (rows == cols).cast(dt).requires_grad_(requires_grad)
  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    """Seed the RNG of every device: the same seed gives the same stream of random tensors, eagerly or under TinyJit
    (whose captured draws read the same per-device state buffer, so they restart from the new seed too).

    >>> Tensor.manual_seed(3)
    >>> first = Tensor.rand(4).tolist()
    >>> Tensor.manual_seed(3)
    >>> Tensor.rand(4).tolist() == first
    True
    """
    _rng_seed[0] = seed
    for device, state in _rng_states.items(): state.assign(_rng_words(seed, device)).realize()
  @staticmethod
  def _rng_draw(device: str) -> Tensor:
    """The RNG state of `device` for one draw: (seed low word, seed high word, draws so far), uint32. It comes from
    the device's state buffer, which this draw advances inside the graph (a kernel, so TinyJit replays it too)."""
    if (state := _rng_states.get(device)) is None:
      state = _rng_states[device] = _rng_words(_rng_seed[0], device)
    step = (Tensor.arange(3, device=device, dtype=dtypes.uint32) == 2).cast(dtypes.uint32)  # (0, 0, 1)
    # a buffer of its own: later draws overwrite the state before this one's random bits are computed (lazily)
    drawn = (state + step).contiguous().realize()
    state.assign(drawn).realize()
    return drawn
  @staticmethod
  def _threefry_bits(n: int, device: str | tuple[str, ...] | None) -> Tensor:
    """n uint32 random words: Threefry-2x32-20 keyed by the seed, over (element index, draw number) counters. Each
    call is a new draw on the device's RNG state, so no two calls (or elements) share a counter. On several devices
    the first one draws and the others get copies, so every copy holds the same values."""
    if isinstance(device, tuple): return Tensor._threefry_bits(n, device[0]).shard(device)
    dev = _canon_device(device)
    drawn = Tensor._rng_draw(dev)
    idx = Tensor.arange(n, device=dev, dtype=dtypes.uint32)
    key0, key1, draw = drawn[0].expand(n), drawn[1].expand(n), drawn[2].expand(n)
    return Tensor._threefry2x32((key0, key1), (idx, draw))[0]
  @staticmethod
  def _threefry2x32(key: tuple[Tensor, Tensor], counter: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Threefry-2x32 with 20 rounds (Salmon et al., Random123) of uint32 tensors: a keyed bijection of the counter."""
    ks = (key[0], key[1], key[0] ^ key[1] ^ 0x1BD11BDA)
    x0, x1 = counter[0] + ks[0], counter[1] + ks[1]
    for r in range(20):
      rot = (13, 15, 26, 6, 17, 29, 16, 24)[r % 8]
      x0 = x0 + x1
      x1 = ((x1 << rot) | (x1 >> (32 - rot))) ^ x0
      if r % 4 == 3:  # key injection s after every four rounds
        s = r // 4 + 1
        x0, x1 = x0 + ks[s % 3], x1 + ks[(s + 1) % 3] + s
    return x0, x1
  @staticmethod
  def rand(*shape: Any, device: str | None = None, dtype: DType | str | None = None, **kwargs: Any) -> Tensor:
    """Uniform samples in [0, 1)."""
    shp = _new_shape(_shape_arg(shape), "rand")
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    n = int(prod(shp))
    bits = Tensor._threefry_bits(max(n, 1), device)
    # 23 random mantissa bits under exponent 0 give a float in [1, 2)
    f = ((bits >> 9) | 0x3F800000).bitcast(dtypes.float32) - 1.0
    if not n: return Tensor.empty(*shp, device=device, dtype=dt)
    return f[:n].reshape(shp).cast(dt).requires_grad_(kwargs.get("requires_grad"))
  @staticmethod
  def randn(*shape: Any, dtype: DType | str | None = None, **kwargs: Any) -> Tensor:
    """Standard normal samples (Box-Muller over two uniform streams)."""
    shp = _shape_arg(shape)
    u = Tensor.rand(2, *shp, dtype=dtypes.float32, device=kwargs.get("device"))
    r = (1 - u[0]).log().mul(-2).sqrt()
    ret = r * (u[1] * (2 * math.pi)).cos()
    out_dtype = to_dtype(dtype) if dtype is not None else dtypes.default_float
    return ret.cast(out_dtype).requires_grad_(kwargs.get("requires_grad"))
  def full_like(self, fill_value: Any, **kwargs: Any) -> Tensor:
    """A tensor of this one's shape (and dtype and device unless given) filled with `fill_value`.

    >>> Tensor([[1, 2], [3, 4]]).full_like(7).tolist()
    [[7, 7], [7, 7]]
    """
    dt = to_dtype(kwargs.pop("dtype")) if kwargs.get("dtype") is not None else strong_dtype(self.dtype)
    return Tensor.full(self.shape, fill_value, dtype=dt, device=kwargs.pop("device", self.device), **kwargs)
  def zeros_like(self, **kwargs: Any) -> Tensor:
    """Zeros of this tensor's shape, dtype and device (override with `dtype=`, `device=`).

    >>> Tensor([1.5, 2.5]).zeros_like().tolist()
    [0.0, 0.0]
    """
    return self.full_like(0, **kwargs)
  def ones_like(self, **kwargs: Any) -> Tensor:
    """Ones of this tensor's shape, dtype and device.

    >>> Tensor([1, 2]).ones_like().tolist()
    [1, 1]
    """
    return self.full_like(1, **kwargs)
  def empty_like(self, **kwargs: Any) -> Tensor:
    """An uninitialised tensor of this tensor's shape, dtype and device.

    >>> Tensor([1.0, 2.0]).empty_like().shape
    (2,)
    """
    dt = to_dtype(kwargs.pop("dtype")) if kwargs.get("dtype") is not None else strong_dtype(self.dtype)
    return Tensor.empty(*self.shape, dtype=dt, device=kwargs.pop("device", self.device), **kwargs)
  @staticmethod
  def linspace(start: int | float, stop: int | float, steps: int, **kwargs: Any) -> Tensor:
    """`steps` evenly spaced values from `start` to `stop` inclusive (torch's symmetric formula: the second half counts
    back from `stop`, so both ends are exact).

    >>> Tensor.linspace(0, 1, 5).tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    if steps < 0: raise ShapeError(f"linspace needs steps >= 0, got {steps}")
    dt = to_dtype(kwargs.pop("dtype")) if kwargs.get("dtype") is not None else dtypes.default_float
    if steps <= 1: return Tensor.full((steps,), start, dtype=dt, **kwargs)
    step = (stop - start) / (steps - 1)
    idx = Tensor.arange(steps, device=kwargs.get("device"), dtype=dtypes.float32 if dt is not dtypes.float64 else dt)
    front = idx * step + start
    back = stop - (steps - 1 - idx) * step
    ret = (idx < steps // 2).where(front, back)
    return ret.cast(dt).requires_grad_(kwargs.get("requires_grad"))
  def meshgrid(self, *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Coordinate grids from 1-d tensors: `indexing="ij"` (matrix, torch default) or `"xy"` (Cartesian).

    >>> a, b = Tensor([1, 2]).meshgrid(Tensor([3, 4, 5]))
    >>> a.shape, b.tolist()
    ((2, 3), [[3, 4, 5], [3, 4, 5]])
    """
    if indexing not in ("ij", "xy"): raise ShapeError(f"meshgrid indexing must be 'ij' or 'xy', got {indexing!r}")
    seq = _tensor_seq(self, args, "meshgrid")
    if (bad := next((t for t in seq if t.ndim > 1), None)) is not None:
      raise ShapeError(f"meshgrid takes 0-d or 1-d tensors, got shape {bad.shape}; flatten it first")
    ts = [t.flatten() for t in seq]
    shape = [t.shape[0] for t in ts]
    if indexing == "xy" and len(ts) >= 2: shape[0], shape[1] = shape[1], shape[0]
    out = []
    for i, t in enumerate(ts):
      pos = (1 if i == 0 else 0 if i == 1 else i) if indexing == "xy" and len(ts) >= 2 else i
      view: list[sint] = [1] * len(ts)
      view[pos] = t.shape[0]
      out.append(t.reshape(view).expand(shape))
    return tuple(out)
  @staticmethod
  def randint(*shape: Any, low: int = 0, high: int = 10, dtype: DType | str | None = None, **kwargs: Any) -> Tensor:
    """Uniform random integers in [low, high).

    >>> Tensor.manual_seed(0); Tensor.randint(4, low=0, high=3).shape
    (4,)
    """
    if high <= low: raise ValueError(f"randint needs low < high, got low={low}, high={high}")
    dt = to_dtype(dtype) if dtype is not None else dtypes.int32
    if not dtypes.is_int(dt): raise DTypeError(f"randint needs an int dtype, got {dt!r}")
    wide = high - low > 2 ** 22  # float32 has 23 random bits: wider ranges draw in float64
    u = Tensor.rand(*shape, dtype=dtypes.float64 if wide else dtypes.float32, device=kwargs.get("device"))
    return ((u * (high - low)).floor().cast(dtypes.int64) + low).cast(dt)
  @staticmethod
  def normal(*shape: Any, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> Tensor:
    """Normal samples with the given mean and standard deviation.

    >>> Tensor.normal(2, 3, mean=1.0, std=0.5).shape
    (2, 3)
    """
    rg = kwargs.pop("requires_grad", None)
    dt = to_dtype(kwargs.get("dtype") or dtypes.default_float)
    return (Tensor.randn(*shape, **kwargs) * std + mean).cast(dt).requires_grad_(rg)
  @staticmethod
  def uniform(*shape: Any, low: float = 0.0, high: float = 1.0, **kwargs: Any) -> Tensor:
    """Uniform samples in [low, high).

    >>> Tensor.uniform(3, low=-1.0, high=1.0).shape
    (3,)
    """
    rg = kwargs.pop("requires_grad", None)
    dt = to_dtype(kwargs.pop("dtype")) if kwargs.get("dtype") is not None else dtypes.default_float
    return (Tensor.rand(*shape, dtype=dtypes.float32, **kwargs) * (high - low) + low).cast(dt).requires_grad_(rg)
  @staticmethod
  def scaled_uniform(*shape: Any, **kwargs: Any) -> Tensor:
    """Uniform in [-1, 1) scaled by 1/sqrt(numel).

    >>> Tensor.scaled_uniform(4, 4).shape
    (4, 4)
    """
    shp = _shape_arg(shape)
    return Tensor.uniform(*shp, low=-1.0, high=1.0, **kwargs).mul(prod(shp) ** -0.5)
  @staticmethod
  def glorot_uniform(*shape: Any, **kwargs: Any) -> Tensor:
    """Xavier/Glorot uniform: U(-b, b) with b = sqrt(6 / (fan_in + fan_out)), fan_out = shape[0].

    >>> Tensor.glorot_uniform(8, 4).shape
    (8, 4)
    """
    shp = _shape_arg(shape)
    bound = (6 / (shp[0] + prod(shp[1:]))) ** 0.5
    return Tensor.uniform(*shp, low=-1.0, high=1.0, **kwargs).mul(bound)
  @staticmethod
  def kaiming_uniform(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
    """He/Kaiming uniform for leaky-relu slope `a`: U(-b, b), b = sqrt(3) * sqrt(2 / (1 + a^2)) / sqrt(fan_in).

    >>> Tensor.kaiming_uniform(8, 4).shape
    (8, 4)
    """
    shp = _shape_arg(shape)
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(shp[1:]))
    return Tensor.uniform(*shp, low=-bound, high=bound, **kwargs)
  @staticmethod
  def kaiming_normal(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
    """He/Kaiming normal for leaky-relu slope `a`: N(0, std), std = sqrt(2 / (1 + a^2)) / sqrt(fan_in).

    >>> Tensor.kaiming_normal(8, 4).shape
    (8, 4)
    """
    shp = _shape_arg(shape)
    std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(shp[1:]))
    return Tensor.normal(*shp, mean=0.0, std=std, **kwargs)

  # ** movement **
  def reshape(self, shape: Any, *args: Any) -> Tensor:
    new_shape = _shape_arg((shape, *args) if args else ((shape,) if isinstance(shape, int) else tuple(shape)))
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
  def view(self, *shape: Any) -> Tensor: return self.reshape(*shape)
  def permute(self, order: Any, *args: Any) -> Tensor:
    dims = (order, *args) if args else ((order,) if isinstance(order, int) else tuple(order))
    perm = tuple(self._resolve_dim(d) for d in dims)
    if sorted(perm) != list(range(self.ndim)):
      raise ShapeError(f"permute order {perm} is not a permutation of {self.ndim} dims (shape {self.shape}); name "
                       "each dim once")
    if perm == tuple(range(self.ndim)): return self
    if self.sharding is not None: return self.sharding.permute(self, perm)
    return Tensor(UOp(Ops.PERMUTE, self.dtype, (self.uop,), perm), requires_grad=self.requires_grad)
  def expand(self, shape: Any = (), *args: Any) -> Tensor:
    new_shape = _shape_arg((shape, *args) if args else ((shape,) if isinstance(shape, int) else tuple(shape)))
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
  def pad(self, padding: Sequence[Any], mode: str = "constant", value: float = 0.0) -> Tensor:
    """Pad with `padding` as ((before, after), ...) per dim, or torch-style flat (last dim first)."""
    pads = _norm_padding(padding, self.ndim)
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
  def _pad_mode(self, pads: list[tuple[int, int]], mode: str) -> Tensor:
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
  def shrink(self, arg: Sequence[tuple[sint, sint] | None]) -> Tensor:
    bounds = tuple((0, s) if a is None else (a[0], a[1]) for a, s in zip(arg, self.shape))
    if len(arg) != self.ndim:
      raise ShapeError(f"shrink needs one (begin, end) per dim: {len(arg)} given for shape {self.shape}")
    for (b, e), s in zip(bounds, self.shape):
      if isinstance(b, int) and isinstance(e, int) and isinstance(s, int) and not 0 <= b <= e <= s:
        raise ShapeError(f"shrink {bounds} is out of range of shape {self.shape}")
    if bounds == tuple((0, s) for s in self.shape): return self
    if self.sharding is not None: return self.sharding.shrink(self, bounds)
    return Tensor(UOp(Ops.SHRINK, self.dtype, (self.uop,), bounds), requires_grad=self.requires_grad)
  def flip(self, axis: Any, *args: Any) -> Tensor:
    dims = (axis, *args) if args else ((axis,) if isinstance(axis, int) else tuple(axis))
    axes = {self._resolve_dim(a) for a in dims}
    if len(axes) != len(dims): raise ShapeError(f"flip dims {dims} name a dim more than once (shape {self.shape})")
    if not axes: return self
    if self.sharding is not None: return self.sharding.flip(self, tuple(sorted(axes)))
    flips = tuple(i in axes for i in range(self.ndim))
    return Tensor(UOp(Ops.FLIP, self.dtype, (self.uop,), flips), requires_grad=self.requires_grad)
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
  def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor:
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

  def __getitem__(self, indices: Any) -> Tensor:
    """Basic and advanced indexing with numpy/torch semantics: ints, slices with steps, None, Ellipsis, and int
    tensors or lists (broadcast together; boolean masks are not supported, use masked_select).

    >>> Tensor([[1, 2, 3], [4, 5, 6]])[1, ::-2].tolist()
    [6, 4]
    """
    from ember.tensor_index import getitem
    return getitem(self, indices)
  def __setitem__(self, indices: Any, value: Any) -> None:
    """Write `value` (broadcast to the indexed region, cast to this dtype) into the indexed elements, in place: the
    whole tensor is reassigned as where(mask, value, self), so the buffer and its readers see the update.

    >>> t = Tensor.zeros(4).contiguous().realize()
    >>> t[1:3] = 5.0
    >>> t.tolist()
    [0.0, 5.0, 5.0, 0.0]
    """
    from ember.tensor_index import setitem
    setitem(self, indices, value)

  def cat(self, *others: Tensor, dim: int = 0) -> Tensor:
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
  def stack(self, *others: Tensor, dim: int = 0) -> Tensor:
    """Join same-shape tensors along a new dim `dim`: `Tensor.stack([a, b])`, `Tensor.stack(a, b)` or `a.stack(b)`.

    >>> Tensor.stack([Tensor([1, 2]), Tensor([3, 4])], dim=1).tolist()
    [[1, 3], [2, 4]]
    """
    if isinstance(self, (list, tuple)) and len(others) == 1 and isinstance(others[0], int):  # torch.stack(ts, dim)
      dim, others = others[0], ()
    ts = _tensor_seq(self, others, "stack")
    d = ts[0]._resolve_dim(dim, extra=1)
    return Tensor.cat(*[t.unsqueeze(d) for t in ts], dim=d)
  def _slice_dim(self, dim: int, start: sint, stop: sint) -> Tensor:
    return self.shrink(tuple((start, stop) if i == dim else (0, s) for i, s in enumerate(self.shape)))
  def repeat(self, repeats: Any, *args: Any) -> Tensor:
    """Tile the tensor `repeats[i]` times along each dim (torch.Tensor.repeat; extra leading repeats add dims).

    >>> Tensor([1, 2]).repeat(2, 2).tolist()
    [[1, 2, 1, 2], [1, 2, 1, 2]]
    """
    reps = _shape_arg((repeats, *args) if args else ((repeats,) if isinstance(repeats, int) else tuple(repeats)))
    if len(reps) < self.ndim:
      raise ShapeError(f"repeat needs at least {self.ndim} repeats for shape {self.shape}, got {reps}")
    base = self.reshape((1,) * (len(reps) - self.ndim) + self.shape)
    inter = [v for s in base.shape for v in (1, s)]
    tiled = [v for r, s in zip(reps, base.shape) for v in (r, s)]
    return base.reshape(inter).expand(tiled).reshape(tuple(r * s for r, s in zip(reps, base.shape)))
  def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
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
  def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
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
  def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """Split into `chunks` pieces of ceil(n / chunks) along `dim` (possibly fewer pieces, like torch.chunk).

    >>> [t.tolist() for t in Tensor([1, 2, 3, 4, 5]).chunk(2)]
    [[1, 2, 3], [4, 5]]
    """
    if chunks <= 0: raise ShapeError(f"chunk needs chunks > 0, got {chunks}")
    d = self._resolve_dim(dim)
    return self.split(max(1, -(-int_size(self.shape[d], "chunk") // chunks)), d)
  def unfold(self, dim: int, size: int, step: int) -> Tensor:
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
  def diag(self, diagonal: int = 0) -> Tensor:
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
  def _zero(self) -> Any: return False if self.dtype is dtypes.bool else 0
  def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
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
  def _tri_mask(self, diagonal: int, lower: bool) -> Tensor:
    if self.ndim < 2: raise ShapeError(f"tril/triu need at least 2 dims, got shape {self.shape}")
    r, c = int_size(self.shape[-2], "triu/tril"), int_size(self.shape[-1], "triu/tril")
    rows = Tensor.arange(r, device=self.device).reshape(r, 1)
    cols = Tensor.arange(c, device=self.device).reshape(1, c)
    return (cols - rows <= diagonal) if lower else (cols - rows >= diagonal)
  def tril(self, diagonal: int = 0) -> Tensor:
    """Keep the lower triangle (col - row <= diagonal) of the last two dims, zero the rest.

    >>> Tensor([[1, 2], [3, 4]]).tril().tolist()
    [[1, 0], [3, 4]]
    """
    return self._tri_mask(diagonal, True).where(self, self._zero())
  def triu(self, diagonal: int = 0) -> Tensor:
    """Keep the upper triangle (col - row >= diagonal) of the last two dims, zero the rest.

    >>> Tensor([[1, 2], [3, 4]]).triu().tolist()
    [[1, 2], [0, 4]]
    """
    return self._tri_mask(diagonal, False).where(self, self._zero())
  def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
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
  def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
    """Split dim `dim` into `sizes` (one may be -1).

    >>> Tensor.arange(6).unflatten(0, (2, 3)).shape
    (2, 3)
    """
    d = self._resolve_dim(dim)
    return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1:])
  def _check_index_tensor(self, index: Tensor, dim: int, op: str) -> None:
    if not dtypes.is_int(index.dtype): raise DTypeError(f"{op} index must be an int tensor, got {index.dtype!r}")
    if index.ndim != self.ndim:
      raise ShapeError(f"{op}: index shape {index.shape} must have as many dims as input {self.shape}")
    for i, (a, b) in enumerate(zip(int_shape(index.shape, op), int_shape(self.shape, op))):
      if i != dim and a > b:
        raise ShapeError(f"{op}: index shape {index.shape} exceeds input shape {self.shape} at dim {i}")
  def gather(self, dim: int, index: Tensor) -> Tensor:
    """out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (torch.gather); out has index's shape.

    >>> Tensor([[1, 2], [3, 4]]).gather(1, Tensor([[1, 0], [0, 0]])).tolist()
    [[2, 1], [3, 3]]
    """
    if self.ndim == 0 and index.ndim == 0:  # torch treats a 0-d input and index as 1-d of one element
      self._resolve_dim(dim, extra=1)
      return self.reshape(1).gather(0, index.reshape(1)).reshape(())
    d = self._resolve_dim(dim)
    self._check_index_tensor(index, d, "gather")
    n = int_size(self.shape[d], "gather")
    x = self.shrink(tuple((0, n) if i == d else (0, s) for i, s in enumerate(index.shape)))
    xb = x.unsqueeze(-1).transpose(d, -1)  # dim d -> 1, values of dim d on the new last axis
    onehot = index.unsqueeze(-1) == Tensor.arange(n, device=self.device, dtype=index.dtype)
    picked = onehot.where(xb, self._zero())
    return picked.max(-1) if self.dtype is dtypes.bool else picked.sum(-1, dtype=picked.dtype)
  def _scatter_mask(self, d: int, index: Tensor) -> Tensor:
    """(*index.shape, n): True where index[p] == m, n the size of dim `d` of self."""
    n = int_size(self.shape[d], "scatter")
    return index.unsqueeze(-1) == Tensor.arange(n, device=self.device, dtype=index.dtype)
  def _scatter_place(self, d: int, index: Tensor, per_pos: Tensor) -> Tensor:
    """Move the trailing n axis of a (*index.shape-with-dim-d-reduced-to-1, n) tensor onto dim d, padded to self."""
    placed = per_pos.transpose(d, -1).squeeze(-1)
    return placed.pad(tuple((0, 0) if i == d else (0, s - t) for i, (s, t) in enumerate(zip(self.shape, placed.shape))))
  def _src_like(self, src: Any, index: Tensor) -> Tensor:
    if isinstance(src, Tensor):
      if src.ndim != index.ndim or any(a > b for a, b in zip(int_shape(index.shape, "scatter"),
                                                              int_shape(src.shape, "scatter"))):
        raise ShapeError(f"scatter: src shape {src.shape} must cover index shape {index.shape}")
      return src.shrink(tuple((0, s) for s in index.shape)).cast(self.dtype)
    return Tensor.full(index.shape, src, dtype=self.dtype, device=self.device)
  def scatter(self, dim: int, index: Tensor, src: Any, reduce: str | None = None) -> Tensor:
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
  def scatter_reduce(self, dim: int, index: Tensor, src: Any, reduce: str, include_self: bool = True) -> Tensor:
    """Combine src[p] into self[..., index[p], ...] along `dim` with `reduce` in sum|prod|mean|amax|amin
    (torch.scatter_reduce); `include_self=False` ignores self's old value where something is written.

    >>> Tensor([1.0, 1.0]).scatter_reduce(0, Tensor([0, 0, 1]), Tensor([2.0, 3.0, 4.0]), "sum").tolist()
    [6.0, 5.0]
    """
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
      raise ShapeError(f"scatter_reduce reduce must be sum, prod, mean, amax or amin, got {reduce!r}")
    d = self._resolve_dim(dim)
    self._check_index_tensor(index, d, "scatter_reduce")
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
  def index_select(self, dim: int, index: Tensor) -> Tensor:
    """The entries of a 1-d int `index` along `dim` (torch.index_select): dim `dim` of the result has len(index).

    >>> Tensor([[1, 2], [3, 4], [5, 6]]).index_select(0, Tensor([2, 0])).tolist()
    [[5, 6], [1, 2]]
    """
    d = self._resolve_dim(dim)
    if not dtypes.is_int(index.dtype): raise DTypeError(f"index_select index must be int, got {index.dtype!r}")
    if index.ndim > 1: raise AxisError(f"index_select index must be 0-d or 1-d, got shape {index.shape}")
    return self[(slice(None),) * d + (index.reshape(-1),)]
  def one_hot(self, num_classes: int = -1) -> Tensor:
    """One-hot encoding along a new last dim, in this tensor's int dtype (`num_classes=-1`: max + 1).

    >>> Tensor([0, 2]).one_hot(3).tolist()
    [[1, 0, 0], [0, 0, 1]]
    """
    if not dtypes.is_int(self.dtype):
      raise DTypeError(f"one_hot needs an int tensor of class indices, got {self.dtype!r}")
    if num_classes == -1: num_classes = int(self.max().item()) + 1
    dt = strong_dtype(self.dtype)
    return (self.unsqueeze(-1) == Tensor.arange(num_classes, device=self.device, dtype=dt)).cast(dt)
  def masked_fill(self, mask: Tensor, value: Any) -> Tensor:
    """`value` where `mask` is True, self elsewhere; the dtype stays self's.

    >>> Tensor([1, 2, 3]).masked_fill(Tensor([True, False, True]), 0).tolist()
    [0, 2, 0]
    """
    if mask.dtype is not dtypes.bool: raise DTypeError(f"masked_fill mask must be bool, got {mask.dtype!r}")
    v = value.cast(self.dtype) if isinstance(value, Tensor) else Tensor(_const_uop(value, self.dtype, self.device))
    return mask.where(v, self)
  def _flat_true_positions(self, count: int) -> Tensor:
    """Flat positions of the first `count` True entries of this bool tensor (-1 for missing rows), as int32."""
    flat = self.flatten()
    n = int_size(flat.shape[0], "nonzero")
    rank = flat.cast(dtypes.int32).cumsum() - 1
    k = Tensor.arange(count, device=self.device, dtype=dtypes.int32).reshape(count, 1)
    hit = flat.reshape(1, n) & (rank.reshape(1, n) == k)  # (count, n)
    pos = Tensor.arange(n, device=self.device, dtype=dtypes.int32).reshape(1, n)
    return hit.any(1).where(hit.where(pos, 0).sum(1, dtype=dtypes.int32), -1)
  def masked_select(self, mask: Tensor, size: int | None = None, fill_value: Any = 0) -> Tensor:
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
  def nonzero(self, size: int | None = None, fill_value: int = -1) -> Tensor:
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
  def _sort_rank(self, d: int, descending: bool) -> Tensor:
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
  def sort(self, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
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
  def argsort(self, dim: int = -1, descending: bool = False) -> Tensor:
    """The int32 indices that sort the tensor along `dim` (stable).

    >>> Tensor([3, 1, 2]).argsort().tolist()
    [1, 2, 0]
    """
    return self.sort(dim, descending)[1]
  def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Tensor, Tensor]:
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

  # ** elementwise **
  def _const_like(self, x: Any) -> Tensor:
    if self.sharding is not None: return self.sharding.const_like(x)
    return Tensor(_const_uop(x, dtypes.from_py(x), self.device))
  def _broadcasted(self, y: Any, reverse: bool = False) -> tuple[Tensor, Tensor]:
    if self.sharding is not None: return self.sharding.broadcasted(self, y, reverse)
    if isinstance(y, Tensor): other = y
    elif isinstance(y, (bool, int, float)): other = Tensor(_const_uop(y, dtypes.from_py(y), self.device))
    else: other = Tensor(y, device=self.device)
    if other.device != self.device:
      raise DeviceError(f"operands on different devices: {self.device} and {other.device}; move one with .to()")
    dt = least_upper_dtype(self.dtype, other.dtype)
    a, b = self.cast(dt), other.cast(dt)
    shp = broadcast_shape(a.shape, b.shape)
    a, b = a._broadcast_to(shp), b._broadcast_to(shp)
    return (b, a) if reverse else (a, b)
  def _broadcast_to(self, shape: tuple[sint, ...]) -> Tensor:
    if self.shape == shape: return self
    return self.reshape((1,) * (len(shape) - self.ndim) + self.shape).expand(shape)
  def _alu(self, op: Ops, *srcs: Tensor) -> Tensor:
    if self.sharding is not None: return self.sharding.alu(self, op, *srcs)
    out_dtype = dtypes.bool if op in GroupOp.Comparison else self.dtype
    if op in GroupOp.Bitwise and any(dtypes.is_float(s.dtype) for s in (self, *srcs)):
      got = " and ".join(repr(s.dtype) for s in (self, *srcs))
      raise DTypeError(f"{op.name.lower()} needs int or bool operands, got {got}")
    # comparisons and int results carry no gradient (torch: only float tensors require grad), so backward never
    # fills a .grad for a mask
    rg = (any(t.requires_grad for t in (self, *srcs)) and dtypes.is_float(out_dtype)) or None
    return Tensor(UOp(op, out_dtype, tuple(t.uop for t in (self, *srcs))), requires_grad=rg)
  def cast(self, dtype: DType | str) -> Tensor:
    dt = to_dtype(dtype)
    if self.dtype is dt: return self
    if self.sharding is not None: return self.sharding.cast(self, dt)
    rg = self.requires_grad if dtypes.is_float(dt) else None
    return Tensor(_cast_uop(self.uop, dt), requires_grad=rg)
  def bitcast(self, dtype: DType | str) -> Tensor:
    dt = to_dtype(dtype)
    if self.dtype.weak or dt.weak: raise DTypeError(f"bitcast needs concrete dtypes, got {self.dtype!r} -> {dt!r}")
    if self.sharding is not None: return self if self.dtype is dt else self.sharding.bitcast(self, dt)
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

  def add(self, x: Any, reverse: PyBool = False) -> Tensor: return _binop(Ops.ADD, self, x, reverse)
  def sub(self, x: Any, reverse: PyBool = False) -> Tensor:
    a, b = self._broadcasted(x, reverse)
    if a.dtype is dtypes.bool:
      raise DTypeError("subtraction of bool tensors is not supported; use logical_xor or cast to int")
    return a._alu(Ops.SUB, b)
  def mul(self, x: Any, reverse: PyBool = False) -> Tensor: return _binop(Ops.MUL, self, x, reverse)
  def div(self, x: Any, reverse: PyBool = False, rounding_mode: str | None = None) -> Tensor:
    """self / x; `rounding_mode="trunc"` rounds the quotient toward zero, `"floor"` down (Python's //: the floor of
    the exact quotient, so 1.0 // 0.1 is 9.0). Rounded quotients keep int dtypes and have zero gradient, as in torch.

    >>> Tensor([7, -7]).div(2, rounding_mode="floor").tolist()
    [3, -4]
    """
    if rounding_mode not in (None, "trunc", "floor"):
      raise ShapeError(f"div rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    a, b = self._broadcasted(x, reverse)
    if rounding_mode is None:
      ft = least_upper_float(a.dtype)
      return a.cast(ft)._alu(Ops.FDIV, b.cast(ft))
    if a.dtype is dtypes.bool: a, b = a.cast(dtypes.int32), b.cast(dtypes.int32)
    if dtypes.is_int(a.dtype): return a._alu(Ops.IDIV, b) if rounding_mode == "trunc" else a._floordiv(b)
    ad, bd = a.detach(), b.detach()
    q = (ad / bd).trunc() if rounding_mode == "trunc" else _exact_floordiv(ad, bd)
    # a piecewise-constant result: zero gradient, but a and b stay in the graph (so asking for their gradient works)
    return (a.isnan() | b.isnan()).where(q, q)
  def _floordiv(self, b: Tensor) -> Tensor:
    q = self._alu(Ops.IDIV, b)
    # C division truncates: step down where the signs differ and there is a remainder
    fix = (self._alu(Ops.MOD, b) != 0) & ((self < 0) != (b < 0))
    return fix.where(q - 1, q)
  def mod(self, x: Any, reverse: PyBool = False) -> Tensor:
    a, b = self._broadcasted(x, reverse)
    if dtypes.is_int(a.dtype):
      r = a._alu(Ops.MOD, b)
      return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)
    q = _exact_floordiv(a.detach(), b.detach())
    # the value is a - q * b computed exactly (1.0 % 0.1 is 0.0999..., not 0); the gradient is that of a - q * b
    approx = a - q * b
    exact = (a.cast(dtypes.float64) - q.cast(dtypes.float64) * b.cast(dtypes.float64)).cast(a.dtype)
    return approx + (exact - approx).detach()
  def neg(self) -> Tensor:
    if self.dtype is dtypes.bool: return self.logical_not()
    return self._alu(Ops.NEG)
  def maximum(self, x: Any) -> Tensor:
    a, b = self._broadcasted(x)
    return a._alu(Ops.MAX, b)
  def minimum(self, x: Any) -> Tensor:
    a, b = self._broadcasted(x)
    if a.dtype is dtypes.bool: return a & b
    # ints through ~ (order-reversing without overflow: -x wraps at the minimum int), floats through -x (NaN propagates)
    if dtypes.is_int(a.dtype): return ~((~a)._alu(Ops.MAX, ~b))
    return -((-a)._alu(Ops.MAX, -b))
  def where(self, x: Any, y: Any) -> Tensor:
    if self.dtype is not dtypes.bool:
      raise DTypeError(f"where condition must be bool, got {self.dtype!r}; compare it first (e.g. t != 0)")
    if self.sharding is not None: return self.sharding.where(self, x, y)
    xs = x if isinstance(x, Tensor) else Tensor(_const_uop(x, dtypes.from_py(x), self.device))
    ys = y if isinstance(y, Tensor) else Tensor(_const_uop(y, dtypes.from_py(y), self.device))
    dt = least_upper_dtype(xs.dtype, ys.dtype)
    shp = broadcast_shape(self.shape, xs.shape, ys.shape)
    c, a, b = self._broadcast_to(shp), xs.cast(dt)._broadcast_to(shp), ys.cast(dt)._broadcast_to(shp)
    rg = a.requires_grad or b.requires_grad or None
    return Tensor(UOp(Ops.WHERE, dt, (c.uop, a.uop, b.uop)), requires_grad=rg)
  def _cmp(self, op: Ops, x: Any, reverse: PyBool = False) -> Tensor:
    a, b = self._broadcasted(x, reverse)
    return a._alu(op, b)
  def __lt__(self, x: Any) -> Tensor: return self._cmp(Ops.CMPLT, x)
  def __gt__(self, x: Any) -> Tensor: return self._cmp(Ops.CMPLT, x, reverse=True)
  def _may_be_nan(self, x: Any) -> PyBool:
    return dtypes.is_float(self.dtype) or isinstance(x, float) or (isinstance(x, Tensor) and dtypes.is_float(x.dtype))
  # `not (x > y)` is one compare, but True where either side is NaN: IEEE (and torch) say False there
  def __le__(self, x: Any) -> Tensor:
    if not self._may_be_nan(x): return self._cmp(Ops.CMPLT, x, reverse=True).logical_not()
    return self._cmp(Ops.CMPLT, x) | self._cmp(Ops.CMPEQ, x)
  def __ge__(self, x: Any) -> Tensor:
    if not self._may_be_nan(x): return self._cmp(Ops.CMPLT, x).logical_not()
    return self._cmp(Ops.CMPLT, x, reverse=True) | self._cmp(Ops.CMPEQ, x)
  def __eq__(self, x: Any) -> Tensor: return self._cmp(Ops.CMPEQ, x)  # type: ignore[override]
  def __ne__(self, x: Any) -> Tensor: return self._cmp(Ops.CMPNE, x)  # type: ignore[override]
  def logical_not(self) -> Tensor:
    as_bool = self.cast(dtypes.bool)
    return as_bool._alu(Ops.CMPNE, Tensor(_const_uop(True, dtypes.bool, self.device))._broadcast_to(self.shape))
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
  def trunc(self) -> Tensor:
    return self if dtypes.is_int(self.dtype) or self.dtype is dtypes.bool else self._alu(Ops.TRUNC)
  def exp(self) -> Tensor:
    # half types go through float32 as in torch: x * (1 / ln 2) rounded to half moves exp(x) by several ulps
    if self.dtype in (dtypes.float16, dtypes.bfloat16): return self.float().exp().cast(self.dtype)
    if dtypes.is_float(self.dtype): return self.mul(1 / math.log(2)).exp2()
    return self.cast(least_upper_float(self.dtype)).exp()
  def log(self) -> Tensor:
    if self.dtype in (dtypes.float16, dtypes.bfloat16): return self.float().log().cast(self.dtype)
    return self.log2().mul(math.log(2))
  def cos(self) -> Tensor: return (math.pi / 2 - self.cast(least_upper_float(self.dtype))).sin()
  def tanh(self) -> Tensor: return 2.0 * (2.0 * self).sigmoid() - 1.0
  def sigmoid(self) -> Tensor:
    x = self.cast(least_upper_float(self.dtype))
    # with e = exp(-|x|) <= 1: 1 / (1 + e) for x >= 0 and e / (1 + e) below. exp never overflows, so neither the value
    # nor the gradient meets inf * 0 at large |x| (1 / (1 + exp(-x)) gave a NaN gradient at x = -1e3)
    pos = x >= 0
    e = (pos.where(-x, x) * (1 / math.log(2))).exp2()
    return pos.where(1, e) * (1 + e).reciprocal()
  def relu(self) -> Tensor:
    """max(x, 0); the gradient is 1 where x > 0 and 0 elsewhere, also at 0 (torch's choice at the kink).

    >>> Tensor([-1.0, 0.0, 2.0]).relu().tolist()
    [0.0, 0.0, 2.0]
    """
    return (self > 0).where(self, self.isnan().where(self.detach(), 0))  # NaN stays NaN
  def abs(self) -> Tensor:
    if dtypes.is_unsigned(self.dtype) or self.dtype is dtypes.bool: return self
    # the sign bit, not `< 0`, so that abs(-0.0) is +0.0; at 0 the gradient is 0 (sign(x), as in torch)
    if dtypes.is_float(self.dtype): return (self == 0).where(0, self._signbit().where(-self, self))
    return (self < 0).where(-self, self)
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
  def _float(self) -> Tensor: return self.cast(least_upper_float(self.dtype))
  def fmod(self, x: Any, reverse: PyBool = False) -> Tensor:
    """C-style remainder: the result has the sign of the dividend (torch.fmod), unlike `%` which follows the divisor.

    >>> Tensor([-3.0, 3.0]).fmod(2).tolist()
    [-1.0, 1.0]
    """
    a, b = self._broadcasted(x, reverse)
    if dtypes.is_int(a.dtype): return a._alu(Ops.MOD, b)
    if a.dtype is dtypes.bool: raise DTypeError("fmod of bool tensors is not supported; cast to int first")
    return a - (a / b).trunc() * b
  def _signbit(self) -> Tensor:
    """True where the sign bit is set (so -0.0 and negative NaN count as negative)."""
    if not dtypes.is_float(self.dtype): return self < 0 if not dtypes.is_unsigned(self.dtype) else self != self
    x = self.cast(strong_dtype(self.dtype))
    return x.bitcast({1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[x.dtype.itemsize]) < 0
  def copysign(self, x: Any) -> Tensor:
    """The magnitude of self with the sign of `x` (the sign bit, so -0.0 counts as negative).

    >>> Tensor([1.0, -2.0]).copysign(Tensor([-0.0, 3.0])).tolist()
    [-1.0, 2.0]
    """
    a, b = self._broadcasted(x)
    mag = a.abs()
    if dtypes.is_unsigned(a.dtype): return mag
    return b._signbit().where(-mag, mag)
  def logaddexp(self, x: Any) -> Tensor:
    """log(exp(self) + exp(x)) without overflow.

    >>> round(Tensor([1000.0]).logaddexp(1000.0).item(), 3)
    1000.693
    """
    a, b = self._broadcasted(x)
    a, b = a._float(), b._float()
    # any finite shift gives the same value; detaching it keeps the gradient exactly softmax(a, b)
    m = a.maximum(b).detach()
    m = m.isinf().where(0, m)
    return ((a - m).exp() + (b - m).exp()).log() + m
  def lerp(self, end: Any, weight: Any) -> Tensor:
    """self + weight * (end - self), evaluated from the nearer end like torch (exact at weight 0 and 1).

    >>> Tensor([0.0, 10.0]).lerp(Tensor([10.0, 20.0]), 0.5).tolist()
    [5.0, 15.0]
    """
    a, b = self._broadcasted(end)
    w = weight if isinstance(weight, Tensor) else Tensor(_const_uop(weight, dtypes.from_py(weight), self.device))
    diff = b - a
    return (w.abs() < 0.5).where(a + w * diff, b - diff * (1 - w))
  def isclose(self, other: Any, rtol: PyFloat = 1e-05, atol: PyFloat = 1e-08, equal_nan: PyBool = False) -> Tensor:
    """Elementwise |self - other| <= atol + rtol * |other| (torch.isclose, including infinities and `equal_nan`).

    >>> Tensor([1.0, 1.1]).isclose(Tensor([1.0 + 1e-7, 1.0])).tolist()
    [True, False]
    """
    a, b = self._broadcasted(other)
    eq = a == b
    if a.dtype is dtypes.bool: return eq
    af, bf = a._float(), b._float()
    close = eq | (af.isfinite() & bf.isfinite() & ((af - bf).abs() <= atol + rtol * bf.abs()))
    return close | (af.isnan() & bf.isnan()) if equal_nan else close
  def clip(self, min_: Any = None, max_: Any = None, *, min: Any = None, max: Any = None) -> Tensor:
    """Clamp values into [min_, max_] (torch's `min=`/`max=` spell the same bounds); either bound may be None or a
    tensor, and they broadcast with self. NaN in self or a bound gives NaN; with min_ > max_ the result is max_
    (torch.clamp). The gradient flows to self where min_ <= x <= max_, to a bound where it is the result.

    >>> Tensor([-2, 0, 5]).clip(-1, 3).tolist()
    [-1, 0, 3]
    >>> Tensor([-2.0, 0.5]).clamp(min=0).tolist()
    [0.0, 0.5]
    """
    lo, hi = (min_ if min is None else min), (max_ if max is None else max)
    if lo is None and hi is None:
      raise ShapeError("clip/clamp needs at least one bound: pass min_ (min=) or max_ (max=), or both")
    ret, bounds = self, []
    if lo is not None:
      a, low = ret._broadcasted(lo)
      ret = (a < low).where(low, a)  # x == min keeps x, so the gradient goes to x there (torch)
      bounds.append(low)
    if hi is not None:
      a, high = ret._broadcasted(hi)
      ret = (a > high).where(high, a)
      bounds.append(high)
    if not dtypes.is_float(ret.dtype): return ret
    # NaN anywhere gives NaN (comparisons with NaN are False, so the wheres above kept x) with no gradient, as torch
    nan = functools.reduce(lambda acc, t: acc + t, bounds, self.cast(ret.dtype)).detach()
    return nan.isnan().where(nan, ret)
  def clamp(self, min_: Any = None, max_: Any = None, *, min: Any = None, max: Any = None) -> Tensor:
    """Alias of `clip`.

    >>> Tensor([0.5, 2.0]).clamp(max=1.0).tolist()
    [0.5, 1.0]
    """
    return self.clip(min_, max_, min=min, max=max)
  def sign(self) -> Tensor:
    """-1, 0 or 1 by sign (0 for NaN and -0.0, like torch); the dtype is kept and the gradient is zero.

    >>> Tensor([-3, 0, 2]).sign().tolist()
    [-1, 0, 1]
    """
    if self.dtype is dtypes.bool: return self
    if dtypes.is_unsigned(self.dtype): return (self > 0).cast(self.dtype)
    return (self > 0).where(1, (self < 0).where(-1, 0)).cast(self.dtype)
  def round(self, decimals: PyInt = 0) -> Tensor:
    """Round half to even (banker's rounding, like torch.round); `decimals` rounds to that many places.

    >>> Tensor([0.5, 1.5, 2.5, -0.5, 2.6]).round().tolist()
    [0.0, 2.0, 2.0, -0.0, 3.0]
    """
    if not dtypes.is_float(self.dtype): return self
    if decimals != 0: return (self * 10 ** decimals).round() / 10 ** decimals
    f = self.floor()
    d = self - f
    odd = (f * 0.5).floor() * 2 != f
    up = (d > 0.5) | ((d == 0.5) & odd)
    return up.where(f + 1, f).copysign(self)
  def log10(self) -> Tensor:
    """Base-10 logarithm.

    >>> Tensor([100.0]).log10().tolist()
    [2.0]
    """
    return self.log2() * math.log10(2)
  def tan(self) -> Tensor:
    """Tangent, sin/cos.

    >>> round(Tensor([0.5]).tan().item(), 5)
    0.5463
    """
    return self.sin() / self.cos()
  def atan(self) -> Tensor:
    """Arctangent, by argument reduction (1/x for |x| > 1, two half-angle steps) and a Taylor series.

    >>> round(Tensor([1.0]).atan().item(), 5)
    0.7854
    """
    x = self._float()
    ax = x.abs()
    big = ax > 1
    t = big.where(big.where(ax, 1).reciprocal(), ax)
    # atan(t) = 2 * atan(t / (1 + sqrt(1 + t^2))): twice takes |t| <= 1 to <= tan(pi/16) ~ 0.199
    for _ in range(2): t = t / ((t * t + 1).sqrt() + 1)
    t2 = t * t
    series: Any = 1 / 25
    for k in range(11, -1, -1): series = series * t2 + ((-1) ** k) / (2 * k + 1)
    r = series * t * 4
    r = big.where(math.pi / 2 - r, r)
    return x._signbit().where(-r, r)
  def asin(self) -> Tensor:
    """Arcsine (NaN outside [-1, 1]).

    >>> round(Tensor([0.5]).asin().item(), 5)
    0.5236
    """
    x = self._float()
    return (x / ((1 - x) * (1 + x)).sqrt()).atan()
  def acos(self) -> Tensor:
    """Arccosine, 2 * atan(sqrt((1 - x) / (1 + x))) (accurate near 1).

    >>> round(Tensor([0.5]).acos().item(), 5)
    1.0472
    """
    x = self._float()
    return ((1 - x) / (1 + x)).sqrt().atan() * 2
  def sinh(self) -> Tensor:
    """Hyperbolic sine (a short series near 0 keeps relative accuracy).

    >>> round(Tensor([1.0]).sinh().item(), 5)
    1.1752
    """
    x = self._float()
    near0 = x.abs() < 0.5
    # the series only sees small inputs, so the unused branch never feeds inf into the backward pass
    xs = near0.where(x, 0)
    x2 = xs * xs
    small = xs * (1 + x2 / 6 * (1 + x2 / 20 * (1 + x2 / 42 * (1 + x2 / 72))))
    return near0.where(small, (x.exp() - (-x).exp()) / 2)
  def cosh(self) -> Tensor:
    """Hyperbolic cosine.

    >>> round(Tensor([1.0]).cosh().item(), 5)
    1.54308
    """
    x = self._float()
    return (x.exp() + (-x).exp()) / 2
  def asinh(self) -> Tensor:
    """Inverse hyperbolic sine, sign(x) * log(|x| + sqrt(x^2 + 1)).

    >>> round(Tensor([1.0]).asinh().item(), 5)
    0.88137
    """
    x = self._float()
    ax = x.abs()
    r = (ax + (ax * ax + 1).sqrt()).log()
    return x._signbit().where(-r, r)
  def acosh(self) -> Tensor:
    """Inverse hyperbolic cosine (NaN below 1).

    >>> round(Tensor([2.0]).acosh().item(), 5)
    1.31696
    """
    x = self._float()
    return (x + ((x - 1) * (x + 1)).sqrt()).log()
  def atanh(self) -> Tensor:
    """Inverse hyperbolic tangent, 0.5 * log((1 + x) / (1 - x)).

    >>> round(Tensor([0.5]).atanh().item(), 5)
    0.54931
    """
    x = self._float()
    return ((1 + x) / (1 - x)).log() * 0.5
  def erf(self) -> Tensor:
    """Gauss error function: a Maclaurin series for |x| < 1, Abramowitz-Stegun 7.1.26 (abs error < 1.5e-7) beyond.

    >>> round(Tensor([1.0]).erf().item(), 5)
    0.8427
    """
    x = self._float()
    ax = x.abs()
    xs = (ax < 1).where(x, 0)
    xs2 = xs * xs
    coef = [((-1) ** n) / (math.factorial(n) * (2 * n + 1)) for n in range(12)]
    series: Any = coef[-1]
    for c in reversed(coef[:-1]): series = series * xs2 + c
    series = series * xs * (2 / math.sqrt(math.pi))
    x2 = x * x
    t = (ax * 0.3275911 + 1).reciprocal()
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    tail = 1 - poly * (-x2).exp()
    return (ax < 1).where(series, x._signbit().where(-tail, tail))
  def isinf(self, detect_positive: PyBool = True, detect_negative: PyBool = True) -> Tensor:
    """True at +inf (if `detect_positive`) and -inf (if `detect_negative`).

    >>> Tensor([1.0, float("inf"), -float("inf")]).isinf(detect_negative=False).tolist()
    [False, True, False]
    """
    if not dtypes.is_float(self.dtype): return self.full_like(False, dtype=dtypes.bool)
    pos = (self == math.inf) if detect_positive else self.full_like(False, dtype=dtypes.bool)
    return pos | (self == -math.inf) if detect_negative else pos
  def isnan(self) -> Tensor:
    """True where the value is NaN.

    >>> Tensor([1.0, float("nan")]).isnan().tolist()
    [False, True]
    """
    return self != self
  def isfinite(self) -> Tensor:
    """True where the value is neither infinite nor NaN.

    >>> Tensor([1.0, float("inf"), float("nan")]).isfinite().tolist()
    [True, False, False]
    """
    return (self.isinf() | self.isnan()).logical_not()
  def logical_and(self, x: Any) -> Tensor:
    """Elementwise AND of truth values (nonzero is True).

    >>> Tensor([1, 0, 2]).logical_and(Tensor([1, 1, 0])).tolist()
    [True, False, False]
    """
    a, b = self._broadcasted(x)
    return a.cast(dtypes.bool) & b.cast(dtypes.bool)
  def logical_or(self, x: Any) -> Tensor:
    """Elementwise OR of truth values.

    >>> Tensor([1, 0, 0]).logical_or(Tensor([0, 0, 3])).tolist()
    [True, False, True]
    """
    a, b = self._broadcasted(x)
    return a.cast(dtypes.bool) | b.cast(dtypes.bool)
  def logical_xor(self, x: Any) -> Tensor:
    """Elementwise XOR of truth values.

    >>> Tensor([1, 0, 1]).logical_xor(Tensor([1, 1, 0])).tolist()
    [False, True, True]
    """
    a, b = self._broadcasted(x)
    return a.cast(dtypes.bool) != b.cast(dtypes.bool)
  def bitwise_not(self) -> Tensor:
    """Bitwise NOT of an int tensor (logical NOT for bool), like `~`.

    >>> Tensor([0, 5]).bitwise_not().tolist()
    [-1, -6]
    """
    return ~self

  # ** activations **
  def relu6(self) -> Tensor:
    """min(max(x, 0), 6).

    >>> Tensor([-1.0, 3.0, 7.0]).relu6().tolist()
    [0.0, 3.0, 6.0]
    """
    return self.hardtanh(0, 6)
  def leaky_relu(self, neg_slope: PyFloat = 0.01) -> Tensor:
    """x for x > 0, neg_slope * x otherwise.

    >>> Tensor([-2.0, 2.0]).leaky_relu(0.5).tolist()
    [-1.0, 2.0]
    """
    return (self > 0).where(self, self * neg_slope)
  def elu(self, alpha: PyFloat = 1.0) -> Tensor:
    """x for x > 0, alpha * (exp(x) - 1) otherwise.

    >>> round(Tensor([-1.0]).elu().item(), 5)
    -0.63212
    """
    return (self > 0).where(self, ((self > 0).where(0, self).exp() - 1) * alpha)
  def celu(self, alpha: PyFloat = 1.0) -> Tensor:
    """x for x > 0, alpha * (exp(x / alpha) - 1) otherwise.

    >>> round(Tensor([-1.0]).celu(2.0).item(), 5)
    -0.78694
    """
    return (self > 0).where(self, (((self > 0).where(0, self) / alpha).exp() - 1) * alpha)
  def selu(self) -> Tensor:
    """Scaled ELU with the self-normalising constants (alpha ~ 1.6733, scale ~ 1.0507).

    >>> round(Tensor([1.0]).selu().item(), 5)
    1.0507
    """
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    return self.elu(alpha) * scale
  def silu(self) -> Tensor:
    """x * sigmoid(x).

    >>> round(Tensor([1.0]).silu().item(), 5)
    0.73106
    """
    return self * self.sigmoid()
  def swish(self) -> Tensor:
    """Alias of `silu`.

    >>> round(Tensor([1.0]).swish().item(), 5)
    0.73106
    """
    return self.silu()
  def gelu(self, approximate: str = "none") -> Tensor:
    """GELU, exact x * Phi(x) (`approximate="none"`) or the tanh approximation (`"tanh"`).

    >>> round(Tensor([1.0]).gelu().item(), 5)
    0.84134
    """
    if approximate == "tanh":
      return 0.5 * self * (1 + (math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).tanh())
    if approximate != "none": raise ValueError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * self * (1 + (self * (1 / math.sqrt(2))).erf())
  def quick_gelu(self) -> Tensor:
    """x * sigmoid(1.702 * x).

    >>> round(Tensor([1.0]).quick_gelu().item(), 4)
    0.8458
    """
    return self * (self * 1.702).sigmoid()
  def hardswish(self) -> Tensor:
    """x * relu6(x + 3) / 6.

    >>> Tensor([-4.0, 0.0, 4.0]).hardswish().tolist()
    [-0.0, 0.0, 4.0]
    """
    return self * (self + 3).relu6() * (1 / 6)
  def hardsigmoid(self) -> Tensor:
    """relu6(x + 3) / 6.

    >>> Tensor([-4.0, 0.0, 4.0]).hardsigmoid().tolist()
    [0.0, 0.5, 1.0]
    """
    return (self + 3).relu6() * (1 / 6)
  def hardtanh(self, min_val: PyFloat = -1.0, max_val: PyFloat = 1.0) -> Tensor:
    """Clamp to [min_val, max_val].

    >>> Tensor([-2.0, 0.5, 2.0]).hardtanh().tolist()
    [-1.0, 0.5, 1.0]
    """
    # the gradient is 1 strictly inside (min_val, max_val), 0 at and beyond the bounds (torch's hardtanh, unlike clamp)
    return ((self > min_val) & (self < max_val)).where(self, self.clip(min_val, max_val).detach())
  def softplus(self, beta: PyFloat = 1.0, threshold: PyFloat = 20.0) -> Tensor:
    """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold (torch's linear cut-over).

    >>> round(Tensor([0.0]).softplus().item(), 5)
    0.69315
    """
    bx = self * beta
    return (bx > threshold).where(self, bx.logaddexp(0) * (1 / beta))
  def mish(self) -> Tensor:
    """x * tanh(softplus(x)).

    >>> round(Tensor([1.0]).mish().item(), 4)
    0.8651
    """
    return self * self.softplus().tanh()
  def softsign(self) -> Tensor:
    """x / (1 + |x|).

    >>> Tensor([1.0, -3.0]).softsign().tolist()
    [0.5, -0.75]
    """
    return self / (self.abs() + 1)
  def logsigmoid(self) -> Tensor:
    """log(sigmoid(x)), computed stably as -softplus(-x).

    >>> round(Tensor([0.0]).logsigmoid().item(), 5)
    -0.69315
    """
    return -(-self).softplus()
  def _softmax_axis(self, axis: PyInt | None, dim: PyInt | None) -> PyInt:
    if dim is not None: return dim
    return -1 if axis is None else axis
  def softmax(self, axis: PyInt | None = -1, dtype: DType | str | None = None, dim: PyInt | None = None) -> Tensor:
    """exp(x) / sum(exp(x)) along `axis` (`dim=` is an alias), shifted by the max for stability.

    >>> Tensor([[1.0, 1.0]]).softmax().tolist()
    [[0.5, 0.5]]
    """
    ax = self._softmax_axis(axis, dim)
    x = self.cast(dtype) if dtype is not None else self._float()
    e = (x - x._amax(ax, keepdim=True).detach()).exp()
    # one reciprocal per row and a multiply per element (as torch's CPU softmax does): a division per element was a
    # third of the softmax's time on AVX-512 (vdivps), and the results differ from it by at most an ulp
    return e * e.sum(ax, keepdim=True).reciprocal()
  def log_softmax(self, axis: PyInt | None = -1, dtype: DType | str | None = None, dim: PyInt | None = None) -> Tensor:
    """log(softmax(x)) along `axis`, computed as x - max - log(sum(exp(x - max))).

    >>> round(Tensor([1.0, 1.0]).log_softmax().tolist()[0], 5)
    -0.69315
    """
    ax = self._softmax_axis(axis, dim)
    x = self.cast(dtype) if dtype is not None else self._float()
    shifted = x - x._amax(ax, keepdim=True).detach()
    return shifted - shifted.exp().sum(ax, keepdim=True).log()
  def softmin(self, axis: PyInt | None = -1, dtype: DType | str | None = None, dim: PyInt | None = None) -> Tensor:
    """softmax(-x).

    >>> Tensor([0.0, 0.0]).softmin().tolist()
    [0.5, 0.5]
    """
    return (-self).softmax(axis, dtype, dim)
  def normalize(self, p: PyFloat = 2.0, dim: PyInt = 1, eps: PyFloat = 1e-12) -> Tensor:
    """x / max(||x||_p, eps) along `dim` (torch.nn.functional.normalize).

    >>> [round(v, 4) for v in Tensor([[3.0, 4.0]]).normalize().tolist()[0]]
    [0.6, 0.8]
    """
    x = self._float()
    norm = x.square().sum(dim, keepdim=True).sqrt() if p == 2 else x.abs().pow(p).sum(dim, keepdim=True).pow(1 / p)
    return x / norm.maximum(eps)

  # ** reductions **
  def _reduce_axes(self, axis: Any) -> tuple[PyInt, ...]:
    if axis is None: return tuple(range(self.ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    resolved = {self._resolve_dim(a) for a in axes}
    if len(resolved) != len(axes): raise ShapeError(f"reduce dims {axes} repeat a dim (shape {self.shape})")
    return tuple(sorted(resolved))
  def _reduce(self, op: Ops, axis: Any = None, keepdim: PyBool = False) -> Tensor:
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
  def _chunked_sum(self, axes: tuple[PyInt, ...]) -> Tensor | None:
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
    chunks = -(-count // SUM_CHUNK)
    flat = self.permute(*keep, *axes).reshape(*kept, count)  # (*kept, count)
    flat = flat.pad(((0, 0),) * len(kept) + ((0, chunks * SUM_CHUNK - count),)).reshape(*kept, chunks, SUM_CHUNK)
    partial = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (flat.uop,), (Ops.ADD, (len(kept) + 1,))),
                     requires_grad=self.requires_grad).reshape(*kept, chunks)  # (*kept, chunks)
    total = partial.contiguous()._reduce(Ops.ADD, len(kept), keepdim=True)  # the partials, in chunks again if many
    return total.reshape(tuple(1 if i in axes else s for i, s in enumerate(self.shape)))
  def _split_reduce_parts(self, axes: tuple[PyInt, ...]) -> PyInt | None:
    """How many partial results a reduction of every element splits into (SPLIT_REDUCE_MIN elements or more, a
    constant shape; the most of 256, 128, ... 2 that divides it into runs of at least 4096), else None."""
    if len(axes) != self.ndim or not all(isinstance(d, int) for d in self.shape): return None
    n = prod(self.shape)
    if not isinstance(n, int) or n < SPLIT_REDUCE_MIN: return None
    return next((c for c in (256, 128, 64, 32, 16, 8, 4, 2) if n % c == 0 and n // c >= 4096), None)
  def sum(self, axis: Any = None, keepdim: PyBool = False, dtype: DType | None = None) -> Tensor:
    acc = to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype)
    ret = self.cast(acc)._reduce(Ops.ADD, axis, keepdim)
    return ret.cast(self.dtype) if dtype is None and self.dtype in (dtypes.float16, dtypes.bfloat16) else ret
  def prod(self, axis: Any = None, keepdim: PyBool = False, dtype: DType | None = None) -> Tensor:
    # bools and small ints multiply in the sum's accumulator (torch: int64), floats in their own dtype
    if dtype is not None: acc = to_dtype(dtype)
    else: acc = strong_dtype(self.dtype) if dtypes.is_float(self.dtype) else sum_acc_dtype(self.dtype)
    return self.cast(acc)._reduce(Ops.MUL, axis, keepdim)
  def _check_nonempty(self, axis: Any, op: str) -> None:
    """max/min/argmax have no identity element: over zero elements they raise, as torch does."""
    if self.ndim and any(self.shape[a] == 0 for a in self._reduce_axes(axis)):
      over = "all dims" if axis is None else f"dim {axis}"
      raise EmptyReductionError(f"{op}() over {over} of shape {self.shape} reduces zero elements and has no identity; "
                                "reduce a non-empty dim")
  def _amax(self, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    """max without the empty check: -inf (the dtype's minimum) over zero elements, for softmax and logsumexp."""
    return self.cast(strong_dtype(self.dtype))._reduce(Ops.MAX, axis, keepdim)
  def max(self, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    self._check_nonempty(axis, "max")
    return self._amax(axis, keepdim)
  def min(self, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    self._check_nonempty(axis, "min")
    x = self.cast(strong_dtype(self.dtype))
    # ~x reverses the order of ints (and bools) without the overflow of -x at the minimum int
    if dtypes.is_int(x.dtype) or x.dtype is dtypes.bool: return ~((~x).max(axis, keepdim))
    return -((-x).max(axis, keepdim))
  def mean(self, axis: Any = None, keepdim: PyBool = False) -> Tensor:
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
  def _axis_count(self, axis: Any) -> PyInt:
    return int(prod(self.shape[a] for a in self._reduce_axes(axis))) if self.ndim else 1
  def var(self, axis: Any = None, keepdim: PyBool = False, correction: PyInt | PyFloat = 1) -> Tensor:
    """Variance over `axis`, dividing by N - correction (Bessel's correction by default).

    >>> Tensor([1.0, 2.0, 3.0, 4.0]).var().item()
    1.6666666269302368
    """
    x = self._float()
    dev = x - x.mean(axis, keepdim=True)
    return dev.square().sum(axis, keepdim=keepdim).div(max(0, self._axis_count(axis) - correction))
  def std(self, axis: Any = None, keepdim: PyBool = False, correction: PyInt | PyFloat = 1) -> Tensor:
    """Standard deviation over `axis`: sqrt(var).

    >>> Tensor([1.0, 3.0]).std().item()
    1.4142135381698608
    """
    return self.var(axis, keepdim, correction).sqrt()
  def var_mean(self, axis: Any = None, keepdim: PyBool = False,
               correction: PyInt | PyFloat = 1) -> tuple[Tensor, Tensor]:
    """(var, mean) over `axis`.

    >>> [t.item() for t in Tensor([1.0, 3.0]).var_mean()]
    [2.0, 2.0]
    """
    return self.var(axis, keepdim, correction), self._float().mean(axis, keepdim)
  def std_mean(self, axis: Any = None, keepdim: PyBool = False,
               correction: PyInt | PyFloat = 1) -> tuple[Tensor, Tensor]:
    """(std, mean) over `axis`.

    >>> [round(t.item(), 4) for t in Tensor([1.0, 3.0]).std_mean()]
    [1.4142, 2.0]
    """
    return self.std(axis, keepdim, correction), self._float().mean(axis, keepdim)
  def any(self, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    """True if any element along `axis` is nonzero.

    >>> Tensor([[0, 1], [0, 0]]).any(axis=1).tolist()
    [True, False]
    """
    return (self != 0).cast(dtypes.uint8)._reduce(Ops.MAX, axis, keepdim).cast(dtypes.bool)
  def all(self, axis: Any = None, keepdim: PyBool = False) -> Tensor:
    """True if every element along `axis` is nonzero.

    >>> Tensor([[1, 1], [0, 1]]).all(axis=1).tolist()
    [True, False]
    """
    return (self == 0).any(axis, keepdim).logical_not()
  def _arg_first(self, hit: Tensor, axis: PyInt | None, keepdim: PyBool) -> Tensor:
    """The first index along `axis` where `hit` is True (as int32)."""
    if axis is None:
      ret = Tensor._arg_first(self.flatten(), hit.flatten(), 0, False)
      return ret.reshape((1,) * self.ndim) if keepdim else ret
    ax = self._resolve_dim(axis)
    n = int_size(self.shape[ax], "argmax/argmin")
    # count down from n so the max picks the smallest index
    down = Tensor.arange(n, 0, -1, device=self.device, dtype=dtypes.int32).reshape((n,) + (1,) * (self.ndim - ax - 1))
    return (n - hit.where(down, 0).max(ax, keepdim)).cast(dtypes.int32)
  def argmax(self, axis: PyInt | None = None, keepdim: PyBool = False) -> Tensor:
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
  def argmin(self, axis: PyInt | None = None, keepdim: PyBool = False) -> Tensor:
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
  def logsumexp(self, axis: Any = None, keepdim: PyBool = False) -> Tensor:
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
  def _scan_windows(self, axis: PyInt, fill: Any) -> Tensor:
    """(..., n, n) with the scanned axis last: row i holds x[:i+1] and `fill` after it."""
    x = self.transpose(axis, -1) if self.ndim > 1 else self
    n = int_size(x.shape[-1], "a cumulative op")
    j = Tensor.arange(n, device=self.device, dtype=dtypes.int32)
    in_prefix = j.reshape(1, n) <= j.reshape(n, 1)  # (i, j): j <= i
    return in_prefix.where(x.unsqueeze(-2).expand(*x.shape[:-1], n, n), fill)
  def _scan(self, op: Ops, axis: PyInt, fill: Any) -> Tensor:
    if self.ndim == 0: return self
    ax = self._resolve_dim(axis)
    if self.shape[ax] == 0: return self
    w = self._scan_windows(ax, fill)
    out = w._reduce(op, -1) if op is not Ops.ADD else w.sum(-1, dtype=w.dtype)
    return out.transpose(ax, -1) if self.ndim > 1 else out
  def cumsum(self, axis: PyInt = 0) -> Tensor:
    """Inclusive cumulative sum along `axis` (ints accumulate in at least int32, like the sum's dtype).

    >>> Tensor([1, 2, 3]).cumsum().tolist()
    [1, 3, 6]
    """
    return self.cast(sum_acc_dtype(self.dtype))._scan(Ops.ADD, axis, 0)
  def cumprod(self, axis: PyInt = 0) -> Tensor:
    """Inclusive cumulative product along `axis`.

    >>> Tensor([1, 2, 3]).cumprod().tolist()
    [1, 2, 6]
    """
    return self.cast(sum_acc_dtype(self.dtype))._scan(Ops.MUL, axis, 1)
  def _cum_extreme(self, axis: PyInt, largest: PyBool) -> tuple[Tensor, Tensor]:
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
    return (src.gather(ax, idx) if dtypes.is_float(src.dtype) else vals), idx
  def cummax(self, axis: PyInt = 0) -> tuple[Tensor, Tensor]:
    """Running maximum along `axis` and the int32 index where it was reached (the latest on ties, like torch).

    >>> [t.tolist() for t in Tensor([1, 3, 2, 3]).cummax()]
    [[1, 3, 3, 3], [0, 1, 1, 3]]
    """
    return self._cum_extreme(axis, True)
  def cummin(self, axis: PyInt = 0) -> tuple[Tensor, Tensor]:
    """Running minimum along `axis` and the int32 index where it was reached.

    >>> [t.tolist() for t in Tensor([3, 1, 2]).cummin()]
    [[3, 1, 1], [0, 1, 1]]
    """
    return self._cum_extreme(axis, False)
  def logcumsumexp(self, axis: PyInt = 0) -> Tensor:
    """log(cumsum(exp(x))) along `axis`, each prefix shifted by its own max (no overflow or underflow).

    >>> [round(v, 4) for v in Tensor([0.0, 0.0]).logcumsumexp().tolist()]
    [0.0, 0.6931]
    """
    x = self._float()
    if x.ndim == 0: return x
    ax = x._resolve_dim(axis)
    out = x._scan_windows(ax, -math.inf).logsumexp(-1)
    return out.transpose(ax, -1) if x.ndim > 1 else out

  # ** linear algebra **
  def dot(self, w: Tensor) -> Tensor:
    """Matrix product with numpy/torch broadcasting semantics; 1-d operands are promoted and squeezed."""
    if self.ndim == 0 or w.ndim == 0:
      raise ShapeError(f"dot needs at least 1-d operands, got shapes {self.shape} and {w.shape}")
    x, y = self, w
    if x.shape[-1] != y.shape[-min(y.ndim, 2)]:
      inner = y.shape[-min(y.ndim, 2)]
      raise ShapeError(f"shape mismatch in matmul: {self.shape} @ {w.shape}; inner dims {x.shape[-1]} != {inner}")
    dt = least_upper_dtype(x.dtype, y.dtype)
    x = x.reshape(*x.shape[:-1], *([1] * min(x.ndim - 1, y.ndim - 1, 1)), x.shape[-1])
    y_tail = min(y.ndim, 2)  # the contracted dim of y counts from the end: -1 for a vector, -2 for a matrix
    y = y.reshape(*y.shape[:-2], *([1] * min(x.ndim - 1, y.ndim - 1, 1)), *y.shape[-y_tail:]).transpose(-1, -y_tail)
    return (x.cast(dt) * y.cast(dt)).sum(-1, dtype=sum_acc_dtype(dt) if not dtypes.is_float(dt) else None).cast(dt)
  def matmul(self, x: Tensor, reverse: PyBool = False) -> Tensor: return x.dot(self) if reverse else self.dot(x)
  @staticmethod
  def einsum(formula: str, *operands: Tensor | Sequence[Tensor]) -> Tensor:
    """Einstein summation: "ij,jk->ik", implicit outputs ("ij,jk"), "..." broadcast dims and repeated letters within
    one operand (a diagonal, e.g. "ii->" is the trace).

    >>> Tensor.einsum("ij,j->i", Tensor([[1, 2], [3, 4]]), Tensor([1, 1])).tolist()
    [3, 7]
    """
    given = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
    ops = [t for t in given if isinstance(t, Tensor)]
    if len(ops) != len(given):
      raise DTypeError(f"einsum operands must be Tensors, got {', '.join(type(t).__name__ for t in given)}")
    spec = formula.replace(" ", "")
    lhs, arrow, rhs = spec.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(ops): raise ShapeError(f"einsum {formula!r} names {len(ins)} operands but {len(ops)} were given")
    for sub in (*ins, rhs):
      if sub.count("...") > 1 or not all(c.isascii() and c.isalpha() for c in sub.replace("...", "")):
        raise ShapeError(f"einsum {formula!r}: subscripts are letters a-z, A-Z and at most one '...' per operand")
    # "..." expands to one fresh symbol per dim the operand has beyond its named ones (not a letter: those are taken)
    ell_ndim = max((t.ndim - len(s.replace("...", "")) for s, t in zip(ins, ops) if "..." in s), default=0)
    ell = "".join(chr(0x100 + i) for i in range(ell_ndim))
    letters: list[str] = []
    for s, t in zip(ins, ops):
      extra = t.ndim - len(s.replace("...", ""))
      full = s.replace("...", ell[ell_ndim - extra:]) if "..." in s else s
      if len(full) != t.ndim: raise ShapeError(f"einsum operand {s!r} has {len(full)} letters but shape {t.shape}")
      letters.append(full)
    if arrow:
      out = rhs.replace("...", ell)
      if (missing := set(out) - set("".join(letters))) or len(set(out)) != len(out):
        raise ShapeError(f"einsum {formula!r}: output letters must appear in an input, each once ({sorted(missing)})")
    else:
      counts = {c: "".join(letters).count(c) for c in "".join(letters)}
      out = ell + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell))
    alphabet = sorted(set("".join(letters)), key=lambda c: (c not in out, out.index(c) if c in out else c))
    sizes: dict[str, sint] = {}
    aligned = []
    for s, t in zip(letters, ops):
      # repeated letters in one operand: keep the diagonal
      while len(set(s)) != len(s):
        c = next(c for c in s if s.count(c) > 1)
        i, j = s.index(c), s.index(c, s.index(c) + 1)
        if t.shape[i] != t.shape[j]:
          raise ShapeError(f"einsum {formula!r}: subscript {c!r} repeats in one operand over sizes {t.shape[i]} != "
                           f"{t.shape[j]} (shape {t.shape})")
        t = t.diagonal(0, i, j)
        s = s[:i] + s[i + 1:j] + s[j + 1:] + c
      for c, n in zip(s, t.shape):
        if sizes.setdefault(c, n) != n and n != 1 and sizes[c] != 1:
          raise ShapeError(f"einsum {formula!r}: letter {c!r} is {sizes[c]} in one operand and {n} in another")
        if sizes[c] == 1: sizes[c] = n
      order = sorted(s, key=alphabet.index)
      t = t.permute([s.index(c) for c in order])
      aligned.append(t.reshape([t.shape[order.index(c)] if c in s else 1 for c in alphabet]))
    dt = least_upper_dtype(*(t.dtype for t in aligned))
    acc = aligned[0].cast(dt)
    for t in aligned[1:]: acc = acc * t.cast(dt)
    reduce_axes = [i for i, c in enumerate(alphabet) if c not in out]
    acc_dt = sum_acc_dtype(dt) if not dtypes.is_float(dt) else None
    ret = acc.sum(reduce_axes, dtype=acc_dt).cast(dt) if reduce_axes else acc
    return ret._broadcast_to(tuple(sizes[c] for c in out)) if ret.shape != tuple(sizes[c] for c in out) else ret

  # ** convolution and pooling **
  def _pool(self, kernel: tuple[PyInt, ...], stride: tuple[PyInt, ...], dilation: tuple[PyInt, ...]) -> Tensor:
    """Sliding windows over the last len(kernel) dims: (..., *spatial) -> (..., *out, *kernel), built from movement ops
    only. Per dim: tile the input e times, view it as rows of (i + d), and row a column o*s is x[o*s + a*d]."""
    nd = len(kernel)
    x = self
    lead = x.ndim - nd
    for j, (k, s, d) in enumerate(zip(kernel, stride, dilation)):
      ax = lead + j * 2  # earlier dims are already (out, kernel) pairs
      i = int_size(x.shape[ax], "pooling")
      o = (i - d * (k - 1) - 1) // s + 1
      if o <= 0: raise ShapeError(f"pool window {k} (dilation {d}) is larger than the padded input size {i}")
      if o * s > i + d:  # a stride longer than the window: room for the row view below (the padding is never read)
        x = x.pad(tuple((0, o * s - i - d) if a == ax else (0, 0) for a in range(x.ndim)))
        i = o * s - d
      e = -(-(k * (i + d)) // i)
      pre, post = x.shape[:ax], x.shape[ax + 1:]
      x = x.reshape(*pre, 1, i, *post).expand(*pre, e, i, *post).reshape(*pre, e * i, *post)
      x = x._slice_dim(ax, 0, k * (i + d)).reshape(*pre, k, i + d, *post)
      x = x._slice_dim(ax + 1, 0, o * s).reshape(*pre, k, o, s, *post)
      x = x._slice_dim(ax + 2, 0, 1).reshape(*pre, k, o, *post)
      x = x.transpose(ax, ax + 1)  # (..., o, k, ...)
    order = list(range(lead)) + [lead + 2 * j for j in range(nd)] + [lead + 2 * j + 1 for j in range(nd)]
    return x.permute(order)
  @staticmethod
  def _tuple_arg(v: PyInt | Sequence[PyInt], n: PyInt, name: str, low: PyInt = 1) -> tuple[PyInt, ...]:
    """One int per spatial dim, each at least `low` (1 for kernel sizes, strides and dilations; 0 for paddings)."""
    ret = (v,) * n if isinstance(v, int) else tuple(int(a) for a in v)
    if len(ret) != n: raise ShapeError(f"{name} {ret} needs {n} entries, one per spatial dim")
    if any(a < low for a in ret): raise ShapeError(f"{name} {ret} must be >= {low} in every spatial dim")
    return ret
  @staticmethod
  def _pad_pairs(padding: PyInt | Sequence[PyInt], n: PyInt) -> list[tuple[PyInt, PyInt]]:
    """Per spatial dim (before, after): an int, one int per dim (symmetric) or 2*n ints (torch F.pad order, last dim
    first: left, right, top, bottom, ...)."""
    pads = [padding] if isinstance(padding, int) else [int(p) for p in padding]
    if any(p < 0 for p in pads): raise ShapeError(f"padding {tuple(pads)} must be >= 0; shrink the input to crop it")
    if len(pads) == 1: return [(pads[0], pads[0])] * n
    if len(pads) == n: return [(p, p) for p in pads]
    if len(pads) == 2 * n: return [(pads[2 * (n - 1 - j)], pads[2 * (n - 1 - j) + 1]) for j in range(n)]
    raise ShapeError(f"padding {tuple(pads)} needs 1, {n} or {2 * n} entries for {n} spatial dims")
  @staticmethod
  def _conv_padding(padding: PyInt | Sequence[PyInt] | str, nd: PyInt, kernel: tuple[PyInt, ...],
                    stride: PyInt | Sequence[PyInt], dilation: PyInt | Sequence[PyInt]) -> list[tuple[PyInt, PyInt]]:
    """conv2d's padding as (before, after) per spatial dim, with torch's "valid" and "same" strings."""
    if not isinstance(padding, str): return Tensor._pad_pairs(padding, nd)
    if padding == "valid": return [(0, 0)] * nd
    if padding != "same": raise ShapeError(f"conv2d padding string must be 'same' or 'valid', got {padding!r}")
    if any(v != 1 for v in Tensor._tuple_arg(stride, nd, "stride")):
      raise ShapeError(f"conv2d padding='same' needs stride 1, got stride {stride}; pad explicitly instead")
    totals = [d * (k - 1) for d, k in zip(Tensor._tuple_arg(dilation, nd, "dilation"), kernel)]
    return [(t // 2, t - t // 2) for t in totals]
  def conv2d(self, weight: Tensor, bias: Tensor | None = None, groups: PyInt = 1, stride: PyInt | Sequence[PyInt] = 1,
             dilation: PyInt | Sequence[PyInt] = 1, padding: PyInt | Sequence[PyInt] | str = 0) -> Tensor:
    """N-d convolution (1d/2d/3d from the weight's rank): input (N, Cin, *spatial), weight (Cout, Cin/groups,
    *kernel). `padding`: int, one per dim, 2 per dim in F.pad order (asymmetric), "valid" (none) or "same" (output
    as large as the input, stride 1; an odd total puts the extra row/col at the end, like torch).

    >>> Tensor.ones(1, 1, 3, 3).conv2d(Tensor.ones(1, 1, 2, 2)).tolist()
    [[[[4.0, 4.0], [4.0, 4.0]]]]
    """
    nd = weight.ndim - 2
    if nd < 1 or self.ndim != nd + 2:
      raise ShapeError(f"conv2d: input {self.shape} and weight {weight.shape} need ranks n+2 and n+2 (n spatial dims)")
    bs, cin = self.shape[:2]
    cout, cin_g = weight.shape[:2]
    if cin != cin_g * groups or cout % groups != 0:
      raise ShapeError(f"conv2d: input channels {cin} != weight channels {cin_g} * groups {groups} "
                       f"(input {self.shape}, weight {weight.shape}), or out channels {cout} not divisible by groups")
    kernel = int_shape(weight.shape[2:], "conv2d")
    pads = Tensor._conv_padding(padding, nd, kernel, stride, dilation)
    x = self.pad(((0, 0), (0, 0), *pads))
    pool_args = (kernel, Tensor._tuple_arg(stride, nd, "stride"), Tensor._tuple_arg(dilation, nd, "dilation"))
    # groups=1 is an implicit GEMM: the padded image is copied channels-last once, then one reduction over
    # (*kernel, Cin) reads its windows in place (affine indices, no gates) and stores (N, *out, Cout), Cout innermost:
    # the kernel is matmul-like with Cout as its columns (register blocks, the weight packed), and no im2col matrix is
    # written (the bench's conv: 115 MB and 10 ms). One copy then makes it (N, Cout, *out).
    implicit = groups == 1 and all(isinstance(s, int) for s in x.shape)
    if implicit: x = x.permute(0, *range(2, 2 + nd), 1).contiguous().permute(0, nd + 1, *range(1, nd + 1))
    win = x._pool(*pool_args)  # (N, Cin, *out, *kernel)
    out_sp = win.shape[2:2 + nd]
    if implicit:
      win = win.permute(0, *range(2, 2 + 2 * nd), 1).reshape(bs, *out_sp, 1, *kernel, cin)
      w = weight.permute(0, *range(2, 2 + nd), 1).reshape(1, *([1] * nd), cout, *kernel, cin)
      axes = list(range(nd + 2, 2 * nd + 3))
    else:  # (N, G, 1, Cin/G, *out, *k) * (1, G, Cout/G, Cin/G, *1, *k) summed over Cin/G and the kernel
      win = win.reshape(bs, groups, 1, cin_g, *out_sp, *kernel)
      w = weight.reshape(1, groups, cout // groups, cin_g, *([1] * nd), *kernel)
      axes = [3] + list(range(4 + nd, 4 + 2 * nd))
    dt = least_upper_dtype(win.dtype, w.dtype)
    acc_dt = sum_acc_dtype(dt) if not dtypes.is_float(dt) else None
    out = (win.cast(dt) * w.cast(dt)).sum(axes, dtype=acc_dt).cast(dt)
    out = out.contiguous().permute(0, nd + 1, *range(1, nd + 1)) if implicit else out.reshape(bs, cout, *out_sp)
    return out if bias is None else out + bias.reshape(1, cout, *([1] * nd))
  def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, groups: PyInt = 1,
                       stride: PyInt | Sequence[PyInt] = 1, dilation: PyInt | Sequence[PyInt] = 1,
                       padding: PyInt | Sequence[PyInt] = 0, output_padding: PyInt | Sequence[PyInt] = 0) -> Tensor:
    """Transposed convolution (the gradient of conv2d): weight (Cin, Cout/groups, *kernel); `output_padding` adds
    rows/cols on the far side of each spatial dim.

    >>> Tensor.ones(1, 1, 2, 2).conv_transpose2d(Tensor.ones(1, 1, 2, 2)).shape
    (1, 1, 3, 3)
    """
    nd = weight.ndim - 2
    if self.ndim != nd + 2:
      raise ShapeError(f"conv_transpose2d: input {self.shape} and weight {weight.shape} ranks differ")
    cin, cout_g = weight.shape[:2]
    if self.shape[1] != cin:
      raise ShapeError(f"conv_transpose2d: input channels {self.shape[1]} != weight {weight.shape} dim 0")
    kernel = int_shape(weight.shape[2:], "conv_transpose2d")
    st, dl = Tensor._tuple_arg(stride, nd, "stride"), Tensor._tuple_arg(dilation, nd, "dilation")
    pd = Tensor._tuple_arg(padding, nd, "padding", low=0)
    op = Tensor._tuple_arg(output_padding, nd, "output_padding", low=0)
    x = self
    # spread the input: s-1 zeros between neighbours
    for j, s in enumerate(st):
      if s == 1: continue
      ax = 2 + j
      i = int_size(x.shape[ax], "conv_transpose2d")
      x = x.unsqueeze(ax + 1).pad(tuple((0, s - 1) if a == ax + 1 else (0, 0) for a in range(x.ndim + 1)))
      x = x.reshape(*x.shape[:ax], i * s, *x.shape[ax + 2:])._slice_dim(ax, 0, (i - 1) * s + 1)
    pads = [(d * (k - 1) - p, d * (k - 1) - p + o) for k, d, p, o in zip(kernel, dl, pd, op)]
    x = x.pad(((0, 0), (0, 0), *pads))
    # (Cin, Cout/G, *k) -> (Cout, Cin/G, *k), flipped in space
    w = weight.reshape(groups, cin // groups, cout_g, *kernel).transpose(1, 2)
    w = w.reshape(groups * cout_g, cin // groups, *kernel)
    w = w.flip(list(range(2, 2 + nd)))
    return x.conv2d(w, bias, groups=groups, dilation=dl)
  def _pool_geometry(self, kernel_size: PyInt | Sequence[PyInt], stride: PyInt | Sequence[PyInt] | None,
                     padding: PyInt | Sequence[PyInt], dilation: PyInt | Sequence[PyInt],
                     ceil_mode: PyBool) -> tuple[tuple[PyInt, ...], ...]:
    """(kernel, stride, dilation, pad_before, pad_after) for the last len(kernel) dims; pad_after includes the extra
    room ceil_mode needs (torch: the last window must start inside the input or its left padding)."""
    nd = 2 if isinstance(kernel_size, int) else len(kernel_size)
    k = Tensor._tuple_arg(kernel_size, nd, "kernel_size")
    no_stride = stride is None or (not isinstance(stride, int) and len(stride) == 0)
    s = k if no_stride or stride is None else Tensor._tuple_arg(stride, nd, "stride")
    d = Tensor._tuple_arg(dilation, nd, "dilation")
    p = Tensor._tuple_arg(padding, nd, "padding", low=0)
    after = []
    for kk, ss, dd, pp, i in zip(k, s, d, p, int_shape(self.shape[-nd:], "pooling")):
      if pp * 2 > kk: raise ShapeError(f"pool padding {pp} must be at most half the kernel size {kk}")
      span = i + 2 * pp - dd * (kk - 1) - 1
      o = (-(-span // ss) if ceil_mode else span // ss) + 1
      if ceil_mode and (o - 1) * ss >= i + pp: o -= 1
      after.append(pp + max(0, (o - 1) * ss + dd * (kk - 1) + 1 - (i + 2 * pp)))
    return k, s, d, p, tuple(after)
  def max_pool2d(self, kernel_size: PyInt | Sequence[PyInt] = (2, 2), stride: PyInt | Sequence[PyInt] | None = None,
                 dilation: PyInt | Sequence[PyInt] = 1, padding: PyInt | Sequence[PyInt] = 0, ceil_mode: PyBool = False,
                 return_indices: PyBool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Max over windows of the last len(kernel_size) dims (stride defaults to the kernel). With `return_indices`, also
    the int32 flat index (over the unpadded spatial dims) of each max, the first on ties, like torch.

    >>> Tensor([[[[1.0, 2.0], [3.0, 4.0]]]]).max_pool2d().tolist()
    [[[[4.0]]]]
    """
    k, s, d, p, after = self._pool_geometry(kernel_size, stride, padding, dilation, ceil_mode)
    nd = len(k)
    pads = ((0, 0),) * (self.ndim - nd) + tuple(zip(p, after))
    low = -math.inf if dtypes.is_float(self.dtype) else dtypes.min(strong_dtype(self.dtype))
    win = self.pad(pads, value=low)._pool(k, s, d)
    flat_k = win.reshape(*win.shape[:win.ndim - nd], int(prod(k)))
    out = flat_k.max(-1)
    if not return_indices: return out
    spatial = self.shape[-nd:]
    ids = Tensor.arange(int(prod(spatial)), device=self.device, dtype=dtypes.int32).reshape(spatial)
    out_sp = win.shape[self.ndim - nd:win.ndim - nd]
    id_win = ids.pad(tuple(zip(p, after)), value=-1)._pool(k, s, d).reshape(*out_sp, int(prod(k)))
    first = flat_k.detach()._arg_first(flat_k.detach() == out.detach().unsqueeze(-1), -1, False)
    pick = first.unsqueeze(-1) == Tensor.arange(int(prod(k)), device=self.device, dtype=dtypes.int32)
    return out, pick.where(id_win, 0).sum(-1, dtype=dtypes.int32)
  def max_unpool2d(self, indices: Tensor, kernel_size: PyInt | Sequence[PyInt] = (2, 2),
                   stride: PyInt | Sequence[PyInt] | None = None, dilation: PyInt | Sequence[PyInt] = 1,
                   padding: PyInt | Sequence[PyInt] = 0, output_size: Sequence[PyInt] | None = None) -> Tensor:
    """The inverse of max_pool2d(return_indices=True): each value goes to its flat index, zeros elsewhere.

    >>> v, i = Tensor([[[[1.0, 2.0], [3.0, 4.0]]]]).max_pool2d(return_indices=True)
    >>> v.max_unpool2d(i).tolist()
    [[[[0.0, 0.0], [0.0, 4.0]]]]
    """
    if indices.shape != self.shape:
      raise ShapeError(f"max_unpool2d: indices {indices.shape} must match values {self.shape}")
    nd = 2 if isinstance(kernel_size, int) else len(kernel_size)
    k = Tensor._tuple_arg(kernel_size, nd, "kernel_size")
    s = k if stride is None else Tensor._tuple_arg(stride, nd, "stride")
    d, p = Tensor._tuple_arg(dilation, nd, "dilation"), Tensor._tuple_arg(padding, nd, "padding", low=0)
    geo = zip(int_shape(self.shape[-nd:], "max_unpool2d"), s, p, d, k)
    default = tuple((i - 1) * ss - 2 * pp + dd * (kk - 1) + 1 for i, ss, pp, dd, kk in geo)
    spatial = default if output_size is None else tuple(int(v) for v in output_size[-nd:])
    # torch's rule: an explicit size lies strictly within a stride of the default one (the size max_pool2d's input had)
    if output_size is not None and (len(output_size) not in (nd, nd + 2) or
                                    any(not o - ss < v < o + ss for v, o, ss in zip(spatial, default, s))):
      raise ShapeError(f"max_unpool2d output_size {tuple(output_size)} must give {nd} spatial sizes, each strictly "
                       f"within a stride {s} of the default {default}")
    lead = self.shape[:-nd]
    from ember.engine.jit import capturing
    # an index outside the output would be dropped silently: check it, as torch does (not while TinyJit captures)
    if not capturing() and indices.numel() and ((indices < 0) | (indices >= prod(spatial))).any().item():
      raise ShapeError(f"max_unpool2d indices must lie in [0, {prod(spatial)}) for output size {spatial}; pass the "
                       "output_size max_pool2d's input had")
    flat = Tensor.zeros(*lead, int(prod(spatial)), dtype=strong_dtype(self.dtype), device=self.device)
    idx, values = indices.flatten(len(lead)), self.flatten(len(lead))
    placed = flat.scatter(len(lead), idx, values.detach())
    if dtypes.is_float(values.dtype):
      # torch's gradient: every value gets the output gradient at its index, also where overlapping windows put several
      # (equal) values on one index and the scatter keeps one: the gradient of a sum-scatter, added as zero
      summed = flat.scatter_reduce(len(lead), idx, values, "sum", include_self=False)
      placed = placed + summed.isfinite().where(summed - summed.detach(), 0)
    return placed.reshape(*lead, *spatial)
  def avg_pool2d(self, kernel_size: PyInt | Sequence[PyInt] = (2, 2), stride: PyInt | Sequence[PyInt] | None = None,
                 padding: PyInt | Sequence[PyInt] = 0, ceil_mode: PyBool = False, count_include_pad: PyBool = True,
                 divisor_override: PyInt | None = None, dilation: PyInt | Sequence[PyInt] = 1) -> Tensor:
    """Mean over windows of the last len(kernel_size) dims. The divisor counts padding when `count_include_pad`, but
    never the extra room ceil_mode adds (torch's rule); `divisor_override` divides every window sum by that instead.

    >>> Tensor([[[[1.0, 2.0], [3.0, 4.0]]]]).avg_pool2d().tolist()
    [[[[2.5]]]]
    """
    if divisor_override is not None and divisor_override == 0:
      raise ShapeError("avg_pool2d divisor_override must not be zero; pass None to divide by the window count")
    k, s, d, p, after = self._pool_geometry(kernel_size, stride, padding, dilation, ceil_mode)
    nd = len(k)
    x = self._float()
    win = x.pad(((0, 0),) * (self.ndim - nd) + tuple(zip(p, after)))._pool(k, s, d)
    total = win.sum(list(range(win.ndim - nd, win.ndim)))
    if divisor_override is not None: return total / divisor_override
    spatial = int_shape(self.shape[-nd:], "avg_pool2d")
    ones = Tensor.ones(*spatial, dtype=x.dtype, device=self.device)
    if count_include_pad:
      ones = ones.pad(tuple(zip(p, p)), value=1.0).pad(tuple((0, a - pp) for pp, a in zip(p, after)))
    else: ones = ones.pad(tuple(zip(p, after)))
    count = ones._pool(k, s, d).sum(list(range(nd, 2 * nd)))
    return total / count
  def interpolate(self, size: PyInt | Sequence[PyInt] | None = None, mode: str = "linear",
                  align_corners: PyBool = False, scale_factor: PyFloat | Sequence[PyFloat] | None = None) -> Tensor:
    """Resize the trailing spatial dims (all but N, C) to `size` (or by `scale_factor`), like F.interpolate:
    mode linear/bilinear/trilinear (separable linear, `align_corners`), nearest or nearest-exact.

    >>> Tensor([[[1.0, 3.0]]]).interpolate(size=3, align_corners=True).tolist()
    [[[1.0, 2.0, 3.0]]]
    """
    nd = self.ndim - 2
    if nd < 1: raise ShapeError(f"interpolate needs (N, C, *spatial) input, got shape {self.shape}")
    if mode not in ("linear", "bilinear", "trilinear", "nearest", "nearest-exact"):
      raise ValueError(f"interpolate mode must be linear, bilinear, trilinear, nearest or nearest-exact, got {mode!r}")
    ins = list(int_shape(self.shape[2:], "interpolate"))
    if size is not None:
      outs = [int(size)] * nd if isinstance(size, int) else [int(v) for v in size]
      scales = [i / o for i, o in zip(ins, outs)]
    elif scale_factor is not None:
      sf = [float(scale_factor)] * nd if isinstance(scale_factor, (int, float)) else [float(v) for v in scale_factor]
      outs = [int(math.floor(i * f)) for i, f in zip(ins, sf)]
      scales = [1 / f for f in sf]
    else: raise ValueError("interpolate needs size or scale_factor")
    if len(outs) != nd: raise ShapeError(f"interpolate size {outs} needs {nd} entries for input shape {self.shape}")
    x = self if mode.startswith("nearest") else self._float()
    for j, (i, o, sc) in enumerate(zip(ins, outs, scales)):
      ax = 2 + j
      if mode == "nearest": src = [min(int(math.floor(t * sc)), i - 1) for t in range(o)]
      elif mode == "nearest-exact": src = [min(int(math.floor((t + 0.5) * sc)), i - 1) for t in range(o)]
      if mode.startswith("nearest"):
        x = x[(slice(None),) * ax + (src,)]
        continue
      if align_corners: pos = [t * (i - 1) / (o - 1) if o > 1 else 0.0 for t in range(o)]
      else: pos = [max((t + 0.5) * sc - 0.5, 0.0) for t in range(o)]
      lo = [min(int(math.floor(v)), i - 1) for v in pos]
      hi = [min(v + 1, i - 1) for v in lo]
      frac = Tensor([v - f for v, f in zip(pos, lo)], dtype=x.dtype, device=self.device)
      frac = frac.reshape(o, *([1] * (nd - 1 - j)))
      x = x[(slice(None),) * ax + (lo,)] * (1 - frac) + x[(slice(None),) * ax + (hi,)] * frac
    if x.dtype is self.dtype: return x
    # int input (torch: uint8) keeps its dtype: the interpolated values rounded half up, within the dtype's range
    return (x + 0.5).floor().clip(dtypes.min(self.dtype), dtypes.max(self.dtype)).cast(self.dtype)
  def dropout(self, p: PyFloat = 0.5) -> Tensor:
    """Zero each element with probability `p` and scale the rest by 1/(1-p), only while `Tensor.training`.

    >>> Tensor.ones(3).dropout(0.5).tolist()  # not training: unchanged
    [1.0, 1.0, 1.0]
    """
    if not 0 <= p <= 1: raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not Tensor.training or p == 0: return self
    if p == 1: return self * 0
    keep = Tensor.rand(*self.shape, device=self.device) >= p
    return keep.where(self, 0) * (1 / (1 - p))
  def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                   dropout_p: PyFloat = 0.0, is_causal: PyBool = False, scale: PyFloat | None = None,
                                   enable_gqa: PyBool = False) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v with q = self (..., L, E). A bool `attn_mask` keeps where True, a float one
    is added; `is_causal` masks the future; `enable_gqa` repeats key/value heads to match the query's.

    >>> q = Tensor.ones(1, 2, 4)
    >>> q.scaled_dot_product_attention(q, q).shape
    (1, 2, 4)
    """
    if self.shape[-1] != key.shape[-1]:
      raise ShapeError(f"sdpa: query {self.shape} and key {key.shape} feature dims differ")
    if is_causal and attn_mask is not None:
      raise ShapeError("sdpa: pass attn_mask or is_causal=True, not both; fold the causal mask into attn_mask")
    if enable_gqa and self.ndim >= 3 and key.shape[-3] != self.shape[-3]:
      rep = int_size(self.shape[-3], "sdpa's enable_gqa") // int_size(key.shape[-3], "sdpa's enable_gqa")
      key, value = key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3)
    sc = scale if scale is not None else 1 / math.sqrt(int_size(self.shape[-1], "sdpa's default scale"))
    scores = (self @ key.transpose(-2, -1)) * sc
    if is_causal:
      L, S = int_size(self.shape[-2], "sdpa's is_causal"), int_size(key.shape[-2], "sdpa's is_causal")
      scores = Tensor.ones(L, S, dtype=dtypes.bool, device=self.device).tril().where(scores, -math.inf)
    if attn_mask is not None:
      scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype is dtypes.bool else scores + attn_mask
    return scores.softmax(-1).dropout(dropout_p) @ value

  # ** losses **
  def _reduce_loss(self, reduction: str) -> Tensor:
    if reduction == "none": return self
    if reduction == "sum": return self.sum()
    if reduction == "mean": return self.mean()
    raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
  def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
    """-(y log p + (1 - y) log(1 - p)) for probabilities p = self, logs clamped at -100 like torch.

    >>> round(Tensor([0.5]).binary_crossentropy(Tensor([1.0])).item(), 5)
    0.69315
    """
    if Y.shape != self.shape: raise ShapeError(f"binary_crossentropy: input {self.shape} and target {Y.shape} differ")
    p = self._float()
    return (-(Y * p.log().maximum(-100) + (1 - Y) * (1 - p).log().maximum(-100)))._reduce_loss(reduction)
  def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    """Binary cross-entropy on logits (sigmoid folded in, numerically stable); `pos_weight` scales the positive term.

    >>> round(Tensor([0.0]).binary_crossentropy_logits(Tensor([1.0])).item(), 5)
    0.69315
    """
    if Y.shape != self.shape:
      raise ShapeError(f"binary_crossentropy_logits: input {self.shape} and target {Y.shape} differ")
    x = self._float()
    log_sig_neg = (-x).softplus()  # -log(sigmoid(x))
    if pos_weight is None: loss = (1 - Y) * x + log_sig_neg
    else: loss = (1 - Y) * x + (1 + (pos_weight - 1) * Y) * log_sig_neg
    return loss._reduce_loss(reduction)
  def nll_loss(self, Y: Tensor, weight: Tensor | None = None, ignore_index: PyInt = -100, reduction: str = "mean",
               label_smoothing: PyFloat = 0.0) -> Tensor:
    """Negative log likelihood of log-probabilities (N, C, ...) (or (C,)) at class indices Y, class dim 1. `weight`
    weighs classes, `ignore_index` targets count nowhere, mean divides by the summed weight of the counted targets.

    >>> Tensor([[-1.0, -2.0]]).nll_loss(Tensor([1])).item()
    2.0
    """
    if not dtypes.is_int(Y.dtype): raise DTypeError(f"nll_loss target must hold int class indices, got {Y.dtype!r}")
    logp = self.unsqueeze(0) if self.ndim == 1 else self
    tgt = Y.unsqueeze(0) if self.ndim == 1 else Y
    if tgt.shape != logp.shape[:1] + logp.shape[2:]:
      raise ShapeError(f"nll_loss: input {self.shape} needs target shape {logp.shape[:1] + logp.shape[2:]}, got "
                       f"{Y.shape}")
    c = int_size(logp.shape[1], "nll_loss")
    classes = Tensor.arange(c, device=self.device, dtype=tgt.dtype).reshape(1, c, *([1] * (logp.ndim - 2)))
    onehot = tgt.unsqueeze(1) == classes  # (N, C, ...)
    keep = (tgt != ignore_index).cast(logp.dtype)  # (N, ...)
    w = weight.cast(logp.dtype).reshape(1, c, *([1] * (logp.ndim - 2))) if weight is not None else None
    picked = onehot.where(logp if w is None else logp * w, 0).sum(1)
    loss = -picked * keep
    w_t = onehot.where(w, 0).sum(1) * keep if w is not None else keep
    if label_smoothing:
      smooth = -(logp if w is None else logp * w).sum(1) * keep
      loss = loss * (1 - label_smoothing) + smooth * (label_smoothing / c)
    if reduction == "mean": return loss.sum() / w_t.sum()
    if reduction == "none" and self.ndim == 1: return loss.reshape(())
    return loss._reduce_loss(reduction)
  def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: PyFloat = 0.0,
                    weight: Tensor | None = None, ignore_index: PyInt = -100) -> Tensor:
    """Cross-entropy of logits (N, C, ...) (class dim 1) against class indices or class probabilities (same shape as
    the logits), with torch's `label_smoothing`, `weight` and `ignore_index` semantics.

    >>> round(Tensor([[0.0, 0.0]]).cross_entropy(Tensor([1])).item(), 5)
    0.69315
    """
    logp = self.log_softmax(1 if self.ndim > 1 else 0)
    if dtypes.is_int(Y.dtype): return logp.nll_loss(Y, weight, ignore_index, reduction, label_smoothing)
    if Y.shape != self.shape:
      raise ShapeError(f"cross_entropy: probability targets {Y.shape} must match logits {self.shape}")
    cdim = 1 if self.ndim > 1 else 0
    c = int_size(self.shape[cdim], "cross_entropy")
    y = Y * (1 - label_smoothing) + label_smoothing / c
    if weight is not None: logp = logp * weight.reshape(c, *([1] * (self.ndim - cdim - 1)))
    loss = -(y * logp).sum(cdim)
    return loss.sum() / (int(prod(loss.shape)) or 1) if reduction == "mean" else loss._reduce_loss(reduction)
  def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: PyInt = -1, label_smoothing: PyFloat = 0.0,
                                      reduction: str = "mean") -> Tensor:
    """Cross-entropy of logits (..., C) (class dim last) against int class indices Y (...); targets equal to
    `ignore_index` are skipped and the mean is over the others.

    >>> round(Tensor([[0.0, 0.0]]).sparse_categorical_crossentropy(Tensor([0])).item(), 5)
    0.69315
    """
    x = self.reshape(-1, self.shape[-1]) if self.ndim != 2 else self
    loss = x.cross_entropy(Y.flatten(), reduction, label_smoothing, ignore_index=ignore_index)
    return loss.reshape(Y.shape) if reduction == "none" else loss

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
  def __rlshift__(self, x: Any) -> Tensor: return _shift(Ops.SHL, self._const_like(x), self)
  def __rrshift__(self, x: Any) -> Tensor: return _shift(Ops.SHR, self._const_like(x), self)
  def __invert__(self) -> Tensor:
    if self.dtype is dtypes.bool: return self.logical_not()
    if not dtypes.is_int(self.dtype): raise DTypeError(f"~ needs an int or bool tensor, got {self.dtype!r}")
    return self ^ -1 if not dtypes.is_unsigned(self.dtype) else self ^ dtypes.max(self.dtype)
  def __pow__(self, x: Any) -> Tensor: return self.pow(x)
  def __rpow__(self, x: Any) -> Tensor: return self.pow(x, True)
  def pow(self, x: Any, reverse: PyBool = False) -> Tensor:
    base, exponent = self._broadcasted(x, reverse)
    if (not reverse and isinstance(x, (int, float)) and not isinstance(x, bool) and float(x).is_integer()
        and abs(x) <= 64 and (x >= 0 or not dtypes.is_int(base.dtype))):
      # integral exponents by square-and-multiply: exact, and the gradient is n*x**(n-1) everywhere (also at x <= 0)
      n = int(abs(x))
      ret, sq = None, base
      while n:
        if n & 1: ret = sq if ret is None else ret * sq
        n >>= 1
        if n: sq = sq * sq
      # x ** 0 is 1 but keeps x in the graph (its gradient is 0, not "not part of the graph")
      if ret is None: ret = base.isnan().where(1, 1).cast(base.dtype)
      return ret.reciprocal() if x < 0 else ret
    ft = least_upper_float(base.dtype)
    b, e = base.cast(ft), exponent.cast(ft)
    mag = (e * b.abs().log2()).exp2()
    # negative base: defined for integral exponents, sign from the exponent's parity
    e_int = e.trunc() == e
    odd = (e.abs() - 2 * (e.abs() * 0.5).trunc()) == 1
    # a non-integral power of a negative base: log2 of the negative base makes the NaN at run time (a NaN constant
    # here would give the graph a NaN value range, which comparisons downstream cannot reason about)
    # (detached: NaN must not reach the backward pass through the unselected branch)
    neg_res = e_int.where(odd.where(-mag, mag), (e * b.log2()).exp2().detach())
    ret = (b < 0).where(neg_res, mag)
    ret = ((b == 0) & (e == 0)).where(1.0, ret)
    if dtypes.is_int(base.dtype): return ret.cast(base.dtype)
    return ret

  # ** autograd **
  def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
    """d(self)/d(target) for each target. `self` must be a scalar unless `gradient` is given."""
    from ember.gradient import compute_gradient
    if self.sharding is not None: return self.sharding.gradient(self, targets, gradient)
    if gradient is None:
      if self.numel() != 1:
        raise GradientError(f"gradient of a tensor of shape {self.shape} needs an explicit gradient argument")
      seed_dtype = self.dtype if dtypes.is_float(self.dtype) else dtypes.default_float
      gradient = Tensor(1.0, device=self.device, dtype=seed_dtype).expand(self.shape)
    grads = compute_gradient(self.uop, gradient.uop, {t.uop for t in targets})
    out = []
    graph: set[UOp] | None = None
    for t in targets:
      g = grads.get(t.uop)
      if g is None:
        graph = set(self.uop.toposort()) if graph is None else graph
        if t.uop not in graph:
          raise GradientError(f"tensor {t.shape} {t.dtype!r} is not part of the graph of this output")
        # reached only through comparisons or other piecewise-constant ops: the gradient is zero
        zero_dt = t.dtype if dtypes.is_float(t.dtype) else dtypes.default_float
        g = Tensor.zeros(*t.shape, dtype=zero_dt, device=t.device).uop
      out.append(Tensor(g).cast(t.dtype) if dtypes.is_float(t.dtype) else Tensor(g))
    return out
  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Fill `.grad` of every tensor with requires_grad in this graph (accumulating into existing grads)."""
    if self.sharding is not None: return self.sharding.backward(self, gradient)
    graph = self.uop.toposort()
    targets = [t for t in list(all_tensors) if t.requires_grad and t.uop in graph]
    if not targets: raise GradientError("backward(): no tensor in this graph has requires_grad=True")
    grads = self.gradient(*targets, gradient=gradient)
    for t, g in zip(targets, grads):
      if g.shape != t.shape: raise GradientError(f"internal gradient shape mismatch {g.shape} vs {t.shape}")
      t.grad = g if t.grad is None else (t.grad + g)
    return self

def _multi_create(make: Any, devices: tuple[str, ...], *args: Any, **kwargs: Any) -> Tensor:
  """A creation function given a tuple of devices: the same tensor made on each (replicated, see `ember.multi`)."""
  from ember.multi import on_devices
  return on_devices(make, devices, *args, **kwargs)

def _sym_eq(a: sint, b: sint) -> bool:
  """Equality of possibly symbolic sizes: structurally after simplification, else at the variables' bound values."""
  if isinstance(a, int) and isinstance(b, int): return a == b
  ua = a.simplify() if isinstance(a, UOp) else a
  ub = b.simplify() if isinstance(b, UOp) else b
  if ua is ub: return True
  from ember.uop.symbolic import sym_infer
  bound = {n.src[0].arg[0]: n.src[1].arg
           for x in (ua, ub) if isinstance(x, UOp) for n in x.toposort() if n.op is Ops.BIND}
  try: return sym_infer(ua, bound) == sym_infer(ub, bound)
  except KeyError: return False  # an unbound variable: only structural equality counts

def _leaf_storage(u: UOp, device: str) -> UOp:
  """A tensor that requires grad is a leaf of its own. Constants are shared: two `Tensor(2.0)` or `Tensor.zeros(3)` are
  one UOp, so their gradients (keyed by UOp) would add up. A constant-valued leaf gets a buffer holding its value."""
  if not all(n.op in (Ops.CONST, Ops.DEVICE, Ops.RESHAPE, Ops.EXPAND) for n in u.toposort()): return u
  shape = tuple(s for s in u.shape if isinstance(s, int))
  if len(shape) != len(u.shape): return u  # symbolic
  const = next(n for n in u.toposort() if n.op is Ops.CONST)
  dt = strong_dtype(_value_dtype(u))
  # bfloat16/fp8: numpy holds float32 and the device rounds (as Tensor(list) does); a 0-d array comes back 1-d
  buf = _from_numpy(np.full(shape, const.arg, dtype=_np_dtype(dt)), device, dt if dt.fmt is not None else None)
  return _reshape(buf if dt.fmt is not None else _cast_uop(buf, dt), u.shape)

def _tensor_seq(first: Any, others: tuple[Any, ...], op: str) -> tuple[Tensor, ...]:
  """The tensors of cat/stack called as `Tensor.cat(a, b)`, `Tensor.cat([a, b])`, `a.cat(b, c)` or `a.cat([b, c])`."""
  items = list(first) if isinstance(first, (list, tuple)) else [first]
  for o in others: items.extend(o if isinstance(o, (list, tuple)) else [o])
  if not items: raise ShapeError(f"{op} needs a non-empty sequence of tensors")
  if (bad := next((t for t in items if not isinstance(t, Tensor)), None)) is not None:
    raise DTypeError(f"{op} takes tensors, got {type(bad).__name__}")
  return tuple(items)

def _widest_float(device: str | tuple[str, ...]) -> DType:
  """float64 where every device renders it, else float32 (Metal has no doubles): the precision of exact remainders."""
  from ember.device import Device
  devices = device if isinstance(device, tuple) else (device,)
  no_doubles = any(dtypes.float64 in getattr(Device[d].renderer, "unsupported_dtypes", ()) for d in devices)
  return dtypes.float32 if no_doubles else dtypes.float64

def _exact_floordiv(a: Tensor, b: Tensor) -> Tensor:
  """floor(a / b) of the exact quotient, as torch and Python compute it for floats: floor(fl(a / b)) is one too big
  where the rounded quotient reaches an integer the exact one falls short of (fl(1 / 0.1) is 10.0); the remainder
  a - q * b, exact in float64 for float32 operands, has the wrong sign there. b == 0 gives a / b (inf or NaN)."""
  q = (a / b).floor()
  wide = _widest_float(a.device)
  r = a.cast(wide) - q.cast(wide) * b.cast(wide)
  return ((r != 0) & ((r < 0) != (b < 0)) & (b != 0)).where(q - 1, q)

def _binop(op: Ops, x: Tensor, y: Any, reverse: bool = False) -> Tensor:
  if op in GroupOp.Bitwise:
    operands = (x.dtype, y.dtype if isinstance(y, Tensor) else dtypes.from_py(y))
    if any(dtypes.is_float(d) for d in operands):  # checked before promotion, so the message names the real operands
      raise DTypeError(f"{op.name.lower()} needs int or bool operands, got {operands[0]!r} and {operands[1]!r}")
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
  out: list[sint] = []
  for s in shape:
    if isinstance(s, (int, np.integer)): out.append(int(s))
    elif isinstance(s, UOp): out.append(s)
    else: raise ShapeError(f"shape entries must be ints, got {type(s).__name__} in {shape}")
  return tuple(out)

def _new_shape(shape: tuple[sint, ...], op: str) -> tuple[sint, ...]:
  """The shape of a tensor being created: every size >= 0 (torch raises for negative ones; -1 is no wildcard here)."""
  if any(isinstance(s, int) and s < 0 for s in shape):
    raise ShapeError(f"{op}: cannot create a tensor of negative size {shape}; sizes must be >= 0")
  return shape

def _norm_padding(padding: Sequence[Any], ndim: int) -> list[tuple[int, int]]:
  if all(isinstance(p, (tuple, list)) or p is None for p in padding):
    if len(padding) != ndim: raise ShapeError(f"padding {padding} needs one (before, after) pair per dim ({ndim})")
    return [(0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding]
  if len(padding) % 2 or len(padding) // 2 > ndim:
    raise ShapeError(f"flat padding {padding} must have an even length <= 2*ndim")
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
  if arr.size: buf.copyin(arr.data.cast("B"))
  attach_buffer(uop, buf)
  return _reshape(uop, tuple(arr.shape)) if arr.shape != (arr.size,) else uop

def _np_dtype(dt: DType) -> Any: return np.dtype(dt.fmt) if dt.fmt is not None else np.float32
def _value_dtype(u: UOp) -> DType:
  """The dtype of a tensor-level node: a value's (pointer dtypes appear only inside kernels)."""
  assert isinstance(u.dtype, DType), f"a tensor graph node has the pointer dtype {u.dtype}"
  return u.dtype

def _mv_fmt(dt: DType) -> str: return dt.fmt if dt.fmt is not None else {1: "B", 2: "H"}[dt.itemsize]

def _is_contiguous_buffer(u: UOp) -> bool:
  """A BUFFER, possibly reshaped: the tensor's elements are the buffer's, in order."""
  while u.op is Ops.RESHAPE: u = u.src[0]
  return u.op is Ops.BUFFER

def _is_buffer_view(u: UOp) -> bool:
  return u.base.op is Ops.BUFFER and all(n.op in GroupOp.Movement or n.op is Ops.BUFFER for n in u.toposort())

def _check_host_read(what: str) -> None:
  from ember.engine.jit import check_host_read
  check_host_read(what)

def _is_done(u: UOp) -> bool:
  return (_is_contiguous_buffer(u) or u.op is Ops.CONST or (u.op in GroupOp.Movement and u.base.op is Ops.CONST)
          or (u.dtype.weak and u.base.op is Ops.CONST))

def _graph_tensors(ts: Sequence[Tensor]) -> list[Tensor]:
  """The tensors with a graph that hold `ts`: a sharded tensor's shards in its place."""
  return [s for t in ts for s in (t.sharding.shards if t.sharding is not None else (t,))]

def _apply_becomes(becomes: dict[UOp, UOp]) -> None:
  if not becomes: return
  for t in list(all_tensors):
    if t.uop in becomes: t.uop = becomes[t.uop]
    elif not _is_done(t.uop) and any(b in becomes for b in t.uop.toposort()): t.uop = t.uop.substitute(becomes)

def _realize_readers_of(bufs: frozenset[UOp], exclude: tuple[Tensor, ...]) -> None:
  """Before a buffer is overwritten, run the pending computations that still read its old value."""
  # identity, not `in`: Tensor.__eq__ is elementwise
  excluded = {id(t) for t in exclude}
  pending = [t for t in list(all_tensors) if id(t) not in excluded and not _is_done(t.uop) and t.uop.buffers & bufs]
  if pending: Tensor._realize_all(*pending)

def _rng_words(seed: int, device: str) -> Tensor:
  """The RNG state buffer's contents for `seed`: its low and high 32-bit words and no draws yet."""
  return Tensor(np.array([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, 0], np.uint32), device=device)

_rng_seed = [SEED.value]
_rng_states: dict[str, Tensor] = {}  # device -> its RNG state (seed low, seed high, draws), uint32, one per device

