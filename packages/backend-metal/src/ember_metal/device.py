"""The Metal device (macOS only): probe, allocator, programs, the JIT graph and the device, on top of the Objective-C
bridge (`objc.py`) and the compiler (`compiler.py`).

What the runtime does with Metal:

* device: `MTLCreateSystemDefaultDevice`, then `newCommandQueue`;
* memory: `newBufferWithLength:options:` with `MTLResourceStorageModeShared`: host and GPU share the pages, so
  `contents` is a zero-copy host view (numpy reads it through `Buffer.as_buffer`);
* programs: the compiler's metallib (`newLibraryWithData:error:`) or MSL source (`newLibraryWithSource:`), then
  `newFunctionWithName:` and a `MTLComputePipelineDescriptor` with `setSupportIndirectCommandBuffers:YES`
  (`newComputePipelineStateWithDescriptor:options:reflection:error:`), so every pipeline can join a JIT graph;
* launch: `commandBuffer`, `computeCommandEncoder`, `setComputePipelineState:`, `setBuffer:offset:atIndex:` per buffer,
  `setBytes:length:atIndex:` per variable, `dispatchThreadgroups:threadsPerThreadgroup:`, `endEncoding`, `commit`;
* wait: `waitUntilCompleted`, `status` / `error`, and `GPUStartTime` / `GPUEndTime` for the kernel time;
* JIT graph (`MetalGraph`): an `MTLIndirectCommandBuffer` with one compute command per captured kernel, replayed with
  `useResources:count:usage:` and `executeCommandsInBuffer:withRange:` in one command buffer.

On any other platform `probe_metal()` says why Metal is unavailable and nothing here loads a native library.
"""
from __future__ import annotations
import ctypes
import functools
import re
import sys
from dataclasses import dataclass
from typing import Any, Sequence
from ember.plugin import (Buffer, BufferSpec, Compiled, CompileError, Compiler, DeviceError, LRUAllocator, ProbeResult,
                          Renderer)
from ember_metal.compiler import MetalCompiler, library_from_metallib, library_from_source, unpack_program
from ember_metal.objc import LibDispatch, LibObjC, MetalContext, MTLSize, NSInteger, NSRange, NSUInteger, ObjC

METAL_FRAMEWORK = "/System/Library/Frameworks/Metal.framework/Metal"
# MTLCreateSystemDefaultDevice returns nil in a process that has not linked CoreGraphics (a plain `python`)
COREGRAPHICS_FRAMEWORK = "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics"
MTL_RESOURCE_STORAGE_MODE_SHARED = 0
MTL_COMMAND_BUFFER_STATUS_ERROR = 5
MTL_INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH = 1 << 5
MTL_RESOURCE_USAGE_READ_WRITE = (1 << 0) | (1 << 1)  # MTLResourceUsageRead | MTLResourceUsageWrite
MTL_GPU_FAMILY_APPLE9 = 1009  # M3 and later: no ICB workaround needed
MTL_MAX_KERNEL_BUFFER_BIND_COUNT = 31  # the buffer argument table of a compute function has 31 entries
# setBuffer/setKernelBuffer offsets of `constant` arguments must be 256-aligned on Macs of the Mac2 family (4 on Apple
# GPUs); the graph's variable slots use the stricter value so one layout is valid on every Mac
MTL_CONSTANT_OFFSET_ALIGNMENT = 256

def probe_metal() -> ProbeResult:
  """Whether this machine has a Metal GPU, without opening it, and why not."""
  if sys.platform != "darwin":
    return ProbeResult(False, "Metal needs macOS (Metal.framework on Apple hardware); this platform is "
                              f"{sys.platform!r}. Use DEV=CPU here, or run on a Mac")
  try:
    metal = ctypes.CDLL(METAL_FRAMEWORK)
    ctypes.CDLL(COREGRAPHICS_FRAMEWORK)
    objc = ObjC(LibObjC())
  except (OSError, DeviceError) as e:
    return ProbeResult(False, f"cannot load Metal.framework or libobjc ({e}); Metal needs macOS 11 or later")
  metal.MTLCopyAllDevices.restype = ctypes.c_void_p
  devices = metal.MTLCopyAllDevices()
  if not devices: return ProbeResult(False, "MTLCopyAllDevices returned nil: this Mac has no Metal device")
  try:
    count = objc.send(devices, "count", restype=NSUInteger)
    if count == 0: return ProbeResult(False, "this Mac has no Metal device (MTLCopyAllDevices is empty)")
    with objc.autorelease_pool():
      name = objc.text(objc.send(objc.send(devices, "objectAtIndex:", NSUInteger(0)), "name"))
  finally: objc.send(devices, "release", restype=None)
  return ProbeResult(True, f"{name} ({count} Metal device{'s' if count > 1 else ''})")

