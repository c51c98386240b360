"""Tensor creation: constants, ranges, random numbers and initialisers.

A mixin of `ember.tensor.Tensor`. This module cannot import ember.tensor (which imports it to define Tensor);
ember.tensor hands it `Tensor`, `_buffer_uop`, `_canon_device` ... once Tensor exists (`LATE_NAMES`)."""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, Any
from ember.dtype import DType, dtypes, strong_dtype, to_dtype
from ember.errors import ArgumentError, DTypeError, ShapeError
from ember.helpers import prod
from ember.uop.ops import Ops, UOp, sint

if TYPE_CHECKING:
  from ember.tensor import (Tensor, _buffer_uop, _canon_device, _const_uop, _int_scalar_dtype, _multi_create,
                            _new_shape, _reshape, _rng_seed, _rng_states, _rng_words, _shape_arg, _tensor_seq)

LATE_NAMES = ('Tensor', '_buffer_uop', '_canon_device', '_const_uop', '_int_scalar_dtype', '_multi_create',
              '_new_shape', '_reshape', '_rng_seed', '_rng_states', '_rng_words', '_shape_arg', '_tensor_seq')

class CreationMixin:
  __slots__ = ()  # Tensor's own slots stay the only instance fields
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
    shp = _new_shape(_shape_arg((shape,)), "full")
    dt = to_dtype(dtype) if dtype is not None else None
    if type(fill_value) is int: _int_scalar_dtype(fill_value, dt)  # a value dt cannot hold is refused, not wrapped
    if dt is None:
      dt = strong_dtype(_int_scalar_dtype(fill_value, None) if type(fill_value) is int else dtypes.from_py(fill_value))
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
    else:  # the default int where it holds every value, else int64 (as torch's default int is)
      last = start + (n - 1) * step if n else start
      dt = dtypes.default_int if all(dtypes.min(dtypes.default_int) <= v <= dtypes.max(dtypes.default_int)
                                     for v in (start, last)) else dtypes.int64
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
    from ember.function import _tracing
    if _tracing[0]:
      # inside an ember.function's trace the draw stays in the graph (the state's pending update chains the draws), so
      # every call of the function draws anew from the state it advances, as a TinyJit replay does
      target, value = (state.uop.src[0], state.uop.src[1]) if state.uop.op is Ops.ASSIGN else (state.uop, state.uop)
      drawn = (Tensor(value) + step).contiguous()
      state.uop = UOp(Ops.ASSIGN, state.dtype, (target, drawn.uop))
      return drawn
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
  def full_like(self: Tensor, fill_value: Any, **kwargs: Any) -> Tensor:
    """A tensor of this one's shape (and dtype and device unless given) filled with `fill_value`.

    >>> Tensor([[1, 2], [3, 4]]).full_like(7).tolist()
    [[7, 7], [7, 7]]
    """
    dt = to_dtype(kwargs.pop("dtype")) if kwargs.get("dtype") is not None else strong_dtype(self.dtype)
    return Tensor.full(self.shape, fill_value, dtype=dt, device=kwargs.pop("device", self.device), **kwargs)
  def zeros_like(self: Tensor, **kwargs: Any) -> Tensor:
    """Zeros of this tensor's shape, dtype and device (override with `dtype=`, `device=`).

    >>> Tensor([1.5, 2.5]).zeros_like().tolist()
    [0.0, 0.0]
    """
    return self.full_like(0, **kwargs)
  def ones_like(self: Tensor, **kwargs: Any) -> Tensor:
    """Ones of this tensor's shape, dtype and device.

    >>> Tensor([1, 2]).ones_like().tolist()
    [1, 1]
    """
    return self.full_like(1, **kwargs)
  def empty_like(self: Tensor, **kwargs: Any) -> Tensor:
    """An uninitialised tensor of this tensor's shape, dtype and device.

    >>> Tensor([1.0, 2.0]).empty_like().shape
    (2,)
    """
    dt = to_dtype(kwargs.pop("dtype")) if kwargs.get("dtype") is not None else strong_dtype(self.dtype)
    return Tensor.empty(*self.shape, dtype=dt, device=kwargs.pop("device", self.device), **kwargs)
  # torch's new_*: a new tensor of this one's dtype and device (unless given), of the shape given
  def new_full(self: Tensor, size: Any, fill_value: Any, **kwargs: Any) -> Tensor:
    dt = to_dtype(kwargs.pop("dtype")) if kwargs.get("dtype") is not None else strong_dtype(self.dtype)
    return Tensor.full(_shape_arg((size,)), fill_value, dtype=dt, device=kwargs.pop("device", self.device), **kwargs)
  def new_zeros(self: Tensor, *size: Any, **kwargs: Any) -> Tensor: return self.new_full(_shape_arg(size), 0, **kwargs)
  def new_ones(self: Tensor, *size: Any, **kwargs: Any) -> Tensor: return self.new_full(_shape_arg(size), 1, **kwargs)
  def new_empty(self: Tensor, *size: Any, **kwargs: Any) -> Tensor:
    dt = to_dtype(kwargs.pop("dtype")) if kwargs.get("dtype") is not None else strong_dtype(self.dtype)
    return Tensor.empty(*_shape_arg(size), dtype=dt, device=kwargs.pop("device", self.device), **kwargs)
  def new_tensor(self: Tensor, data: Any, **kwargs: Any) -> Tensor:
    dt = to_dtype(kwargs.pop("dtype")) if kwargs.get("dtype") is not None else strong_dtype(self.dtype)
    return Tensor(data, dtype=dt, device=kwargs.pop("device", self.device), **kwargs)
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
  def meshgrid(self: Tensor, *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
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
    if high <= low: raise ArgumentError(f"randint needs low < high, got low={low}, high={high}")
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
