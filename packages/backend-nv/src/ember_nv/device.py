"""The NV backend's devices: CUDA (NVIDIA GPUs through the CUDA driver API: libcuda, loaded with ctypes when the device
opens), and the choice of interface for the NV HCQ device (`open_nv_device`): MOCK (`mock.NVMockDevice`, the software
GPU) or NV (`nvdriver.NVDriverDevice`, the NVIDIA kernel driver; imported only when it is opened).

`probe_cuda()` and `probe_nv()` are what `ember_probe` answers: they say plainly why a device is unusable ("no NVIDIA
driver (libcuda.so not found)", "no NVIDIA GPU"). Nothing here runs at `import ember`.
"""
from __future__ import annotations
import ctypes
import functools
import os
import re
from typing import Any, Callable
from ember.plugin import (BufferSpec, Compiled, CompileError, Compiler, DeviceError, HCQCompiled, LRUAllocator,
                          ProbeResult, Renderer)
from ember_nv.compiler import NVShimCompiler
from ember_nv.mock import NVMockDevice
from ember_nv.renderer import CUDARenderer

LIBCUDA_NAMES = ("libcuda.so.1", "libcuda.so")

@functools.cache
def load_libcuda() -> ctypes.CDLL:
  """libcuda with cuInit called, or a DeviceError saying why not."""
  for name in LIBCUDA_NAMES:
    try: lib = ctypes.CDLL(name)
    except OSError: continue
    check(lib, lib.cuInit(0), "cuInit")
    return lib
  raise DeviceError("no NVIDIA driver (libcuda.so not found); install the NVIDIA driver on a machine with an NVIDIA "
                    "GPU, or use DEV=MOCK+NV to run the NV queues without one")

def check(lib: ctypes.CDLL, status: int, what: str) -> None:
  if status == 0: return
  name = ctypes.c_char_p()
  lib.cuGetErrorName(status, ctypes.byref(name))
  raise DeviceError(f"CUDA {what} failed: {(name.value or b'?').decode()} ({status})")

def probe_cuda() -> ProbeResult:
  """Usable when libcuda loads, initialises and reports at least one device."""
  try: lib = load_libcuda()
  except DeviceError as e: return ProbeResult(False, str(e))
  count = ctypes.c_int()
  try: check(lib, lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
  except DeviceError as e: return ProbeResult(False, str(e))
  if count.value == 0: return ProbeResult(False, "no NVIDIA GPU (the driver reports 0 devices)")
  return ProbeResult(True, f"{count.value} NVIDIA GPU(s) through libcuda")

def probe_nv(interface: str) -> ProbeResult:
  """NV (HCQ): the MOCK interface needs nothing; the hardware interface needs the NVIDIA kernel driver."""
  if interface.startswith("MOCK"): return ProbeResult(True, "MOCK+NV: software GPU executing the NV command stream")
  if not os.path.exists("/dev/nvidiactl"):
    return ProbeResult(False, "no NVIDIA kernel driver (/dev/nvidiactl not found); use DEV=MOCK+NV to run the NV "
                              "queues without a GPU")
  if not os.path.exists("/dev/nvidia-uvm"):
    return ProbeResult(False, "the NVIDIA UVM driver is not loaded (/dev/nvidia-uvm not found); run "
                              "`modprobe nvidia-uvm`, or use DEV=CUDA")
  return ProbeResult(True, "NVIDIA kernel driver (/dev/nvidiactl, /dev/nvidia-uvm); the NV ioctl runtime has never "
                           "run on hardware")

class CUDAContext:
  """One device's primary context, made current on the calling thread for every driver call."""
  def __init__(self, index: int) -> None:
    self.lib = load_libcuda()
    self.device, self.context = ctypes.c_int(), ctypes.c_void_p()
    check(self.lib, self.lib.cuDeviceGet(ctypes.byref(self.device), index), f"cuDeviceGet({index})")
    status = self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), self.device)
    check(self.lib, status, "cuDevicePrimaryCtxRetain")
  def call(self, fn: str, *args: Any) -> None:
    check(self.lib, self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
    check(self.lib, getattr(self.lib, fn)(*args), fn)

class CUDAAllocator(LRUAllocator):
  """Device memory from cuMemAlloc; handles are device addresses (ints)."""
  def __init__(self, ctx: CUDAContext) -> None:
    super().__init__()
    self.ctx = ctx
  def _alloc(self, size: int, options: BufferSpec) -> Any:
    ptr = ctypes.c_uint64()
    self.ctx.call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(max(size, 1)))
    return ptr.value
  def _free(self, opaque: Any, options: BufferSpec) -> None: self.ctx.call("cuMemFree_v2", ctypes.c_uint64(opaque))
  def _copyin(self, dest: Any, src: memoryview) -> None:
    host = bytes(src) if src.readonly else (ctypes.c_char * src.nbytes).from_buffer(src)
    self.ctx.call("cuMemcpyHtoD_v2", ctypes.c_uint64(dest), host, ctypes.c_size_t(src.nbytes))
  def _copyout(self, dest: memoryview, src: Any) -> None:
    self.ctx.call("cuMemcpyDtoH_v2", (ctypes.c_char * dest.nbytes).from_buffer(dest), ctypes.c_uint64(src),
                  ctypes.c_size_t(dest.nbytes))
  def _offset(self, opaque: Any, size: int, offset: int) -> Any: return opaque + offset

