"""The lazy Tensor front end: every op builds a UOp graph; nothing runs until `realize()`, `numpy()`, `item()`...

The primitives here (creation, elementwise with broadcasting and weak-dtype promotion, reductions, movement ops,
matmul, autograd) are what the rest of the API composes from.
"""
from __future__ import annotations
import os
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, TypeAlias
import numpy as np
from ember.dtype import DType, dtypes, least_upper_dtype, least_upper_float, strong_dtype, to_dtype
from ember.errors import (ArgumentError, DTypeError, GradientError, ShapeError, DeviceError,
                          ShardingError)
from ember.helpers import prod, SEED, TRAINING
from ember.tensor_ops.extra import ExtraMixin
from ember.tensor_ops.creation import CreationMixin
from ember.tensor_ops.movement import MovementMixin
from ember.tensor_ops.elementwise import ElementwiseMixin
from ember.tensor_ops.math import MathMixin
from ember.tensor_ops.activation import ActivationMixin
from ember.tensor_ops.reduce import ReduceMixin
from ember.tensor_ops.nn import NNMixin
from ember.tensor_ops.custom import CustomMixin
from ember.tensor_ops.torch_compat import TorchCompatMixin
from ember.uop.ops import Ops, UOp, BufferArg, GroupOp, int_shape, int_size, next_unique, sint
if TYPE_CHECKING:
  from ember.device.base import Buffer

# inside `class Tensor` the names int/float/bool are the cast methods; its signatures use these for the builtins
PyInt: TypeAlias = int
PyFloat: TypeAlias = float
PyBool: TypeAlias = bool

class _LiveTensors:
  """Weak references to tensors, iterated in the order the tensors were made. A WeakSet iterates in the order of the
  tensors' addresses, which changes from one process to the next: what is read from here (the pending readers an
  assign realizes, backward's leaves) became schedule targets in another order each run, and so did the kernels."""
  def __init__(self) -> None:
    refs: dict[weakref.ref[Tensor], None] = {}
    self._refs = refs
    self._gone: Callable[[weakref.ref[Tensor]], None] = lambda ref: refs.pop(ref, None)  # one callback for all
  def add(self, t: Tensor) -> None: self._refs[weakref.ref(t, self._gone)] = None
  def discard(self, t: Tensor) -> None:
    # by identity: comparing live references compares the tensors with ==, which is elementwise
    for ref in [r for r in self._refs if r() is t]: del self._refs[ref]
  def __iter__(self) -> Iterator[Tensor]: return (t for r in list(self._refs) if (t := r()) is not None)
  def __len__(self) -> int: return len(self._refs)

# every live tensor that has a graph (`uop`); a sharded tensor has none and is in `sharded_tensors` (by id: a WeakSet
# compares members with ==, which is elementwise on tensors), its shards, Tensors of their own, are here
all_tensors = _LiveTensors()
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

