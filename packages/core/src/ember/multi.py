"""Sharded tensors: one logical tensor held as one ordinary `Tensor` per device, plus the axis it is split on.

`Tensor.shard(devices, axis)` splits a tensor into contiguous pieces along `axis` (`axis=None`, or `.to(devices)`,
replicates it). Kernels are scheduled by the normal scheduler and launch once per device; data crosses devices only
through COPY nodes, i.e. through each backend's copy path.

Design: composition. A sharded tensor is a plain `Tensor` whose `sharding` holds a `Sharding` (this module): its
shards, one single-device Tensor per device in device order, and the axis they split (None: every device holds the
whole tensor). It has no graph of its own: no `uop` (reading it raises `ShardingError`), and it is listed in
`ember.tensor.sharded_tensors`, not in `all_tensors` (its shards are there). `Tensor`'s primitive entry points
(elementwise, cast, movement, reduce, read-out, assign/replace, autograd) check `self.sharding` and hand the op to the
`Sharding` method of the same name, which runs it once per shard; every composite op built from them (matmul,
softmax, losses ...) works unchanged. No tensor ever changes class: `shard_` and `replace` swap the layout object, and
`MultiTensor` is the type of sharded tensors for `isinstance` only. The reference design keeps devices in the graph
(a multi-device UOp over the per-device graphs, rewritten before scheduling); that would teach the scheduler, autograd
and the JIT a new node and move sharding errors from the op to `realize`, where composition keeps every layout rule in
this one module, above `tensor.py` in the layer order. docs/multi-device.md says more.

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
from typing import Any, Callable, Sequence
import numpy as np
from ember.device import Device
from ember.dtype import DType, dtypes, least_upper_dtype, strong_dtype
from ember.errors import ArgumentError, ShapeError, GradientError, ShardingError
from ember.helpers import ContextVar, prod
from ember.tensor import Tensor, all_tensors, broadcast_shape, sharded_tensors
from ember.uop.ops import Ops, UOp, int_size

RING = ContextVar("RING", 0)

# every live sharded tensor (the registry is tensor.py's; this is its name in the multi-device API)
all_multi = sharded_tensors

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
  devs = tuple(Device.canonicalize(d) for d in devices)
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
  if algo not in ("naive", "ring"): raise ArgumentError(f"collective algorithm must be 'naive' or 'ring', got {algo!r}")
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
  size = int_size(shape[axis], "reduce_scatter")
  if size < len(devices):
    raise ShardingError(f"reduce_scatter: axis {axis} of size {size} cannot split over {len(devices)} devices")
  bounds = _bounds(split_sizes(size, len(devices)))
  chunks = [[t._slice_dim(axis, b, e) for b, e in bounds] for t in tensors]
  if _use_ring(algorithm): return _ring_reduce_scatter(op, chunks, devices)
  return [_fold(op, [chunks[j][i].to(d) for j in range(len(devices))]) for i, d in enumerate(devices)]

# ** the layout of a sharded tensor **

class Sharding:
  """How a sharded Tensor holds its value: `shards` (one single-device Tensor per device, in device order) split along
  `axis` (None: every device holds the whole tensor). The Tensor holding it calls these methods from its primitive
  ops, passing itself as `t`; they get arguments the Tensor has already checked and normalised, and run the op once
  per shard."""
  __slots__ = ("shards", "axis")

  def __init__(self, shards: Sequence[Tensor], axis: int | None):
    if not shards: raise ShardingError("a sharded tensor needs at least one shard")
    devs = tuple(s.device for s in shards)
    if len(set(devs)) != len(devs): raise ShardingError(f"shards must be on distinct devices, got {devs}")
    self.shards: tuple[Tensor, ...] = tuple(shards)
    self.axis = axis

  # ** layout **
  @property
  def devices(self) -> tuple[str, ...]: return tuple(s.device for s in self.shards)
  @property
  def bounds(self) -> list[tuple[int, int]]:
    """Each shard's (start, end) along the shard axis (none for a replicated tensor)."""
    if self.axis is None: return []
    return _bounds([int_size(s.shape[self.axis], "a shard axis") for s in self.shards])
  @property
  def shape(self) -> tuple[Any, ...]:
    first = self.shards[0].shape
    if self.axis is None: return first
    size = sum(int_size(s.shape[self.axis], "a shard axis") for s in self.shards)
    return first[:self.axis] + (size,) + first[self.axis + 1:]
  @property
  def dtype(self) -> DType: return self.shards[0].dtype
  def __repr__(self) -> str: return f"sharded over {self.devices} axis={self.axis}"

  # ** data out and placement **
  def numpy(self) -> np.ndarray:
    Tensor.realize(*self.shards)
    if self.axis is None: return self.shards[0].numpy()
    return np.concatenate([s.numpy() for s in self.shards], axis=self.axis)
  def data(self) -> memoryview: return np.ascontiguousarray(self.numpy()).data.cast("B")
  def to(self, t: Tensor, device: str | tuple[str, ...] | None) -> Tensor:
    """To one device: gather the shards there. To a tuple of devices: replicate on them."""
    if isinstance(device, tuple):
      devs = _canon_devices(device)
      if devs == self.devices: return self.gathered(t)
      return shard_tensor(t.to(devs[0]), devs, None)
    dev = Device.canonicalize(device) if device is not None else Device.DEFAULT
    if self.axis is None: return self.shards[self.devices.index(dev)] if dev in self.devices else self.shards[0].to(dev)
    return Tensor.cat(*[s.to(dev) for s in self.shards], dim=self.axis)
  def shard(self, t: Tensor, devices: Sequence[str], axis: int | None) -> Tensor:
    """Re-lay `t` out over `devices` along `axis`: local pieces on the same devices, a gather otherwise."""
    devs = _canon_devices(devices)
    ax = None if axis is None else t._resolve_dim(axis)
    if devs != self.devices: return shard_tensor(t.to(devs[0]), devs, ax)
    if ax == self.axis: return t
    return _split(self.gathered(t).shards, devs, ax, t.requires_grad)
  def shard_like(self, t: Tensor, other: Tensor) -> Tensor:
    lay = _layout(other)
    return _align(t, lay.devices, lay.axis, lay.bounds)
  def gathered(self, t: Tensor) -> Tensor:
    """`t` replicated on the same devices (an allgather of the shards)."""
    if self.axis is None: return t
    return sharded(allgather(self.shards, self.axis), None, t.requires_grad)
  def clone(self, t: Tensor, device: str | None) -> Tensor:
    return self.map(t, lambda s: s.clone()) if device is None else t.to(device).clone()
  def contiguous(self, t: Tensor) -> Tensor: return self.map(t, lambda s: s.contiguous())
  def contiguous_backward(self, t: Tensor) -> Tensor: return self.map(t, lambda s: s.contiguous_backward())
  def detach(self) -> Tensor: return sharded([s.detach() for s in self.shards], self.axis, False)
  def assign(self, t: Tensor, x: Any) -> Tensor:
    """Write `x` into every shard's buffer (brought to `t`'s layout first)."""
    value = _as_multi(x, self.devices, self.dtype)
    if value.shape != self.shape: raise ShapeError(f"assign shape mismatch: target {self.shape} <- value {value.shape}")
    value = _align(value, self.devices, self.axis, self.bounds)
    for s, v in zip(self.shards, _layout(value).shards): s.assign(v)
    return t
  def replace(self, t: Tensor, x: Tensor) -> Tensor:
    """`t` holds `x` from now on: `x`'s shards if it is sharded over the same devices, else `x` laid out as `t` is."""
    value = _as_multi(x, self.devices, self.dtype)
    if x.sharding is None: value = _align(value, self.devices, self.axis, self.bounds)
    t.sharding = _layout(value)
    return t
  def map(self, t: Tensor, fn: Callable[[Tensor], Tensor], axis: int | None = None, keep_axis: bool = True) -> Tensor:
    """`fn` run on every shard: a tensor on the same devices, split on `axis` (or on `t`'s axis with `keep_axis`)."""
    return sharded([fn(s) for s in self.shards], self.axis if keep_axis else axis, t.requires_grad)

  # ** elementwise **
  def const_like(self, x: Any) -> Tensor: return _as_multi(x, self.devices, None)
  def broadcasted(self, t: Tensor, y: Any, reverse: bool) -> tuple[Tensor, Tensor]:
    other = _as_multi(y, self.devices, None)
    dt = least_upper_dtype(self.dtype, other.dtype)
    a, b = t.cast(dt), other.cast(dt)
    shp = broadcast_shape(a.shape, b.shape)
    a, b = a._broadcast_to(shp), b._broadcast_to(shp)
    return (b, a) if reverse else (a, b)
  def alu(self, t: Tensor, op: Ops, *srcs: Tensor) -> Tensor:
    ops = _aligned([t, *[_as_multi(s, self.devices, None) for s in srcs]])
    rg = any(x.requires_grad for x in ops) or None
    per_device = zip(*(_layout(x).shards for x in ops))
    return sharded([parts[0]._alu(op, *parts[1:]) for parts in per_device], _layout(ops[0]).axis, rg)
  def where(self, t: Tensor, x: Any, y: Any) -> Tensor:
    xs, ys = _as_multi(x, self.devices, None), _as_multi(y, self.devices, None)
    dt = least_upper_dtype(xs.dtype, ys.dtype)
    shp = broadcast_shape(self.shape, xs.shape, ys.shape)
    c, a, b = _aligned([t._broadcast_to(shp), xs.cast(dt)._broadcast_to(shp), ys.cast(dt)._broadcast_to(shp)])
    rg = a.requires_grad or b.requires_grad or None
    parts = zip(_layout(c).shards, _layout(a).shards, _layout(b).shards)
    return sharded([cs.where(xa, yb) for cs, xa, yb in parts], _layout(c).axis, rg)
  def cast(self, t: Tensor, dtype: DType) -> Tensor: return self.map(t, lambda s: s.cast(dtype))
  def bitcast(self, t: Tensor, dtype: DType) -> Tensor:
    if self.axis is not None and self.axis == len(self.shape) - 1 and dtype.itemsize != self.dtype.itemsize:
      raise ShardingError(f"bitcast {self.dtype!r} -> {dtype!r} changes the size of the sharded last axis; "
                          "shard another axis")
    return self.map(t, lambda s: s.bitcast(dtype))

  # ** movement (shapes and dims already checked by Tensor) **
  def reshape(self, t: Tensor, new_shape: tuple[Any, ...]) -> Tensor:
    if self.axis is None: return self.map(t, lambda s: s.reshape(new_shape))
    new_axis = _reshape_axis(self.shape, new_shape, self.axis, self.bounds)
    out = []
    for s in self.shards:
      local = list(new_shape)
      local[new_axis] = int(prod(s.shape)) // int(prod(new_shape[:new_axis])) // int(prod(new_shape[new_axis + 1:]))
      out.append(s.reshape(tuple(local)))
    return sharded(out, new_axis, t.requires_grad)
  def permute(self, t: Tensor, perm: tuple[int, ...]) -> Tensor:
    return self.map(t, lambda s: s.permute(perm), None if self.axis is None else perm.index(self.axis), False)
  def expand(self, t: Tensor, final: tuple[Any, ...]) -> Tensor:
    """`t` (already of `final`'s rank) expanded to `final`: the shard axis keeps each shard's own size."""
    ax = self.axis
    return self.map(t, lambda s: s.expand(tuple(s.shape[i] if i == ax else d for i, d in enumerate(final))))
  def pad(self, t: Tensor, pads: list[tuple[int, int]], mode: str, value: float) -> Tensor:
    if self.axis is not None and pads[self.axis] != (0, 0): return self.gathered(t).pad(pads, mode, value)
    return self.map(t, lambda s: s.pad(pads, mode, value))
  def shrink(self, t: Tensor, bounds: tuple[tuple[Any, Any], ...]) -> Tensor:
    ax = self.axis
    if ax is None: return self.map(t, lambda s: s.shrink(bounds))
    def local(s: Tensor) -> tuple[tuple[Any, Any], ...]:
      return tuple((0, s.shape[i]) if i == ax else be for i, be in enumerate(bounds))
    if bounds[ax] == (0, self.shape[ax]): return self.map(t, lambda s: s.shrink(local(s)))
    if bounds[ax] in self.bounds:
      # exactly one device's piece: copy it to every device (a replicated result)
      piece = self.shards[self.bounds.index(bounds[ax])]
      return sharded([_on_device(piece.shrink(local(piece)), d) for d in self.devices], None, t.requires_grad)
    raise ShardingError(f"shrink {bounds[ax]} of axis {ax} does not fall on the shard boundaries {self.bounds} of a "
                        f"tensor {self.shape} sharded over {self.devices}; gather it first with .to(devices) or "
                        ".to(device)")
  def flip(self, t: Tensor, axes: tuple[int, ...]) -> Tensor:
    if self.axis is not None and self.axis in axes: return self.gathered(t).flip(axes)
    return self.map(t, lambda s: s.flip(axes))

  # ** reductions **
  def reduce(self, t: Tensor, op: Ops, axes: tuple[int, ...], keepdim: bool) -> Tensor:
    """`op` over `axes` (resolved, non-empty): per shard, then an allreduce when the shard axis is among them."""
    local = [s._reduce(op, axes, keepdim=True) for s in self.shards]
    if self.axis is not None and self.axis in axes: ret = sharded(allreduce(op, local), None, t.requires_grad)
    else: ret = sharded(local, self.axis, t.requires_grad)
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  # ** autograd **
  def gradient(self, t: Tensor, targets: Sequence[Tensor], gradient: Tensor | None) -> list[Tensor]:
    """d(t)/d(target) per target; a replicated target's gradient is the allreduced sum of its per-device parts."""
    from ember.gradient import compute_gradient
    if gradient is None:
      if t.numel() != 1:
        raise GradientError(f"gradient of a tensor of shape {self.shape} needs an explicit gradient argument")
      one = Tensor(1.0, dtype=self.dtype if dtypes.is_float(self.dtype) else dtypes.default_float)
      gradient = _as_multi(one, self.devices, None).expand(self.shape)
    seeds = _layout(_align(_as_multi(gradient, self.devices, None), self.devices, self.axis, self.bounds)).shards
    # a replicated value is one value: differentiate one copy (the copies are the same function of the inputs)
    roots = list(zip(self.shards, seeds))[:1] if self.axis is None else list(zip(self.shards, seeds))
    wanted = {u for x in targets for u in _target_uops(x)}
    acc: dict[UOp, Tensor] = {}
    for root, seed in roots:
      for u, g in compute_gradient(root.uop, seed.uop, wanted).items():
        if u in wanted: acc[u] = Tensor(g) if u not in acc else acc[u] + Tensor(g)
    return [_collect_grad(x, acc) for x in targets]
  def backward(self, t: Tensor, gradient: Tensor | None) -> Tensor:
    """Fill `.grad` of every tensor (sharded or not) with requires_grad that `t` depends on."""
    graph: set[UOp] = set()
    for s in self.shards: graph.update(s.uop.toposort())
    multis = [m for m in list(sharded_tensors.values()) if m.sharding is not None]
    shard_ids = {id(s) for m in multis for s in _layout(m).shards}
    targets = [m for m in multis if m.requires_grad and any(s.uop in graph for s in _layout(m).shards)]
    targets += [x for x in list(all_tensors) if x.requires_grad and id(x) not in shard_ids and x.uop in graph]
    if not targets: raise GradientError("backward(): no tensor in this graph has requires_grad=True")
    for x, g in zip(targets, self.gradient(t, targets, gradient)):
      x.grad = g if x.grad is None else (x.grad + g)
    return t

