"""`@ember.function`: a Python function of Tensors traced once per input signature into one reusable graph.

The first call with a given signature (the shapes, dtypes and devices of the Tensor arguments, and the other arguments'
values) runs the body on placeholder tensors: the traced graph over those placeholders is kept. Every later call with
that signature substitutes its arguments for the placeholders; the body does not run again. The result is lazy and
composes with the code around it (including other functions, and autograd: gradients flow through the substituted
graph to the arguments and to tensors the body reads from outside, such as a layer's weights).

`precompile=True` also schedules the traced graph once: later calls run that schedule with their arguments' buffers
swapped in (like a TinyJit replay, but per signature and usable anywhere) and return realized tensors over fresh
buffers. When a call's arguments, or tensors the body reads from outside, require grad, each replayed output carries
its gradient as a function (`ember.gradient.custom_gradient`): the gradient of the traced graph, traced once per
signature, over the arguments, the output's gradient and the forward outputs (read from their buffers, not
recomputed). `precompile_backward=True` schedules that backward once too and replays it; without it the backward is
a lazy graph scheduled with the rest of the backward pass. State the body assigns is written in place by each replay.
Calls inside another function's trace take the lazy path.
"""
from __future__ import annotations
import functools
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar, overload
from ember.device.base import Buffer
from ember.dtype import DType, dtypes, strong_dtype
from ember.errors import EmberError
from ember.gradient import compute_gradient, custom_gradient
from ember.schedule import ScheduleItem, buffer_of
import ember.schedule as scheduler
from ember.tensor import Tensor, all_tensors, _is_contiguous_buffer, _rng_states, _value_dtype
from ember.uop.ops import GroupOp, Ops, UOp, int_shape

F = TypeVar("F", bound=Callable[..., Any])

class FunctionError(EmberError, TypeError):
  """An `ember.function` was given or returned something it cannot trace: the body must return a Tensor or a tuple of
  Tensors, and the arguments that are not Tensors must be hashable (they are part of the signature)."""

_tracing = [0]  # bodies being traced now: a precompiled call inside one composes lazily

def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
  def key(a: Any) -> Any:
    if isinstance(a, Tensor):
      if a.sharding is not None:
        raise FunctionError("ember.function takes single-device tensors; gather a sharded one with .to(device)")
      return ("Tensor", a.shape, a.dtype, a.device)
    try: hash(a)
    except TypeError as e:
      raise FunctionError(f"ember.function: argument {a!r} is neither a Tensor nor hashable; non-Tensor arguments "
                          "are part of the signature a trace is cached under") from e
    return ("value", type(a), a)
  # the modes a body may read: training (Dropout, BatchNorm) and the default dtypes
  modes = (Tensor.is_training(), dtypes.default_float, dtypes.default_int)
  return (modes, *(key(a) for a in args), *((k, key(v)) for k, v in sorted(kwargs.items())))

def _placeholder(like: UOp, dtype: DType) -> UOp:
  """A buffer standing for a value of `like`'s shape and device that a replay passes in (at `dtype`'s strong width)."""
  return Tensor.empty(*like.shape, dtype=strong_dtype(dtype), device=str(like.device)).uop

def _no_kernel(o: UOp) -> bool:
  """No kernel computes `o`: a constant, a placeholder, a captured buffer or a view or cast of one. A replay returns
  it lazily over the call's values (the code that reads it fuses it)."""
  return all(n.op in GroupOp.Movement or n.op in (Ops.BUFFER, Ops.CONST, Ops.DEVICE, Ops.CAST) for n in o.toposort())

def _mapping(params: Sequence[UOp], values: Sequence[Tensor]) -> dict[UOp, UOp]:
  out: dict[UOp, UOp] = {}
  for p, t in zip(params, values):
    value = t.uop if t.dtype is p.dtype else t.cast(_value_dtype(p)).uop  # weak-dtyped values trace at their width
    out[p] = value
    if p.op is not Ops.BUFFER:  # the placeholder's buffer itself, where an op reached under its reshape
      out[p.base] = UOp(Ops.RESHAPE, value.dtype, (value,), (p.base.arg.size,))
  return out