class Tensor(CreationMixin, MovementMixin, ElementwiseMixin, MathMixin, ActivationMixin, ReduceMixin, NNMixin,
             ExtraMixin, CustomMixin, TorchCompatMixin):
  """A lazy, multi-dimensional array with autograd.

  >>> Tensor([[1.0, 2.0], [3.0, 4.0]]).sum(axis=1).numpy()
  array([3., 7.], dtype=float32)
  """
  __slots__ = ("uop", "sharding", "_requires_grad", "grad", "__weakref__")
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
      uop = _const_uop(data, _int_scalar_dtype(data, dt) if type(data) is int else dtypes.from_py(data), dev)
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
      except OverflowError as e:  # ints the default int cannot hold: int64 or uint64 where none was asked for
        wider = next((w for w in (dtypes.int64, dtypes.uint64) if dt is None and dtypes.is_int(target)
                      and _fits(data, w)), None)
        if wider is None:
          raise ArgumentError(f"a value of the list does not fit {target!r} ({e}); pass dtype= a wider one, or "
                              "smaller values") from e
        target = wider
        arr = np.array(data, dtype=target.fmt)
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
    if requires_grad: _check_differentiable(_value_dtype(uop), "Tensor(..., requires_grad=True)")
    if requires_grad and isinstance(dev, str): uop = _leaf_storage(uop, dev)
    self.uop: UOp = uop
    # a sharded tensor's layout (an ember.multi.Sharding: its per-device shards and their axis); it then has no `uop`
    self.sharding: Any = None
    self.requires_grad: bool | None = requires_grad
    self.grad: Tensor | None = None
    all_tensors.add(self)

  @staticmethod
  def from_buffer(buf: Buffer, shape: Sequence[PyInt] | None = None, dtype: DType | str | None = None) -> Tensor:
    """A tensor over an existing device `Buffer`, without a copy: its elements are the buffer's, in order, so a write
    to either shows in the other. `shape` defaults to the buffer's `(size,)` and `dtype` to its dtype; another dtype
    reads the same bytes as that type (no conversion).

    >>> from ember import Buffer
    >>> buf = Buffer("PYTHON", 4, dtypes.int32).copyin(memoryview(np.arange(4, dtype=np.int32)))
    >>> Tensor.from_buffer(buf, (2, 2)).tolist()
    [[0, 1], [2, 3]]
    """
    from ember.device.base import Buffer
    if not isinstance(buf, Buffer):
      raise DTypeError(f"from_buffer takes an ember Buffer, got {type(buf).__name__}; to copy host data use Tensor(x)")
    dt = to_dtype(dtype) if dtype is not None else buf.dtype
    if dt.weak: raise DTypeError(f"from_buffer: a buffer cannot hold the weak dtype {dt!r}; use a concrete dtype")
    if dt is not buf.dtype:
      if buf.nbytes % dt.itemsize:
        raise ShapeError(f"from_buffer: a buffer of {buf.nbytes} bytes is not a whole number of {dt!r} elements "
                         f"({dt.itemsize} bytes each)")
      buf = buf.view(buf.nbytes // dt.itemsize, dt, 0)
    shp = _static_shape_arg(shape, "from_buffer") if shape is not None else (buf.size,)
    if prod(shp) != buf.size:
      raise ShapeError(f"from_buffer: shape {shp} does not fit a buffer of {buf.size} {dt!r} elements; give a shape "
                       f"of {buf.size} elements")
    from ember.schedule import attach_buffer
    uop = _buffer_uop(_canon_device(buf.device), buf.size, dt)
    attach_buffer(uop, buf)
    return Tensor(_reshape(uop, shp))

  @staticmethod
  def from_file(path: str | os.PathLike[str], offset: PyInt = 0, shape: Sequence[PyInt] | None = None,
                dtype: DType | str = dtypes.uint8, device: str | None = None) -> Tensor:
    """A lazy tensor over the bytes of the file at `path` from byte `offset`: the file is memory-mapped (the DISK
    device) and the range read only when the tensor is realized, as a copy onto `device` (the default device when
    None; `"DISK"` leaves the tensor on the file, where it can only be copied or read). `shape` defaults to every
    whole `dtype` element from `offset` to the end of the file. The weight loaders of `ember.nn` are built on it.

    >>> _ = np.arange(6, dtype=np.float32).tofile("/tmp/w.bin")
    >>> Tensor.from_file("/tmp/w.bin", offset=8, shape=(2, 2), dtype=dtypes.float32).tolist()
    [[2.0, 3.0], [4.0, 5.0]]
    """
    from ember.device.disk import file_buffer
    dt = to_dtype(dtype)
    if dt.weak: raise DTypeError(f"from_file: a file cannot hold the weak dtype {dt!r}; use a concrete dtype")
    if not isinstance(offset, (int, np.integer)) or isinstance(offset, PyBool) or offset < 0:
      raise ShapeError(f"from_file: offset must be an int >= 0, got {offset!r}")
    offset, base = int(offset), file_buffer(os.fspath(path))
    if offset > base.nbytes:
      raise ShapeError(f"from_file: offset {offset} is past the end of {os.fspath(path)!r}, which has {base.nbytes} "
                       "bytes")
    shp = _static_shape_arg(shape, "from_file") if shape is not None else ((base.nbytes - offset) // dt.itemsize,)
    count = prod(shp)
    if (end := offset + count * dt.itemsize) > base.nbytes:
      raise ShapeError(f"from_file: {count} {dt!r} elements at byte {offset} need bytes {offset}..{end}, but "
                       f"{os.fspath(path)!r} has {base.nbytes}; give a range inside the file")
    t = Tensor.from_buffer(base.view(count, dt, offset), shp)
    return t if device is not None and _canon_device(device) == "DISK" else t.to(device)

  # ** properties **
  @property
  def shape(self) -> tuple[sint, ...]: return self.uop.shape if self.sharding is None else self.sharding.shape
  @property
  def dtype(self) -> DType: return _value_dtype(self.uop) if self.sharding is None else self.sharding.dtype
  @property
  def requires_grad(self) -> bool | None:
    """True: autograd tracks this tensor (backward() fills its `.grad`); False: it never does; None: not yet decided
    (an optimizer given it makes it True). Only floating-point tensors can be True."""
    return self._requires_grad
  @requires_grad.setter
  def requires_grad(self, value: bool | None) -> None:
    if value: _check_differentiable(self.dtype, "requires_grad = True")
    self._requires_grad = value
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
    return f"<Tensor {self.shape} {self.dtype!r} on {self.uop.device} realized={self.is_realized}>"
  def __getattr__(self, name: str) -> Any:
    # reached only when normal lookup fails, e.g. for the `uop` a sharded tensor does not have
    if name == "uop" and self.sharding is not None:
      raise ShardingError(f"a tensor sharded over {self.sharding.devices} has one graph per device, not one uop; "
                          "use .shards, or gather it with .to(device)")
    raise AttributeError(f"'Tensor' object has no attribute {name!r}")
  def __hash__(self) -> int: return id(self)
  def __iter__(self) -> Iterator[Tensor]:
    # without it Python iterates through __getitem__ until an IndexError: a 0-d tensor gave an empty list
    if not self.shape: raise TypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(len(self)))
  def __int__(self) -> int: return int(self._scalar("int(tensor)"))
  def __float__(self) -> float: return float(self._scalar("float(tensor)"))
  def __index__(self) -> int:
    if not (dtypes.is_int(self.dtype) or self.dtype is dtypes.bool):
      raise TypeError(f"only integer tensors of a single element can be used as an index, got {self.dtype!r}")
    return int(self._scalar("an index"))
  def _scalar(self, what: str) -> Any:
    if self.numel() != 1: raise ShapeError(f"{what} needs a tensor with one element, got shape {self.shape}")
    return self.item()
  def __bool__(self) -> bool:
    if self.numel() != 1:
      raise ValueError(f"the truth value of a tensor with {self.numel()} elements is ambiguous; "
                       "use .any() or .all()")
    _check_host_read("bool(tensor)")
    return bool(self.item())

  # ** realize and data out **
  def schedule(self, *others: Tensor) -> list:
    from ember.schedule import create_schedule
    todo = _graph_tensors((self, *others))
    readers = _old_value_readers_of(todo)[0] if _old_value_readers else []  # what realize() would run with them
    items, _ = create_schedule([t.uop for t in todo + readers])
    return items
  def realize(self, *others: Tensor) -> Tensor:
    """Run the kernels that compute this tensor (and `others`); returns self. A sharded tensor runs its shards'."""
    Tensor._realize_all(self, *others)
    return self
  @staticmethod
  def _realize_all(*tensors: Tensor) -> None:
    todo = [t for t in _graph_tensors(tensors) if not _is_done(t.uop)]
    if not todo: return  # (before the imports: a TinyJit replay's result is realized already, ~1 us of them a call)
    from ember.schedule import OverwriteOrderError, create_schedule
    from ember.engine.realize import run_schedule
    readers, assigns = _old_value_readers_of(todo) if _old_value_readers else ([], [])
    try: items, becomes = create_schedule([t.uop for t in todo + readers])
    except OverwriteOrderError:  # a kernel needs an assign's old and new value: the old value's readers go first,
      Tensor._realize_all(*readers)  # then the rest in dependency order (as before assigns were deferred)
      items, becomes = create_schedule([t.uop for t in todo if not _is_done(t.uop)], order_overwrites=False)
    for n in assigns: _old_value_readers.pop(n, None)
    run_schedule(items)
    _apply_becomes(becomes)
  @property
  def is_realized(self) -> PyBool:
    """True when the tensor's elements are those of one device buffer, in order: what `buffer()` returns without a
    copy. A lazy result, a view of part of a buffer, a pending `assign` or a constant (`Tensor.zeros(3)`, which
    `realize()` leaves a constant; `.contiguous().realize()` stores it) is not.

    >>> t = Tensor([1.0, 2.0]) + 1
    >>> t.is_realized, t.realize().is_realized
    (False, True)
    """
    return all(_is_contiguous_buffer(t.uop) for t in _graph_tensors((self,)))
  @staticmethod
  def pending_readers(*tensors: Tensor) -> list[Tensor]:
    """The live tensors, still to be computed, that read the buffers of `tensors`: what must be realized before those
    buffers are overwritten in place. `assign` keeps its target's, and realizing the assign realizes them in the same
    schedule, before it.

    >>> w = Tensor([1.0, 2.0]).realize()
    >>> loss = (w * 2).sum()
    >>> len(Tensor.pending_readers(w))
    1
    """
    return _pending_readers(frozenset().union(*(t.uop.buffers for t in _graph_tensors(tensors))))
  @staticmethod
  def is_training() -> PyBool:
    """Training mode: True while `Tensor.training` is set or inside `Context(TRAINING=1)`. Dropout and BatchNorm
    read it.

    >>> from ember import Context
    >>> with Context(TRAINING=1): print(Tensor.is_training())
    True
    """
    return PyBool(Tensor.training) or PyBool(TRAINING.value)
  def contiguous(self) -> Tensor:
    if self.sharding is not None: return self.sharding.contiguous(self)
    if self.dtype.weak: return self
    return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)), requires_grad=self.requires_grad)
  def contiguous_backward(self) -> Tensor:
    if self.sharding is not None: return self.sharding.contiguous_backward(self)
    return Tensor(UOp(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.uop,)))
  def buffer(self) -> Buffer:
    """The device `Buffer` holding this tensor's elements in order, realizing the tensor first. A tensor that is one
    whole buffer (made by `from_buffer` or `empty`, or realized from `.contiguous()`) returns that buffer itself, so
    writes to it change the tensor; any other (a view, a weak-dtyped scalar) is copied into a new buffer first.

    >>> Tensor([1, 2, 3]).buffer().numpy()
    array([1, 2, 3], dtype=int32)
    """
    from ember.schedule import buffer_of
    # a pending assign (or a custom kernel's output) realizes into its own buffer: read that, not a copy of it
    if self.uop.op in (Ops.ASSIGN, Ops.AFTER): self.realize()
    t = self.cast(strong_dtype(self.dtype)) if self.dtype.weak else self
    t = t if _is_contiguous_buffer(t.uop) else t.contiguous()
    t.realize()
    return buffer_of(t.uop)
  def data(self) -> memoryview:
    _check_host_read("data()")
    if self.sharding is not None: return self.sharding.data()
    buf = self.buffer()
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
    buf = self.buffer()
    return buf.numpy().view(_np_dtype(dt)).reshape(shape)
  def item(self) -> Any:
    if self.numel() != 1: raise ShapeError(f"item() needs a tensor with one element, got shape {self.shape}")
    _check_host_read("item()")
    return self.numpy().reshape(()).item()
  def tolist(self) -> Any:
    _check_host_read("tolist()")
    return self.numpy().tolist()
  def to(self, device: str | tuple[str, ...] | DType | None = None, dtype: DType | str | None = None) -> Tensor:
    """A copy on `device`, or replicated on every device of a tuple (a sharded tensor is gathered first); as torch's
    `.to`, a dtype (`x.to(dtypes.float16)`, or `x.to(device, dtype)`) casts too."""
    if isinstance(device, DType): device, dtype = None, device
    if dtype is not None: return (self if device is None else self.to(device)).cast(dtype)
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
    if requires_grad: _check_differentiable(self.dtype, "requires_grad_()")
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
    pending = _pending_readers(self.uop.buffers, exclude=(self, other))
    self.uop = UOp(Ops.ASSIGN, self.dtype, (self.uop, value.uop))
    # the tensors still to be computed that read the old value are realized with the assign, before it (or earlier)
    if pending: _old_value_readers[self.uop] = [weakref.ref(t) for t in pending]
    return self
  def replace(self, x: Tensor) -> Tensor:
    """This object holds `x`'s value from now on (its graph, or its shards), so references to it see `x`."""
    if x.shape != self.shape: raise ShapeError(f"replace shape mismatch: {self.shape} <- {x.shape}")
    if self.sharding is not None: return self.sharding.replace(self, x)
    if x.sharding is None:
      self.uop = x.uop
      return self
    # it becomes sharded: no graph of its own any more, so it moves from all_tensors to sharded_tensors
    all_tensors.discard(self)
    del self.uop
    self.sharding = x.sharding
    sharded_tensors[id(self)] = self
    return self










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
  a - q * b, exact in float64 for float32 operands, has the wrong sign there. b == 0 gives a / b (inf or NaN). As
  torch's (and Python's divmod): an infinite a gives NaN (its remainder is NaN), and a finite a over an infinite b gives
  -1 where their signs differ and a != 0, else a zero with the quotient's sign."""
  q = (a / b).floor()
  wide = _widest_float(a.device)
  r = a.cast(wide) - q.cast(wide) * b.cast(wide)
  q = ((r != 0) & ((r < 0) != (b < 0)) & (b != 0)).where(q - 1, q)
  over_inf = ((a != 0) & ((a < 0) != (b < 0))).where(-1.0, a / b)  # a / b: a signed zero
  q = (b.isinf() & a.isfinite()).where(over_inf, q)
  return (a.isinf() & (b != 0)).where(float("nan"), q)

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