@functools.cache
def metal_context() -> MetalContext:
  """Open the system default Metal device (once per process)."""
  if not (probed := probe_metal()).ok: raise DeviceError(f"METAL is unavailable: {probed.reason}")
  metal = ctypes.CDLL(METAL_FRAMEWORK)
  metal.MTLCreateSystemDefaultDevice.restype = ctypes.c_void_p
  device = metal.MTLCreateSystemDefaultDevice()
  if not device: raise DeviceError("MTLCreateSystemDefaultDevice returned nil: no usable Metal GPU")
  return MetalContext(ObjC(LibObjC()), device, LibDispatch())

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

def _three(size: Sequence[int] | None) -> tuple[int, int, int]:
  dims = list(size or ()) + [1, 1, 1]
  return dims[0], dims[1], dims[2]

# ** the device **

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
  """One kernel as a compute pipeline (usable in indirect command buffers); calling it encodes a dispatch."""
  def __init__(self, dev: MetalDevice, name: str, lib: bytes) -> None:
    self.dev, self.name = dev, name
    src, metallib = unpack_program(lib)
    self.var_widths = kernel_var_widths(src, name)
    ctx = dev.ctx
    objc, error = ctx.objc, ctypes.c_void_p()
    library = library_from_source(ctx, src) if metallib is None else library_from_metallib(ctx, metallib)
    try:
      with objc.autorelease_pool():
        function = objc.send(library, "newFunctionWithName:", objc.string(name))
      if not function: raise DeviceError(f"the Metal library has no kernel function {name}")
      try:
        descriptor = objc.send(objc.cls("MTLComputePipelineDescriptor"), "new")
        try:
          objc.send(descriptor, "setComputeFunction:", ctypes.c_void_p(function), restype=None)
          objc.send(descriptor, "setSupportIndirectCommandBuffers:", ctypes.c_bool(True), restype=None)
          self.pipeline = objc.send(ctx.device, "newComputePipelineStateWithDescriptor:options:reflection:error:",
                                    ctypes.c_void_p(descriptor), NSUInteger(0), ctypes.c_void_p(None),
                                    ctypes.pointer(error))
        finally: objc.send(descriptor, "release", restype=None)
      finally: objc.send(function, "release", restype=None)
    finally: objc.send(library, "release", restype=None)
    if not self.pipeline:
      with objc.autorelease_pool(): reason = objc.error_text(error)
      raise CompileError(f"Metal could not build a pipeline for kernel {name}: {reason}")
    self.max_threads = objc.send(self.pipeline, "maxTotalThreadsPerThreadgroup", restype=NSUInteger)
  def __del__(self) -> None:
    if getattr(self, "pipeline", None): self.dev.ctx.objc.send(self.pipeline, "release", restype=None)
  def dims(self, global_size: Sequence[int] | None, local_size: Sequence[int] | None,
           vals: tuple[int, ...]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(threadgroups, threads per threadgroup) of a launch, after checking it against the kernel and pipeline."""
    if len(vals) != len(self.var_widths):
      raise DeviceError(f"kernel {self.name} takes {len(self.var_widths)} variable values, got {len(vals)}")
    grid, local = _three(global_size), _three(local_size)
    if local[0] * local[1] * local[2] > self.max_threads:
      raise DeviceError(f"kernel {self.name}: threadgroup {local} has more than the pipeline's "
                        f"{self.max_threads} threads; use a smaller local size")
    return grid, local
  def __call__(self, *bufs: MetalBuffer, global_size: tuple[int, ...] = (1, 1, 1),
               local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    grid, local = self.dims(global_size, local_size, vals)
    command_buffer = encode_launch(self.dev.ctx.objc, self.dev.queue, self.pipeline,
                                   [(b.handle, b.offset) for b in bufs], list(zip(vals, self.var_widths)), grid, local)
    if not wait:
      self.dev.in_flight.append(command_buffer)
      return None
    self.dev.synchronize()  # earlier dispatches finish first on the serial queue anyway; this checks their status
    return wait_command_buffer(self.dev.ctx.objc, command_buffer)

# ** the JIT graph **

Captured = list[tuple[Any, list[Buffer], dict[str, int]]]  # TinyJit's (CompiledRunner, buffers, var_vals)

class MetalGraph:
  """A TinyJit capture as one MTLIndirectCommandBuffer: one concurrent-dispatch compute command per kernel (its
  pipeline, buffers and threadgroups, and a barrier so each kernel sees the previous one's writes), built once.
  A replay rebinds the buffers of the inputs that changed and executes the whole ICB in one command buffer.

  Indirect compute commands have no `setBytes`, so the kernels' variables live in one shared buffer, each in its own
  `MTL_CONSTANT_OFFSET_ALIGNMENT` slot bound at the variable's binding index (the kernel reads `constant T&`)."""
  def __init__(self, dev: MetalDevice, captured: Captured, input_buffers: list[Buffer]) -> None:
    self.dev, self.captured = dev, captured
    objc, ctx = dev.ctx.objc, dev.ctx
    launches = []
    for runner, bufs, var_vals in captured:
      program = runner.prg
      if not isinstance(program, MetalProgram) or program.dev is not dev:
        raise DeviceError(f"MetalGraph batches kernels of {dev.device} only, got {runner.spec.name} on {runner.device}")
      if (n_bindings := len(bufs) + len(program.var_widths)) > MTL_MAX_KERNEL_BUFFER_BIND_COUNT:
        raise DeviceError(f"kernel {runner.spec.name} binds {n_bindings} buffers and variables, more than the "
                          f"{MTL_MAX_KERNEL_BUFFER_BIND_COUNT} an indirect command can; run it without the JIT")
      vals = tuple(var_vals[v.arg[0]] for v in runner.spec.vars)
      launches.append((program, [b.ensure_allocated()._buf for b in bufs], vals,
                       *program.dims(runner.spec.global_size, runner.spec.local_size, vals)))
    # variables: one slot each, written once (a capture's variable values are fixed)
    n_vars = sum(len(program.var_widths) for program, *_ in launches)
    self.var_buffer: int | None = None
    if n_vars:
      self.var_buffer = objc.send(ctx.device, "newBufferWithLength:options:",
                                  NSUInteger(n_vars * MTL_CONSTANT_OFFSET_ALIGNMENT),
                                  NSUInteger(MTL_RESOURCE_STORAGE_MODE_SHARED))
      if not self.var_buffer: raise MemoryError("Metal could not allocate the JIT graph's variable buffer")
    descriptor = objc.send(objc.cls("MTLIndirectCommandBufferDescriptor"), "new")
    try:
      objc.send(descriptor, "setCommandTypes:", NSUInteger(MTL_INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH), restype=None)
      objc.send(descriptor, "setInheritBuffers:", ctypes.c_bool(False), restype=None)
      objc.send(descriptor, "setInheritPipelineState:", ctypes.c_bool(False), restype=None)
      objc.send(descriptor, "setMaxKernelBufferBindCount:", NSUInteger(MTL_MAX_KERNEL_BUFFER_BIND_COUNT), restype=None)
      self.icb = objc.send(ctx.device, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:",
                           ctypes.c_void_p(descriptor), NSUInteger(len(launches)), NSUInteger(0))
    finally: objc.send(descriptor, "release", restype=None)
    if not self.icb: raise DeviceError(f"Metal could not create an indirect command buffer of {len(launches)} commands")
    self.commands: list[int] = []
    slot = 0
    for program, handles, vals, grid, local in launches:
      command = objc.send(self.icb, "indirectComputeCommandAtIndex:", NSUInteger(len(self.commands)))
      objc.send(command, "setComputePipelineState:", ctypes.c_void_p(program.pipeline), restype=None)
      for index, buffer in enumerate(handles): self._bind(command, index, buffer.handle, buffer.offset)
      for index, (value, width) in enumerate(zip(vals, program.var_widths), start=len(handles)):
        self._write_var(slot, value, width)
        self._bind(command, index, self.var_buffer, slot * MTL_CONSTANT_OFFSET_ALIGNMENT)
        slot += 1
      objc.send(command, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", MTLSize(*grid), MTLSize(*local),
                restype=None)
      objc.send(command, "setBarrier", restype=None)
      self.commands.append(command)
    # where each input is bound: (command, binding index), and the buffer bound there now
    position = {id(b): i for i, b in enumerate(input_buffers)}
    self.patches: dict[int, list[tuple[int, int]]] = {}
    for j, (_, bufs, _) in enumerate(captured):
      for index, b in enumerate(bufs):
        if id(b) in position: self.patches.setdefault(position[id(b)], []).append((j, index))
    self.bound: dict[int, MetalBuffer] = {i: input_buffers[i]._buf for i in self.patches}
    self.resources: dict[int, int] = {}  # MTLBuffer handle -> how many bindings use it
    for _, handles, *_ in launches:
      for buffer in handles: self.resources[buffer.handle] = self.resources.get(buffer.handle, 0) + 1
    if self.var_buffer: self.resources[self.var_buffer] = 1
    self.pipelines = list(dict.fromkeys(program.pipeline for program, *_ in launches))
    # before Apple9 (M3), pipelines only referenced from an ICB are not made resident: a zero-size direct dispatch of
    # each one first avoids the GPU fault
    self.needs_icb_fix = not objc.send(ctx.device, "supportsFamily:", NSInteger(MTL_GPU_FAMILY_APPLE9),
                                       restype=ctypes.c_bool)
    self.last: int | None = None
  def _bind(self, command: int, index: int, handle: int | None, offset: int) -> None:
    self.dev.ctx.objc.send(command, "setKernelBuffer:offset:atIndex:", ctypes.c_void_p(handle), NSUInteger(offset),
                           NSUInteger(index), restype=None)
  def _write_var(self, slot: int, value: int, width: int) -> None:
    address = self.dev.ctx.objc.send(self.var_buffer, "contents") + slot * MTL_CONSTANT_OFFSET_ALIGNMENT
    scalar = ctypes.c_int64 if width == 8 else ctypes.c_int32
    scalar.from_address(address).value = value
  def __call__(self, input_buffers: list[Buffer], wait: bool = False) -> float | None:
    """Replay with these inputs (in the capture's argument order); returns the GPU time when `wait`."""
    objc = self.dev.ctx.objc
    changed = {i: input_buffers[i].ensure_allocated()._buf for i in self.patches}
    changed = {i: buffer for i, buffer in changed.items() if buffer != self.bound[i]}
    if changed:
      # the GPU may still be executing this ICB from the previous replay: rebind only once it has finished
      if self.last is not None and self.last in self.dev.in_flight: self.dev.synchronize()
      for i, buffer in changed.items():
        old = self.bound[i]
        for j, index in self.patches[i]: self._bind(self.commands[j], index, buffer.handle, buffer.offset)
        uses = len(self.patches[i])
        if (left := self.resources[old.handle] - uses) > 0: self.resources[old.handle] = left
        else: del self.resources[old.handle]
        self.resources[buffer.handle] = self.resources.get(buffer.handle, 0) + uses
        self.bound[i] = buffer
    with objc.autorelease_pool():
      command_buffer = objc.send(objc.send(self.dev.queue, "commandBuffer"), "retain")
      encoder = objc.send(command_buffer, "computeCommandEncoder")
      if self.needs_icb_fix:
        for pipeline in self.pipelines:
          objc.send(encoder, "setComputePipelineState:", ctypes.c_void_p(pipeline), restype=None)
          objc.send(encoder, "dispatchThreadgroups:threadsPerThreadgroup:", MTLSize(0, 0, 0), MTLSize(0, 0, 0),
                    restype=None)
      # commands in an ICB do not make their buffers resident; the encoder must be told every one
      handles = (ctypes.c_void_p * len(self.resources))(*self.resources)
      objc.send(encoder, "useResources:count:usage:", ctypes.cast(handles, ctypes.c_void_p),
                NSUInteger(len(self.resources)), NSUInteger(MTL_RESOURCE_USAGE_READ_WRITE), restype=None)
      objc.send(encoder, "executeCommandsInBuffer:withRange:", ctypes.c_void_p(self.icb),
                NSRange(0, len(self.commands)), restype=None)
      objc.send(encoder, "endEncoding", restype=None)
      objc.send(command_buffer, "commit", restype=None)
    self.last = command_buffer
    if not wait:
      self.dev.in_flight.append(command_buffer)
      return None
    self.dev.synchronize()
    return wait_command_buffer(objc, command_buffer)
  def __del__(self) -> None:
    objc = self.dev.ctx.objc
    if getattr(self, "icb", None): objc.send(self.icb, "release", restype=None)
    if getattr(self, "var_buffer", None): objc.send(self.var_buffer, "release", restype=None)

class MetalDevice(Compiled):
  """An Apple GPU: shared-storage buffers, MSL compiled by Metal, one serial command queue, ICB graphs for the JIT."""
  def __init__(self, device: str, renderer: Renderer | None, compiler: Compiler | None,
               context: MetalContext | None = None) -> None:
    self.ctx = context or metal_context()
    self.queue: int = self.ctx.objc.send(self.ctx.device, "newCommandQueue")
    if not self.queue: raise DeviceError("Metal could not create a command queue")
    self.in_flight: list[int] = []
    super().__init__(device, MetalAllocator(self), renderer, compiler or MetalCompiler(lambda: self.ctx),
                     functools.partial(MetalProgram, self), functools.partial(MetalGraph, self))
  def synchronize(self) -> None:
    """Wait for every committed command buffer (the queue is serial, so they finish in order)."""
    pending, self.in_flight = self.in_flight, []
    errors = []
    for command_buffer in pending:
      try: wait_command_buffer(self.ctx.objc, command_buffer)
      except DeviceError as e: errors.append(str(e))
    if errors: raise DeviceError("; ".join(errors))
