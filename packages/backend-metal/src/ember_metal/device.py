"""The Metal runtime (macOS only): the Metal API driven through the Objective-C runtime with ctypes, no PyObjC.

Every Objective-C call is `objc_msgSend` cast to the exact C prototype of that message (receiver, selector, then the
arguments' ctypes types, and the declared return type). That cast is required on Apple silicon, where
`objc_msgSend` must be called with the callee's real signature; `ObjC.send` derives it from ctypes values, so a
Python int can never be passed at the wrong width.

What the runtime does with Metal:

* device: `MTLCreateSystemDefaultDevice`, then `newCommandQueue`;
* memory: `newBufferWithLength:options:` with `MTLResourceStorageModeShared`: host and GPU share the pages, so
  `contents` is a zero-copy host view (numpy reads it through `Buffer.as_buffer`);
* compile: `MTLCompileOptions` with `setFastMathEnabled:NO`, `newLibraryWithSource:options:error:`,
  `newFunctionWithName:`, `newComputePipelineStateWithFunction:error:`;
* launch: `commandBuffer`, `computeCommandEncoder`, `setComputePipelineState:`, `setBuffer:offset:atIndex:` per buffer,
  `setBytes:length:atIndex:` per variable, `dispatchThreadgroups:threadsPerThreadgroup:`, `endEncoding`, `commit`;
* wait: `waitUntilCompleted`, `status` / `error`, and `GPUStartTime` / `GPUEndTime` for the kernel time.

On any other platform `probe()` says why Metal is unavailable and nothing here loads a native library.
"""
from __future__ import annotations
import contextlib
import ctypes
import functools
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol
from ember.plugin import BufferSpec, Compiled, CompileError, Compiler, DeviceError, LRUAllocator, Renderer

LIBOBJC = "/usr/lib/libobjc.A.dylib"
METAL_FRAMEWORK = "/System/Library/Frameworks/Metal.framework/Metal"
# MTLCreateSystemDefaultDevice returns nil in a process that has not linked CoreGraphics (a plain `python`)
COREGRAPHICS_FRAMEWORK = "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics"
MTL_RESOURCE_STORAGE_MODE_SHARED = 0
MTL_COMMAND_BUFFER_STATUS_ERROR = 5
NSUInteger = ctypes.c_uint64  # `unsigned long` on 64-bit macOS

class MTLSize(ctypes.Structure):
  _fields_ = [("width", NSUInteger), ("height", NSUInteger), ("depth", NSUInteger)]

def probe() -> tuple[bool, str]:
  """(usable, reason): whether this machine has a Metal GPU, without opening it."""
  if sys.platform != "darwin":
    return False, (f"Metal needs macOS (Metal.framework on Apple hardware); this platform is {sys.platform!r}. "
                   "Use DEV=CPU here, or run on a Mac")
  try:
    metal = ctypes.CDLL(METAL_FRAMEWORK)
    ctypes.CDLL(COREGRAPHICS_FRAMEWORK)
    objc = ObjC(LibObjC())
  except (OSError, DeviceError) as e:
    return False, f"cannot load Metal.framework or libobjc ({e}); Metal needs macOS 11 or later"
  metal.MTLCopyAllDevices.restype = ctypes.c_void_p
  devices = metal.MTLCopyAllDevices()
  if not devices: return False, "MTLCopyAllDevices returned nil: this Mac has no Metal device"
  try:
    count = objc.send(devices, "count", restype=NSUInteger)
    if count == 0: return False, "this Mac has no Metal device (MTLCopyAllDevices is empty)"
    with objc.autorelease_pool():
      name = objc.text(objc.send(objc.send(devices, "objectAtIndex:", NSUInteger(0)), "name"))
  finally: objc.send(devices, "release", restype=None)
  return True, f"{name} ({count} Metal device{'s' if count > 1 else ''})"

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

# ** kernels' calling convention **

_var_param = re.compile(r"constant (\w+)& \w+ \[\[buffer\((\d+)\)\]\]")

def kernel_var_widths(src: str, name: str) -> list[int]:
  """The byte width of each variable of kernel `name`, in argument order, read from its MSL signature (MetalRenderer
  prints `constant int& n [[buffer(k)]]`, `long` for int64)."""
  start = src.find(f"kernel void {name}(")
  if start < 0: raise DeviceError(f"the Metal source has no kernel named {name}; render it with MetalRenderer")
  signature = src[start:src.index(") {", start)]
  return [8 if ctype in ("long", "ulong") else 4 for ctype, _ in _var_param.findall(signature)]