def _fits(data: Any, dt: DType) -> bool:
  """Every int of a nested list within `dt`'s range."""
  if isinstance(data, (list, tuple)): return all(_fits(x, dt) for x in data)
  return not isinstance(data, int) or dtypes.min(dt) <= data <= dtypes.max(dt)

def _int_scalar_dtype(v: int, dt: DType | None) -> DType:
  """A Python int's dtype: weak where the default int holds it, else int64 or uint64 (numpy's choice); a value the
  asked-for integer dtype, or no integer dtype, can hold is an ArgumentError rather than a wrapped number."""
  if dt is not None and dtypes.is_int(dt) and not dtypes.min(dt) <= v <= dtypes.max(dt):
    raise ArgumentError(f"{v} does not fit {dt!r} (range {dtypes.min(dt)}..{dtypes.max(dt)}); pass a wider dtype")
  if dt is not None and dtypes.is_float(dt): return dtypes.weakfloat  # (2**70 as a float32 is fine)
  if dt is not None or dtypes.min(dtypes.default_int) <= v <= dtypes.max(dtypes.default_int): return dtypes.weakint
  if wide := next((w for w in (dtypes.int64, dtypes.uint64) if dtypes.min(w) <= v <= dtypes.max(w)), None): return wide
  raise ArgumentError(f"{v} does not fit any integer dtype (int64 or uint64); pass it as a float")