class _IsSharded(type):
  def __instancecheck__(cls, obj: Any) -> bool: return isinstance(obj, Tensor) and obj.sharding is not None

class MultiTensor(metaclass=_IsSharded):
  """The type of sharded tensors, for `isinstance` only: `isinstance(t, MultiTensor)` is `t.sharding is not None`.
  Every tensor is a `Tensor`; make a sharded one with `Tensor.shard`, `Tensor.shard_` or `Tensor.to(devices)`."""
  def __new__(cls, *args: Any, **kwargs: Any) -> MultiTensor:
    raise TypeError("MultiTensor is the type of sharded tensors, for isinstance; make one with Tensor.shard(devices, "
                    "axis) or Tensor.to(devices)")

# ** helpers **

def sharded(shards: Sequence[Tensor], axis: int | None, requires_grad: bool | None = None) -> Tensor:
  """The tensor split along `axis` into `shards` (one per device, in device order; axis None: replicas). A result
  that is not floating point (a comparison's, an index cast's) is not tracked, whatever its inputs were."""
  layout = Sharding(shards, axis)
  return Tensor.from_sharding(layout, requires_grad if dtypes.is_float(layout.dtype) else None)

def _layout(t: Tensor) -> Sharding:
  assert t.sharding is not None, "a sharded tensor was expected here"
  return t.sharding

