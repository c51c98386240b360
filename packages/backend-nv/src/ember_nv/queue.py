"""NV hardware command queues (HCQ): pushbuffer methods submitted through GPFIFO rings, and the device side of them
(`NVHCQDevice`: the rings and channels both NV interfaces, MOCK and the kernel driver, submit through).

The formats are the hardware's, as NVIDIA's class headers define them (open-gpu-kernel-modules, src/common/sdk/nvidia/
inc/class and kernel-open/nvidia-uvm):

* *Pushbuffer methods* (clc56f.h `NVC56F_DMA_*`): an incrementing-method header `SEC_OP=INC_METHOD (31:29) | COUNT
  (28:16) | SUBCHANNEL (15:13) | ADDRESS = method >> 2 (11:0)` followed by COUNT data words. Host semaphores
  (`SEM_ADDR_LO..SEM_EXECUTE`, 64-bit payloads, acquire ">=" and release, release with timestamp), compute launches
  (clc6c0.h `SEND_PCAS_A` = QMD address >> 8, `SEND_SIGNALING_PCAS2_B`), 1D copies on the copy engine (clc6b5.h
  `OFFSET_IN_UPPER..LAUNCH_DMA`).
* *GPFIFO entries* (`NVC56F_GP_ENTRY0/1`): one 64-bit word per pushbuffer segment, `GET` = address bits 31:2 in word 0,
  `GET_HI` = address bits 39:32 and `LENGTH` (words, 30:10) and `LEVEL` in word 1. The CPU writes entries into the
  channel's ring, then `GPPut` (byte 0x8c of the channel's USERD page, `Nvc56fControl`), then rings the doorbell.
* *QMDs* (queue meta data, the launch descriptor `SEND_PCAS_A` points at): QMD version 3.0 for Ampere/Ada compute
  classes (256 bytes; bit positions from NVIDIA's QMDV03_00 header) and version 4.0 for Hopper (384 bytes; bit
  positions from Mesa NVK's clcbc0qmd.h, the only public copy). `QMDLayout` maps each field name to (high bit, low bit)
  over the QMD seen as little-endian 32-bit words; both versions keep QMD_MAJOR_VERSION at bits 583:580, which is how
  the MOCK decoder tells them apart.
* *Timestamps*: a semaphore release with RELEASE_TIMESTAMP writes a 16-byte record, the 64-bit payload and then the
  GPU's nanosecond timer. `timestamp(signal)` releases at `signal.addr - 8`, so the timer lands in the signal's word
  and the payload in the 8 unused bytes below it (every HCQ signal owns a 16-byte slot and uses its first 8 bytes).

Addresses: a GPFIFO entry holds 40 address bits and `SEND_PCAS_A` holds QMD address >> 8 in 32 bits, so pushbuffers
and QMDs must live below 2^40. On hardware they are GPU virtual addresses we choose; the MOCK keeps them in host memory
mapped below 2 GiB (`mock.host_pages`, Linux x86-64 MAP_32BIT) so that host pointers are valid values for those
fields.
Every other address field (semaphores, copies, program, constant buffer) holds the full host address.
"""
from __future__ import annotations
import ctypes
import time
from dataclasses import dataclass
from typing import Callable, Protocol
from ember.plugin import DeviceError, HCQArgs, HCQBuffer, HCQCompiled, HCQProgram, HCQSignal, HWQueue

