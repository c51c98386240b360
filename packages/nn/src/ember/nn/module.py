"""`Module`: torch.nn.Module's conveniences on ember's layers and on your own classes.

ember's layers are plain classes (tinygrad's style): a model is any object whose attributes, lists and dicts hold
Tensors, and `ember.nn.state.get_state_dict` finds them by walking it. `Module` keeps that (no registration, no
`__setattr__` hook) and adds the methods torch code calls on a model: `parameters()`, `named_parameters()`,
`buffers()`, `state_dict()`, `load_state_dict()`, `children()`, `modules()`, `apply()`, `train()`/`eval()`,
`zero_grad()`, `requires_grad_()` and `to()`. A subclass defines `forward` (called by `__call__`) or `__call__`.

Parameters are the tensors made by `Parameter(t)` (every layer weight is one), buffers those made by
`register_buffer` / the layers' running statistics; a tensor made neither way is a parameter unless its
`requires_grad` is False. So a frozen weight (`requires_grad_(False)`) stays a parameter, as in torch.

Training mode: `train()`/`eval()` set it on a module and every module below it, and Dropout, BatchNorm, the attention
and recurrent layers read it. A module neither was called on follows `Tensor.training` / `Context(TRAINING=1)`, as
tinygrad programs expect, so a fresh model is in eval mode unless training is switched on (torch's starts in training
mode: call `model.train()`).
"""
from __future__ import annotations
import weakref
from typing import Any, Callable, Iterator, NamedTuple, TypeVar
from ember import Tensor
from ember.dtype import DType, dtypes, to_dtype
from ember.errors import DTypeError
from ember.nn import state

M = TypeVar("M", bound="Module")

# by id, checked for identity: a WeakSet would compare tensors with ==, which is elementwise
_kinds: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
_is_param: dict[int, bool] = {}

def _mark(t: Tensor, param: bool) -> Tensor:
  _kinds[id(t)] = t
  _is_param[id(t)] = param
  weakref.finalize(t, _is_param.pop, id(t), None)
  return t

def Parameter(t: Tensor, requires_grad: bool = True) -> Tensor:
  """torch.nn.Parameter: `t` itself, marked a parameter (it stays one when frozen) and requiring grad."""
  return _mark(t.requires_grad_(requires_grad), True)

def Buffer(t: Tensor) -> Tensor:
  """A module's state that is not trained (running statistics): `t` itself, marked a buffer, requires_grad False."""
  return _mark(t.requires_grad_(False), False)

def is_parameter(t: Tensor) -> bool:
  """Marked by Parameter, else anything not marked a buffer whose requires_grad is not False."""
  if _kinds.get(id(t)) is t: return _is_param[id(t)]
  return t.requires_grad is not False

class IncompatibleKeys(NamedTuple):
  """What `load_state_dict(strict=False)` left out: the model's keys the dict lacks, the dict's keys the model lacks."""
  missing_keys: list[str]
  unexpected_keys: list[str]

def _submodules(obj: Any, prefix: str) -> Iterator[tuple[str, Module]]:
  """The nearest Modules below `obj` (through attributes, lists, tuples and dicts), with their dotted names."""
  if isinstance(obj, (list, tuple)) and not isinstance(obj, Module): items: Any = enumerate(obj)
  elif isinstance(obj, dict): items = obj.items()
  elif isinstance(obj, Module):
    items = enumerate(obj) if isinstance(obj, list) else vars(obj).items()
  else: return
  for k, v in items:
    name = f"{prefix}{k}"
    if isinstance(v, Module): yield name, v
    elif isinstance(v, (list, tuple, dict)): yield from _submodules(v, name + ".")