def _shape_arg(shape: tuple[Any, ...]) -> tuple[sint, ...]:
  if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
  out: list[sint] = []
  for s in shape:
    if isinstance(s, (int, np.integer)): out.append(int(s))
    elif isinstance(s, UOp): out.append(s)
    else: raise ShapeError(f"shape entries must be ints, got {type(s).__name__} in {shape}")
  return tuple(out)

def _static_shape_arg(shape: Any, op: str) -> tuple[int, ...]:
  """A shape given as ints (an int, or a sequence of them), each >= 0: the shape of a tensor over existing memory."""
  shp = _new_shape(_shape_arg(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)), op)
  ints = tuple(d for d in shp if isinstance(d, int))
  if len(ints) != len(shp): raise ShapeError(f"{op}: the shape {shp} must be ints, not symbolic")
  return ints

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
def _check_differentiable(dt: DType, what: str) -> None:
  # a gradient is a float: an int or bool tensor tracked by autograd got a gradient rounded to its dtype, or none
  # through its cast (silently 0), so it cannot require one, as in PyTorch
  if not dtypes.is_float(dt):
    raise GradientError(f"{what}: only floating-point tensors can require gradients, this one is {dt!r}; cast it "
                        "first (.float()), or leave requires_grad False for integer/bool data such as indices")