class _Replay:
  """A graph over placeholders (`params`), scheduled once; `run` replays the schedule with the buffers of other values
  in the placeholders' places and returns the outputs over fresh buffers (outputs no kernel computes: lazily). The
  `writes` (assigns into buffers from outside, a BatchNorm's running statistics) write those same buffers each run."""
  def __init__(self, params: list[UOp], outs: list[UOp], writes: Sequence[UOp] = ()):
    self.params, self.outs = params, outs
    self.kernel_outs = [i for i, o in enumerate(outs) if not _no_kernel(o)]
    targets = [Tensor(o).cast(strong_dtype(_value_dtype(o))).contiguous().uop if o.dtype.weak else o
               for o in (outs[i] for i in self.kernel_outs)]
    items, becomes = scheduler.create_schedule([*targets, *writes]) if targets or writes else ([], {})
    self.items: list[ScheduleItem] = items
    self.param_bufs = [buffer_of(p.base) for p in params]
    self.out_bufs = [buffer_of(becomes[t]) for t in targets]

  def run(self, values: Sequence[Tensor]) -> list[Tensor]:
    from ember.engine.realize import run_schedule
    read = {b for it in self.items for b in map(id, it.bufs)}
    args = [(t if t.dtype is p.dtype else t.cast(_value_dtype(p))).buffer() if id(pb) in read else pb
            for p, t, pb in zip(self.params, values, self.param_bufs)]
    by_id: dict[int, Buffer] = {}  # an output returned twice is one buffer
    fresh = [by_id.setdefault(id(b), Buffer(b.device, b.size, b.dtype)) for b in self.out_bufs]
    swap = {id(b): a for b, a in zip(self.param_bufs, args)} | {id(b): n for b, n in zip(self.out_bufs, fresh)}
    run_schedule([ScheduleItem(it.kind, it.device, [swap.get(id(b), b) for b in it.bufs], it.ast, it.var_vals,
                               it.packed) for it in self.items])
    computed = dict(zip(self.kernel_outs, fresh))
    return [_over(computed[i], o) if i in computed else _lazy(o, self.params, values) for i, o in enumerate(self.outs)]

def _lazy(out: UOp, params: Sequence[UOp], values: Sequence[Tensor]) -> Tensor:
  return Tensor(out.substitute(_mapping(params, values)))

def _over(buf: Buffer, out: UOp) -> Tensor:
  t = Tensor.from_buffer(buf, int_shape(out.shape, "ember.function"))
  return t.cast(_value_dtype(out)) if out.dtype.weak else t

@dataclass
class _Backward:
  """The gradient of one output of a trace, over placeholders: the arguments', the output's gradient's and the forward
  outputs' (so what the forward computed is read, not recomputed). One gradient (or None) per argument, then per
  tensor read from outside that requires grad."""
  params: list[UOp]
  grads: list[UOp | None]
  replay: _Replay | None = None

  def __call__(self, values: list[Tensor], precompile: bool) -> list[Tensor | None]:
    todo = [g for g in self.grads if g is not None]
    if precompile and not _tracing[0] and todo:
      if self.replay is None: self.replay = _Replay(self.params, todo)
      done = iter(self.replay.run(values))
    else: done = iter(_lazy(g, self.params, values) for g in todo)
    return [None if g is None else next(done) for g in self.grads]

