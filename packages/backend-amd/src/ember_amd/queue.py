"""AMD hardware command queues (HCQ): PM4 type-3 packets for the compute queue, SDMA packets for the copy queue.

Packet encodings follow AMD's published headers (the kernel driver's `soc15d.h`/`nvd.h` PM4 opcodes and the
`sdma_v5`/`sdma_v6` packet layouts):

* PM4 type-3 header: `(3 << 30) | ((body_dwords - 1) << 16) | (opcode << 8)`.
* SET_SH_REG (0x76): register offset from 0x2c00, then values; sets COMPUTE_PGM_LO/HI (code address >> 8),
  COMPUTE_PGM_RSRC1/2, COMPUTE_USER_DATA_0.. (the kernarg segment pointer, the only user SGPRs our kernels enable),
  COMPUTE_NUM_THREAD_X/Y/Z (the workgroup size).
* DISPATCH_DIRECT (0x15): grid x, y, z in workgroups, DISPATCH_INITIATOR.
* RELEASE_MEM (0x49): event, data_sel (1: 32-bit value, 2: 64-bit value, 3: the 64-bit GPU timestamp), address,
  value; the end-of-pipe write that signals completion.
* WAIT_REG_MEM (0x3c): function 5 (>=) on memory, address, reference, mask; the queue stalls until it holds.
* ACQUIRE_MEM (0x58): cache invalidate/writeback over the full range (GCR_CNTL), the memory barrier.
* SDMA COPY_LINEAR (op 1, sub-op 0): byte count - 1, parameters, source, destination; at most 4 MiB per packet.
* SDMA FENCE (op 5): address, one 32-bit value (a 64-bit signal takes two). SDMA POLL_REGMEM (op 8): function >= on
  memory. SDMA TIMESTAMP (op 13, sub-op 2 GET_GLOBAL). SDMA NOP (op 0).

A queue's `words` are copied into the device's ring buffer at its write pointer on `submit`, and the doorbell is rung
with the new write pointer (`device.ring_doorbell`). What this does not set that a real dispatch needs is listed in
README.md (COMPUTE_TMPRING_SIZE for scratch, RESOURCE_LIMITS, PGM_RSRC3, the AQL-free dispatch's user SGPR layout
beyond the kernarg pointer).
"""
from __future__ import annotations
from ember.plugin import DeviceError, HCQArgs, HCQCompiled, HCQProgram, HCQSignal, HWQueue

# ** PM4 **
PACKET3_NOP, PACKET3_DISPATCH_DIRECT, PACKET3_WAIT_REG_MEM, PACKET3_RELEASE_MEM, PACKET3_ACQUIRE_MEM = \
  0x10, 0x15, 0x3c, 0x49, 0x58
PACKET3_SET_SH_REG = 0x76
SH_REG_BASE = 0x2c00
COMPUTE_NUM_THREAD_X, COMPUTE_PGM_LO, COMPUTE_PGM_RSRC1, COMPUTE_USER_DATA_0 = 0x2e07, 0x2e0c, 0x2e12, 0x2e40
DISPATCH_INITIATOR = (1 << 0) | (1 << 2) | (1 << 15)  # COMPUTE_SHADER_EN | FORCE_START_AT_000 | CS_W32_EN
WAIT_REG_MEM_FUNCTION_GEQ, WAIT_REG_MEM_MEM_SPACE_MEMORY = 5, 1
EVENT_CACHE_FLUSH_AND_INV_TS = 0x14
EVENT_INDEX_EOP = 5
DATA_SEL_32, DATA_SEL_64, DATA_SEL_TIMESTAMP = 1, 2, 3
GCR_CNTL_FULL = 0x3f0  # GL2 invalidate + writeback, GLM, GLK, GLV, GL1 invalidate (gfx10+ GCR_CNTL bits)

