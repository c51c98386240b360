"""Sharded tensors: one logical tensor held as one ordinary `Tensor` per device, plus the axis it is split on.

`Tensor.shard(devices, axis)` splits a tensor into contiguous pieces along `axis` (`axis=None`, or `.to(devices)`,
replicates it). The result is a `MultiTensor`: a `Tensor` whose primitive ops (elementwise, reduce, movement, cast,
assign, realize, autograd) run once per device on the shards, so every composite op built from them (matmul, softmax,
losses ...) works unchanged. Kernels are scheduled by the normal scheduler and launch once per device; data crosses
devices only through COPY nodes, i.e. through each backend's copy path.

- elementwise: operands are brought to the layout of the first sharded one (a replicated operand is shrunk locally to
  each device's piece; an operand sharded differently is gathered first);
- reduce over the sharded axis: a local reduce, then an allreduce (the result is replicated);
- movement: reshape and permute follow the shard axis; a reshape that moves items between shards, or a shrink that does
  not fall on shard boundaries, raises `ShardingError`; pad and flip of the sharded axis gather first.

Collectives (`allreduce`, `allgather`, `reduce_scatter`) work on lists of per-device tensors with a naive or a ring
algorithm: `algorithm="ring"`, or `RING=1` (env or `Context(RING=1)`) for the default.

>>> from ember.tensor import Tensor
>>> x = Tensor([[1.0, 2.0], [3.0, 4.0]], device="PYTHON").shard(("PYTHON", "PYTHON:1"), axis=0)
>>> x.sum().item()
10.0
"""
from __future__ import annotations
import itertools
import weakref
from typing import Any, Callable, Sequence
import numpy as np
from ember.dtype import DType, dtypes, least_upper_dtype, strong_dtype, to_dtype
from ember.errors import EmberError, ShapeError, GradientError
from ember.helpers import ContextVar, prod
from ember.tensor import Tensor, broadcast_shape, _canon_device, _shape_arg, _norm_padding
from ember.uop.ops import Ops, UOp

RING = ContextVar("RING", 0)

class ShardingError(EmberError, RuntimeError):
  """An op cannot run on a sharded tensor as laid out (it would move items between shards, or devices disagree)."""

all_multi: weakref.WeakSet[MultiTensor] = weakref.WeakSet()

# ** layouts **

