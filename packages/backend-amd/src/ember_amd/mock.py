"""The MOCK interface of the AMD backend (DEV=MOCK+AMD): a software GPU that decodes the PM4 and SDMA packets the AMD
queues write into their rings and performs them on host memory, and the HCQ device, allocator and programs that drive
it.

*The MOCK GPU* (`MockAMDGPU`) owns one ring per engine (PM4 compute, SDMA). A doorbell hands it the new write pointer;
it then executes packets from the read pointer on: SET_SH_REG into a register file, DISPATCH_DIRECT launches the
program at COMPUTE_PGM_LO/HI << 8 (on the MOCK the code there is the host shim's shared object, `compiler.
AMDShimCompiler`, whose length the MOCK reads from its ELF header), RELEASE_MEM writes 32 or 64 bits or the timer,
WAIT_REG_MEM and POLL_REGMEM stall the ring until memory holds the value, ACQUIRE_MEM is a barrier (host memory is
coherent), COPY_LINEAR and FENCE copy and write. See `ember_amd.queue` for the packet formats.
"""
from __future__ import annotations
import ctypes
import hashlib
import time
from ember.plugin import (BufferSpec, DeviceError, HCQAllocator, HCQBuffer, HCQCompiled, HCQProgram, HostKernel,
                          Renderer, elf_image_size, shim_arg_layout)
from ember_amd import queue as q
from ember_amd.compiler import AMDShimCompiler

# ** the MOCK GPU **

class Ring:
  """One engine's ring buffer in host memory: dwords, a read pointer the engine advances and a write pointer the
  doorbell sets (both in dwords, growing without wrapping; the slot is `ptr % size`)."""
  def __init__(self, size_dwords: int) -> None:
    self.size = size_dwords
    self.mem = (ctypes.c_uint32 * size_dwords)()
    self.rptr = self.wptr = 0
  def write(self, words: list[int]) -> int:
    """Append `words` at the write pointer (the host side of a submission); returns the new write pointer."""
    if self.wptr + len(words) - self.rptr > self.size:
      raise DeviceError(f"AMD ring overflow: {len(words)} dwords do not fit ({self.wptr - self.rptr} of {self.size} "
                        "pending); synchronize before submitting more")
    for k, w in enumerate(words): self.mem[(self.wptr + k) % self.size] = w
    return self.wptr + len(words)
  def __getitem__(self, ptr: int) -> int: return self.mem[ptr % self.size]