SUBC_HOST, SUBC_COMPUTE, SUBC_COPY = 0, 1, 4
# host class methods (clc56f.h)
SET_OBJECT = 0x0000
SEM_ADDR_LO, SEM_ADDR_HI, SEM_PAYLOAD_LO, SEM_PAYLOAD_HI = 0x005c, 0x0060, 0x0064, 0x0068
SEM_EXECUTE, WFI = 0x006c, 0x0078
SEM_ACQUIRE_GEQ, SEM_RELEASE = 3, 1                            # SEM_EXECUTE_OPERATION (2:0): ACQ_CIRC_GEQ, RELEASE
SEM_RELEASE_WFI, SEM_PAYLOAD_64, SEM_TIMESTAMP = 1 << 20, 1 << 24, 1 << 25  # RELEASE_WFI, PAYLOAD_SIZE, TIMESTAMP
DMA_SEC_OP_INC_METHOD = 1
# compute class methods (clc6c0.h; the same offsets in clc7c0/clc9c0/clcbc0)
SEND_PCAS_A, SEND_SIGNALING_PCAS2_B, PCAS_INVALIDATE_COPY_SCHEDULE = 0x02b4, 0x02c0, 9
SET_SHADER_SHARED_MEMORY_WINDOW_A, SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A = 0x02a0, 0x02e4
SET_SHADER_LOCAL_MEMORY_A, SET_SHADER_LOCAL_MEMORY_WINDOW_A = 0x0790, 0x07b0
# copy class methods (clc6b5.h): LAUNCH_DMA DATA_TRANSFER_TYPE=NON_PIPELINED (1:0 = 2), SRC/DST_MEMORY_LAYOUT=PITCH
OFFSET_IN_UPPER, LINE_LENGTH_IN, LAUNCH_DMA, DMA_1D_PITCH = 0x0400, 0x0418, 0x0300, 0x182
# GPFIFO entry (NVC56F_GP_ENTRY0/1) and the channel's USERD (Nvc56fControl)
GP_ENTRY_LEVEL_SUBROUTINE, GP_ENTRY_MAX_WORDS, GP_ENTRY_ADDRESS_BITS = 1, (1 << 21) - 1, 40
USERD_GP_GET, USERD_GP_PUT, USERD_SIZE = 0x88, 0x8c, 0x200
DOORBELL_OFFSET = 0x90  # NVC361_NOTIFY_CHANNEL_PENDING in the usermode (doorbell) page

def method(subchannel: int, mthd: int, *data: int) -> list[int]:
  """One incrementing-method header and its data words."""
  if not 0 < len(data) < 1 << 13: raise DeviceError(f"a pushbuffer method carries 1..8191 data words, got {len(data)}")
  return [(DMA_SEC_OP_INC_METHOD << 29) | (len(data) << 16) | (subchannel << 13) | (mthd >> 2),
          *[d & 0xffffffff for d in data]]

def gpfifo_entry(addr: int, nwords: int) -> int:
  """The 64-bit GPFIFO entry for a pushbuffer segment of `nwords` words at GPU address `addr`."""
  if addr % 4 or not 0 <= addr < 1 << GP_ENTRY_ADDRESS_BITS:
    raise DeviceError(f"a GPFIFO entry needs a 4-byte aligned pushbuffer address below 2^40, got {addr:#x}")
  if not 0 < nwords <= GP_ENTRY_MAX_WORDS:
    raise DeviceError(f"a GPFIFO entry holds 1..{GP_ENTRY_MAX_WORDS} words, got {nwords}; split the submission")
  word0 = addr & 0xfffffffc
  word1 = (addr >> 32) | (GP_ENTRY_LEVEL_SUBROUTINE << 9) | (nwords << 10)
  return word0 | word1 << 32

def decode_gpfifo_entry(entry: int) -> tuple[int, int]:
  """(pushbuffer address, length in words) of a GPFIFO entry."""
  word0, word1 = entry & 0xffffffff, entry >> 32
  return (word0 & 0xfffffffc) | (word1 & 0xff) << 32, (word1 >> 10) & GP_ENTRY_MAX_WORDS

def _lo_hi(x: int) -> tuple[int, int]: return x & 0xffffffff, x >> 32

# ** QMDs **

class Words(Protocol):
  """32-bit words read and written by index: a list, or a ctypes c_uint32 array over a QMD in device memory."""
  def __getitem__(self, index: int, /) -> int: ...
  def __setitem__(self, index: int, value: int, /) -> None: ...

def set_bits(words: Words, hi: int, lo: int, value: int) -> None:
  """Write `value` into bits hi..lo (inclusive) of a bit string stored as little-endian 32-bit words."""
  width = hi - lo + 1
  if value < 0 or value >> width:
    raise DeviceError(f"QMD value {value:#x} does not fit the {width}-bit field at bits {hi}:{lo}")
  pos = lo
  while pos <= hi:
    w, b = divmod(pos, 32)
    n = min(32 - b, hi - pos + 1)
    mask = ((1 << n) - 1) << b
    words[w] = (words[w] & ~mask & 0xffffffff) | (((value >> (pos - lo)) << b) & mask)
    pos += n

