"""The MOCK interface of the NV backend (DEV=MOCK+NV): a software GPU that executes the command stream the NV queues
write, and the HCQ device, allocator and programs that drive it.

*The MOCK GPU* (`MockNVGPU`) fetches GPFIFO entries of each channel whose doorbell rang, decodes their pushbuffer
methods (semaphore release/acquire, copy engine launches, QMD compute launches) and performs them on host memory; see
`ember_nv.queue` for the formats. A QMD launch runs the kernel at the QMD's program address: on the MOCK that is a host
shim shared object (`compiler.NVShimCompiler`), whose length the GPU reads from its ELF header. Pushbuffers and QMDs
live in host memory mapped below 2 GiB (`host_pages`), so host pointers fit the 40-bit GPFIFO and QMD address fields.
"""
from __future__ import annotations
import ctypes
import hashlib
import time
from dataclasses import dataclass
from ember.plugin import (BufferSpec, DeviceError, HCQAllocator, HCQBuffer, HostKernel, Renderer, elf_image_size,
                          shim_arg_layout)
from ember_nv.compiler import NVShimCompiler
from ember_nv.queue import (DMA_SEC_OP_INC_METHOD, GP_ENTRY_ADDRESS_BITS, LAUNCH_DMA, LINE_LENGTH_IN, OFFSET_IN_UPPER,
                            QMD_LAYOUTS, QMD_MAJOR_VERSION_BITS, QMD_V4, SEM_ACQUIRE_GEQ, SEM_ADDR_HI, SEM_ADDR_LO,
                            SEM_EXECUTE, SEM_PAYLOAD_HI, SEM_PAYLOAD_LO, SEM_TIMESTAMP, SEND_PCAS_A,
                            SEND_SIGNALING_PCAS2_B, SUBC_COMPUTE, SUBC_COPY, SUBC_HOST, USERD_GP_GET, USERD_GP_PUT,
                            GPFifo, NVComputeQueue, NVCopyQueue, NVHCQDevice, NVLaunchable, decode_gpfifo_entry,
                            get_bits, qmd_layout_for_arch)

# ** reading QMDs back **

@dataclass
class QMDLaunch:
  """What the MOCK GPU reads back from a QMD."""
  program_address: int
  grid: tuple[int, int, int]
  block: tuple[int, int, int]
  cbuf0: tuple[int, int]
  shared_size: int
  registers: int