class MockAMDGPU:
  """A software AMD GPU: a PM4 compute ring and an SDMA ring, each executed in order up to its write pointer."""
  def __init__(self, ring_dwords: int = 1 << 16) -> None:
    self.rings = {"compute": Ring(ring_dwords), "sdma": Ring(ring_dwords)}
    self.sh_regs: dict[int, int] = {}
    self.kernels: dict[str, HostKernel] = {}
    self.executed = {"compute": 0, "sdma": 0}  # packets executed per ring
    self.launches: list[int] | None = None  # a test sets a list: the code address of every dispatch is appended
  def doorbell(self, ring: str, wptr: int) -> None:
    self.rings[ring].wptr = wptr
    self.run_pending()
  def run_pending(self) -> None:
    """Execute both rings until neither can advance (empty, or stalled on a wait)."""
    progress = True
    while progress:
      progress = False
      for name, ring in self.rings.items():
        while ring.rptr < ring.wptr:
          size = self.pm4(ring) if name == "compute" else self.sdma(ring)
          if size == 0: break
          ring.rptr += size
          self.executed[name] += 1
          progress = True

  # ** PM4 **
  def pm4(self, ring: Ring) -> int:
    """Execute the PM4 packet at the read pointer; returns its size in dwords, 0 if it stalls."""
    header = ring[ring.rptr]
    if header >> 30 != 3:
      raise DeviceError(f"MOCK+AMD: PM4 packet type {header >> 30} at dword {ring.rptr}; it executes type 3 only")
    opcode, count = (header >> 8) & 0xff, ((header >> 16) & 0x3fff) + 1
    body = [ring[ring.rptr + 1 + k] for k in range(count)]
    if opcode == q.PACKET3_SET_SH_REG:
      for k, value in enumerate(body[1:]): self.sh_regs[q.SH_REG_BASE + body[0] + k] = value
    elif opcode == q.PACKET3_DISPATCH_DIRECT: self.dispatch(tuple(body[:3]))  # type: ignore[arg-type]
    elif opcode == q.PACKET3_WAIT_REG_MEM:
      if body[0] & 0xf != q.WAIT_REG_MEM_FUNCTION_GEQ or (body[0] >> 4) & 3 != q.WAIT_REG_MEM_MEM_SPACE_MEMORY:
        raise DeviceError(f"MOCK+AMD: WAIT_REG_MEM control {body[0]:#x} is not 'memory >= reference'")
      word = ctypes.c_uint32.from_address(body[1] | body[2] << 32).value
      if word & body[4] < body[3]: return 0
    elif opcode == q.PACKET3_RELEASE_MEM:
      self.write_data(body[1] >> 29, body[2] | body[3] << 32, body[4] | body[5] << 32)
    elif opcode not in (q.PACKET3_ACQUIRE_MEM, q.PACKET3_NOP):
      raise DeviceError(f"MOCK+AMD: unsupported PM4 opcode {opcode:#x} at dword {ring.rptr}")
    return 1 + count

  def write_data(self, data_sel: int, addr: int, value: int) -> None:
    if data_sel == q.DATA_SEL_32: ctypes.c_uint32.from_address(addr).value = value & 0xffffffff
    elif data_sel == q.DATA_SEL_64: ctypes.c_uint64.from_address(addr).value = value
    elif data_sel == q.DATA_SEL_TIMESTAMP: ctypes.c_uint64.from_address(addr).value = time.perf_counter_ns()
    else: raise DeviceError(f"MOCK+AMD: RELEASE_MEM data_sel {data_sel} is not supported (1, 2 or 3)")

  def dispatch(self, grid: tuple[int, int, int]) -> None:
    regs = self.sh_regs
    code = (regs[q.COMPUTE_PGM_LO] | regs[q.COMPUTE_PGM_LO + 1] << 32) << 8
    if self.launches is not None: self.launches.append(code)
    image = ctypes.string_at(code, elf_image_size(code, "MOCK+AMD: the program address (COMPUTE_PGM_LO/HI)"))
    key = hashlib.sha256(image).hexdigest()
    if (kernel := self.kernels.get(key)) is None: kernel = self.kernels[key] = HostKernel(image)
    kernargs = regs[q.COMPUTE_USER_DATA_0] | regs[q.COMPUTE_USER_DATA_0 + 1] << 32
    workgroup = (regs[q.COMPUTE_NUM_THREAD_X], regs[q.COMPUTE_NUM_THREAD_X + 1], regs[q.COMPUTE_NUM_THREAD_X + 2])
    kernel.run(kernargs, grid, workgroup)

  # ** SDMA **
  def sdma(self, ring: Ring) -> int:
    """Execute the SDMA packet at the read pointer; returns its size in dwords, 0 if it stalls."""
    at = ring.rptr
    header = ring[at]
    op, sub_op = header & 0xff, (header >> 8) & 0xff
    if op == q.SDMA_OP_NOP: return 1
    if op == q.SDMA_OP_COPY and sub_op == q.SDMA_SUBOP_COPY_LINEAR:
      count, src, dst = ring[at + 1] + 1, ring[at + 3] | ring[at + 4] << 32, ring[at + 5] | ring[at + 6] << 32
      ctypes.memmove(dst, src, count)
      return 7
    if op == q.SDMA_OP_FENCE:
      ctypes.c_uint32.from_address(ring[at + 1] | ring[at + 2] << 32).value = ring[at + 3]
      return 4
    if op == q.SDMA_OP_POLL_REGMEM:
      if (header >> 28) & 7 != q.SDMA_POLL_FUNC_GEQ or not header >> 31:
        raise DeviceError(f"MOCK+AMD: SDMA POLL_REGMEM header {header:#x} is not 'memory >= value'")
      word = ctypes.c_uint32.from_address(ring[at + 1] | ring[at + 2] << 32).value
      return 0 if word & ring[at + 4] < ring[at + 3] else 6
    if op == q.SDMA_OP_TIMESTAMP and sub_op == q.SDMA_SUBOP_TIMESTAMP_GET_GLOBAL:
      ctypes.c_uint64.from_address(ring[at + 1] | ring[at + 2] << 32).value = time.perf_counter_ns()
      return 3
    raise DeviceError(f"MOCK+AMD: unsupported SDMA packet op {op} sub-op {sub_op} at dword {at}")

# ** the MOCK device **

def _aligned(size: int, align: int) -> HCQBuffer:
  mem = (ctypes.c_uint8 * (size + align))()
  addr = -(-ctypes.addressof(mem) // align) * align
  return HCQBuffer(addr, size, mem)

class AMDMockAllocator(HCQAllocator):
  """MOCK+AMD device memory: host memory whose address is the GPU virtual address (256-byte aligned)."""
  def _alloc(self, size: int, options: BufferSpec) -> HCQBuffer: return _aligned(max(size, 1), 256)

class AMDMockProgram(HCQProgram):
  """A kernel binary uploaded to 256-byte aligned device memory (COMPUTE_PGM_LO holds its address >> 8)."""
  def __init__(self, device: AMDMockDevice, name: str, lib: bytes) -> None:
    self.code = _aligned(len(lib), 256)
    ctypes.memmove(self.code.va_addr, lib, len(lib))
    self.code_addr, self.rsrc1, self.rsrc2 = self.code.va_addr, 0, 0
    super().__init__(device, name, *device.arg_layout(name, lib))

class AMDMockDevice(HCQCompiled):
  """DEV=MOCK+AMD: the AMD queues, allocator, programs and graph, executed by `MockAMDGPU`. Kernels are the HIP-style C
  of `HIPRenderer` built for the host through the shim (`AMDShimCompiler`); no ROCm is needed."""
  def __init__(self, device: str, renderer: Renderer) -> None:
    self.gpu = MockAMDGPU()
    signals = _aligned(64, 64)
    self._signal_keep = signals
    super().__init__(device, AMDMockAllocator(self), renderer, AMDShimCompiler(),
                     lambda name, lib: AMDMockProgram(self, name, lib), q.AMDComputeQueue, q.AMDCopyQueue, signals)
  def ring_doorbell(self, ring: str, words: list[int]) -> None:
    """Write a queue's packets into the engine's ring and ring its doorbell with the new write pointer."""
    self.gpu.doorbell(ring, self.gpu.rings[ring].write(words))
  def _progress(self) -> None: self.gpu.run_pending()
  def arg_layout(self, name: str, lib: bytes) -> tuple[list[tuple[int, int]], int]:
    """The parameter block of a host-shim kernel, from the source its compiler remembers."""
    return shim_arg_layout(self.compiler, name, lib)
