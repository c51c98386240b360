"""`@ember.function`: a Python function of Tensors traced once per input signature into one reusable graph.

The first call with a given signature (the shapes, dtypes and devices of the Tensor arguments, and the other arguments'
values) runs the body on placeholder tensors: the traced graph over those placeholders is kept. Every later call with
that signature substitutes its arguments for the placeholders; the body does not run again. The result is lazy and
composes with the code around it (including other functions, and autograd: gradients flow through the substituted
graph to the arguments and to tensors the body reads from outside, such as a layer's weights).

`precompile=True` also schedules the traced graph once: calls whose arguments need no gradient run that schedule with
their arguments' buffers swapped in (like a TinyJit replay, but per signature and usable anywhere) and return realized
tensors over fresh buffers. Calls that need gradients, and calls inside another function's trace, take the lazy path.
"""
from __future__ import annotations
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar, overload
from ember.device.base import Buffer
from ember.dtype import dtypes, strong_dtype
from ember.errors import EmberError
from ember.schedule import ScheduleItem, buffer_of
import ember.schedule as scheduler
from ember.tensor import Tensor, all_tensors, _is_contiguous_buffer, _value_dtype
from ember.uop.ops import Ops, UOp, int_shape

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

@dataclass
class _Trace:
  """One signature's traced graph: the placeholders' uops (in argument order) and the outputs over them."""
  params: list[UOp]
  outs: list[UOp]
  single: bool                # the body returned one Tensor (not a tuple)
  grad_inside: bool           # the graph reads tensors outside the arguments that require grad (a layer's weights)
  # state the body updates (a BatchNorm's running statistics, an RNG counter): each such tensor and its new graph, set
  # again (over the call's arguments) by every call
  effects: list[tuple[Tensor, UOp]] = field(default_factory=list)
  compiled: list[ScheduleItem] | None = None
  param_bufs: list[Buffer] = field(default_factory=list)
  out_bufs: list[Buffer] = field(default_factory=list)
  lazy_only: bool = False     # outputs that are no kernels' results (a constant, an argument): nothing to precompile

  def mapping(self, tensors: list[Tensor]) -> dict[UOp, UOp]:
    out: dict[UOp, UOp] = {}
    for p, t in zip(self.params, tensors):
      value = t.uop if t.dtype is p.dtype else t.cast(_value_dtype(p)).uop  # weak-dtyped arguments trace at their width
      out[p] = value
      if p.op is not Ops.BUFFER:  # the placeholder's buffer itself, where an op reached under its reshape
        out[p.base] = UOp(Ops.RESHAPE, value.dtype, (value,), (p.base.arg.size,))
    return out

  def lazy(self, tensors: list[Tensor]) -> tuple[Tensor, ...]:
    sink = UOp(Ops.SINK, src=(*self.outs, *(u for _, u in self.effects))).substitute(self.mapping(tensors))
    for (t, _), u in zip(self.effects, sink.src[len(self.outs):]):
      if not _tracing[0] and not _is_contiguous_buffer(t.uop): t.realize()  # the last call's update lands first
      t.uop = u
    return tuple(Tensor(u) for u in sink.src[:len(self.outs)])

  def compile(self) -> None:
    if self.effects or any(_is_contiguous_buffer(o) or o.base.op is Ops.CONST or o in self.params for o in self.outs):
      self.lazy_only = True
      return
    targets = [Tensor(o).cast(strong_dtype(_value_dtype(o))).contiguous().uop if o.dtype.weak else o for o in self.outs]
    items, becomes = scheduler.create_schedule(targets)
    self.param_bufs = [buffer_of(p.base) for p in self.params]
    self.out_bufs = [buffer_of(becomes[t]) for t in targets]
    self.compiled = items

  def run(self, tensors: list[Tensor]) -> tuple[Tensor, ...]:
    from ember.engine.realize import run_schedule
    assert self.compiled is not None
    args = [(t if t.dtype is p.dtype else t.cast(_value_dtype(p))).buffer() for p, t in zip(self.params, tensors)]
    by_id: dict[int, Buffer] = {}  # an output returned twice is one buffer
    fresh = [by_id.setdefault(id(b), Buffer(b.device, b.size, b.dtype)) for b in self.out_bufs]
    swap = {id(b): a for b, a in zip(self.param_bufs, args)} | {id(b): n for b, n in zip(self.out_bufs, fresh)}
    run_schedule([ScheduleItem(it.kind, it.device, [swap.get(id(b), b) for b in it.bufs], it.ast, it.var_vals,
                               it.packed) for it in self.compiled])
    return tuple(_over(buf, o) for buf, o in zip(fresh, self.outs))