@dataclass
class _Trace:
  """One signature's traced graph: the placeholders' uops (in argument order) and the outputs over them."""
  params: list[UOp]
  outs: list[UOp]
  single: bool                # the body returned one Tensor (not a tuple)
  # state the body updates (a BatchNorm's running statistics, an RNG counter): each such tensor and its new graph, set
  # again (over the call's arguments) by every call
  effects: list[tuple[Tensor, UOp]] = field(default_factory=list)
  replay: _Replay | None = None
  backwards: dict[tuple[Any, ...], _Backward] = field(default_factory=dict)
  nodes: set[UOp] = field(default_factory=set)  # the graph's nodes: where tensors read from outside are found

  def lazy(self, tensors: list[Tensor]) -> tuple[Tensor, ...]:
    sink = UOp(Ops.SINK, src=(*self.outs, *(u for _, u in self.effects))).substitute(_mapping(self.params, tensors))
    for (t, _), u in zip(self.effects, sink.src[len(self.outs):]):
      if not _tracing[0] and not _is_contiguous_buffer(t.uop): t.realize()  # the last call's update lands first
      t.uop = u
    return tuple(Tensor(u) for u in sink.src[:len(self.outs)])

  def run(self, tensors: list[Tensor], implicit: list[Tensor] | None, precompile_backward: bool) -> tuple[Tensor, ...]:
    """The replayed outputs. Differentiable (`implicit` not None: the tensors read from outside that require grad),
    each output a kernel computed carries its gradient as a function of its own (the traced graph's gradient)."""
    if self.replay is None: self.replay = _Replay(self.params, self.outs, [u for _, u in self.effects])
    if implicit is None: return tuple(self.replay.run(tensors))
    # a lazy argument is computed into a buffer of its own and stays lazy: realized in place, it would lose the graph
    # autograd goes through to what it was computed from
    values = [t if _is_contiguous_buffer(t.uop) and t.dtype is p.dtype
              else Tensor(t.uop).cast(_value_dtype(p)).contiguous().realize() for p, t in zip(self.params, tensors)]
    outs = self.replay.run(values)
    inputs = (*tensors, *implicit)
    forward = [outs[self.outs.index(o)] for o in self._stored()]
    def grad_of(i: int) -> Callable[..., list[Tensor | None]]:
      def backward(g: Tensor, *_: Tensor) -> list[Tensor | None]:
        bwd = self.backward(i, strong_dtype(g.dtype), tuple(t.uop for t in implicit))
        return bwd([*values, g, *forward], precompile_backward)
      return backward
    return tuple(custom_gradient(o, inputs, grad_of(i)) if i in self.replay.kernel_outs else o
                 for i, o in enumerate(outs))

  def updates_in_place(self) -> bool:
    """Whether a replay can update the state the body assigns: each such tensor is (once its last lazy update and
    the reads of its old value ran) the very buffer the trace assigned into."""
    if not self.effects: return True
    states = [t for t, _ in self.effects]
    for t in states:
      if not _is_contiguous_buffer(t.uop): t.realize()
    if pending := Tensor.pending_readers(*states): Tensor.realize(*pending)
    return all(t.uop is u.src[0] for t, u in self.effects)

  def _stored(self) -> list[UOp]:
    """The outputs a replay stores in buffers of their own dtype (each once): what a backward reads instead of
    computing again."""
    assert self.replay is not None
    return list(dict.fromkeys(o for o in (self.outs[k] for k in self.replay.kernel_outs) if not o.dtype.weak))

  def backward(self, i: int, grad_dtype: DType, implicit: tuple[UOp, ...]) -> _Backward:
    key = (i, grad_dtype, implicit)
    if (bwd := self.backwards.get(key)) is not None: return bwd
    assert self.replay is not None
    out = self.outs[i]
    grad = _placeholder(out, grad_dtype)
    forward = {o: _placeholder(o, _value_dtype(o)) for o in self._stored()}
    targets = [*self.params, *implicit]
    got = compute_gradient(out, grad, set(targets))
    def cast(g: UOp | None, t: UOp) -> UOp | None:
      if g is None or not dtypes.is_float(dt := _value_dtype(t)): return None
      return g if g.dtype is dt else Tensor(g).cast(dt).uop
    grads = [cast(got.get(t), t) for t in targets]
    # the forward outputs are read from the call's buffers (their placeholders), not recomputed
    subbed = iter(UOp(Ops.SINK, src=tuple(g for g in grads if g is not None)).substitute(forward).src)
    bwd = self.backwards[key] = _Backward([*self.params, grad, *forward.values()],
                                          [None if g is None else next(subbed) for g in grads])
    return bwd

