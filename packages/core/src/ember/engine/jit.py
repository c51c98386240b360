"""TinyJit: run a function normally once, capture the kernels it launches on the second call, replay them after.

Replay launches the captured compiled kernels directly with the new input buffers swapped in: no scheduling, no
codegen and no per-op Python work. Inputs must be realized tensors of the same shapes and dtypes on every call.

A device can batch a whole capture into one native submission through `Compiled.graph`: when every captured call
is a kernel on one device whose `graph` is set, `graph(captured, input_buffers)` is built once after the capture
(`captured` is the list of (runner, buffers, var_vals), `input_buffers` the inputs in argument order), and each replay
calls `graph_runner(new_input_buffers)` instead of launching the kernels one by one; it must swap the new inputs in
wherever the capture used the old ones, and may return before the GPU finishes (`Device.synchronize` waits).

Replay cannot see Python values: reading tensor data to the host while capturing (`item()`, `numpy()`, `tolist()`,
`data()`, `bool(t)`) raises `JitError`, since the value read would be baked into every replay. Tensors inside list,
tuple and dict arguments are inputs like the others. Python arguments (numbers, strings, flags, and lists or dicts of
them) are baked into the capture: where one differs from the captured call's, the function runs and is captured again
(tinygrad's TinyJit replays the old value silently). Inputs whose shapes
hold bound Variables replay with each call's values. `prune=True` runs the kernels that depend on neither the inputs
nor state the replay itself changes once, at capture, and drops them from the replay. `JITBEAM=N` compiles the
captured kernels under BEAM=N (a search per new kernel, see ember.codegen.search): the kernels replays run are searched
and the rest of the program is not.
"""
from __future__ import annotations
import functools
import sys
import warnings
from typing import Any, Callable, Generic, TypeVar
import ember.profiler as profiler
from ember.device.base import Buffer
from ember.errors import JitError
from ember.engine import realize as engine
from ember.helpers import BEAM, DEBUG, JIT, Context
from ember.schedule import buffer_of, is_kept, note_packed, pack_is_fresh
from ember.uop.ops import GroupOp, Ops, UOp

R = TypeVar("R")
Captured = list[tuple[engine.CompiledRunner | None, list[Buffer], dict[str, int]]]
Packs = list[tuple[engine.CompiledRunner, list[Buffer], dict[str, int]]]

# looked up once: an Enum member read through its class costs ~0.13 us on CPython 3.11, a tenth of _plain_inputs' time
_RESHAPE, _BUFFER, _BIND, _CONST = Ops.RESHAPE, Ops.BUFFER, Ops.BIND, Ops.CONST

_capturing: list[str] = []  # the functions TinyJit is capturing now, innermost last

def capturing() -> bool:
  """Whether TinyJit is capturing: work done now is replayed without Python, so checks on data cannot run."""
  return bool(_capturing)

def check_host_read(what: str) -> None:
  """Raise JitError for a read of tensor data to the host while TinyJit captures (`what` names the read)."""
  if _capturing:
    raise JitError(f"{what} reads tensor data while TinyJit captures {_capturing[-1]}: replays would reuse the value "
                   "read now; keep the values in tensors inside the jitted function, or return the tensor and read it "
                   "after the call")

def _unbind_shape(shape: tuple[Any, ...], var_vals: dict[str, int]) -> tuple[Any, ...]:
  """`shape` with its bound Variables unbound; their values go to `var_vals`."""
  out = []
  for s in shape:
    if isinstance(s, UOp):
      binds = [u for u in s.toposort() if u.op is Ops.BIND]
      for b in binds: var_vals[b.src[0].arg[0]] = b.src[1].arg
      s = s.substitute({b: b.src[0] for b in binds})
    out.append(s)
  return tuple(out)

def _per_device(t: Any) -> list[Any]:
  """A tensor as the single-device tensors that hold it: a sharded one's shards, in device order."""
  return list(t.sharding.shards) if t.sharding is not None else [t]