def _value_dtype(u: UOp) -> DType:
  """The dtype of a tensor-level node: a value's (pointer dtypes appear only inside kernels)."""
  assert isinstance(u.dtype, DType), f"a tensor graph node has the pointer dtype {u.dtype}"
  return u.dtype

def _mv_fmt(dt: DType) -> str: return dt.fmt if dt.fmt is not None else {1: "B", 2: "H"}[dt.itemsize]

# read once: an Enum member read through its class costs ~0.13 us on CPython 3.11, and these run on every realize()
_RESHAPE, _BUFFER, _CONST = Ops.RESHAPE, Ops.BUFFER, Ops.CONST

def _is_contiguous_buffer(u: UOp) -> bool:
  """A BUFFER, possibly reshaped: the tensor's elements are the buffer's, in order."""
  while u.op is _RESHAPE: u = u.src[0]
  return u.op is _BUFFER

def _is_buffer_view(u: UOp) -> bool:
  return u.base.op is Ops.BUFFER and all(n.op in GroupOp.Movement or n.op is Ops.BUFFER for n in u.toposort())

def _check_host_read(what: str) -> None:
  from ember.engine.jit import check_host_read
  check_host_read(what)

def _is_done(u: UOp) -> bool:
  return (_is_contiguous_buffer(u) or u.op is _CONST or (u.op in GroupOp.Movement and u.base.op is _CONST)
          or (u.dtype.weak and u.base.op is _CONST))

