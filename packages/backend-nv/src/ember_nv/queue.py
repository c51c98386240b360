"""NV hardware command queues (HCQ): pushbuffer methods submitted through a GPFIFO ring, and the MOCK GPU running them.

Pushbuffer words are NVIDIA "incrementing method" headers, `(1 << 29) | (count << 16) | (subchannel << 13) | (method
>> 2)`, followed by `count` data words. Method numbers follow NVIDIA's class headers: host semaphores (clc56f
SEM_ADDR_LO..SEM_EXECUTE), compute launches (clc6c0 SEND_PCAS_A with a QMD address >> 8, SEND_SIGNALING_PCAS2_B) and
copy-engine DMA (clc6b5 OFFSET_IN/OUT, LINE_LENGTH_IN, LAUNCH_DMA).

What differs from the hardware, and must change before the ioctl interface can drive a real GPU:
* the QMD is a simplified layout of our own (`QMD_*` dword offsets below), not the Ampere/Hopper QMD bit layout;
* a GPFIFO entry is two 64-bit words (pushbuffer address, length in words) instead of one packed 64-bit word, because
  host addresses do not fit the 40-bit address field;
* the timestamp release writes the nanosecond timer into the semaphore word itself.
"""
from __future__ import annotations
import ctypes
import hashlib
import time
from typing import Any
from ember.plugin import (BufferSpec, CompileError, Compiler, DeviceError, Renderer, HCQAllocator, HCQArgs, HCQBuffer,
                          HCQCompiled, HCQProgram, HCQSignal, HWQueue, shim_arg_layout)
from ember_nv.mock import HostKernel, HostShimCompiler

SUBC_HOST, SUBC_COMPUTE, SUBC_COPY = 0, 1, 4
# host class (clc56f)
SEM_ADDR_LO, SEM_EXECUTE, WFI = 0x005c, 0x006c, 0x0078
SEM_ACQUIRE_GEQ, SEM_RELEASE, SEM_PAYLOAD_64, SEM_TIMESTAMP = 3, 1, 1 << 24, 1 << 25
# compute class (clc6c0)
SEND_PCAS_A, SEND_SIGNALING_PCAS2_B, PCAS_INVALIDATE_AND_SCHEDULE = 0x02b4, 0x02c0, 9
# copy class (clc6b5)
OFFSET_IN_UPPER, LINE_LENGTH_IN, LAUNCH_DMA, DMA_1D_PITCH = 0x0400, 0x0418, 0x0300, 0x182
# our QMD layout (dword offsets)
QMD_SIZE = 256
QMD_PROGRAM_LO, QMD_PROGRAM_HI, QMD_PROGRAM_SIZE, QMD_GRID, QMD_BLOCK, QMD_CBUF0_LO, QMD_CBUF0_HI, QMD_CBUF0_SIZE = \
  0, 1, 2, 3, 6, 9, 10, 11

def method(subchannel: int, mthd: int, *data: int) -> list[int]:
  """One incrementing-method header and its data words."""
  return [(1 << 29) | (len(data) << 16) | (subchannel << 13) | (mthd >> 2), *[d & 0xffffffff for d in data]]

def _lo_hi(x: int) -> tuple[int, int]: return x & 0xffffffff, x >> 32