def packet3(opcode: int, *body: int) -> list[int]:
  """One PM4 type-3 packet: its header and body dwords."""
  if not body: raise DeviceError(f"PM4 packet {opcode:#x} needs a body")
  return [(3 << 30) | ((len(body) - 1) << 16) | (opcode << 8), *[b & 0xffffffff for b in body]]

# ** SDMA **
SDMA_OP_NOP, SDMA_OP_COPY, SDMA_OP_FENCE, SDMA_OP_POLL_REGMEM, SDMA_OP_TIMESTAMP = 0, 1, 5, 8, 13
SDMA_SUBOP_COPY_LINEAR, SDMA_SUBOP_TIMESTAMP_GET_GLOBAL = 0, 2
SDMA_MAX_COPY = 1 << 22
SDMA_POLL_FUNC_GEQ = 5

def sdma_header(op: int, sub_op: int = 0, extra: int = 0) -> int: return op | (sub_op << 8) | extra

def _lo_hi(x: int) -> tuple[int, int]: return x & 0xffffffff, (x >> 32) & 0xffffffff

class AMDQueue(HWQueue):
  """Packets of one queue as dwords; `value_at` maps a wait/signal command to the dwords of its value."""
  ring = "compute"
  def __init__(self) -> None:
    super().__init__()
    self.words: list[int] = []
    self.value_at: dict[int, list[int]] = {}  # command index -> word indices holding its value (lo, then hi)
  def _patch_value(self, command_index: int, value: int) -> None:
    for k, at in enumerate(self.value_at[command_index]): self.words[at] = (value >> (32 * k)) & 0xffffffff
  def _exec(self, prg: HCQProgram, args: HCQArgs, global_size: tuple[int, int, int],
            local_size: tuple[int, int, int]) -> None:
    raise DeviceError(f"{type(self).__name__} cannot launch kernels; use the compute queue (AMDComputeQueue)")
  def _copy(self, dest: int, src: int, nbytes: int) -> None:
    raise DeviceError(f"{type(self).__name__} cannot copy; use the SDMA copy queue (AMDCopyQueue)")
  def _submit(self, device: HCQCompiled) -> None:
    ring_doorbell = getattr(device, "ring_doorbell", None)
    if ring_doorbell is None: raise DeviceError(f"an AMD queue cannot be submitted to {device!r}")
    ring_doorbell(self.ring, self.words)

class AMDComputeQueue(AMDQueue):
  """PM4 on a compute ring: dispatches, end-of-pipe signals, waits on memory, cache barriers."""
  ring = "compute"
  def _wait(self, signal: HCQSignal, value: int) -> None:
    """WAIT_REG_MEM: the CP stalls until the signal's low dword is >= `value`."""
    self.value_at[len(self.commands)] = [len(self.words) + 4]
    lo, hi = _lo_hi(signal.addr)
    control = WAIT_REG_MEM_FUNCTION_GEQ | (WAIT_REG_MEM_MEM_SPACE_MEMORY << 4)
    self.words += packet3(PACKET3_WAIT_REG_MEM, control, lo, hi, value, 0xffffffff, 0x4)
  def _release(self, signal: HCQSignal, value: int, data_sel: int) -> None:
    lo, hi = _lo_hi(signal.addr)
    vlo, vhi = _lo_hi(value)
    self.value_at[len(self.commands)] = [len(self.words) + 5, len(self.words) + 6]
    event = EVENT_CACHE_FLUSH_AND_INV_TS | (EVENT_INDEX_EOP << 8)
    self.words += packet3(PACKET3_RELEASE_MEM, event, data_sel << 29, lo, hi, vlo, vhi, 0)
  def _signal(self, signal: HCQSignal, value: int) -> None:
    """RELEASE_MEM with data_sel 2: once every earlier dispatch is done and flushed, the 64-bit value is written."""
    self._release(signal, value, DATA_SEL_64)
  def _timestamp(self, signal: HCQSignal) -> None: self._release(signal, 0, DATA_SEL_TIMESTAMP)
  def _memory_barrier(self) -> None:
    """ACQUIRE_MEM over the whole address space: later packets see the writes of earlier dispatches."""
    self.words += packet3(PACKET3_ACQUIRE_MEM, 0, 0xffffffff, 0xffffff, 0, 0, 0xa, GCR_CNTL_FULL)
  def _exec(self, prg: HCQProgram, args: HCQArgs, global_size: tuple[int, int, int],
            local_size: tuple[int, int, int]) -> None:
    code_addr, rsrc1, rsrc2 = getattr(prg, "code_addr", None), getattr(prg, "rsrc1", 0), getattr(prg, "rsrc2", 0)
    if code_addr is None or code_addr & 0xff:
      raise DeviceError(f"AMDComputeQueue launches AMDProgram kernels whose code is 256-byte aligned, got {prg!r}")
    pgm_lo, pgm_hi = _lo_hi(code_addr >> 8)
    args_lo, args_hi = _lo_hi(args.buf.va_addr)
    self.words += packet3(PACKET3_SET_SH_REG, COMPUTE_PGM_LO - SH_REG_BASE, pgm_lo, pgm_hi)
    self.words += packet3(PACKET3_SET_SH_REG, COMPUTE_PGM_RSRC1 - SH_REG_BASE, rsrc1, rsrc2)
    self.words += packet3(PACKET3_SET_SH_REG, COMPUTE_USER_DATA_0 - SH_REG_BASE, args_lo, args_hi)
    self.words += packet3(PACKET3_SET_SH_REG, COMPUTE_NUM_THREAD_X - SH_REG_BASE, *local_size)
    self.words += packet3(PACKET3_DISPATCH_DIRECT, *global_size, DISPATCH_INITIATOR)