def _result(outs: tuple[Tensor, ...], single: bool) -> Any: return outs[0] if single else outs

def _grad_reads(trace: _Trace, tensors: list[Tensor]) -> list[Tensor] | None:
  """None when no gradient can flow through this call; else the tensors the body reads from outside that require grad
  now (an optimizer may set it after the trace). A gradient flows when one of those exists or an argument's graph
  reaches a tensor that requires grad (`a * 2` for a trainable `a`, another function's output)."""
  leaves = {t.uop: t for t in list(all_tensors) if t.requires_grad}
  if not leaves: return None
  params = set(trace.params)
  implicit = [t for u, t in leaves.items() if u in trace.nodes and u not in params]
  if implicit or any(u in leaves for t in tensors for u in t.uop.toposort()): return implicit
  return None

class _Traces:
  """A function's traces by signature, out of sight of code that walks objects' attributes for their tensors (a
  model's state dict would otherwise list the state a trace updates, an RNG state included)."""
  __slots__ = ("by_signature",)
  def __init__(self) -> None: self.by_signature: dict[tuple[Any, ...], _Trace] = {}

class Function:
  """A traced-once function of Tensors; see the module docstring. Make one with `@ember.function`."""
  def __init__(self, fxn: Callable[..., Any], precompile: bool = False, precompile_backward: bool = False,
               allow_implicit: bool = True):
    self.fxn, self.precompile, self.allow_implicit = fxn, precompile, allow_implicit
    self.precompile_backward = precompile_backward  # the backward of a precompiled call is replayed too
    self._traces = _Traces()
    self._by_instance: dict[int, _Traces] = {}  # a method's traces per live instance (see __get__)
    functools.update_wrapper(self, fxn)

  @property
  def traces(self) -> dict[tuple[Any, ...], _Trace]:
    """The traces by signature (one per shapes, dtypes, devices and other arguments seen)."""
    return self._traces.by_signature

  def __get__(self, obj: Any, objtype: Any = None) -> Any:
    """As a method (`@function def __call__(self, x)`): bound to the instance, whose traces are its own and go
    with it (an instance that cannot be weakly referenced is part of the signature of the function's traces)."""
    return self if obj is None else BoundFunction(self, obj)

  def _instance_traces(self, obj: Any) -> _Traces | None:
    if (t := self._by_instance.get(key := id(obj))) is not None: return t
    try: weakref.finalize(obj, self._by_instance.pop, key, None)
    except TypeError: return None
    t = self._by_instance[key] = _Traces()
    return t

  def __call__(self, *args: Any, **kwargs: Any) -> Any: return self._call(self._traces, args, kwargs, args)

  def _call(self, traces: _Traces, args: tuple[Any, ...], kwargs: dict[str, Any], keyed: tuple[Any, ...]) -> Any:
    sig = _signature(keyed, kwargs)
    tensors = [a for a in (*args, *(kwargs[k] for k in sorted(kwargs))) if isinstance(a, Tensor)]
    if (trace := traces.by_signature.get(sig)) is None:
      trace = traces.by_signature[sig] = self._trace(args, kwargs)
      # the trace ran over placeholders: this call's outputs (and state updates) are the graph over its arguments
      return _result(trace.lazy(tensors), trace.single)
    if self.precompile and not _tracing[0] and trace.updates_in_place():
      return _result(trace.run(tensors, _grad_reads(trace, tensors), self.precompile_backward), trace.single)
    return _result(trace.lazy(tensors), trace.single)

  def _trace(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Trace:
    def placeholder(a: Any) -> Any:
      if not isinstance(a, Tensor): return a
      return Tensor.empty(*a.shape, dtype=strong_dtype(a.dtype), device=a.device).cast(a.dtype)
    targs = tuple(placeholder(a) for a in args)
    tkwargs = {k: placeholder(v) for k, v in kwargs.items()}
    params = [t.uop for t in (*targs, *(tkwargs[k] for k in sorted(tkwargs))) if isinstance(t, Tensor)]
    before = {id(t): (t, t.uop) for t in list(all_tensors)}  # (holding each tensor: no id is reused meanwhile)
    _tracing[0] += 1
    try: ret = self.fxn(*targs, **tkwargs)
    finally: _tracing[0] -= 1
    single = isinstance(ret, Tensor)
    outs = (ret,) if single else ret
    if not isinstance(outs, tuple) or not outs or not all(isinstance(o, Tensor) for o in outs):
      raise FunctionError(f"function {getattr(self.fxn, '__qualname__', self.fxn)!r} returned {type(ret).__name__}; "
                          "a function must return a Tensor or a tuple of Tensors")
    graph = UOp(Ops.SINK, src=tuple(o.uop for o in outs)).toposort()
    own = {p.base for p in params}
    if not self.allow_implicit and (implicit := [b for b in graph if b.op is Ops.BUFFER and b not in own]):
      raise FunctionError(f"function {getattr(self.fxn, '__qualname__', self.fxn)!r} reads {len(implicit)} tensors "
                          "that are not its arguments; pass them as arguments, or allow_implicit=True")
    # tensors from outside whose value the body changed (assign), and the RNG states its random draws advanced (one
    # made by the body's first draw too): replayed by every call, this one's included
    rng = {id(t) for t in _rng_states.values()}
    effects = [(t, t.uop) for t in list(all_tensors) if t.uop.op is Ops.ASSIGN and (id(t) in rng or id(t) in before
               and before[id(t)][0] is t and before[id(t)][1] is not t.uop)]
    for t, u in effects:  # undone: the trace's update is over placeholders, not the arguments
      t.uop = before[id(t)][1] if id(t) in before else u.src[0]
    return _Trace([p if p.op is not Ops.CAST else p.src[0] for p in params], [o.uop for o in outs], single,
                  effects=effects, nodes=set(graph))

class BoundFunction:
  """A `Function` used as a method of one instance: calls pass the instance first; `traces` are this instance's."""
  __slots__ = ("function", "instance")
  def __init__(self, function: Function, instance: Any): self.function, self.instance = function, instance
  @property
  def traces(self) -> dict[tuple[Any, ...], _Trace]:
    own = self.function._instance_traces(self.instance)
    return (own or self.function._traces).by_signature
  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    f, obj = self.function, self.instance
    own = f._instance_traces(obj)
    return f._call(own or f._traces, (obj, *args), kwargs, args if own is not None else (obj, *args))
  def __repr__(self) -> str:
    return f"<bound ember.function {getattr(self.function.fxn, '__qualname__', '?')} of {self.instance!r}>"

@overload
def function(fxn: F, *, precompile: bool = False, precompile_backward: bool = False,
             allow_implicit: bool = True) -> F: ...
@overload
def function(fxn: None = None, *, precompile: bool = False, precompile_backward: bool = False,
             allow_implicit: bool = True) -> Callable[[F], F]: ...
def function(fxn: Any = None, *, precompile: bool = False, precompile_backward: bool = False,
             allow_implicit: bool = True) -> Any:
  """Trace a function of Tensors once per input signature (see the module docstring); `@function` and
  `@function(precompile=True, precompile_backward=True)` both work.

  >>> calls = []
  >>> @function
  ... def double(x):
  ...   calls.append(1)
  ...   return x * 2
  >>> [double(Tensor([1, 2])).tolist() for _ in range(3)], len(calls)
  ([[2, 4], [2, 4], [2, 4]], 1)
  """
  if precompile_backward and not precompile:
    raise FunctionError("precompile_backward=True replays the backward of a precompiled call; "
                        "pass precompile=True as well")
  def wrap(f: Any) -> Any: return Function(f, precompile, precompile_backward, allow_implicit)
  return wrap if fxn is None else wrap(fxn)