def _input_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
  """The tensor arguments, in order, including those inside lists, tuples and dicts (a replay swaps each one in: a
  tensor in a list was baked into the capture, so every replay read the first call's data)."""
  return _flatten_returns((*args, *kwargs.values()))

_SCALARS = (int, float, bool, str, bytes, complex, type(None))

def _scalar_key(x: Any) -> Any:
  """What a Python value baked into a capture is compared by: scalars by type and value (NaN equal to NaN), containers
  by their items, tensors and Variables (swapped in or bound per call) and other objects (a model, a function) not."""
  if isinstance(x, _SCALARS): return (type(x), "nan" if isinstance(x, float) and x != x else x)
  if isinstance(x, (list, tuple)): return (type(x), tuple(_scalar_key(v) for v in x))
  if isinstance(x, dict): return (dict, tuple((k, _scalar_key(v)) for k, v in x.items()))
  if hasattr(x, "item") and getattr(x, "shape", None) == () and hasattr(x, "dtype") and type(x).__module__ == "numpy":
    return (type(x), x.item())  # a numpy scalar
  return None

def _copy_input_views(ret: Any, inputs: set[int]) -> Any:
  """`ret` with each tensor whose graph is only a view of an input's buffer (a sharded one: any shard's) replaced by a
  copy of it; `ret` itself where there is none."""
  from ember.tensor import Tensor
  if isinstance(ret, Tensor):
    views = [s.uop for s in ret.shards] if ret.sharding is not None else [ret.uop]
    return ret.contiguous() if any(_input_view(u, inputs) for u in views) else ret
  if isinstance(ret, (list, tuple)):
    new = [_copy_input_views(r, inputs) for r in ret]
    if all(a is b for a, b in zip(new, ret)): return ret
    return type(ret)(*new) if hasattr(ret, "_fields") else type(ret)(new)  # a named tuple takes its fields
  if isinstance(ret, dict):
    new_d = {k: _copy_input_views(v, inputs) for k, v in ret.items()}
    return ret if all(new_d[k] is v for k, v in ret.items()) else type(ret)(new_d)
  return ret

def _input_view(u: UOp, inputs: set[int]) -> bool:
  """`u` is only movement ops over buffers, one of them an input's (ids of base buffers)."""
  if not all(n.op in GroupOp.Movement or n.op is Ops.BUFFER for n in u.toposort()): return False
  return any(id(buffer_of(b).base) in inputs for b in u.buffers)

def _flatten_returns(ret: Any) -> list[Any]:
  from ember.tensor import Tensor
  if isinstance(ret, Tensor): return _per_device(ret)
  if isinstance(ret, (list, tuple)): return [t for r in ret for t in _flatten_returns(r)]
  if isinstance(ret, dict): return [t for r in ret.values() for t in _flatten_returns(r)]
  return []

