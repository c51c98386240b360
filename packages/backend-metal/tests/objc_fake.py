"""A recording stand-in for libobjc and libdispatch: it records every message that would be sent (receiver, selector,
argument values) after checking it against the prototype it was sent with. It computes nothing: messages that return
objects hand out fresh fake handles unless a test gives the answer."""
from __future__ import annotations
import ctypes
from typing import Any, Callable
from ember_metal.objc import MTLSize, NSRange

class RecordingLibObjC:
  """Implements `ObjCLibrary`. Classes and selectors get one stable handle per name (`names` maps them back)."""
  def __init__(self, answers: dict[str, Any] | None = None) -> None:
    self.answers = answers or {}
    self.names: dict[int, str] = {}
    self.handles: dict[str, int] = {}
    self.calls: list[tuple[int, str, tuple[Any, ...]]] = []
    self.pools: list[str] = []
    self.handle = 0x1000
  def _fresh(self) -> int:
    self.handle += 0x10
    return self.handle
  def _named(self, name: bytes) -> int:
    if (handle := self.handles.get(name.decode())) is None:
      handle = self.handles[name.decode()] = self._fresh()
      self.names[handle] = name.decode()
    return handle
  def get_class(self, name: bytes) -> int | None: return self._named(name)
  def register_selector(self, name: bytes) -> int: return self._named(name)
  def msg_send(self, restype: Any, argtypes: tuple[Any, ...]) -> Callable[..., Any]:
    def send(receiver: int, selector: int, *args: Any) -> Any:
      name = self.names[selector]
      assert len(args) == len(argtypes) and all(isinstance(a, t) for a, t in zip(args, argtypes)), (name, args)
      values: tuple[Any, ...] = tuple(self._value(a) for a in args)
      if name == "setBytes:length:atIndex:": values = (ctypes.string_at(args[0].value, args[1].value), *values[1:])
      if name == "useResources:count:usage:":  # the C array of ids the pointer points at
        values = (tuple((ctypes.c_void_p * args[1].value).from_address(args[0].value)), *values[1:])
      self.calls.append((receiver, name, values))
      if name in self.answers: return self.answers[name]
      return self._fresh() if restype is ctypes.c_void_p else None
    return send
  @staticmethod
  def _value(arg: Any) -> Any:
    if isinstance(arg, MTLSize): return (arg.width, arg.height, arg.depth)
    if isinstance(arg, NSRange): return (arg.location, arg.length)
    if isinstance(arg, ctypes._Pointer): return "out-pointer"  # an NSError** the callee may fill
    return arg.value if hasattr(arg, "value") else arg
  def pool_push(self) -> int | None:
    self.pools.append("push")
    return 7
  def pool_pop(self, token: int | None) -> None:
    assert token == 7
    self.pools.append("pop")
  def cls(self, name: str) -> int: return self.handles[name]

class RecordingDispatch:
  """Implements `DispatchLibrary`: records the bytes handed to dispatch_data_create and every release."""
  def __init__(self, handle: int | None = 0xDA7A) -> None:
    self.handle = handle
    self.calls: list[tuple[str, Any]] = []
  def data_create(self, data: bytes) -> int | None:
    self.calls.append(("dispatch_data_create", bytes(data)))
    return self.handle
  def release(self, handle: int) -> None: self.calls.append(("dispatch_release", handle))