def param_widths(lib: bytes, name: str) -> list[int]:
  """The byte width of each parameter of kernel `name`, from the binary itself: a cubin's EIATTR_KPARAM_INFO records,
  or the `.param .<type>` list of a PTX entry (so an int64 variable is passed as 8 bytes, an int32 one as 4)."""
  if lib.startswith(b"\x7fELF"):
    from ember_nv.nvdriver import cubin_param_layout
    return [size for _, size in cubin_param_layout(lib, name)[0]]
  text = lib.decode(errors="replace")
  if (start := text.find(f".entry {name}(")) < 0:
    raise DeviceError(f"the PTX has no entry {name}; it was compiled from a different kernel")
  return [int(bits) // 8 for bits in re.findall(r"\.param\s+\.[a-z]+?(\d+)\s", text[start:text.index(")", start)])]

def _arg(value: int, width: int) -> Any: return ctypes.c_int64(value) if width == 8 else ctypes.c_int32(value)

class CUDAProgram:
  """A cubin (or PTX) loaded with cuModuleLoadData; launches pass the arguments as one parameter block, each variable
  at the width the binary declares for it."""
  def __init__(self, ctx: CUDAContext, name: str, lib: bytes) -> None:
    self.ctx, self.name, self.widths = ctx, name, param_widths(lib, name)
    self.module, self.function = ctypes.c_void_p(), ctypes.c_void_p()
    image = ctypes.create_string_buffer(lib + (b"\0" if not lib.startswith(b"\x7fELF") else b""))
    ctx.call("cuModuleLoadData", ctypes.byref(self.module), image)
    ctx.call("cuModuleGetFunction", ctypes.byref(self.function), self.module, name.encode())
  def arguments(self, bufs: Any, vals: Any) -> list[Any]:
    """The launch arguments: buffer addresses, then each variable at its declared width."""
    return [ctypes.c_uint64(b) for b in bufs] + [_arg(v, w) for v, w in zip(vals, self.widths[len(bufs):])]
  def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] | None = None,
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    args = self.arguments(bufs, vals)
    params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
    grid, block = (*global_size, 1, 1)[:3], (*(local_size or (1, 1, 1)), 1, 1)[:3]
    start, end = ctypes.c_void_p(), ctypes.c_void_p()
    if wait:
      self.ctx.call("cuEventCreate", ctypes.byref(start), 0)
      self.ctx.call("cuEventCreate", ctypes.byref(end), 0)
      self.ctx.call("cuEventRecord", start, None)
    self.ctx.call("cuLaunchKernel", self.function, *[ctypes.c_uint(x) for x in (*grid, *block)], ctypes.c_uint(0), None,
                  params, None)
    if not wait: return None
    self.ctx.call("cuEventRecord", end, None)
    self.ctx.call("cuEventSynchronize", end)
    ms = ctypes.c_float()
    self.ctx.call("cuEventElapsedTime", ctypes.byref(ms), start, end)
    for event in (start, end): self.ctx.call("cuEventDestroy_v2", event)
    return ms.value / 1e3

class CUDA_KERNEL_NODE_PARAMS(ctypes.Structure):
  """cuda.h CUDA_KERNEL_NODE_PARAMS_v1 (what the unversioned cuGraphAddKernelNode/cuGraphExecKernelNodeSetParams
  symbols take): the function, grid and block dimensions, dynamic shared memory, the argument pointers."""
  _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
              ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
              ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint), ("kernelParams", ctypes.c_void_p),
              ("extra", ctypes.c_void_p)]

class _KernelNode:
  """One captured launch: its argument values (kept alive here: the driver reads them through `kernelParams`), the
  node parameters, and the graph node."""
  def __init__(self, prg: CUDAProgram, bufs: list[int], vals: tuple[int, ...], grid: tuple[int, ...],
               block: tuple[int, ...]) -> None:
    self.prg, self.vals, self.grid, self.block = prg, vals, (*grid, 1, 1)[:3], (*block, 1, 1)[:3]
    self.node = ctypes.c_void_p()
    self.set_buffers(bufs)
  def set_buffers(self, bufs: list[int]) -> None:
    self.args = self.prg.arguments(bufs, self.vals)
    self.argv = (ctypes.c_void_p * max(len(self.args), 1))(
      *[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in self.args])
    self.params = CUDA_KERNEL_NODE_PARAMS(self.prg.function, *self.grid, *self.block, 0,
                                          ctypes.cast(self.argv, ctypes.c_void_p), None)