class TinyJit(Generic[R]):
  """`@TinyJit` on a function of Tensors: the 1st call runs normally, the 2nd captures, later calls replay.

  `@TinyJit(prune=True)`: kernels that read neither the inputs nor buffers the replay writes run once, at capture.
  """
  def __init__(self, fxn: Callable[..., R] | None = None, prune: bool = False):
    self.fxn, self.prune = fxn, prune
    self.recaptures = 0  # captures dropped because a Python argument changed (warned about at the third)
    self.cnt = 0
    self.captured: Captured = []
    self.packs: Packs = []  # PACK calls of kept packed weights, run where stale (_kept_packs)
    self.written: list[Buffer] = []
    self.expected: list[Any] = []
    self.ret: Any = None
    self.scalars: Any = None  # _scalar_key of the captured call's arguments: Python values the capture baked in
    # called with the input buffers, and with the bound Variables too where the runner `takes_var_vals`
    self.graph: Callable[..., Any] | None = None
    self._reset_replay()
    if fxn is not None: functools.update_wrapper(self, fxn)
  def __get__(self, obj: Any, objtype: Any = None) -> Any: return functools.partial(self.__call__, obj)
  def reset(self) -> None:
    self.cnt, self.captured, self.expected, self.ret, self.graph, self.scalars = 0, [], [], None, None, None
    self.packs, self.written = [], []
    self._reset_replay()
  def _reset_replay(self) -> None:
    # what a replay precomputes at capture (_plan_replay): the arguments' classes, shapes, dtypes and devices where
    # they are plain (_plain_inputs), packs and written buffers by input slot, and the graph's own kernel timing hook
    # per argument: None (a Python value), (class, shape, dtype, device) of a tensor, or the Variable an argument binds
    self.plain: list[tuple[type[Any], tuple[Any, ...], Any, str] | UOp | None] | None = None
    self.plain_scalars: list[tuple[int, Any]] = []  # (argument position, _scalar_key) of the plain non-tensor arguments
    self.pack_plan: list[tuple[engine.CompiledRunner, Buffer, int, Buffer, dict[str, int]]] = []
    self.written_bases: list[Buffer] = []
    self.written_inputs: list[int] = []
    self.graph_times: Callable[[], list[tuple[int, int]]] | None = None
  def __call__(self, *args: Any, **kwargs: Any) -> R:
    if self.fxn is None:  # used as @TinyJit(prune=True)
      self.fxn = args[0]
      functools.update_wrapper(self, self.fxn)
      return self  # type: ignore[return-value]
    if self.cnt >= 2 and JIT.value and (plain := self._plain_inputs(args, kwargs)) is not None:
      return self._replay(*plain)
    inputs = _input_tensors(args, kwargs)
    for t in inputs:
      if t.dtype.weak: raise JitError(f"JIT inputs must be real buffers, got a weak {t.dtype!r} tensor; use .clone()")
    scalars = _scalar_key((args, tuple(sorted(kwargs.items(), key=lambda kv: kv[0]))))
    if not JIT.value or self.cnt == 0: return self._run(args, kwargs)
    from ember.tensor import Tensor
    for t in inputs: t.realize()
    in_bufs = [t.buffer() if not t.uop.is_realized else _buf(t) for t in inputs]
    # bound Variables, as arguments or in the inputs' shapes, change sizes and positions without recapture: the
    # kernels are symbolic in them and take each call's values
    var_vals: dict[str, int] = {}
    info = [(_unbind_shape(t.shape, var_vals), t.dtype, t.device) for t in inputs]
    info += [_unbind_shape((u,), var_vals) for u in (*args, *kwargs.values()) if isinstance(u, UOp)]
    for u in (*args, *kwargs.values()):
      if isinstance(u, UOp) and (unbound := [x.arg[0] for x in u.toposort() if x.op is Ops.DEFINE_VAR
                                             and x.arg[0] not in var_vals]):
        raise JitError(f"TinyJit argument {unbound[0]!r} is a Variable bound to no value: a replay would reuse the "
                       f"last call's; pass it bound, Variable({unbound[0]!r}, ...).bind(value)")
    if self.cnt == 1:
      self.expected, self.scalars = info, scalars
      captured: Captured = []
      hook = lambda runner, bufs, vv: captured.append((runner, list(bufs), dict(vv)))  # noqa: E731
      engine.capture_hooks.append(hook)
      _capturing.append(getattr(self.fxn, "__qualname__", repr(self.fxn)))
      from ember.codegen.search import JITBEAM
      try:
        with Context(BEAM=JITBEAM.value or BEAM.value):  # JITBEAM=N: BEAM=N for the kernels replays will run
          ret = self.fxn(*args, **kwargs)
          outs = _flatten_returns(ret)
          Tensor.realize(*outs) if outs else None
          # a returned input, or a reshape of one (after any assign to it landed), is the captured call's buffer: a
          # replay would hand back that call's tensor. Returned as a copy made by a captured kernel, it is this call's
          if outs and (own := _copy_input_views(ret, {id(b.base) for b in in_bufs})) is not ret:
            ret = own
            Tensor.realize(*_flatten_returns(ret))
      finally:
        engine.capture_hooks.remove(hook)
        _capturing.pop()
      if self.prune: captured = _prune(captured, in_bufs)
      captured, self.packs = _kept_packs(captured)
      self.captured, self.in_bufs, self.ret = captured, in_bufs, ret
      # what a device graph's replay writes, for the write counts it does not pass through the runners (Buffer.writes)
      self.written = [bufs[i] for runner, bufs, _ in captured if runner is not None for i in runner.written]
      self.graph = _device_graph(captured, in_bufs)
      self._plan_replay(args, kwargs, var_vals)
      self.cnt += 1
      return ret
    if info != self.expected:
      raise JitError(f"TinyJit inputs changed: expected {self.expected}, got {info}; "
                     "shapes, dtypes and devices must stay the same")
    if scalars != self.scalars:
      # a Python value the capture baked in (a scale, a flag, a size) changed: the replay would compute with the old
      # one, so the function runs again and is captured anew for the new values (as a guard failure recompiles)
      self.recaptures += 1
      if self.recaptures == 3 or DEBUG.value >= 1:
        warnings.warn(f"TinyJit {getattr(self.fxn, '__qualname__', '')}: a Python argument changed since the capture "
                      f"({self.recaptures} times), so the function ran and was captured again; pass values that change "
                      "as Tensors or Variables to replay without that", stacklevel=2)
      self.reset()
      return self._run(args, kwargs)
    return self._replay(in_bufs, var_vals)

  def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    """A call run as plain code (the first, or one after a reset), its returns realized: the next call captures."""
    assert self.fxn is not None  # set by __init__ or the decorator call
    self.cnt += 1
    ret = self.fxn(*args, **kwargs)
    for t in _flatten_returns(ret): t.realize()
    return ret

  def _plan_replay(self, args: tuple[Any, ...], kwargs: dict[str, Any], var_vals: dict[str, int]) -> None:
    """Precompute at capture what each replay would otherwise work out per call: where the kept packs' sources and the
    written buffers sit among the inputs, and, when the capture took no sharded tensor and no tensor of a symbolic
    shape, each argument's class, shape, dtype and device, or the Variable it binds, for `_plain_inputs`."""
    slot = {id(b): i for i, b in enumerate(self.in_bufs)}
    self.pack_plan = [(pack, bufs[0], slot.get(id(bufs[1]), -1), bufs[1], vv) for pack, bufs, vv in self.packs]
    self.written_bases = [b.base for b in self.written if id(b) not in slot]
    self.written_inputs = [slot[id(b)] for b in self.written if id(b) in slot]
    self.graph_times = getattr(self.graph, "kernel_times_ns", None)
    from ember.tensor import Tensor
    values = (*args, *kwargs.values())
    if any(isinstance(a, Tensor) and (a.sharding is not None or not all(isinstance(s, int) for s in a.shape))
           for a in values): return
    if any(isinstance(a, (list, tuple, dict)) and _flatten_returns(a) for a in values): return  # tensors inside
    if any(isinstance(a, UOp) and not _bound_variable(a) for a in values): return
    if set(var_vals) != {a.src[0].arg[0] for a in values if isinstance(a, UOp)}: return
    self.plain = [(type(a), a.shape, a.dtype, a.device) if isinstance(a, Tensor) else a.src[0] if isinstance(a, UOp)
                  else None for a in values]
    self.plain_scalars = [(i, key) for i, a in enumerate(values) if (key := _scalar_key(a)) is not None]

  def _plain_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Buffer], dict[str, int]] | None:
    """The replay's input buffers and Variable values when every tensor argument is one whole buffer already, of the
    class, shape, dtype and device captured, and each Variable argument is the captured one bound to a constant (a
    replay in a loop, a decode step): what the general path finds after realizing each input and unbinding its shape,
    at a tenth of its Python cost (a small matvec's whole kernel is ~30 us). None where anything differs or is not
    plain: the general path then realizes, swaps or reports it."""
    plain = self.plain
    values: tuple[Any, ...] = (*args, *kwargs.values()) if kwargs else args
    if plain is None or len(values) != len(plain): return None
    bufs, var_vals = [], {}
    for a, want in zip(values, plain):
      if want is None:
        from ember.tensor import Tensor
        if isinstance(a, (Tensor, UOp)): return None  # a tensor or a Variable where the capture had neither
        continue
      if type(want) is UOp:  # the Variable the capture bound: this call's value (UOps are interned: `is` compares)
        if type(a) is not UOp or a.op is not _BIND or a.src[0] is not want or a.src[1].op is not _CONST: return None
        var_vals[want.arg[0]] = a.src[1].arg
        continue
      assert isinstance(want, tuple)
      cls, shape, dtype, device = want
      if type(a) is not cls or a.sharding is not None: return None
      u = b = a.uop
      while b.op is _RESHAPE: b = b.src[0]
      if b.op is not _BUFFER or b.arg.device != device or b.dtype != dtype or u.shape != shape: return None
      bufs.append(buffer_of(b))
    for i, key in self.plain_scalars:  # a Python value baked into the capture changed: the general path recaptures
      if _scalar_key(values[i]) != key: return None
    return bufs, var_vals

  def _replay(self, in_bufs: list[Buffer], var_vals: dict[str, int]) -> R:
    """Run the capture on this call's input buffers (in the capture's input order) and bound Variable values."""
    for pack, scratch, src_slot, src, vv in self.pack_plan:  # kept packed weights: packed again once stale
      if src_slot >= 0: src = in_bufs[src_slot]
      if pack_is_fresh(scratch, src): continue
      pack([scratch, src], {**vv, **var_vals})
      note_packed(scratch, src)
      engine.GlobalCounters.kernel_count += 1
    # each kernel timed on its own (DEBUG=2, a profile): launched one by one, not as the device's graph, unless the
    # graph times its kernels itself (HCQ: a GPU timestamp around each), which a profile then reads after the replay
    graph_times = self.graph_times
    timed = DEBUG.value >= 2 or (profiler.enabled and graph_times is None)
    # a graph replays the capture in one device call; one that `takes_var_vals` also takes new Variable values
    if self.graph is not None and not timed and (not var_vals or getattr(self.graph, "takes_var_vals", False)):
      start = profiler.now_us() if profiler.enabled else 0.0
      if var_vals: self.graph(in_bufs, var_vals)
      else: self.graph(in_bufs)
      for base in self.written_bases: base.writes += 1
      for i in self.written_inputs: in_bufs[i].base.writes += 1
      engine.GlobalCounters.kernel_count += len(self.captured)
      if profiler.enabled and graph_times is not None: self._record_graph_replay(start, graph_times())
      self.cnt += 1
      return self.ret
    swap = {id(old): new for old, new in zip(self.in_bufs, in_bufs)}
    start = profiler.now_us() if profiler.enabled else 0.0
    for runner, bufs, vv in self.captured:
      real = [swap.get(id(b), b) for b in bufs]
      if runner is None: engine._copy(real[0], real[1])
      elif timed: engine.replay_timed(runner, real, {**vv, **var_vals})
      else:
        runner(real, {**vv, **var_vals})
        engine.GlobalCounters.kernel_count += 1
    if profiler.enabled:
      from ember.device import Device
      device = next((runner.device for runner, _, _ in self.captured if runner is not None), Device.DEFAULT)
      profiler.record("jit", f"TinyJit {getattr(self.fxn, '__qualname__', repr(self.fxn))}", device, "jit", start,
                      profiler.now_us() - start, calls=len(self.captured))
    self.cnt += 1
    return self.ret

  def _record_graph_replay(self, start_us: float, times: list[tuple[int, int]]) -> None:
    """A profile of one graph replay: each kernel at the device times the graph stamped, and the replay itself."""
    from ember.device import Device
    runners = [runner for runner, _, _ in self.captured if runner is not None]
    dev = Device[runners[0].device]
    for runner, (s, e) in zip(runners, times):
      spec = runner.spec
      profiler.device_event("kernel", spec.name, dev, "compute", s, e, ops=spec.estimates.ops, bytes=spec.estimates.mem,
                            jit=True, graph=True)
    profiler.record("jit", f"TinyJit {getattr(self.fxn, '__qualname__', repr(self.fxn))}", runners[0].device, "jit",
                    start_us, profiler.now_us() - start_us, calls=len(self.captured), submissions=1)