def split_sizes(n: int, ndev: int) -> list[int]:
  """Balanced contiguous split of `n` items over `ndev` devices: the first `n % ndev` get one more."""
  return [n // ndev + (1 if i < n % ndev else 0) for i in range(ndev)]

def _bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
  starts = list(itertools.accumulate(sizes, initial=0))
  return [(starts[i], starts[i + 1]) for i in range(len(sizes))]

def _canon_devices(devices: Sequence[str]) -> tuple[str, ...]:
  if isinstance(devices, str) or len(devices) == 0:
    raise ShardingError(f"shard needs a tuple of devices, got {devices!r}")
  devs = tuple(_canon_device(d) for d in devices)
  if len(set(devs)) != len(devs):
    raise ShardingError(f"devices {devs} repeat a device; each shard needs its own device")
  return devs

def _on_device(t: Tensor, device: str) -> Tensor:
  """`t` on `device`: a graph without buffers (consts, arange, rand bits) is rebuilt there, anything else is copied."""
  if t.uop.device == device: return t
  nodes = t.uop.toposort()
  if not any(n.op in (Ops.BUFFER, Ops.COPY) for n in nodes):
    dev_uop = UOp(Ops.DEVICE, arg=device)
    return Tensor(t.uop.substitute({n: dev_uop for n in nodes if n.op is Ops.DEVICE}), requires_grad=t.requires_grad)
  return t.to(device)

# ** collectives over one tensor per device **

def _use_ring(algorithm: str | None) -> bool:
  algo = algorithm if algorithm is not None else ("ring" if RING.value else "naive")
  if algo not in ("naive", "ring"): raise ValueError(f"collective algorithm must be 'naive' or 'ring', got {algo!r}")
  return algo == "ring"

def _check_collective(tensors: Sequence[Tensor], what: str) -> tuple[str, ...]:
  if not tensors: raise ShardingError(f"{what} needs at least one tensor")
  devices = tuple(t.device for t in tensors)
  if len(set(devices)) != len(devices):
    raise ShardingError(f"{what}: tensors must be on distinct devices, got {devices}")
  return devices

def _combine(op: Ops, a: Tensor, b: Tensor) -> Tensor: return a._alu(op, b)

def _ring_reduce_scatter(op: Ops, chunks: list[list[Tensor]], devices: tuple[str, ...]) -> list[Tensor]:
  """chunks[i][c] is device i's piece c; returns piece i reduced over all devices, on device i. Each of the n-1 steps
  moves one piece per device to its ring neighbour, which folds it into its own copy of that piece."""
  n = len(devices)
  pieces = [list(row) for row in chunks]
  for step in range(n - 1):
    sent = [(i, (i - step - 1) % n) for i in range(n)]
    moved = {(i + 1) % n: (c, pieces[i][c].to(devices[(i + 1) % n])) for i, c in sent}
    for dst, (c, x) in moved.items(): pieces[dst][c] = _combine(op, pieces[dst][c], x)
  return [pieces[i][i] for i in range(n)]

def _ring_allgather(owned: list[Tensor], devices: tuple[str, ...]) -> list[list[Tensor]]:
  """owned[i] lives on device i; returns, per device, all n pieces (its own plus n-1 passed around the ring)."""
  n = len(devices)
  have: list[dict[int, Tensor]] = [{i: owned[i]} for i in range(n)]
  for step in range(n - 1):
    sent = [(i, (i - step) % n) for i in range(n)]
    for i, c in sent: have[(i + 1) % n][c] = have[i][c].to(devices[(i + 1) % n])
  return [[have[i][c] for c in range(n)] for i in range(n)]

def allreduce(op: Ops, tensors: Sequence[Tensor], algorithm: str | None = None) -> list[Tensor]:
  """Reduce same-shaped tensors (one per device) with `op` (Ops.ADD, Ops.MAX, Ops.MUL); every device gets the result.

  naive: every device copies in all n tensors and folds them in device order. ring: a reduce-scatter then an allgather
  over n pieces of the flattened tensor, 2(n-1)/n of the data per device on the wire. Replicas are bit-identical."""
  devices = _check_collective(tensors, "allreduce")
  if op not in (Ops.ADD, Ops.MAX, Ops.MUL): raise ShardingError(f"allreduce supports ADD, MAX and MUL, not {op}")
  shape = tensors[0].shape
  if any(t.shape != shape for t in tensors):
    raise ShapeError(f"allreduce of different shapes {[t.shape for t in tensors]}")
  n, numel = len(devices), int(prod(shape))
  if n == 1: return list(tensors)
  if not _use_ring(algorithm) or numel < n:
    return [_fold(op, [t.to(d) for t in tensors]) for d in devices]
  bounds = _bounds(split_sizes(numel, n))
  chunks = [[t.reshape(numel)[b:e] for b, e in bounds] for t in tensors]
  reduced = _ring_reduce_scatter(op, chunks, devices)
  return [Tensor.cat(*row).reshape(shape) for row in _ring_allgather(reduced, devices)]

def _fold(op: Ops, ts: list[Tensor]) -> Tensor:
  acc = ts[0]
  for t in ts[1:]: acc = _combine(op, acc, t)
  return acc

def allgather(tensors: Sequence[Tensor], axis: int = 0, algorithm: str | None = None) -> list[Tensor]:
  """Concatenate the per-device tensors along `axis`; every device gets the whole result."""
  devices = _check_collective(tensors, "allgather")
  if not _use_ring(algorithm): return [Tensor.cat(*[t.to(d) for t in tensors], dim=axis) for d in devices]
  return [Tensor.cat(*row, dim=axis) for row in _ring_allgather(list(tensors), devices)]

def reduce_scatter(op: Ops, tensors: Sequence[Tensor], axis: int = 0, algorithm: str | None = None) -> list[Tensor]:
  """Reduce same-shaped tensors (one per device) and leave device i with piece i (a balanced split along `axis`)."""
  devices = _check_collective(tensors, "reduce_scatter")
  shape = tensors[0].shape
  if any(t.shape != shape for t in tensors):
    raise ShapeError(f"reduce_scatter of different shapes {[t.shape for t in tensors]}")
  size = int(shape[axis])
  if size < len(devices):
    raise ShardingError(f"reduce_scatter: axis {axis} of size {size} cannot split over {len(devices)} devices")
  bounds = _bounds(split_sizes(size, len(devices)))
  chunks = [[t._slice_dim(axis, b, e) for b, e in bounds] for t in tensors]
  if _use_ring(algorithm): return _ring_reduce_scatter(op, chunks, devices)
  return [_fold(op, [chunks[j][i].to(d) for j in range(len(devices))]) for i, d in enumerate(devices)]

# ** the sharded tensor **

class MultiTensor(Tensor):
  """A logical tensor stored as `shards` (one Tensor per device, in device order) split along `axis` (None:
  every device holds the whole tensor). Built by `Tensor.shard`, `Tensor.shard_` and `Tensor.to(tuple)`."""
  # no slots of its own: `shard_` turns a Tensor into a MultiTensor in place, which needs the same memory layout. The
  # Tensor's `uop` slot holds the (shards, axis) pair instead of a graph; the `uop` property below guards it.
  __slots__ = ()

  def __init__(self, shards: Sequence[Tensor], axis: int | None, requires_grad: bool | None = None):
    _init_multi(self, shards, axis, requires_grad)

  # ** state **
  @property
  def uop(self) -> UOp:  # type: ignore[override]
    raise ShardingError(f"a tensor sharded over {self.devices} has one graph per device, not one uop; "
                        "use .shards, or gather it with .to(device)")
  @property
  def shards(self) -> tuple[Tensor, ...]: return Tensor.uop.__get__(self)[0]  # type: ignore[attr-defined]
  @property
  def axis(self) -> int | None: return Tensor.uop.__get__(self)[1]  # type: ignore[attr-defined]
  @property
  def devices(self) -> tuple[str, ...]: return tuple(s.device for s in self.shards)
  @property
  def bounds(self) -> list[tuple[int, int]]:
    """Each shard's (start, end) along the shard axis (the whole axis for a replicated tensor)."""
    if self.axis is None: return []
    return _bounds([int(s.shape[self.axis]) for s in self.shards])
  @property
  def shape(self) -> tuple[Any, ...]:
    first = self.shards[0].shape
    if self.axis is None: return first
    return first[:self.axis] + (sum(int(s.shape[self.axis]) for s in self.shards),) + first[self.axis + 1:]
  @property
  def dtype(self) -> DType: return self.shards[0].dtype
  @property
  def device(self) -> tuple[str, ...]: return self.devices  # type: ignore[override]
  def __repr__(self) -> str: return f"<MultiTensor {self.shape} {self.dtype!r} on {self.devices} axis={self.axis}>"
  def _map(self, fn: Callable[[Tensor], Tensor], axis: int | None = None, keep_axis: bool = True) -> MultiTensor:
    return MultiTensor([fn(s) for s in self.shards], self.axis if keep_axis else axis, self.requires_grad)

  # ** realize and data out **
  def schedule(self, *others: Tensor) -> list:
    from ember.schedule import create_schedule
    items, _ = create_schedule([s.uop for s in _flat_shards((self, *others))])
    return items
  def realize(self, *others: Tensor) -> Tensor:
    """Run the kernels of every shard (one launch per device and kernel) and of `others`, in one schedule."""
    Tensor._realize_all(*_flat_shards((self, *others)))
    return self
  def numpy(self) -> np.ndarray:
    self.realize()
    if self.axis is None: return self.shards[0].numpy()
    return np.concatenate([s.numpy() for s in self.shards], axis=self.axis)
  def data(self) -> memoryview: return memoryview(np.ascontiguousarray(self.numpy())).cast("B")
  def to(self, device: str | tuple[str, ...] | None) -> Tensor:
    """To one device: gather the shards there. To a tuple of devices: replicate on them."""
    if isinstance(device, tuple):
      devs = _canon_devices(device)
      if devs == self.devices: return self._gathered()
      return shard_tensor(self.to(devs[0]), devs, None)
    dev = _canon_device(device)
    if self.axis is None: return self.shards[self.devices.index(dev)] if dev in self.devices else self.shards[0].to(dev)
    return Tensor.cat(*[s.to(dev) for s in self.shards], dim=self.axis)
  def shard(self, devices: Sequence[str], axis: int | None = None) -> MultiTensor:
    """Re-lay this tensor out over `devices` along `axis`: local pieces on the same devices, a gather otherwise."""
    devs = _canon_devices(devices)
    ax = None if axis is None else self._resolve_dim(axis)
    if devs != self.devices: return shard_tensor(self.to(devs[0]), devs, ax)
    if ax == self.axis: return self
    return _split(self._gathered().shards, devs, ax, self.requires_grad)
  def shard_like(self, other: MultiTensor) -> MultiTensor: return _align(self, other.devices, other.axis, other.bounds)
  def _gathered(self) -> MultiTensor:
    """The same tensor replicated on the same devices (an allgather of the shards)."""
    if self.axis is None: return self
    return MultiTensor(allgather(self.shards, self.axis), None, self.requires_grad)
  def clone(self, device: str | None = None) -> Tensor:
    return self._map(lambda s: s.clone()) if device is None else self.to(device).clone()
  def contiguous(self) -> Tensor: return self._map(lambda s: s.contiguous())
  def contiguous_backward(self) -> Tensor: return self._map(lambda s: s.contiguous_backward())
  def detach(self) -> Tensor: return MultiTensor([s.detach() for s in self.shards], self.axis, False)
  def assign(self, x: Any) -> Tensor:
    """Write `x` into every shard's buffer (brought to this tensor's layout first)."""
    value = _as_multi(x, self.devices, self.dtype)
    if value.shape != self.shape: raise ShapeError(f"assign shape mismatch: target {self.shape} <- value {value.shape}")
    value = _align(value, self.devices, self.axis, self.bounds)
    for s, v in zip(self.shards, value.shards): s.assign(v)
    return self
  def replace(self, x: Tensor) -> Tensor:
    if x.shape != self.shape: raise ShapeError(f"replace shape mismatch: {self.shape} <- {x.shape}")
    value = _as_multi(x, self.devices, self.dtype)
    _set_state(self, value.shards, value.axis)
    return self

  # ** elementwise **
  def _const_like(self, x: Any) -> Tensor: return _as_multi(x, self.devices, None)
  def _broadcasted(self, y: Any, reverse: bool = False) -> tuple[Tensor, Tensor]:
    other = _as_multi(y, self.devices, None)
    dt = least_upper_dtype(self.dtype, other.dtype)
    a, b = self.cast(dt), other.cast(dt)
    shp = broadcast_shape(a.shape, b.shape)
    a, b = a._broadcast_to(shp), b._broadcast_to(shp)
    return (b, a) if reverse else (a, b)
  def _alu(self, op: Ops, *srcs: Tensor) -> Tensor:
    ops = _aligned([self, *[_as_multi(s, self.devices, None) for s in srcs]])
    rg = any(t.requires_grad for t in ops) or None
    per_device = zip(*(t.shards for t in ops))
    return MultiTensor([Tensor._alu(parts[0], op, *parts[1:]) for parts in per_device], ops[0].axis, rg)
  def where(self, x: Any, y: Any) -> Tensor:
    xs, ys = _as_multi(x, self.devices, None), _as_multi(y, self.devices, None)
    dt = least_upper_dtype(xs.dtype, ys.dtype)
    shp = broadcast_shape(self.shape, xs.shape, ys.shape)
    c, a, b = _aligned([self._broadcast_to(shp), xs.cast(dt)._broadcast_to(shp), ys.cast(dt)._broadcast_to(shp)])
    rg = a.requires_grad or b.requires_grad or None
    return MultiTensor([Tensor.where(cs, xa, yb) for cs, xa, yb in zip(c.shards, a.shards, b.shards)], c.axis, rg)
  def cast(self, dtype: DType | str) -> Tensor:
    dt = to_dtype(dtype)
    return self if self.dtype is dt else self._map(lambda s: s.cast(dt))
  def bitcast(self, dtype: DType | str) -> Tensor:
    dt = to_dtype(dtype)
    if self.axis is not None and self.axis == self.ndim - 1 and dt.itemsize != self.dtype.itemsize:
      raise ShardingError(f"bitcast {self.dtype!r} -> {dt!r} changes the size of the sharded last axis; "
                          "shard another axis")
    return self._map(lambda s: s.bitcast(dt))

  # ** movement **
  def reshape(self, shape: Any, *args: Any) -> Tensor:
    new_shape = _resolve_reshape(self.shape, _shape_arg(_varargs(shape, args)))
    if new_shape == self.shape: return self
    if self.axis is None: return self._map(lambda s: s.reshape(new_shape))
    new_axis = _reshape_axis(self.shape, new_shape, self.axis, self.bounds)
    out = []
    for s in self.shards:
      local = list(new_shape)
      local[new_axis] = int(prod(s.shape)) // int(prod(new_shape[:new_axis])) // int(prod(new_shape[new_axis + 1:]))
      out.append(s.reshape(tuple(local)))
    return MultiTensor(out, new_axis, self.requires_grad)
  def permute(self, order: Any, *args: Any) -> Tensor:
    perm = tuple(self._resolve_dim(d) for d in _varargs(order, args))
    if sorted(perm) != list(range(self.ndim)):
      raise ShapeError(f"permute order {perm} is not a permutation of {self.ndim} dims")
    if perm == tuple(range(self.ndim)): return self
    return self._map(lambda s: s.permute(perm), None if self.axis is None else perm.index(self.axis), keep_axis=False)
  def expand(self, shape: Any, *args: Any) -> Tensor:
    new_shape = _shape_arg(_varargs(shape, args))
    if len(new_shape) < self.ndim: raise ShapeError(f"cannot expand {self.shape} to fewer dims {new_shape}")
    base = self.reshape((1,) * (len(new_shape) - self.ndim) + self.shape) if len(new_shape) > self.ndim else self
    assert isinstance(base, MultiTensor)
    final = tuple(s if ns == -1 else ns for s, ns in zip(base.shape, new_shape))
    if final == base.shape: return base
    for s, ns in zip(base.shape, final):
      if s != ns and s != 1: raise ShapeError(f"cannot expand {self.shape} to {new_shape}: dim {s} is not 1")
    ax = base.axis
    return base._map(lambda sh: sh.expand(tuple(sh.shape[i] if i == ax else d for i, d in enumerate(final))))
  def pad(self, padding: Sequence[Any], mode: str = "constant", value: float = 0.0) -> Tensor:
    pads = _norm_padding(padding, self.ndim)
    if self.axis is not None and pads[self.axis] != (0, 0): return self._gathered().pad(pads, mode, value)
    return self._map(lambda s: Tensor.pad(s, pads, mode, value))
  def shrink(self, arg: Sequence[tuple[Any, Any] | None]) -> Tensor:
    if len(arg) != self.ndim:
      raise ShapeError(f"shrink needs one (begin, end) per dim: {len(arg)} given for shape {self.shape}")
    bounds = tuple((0, s) if a is None else (a[0], a[1]) for a, s in zip(arg, self.shape))
    for (b, e), s in zip(bounds, self.shape):
      if isinstance(b, int) and isinstance(e, int) and isinstance(s, int) and not 0 <= b <= e <= s:
        raise ShapeError(f"shrink {bounds} is out of range of shape {self.shape}")
    if bounds == tuple((0, s) for s in self.shape): return self
    ax = self.axis
    if ax is None: return self._map(lambda s: s.shrink(bounds))
    def local(s: Tensor) -> tuple[tuple[Any, Any], ...]:
      return tuple((0, s.shape[i]) if i == ax else be for i, be in enumerate(bounds))
    if bounds[ax] == (0, self.shape[ax]): return self._map(lambda s: s.shrink(local(s)))
    if bounds[ax] in self.bounds:
      # exactly one device's piece: copy it to every device (a replicated result)
      piece = self.shards[self.bounds.index(bounds[ax])]
      return MultiTensor([_on_device(piece.shrink(local(piece)), d) for d in self.devices], None, self.requires_grad)
    raise ShardingError(f"shrink {bounds[ax]} of axis {ax} does not fall on the shard boundaries {self.bounds} of a "
                        f"tensor {self.shape} sharded over {self.devices}; gather it first with .to(devices) or "
                        ".to(device)")
  def flip(self, axis: Any, *args: Any) -> Tensor:
    axes = {self._resolve_dim(a) for a in _varargs(axis, args)}
    if self.axis is not None and self.axis in axes: return self._gathered().flip(tuple(axes))
    return self._map(lambda s: s.flip(tuple(axes))) if axes else self

  # ** reductions **
  def _reduce(self, op: Ops, axis: Any = None, keepdim: bool = False) -> Tensor:
    axes = self._reduce_axes(axis)
    if self.ndim == 0 or not axes: return self
    local = [Tensor._reduce(s, op, axes, keepdim=True) for s in self.shards]
    if self.axis is not None and self.axis in axes: ret = MultiTensor(allreduce(op, local), None, self.requires_grad)
    else: ret = MultiTensor(local, self.axis, self.requires_grad)
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  # ** autograd **
  def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
    """d(self)/d(target) per target; a replicated target's gradient is the allreduced sum of its per-device parts."""
    from ember.gradient import compute_gradient
    if gradient is None:
      if self.numel() != 1:
        raise GradientError(f"gradient of a tensor of shape {self.shape} needs an explicit gradient argument")
      one = Tensor(1.0, dtype=self.dtype if dtypes.is_float(self.dtype) else dtypes.default_float)
      seed = _as_multi(one, self.devices, None)
      gradient = seed.expand(self.shape)
    seed_m = _align(_as_multi(gradient, self.devices, None), self.devices, self.axis, self.bounds)
    # a replicated value is one value: differentiate one copy (the copies are the same function of the inputs)
    roots = list(zip(self.shards, seed_m.shards))[:1] if self.axis is None else list(zip(self.shards, seed_m.shards))
    wanted = {u for t in targets for u in _target_uops(t)}
    acc: dict[UOp, Tensor] = {}
    for root, seed_shard in roots:
      for u, g in compute_gradient(root.uop, seed_shard.uop, wanted).items():
        if u in wanted: acc[u] = Tensor(g) if u not in acc else acc[u] + Tensor(g)
    return [_collect_grad(t, acc) for t in targets]
  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Fill `.grad` of every tensor (sharded or not) with requires_grad that this value depends on."""
    graph: set[UOp] = set()
    for s in self.shards: graph.update(s.uop.toposort())
    shard_ids = {id(s) for m in list(all_multi) for s in m.shards}
    targets: list[Tensor] = [m for m in list(all_multi) if m.requires_grad and any(s.uop in graph for s in m.shards)]
    from ember.tensor import all_tensors
    targets += [t for t in list(all_tensors) if t.requires_grad and id(t) not in shard_ids and t.uop in graph]
    if not targets: raise GradientError("backward(): no tensor in this graph has requires_grad=True")
    for t, g in zip(targets, self.gradient(*targets, gradient=gradient)):
      t.grad = g if t.grad is None else (t.grad + g)
    return self

# ** helpers **

def _set_state(t: Tensor, shards: Sequence[Tensor], axis: int | None) -> None:
  Tensor.uop.__set__(t, (tuple(shards), axis))  # type: ignore[attr-defined]

def _init_multi(t: Tensor, shards: Sequence[Tensor], axis: int | None, requires_grad: bool | None) -> None:
  if not shards: raise ShardingError("a sharded tensor needs at least one shard")
  devs = tuple(s.device for s in shards)
  if len(set(devs)) != len(devs): raise ShardingError(f"shards must be on distinct devices, got {devs}")
  _set_state(t, shards, axis)
  t.requires_grad, t.grad = requires_grad, None
  all_multi.add(t)  # type: ignore[arg-type]

def _flat_shards(ts: Sequence[Tensor]) -> list[Tensor]:
  return [s for t in ts for s in (t.shards if isinstance(t, MultiTensor) else (t,))]

def _split(replicas: Sequence[Tensor], devices: tuple[str, ...], axis: int | None,
           requires_grad: bool | None) -> MultiTensor:
  """Each device keeps its own piece of its replica: no data moves."""
  if axis is None: return MultiTensor(replicas, None, requires_grad)
  size = replicas[0].shape[axis]
  if not isinstance(size, int): raise ShardingError(f"cannot shard symbolic axis {axis} of shape {replicas[0].shape}")
  if size < len(devices):
    raise ShardingError(f"axis {axis} of shape {replicas[0].shape} has {size} items, fewer than the {len(devices)} "
                        "devices; shard a larger axis or use fewer devices")
  pieces = [r._slice_dim(axis, b, e) for r, (b, e) in zip(replicas, _bounds(split_sizes(size, len(devices))))]
  return MultiTensor(pieces, axis, requires_grad)

def shard_tensor(t: Tensor, devices: Sequence[str], axis: int | None = None) -> MultiTensor:
  """`t` split into contiguous pieces along `axis` over `devices` (axis None: a copy on every device)."""
  if isinstance(t, MultiTensor): return t.shard(devices, axis)
  devs = _canon_devices(devices)
  ax = None if axis is None else t._resolve_dim(axis)
  if ax is None: return MultiTensor([_on_device(t, d) for d in devs], None, t.requires_grad)
  size = t.shape[ax]
  if not isinstance(size, int) or size < len(devs):
    raise ShardingError(f"axis {ax} of shape {t.shape} has {size} items, fewer than the {len(devs)} devices; "
                        "shard a larger axis or use fewer devices")
  pieces = [_on_device(t._slice_dim(ax, b, e), d) for (b, e), d in zip(_bounds(split_sizes(size, len(devs))), devs)]
  return MultiTensor(pieces, ax, t.requires_grad)

def shard_inplace(t: Tensor, devices: Sequence[str], axis: int | None = None) -> MultiTensor:
  """Turn `t` itself into its sharded version (the same Python object, so references to it see the shards)."""
  from ember.tensor import all_tensors
  sharded = shard_tensor(t, devices, axis)
  if isinstance(t, MultiTensor):
    _set_state(t, sharded.shards, sharded.axis)
    return t
  # its `uop` is no longer a graph: code walking all_tensors must not see it. Found by identity, because WeakSet.discard
  # compares with ==, which is elementwise on tensors
  for ref in [r for r in all_tensors.data if r() is t]: all_tensors.data.discard(ref)
  t.__class__ = MultiTensor
  _init_multi(t, sharded.shards, sharded.axis, t.requires_grad)
  assert isinstance(t, MultiTensor)
  return t

def on_devices(make: Callable[..., Tensor], devices: tuple[str, ...], *args: Any, **kwargs: Any) -> MultiTensor:
  """A creation function (`Tensor.full`, `empty`, `arange`) run once per device: a replicated tensor."""
  devs = _canon_devices(devices)
  rg = kwargs.pop("requires_grad", None)
  return MultiTensor([make(*args, device=d, **kwargs) for d in devs], None, rg)

def _as_multi(x: Any, devices: tuple[str, ...], dtype: DType | None) -> MultiTensor:
  """`x` (scalar, list, Tensor or MultiTensor) as a tensor on `devices` (replicated unless it is already sharded)."""
  if isinstance(x, MultiTensor):
    if x.devices != devices:
      raise ShardingError(f"operands sharded over different devices: {x.devices} and {devices}; "
                          "move one with .to(devices)")
    return x
  if isinstance(x, Tensor): return MultiTensor([_on_device(x, d) for d in devices], None, x.requires_grad)
  if isinstance(x, (bool, int, float)): return MultiTensor([Tensor(x, device=d) for d in devices], None)
  return MultiTensor([Tensor(x, device=d, dtype=dtype) for d in devices], None)

def _align(t: MultiTensor, devices: tuple[str, ...], axis: int | None, bounds: list[tuple[int, int]]) -> MultiTensor:
  """`t` laid out as (devices, axis, bounds): replicated pieces are shrunk locally, other shardings gathered first."""
  if t.devices != devices: raise ShardingError(f"operands sharded over different devices: {t.devices} and {devices}")
  if t.axis == axis and t.bounds == bounds: return t
  replicated = t._gathered()
  if axis is None: return replicated
  pieces = [r._slice_dim(axis, b, e) for r, (b, e) in zip(replicated.shards, bounds)]
  return MultiTensor(pieces, axis, t.requires_grad)

def _aligned(ts: list[MultiTensor]) -> list[MultiTensor]:
  """Operands of one elementwise op in one layout: the first sharded operand's (or replicated if none is)."""
  lead = next((t for t in ts if t.axis is not None), ts[0])
  return [_align(t, lead.devices, lead.axis, lead.bounds) for t in ts]

def _varargs(first: Any, rest: tuple[Any, ...]) -> tuple[Any, ...]:
  """`f(2, 3)`, `f((2, 3))` and `f(2)` alike: the arguments as one tuple."""
  if rest: return (first, *rest)
  return (first,) if isinstance(first, int) else tuple(first)

def _resolve_reshape(old: tuple[Any, ...], new_shape: tuple[Any, ...]) -> tuple[Any, ...]:
  numel = prod(old)
  if (neg := [i for i, s in enumerate(new_shape) if s == -1]):
    if len(neg) > 1: raise ShapeError(f"reshape {old} -> {new_shape}: only one dimension can be -1")
    known = prod(s for s in new_shape if s != -1)
    if known == 0 or numel % known != 0: raise ShapeError(f"cannot reshape {old} ({numel} elements) to {new_shape}")
    new_shape = tuple(numel // known if s == -1 else s for s in new_shape)
  if prod(new_shape) != numel:
    raise ShapeError(f"cannot reshape {old} ({numel} elements) to {new_shape} ({prod(new_shape)} elements)")
  return new_shape

def _reshape_axis(old: tuple[Any, ...], new: tuple[Any, ...], axis: int, bounds: list[tuple[int, int]]) -> int:
  """The axis of `new` that carries the shard split of `old`'s `axis`, if every shard stays a contiguous block."""
  before, after = int(prod(old[:axis])), int(prod(old[axis + 1:]))
  for k in range(len(new)):
    if int(prod(new[:k])) != before or new[k] == 1 and old[axis] != 1: continue
    inner = int(prod(new[k + 1:]))
    if inner and all((b * after) % inner == 0 and (e * after) % inner == 0 for b, e in bounds): return k
  raise ShardingError(f"reshape {old} -> {new} moves items between shards of axis {axis} (boundaries {bounds}); "
                      "gather the tensor first with .to(devices), or reshape so the sharded axis stays whole")

def _target_uops(t: Tensor) -> list[UOp]: return [s.uop for s in t.shards] if isinstance(t, MultiTensor) else [t.uop]

def _grad_dtype(t: Tensor) -> DType: return strong_dtype(t.dtype) if dtypes.is_float(t.dtype) else dtypes.default_float

def _collect_grad(t: Tensor, acc: dict[UOp, Tensor]) -> Tensor:
  if not isinstance(t, MultiTensor):
    g = acc.get(t.uop)
    if g is None: g = Tensor.zeros(*t.shape, dtype=_grad_dtype(t), device=t.device)
    return g.cast(t.dtype) if dtypes.is_float(t.dtype) else g
  parts = []
  for s in t.shards:
    g = acc.get(s.uop)
    g = Tensor.zeros(*s.shape, dtype=_grad_dtype(t), device=s.device) if g is None else g
    parts.append(g.cast(t.dtype) if dtypes.is_float(t.dtype) else g)
  if t.axis is not None: return MultiTensor(parts, t.axis)
  # a replica copied from another replica passes its gradient on to that one (through the COPY), so only replicas
  # that derive from no other one hold independent parts of the gradient
  uops = [s.uop for s in t.shards]
  own = [i for i, u in enumerate(uops) if not any(o is not u and o in u.toposort() for o in uops)]
  if len(own) == len(parts): return MultiTensor(allreduce(Ops.ADD, parts), None)
  return MultiTensor([_fold(Ops.ADD, [parts[i].to(d) for i in own]) for d in t.devices], None)

__all__ = ["MultiTensor", "ShardingError", "RING", "allreduce", "allgather", "reduce_scatter", "shard_tensor",
           "shard_inplace", "on_devices", "split_sizes"]