def _split(replicas: Sequence[Tensor], devices: tuple[str, ...], axis: int | None,
           requires_grad: bool | None) -> Tensor:
  """Each device keeps its own piece of its replica: no data moves."""
  if axis is None: return sharded(replicas, None, requires_grad)
  size = replicas[0].shape[axis]
  if not isinstance(size, int): raise ShardingError(f"cannot shard symbolic axis {axis} of shape {replicas[0].shape}")
  if size < len(devices):
    raise ShardingError(f"axis {axis} of shape {replicas[0].shape} has {size} items, fewer than the {len(devices)} "
                        "devices; shard a larger axis or use fewer devices")
  pieces = [r._slice_dim(axis, b, e) for r, (b, e) in zip(replicas, _bounds(split_sizes(size, len(devices))))]
  return sharded(pieces, axis, requires_grad)

def shard_tensor(t: Tensor, devices: Sequence[str], axis: int | None = None) -> Tensor:
  """`t` split into contiguous pieces along `axis` over `devices` (axis None: a copy on every device)."""
  if t.sharding is not None: return t.sharding.shard(t, devices, axis)
  devs = _canon_devices(devices)
  ax = None if axis is None else t._resolve_dim(axis)
  if ax is None: return sharded([_on_device(t, d) for d in devs], None, t.requires_grad)
  size = t.shape[ax]
  if not isinstance(size, int) or size < len(devs):
    raise ShardingError(f"axis {ax} of shape {t.shape} has {size} items, fewer than the {len(devs)} devices; "
                        "shard a larger axis or use fewer devices")
  pieces = [_on_device(t._slice_dim(ax, b, e), d) for (b, e), d in zip(_bounds(split_sizes(size, len(devs))), devs)]
  return sharded(pieces, ax, t.requires_grad)