def _access(runner: engine.CompiledRunner | None, bufs: list[Buffer]) -> tuple[set[int], set[int]]:
  """The base buffers (ids) one captured call reads and writes; a copy (runner None) writes bufs[0] from bufs[1]."""
  if runner is None: return {id(bufs[1].base)}, {id(bufs[0].base)}
  spec = runner.spec
  reads = {id(b.base) for b, slot in zip(bufs, spec.globals) if slot in spec.ins}
  return reads, {id(b.base) for b, slot in zip(bufs, spec.globals) if slot in spec.outs}

def _prune(captured: Captured, in_bufs: list[Buffer]) -> Captured:
  """The calls a replay must run: those reading an input, a buffer some call writes after (or while) reading it
  (state carried from one replay to the next: weights an optimizer updates, the RNG counter), or a buffer such a call
  writes; and calls writing memory a kept call also writes (the memory planner may have shared it). The rest already
  ran during the capture and would compute the same values again."""
  access = [_access(runner, bufs) for runner, bufs, _ in captured]
  last_write = {b: i for i, (_, writes) in enumerate(access) for b in writes}
  carried = {b for i, (reads, _) in enumerate(access) for b in reads if last_write.get(b, -1) >= i}
  depends = {id(b.base) for b in in_bufs} | carried
  keep: set[int] = set()
  while True:
    kept_writes = set().union(*(access[i][1] for i in keep))
    new = {i for i, (reads, writes) in enumerate(access) if i not in keep and (reads & depends or writes & kept_writes)}
    if not new: break
    keep |= new
    depends |= set().union(*(access[i][1] for i in new))
  if DEBUG.value >= 1: sys.stderr.write(f"TinyJit prune: {len(captured)} -> {len(keep)} calls\n")
  return [call for i, call in enumerate(captured) if i in keep]