def encode_launch(objc: ObjC, queue: int, pipeline: int, buffers: list[tuple[int, int]], vals: list[tuple[int, int]],
                  grid: tuple[int, int, int], local: tuple[int, int, int]) -> int:
  """Encode and commit one dispatch; return the retained command buffer. `buffers` are (MTLBuffer, offset) in slot
  order, `vals` are (value, byte width) bound right after them."""
  with objc.autorelease_pool():
    command_buffer = objc.send(objc.send(queue, "commandBuffer"), "retain")
    encoder = objc.send(command_buffer, "computeCommandEncoder")
    objc.send(encoder, "setComputePipelineState:", ctypes.c_void_p(pipeline), restype=None)
    for index, (handle, offset) in enumerate(buffers):
      objc.send(encoder, "setBuffer:offset:atIndex:", ctypes.c_void_p(handle), NSUInteger(offset), NSUInteger(index),
                restype=None)
    for index, (value, width) in enumerate(vals, start=len(buffers)):
      scalar = (ctypes.c_int64 if width == 8 else ctypes.c_int32)(value)  # setBytes copies it before returning
      objc.send(encoder, "setBytes:length:atIndex:", ctypes.cast(ctypes.pointer(scalar), ctypes.c_void_p),
                NSUInteger(width), NSUInteger(index), restype=None)
    objc.send(encoder, "dispatchThreadgroups:threadsPerThreadgroup:", MTLSize(*grid), MTLSize(*local), restype=None)
    objc.send(encoder, "endEncoding", restype=None)
    objc.send(command_buffer, "commit", restype=None)
  return command_buffer

def wait_command_buffer(objc: ObjC, command_buffer: int) -> float:
  """Block until the command buffer has run; release it; return its GPU time in seconds. A GPU fault is a
  DeviceError with Metal's description."""
  try:
    objc.send(command_buffer, "waitUntilCompleted", restype=None)
    if objc.send(command_buffer, "status", restype=NSUInteger) == MTL_COMMAND_BUFFER_STATUS_ERROR:
      with objc.autorelease_pool():
        reason = objc.error_text(ctypes.c_void_p(objc.send(command_buffer, "error")))
      raise DeviceError(f"a Metal command buffer failed: {reason}")
    return objc.send(command_buffer, "GPUEndTime", restype=ctypes.c_double) - \
      objc.send(command_buffer, "GPUStartTime", restype=ctypes.c_double)
  finally: objc.send(command_buffer, "release", restype=None)

def _three(size: tuple[int, ...] | list[int] | None) -> tuple[int, int, int]:
  dims = list(size or ()) + [1, 1, 1]
  return dims[0], dims[1], dims[2]

# ** the device **

def _numbered(src: str) -> str: return "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(src.splitlines()))

class MetalContext:
  """The loaded frameworks and the system default MTLDevice, shared by the device, its compiler and programs."""
  def __init__(self) -> None:
    usable, reason = probe()
    if not usable: raise DeviceError(f"METAL is unavailable: {reason}")
    metal = ctypes.CDLL(METAL_FRAMEWORK)
    metal.MTLCreateSystemDefaultDevice.restype = ctypes.c_void_p
    self.objc = ObjC(LibObjC())
    self.device: int = metal.MTLCreateSystemDefaultDevice()
    if not self.device: raise DeviceError("MTLCreateSystemDefaultDevice returned nil: no usable Metal GPU")
  def new_library(self, src: str) -> int:
    """Compile MSL with fast math off (IEEE NaN/inf, as the renderer's MAX and the reference need)."""
    objc, error = self.objc, ctypes.c_void_p()
    with objc.autorelease_pool():
      options = objc.send(objc.cls("MTLCompileOptions"), "new")
      objc.send(options, "setFastMathEnabled:", ctypes.c_bool(False), restype=None)
      try:
        library = objc.send(self.device, "newLibraryWithSource:options:error:", objc.string(src),
                            ctypes.c_void_p(options), ctypes.pointer(error))
      finally: objc.send(options, "release", restype=None)
      if not library:
        raise CompileError(f"Metal rejected a kernel: {objc.error_text(error)}\nsource:\n{_numbered(src)}")
    return library

@functools.cache
def metal_context() -> MetalContext:
  return MetalContext()

class MetalCompiler(Compiler):
  """Checks MSL with the Metal compiler (`newLibraryWithSource:`) and returns the source: the runtime builds the
  library from source again, served from Metal's own shader cache."""
  binary_format = "msl-source"
  def __init__(self) -> None:
    super().__init__(None)
  def compile(self, src: str) -> bytes:
    ctx = metal_context()
    ctx.objc.send(ctx.new_library(src), "release", restype=None)
    return src.encode()

@dataclass(frozen=True)
class MetalBuffer:
  """An MTLBuffer and the byte range of it that an ember buffer (or view) covers."""
  handle: int
  size: int
  offset: int = 0