def on_devices(make: Callable[..., Tensor], devices: tuple[str, ...], *args: Any, **kwargs: Any) -> Tensor:
  """A creation function (`Tensor.full`, `empty`, `arange`) run once per device: a replicated tensor."""
  devs = _canon_devices(devices)
  rg = kwargs.pop("requires_grad", None)
  return sharded([make(*args, device=d, **kwargs) for d in devs], None, rg)

def _as_multi(x: Any, devices: tuple[str, ...], dtype: DType | None) -> Tensor:
  """`x` (scalar, list, or a sharded or single-device Tensor) as a tensor on `devices` (replicated unless it is
  already sharded)."""
  if isinstance(x, Tensor) and x.sharding is not None:
    if x.sharding.devices != devices:
      raise ShardingError(f"operands sharded over different devices: {x.sharding.devices} and {devices}; "
                          "move one with .to(devices)")
    return x
  if isinstance(x, Tensor): return sharded([_on_device(x, d) for d in devices], None, x.requires_grad)
  if isinstance(x, (bool, int, float)): return sharded([Tensor(x, device=d) for d in devices], None)
  return sharded([Tensor(x, device=d, dtype=dtype) for d in devices], None)

def _align(t: Tensor, devices: tuple[str, ...], axis: int | None, bounds: list[tuple[int, int]]) -> Tensor:
  """Sharded `t` laid out as (devices, axis, bounds): replicated pieces are shrunk locally, other shardings gathered
  first."""
  lay = _layout(t)
  if lay.devices != devices:
    raise ShardingError(f"operands sharded over different devices: {lay.devices} and {devices}")
  if lay.axis == axis and lay.bounds == bounds: return t
  replicated = lay.gathered(t)
  if axis is None: return replicated
  pieces = [r._slice_dim(axis, b, e) for r, (b, e) in zip(_layout(replicated).shards, bounds)]
  return sharded(pieces, axis, t.requires_grad)