class Module:
  """Base class of ember's layers, with torch.nn.Module's methods (module docstring)."""
  def __call__(self, *args: Any, **kwargs: Any) -> Any: return self.forward(*args, **kwargs)
  def forward(self, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(f"{type(self).__name__} defines neither forward() nor __call__()")

  # ** training mode **
  @property
  def training(self) -> bool:
    """This module's mode: what train()/eval() set, else the global one (`Tensor.is_training()`)."""
    mode = self.__dict__.get("_training_mode")
    return Tensor.is_training() if mode is None else mode
  def train(self: M, mode: bool = True) -> M:
    for m in self.modules(): m.__dict__["_training_mode"] = bool(mode)
    return self
  def eval(self: M) -> M: return self.train(False)

  # ** tensors **
  def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
    """Every tensor (parameters and buffers) by its dotted path, as `ember.nn.state.get_state_dict`."""
    return state.get_state_dict(self, prefix)
  def load_state_dict(self, state_dict: dict[str, Tensor], strict: bool = True) -> IncompatibleKeys:
    """Load `state_dict` (torch's tensors converted to ember's, or `safe_load`'s); with strict=False the keys that did
    not match are returned instead of raised, as torch does. Shapes must match; values are cast to each tensor's
    dtype."""
    mine = self.state_dict()
    state.load_state_dict(self, state_dict, strict=strict, cast=True)
    return IncompatibleKeys([k for k in mine if k not in state_dict], [k for k in state_dict if k not in mine])
  def _named(self, prefix: str, want_params: bool) -> Iterator[tuple[str, Tensor]]:
    """Each module's own tensors, module by module in named_modules' order (torch's: a module's own before its
    children's), each tensor once."""
    rank = {name: i for i, (name, _) in enumerate(self.named_modules())}
    def owner(key: str) -> int:
      parts = key.split(".")
      return next(rank[o] for j in range(len(parts) - 1, -1, -1) if (o := ".".join(parts[:j])) in rank)
    seen: set[int] = set()
    for k, t in sorted(self.state_dict().items(), key=lambda kv: owner(kv[0])):
      if id(t) in seen or is_parameter(t) is not want_params: continue
      seen.add(id(t))
      yield prefix + k, t
  def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of each parameter once (a tied weight under its first name)."""
    for k, t in self._named(prefix, True):
      if recurse or "." not in k[len(prefix):]: yield k, t
  def parameters(self, recurse: bool = True) -> Iterator[Tensor]:
    for _, t in self.named_parameters(recurse=recurse): yield t
  def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
    for k, t in self._named(prefix, False):
      if recurse or "." not in k[len(prefix):]: yield k, t
  def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
    for _, t in self.named_buffers(recurse=recurse): yield t
  def register_buffer(self, name: str, tensor: Tensor | None) -> None:
    """torch's register_buffer: an attribute that is state but not a parameter."""
    setattr(self, name, Buffer(tensor) if tensor is not None else None)
  def register_parameter(self, name: str, tensor: Tensor | None) -> None:
    setattr(self, name, Parameter(tensor) if tensor is not None else None)

  # ** the module tree **
  def named_children(self) -> Iterator[tuple[str, Module]]:
    seen: set[int] = set()
    for k, m in _submodules(self, ""):
      if id(m) not in seen:
        seen.add(id(m))
        yield k, m
  def children(self) -> Iterator[Module]:
    for _, m in self.named_children(): yield m
  def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
    """This module and every one below it, each once, depth first (torch's order)."""
    seen: set[int] = set()
    def walk(m: Module, name: str) -> Iterator[tuple[str, Module]]:
      if id(m) in seen: return
      seen.add(id(m))
      yield name, m
      for k, c in m.named_children(): yield from walk(c, f"{name}.{k}" if name else k)
    yield from walk(self, prefix)
  def modules(self) -> Iterator[Module]:
    for _, m in self.named_modules(): yield m
  def apply(self: M, fn: Callable[[Module], Any]) -> M:
    """fn on every submodule, then on this one (torch's order: children first)."""
    for c in self.children(): c.apply(fn)
    fn(self)
    return self

  # ** in place on every tensor **
  def zero_grad(self, set_to_none: bool = True) -> None:
    for t in self.parameters():
      if set_to_none or t.grad is None: t.grad = None
      else: t.grad = t.grad.zeros_like()
  def requires_grad_(self: M, requires_grad: bool = True) -> M:
    for t in self.parameters(): t.requires_grad_(requires_grad)
    return self
  def to(self: M, device: str | DType | None = None, dtype: DType | str | None = None) -> M:
    """Move every tensor to `device` (in place: references to them see the move) and cast the float ones to `dtype`
    (`model.to("CPU")`, `model.to(dtypes.half)`, `model.to("CPU", dtypes.half)`)."""
    if isinstance(device, DType) or (isinstance(device, str) and _is_dtype_name(device)): device, dtype = None, device
    dt = to_dtype(dtype) if dtype is not None else None
    for t in state.get_parameters(self):
      if device is not None and t.device != device: t.to_(device)
      if dt is not None and dtypes.is_float(t.dtype) and t.dtype is not dt: t.replace(t.cast(dt).realize())
    return self

def _is_dtype_name(s: str) -> bool:
  """Whether `s` names a dtype ("half", "float32"), not a device ("CPU")."""
  try: to_dtype(s)
  except DTypeError: return False
  return True