def get_bits(words: Words, hi: int, lo: int) -> int:
  value, pos = 0, lo
  while pos <= hi:
    w, b = divmod(pos, 32)
    n = min(32 - b, hi - pos + 1)
    value |= ((words[w] >> b) & ((1 << n) - 1)) << (pos - lo)
    pos += n
  return value

@dataclass(frozen=True)
class QMDLayout:
  """One QMD version: its size and each field's (high bit, low bit). `cbuf_shift` is how far constant buffer
  addresses are shifted right in the address fields (version 4 stores address >> 6)."""
  name: str
  major: int
  minor: int
  size: int
  cbuf_shift: int
  fields: dict[str, tuple[int, int]]
  def set(self, words: Words, field: str, value: int) -> None:
    if field not in self.fields: raise DeviceError(f"{self.name} has no field {field}")
    set_bits(words, *self.fields[field], value)
  def get(self, words: Words, field: str) -> int: return get_bits(words, *self.fields[field])

# QMD version 3.0 (Ampere AMPERE_COMPUTE_A/B 0xC6C0/0xC7C0, Ada ADA_COMPUTE_A 0xC9C0): NVC6C0_QMDV03_00_*
QMD_V3 = QMDLayout("QMD 3.0", 3, 0, 256, 0, {
  "sm_global_caching_enable": (134, 134), "invalidate_texture_header_cache": (186, 186),
  "invalidate_texture_sampler_cache": (187, 187), "invalidate_texture_data_cache": (188, 188),
  "invalidate_shader_data_cache": (189, 189), "cwd_membar_type": (369, 368), "api_visible_call_limit": (378, 378),
  "sampler_index": (382, 382), "grid_width": (415, 384), "grid_height": (431, 416), "grid_depth": (463, 448),
  "shared_memory_size": (561, 544), "min_sm_config_shared_mem_size": (567, 562),
  "max_sm_config_shared_mem_size": (574, 569), "qmd_version": (579, 576), "qmd_major_version": (583, 580),
  "cta_thread_dimension0": (607, 592), "cta_thread_dimension1": (623, 608), "cta_thread_dimension2": (639, 624),
  "constant_buffer_valid0": (640, 640), "register_count": (656, 648), "target_sm_config_shared_mem_size": (662, 657),
  "barrier_count": (767, 763), "release0_address_lower": (799, 768), "release0_address_upper": (807, 800),
  "release0_membar_type": (819, 819), "release0_enable": (823, 823), "release0_payload64b": (829, 829),
  "release0_structure_size": (831, 830), "release0_payload_lower": (863, 832), "release0_payload_upper": (895, 864),
  "constant_buffer_addr_lower0": (1055, 1024), "constant_buffer_addr_upper0": (1072, 1056),
  "constant_buffer_size_shifted4_0": (1087, 1075), "program_address_lower": (1567, 1536),
  "program_address_upper": (1584, 1568),
})
# QMD version 4.0 (Hopper HOPPER_COMPUTE_A 0xCBC0): NVCBC0_QMDV04_00_* as Mesa NVK's clcbc0qmd.h gives them
QMD_V4 = QMDLayout("QMD 4.0", 4, 0, 384, 6, {
  "qmd_type": (25, 23), "constant_buffer_valid0": (416, 416), "api_visible_call_limit": (568, 568),
  "sampler_index": (569, 569), "qmd_version": (579, 576), "qmd_major_version": (583, 580),
  "shared_memory_size": (601, 584), "grid_width": (1055, 1024), "grid_height": (1071, 1056),
  "grid_depth": (1103, 1088), "cta_thread_dimension0": (1167, 1152), "cta_thread_dimension1": (1183, 1168),
  "cta_thread_dimension2": (1199, 1184), "register_count": (1208, 1200), "barrier_count": (1215, 1211),
  "program_address_lower": (1247, 1216), "program_address_upper": (1272, 1248),
  "constant_buffer_addr_lower0": (1567, 1536), "constant_buffer_addr_upper0": (1586, 1568),
  "constant_buffer_size_shifted4_0": (1599, 1587),
})
QMD_LAYOUTS = {3: QMD_V3, 4: QMD_V4}
QMD_MAJOR_VERSION_BITS = (583, 580)  # the same in both versions
QMD_TYPE_GRID_CTA = 2