class CUDAGraph:
  """A TinyJit capture as one CUDA graph: a chain of kernel nodes (each depends on the one before, as the stream
  ordered them), instantiated once; a replay rewrites the parameters of the nodes whose input buffers changed
  (cuGraphExecKernelNodeSetParams) and launches the executable graph on the null stream. Never run on a GPU here."""
  def __init__(self, dev: CUDADevice, captured: list[tuple[Any, list[Any], dict[str, int]]],
               input_buffers: list[Any]) -> None:
    self.dev, self.ctx = dev, dev.ctx
    self.graph, self.exec = ctypes.c_void_p(), ctypes.c_void_p()
    self.ctx.call("cuGraphCreate", ctypes.byref(self.graph), ctypes.c_uint(0))
    self.nodes: list[_KernelNode] = []
    self.handles: list[list[int]] = []
    for runner, bufs, var_vals in captured:
      if not isinstance(runner.prg, CUDAProgram): raise DeviceError(f"CUDAGraph runs CUDA kernels, got {runner.prg!r}")
      spec = runner.spec
      handles = [b.ensure_allocated()._buf for b in bufs]
      node = _KernelNode(runner.prg, handles, tuple(var_vals[v.arg[0]] for v in spec.vars),
                         tuple(spec.global_size or (1, 1, 1)), tuple(spec.local_size or (1, 1, 1)))
      deps = (ctypes.c_void_p * 1)(self.nodes[-1].node) if self.nodes else None
      self.ctx.call("cuGraphAddKernelNode", ctypes.byref(node.node), self.graph, deps, ctypes.c_size_t(len(self.nodes)
                    and 1), ctypes.byref(node.params))
      self.nodes.append(node)
      self.handles.append(handles)
    self.ctx.call("cuGraphInstantiateWithFlags", ctypes.byref(self.exec), self.graph, ctypes.c_ulonglong(0))
    position = {id(b): i for i, b in enumerate(input_buffers)}
    self.inputs = [[(j, position[id(b)]) for j, b in enumerate(bufs) if id(b) in position] for _, bufs, _ in captured]
  def __call__(self, input_buffers: list[Any]) -> None:
    """Replay with these inputs (in the capture's argument order); returns before the GPU finishes."""
    for node, handles, inputs in zip(self.nodes, self.handles, self.inputs):
      new = list(handles)
      for j, i in inputs: new[j] = input_buffers[i].ensure_allocated()._buf
      if new != handles:
        handles[:] = new
        node.set_buffers(new)
        self.ctx.call("cuGraphExecKernelNodeSetParams", self.exec, node.node, ctypes.byref(node.params))
    self.ctx.call("cuGraphLaunch", self.exec, None)
  def __del__(self) -> None:
    try:
      if self.exec: self.ctx.call("cuGraphExecDestroy", self.exec)
      if self.graph: self.ctx.call("cuGraphDestroy", self.graph)
    except (DeviceError, AttributeError): return

class CUDADevice(Compiled):
  """DEV=CUDA: one GPU through the driver API; kernels from NVRTC (cubin) or ptxas; TinyJit captures replay as CUDA
  graphs (`CUDAGraph`)."""
  def __init__(self, device: str, renderer: Renderer | None, compiler: Compiler | None) -> None:
    index = int(device.partition(":")[2] or 0)
    self.ctx = CUDAContext(index)
    super().__init__(device, CUDAAllocator(self.ctx), renderer, compiler,
                     lambda name, lib: CUDAProgram(self.ctx, name, lib),
                     lambda captured, input_buffers: CUDAGraph(self, captured, input_buffers))
  def synchronize(self) -> None: self.ctx.call("cuCtxSynchronize")

# ** the NV HCQ device: MOCK or the kernel driver **

def nv_interface(interface: str) -> Callable[..., HCQCompiled]:
  """The device class that drives NV through `interface`: MOCK (the software GPU) or NV (the NVIDIA kernel driver;
  `DEV=NV` with no interface means this one)."""
  if interface == "MOCK": return NVMockDevice
  if interface in ("", "NV"):
    from ember_nv.nvdriver import NVDriverDevice
    return NVDriverDevice
  raise DeviceError(f"NV has no interface {interface!r}: use DEV=NV (the NVIDIA kernel driver) or DEV=MOCK+NV")

def open_nv_device(device: str, interface: str, renderer: Renderer | None, compiler: Compiler | None) -> HCQCompiled:
  """MOCK+NV runs the CUDA C through the host shim; NV loads the cubins of the selected compiler."""
  if interface == "MOCK":
    if not isinstance(renderer, CUDARenderer):
      raise CompileError(f"MOCK+NV runs CUDA C through the host shim; {type(renderer).__name__} output cannot run on "
                         "it; use DEV=MOCK+NV or DEV=MOCK+NV:CUDA")
    if not isinstance(compiler, NVShimCompiler):
      raise CompileError(f"MOCK+NV runs kernels built by the host shim (NVShimCompiler), not {compiler!r}; the NV "
                         "plugin's compiler registration must follow the interface")
    return NVMockDevice(device, renderer, compiler)
  return nv_interface(interface)(device, renderer, compiler)