def _kept_packs(captured: Captured) -> tuple[Captured, Packs]:
  """(the other calls, the PACK calls into kept scratch buffers whose source and scratch no other call of the capture
  writes): a replay runs those only where `pack_is_fresh` says their copy is stale (the source, or the input swapped
  in for it, was written since), before the other calls."""
  writes = [_access(runner, bufs)[1] for runner, bufs, _ in captured]
  def kept(i: int) -> bool:
    runner, bufs, _ = captured[i]
    if runner is None or len(bufs) != 2 or not is_kept(bufs[0]): return False
    return not any(id(b.base) in w for j, w in enumerate(writes) if j != i for b in bufs)
  packs = {i for i in range(len(captured)) if kept(i)}
  return [c for i, c in enumerate(captured) if i not in packs], \
    [(r, bufs, vv) for i, (r, bufs, vv) in enumerate(captured) if i in packs and r is not None]

def _device_graph(captured: Captured, in_bufs: list[Buffer]) -> Callable[..., Any] | None:
  """The device's graph runner for this capture, or None to replay call by call (copies, several devices, no graph)."""
  runners = [runner for runner, _, _ in captured if runner is not None]
  if not runners or len(runners) != len(captured) or len({runner.device for runner in runners}) != 1: return None
  from ember.device import Device
  graph = Device[runners[0].device].graph
  return graph(captured, in_bufs) if graph is not None else None

def _buf(t: Any) -> Buffer: return buffer_of(t.uop)

def _bound_variable(u: UOp) -> bool:
  """A Variable bound to a constant (`Variable("n", 1, 64).bind(5)`): what a replay reads its value from directly."""
  return u.op is _BIND and u.src[0].op is Ops.DEFINE_VAR and u.src[1].op is _CONST