class NVQueue(HWQueue):
  """Pushbuffer words of one queue; `_submit` copies them to host memory and adds a GPFIFO entry for them."""
  def __init__(self) -> None:
    super().__init__()
    self.words: list[int] = []
    self.value_at: dict[int, int] = {}  # command index -> word index of its 64-bit payload (low word)
    self.memory: Any = None
  def _semaphore(self, signal: HCQSignal, value: int, execute: int) -> None:
    lo, hi = _lo_hi(signal.addr)
    vlo, vhi = _lo_hi(value)
    self.value_at[len(self.commands)] = len(self.words) + 3
    self.words += method(SUBC_HOST, SEM_ADDR_LO, lo, hi, vlo, vhi, execute)
  def _wait(self, signal: HCQSignal, value: int) -> None:
    self._semaphore(signal, value, SEM_ACQUIRE_GEQ | SEM_PAYLOAD_64)
  def _signal(self, signal: HCQSignal, value: int) -> None: self._semaphore(signal, value, SEM_RELEASE | SEM_PAYLOAD_64)
  def _timestamp(self, signal: HCQSignal) -> None:
    self._semaphore(signal, 0, SEM_RELEASE | SEM_PAYLOAD_64 | SEM_TIMESTAMP)
  def _memory_barrier(self) -> None: self.words += method(SUBC_HOST, WFI, 0)
  def _patch_value(self, command_index: int, value: int) -> None:
    at = self.value_at[command_index]
    self.words[at], self.words[at + 1] = _lo_hi(value)
    if self.memory is not None: self.memory[at], self.memory[at + 1] = _lo_hi(value)
  def _exec(self, prg: HCQProgram, args: HCQArgs, global_size: tuple[int, int, int],
            local_size: tuple[int, int, int]) -> None:
    raise DeviceError(f"{type(self).__name__} cannot launch kernels; use the compute queue")
  def _copy(self, dest: int, src: int, nbytes: int) -> None:
    raise DeviceError(f"{type(self).__name__} cannot copy; use the copy queue")
  def _submit(self, device: HCQCompiled) -> None:
    if not isinstance(device, NVDevice): raise DeviceError(f"an NV queue cannot be submitted to {device!r}")
    if self.memory is None or len(self.memory) != len(self.words):
      self.memory = (ctypes.c_uint32 * len(self.words))(*self.words)
    device.gpfifo_push(ctypes.addressof(self.memory), len(self.words), self.memory)

