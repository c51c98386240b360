"""The Objective-C bridge: the Metal API driven through the Objective-C runtime with ctypes, no PyObjC (macOS only).

Every Objective-C call is `objc_msgSend` cast to the exact C prototype of that message (receiver, selector, then the
arguments' ctypes types, and the declared return type). That cast is required on Apple silicon, where
`objc_msgSend` must be called with the callee's real signature; `ObjC.send` derives it from ctypes values, so a
Python int can never be passed at the wrong width. libdispatch (`LibDispatch`) hands a precompiled metallib to
`newLibraryWithData:error:`. `MetalContext` bundles the bridge with the opened MTLDevice; the compiler, the programs
and the device all talk to Metal through it. Nothing here loads a native library until a class is instantiated.
"""
from __future__ import annotations
import contextlib
import ctypes
from typing import Any, Callable, Iterator, Protocol
from ember.plugin import DeviceError

LIBOBJC = "/usr/lib/libobjc.A.dylib"
# dispatch_data_create and dispatch_release live in libdispatch, part of libSystem
LIBDISPATCH = "/usr/lib/libSystem.B.dylib"
NSUInteger = ctypes.c_uint64  # `unsigned long` on 64-bit macOS
NSInteger = ctypes.c_int64

class MTLSize(ctypes.Structure):
  _fields_ = [("width", NSUInteger), ("height", NSUInteger), ("depth", NSUInteger)]

class NSRange(ctypes.Structure):
  _fields_ = [("location", NSUInteger), ("length", NSUInteger)]

# ** the Objective-C runtime **

class ObjCLibrary(Protocol):
  """What `ObjC` needs from libobjc (the tests substitute a recording fake for it)."""
  def get_class(self, name: bytes) -> int | None: ...
  def register_selector(self, name: bytes) -> int: ...
  def msg_send(self, restype: Any, argtypes: tuple[Any, ...]) -> Callable[..., Any]: ...
  def pool_push(self) -> int | None: ...
  def pool_pop(self, token: int | None) -> None: ...

class LibObjC:
  """libobjc through ctypes."""
  def __init__(self, path: str = LIBOBJC) -> None:
    try: self.lib = ctypes.CDLL(path)
    except OSError as e: raise DeviceError(f"cannot load the Objective-C runtime {path}: {e}; Metal needs macOS") from e
    for fn, restype, argtypes in (("objc_getClass", ctypes.c_void_p, [ctypes.c_char_p]),
                                  ("sel_registerName", ctypes.c_void_p, [ctypes.c_char_p]),
                                  ("objc_autoreleasePoolPush", ctypes.c_void_p, []),
                                  ("objc_autoreleasePoolPop", None, [ctypes.c_void_p])):
      getattr(self.lib, fn).restype, getattr(self.lib, fn).argtypes = restype, argtypes
    self.msg_send_address: int = ctypes.cast(self.lib.objc_msgSend, ctypes.c_void_p).value or 0
    self.prototypes: dict[tuple[Any, tuple[Any, ...]], Callable[..., Any]] = {}
  def get_class(self, name: bytes) -> int | None: return self.lib.objc_getClass(name)
  def register_selector(self, name: bytes) -> int: return self.lib.sel_registerName(name)
  def msg_send(self, restype: Any, argtypes: tuple[Any, ...]) -> Callable[..., Any]:
    """objc_msgSend as a C function of exactly this prototype (one per signature, kept for the process)."""
    if (fn := self.prototypes.get((restype, argtypes))) is None:
      fn = ctypes.CFUNCTYPE(restype, ctypes.c_void_p, ctypes.c_void_p, *argtypes)(self.msg_send_address)
      self.prototypes[(restype, argtypes)] = fn
    return fn
  def pool_push(self) -> int | None: return self.lib.objc_autoreleasePoolPush()
  def pool_pop(self, token: int | None) -> None: self.lib.objc_autoreleasePoolPop(token)