def _aligned(ts: list[Tensor]) -> list[Tensor]:
  """Sharded operands of one elementwise op in one layout: the first split operand's (replicated if none is split)."""
  lead = _layout(next((t for t in ts if _layout(t).axis is not None), ts[0]))
  return [_align(t, lead.devices, lead.axis, lead.bounds) for t in ts]

def _reshape_axis(old: tuple[Any, ...], new: tuple[Any, ...], axis: int, bounds: list[tuple[int, int]]) -> int:
  """The axis of `new` that carries the shard split of `old`'s `axis`, if every shard stays a contiguous block."""
  before, after = int(prod(old[:axis])), int(prod(old[axis + 1:]))
  for k in range(len(new)):
    if int(prod(new[:k])) != before or new[k] == 1 and old[axis] != 1: continue
    inner = int(prod(new[k + 1:]))
    if inner and all((b * after) % inner == 0 and (e * after) % inner == 0 for b, e in bounds): return k
  raise ShardingError(f"reshape {old} -> {new} moves items between shards of axis {axis} (boundaries {bounds}); "
                      "gather the tensor first with .to(devices), or reshape so the sharded axis stays whole")

def _target_uops(t: Tensor) -> list[UOp]: return [s.uop for s in t.sharding.shards] if t.sharding else [t.uop]