class NVComputeQueue(NVQueue):
  """Semaphores and QMD launches on the compute engine."""
  def _exec(self, prg: HCQProgram, args: HCQArgs, global_size: tuple[int, int, int],
            local_size: tuple[int, int, int]) -> None:
    if not isinstance(prg, NVProgram): raise DeviceError(f"NVComputeQueue launches NVProgram kernels, got {prg!r}")
    qmd = prg.device.qmd_alloc()
    words = (ctypes.c_uint32 * (QMD_SIZE // 4)).from_address(qmd.va_addr)
    words[QMD_PROGRAM_LO], words[QMD_PROGRAM_HI] = _lo_hi(prg.code.va_addr)
    words[QMD_PROGRAM_SIZE] = prg.code.size
    for i in range(3): words[QMD_GRID + i], words[QMD_BLOCK + i] = global_size[i], local_size[i]
    words[QMD_CBUF0_LO], words[QMD_CBUF0_HI] = _lo_hi(args.buf.va_addr)
    words[QMD_CBUF0_SIZE] = args.buf.size
    self.words += method(SUBC_COMPUTE, SEND_PCAS_A, qmd.va_addr >> 8)
    self.words += method(SUBC_COMPUTE, SEND_SIGNALING_PCAS2_B, PCAS_INVALIDATE_AND_SCHEDULE)

class NVCopyQueue(NVQueue):
  """Semaphores and 1D DMA copies on a copy engine."""
  def _copy(self, dest: int, src: int, nbytes: int) -> None:
    shi, slo = src >> 32, src & 0xffffffff
    dhi, dlo = dest >> 32, dest & 0xffffffff
    self.words += method(SUBC_COPY, OFFSET_IN_UPPER, shi, slo, dhi, dlo)
    self.words += method(SUBC_COPY, LINE_LENGTH_IN, nbytes)
    self.words += method(SUBC_COPY, LAUNCH_DMA, DMA_1D_PITCH)

class NVProgram(HCQProgram):
  """A kernel binary uploaded to device memory; the QMD points at it."""
  def __init__(self, device: NVDevice, name: str, lib: bytes) -> None:
    self.code = device._host_alloc(len(lib))
    ctypes.memmove(self.code.va_addr, lib, len(lib))
    super().__init__(device, name, *device.arg_layout(name, lib))

class NVAllocator(HCQAllocator):
  """Device memory: on the MOCK GPU, host memory whose address is the GPU virtual address."""
  def _alloc(self, size: int, options: BufferSpec) -> HCQBuffer:
    mem = (ctypes.c_uint8 * max(size, 1))()
    return HCQBuffer(ctypes.addressof(mem), size, mem)

class MockNVGPU:
  """A software NV GPU: decodes the GPFIFO entries and pushbuffer methods and performs them in order, on host memory."""
  def __init__(self) -> None:
    self.kernels: dict[str, HostKernel] = {}
    self.pending: list[tuple[int, int, Any]] = []
    self.executed_methods = 0
  def push(self, addr: int, nwords: int, keep: Any) -> None: self.pending.append((addr, nwords, keep))
  def run_pending(self) -> None:
    """Execute every submitted GPFIFO entry; an acquire that is not satisfied stops execution there (like a GPU)."""
    while self.pending:
      addr, nwords, keep = self.pending[0]
      if not self.execute(addr, nwords): return
      self.pending.pop(0)
  def execute(self, addr: int, nwords: int) -> bool:
    words = (ctypes.c_uint32 * nwords).from_address(addr)
    regs: dict[tuple[int, int], int] = {}
    i = 0
    while i < nwords:
      header = words[i]
      if header >> 29 != 1: raise DeviceError(f"MOCK+NV: unsupported pushbuffer header {header:#010x} at word {i}")
      count, subc, mthd = (header >> 16) & 0x1fff, (header >> 13) & 7, (header & 0x1fff) << 2
      for k in range(count): regs[(subc, mthd + 4 * k)] = words[i + 1 + k]
      last = mthd + 4 * (count - 1)
      if not self.method(subc, last, regs): return False
      self.executed_methods += 1
      i += 1 + count
    return True
  def method(self, subc: int, mthd: int, regs: dict[tuple[int, int], int]) -> bool:
    if subc == SUBC_HOST and mthd == SEM_EXECUTE:
      addr = regs[(subc, SEM_ADDR_LO)] | regs[(subc, SEM_ADDR_LO + 4)] << 32
      value = regs[(subc, SEM_ADDR_LO + 8)] | regs[(subc, SEM_ADDR_LO + 12)] << 32
      word, execute = ctypes.c_uint64.from_address(addr), regs[(subc, SEM_EXECUTE)]
      if execute & 0xf == SEM_ACQUIRE_GEQ: return word.value >= value
      word.value = time.perf_counter_ns() if execute & SEM_TIMESTAMP else value
    elif subc == SUBC_COMPUTE and mthd == SEND_SIGNALING_PCAS2_B: self.launch(regs[(subc, SEND_PCAS_A)] << 8)
    elif subc == SUBC_COPY and mthd == LAUNCH_DMA:
      src = regs[(subc, OFFSET_IN_UPPER)] << 32 | regs[(subc, OFFSET_IN_UPPER + 4)]
      dest = regs[(subc, OFFSET_IN_UPPER + 8)] << 32 | regs[(subc, OFFSET_IN_UPPER + 12)]
      ctypes.memmove(dest, src, regs[(subc, LINE_LENGTH_IN)])
    return True
  def launch(self, qmd_addr: int) -> None:
    q = (ctypes.c_uint32 * (QMD_SIZE // 4)).from_address(qmd_addr)
    code = ctypes.string_at(q[QMD_PROGRAM_LO] | q[QMD_PROGRAM_HI] << 32, q[QMD_PROGRAM_SIZE])
    key = hashlib.sha256(code).hexdigest()
    if (kernel := self.kernels.get(key)) is None: kernel = self.kernels[key] = HostKernel(code)
    params = ctypes.string_at(q[QMD_CBUF0_LO] | q[QMD_CBUF0_HI] << 32, q[QMD_CBUF0_SIZE])
    grid, block = (q[QMD_GRID], q[QMD_GRID + 1], q[QMD_GRID + 2]), (q[QMD_BLOCK], q[QMD_BLOCK + 1], q[QMD_BLOCK + 2])
    kernel.run(params, grid, block)

_MAP_PRIVATE, _MAP_ANONYMOUS, _MAP_32BIT, _PROT_RW = 0x02, 0x20, 0x40, 0x3

def low_memory(size: int) -> HCQBuffer:
  """Page-aligned host memory below 2 GiB (Linux x86-64 MAP_32BIT): a QMD address is sent as `addr >> 8` in one
  32-bit method word, which holds only 40-bit GPU addresses. Never unmapped: the QMD ring lives as long as the
  device."""
  libc = ctypes.CDLL(None, use_errno=True)
  libc.mmap.restype = ctypes.c_void_p
  libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
  addr = libc.mmap(None, size, _PROT_RW, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_32BIT, -1, 0)
  if addr in (None, ctypes.c_void_p(-1).value) or addr >= 1 << 40:
    raise DeviceError(f"MOCK+NV could not map {size} bytes below 2^40 for QMDs (errno {ctypes.get_errno()}); MOCK+NV "
                      "needs Linux on x86-64")
  return HCQBuffer(addr, size)

class NVDevice(HCQCompiled):
  """DEV=MOCK+NV: the NV queues, allocator, programs and graph, executed by `MockNVGPU`. Kernels are the CUDA C of
  `CUDARenderer` built for the host through the shim (`HostShimCompiler`); NVRTC is not needed."""
  def __init__(self, device: str, renderer: Renderer) -> None:
    self.gpu = MockNVGPU()
    self._qmds: HCQBuffer | None = None
    signals = (ctypes.c_uint8 * 64)()
    self._signal_keep = signals
    super().__init__(device, NVAllocator(self), renderer, HostShimCompiler(),
                     lambda name, lib: NVProgram(self, name, lib), NVComputeQueue, NVCopyQueue,
                     HCQBuffer(ctypes.addressof(signals), 64, signals))
    self._qmd_ptr = 0
  def gpfifo_push(self, addr: int, nwords: int, keep: Any) -> None:
    self.gpu.push(addr, nwords, keep)
    self.gpu.run_pending()
  def _progress(self) -> None: self.gpu.run_pending()
  def qmd_alloc(self) -> HCQBuffer:
    """A 256-byte aligned QMD from a ring (QMD addresses are sent >> 8)."""
    if self._qmds is None or self._qmd_ptr + QMD_SIZE > self._qmds.size:
      self.synchronize()
      self._qmds, self._qmd_ptr = low_memory(QMD_SIZE * 4096), 0
    buf = self._qmds.offset(self._qmd_ptr, QMD_SIZE)
    self._qmd_ptr += QMD_SIZE
    return buf
  def arg_layout(self, name: str, lib: bytes) -> tuple[list[tuple[int, int]], int]:
    """The parameter block of a host-shim kernel, from the source its compiler remembers."""
    return shim_arg_layout(self.compiler, name, lib)

def nv_interface(interface: str) -> type[NVDevice]:
  """The device class that drives NV through `interface`; only MOCK exists so far."""
  if interface == "MOCK": return NVDevice
  raise DeviceError(f"the NV interface {interface or '(hardware)'} is not implemented: only MOCK exists (the ioctl "
                    "interface over /dev/nvidia* is not written yet); use DEV=MOCK+NV, or DEV=CUDA on a GPU machine")

def open_nv_device(device: str, interface: str, renderer: Renderer | None, compiler: Compiler | None) -> NVDevice:
  from ember_nv.renderer import CUDARenderer
  if not isinstance(renderer, CUDARenderer):
    raise CompileError(f"MOCK+NV runs CUDA C through the host shim; {type(renderer).__name__} output cannot run on it; "
                       "use DEV=MOCK+NV or DEV=MOCK+NV:CUDA")
  return nv_interface(interface)(device, renderer)