class MetalAllocator(LRUAllocator):
  """Shared-storage MTLBuffers: the CPU reads and writes `contents` directly (after waiting for the GPU)."""
  def __init__(self, dev: MetalDevice) -> None:
    super().__init__()
    self.dev = dev
  def _alloc(self, size: int, options: BufferSpec) -> MetalBuffer:
    if options.external_ptr is not None:
      raise DeviceError("METAL cannot wrap external host memory (external_ptr); copy the data in instead")
    objc = self.dev.ctx.objc
    handle = objc.send(self.dev.ctx.device, "newBufferWithLength:options:", NSUInteger(max(size, 1)),
                       NSUInteger(MTL_RESOURCE_STORAGE_MODE_SHARED))
    if not handle: raise MemoryError(f"Metal could not allocate {size} bytes")
    return MetalBuffer(handle, size)
  def _free(self, opaque: MetalBuffer, options: BufferSpec) -> None:
    # a committed command buffer retains the MTLBuffers it uses, so releasing here cannot pull memory from the GPU
    self.dev.ctx.objc.send(opaque.handle, "release", restype=None)
  def _as_buffer(self, opaque: MetalBuffer) -> memoryview:
    address = self.dev.ctx.objc.send(opaque.handle, "contents") + opaque.offset
    return memoryview((ctypes.c_uint8 * opaque.size).from_address(address)).cast("B")
  def _offset(self, opaque: MetalBuffer, size: int, offset: int) -> MetalBuffer:
    return MetalBuffer(opaque.handle, size, opaque.offset + offset)
  def _copyin(self, dest: MetalBuffer, src: memoryview) -> None:
    self.dev.synchronize()  # a kernel in flight may still read the old contents
    self._as_buffer(dest)[:src.nbytes] = src.cast("B")
  def _copyout(self, dest: memoryview, src: MetalBuffer) -> None:
    self.dev.synchronize()
    dest.cast("B")[:] = self._as_buffer(src)[:dest.nbytes]

class MetalProgram:
  """One kernel as a compute pipeline; calling it encodes a dispatch on the device's queue."""
  def __init__(self, dev: MetalDevice, name: str, lib: bytes) -> None:
    self.dev, self.name = dev, name
    src = lib.decode()
    self.var_widths = kernel_var_widths(src, name)
    ctx = dev.ctx
    objc, error = ctx.objc, ctypes.c_void_p()
    library = ctx.new_library(src)
    try:
      with objc.autorelease_pool():
        function = objc.send(library, "newFunctionWithName:", objc.string(name))
      if not function: raise DeviceError(f"the Metal library has no kernel function {name}")
      try:
        self.pipeline = objc.send(ctx.device, "newComputePipelineStateWithFunction:error:", ctypes.c_void_p(function),
                                  ctypes.pointer(error))
      finally: objc.send(function, "release", restype=None)
    finally: objc.send(library, "release", restype=None)
    if not self.pipeline:
      with objc.autorelease_pool(): reason = objc.error_text(error)
      raise CompileError(f"Metal could not build a pipeline for kernel {name}: {reason}")
    self.max_threads = objc.send(self.pipeline, "maxTotalThreadsPerThreadgroup", restype=NSUInteger)
  def __del__(self) -> None:
    if getattr(self, "pipeline", None): self.dev.ctx.objc.send(self.pipeline, "release", restype=None)
  def __call__(self, *bufs: MetalBuffer, global_size: tuple[int, ...] = (1, 1, 1),
               local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    if len(vals) != len(self.var_widths):
      raise DeviceError(f"kernel {self.name} takes {len(self.var_widths)} variable values, got {len(vals)}")
    grid, local = _three(global_size), _three(local_size)
    if local[0] * local[1] * local[2] > self.max_threads:
      raise DeviceError(f"kernel {self.name}: threadgroup {local} has more than the pipeline's "
                        f"{self.max_threads} threads; use a smaller local size")
    command_buffer = encode_launch(self.dev.ctx.objc, self.dev.queue, self.pipeline,
                                   [(b.handle, b.offset) for b in bufs], list(zip(vals, self.var_widths)), grid, local)
    if not wait:
      self.dev.in_flight.append(command_buffer)
      return None
    self.dev.synchronize()  # earlier dispatches finish first on the serial queue anyway; this checks their status
    return wait_command_buffer(self.dev.ctx.objc, command_buffer)

class MetalDevice(Compiled):
  """An Apple GPU: shared-storage buffers, MSL compiled by Metal, one serial command queue."""
  def __init__(self, device: str, renderer: Renderer | None, compiler: Compiler | None) -> None:
    self.ctx = metal_context()
    self.queue: int = self.ctx.objc.send(self.ctx.device, "newCommandQueue")
    if not self.queue: raise DeviceError("Metal could not create a command queue")
    self.in_flight: list[int] = []
    super().__init__(device, MetalAllocator(self), renderer, compiler or MetalCompiler(),
                     functools.partial(MetalProgram, self))
  def synchronize(self) -> None:
    """Wait for every committed command buffer (the queue is serial, so they finish in order)."""
    pending, self.in_flight = self.in_flight, []
    errors = []
    for command_buffer in pending:
      try: wait_command_buffer(self.ctx.objc, command_buffer)
      except DeviceError as e: errors.append(str(e))
    if errors: raise DeviceError("; ".join(errors))