def _grad_dtype(t: Tensor) -> DType: return strong_dtype(t.dtype) if dtypes.is_float(t.dtype) else dtypes.default_float

def _collect_grad(t: Tensor, acc: dict[UOp, Tensor]) -> Tensor:
  if t.sharding is None:
    g = acc.get(t.uop)
    if g is None: g = Tensor.zeros(*t.shape, dtype=_grad_dtype(t), device=t.device)
    return g.cast(t.dtype) if dtypes.is_float(t.dtype) else g
  parts = []
  for s in t.sharding.shards:
    g = acc.get(s.uop)
    g = Tensor.zeros(*s.shape, dtype=_grad_dtype(t), device=s.device) if g is None else g
    parts.append(g.cast(t.dtype) if dtypes.is_float(t.dtype) else g)
  if t.sharding.axis is not None: return sharded(parts, t.sharding.axis)
  # a replica copied from another replica passes its gradient on to that one (through the COPY), so only replicas
  # that derive from no other one hold independent parts of the gradient
  uops = [s.uop for s in t.sharding.shards]
  own = [i for i, u in enumerate(uops) if not any(o is not u and o in u.toposort() for o in uops)]
  if len(own) == len(parts): return sharded(allreduce(Ops.ADD, parts), None)
  return sharded([_fold(Ops.ADD, [parts[i].to(d) for i in own]) for d in t.sharding.devices], None)

__all__ = ["MultiTensor", "Sharding", "ShardingError", "RING", "all_multi", "allreduce", "allgather", "reduce_scatter",
           "shard_tensor", "sharded", "on_devices", "split_sizes"]