def _over(buf: Buffer, out: UOp) -> Tensor:
  t = Tensor.from_buffer(buf, int_shape(out.shape, "ember.function"))
  return t.cast(_value_dtype(out)) if out.dtype.weak else t

class Function:
  """A traced-once function of Tensors; see the module docstring. Make one with `@ember.function`."""
  def __init__(self, fxn: Callable[..., Any], precompile: bool = False, precompile_backward: bool = False,
               allow_implicit: bool = True):
    self.fxn, self.precompile, self.allow_implicit = fxn, precompile, allow_implicit
    # the backward of a call is the gradient of the traced graph, differentiated with the graph around the call
    self.precompile_backward = precompile_backward
    self.traces: dict[tuple[Any, ...], _Trace] = {}
    functools.update_wrapper(self, fxn)

  def __get__(self, obj: Any, objtype: Any = None) -> Any:
    """As a method (`@function def __call__(self, x)`): bound to the instance, which is part of the signature."""
    return self if obj is None else functools.partial(self.__call__, obj)

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    sig = _signature(args, kwargs)
    tensors = [a for a in (*args, *(kwargs[k] for k in sorted(kwargs))) if isinstance(a, Tensor)]
    if (trace := self.traces.get(sig)) is None:
      trace = self.traces[sig] = self._trace(args, kwargs)
      # the trace ran over placeholders: this call's outputs (and state updates) are the graph over its arguments
      return _result(trace.lazy(tensors), trace.single)
    needs_grad = trace.grad_inside or any(t.requires_grad for t in tensors)
    if self.precompile and not needs_grad and not _tracing[0]:
      if trace.compiled is None and not trace.lazy_only: trace.compile()
      if not trace.lazy_only: return _result(trace.run(tensors), trace.single)
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
    grad_inside = any(t.requires_grad and t.uop in graph for t in list(all_tensors))
    # tensors from outside whose value the body changed (assign): replayed by every call, this one's included
    effects = [(t, t.uop) for t in list(all_tensors) if t.uop.op is Ops.ASSIGN and id(t) in before
               and before[id(t)][0] is t and before[id(t)][1] is not t.uop]
    for t, _ in effects: t.uop = before[id(t)][1]  # undone: the trace's update is over placeholders, not the arguments
    return _Trace([p if p.op is not Ops.CAST else p.src[0] for p in params], [o.uop for o in outs], single,
                  grad_inside, effects=effects)

def _result(outs: tuple[Tensor, ...], single: bool) -> Any: return outs[0] if single else outs

@overload
def function(fxn: F, *, precompile: bool = False, precompile_backward: bool = False,
             allow_implicit: bool = True) -> F: ...
@overload
def function(fxn: None = None, *, precompile: bool = False, precompile_backward: bool = False,
             allow_implicit: bool = True) -> Callable[[F], F]: ...
def function(fxn: Any = None, *, precompile: bool = False, precompile_backward: bool = False,
             allow_implicit: bool = True) -> Any:
  """Trace a function of Tensors once per input signature (see the module docstring); `@function` and
  `@function(precompile=True)` both work.

  >>> calls = []
  >>> @function
  ... def double(x):
  ...   calls.append(1)
  ...   return x * 2
  >>> [double(Tensor([1, 2])).tolist() for _ in range(3)], len(calls)
  ([[2, 4], [2, 4], [2, 4]], 1)
  """
  def wrap(f: Any) -> Any: return Function(f, precompile, precompile_backward, allow_implicit)
  return wrap if fxn is None else wrap(fxn)