class AMDCopyQueue(AMDQueue):
  """SDMA on a copy ring: linear copies, fences, polls, timestamps."""
  ring = "sdma"
  def _wait(self, signal: HCQSignal, value: int) -> None:
    """POLL_REGMEM: the SDMA engine stalls until the signal's low dword is >= `value`."""
    self.value_at[len(self.commands)] = [len(self.words) + 3]
    lo, hi = _lo_hi(signal.addr)
    header = sdma_header(SDMA_OP_POLL_REGMEM, 0, (SDMA_POLL_FUNC_GEQ << 28) | (1 << 31))
    self.words += [header, lo, hi, value & 0xffffffff, 0xffffffff, 0x10 | (0xfff << 16)]
  def _signal(self, signal: HCQSignal, value: int) -> None:
    """Two FENCE packets (the high dword, then the low one): after the earlier copies, the 64-bit value is written."""
    vlo, vhi = _lo_hi(value)
    hi_at = len(self.words) + 3
    for addr, word in ((signal.addr + 4, vhi), (signal.addr, vlo)):
      lo, hi = _lo_hi(addr)
      self.words += [sdma_header(SDMA_OP_FENCE), lo, hi, word]
    self.value_at[len(self.commands)] = [hi_at + 4, hi_at]
  def _timestamp(self, signal: HCQSignal) -> None:
    lo, hi = _lo_hi(signal.addr)
    self.words += [sdma_header(SDMA_OP_TIMESTAMP, SDMA_SUBOP_TIMESTAMP_GET_GLOBAL), lo, hi]
  def _memory_barrier(self) -> None:
    """SDMA executes its packets in order: a NOP marks the barrier (the copy engine has no caches to flush)."""
    self.words += [sdma_header(SDMA_OP_NOP)]
  def _copy(self, dest: int, src: int, nbytes: int) -> None:
    """COPY_LINEAR packets of at most 4 MiB each."""
    for offset in range(0, nbytes, SDMA_MAX_COPY):
      size = min(SDMA_MAX_COPY, nbytes - offset)
      slo, shi = _lo_hi(src + offset)
      dlo, dhi = _lo_hi(dest + offset)
      self.words += [sdma_header(SDMA_OP_COPY, SDMA_SUBOP_COPY_LINEAR), size - 1, 0, slo, shi, dlo, dhi]