def qmd_layout_for_arch(arch: str) -> QMDLayout:
  """The QMD version of an `sm_XX` target: 4.0 from Hopper (sm_90) on, 3.0 for Ampere and Ada."""
  try: sm = int(arch.removeprefix("sm_").rstrip("a"))
  except ValueError as e: raise DeviceError(f"NV needs an sm_XX architecture, got {arch!r}") from e
  if sm < 80: raise DeviceError(f"NV queues drive Ampere (sm_80) and newer, not {arch}")
  if sm >= 100: raise DeviceError(f"NV queues write QMD 3.0/4.0; {arch} (Blackwell) uses QMD 5.0, which is not written")
  return QMD_V4 if sm >= 90 else QMD_V3

def sm_config_shared_mem(nbytes: int) -> int:
  """The SM shared-memory configuration encoding of the *_SM_CONFIG_SHARED_MEM_SIZE fields: 4 KiB units plus one."""
  return nbytes // 4096 + 1

def build_qmd(layout: QMDLayout, words: Words, program_address: int, grid: tuple[int, int, int],
              block: tuple[int, int, int], cbuf0: tuple[int, int], shared_size: int = 0, registers: int = 0,
              barriers: int = 0, max_shared: int = 0) -> None:
  """Fill a zeroed QMD for one grid launch: program, grid and block dimensions, resources, constant buffer 0 (the
  kernel's parameters) as (address, size)."""
  addr, size = cbuf0
  if addr % (1 << max(layout.cbuf_shift, 4)) or size % 16:
    raise DeviceError(f"constant buffer 0 at {addr:#x} ({size} bytes) is not aligned as {layout.name} needs")
  layout.set(words, "qmd_major_version", layout.major)
  layout.set(words, "qmd_version", layout.minor)
  layout.set(words, "api_visible_call_limit", 1)  # NO_CHECK
  if "qmd_type" in layout.fields: layout.set(words, "qmd_type", QMD_TYPE_GRID_CTA)
  if "sm_global_caching_enable" in layout.fields:
    layout.set(words, "sm_global_caching_enable", 1)
    for cache in ("texture_header", "texture_sampler", "texture_data", "shader_data"):
      layout.set(words, f"invalidate_{cache}_cache", 1)
    layout.set(words, "cwd_membar_type", 1)  # L1_SYSMEMBAR: the launch's writes are visible when it completes
  for name, value in zip(("grid_width", "grid_height", "grid_depth"), grid): layout.set(words, name, value)
  for i, value in enumerate(block): layout.set(words, f"cta_thread_dimension{i}", value)
  layout.set(words, "shared_memory_size", -(-shared_size // 256) * 256)
  if "min_sm_config_shared_mem_size" in layout.fields and max_shared:
    layout.set(words, "min_sm_config_shared_mem_size", sm_config_shared_mem(8 << 10))
    layout.set(words, "max_sm_config_shared_mem_size", sm_config_shared_mem(max_shared))
    layout.set(words, "target_sm_config_shared_mem_size", sm_config_shared_mem(max_shared))
  layout.set(words, "register_count", registers)
  layout.set(words, "barrier_count", barriers)
  layout.set(words, "program_address_lower", program_address & 0xffffffff)
  layout.set(words, "program_address_upper", program_address >> 32)
  shifted = addr >> layout.cbuf_shift
  layout.set(words, "constant_buffer_addr_lower0", shifted & 0xffffffff)
  layout.set(words, "constant_buffer_addr_upper0", shifted >> 32)
  layout.set(words, "constant_buffer_size_shifted4_0", size >> 4)
  layout.set(words, "constant_buffer_valid0", 1)

# ** queues **

class NVQueue(HWQueue):
  """Pushbuffer words of one queue; `_submit` hands them to the device's GPFIFO channel for this engine."""
  engine = "compute"
  def __init__(self) -> None:
    super().__init__()
    self.words: list[int] = []
    self.value_at: dict[int, int] = {}  # command index -> word index of its 64-bit payload (low word)
  def _semaphore(self, addr: int, value: int, execute: int) -> None:
    lo, hi = _lo_hi(addr)
    vlo, vhi = _lo_hi(value)
    self.value_at[len(self.commands)] = len(self.words) + 3
    self.words += method(SUBC_HOST, SEM_ADDR_LO, lo, hi, vlo, vhi, execute)
  def _wait(self, signal: HCQSignal, value: int) -> None:
    self._semaphore(signal.addr, value, SEM_ACQUIRE_GEQ | SEM_PAYLOAD_64)
  def _signal(self, signal: HCQSignal, value: int) -> None:
    self._semaphore(signal.addr, value, SEM_RELEASE | SEM_RELEASE_WFI | SEM_PAYLOAD_64)
  def _timestamp(self, signal: HCQSignal) -> None:
    self._semaphore(signal.addr - 8, 0, SEM_RELEASE | SEM_RELEASE_WFI | SEM_PAYLOAD_64 | SEM_TIMESTAMP)
  def _memory_barrier(self) -> None: self.words += method(SUBC_HOST, WFI, 0)
  def _patch_value(self, command_index: int, value: int) -> None:
    at = self.value_at[command_index]
    self.words[at], self.words[at + 1] = _lo_hi(value)
  def _exec(self, prg: HCQProgram, args: HCQArgs, global_size: tuple[int, int, int],
            local_size: tuple[int, int, int]) -> None:
    raise DeviceError(f"{type(self).__name__} cannot launch kernels; use the compute queue")
  def _copy(self, dest: int, src: int, nbytes: int) -> None:
    raise DeviceError(f"{type(self).__name__} cannot copy; use the copy queue")
  def _submit(self, device: HCQCompiled) -> None:
    if not isinstance(device, NVHCQDevice): raise DeviceError(f"an NV queue cannot be submitted to {device!r}")
    device.submit(self.engine, self.words)

class NVComputeQueue(NVQueue):
  """Semaphores and QMD launches on the compute engine."""
  def _exec(self, prg: HCQProgram, args: HCQArgs, global_size: tuple[int, int, int],
            local_size: tuple[int, int, int]) -> None:
    if not isinstance(prg, NVLaunchable): raise DeviceError(f"NVComputeQueue launches NV programs, got {prg!r}")
    dev = prg.device
    if not isinstance(dev, NVHCQDevice): raise DeviceError(f"an NV program belongs to an NV device, not {dev!r}")
    layout = dev.qmd_layout
    qmd = dev.qmd_alloc(layout.size, self if self.persistent else None)
    words = (ctypes.c_uint32 * (layout.size // 4)).from_address(qmd.va_addr)
    ctypes.memset(qmd.va_addr, 0, layout.size)
    build_qmd(layout, words, prg.program_address, global_size, local_size, (args.buf.va_addr, prg.cbuf0_size),
              prg.shared_size, prg.registers, prg.barriers, dev.max_shared)
    self.words += method(SUBC_COMPUTE, SEND_PCAS_A, qmd.va_addr >> 8)
    self.words += method(SUBC_COMPUTE, SEND_SIGNALING_PCAS2_B, PCAS_INVALIDATE_COPY_SCHEDULE)

class NVCopyQueue(NVQueue):
  """Semaphores and 1D DMA copies on a copy engine."""
  engine = "copy"
  def _copy(self, dest: int, src: int, nbytes: int) -> None:
    self.words += method(SUBC_COPY, OFFSET_IN_UPPER, src >> 32, src & 0xffffffff, dest >> 32, dest & 0xffffffff)
    self.words += method(SUBC_COPY, LINE_LENGTH_IN, nbytes)
    self.words += method(SUBC_COPY, LAUNCH_DMA, DMA_1D_PITCH)

class NVLaunchable(HCQProgram):
  """An HCQ program the compute queue can put in a QMD: where its code starts and the resources it declares."""
  program_address: int
  cbuf0_size: int
  shared_size: int = 0
  registers: int = 0
  barriers: int = 0

# ** GPFIFO channels **

class GPFifo:
  """One GPFIFO channel as the CPU drives it: the ring of entries, the USERD control page (GPGet, GPPut) and the
  doorbell that tells the GPU the channel has new entries (`ring_doorbell(token)`)."""
  def __init__(self, ring_addr: int, entries: int, userd_addr: int, token: int,
               ring_doorbell: Callable[[int], None], progress: Callable[[], None] | None = None) -> None:
    self.ring = (ctypes.c_uint64 * entries).from_address(ring_addr)
    self.ring_addr, self.entries, self.userd_addr, self.token = ring_addr, entries, userd_addr, token
    self.ring_doorbell, self.progress = ring_doorbell, progress
    self.put = 0
  @property
  def gp_get(self) -> int: return ctypes.c_uint32.from_address(self.userd_addr + USERD_GP_GET).value
  def push(self, addr: int, nwords: int, timeout_s: float = 30.0) -> None:
    """Append one entry for the segment at `addr`; waits while the ring is full."""
    deadline = time.monotonic() + timeout_s
    while (self.put - self.gp_get) % self.entries >= self.entries - 1:
      if self.progress is not None: self.progress()
      if time.monotonic() > deadline:
        raise DeviceError(f"GPFIFO ring of {self.entries} entries stayed full for {timeout_s} s; the GPU is hung")
    self.ring[self.put] = gpfifo_entry(addr, nwords)
    self.put = (self.put + 1) % self.entries
    ctypes.c_uint32.from_address(self.userd_addr + USERD_GP_PUT).value = self.put
    self.ring_doorbell(self.token)

class NVHCQDevice(HCQCompiled):
  """What the NV queues need of a device, MOCK or hardware: a GPFIFO channel per engine, a pushbuffer ring and a QMD
  ring below 2^40 (`_cmd_memory`), the QMD version, and the shared memory the SMs can give a block."""
  qmd_layout: QMDLayout = QMD_V3
  max_shared: int = 0
  QMD_CHUNK = 64  # QMDs per block of memory kept for graphs
  def _rings(self, cmd: HCQBuffer, qmds: HCQBuffer, gpfifos: dict[str, GPFifo]) -> None:
    self._cmd, self._cmd_ptr, self._qmds, self._qmd_ptr, self.gpfifos = cmd, 0, qmds, 0, gpfifos
  def _command_memory(self, size: int) -> HCQBuffer:
    """Host-visible memory below 2^40 for QMDs the device keeps (see the module docstring)."""
    return self._host_alloc(size)
  def _ring_slot(self, ring: HCQBuffer, ptr: int, size: int, align: int) -> int:
    ptr = -(-ptr // align) * align
    if ptr + size > ring.size:
      if size > ring.size: raise DeviceError(f"{size} bytes do not fit the NV ring of {ring.size} bytes")
      self.synchronize()  # everything submitted so far has run: the ring can be reused from its start
      ptr = 0
    return ptr
  def qmd_alloc(self, size: int, owner: HWQueue | None = None) -> HCQBuffer:
    """A 256-byte aligned QMD (QMD addresses are sent >> 8) from the QMD ring; for a persistent queue `owner` (a
    graph's launch, replayed any number of times): from blocks of QMD_CHUNK slots the queue keeps (`owner.kept`),
    which are never reused while it lives."""
    if owner is not None:
      slot = -(-size // 256) * 256
      if not owner.kept or owner.kept_used + slot > owner.kept[-1].size:
        owner.kept.append(self._command_memory(slot * self.QMD_CHUNK))
        owner.kept_used = 0
      owner.kept_used += slot
      return owner.kept[-1].offset(owner.kept_used - slot, size)
    at = self._qmd_ptr = self._ring_slot(self._qmds, self._qmd_ptr, size, 256)
    self._qmd_ptr += size
    return self._qmds.offset(at, size)
  def submit(self, engine: str, words: list[int]) -> None:
    """Copy a queue's words into the pushbuffer ring and add a GPFIFO entry for them on `engine`'s channel."""
    nbytes = 4 * len(words)
    at = self._cmd_ptr = self._ring_slot(self._cmd, self._cmd_ptr, nbytes, 16)
    self._cmd_ptr += nbytes
    addr = self._cmd.va_addr + at
    ctypes.memmove(addr, (ctypes.c_uint32 * len(words))(*words), nbytes)
    self.gpfifos[engine].push(addr, len(words))