def read_qmd(addr: int) -> QMDLaunch:
  major = get_bits((ctypes.c_uint32 * 32).from_address(addr), *QMD_MAJOR_VERSION_BITS)
  if (layout := QMD_LAYOUTS.get(major)) is None: raise DeviceError(f"MOCK+NV: unknown QMD major version {major}")
  q = (ctypes.c_uint32 * (layout.size // 4)).from_address(addr)
  g = lambda name: layout.get(q, name)  # noqa: E731
  return QMDLaunch(g("program_address_lower") | g("program_address_upper") << 32,
                   (g("grid_width"), g("grid_height"), g("grid_depth")),
                   (g("cta_thread_dimension0"), g("cta_thread_dimension1"), g("cta_thread_dimension2")),
                   ((g("constant_buffer_addr_lower0") | g("constant_buffer_addr_upper0") << 32) << layout.cbuf_shift,
                    g("constant_buffer_size_shifted4_0") << 4), g("shared_memory_size"), g("register_count"))

# ** the MOCK GPU **

@dataclass
class _Channel:
  fifo: GPFifo
  get: int = 0        # next entry to fetch
  word: int = 0       # next word of the entry being executed (an unsatisfied acquire stops there)
  regs: dict[tuple[int, int], int] | None = None

class MockNVGPU:
  """A software NV GPU: fetches GPFIFO entries of each channel whose doorbell rang, decodes their pushbuffer methods
  and performs them on host memory. An acquire that is not satisfied stops its channel there, as on a GPU; the other
  channels go on."""
  def __init__(self) -> None:
    self.kernels: dict[str, HostKernel] = {}
    self.channels: dict[int, _Channel] = {}
    self.executed_methods = 0
    self.doorbells: list[int] = []
    self.launches: list[int] | None = None  # a test sets a list: the program address of every launch is appended
  def add_channel(self, fifo: GPFifo) -> None: self.channels[fifo.token] = _Channel(fifo, regs={})
  def doorbell(self, token: int) -> None:
    if token not in self.channels: raise DeviceError(f"MOCK+NV: doorbell rung with unknown work submit token {token}")
    self.doorbells.append(token)
    self.run_pending()
  @property
  def pending(self) -> int:
    """GPFIFO entries written (GPPut) and not yet completed, over every channel."""
    return sum((ch.fifo.put - ch.get) % ch.fifo.entries for ch in self.channels.values())
  def run_pending(self) -> None:
    progress = True
    while progress:
      progress = False
      for ch in self.channels.values():
        while ch.get != ctypes.c_uint32.from_address(ch.fifo.userd_addr + USERD_GP_PUT).value:
          addr, nwords = decode_gpfifo_entry(ch.fifo.ring[ch.get])
          if not self._execute(ch, addr, nwords): break
          ch.get, ch.word, progress = (ch.get + 1) % ch.fifo.entries, 0, True
          ctypes.c_uint32.from_address(ch.fifo.userd_addr + USERD_GP_GET).value = ch.get
  def drop_pending(self) -> None:
    """Forget every entry not yet completed (a test that leaves a queue waiting on a signal nobody releases)."""
    for ch in self.channels.values():
      ch.get, ch.word = ch.fifo.put, 0
      ctypes.c_uint32.from_address(ch.fifo.userd_addr + USERD_GP_GET).value = ch.get
  def _execute(self, ch: _Channel, addr: int, nwords: int) -> bool:
    words = (ctypes.c_uint32 * nwords).from_address(addr)
    regs = ch.regs if ch.regs is not None else {}
    while ch.word < nwords:
      i, header = ch.word, words[ch.word]
      if header >> 29 != DMA_SEC_OP_INC_METHOD:
        raise DeviceError(f"MOCK+NV: unsupported pushbuffer header {header:#010x} at word {i}")
      count, subc, mthd = (header >> 16) & 0x1fff, (header >> 13) & 7, (header & 0xfff) << 2
      for k in range(count): regs[(subc, mthd + 4 * k)] = words[i + 1 + k]
      if not self.method(subc, mthd + 4 * (count - 1), regs): return False
      self.executed_methods += 1
      ch.word = i + 1 + count
    return True
  def method(self, subc: int, mthd: int, regs: dict[tuple[int, int], int]) -> bool:
    if subc == SUBC_HOST and mthd == SEM_EXECUTE:
      addr = regs[(subc, SEM_ADDR_LO)] | regs[(subc, SEM_ADDR_HI)] << 32
      value = regs[(subc, SEM_PAYLOAD_LO)] | regs[(subc, SEM_PAYLOAD_HI)] << 32
      word, execute = ctypes.c_uint64.from_address(addr), regs[(subc, SEM_EXECUTE)]
      if execute & 0x7 == SEM_ACQUIRE_GEQ: return word.value >= value
      word.value = value
      if execute & SEM_TIMESTAMP: ctypes.c_uint64.from_address(addr + 8).value = time.perf_counter_ns()
    elif subc == SUBC_COMPUTE and mthd == SEND_SIGNALING_PCAS2_B: self.launch(regs[(subc, SEND_PCAS_A)] << 8)
    elif subc == SUBC_COPY and mthd == LAUNCH_DMA:
      src = regs[(subc, OFFSET_IN_UPPER)] << 32 | regs[(subc, OFFSET_IN_UPPER + 4)]
      dest = regs[(subc, OFFSET_IN_UPPER + 8)] << 32 | regs[(subc, OFFSET_IN_UPPER + 12)]
      ctypes.memmove(dest, src, regs[(subc, LINE_LENGTH_IN)])
    return True
  def launch(self, qmd_addr: int) -> None:
    """Run the grid a QMD describes: the program is the host-shim ELF at its program address (its size read from the
    ELF header), constant buffer 0 is the parameter block."""
    q = read_qmd(qmd_addr)
    if self.launches is not None: self.launches.append(q.program_address)
    code = ctypes.string_at(q.program_address, elf_image_size(q.program_address, "MOCK+NV: the QMD's program address"))
    key = hashlib.sha256(code).hexdigest()
    if (kernel := self.kernels.get(key)) is None: kernel = self.kernels[key] = HostKernel(code)
    kernel.run(ctypes.string_at(*q.cbuf0), q.grid, q.block)

# ** the MOCK device **

_MAP_PRIVATE, _MAP_ANONYMOUS, _MAP_32BIT, _PROT_RW = 0x02, 0x20, 0x40, 0x3

def host_pages(size: int, low: bool = False) -> HCQBuffer:
  """Page-aligned anonymous host memory, below 2 GiB when `low` (Linux x86-64 MAP_32BIT): MOCK pushbuffers and QMDs
  must sit below 2^40 (see the module docstring). Rings live as long as the device; a graph's memory goes back with
  `host_pages_free`."""
  libc = ctypes.CDLL(None, use_errno=True)
  libc.mmap.restype = ctypes.c_void_p
  libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
  addr = libc.mmap(None, size, _PROT_RW, _MAP_PRIVATE | _MAP_ANONYMOUS | (_MAP_32BIT if low else 0), -1, 0)
  if addr in (None, ctypes.c_void_p(-1).value) or (low and addr >= 1 << GP_ENTRY_ADDRESS_BITS):
    raise DeviceError(f"MOCK+NV could not map {size} bytes{' below 2^40' if low else ''} (errno {ctypes.get_errno()}); "
                      "MOCK+NV needs Linux on x86-64")
  return HCQBuffer(addr, size)

def host_pages_free(buf: HCQBuffer) -> None:
  libc = ctypes.CDLL(None, use_errno=True)
  libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
  if libc.munmap(ctypes.c_void_p(buf.va_addr), buf.size) != 0:
    raise DeviceError(f"MOCK+NV could not unmap {buf.size} bytes at {buf.va_addr:#x} (errno {ctypes.get_errno()})")

class NVMockProgram(NVLaunchable):
  """MOCK+NV: the host-shim shared object uploaded to memory; the QMD's program address points at its first byte, and
  the kernel parameters are constant buffer 0 as they are."""
  def __init__(self, device: NVMockDevice, name: str, lib: bytes) -> None:
    self.code = device._host_alloc(len(lib))
    ctypes.memmove(self.code.va_addr, lib, len(lib))
    self.program_address = self.code.va_addr
    super().__init__(device, name, *device.arg_layout(name, lib))
    self.cbuf0_size = max(16, -(-self.args_size // 16) * 16)

class NVMockAllocator(HCQAllocator):
  """MOCK+NV device memory: host memory whose address is the GPU virtual address."""
  def _alloc(self, size: int, options: BufferSpec) -> HCQBuffer:
    mem = (ctypes.c_uint8 * max(size, 1))()
    return HCQBuffer(ctypes.addressof(mem), size, mem)

class NVMockDevice(NVHCQDevice):
  """DEV=MOCK+NV: the NV queues, allocator, programs and graph, executed by `MockNVGPU` through real GPFIFO rings,
  QMDs and doorbells. Kernels are the CUDA C of `CUDARenderer` built for the host through the shim
  (`NVShimCompiler`, the compiler the registry builds for the MOCK interface); NVRTC is not needed. The QMD version
  follows the renderer's arch (sm_90: 4.0, else 3.0)."""
  RING_ENTRIES = 1024
  def __init__(self, device: str, renderer: Renderer, compiler: NVShimCompiler) -> None:
    self.gpu = MockNVGPU()
    self.qmd_layout = qmd_layout_for_arch(getattr(renderer, "arch", "sm_80"))
    signals = host_pages(4096)
    super().__init__(device, NVMockAllocator(self), renderer, compiler,
                     lambda name, lib: NVMockProgram(self, name, lib), NVComputeQueue, NVCopyQueue, signals)
    control = host_pages(2 * (self.RING_ENTRIES * 8 + 4096))
    fifos = {}
    for i, engine in enumerate(("compute", "copy")):
      base = control.va_addr + i * (self.RING_ENTRIES * 8 + 4096)
      fifos[engine] = GPFifo(base + 4096, self.RING_ENTRIES, base, i + 1, self.gpu.doorbell, self.gpu.run_pending)
      self.gpu.add_channel(fifos[engine])
    self._rings(host_pages(4 << 20, low=True), host_pages(QMD_V4.size * 4096, low=True), fifos)
  def _progress(self) -> None: self.gpu.run_pending()
  def _command_memory(self, size: int) -> HCQBuffer: return host_pages(-(-size // 4096) * 4096, low=True)
  def _host_alloc(self, size: int) -> HCQBuffer:
    """Page-aligned host memory (QMD 4.0 needs constant buffers 64-byte aligned)."""
    return host_pages(-(-max(size, 1) // 4096) * 4096)
  def _host_free(self, buf: HCQBuffer) -> None: host_pages_free(buf)
  def arg_layout(self, name: str, lib: bytes) -> tuple[list[tuple[int, int]], int]:
    """The parameter block of a host-shim kernel, from the source its compiler remembers."""
    return shim_arg_layout(self.compiler, name, lib)