def _graph_tensors(ts: Sequence[Tensor]) -> list[Tensor]:
  """The tensors with a graph that hold `ts`: a sharded tensor's shards in its place."""
  return [s for t in ts for s in (t.sharding.shards if t.sharding is not None else (t,))]

def _apply_becomes(becomes: dict[UOp, UOp]) -> None:
  if not becomes: return
  for t in list(all_tensors):
    if t.uop in becomes: t.uop = becomes[t.uop]
    elif not _is_done(t.uop) and any(b in becomes for b in t.uop.toposort()): t.uop = t.uop.substitute(becomes)

# a pending assign -> the tensors that were still to be computed and read its target's buffer when it was made: they
# must see the old value, so they are realized in the assign's schedule, which orders them before the assign
# (ember.schedule, write after read), or earlier. One schedule for a train step's backward and its parameter updates,
# where realizing them when each assign is made ran the backward, then generated and compiled the updates' kernels
_old_value_readers: weakref.WeakKeyDictionary[UOp, list[weakref.ref[Tensor]]] = weakref.WeakKeyDictionary()

def _old_value_readers_of(todo: list[Tensor]) -> tuple[list[Tensor], list[UOp]]:
  """The tensors to realize with `todo` because a pending assign in their graphs overwrites what they read (and those
  that a pending assign in theirs overwrites, in turn), but those of `todo`; and those assigns."""
  from ember.uop.ops import toposort_all
  chosen = {id(t) for t in todo}
  readers: list[Tensor] = []
  assigns: dict[UOp, None] = {}
  roots = [t.uop for t in todo]
  while roots:
    more: list[UOp] = []
    for n in toposort_all(roots, gate=lambda n: not _is_done(n)):
      if n.op is not Ops.ASSIGN or n in assigns or (refs := _old_value_readers.get(n)) is None: continue
      assigns[n] = None
      for r in refs:
        if (t := r()) is not None and id(t) not in chosen and not _is_done(t.uop):
          chosen.add(id(t))
          readers.append(t)
          more.append(t.uop)
    roots = more
  return readers, list(assigns)

def _pending_readers(bufs: frozenset[UOp], exclude: tuple[Tensor, ...] = ()) -> list[Tensor]:
  """The live tensors still to be computed that read any of `bufs` (before a buffer is overwritten, these must run
  to see its old value), but those of `exclude`."""
  # identity, not `in`: Tensor.__eq__ is elementwise
  excluded = {id(t) for t in exclude}
  return [t for t in list(all_tensors) if id(t) not in excluded and not _is_done(t.uop) and t.uop.buffers & bufs]

def _rng_words(seed: int, device: str) -> Tensor:
  """The RNG state buffer's contents for `seed`: its low and high 32-bit words and no draws yet."""
  return Tensor(np.array([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, 0], np.uint32), device=device)

_rng_seed = [SEED.value]
_rng_states: dict[str, Tensor] = {}  # device -> its RNG state (seed low, seed high, draws), uint32, one per device

def _hand_names_to_op_families() -> None:
  """The op-family modules (ember/tensor_ops/) build Tensors and call this module's helpers, but cannot import this
  module while it imports them; each lists what it needs in LATE_NAMES and gets it here, once Tensor exists."""
  from ember.tensor_ops import activation, creation, custom, elementwise, extra, math, movement, nn, reduce
  for family in (creation, movement, elementwise, math, activation, reduce, nn, extra, custom):
    for name in family.LATE_NAMES: setattr(family, name, globals()[name])

_hand_names_to_op_families()