def ctype_of(value: Any) -> Any:
  """The C type a message argument is passed as: the ctypes type of the value (Python ints are refused, they have
  no width)."""
  if isinstance(value, (ctypes._SimpleCData, ctypes.Structure, ctypes._Pointer)): return type(value)
  raise TypeError(f"Objective-C arguments must be ctypes values (c_void_p, NSUInteger, MTLSize, pointer), "
                  f"got {type(value).__name__} {value!r}")

class ObjC:
  """Classes, selectors and typed messages."""
  def __init__(self, lib: ObjCLibrary) -> None:
    self.lib = lib
    self.selectors: dict[str, int] = {}
  def cls(self, name: str) -> int:
    if not (handle := self.lib.get_class(name.encode())):
      raise DeviceError(f"the Objective-C class {name} does not exist; is Metal.framework loaded (macOS 11+)?")
    return handle
  def sel(self, name: str) -> int:
    if (handle := self.selectors.get(name)) is None:
      handle = self.selectors[name] = self.lib.register_selector(name.encode())
    return handle
  def send(self, receiver: int | None, selector: str, *args: Any, restype: Any = ctypes.c_void_p) -> Any:
    """`[receiver selector:args...]`, with the C prototype taken from `restype` and the ctypes types of `args`."""
    if selector.count(":") != len(args):
      raise TypeError(f"selector {selector} takes {selector.count(':')} arguments, got {len(args)}")
    if not receiver: raise DeviceError(f"message {selector} sent to nil: an earlier Metal call failed")
    argtypes = tuple(ctype_of(a) for a in args)
    return self.lib.msg_send(restype, argtypes)(receiver, self.sel(selector), *args)
  @contextlib.contextmanager
  def autorelease_pool(self) -> Iterator[None]:
    """Objects returned autoreleased (strings, command encoders) are freed when the block ends."""
    token = self.lib.pool_push()
    try: yield
    finally: self.lib.pool_pop(token)
  def string(self, text: str) -> ctypes.c_void_p:
    """An autoreleased NSString (use inside `autorelease_pool`)."""
    return ctypes.c_void_p(self.send(self.cls("NSString"), "stringWithUTF8String:", ctypes.c_char_p(text.encode())))
  def text(self, nsstring: int | None) -> str:
    raw = self.send(nsstring, "UTF8String", restype=ctypes.c_char_p)
    return raw.decode(errors="replace") if raw is not None else ""
  def error_text(self, error: ctypes.c_void_p) -> str:
    """The localizedDescription of an NSError out-parameter."""
    return self.text(self.send(error.value, "localizedDescription")) if error.value else "no NSError was returned"

# ** libdispatch **

class DispatchLibrary(Protocol):
  """What loading a metallib needs from libdispatch (the tests substitute a recording fake)."""
  def data_create(self, data: bytes) -> int | None: ...
  def release(self, handle: int) -> None: ...

class LibDispatch:
  """libdispatch through ctypes: `newLibraryWithData:error:` takes the metallib as a dispatch_data_t."""
  def __init__(self, path: str = LIBDISPATCH) -> None:
    try: self.lib = ctypes.CDLL(path)
    except OSError as e: raise DeviceError(f"cannot load libdispatch from {path}: {e}; Metal needs macOS") from e
    self.lib.dispatch_data_create.restype = ctypes.c_void_p
    self.lib.dispatch_data_create.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    self.lib.dispatch_release.restype, self.lib.dispatch_release.argtypes = None, [ctypes.c_void_p]
  def data_create(self, data: bytes) -> int | None:
    # queue and destructor NULL: DISPATCH_DATA_DESTRUCTOR_DEFAULT, dispatch copies the bytes before returning
    return self.lib.dispatch_data_create(ctypes.c_char_p(data), len(data), None, None)
  def release(self, handle: int) -> None: self.lib.dispatch_release(handle)

class MetalContext:
  """The Objective-C runtime, libdispatch and the MTLDevice, shared by the device, its compiler and programs."""
  def __init__(self, objc: ObjC, device: int, dispatch: DispatchLibrary) -> None:
    self.objc, self.device, self.dispatch = objc, device, dispatch
