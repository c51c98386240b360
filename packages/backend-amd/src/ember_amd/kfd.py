"""`DEV=AMD` on hardware: the HCQ device over the amdgpu kernel driver's KFD interface (/dev/kfd and the GPU's DRM
render node), with ctypes structs, `fcntl.ioctl` and libc `mmap`. Imported only when an AMD device is opened.

Bring-up, in order:

1. The KFD topology in sysfs (`/sys/devices/virtual/kfd/kfd/topology/nodes/N/{gpu_id,properties}`): GPU nodes have a
   non-zero gpu_id; `gfx_target_version` (major * 10000 + minor * 100 + stepping) names the arch (90402 -> gfx942,
   110000 -> gfx1100), `drm_render_minor` the render node, simd/CU counts size the context save area.
2. Open /dev/kfd, check AMDKFD_IOC_GET_VERSION (major 1), open /dev/dri/renderD<minor>, AMDKFD_IOC_ACQUIRE_VM binds
   the render node's GPU VM to this process.
3. Memory: a CPU virtual address range is reserved with an anonymous mmap and the same address becomes the GPU VA of
   an AMDKFD_IOC_ALLOC_MEMORY_OF_GPU allocation (VRAM, GTT or USERPTR); host-visible memory is then mapped into that
   range from the render node at the allocation's mmap offset; AMDKFD_IOC_MAP_MEMORY_TO_GPU maps it into the GPU VM.
   Freeing is UNMAP_MEMORY_FROM_GPU, FREE_MEMORY_OF_GPU, munmap.
4. Queues: AMDKFD_IOC_CREATE_QUEUE for a PM4 compute queue (ring, read/write pointers, EOP buffer, context save area
   sized from the node's properties) and an SDMA queue; the doorbells live in the process doorbell page that /dev/kfd
   maps at the queue's doorbell offset. A submission copies a queue's packets into the ring, stores the new write
   pointer (dwords for PM4, bytes for SDMA) and writes it to the doorbell.
5. Signals: the HCQ timeline is a 64-bit word in uncached GTT memory written by RELEASE_MEM (PM4) or FENCE (SDMA).
   Each signal also writes the event's mailbox slot and raises an interrupt (RELEASE_MEM int_sel, SDMA TRAP) so that
   AMDKFD_IOC_WAIT_EVENTS on a KFD signal event sleeps instead of spinning.
6. Programs: the code object (elf.py parses it) is loaded segment by segment into executable VRAM; its kernel
   descriptor gives the entry (COMPUTE_PGM_LO/HI), RSRC1/2/3, the kernarg size and which user SGPRs the kernel expects.

Every ioctl goes through `_ioctl`, every mapping through `_mmap`/`_munmap`, every device node through `_open`/`_close`:
the tests replace these five with a fake driver. Struct layouts and ioctl numbers follow the kernel's uapi header
include/uapi/linux/kfd_ioctl.h (KFD ioctl interface 1.x).
"""
from __future__ import annotations
import ctypes
import fcntl
import os
import time
from dataclasses import dataclass, field
from ember.plugin import (BufferSpec, CompileError, Compiler, DeviceError, HCQAllocator, HCQArgs, HCQBuffer,
                          HCQCompiled, HCQProgram, HCQSignal, ProbeResult, Renderer, device_target)
from ember_amd.elf import PT_LOAD, parse_code_object
from ember_amd.queue import (COMPUTE_NUM_THREAD_X, COMPUTE_PGM_LO, COMPUTE_PGM_RSRC1, COMPUTE_USER_DATA_0,
                             DATA_SEL_64, EVENT_CACHE_FLUSH_AND_INV_TS, EVENT_INDEX_EOP, PACKET3_ACQUIRE_MEM,
                             PACKET3_DISPATCH_DIRECT, PACKET3_NOP, PACKET3_RELEASE_MEM, PACKET3_SET_SH_REG,
                             SDMA_OP_FENCE, SH_REG_BASE, AMDComputeQueue, AMDCopyQueue, packet3, sdma_header)
from ember_amd.renderer import ARCHS

KFD_PATH = "/dev/kfd"
TOPOLOGY_PATH = "/sys/devices/virtual/kfd/kfd/topology/nodes"
RENDER_NODE = "/dev/dri/renderD{minor}"
PAGE = 0x1000

# ** the uapi: ioctl numbers and argument structs (include/uapi/linux/kfd_ioctl.h) **

_IOC_WRITE, _IOC_READ = 1, 2
AMDKFD_IOCTL_BASE = ord("K")

class GetVersionArgs(ctypes.Structure):
  _fields_ = [("major_version", ctypes.c_uint32), ("minor_version", ctypes.c_uint32)]

class CreateQueueArgs(ctypes.Structure):
  _fields_ = [("ring_base_address", ctypes.c_uint64), ("write_pointer_address", ctypes.c_uint64),
              ("read_pointer_address", ctypes.c_uint64), ("doorbell_offset", ctypes.c_uint64),
              ("ring_size", ctypes.c_uint32), ("gpu_id", ctypes.c_uint32), ("queue_type", ctypes.c_uint32),
              ("queue_percentage", ctypes.c_uint32), ("queue_priority", ctypes.c_uint32), ("queue_id", ctypes.c_uint32),
              ("eop_buffer_address", ctypes.c_uint64), ("eop_buffer_size", ctypes.c_uint64),
              ("ctx_save_restore_address", ctypes.c_uint64), ("ctx_save_restore_size", ctypes.c_uint32),
              ("ctl_stack_size", ctypes.c_uint32), ("sdma_engine_id", ctypes.c_uint32), ("pad", ctypes.c_uint32)]

class DestroyQueueArgs(ctypes.Structure):
  _fields_ = [("queue_id", ctypes.c_uint32), ("pad", ctypes.c_uint32)]

class CreateEventArgs(ctypes.Structure):
  _fields_ = [("event_page_offset", ctypes.c_uint64), ("event_trigger_data", ctypes.c_uint32),
              ("event_type", ctypes.c_uint32), ("auto_reset", ctypes.c_uint32), ("node_id", ctypes.c_uint32),
              ("event_id", ctypes.c_uint32), ("event_slot_index", ctypes.c_uint32)]

class DestroyEventArgs(ctypes.Structure):
  _fields_ = [("event_id", ctypes.c_uint32), ("pad", ctypes.c_uint32)]

class EventData(ctypes.Structure):
  """struct kfd_event_data: a 32-byte union of exception payloads, the extension pointer, the event id."""
  _fields_ = [("payload", ctypes.c_uint8 * 32), ("kfd_event_data_ext", ctypes.c_uint64), ("event_id", ctypes.c_uint32),
              ("pad", ctypes.c_uint32)]

class WaitEventsArgs(ctypes.Structure):
  _fields_ = [("events_ptr", ctypes.c_uint64), ("num_events", ctypes.c_uint32), ("wait_for_all", ctypes.c_uint32),
              ("timeout", ctypes.c_uint32), ("wait_result", ctypes.c_uint32)]

class AcquireVMArgs(ctypes.Structure):
  _fields_ = [("drm_fd", ctypes.c_uint32), ("gpu_id", ctypes.c_uint32)]

class AllocMemoryArgs(ctypes.Structure):
  _fields_ = [("va_addr", ctypes.c_uint64), ("size", ctypes.c_uint64), ("handle", ctypes.c_uint64),
              ("mmap_offset", ctypes.c_uint64), ("gpu_id", ctypes.c_uint32), ("flags", ctypes.c_uint32)]

class FreeMemoryArgs(ctypes.Structure):
  _fields_ = [("handle", ctypes.c_uint64)]

class MapMemoryArgs(ctypes.Structure):
  """kfd_ioctl_map_memory_to_gpu_args, and (same layout) kfd_ioctl_unmap_memory_from_gpu_args."""
  _fields_ = [("handle", ctypes.c_uint64), ("device_ids_array_ptr", ctypes.c_uint64), ("n_devices", ctypes.c_uint32),
              ("n_success", ctypes.c_uint32)]

# nr -> (name, direction, argument struct); the request number is _IOC(direction, 'K', nr, sizeof(struct))
IOCTLS: dict[int, tuple[str, int, type[ctypes.Structure]]] = {
  0x01: ("GET_VERSION", _IOC_READ, GetVersionArgs),
  0x02: ("CREATE_QUEUE", _IOC_READ | _IOC_WRITE, CreateQueueArgs),
  0x03: ("DESTROY_QUEUE", _IOC_READ | _IOC_WRITE, DestroyQueueArgs),
  0x08: ("CREATE_EVENT", _IOC_READ | _IOC_WRITE, CreateEventArgs),
  0x09: ("DESTROY_EVENT", _IOC_WRITE, DestroyEventArgs),
  0x0C: ("WAIT_EVENTS", _IOC_READ | _IOC_WRITE, WaitEventsArgs),
  0x15: ("ACQUIRE_VM", _IOC_WRITE, AcquireVMArgs),
  0x16: ("ALLOC_MEMORY_OF_GPU", _IOC_READ | _IOC_WRITE, AllocMemoryArgs),
  0x17: ("FREE_MEMORY_OF_GPU", _IOC_WRITE, FreeMemoryArgs),
  0x18: ("MAP_MEMORY_TO_GPU", _IOC_READ | _IOC_WRITE, MapMemoryArgs),
  0x19: ("UNMAP_MEMORY_FROM_GPU", _IOC_READ | _IOC_WRITE, MapMemoryArgs),
}
NR = {name: nr for nr, (name, _, _) in IOCTLS.items()}

def ioctl_request(nr: int) -> int:
  """The ioctl request number of KFD command `nr`: direction << 30 | size << 16 | 'K' << 8 | nr."""
  _, direction, struct = IOCTLS[nr]
  return (direction << 30) | (ctypes.sizeof(struct) << 16) | (AMDKFD_IOCTL_BASE << 8) | nr

KFD_IOCTL_MAJOR_VERSION = 1
KFD_IOC_QUEUE_TYPE_COMPUTE, KFD_IOC_QUEUE_TYPE_SDMA, KFD_IOC_QUEUE_TYPE_COMPUTE_AQL = 0, 1, 2
KFD_MAX_QUEUE_PERCENTAGE, QUEUE_PRIORITY_NORMAL = 100, 7
KFD_IOC_EVENT_SIGNAL = 0
KFD_IOC_WAIT_RESULT_COMPLETE, KFD_IOC_WAIT_RESULT_TIMEOUT, KFD_IOC_WAIT_RESULT_FAIL = 0, 1, 2
KFD_SIGNAL_EVENT_LIMIT = 4096
UNSIGNALED_EVENT_SLOT = 0xffffffffffffffff
MEM_VRAM, MEM_GTT, MEM_USERPTR, MEM_DOORBELL = 1 << 0, 1 << 1, 1 << 2, 1 << 3
MEM_WRITABLE, MEM_EXECUTABLE, MEM_PUBLIC, MEM_NO_SUBSTITUTE = 1 << 31, 1 << 30, 1 << 29, 1 << 28
MEM_COHERENT, MEM_UNCACHED = 1 << 26, 1 << 25
DOORBELL_PAGE = 0x2000  # gfx9+: 1024 doorbells of 8 bytes per process

# ** the syscall layer: the only functions that reach the OS (tests replace them) **

PROT_NONE, PROT_READ, PROT_WRITE = 0, 1, 2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000
_libc: ctypes.CDLL | None = None

def _libc_mm() -> ctypes.CDLL:
  global _libc
  if _libc is None:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    lib.munmap.restype = ctypes.c_int
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    _libc = lib
  return _libc

def _open(path: str) -> int:
  try: return os.open(path, os.O_RDWR | os.O_CLOEXEC)
  except OSError as e:
    raise DeviceError(f"cannot open {path}: {e.strerror}; the user needs read/write access to the KFD and render "
                      "nodes (usually membership of the 'render' and 'video' groups)") from e

def _close(fd: int) -> None: os.close(fd)

def _ioctl(fd: int, nr: int, args: ctypes.Structure) -> None:
  """Issue KFD command `nr` with `args` (filled in place by the driver); a failure is a DeviceError naming it."""
  name, _, struct = IOCTLS[nr]
  if not isinstance(args, struct): raise DeviceError(f"AMDKFD_IOC_{name} takes {struct.__name__}, got {args!r}")
  try: fcntl.ioctl(fd, ioctl_request(nr), args, True)
  except OSError as e: raise DeviceError(f"AMDKFD_IOC_{name} failed: {e.strerror} (errno {e.errno})") from e

def _mmap(addr: int, size: int, prot: int, flags: int, fd: int, offset: int) -> int:
  """libc mmap; returns the mapped address or raises a DeviceError with errno."""
  got = _libc_mm().mmap(addr or None, size, prot, flags, fd, offset)
  if got is None or got == ctypes.c_void_p(-1).value:
    err = ctypes.get_errno()
    raise DeviceError(f"mmap of {size:#x} bytes (fd {fd}, offset {offset:#x}) failed: {os.strerror(err)}")
  return int(got)

def _munmap(addr: int, size: int) -> None:
  if _libc_mm().munmap(addr, size) != 0:
    raise DeviceError(f"munmap({addr:#x}, {size:#x}) failed: {os.strerror(ctypes.get_errno())}")

# ** topology **

def _round_up(x: int, align: int) -> int: return -(-x // align) * align

def gfx_arch(version: int) -> str:
  """KFD gfx_target_version (major*10000 + minor*100 + stepping) -> the LLVM processor name: 90010 -> gfx90a."""
  major, minor, stepping = version // 10000, version // 100 % 100, version % 100
  return f"gfx{major}{minor:x}{stepping:x}"

@dataclass(frozen=True)
class KFDNode:
  """One GPU node of the KFD topology: its node number, gpu_id (what every ioctl names it by) and properties."""
  node: int
  gpu_id: int
  properties: dict[str, int] = field(hash=False)
  def prop(self, name: str) -> int:
    if name not in self.properties:
      raise DeviceError(f"KFD topology node {self.node} has no '{name}' property; the amdgpu driver is too old or the "
                        "topology is not a GPU's")
    return self.properties[name]
  @property
  def version(self) -> int: return self.prop("gfx_target_version")
  @property
  def arch(self) -> str: return gfx_arch(self.version)
  @property
  def render_minor(self) -> int: return self.prop("drm_render_minor")
  @property
  def num_xcc(self) -> int: return max(1, self.properties.get("num_xcc", 1))
  @property
  def cu_count(self) -> int: return self.prop("simd_count") // self.prop("simd_per_cu")
  @property
  def wave_count(self) -> int:
    """Waves whose state a context save stores, per XCC (as the driver computes it)."""
    cu = self.cu_count // self.num_xcc
    if self.version < 100100: return min(cu * 40, self.prop("array_count") // self.prop("simd_arrays_per_engine") * 512)
    return cu * 32
  @property
  def eop_buffer_size(self) -> int: return 0x8000 if self.version == 80002 else 4096
  @property
  def ctl_stack_size(self) -> int:
    if "ctl_stack_size" in self.properties: return self.properties["ctl_stack_size"]
    size = _round_up(40 + self.wave_count * (12 if self.version >= 100100 else 8) + 8, PAGE)
    return min(size, 0x7000) if self.version // 10000 == 10 else size
  @property
  def cwsr_size(self) -> int:
    """The per-XCC context save/restore size (the node's cwsr_size, or the driver's formula on kernels that do not
    export it): control stack + per-CU VGPR, SGPR, LDS and hardware register state."""
    if "cwsr_size" in self.properties: return self.properties["cwsr_size"]
    vgpr = 0x40000
    if self.version in (90400, 90401, 90402, 90010, 90008, 90500): vgpr = 0x80000
    elif self.version in (110000, 110001, 120000, 120001): vgpr = 0x60000
    lds = self.prop("lds_size_in_kb") << 10 if self.version == 90500 else 0x10000
    wg_data = _round_up(self.cu_count // self.num_xcc * (vgpr + 0x4000 + lds + 0x1000), PAGE)
    return _round_up(self.ctl_stack_size + wg_data, PAGE)
  @property
  def debug_memory_size(self) -> int: return _round_up(self.wave_count * 32, 64)
  @property
  def cwsr_allocation(self) -> int:
    """Bytes of the context save area a compute queue needs: (cwsr + debugger memory) per XCC."""
    return _round_up((self.cwsr_size + self.debug_memory_size) * self.num_xcc, PAGE)

def _read_int(path: str) -> int:
  with open(path) as f: text = f.read().strip()
  try: return int(text, 0)
  except ValueError as e: raise DeviceError(f"{path} holds {text!r}, not a number") from e

def read_topology(root: str = TOPOLOGY_PATH) -> list[KFDNode]:
  """The GPU nodes of the KFD topology under `root` (CPU nodes, gpu_id 0, are left out), by node number."""
  if not os.path.isdir(root): raise DeviceError(f"no KFD topology at {root}: the amdgpu driver is not loaded")
  nodes = []
  for name in sorted((n for n in os.listdir(root) if n.isdigit()), key=int):
    base = os.path.join(root, name)
    gpu_id = _read_int(os.path.join(base, "gpu_id"))
    if gpu_id == 0: continue
    props: dict[str, int] = {}
    with open(os.path.join(base, "properties")) as f:
      for line in f:
        parts = line.split()
        if len(parts) != 2: continue
        try: props[parts[0]] = int(parts[1])
        except ValueError as e:
          raise DeviceError(f"KFD topology {base}/properties: {line.strip()!r} is not 'name number'") from e
    nodes.append(KFDNode(int(name), gpu_id, props))
  return nodes

def default_arch(index: int = 0, root: str = TOPOLOGY_PATH) -> str:
  """The gfx arch of the `index`-th KFD GPU, or "" when there is none (the renderer then uses its default)."""
  try: nodes = read_topology(root)
  except (DeviceError, OSError): return ""
  return nodes[index].arch if index < len(nodes) else ""

# ** memory **

@dataclass
class KFDMemory:
  """What freeing a KFD allocation needs: its handle, the reserved CPU/GPU range and how it was made."""
  handle: int
  flags: int
  size: int

# ** rings **

PM4_NOP_ONE_DWORD = 0xffff1000  # a type-3 NOP whose count field is 0x3fff: a header with no body

class KFDRing:
  """One hardware queue's ring in GTT memory with its read/write pointer words and its doorbell. Pointers count
  `unit` bytes (4 for PM4: dwords; 1 for SDMA: bytes) and grow without wrapping; a batch never straddles the ring's end
  (the tail is filled with NOPs first)."""
  def __init__(self, ring: HCQBuffer, rptr: int, wptr: int, doorbell: int, pm4: bool, queue_id: int) -> None:
    self.ring, self.rptr_addr, self.wptr_addr, self.doorbell, self.pm4 = ring, rptr, wptr, doorbell, pm4
    self.unit = 4 if pm4 else 1
    self.size = ring.size // 4  # dwords
    self.put = 0  # dwords written, ever
    self.queue_id = queue_id
  def _fill(self, count: int) -> list[int]:
    """NOPs padding the ring's tail: SDMA NOPs are single zero dwords; PM4 takes one NOP packet (its one-dword form
    when only one dword is left)."""
    if not self.pm4: return [0] * count
    return [PM4_NOP_ONE_DWORD] if count == 1 else packet3(PACKET3_NOP, *([0] * (count - 1)))
  def _wait_space(self, count: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
      read = ctypes.c_uint64.from_address(self.rptr_addr).value * self.unit // 4
      if (self.put - read) % self.size + count < self.size: return
      if time.monotonic() > deadline:
        raise DeviceError(f"AMD ring full for {timeout_s:.0f}s ({count} dwords to write, read pointer stuck at "
                          f"{read}); the GPU is hung or a queue waits on a signal nobody releases")
  def submit(self, words: list[int]) -> None:
    """Copy `words` in at the write pointer, publish the new write pointer, ring the doorbell."""
    if len(words) >= self.size:
      raise DeviceError(f"{len(words)} dwords do not fit an AMD ring of {self.size}; submit smaller batches")
    slot = self.put % self.size
    batch = words if slot + len(words) <= self.size else self._fill(self.size - slot) + list(words)
    self._wait_space(len(batch))
    for k, w in enumerate(batch):
      ctypes.c_uint32.from_address(self.ring.va_addr + 4 * ((self.put + k) % self.size)).value = w & 0xffffffff
    self.put += len(batch)
    ctypes.c_uint64.from_address(self.wptr_addr).value = self.put * 4 // self.unit
    ctypes.c_uint64.from_address(self.doorbell).value = self.put * 4 // self.unit

# ** queues **

CS_W32_EN, DISPATCH_BASE = 1 << 15, (1 << 0) | (1 << 2)  # COMPUTE_SHADER_EN | FORCE_START_AT_000
COMPUTE_TMPRING_SIZE = 0x2e18
COMPUTE_PGM_RSRC3 = {9: 0x2e2d, 10: 0x2e28, 11: 0x2e28, 12: 0x2e28}  # gfx9 keeps RSRC3 at another offset than gfx10+
INT_SEL_AFTER_WRITE_CONFIRM = 2
# gfx9 ACQUIRE_MEM CP_COHER_CNTL: SH_ICACHE | SH_KCACHE | TC (L2) | TCL1 | TC_WB action enables
CP_COHER_CNTL_FULL = (1 << 29) | (1 << 27) | (1 << 23) | (1 << 22) | (1 << 18)
SDMA_OP_TRAP = 6

class AMDKFDComputeQueue(AMDComputeQueue):
  """PM4 on a KFD compute queue: the dispatch sets what a real CP needs (RSRC3, TMPRING_SIZE, the user SGPRs the
  kernel descriptor enables, the wave size), and a signal also wakes `AMDKFD_IOC_WAIT_EVENTS` through an interrupt."""
  def __init__(self, major: int, event_id: int, mailbox: int) -> None:
    super().__init__()
    self.major, self.event_id, self.mailbox = major, event_id, mailbox
  def _signal(self, signal: HCQSignal, value: int) -> None:
    """RELEASE_MEM of the 64-bit value once earlier work is done, then a second RELEASE_MEM that writes the event's
    mailbox slot and interrupts (ctxid = event id)."""
    super()._signal(signal, value)
    lo, hi = self.mailbox & 0xffffffff, self.mailbox >> 32
    event = EVENT_CACHE_FLUSH_AND_INV_TS | (EVENT_INDEX_EOP << 8)
    sel = (DATA_SEL_64 << 29) | (INT_SEL_AFTER_WRITE_CONFIRM << 24)
    self.words += packet3(PACKET3_RELEASE_MEM, event, sel, lo, hi, self.event_id, 0, self.event_id)
  def _memory_barrier(self) -> None:
    if self.major != 9: return super()._memory_barrier()
    self.words += packet3(PACKET3_ACQUIRE_MEM, CP_COHER_CNTL_FULL, 0xffffffff, 0xffffff, 0, 0, 0xa, 0)
  def _exec(self, prg: HCQProgram, args: HCQArgs, global_size: tuple[int, int, int],
            local_size: tuple[int, int, int]) -> None:
    if not isinstance(prg, AMDKFDProgram):
      raise DeviceError(f"AMDKFDComputeQueue launches AMDKFDProgram kernels (code objects), got {prg!r}")
    code = prg.code_addr >> 8
    self.words += packet3(PACKET3_SET_SH_REG, COMPUTE_PGM_LO - SH_REG_BASE, code & 0xffffffff, code >> 32)
    self.words += packet3(PACKET3_SET_SH_REG, COMPUTE_PGM_RSRC1 - SH_REG_BASE, prg.rsrc1, prg.rsrc2)
    self.words += packet3(PACKET3_SET_SH_REG, COMPUTE_PGM_RSRC3[self.major] - SH_REG_BASE, prg.rsrc3)
    self.words += packet3(PACKET3_SET_SH_REG, COMPUTE_TMPRING_SIZE - SH_REG_BASE, 0)
    if user_data := prg.user_data(args.buf.va_addr):
      self.words += packet3(PACKET3_SET_SH_REG, COMPUTE_USER_DATA_0 - SH_REG_BASE, *user_data)
    self.words += packet3(PACKET3_SET_SH_REG, COMPUTE_NUM_THREAD_X - SH_REG_BASE, *local_size)
    self.words += packet3(PACKET3_DISPATCH_DIRECT, *global_size, prg.dispatch_initiator)

class AMDKFDCopyQueue(AMDCopyQueue):
  """SDMA on a KFD SDMA queue: a signal also writes the event's 64-bit mailbox slot and traps (an interrupt carrying
  the event id)."""
  def __init__(self, event_id: int, mailbox: int) -> None:
    super().__init__()
    self.event_id, self.mailbox = event_id, mailbox
  def _signal(self, signal: HCQSignal, value: int) -> None:
    super()._signal(signal, value)
    for addr, word in ((self.mailbox + 4, 0), (self.mailbox, self.event_id)):  # the 64-bit slot, high dword first
      self.words += [sdma_header(SDMA_OP_FENCE), addr & 0xffffffff, addr >> 32, word]
    self.words += [sdma_header(SDMA_OP_TRAP), self.event_id & 0xfffffff]

# ** programs **

# kernel code properties (amdhsa kernel descriptor) -> user SGPRs, in the order the hardware loads them
USER_SGPR_PRIVATE_SEGMENT_BUFFER, USER_SGPR_DISPATCH_PTR, USER_SGPR_QUEUE_PTR, USER_SGPR_KERNARG_PTR = 0, 1, 2, 3
USER_SGPR_DISPATCH_ID, USER_SGPR_FLAT_SCRATCH_INIT, USER_SGPR_PRIVATE_SEGMENT_SIZE = 4, 5, 6
NS_PER_TIMESTAMP_TICK = 10  # the RELEASE_MEM/SDMA timestamp counts at 100 MHz

class AMDKFDProgram(HCQProgram):
  """A kernel of an HSA code object loaded into executable VRAM. The kernel descriptor gives the entry address,
  RSRC1/2/3, the wave size and the user SGPR layout; the metadata note gives the explicit kernel arguments."""
  def __init__(self, device: AMDKFDDevice, name: str, lib: bytes) -> None:
    co = parse_code_object(lib)
    if co.target.split("--")[-1].split(":")[0] != device.arch:
      raise CompileError(f"kernel {name} was compiled for {co.target or 'an unknown target'}, the GPU is "
                         f"{device.arch}; use DEV=AMD:LLVM:{device.arch}")
    if name not in co.kernels:
      raise CompileError(f"the code object has no kernel {name!r} (it has {', '.join(sorted(co.kernels)) or 'none'})")
    kd = co.kernels[name]
    if kd.private_segment_size:
      raise DeviceError(f"kernel {name} needs {kd.private_segment_size} bytes of scratch per work-item; ember's KFD "
                        "runtime sets up no scratch memory yet")
    enabled = [bit for bit in range(7) if kd.properties & (1 << bit)]
    unsupported = ((USER_SGPR_DISPATCH_PTR, "the dispatch packet pointer"), (USER_SGPR_QUEUE_PTR, "the queue pointer"))
    for bit, what in unsupported:
      if bit in enabled:
        raise DeviceError(f"kernel {name} asks for {what} in its user SGPRs; a PM4 dispatch has no AQL packet or queue "
                          "to point at (code object v5 kernels read these from the hidden kernel arguments)")
    self.user_sgprs = enabled
    if len(self.user_data(0)) > (kd.rsrc2 >> 1) & 0x1f:
      raise CompileError(f"kernel {name}: RSRC2 declares {(kd.rsrc2 >> 1) & 0x1f} user SGPRs but its properties "
                         f"{kd.properties:#x} need {len(self.user_data(0))}")
    # a PM4 dispatch has no AQL packet for the CP to size LDS from: RSRC2.LDS_SIZE (bits 15..23, in 512-byte granules
    # on gfx9 and gfx10+) carries the kernel's group segment (a group reduction's shared buffers)
    lds_granules = -(-kd.group_segment_size // 512)
    if lds_granules > 0x1ff: raise DeviceError(f"kernel {name} needs {kd.group_segment_size} bytes of LDS")
    self.rsrc1, self.rsrc2, self.rsrc3 = kd.rsrc1, (kd.rsrc2 & ~(0x1ff << 15)) | (lds_granules << 15), kd.rsrc3
    self.dispatch_initiator = DISPATCH_BASE | (CS_W32_EN if kd.wavefront_size32 else 0)
    image = bytearray(max((vaddr + memsz for ptype, _, _, vaddr, _, memsz, _ in co.elf.segments if ptype == PT_LOAD),
                          default=0))
    for ptype, _, off, vaddr, filesz, _, _ in co.elf.segments:
      if ptype == PT_LOAD: image[vaddr:vaddr + filesz] = lib[off:off + filesz]
    self.code = device.allocator.alloc(len(image))
    device.allocator._copyin(self.code, memoryview(bytes(image)))
    self.code_addr = self.code.va_addr + kd.entry
    meta = co.kernel_metadata(name)
    layout = [(a[".offset"], a[".size"]) for a in meta.get(".args", []) if not a[".value_kind"].startswith("hidden")]
    super().__init__(device, name, layout, max(kd.kernarg_size, 1))
  def user_data(self, kernargs: int) -> list[int]:
    """The COMPUTE_USER_DATA values: each user SGPR the descriptor enables, in hardware order. Without scratch the
    private segment buffer descriptor, flat scratch init and private segment size are zero."""
    words: list[int] = []
    for bit in self.user_sgprs:
      if bit == USER_SGPR_PRIVATE_SEGMENT_BUFFER: words += [0, 0, 0, 0]
      elif bit == USER_SGPR_KERNARG_PTR: words += [kernargs & 0xffffffff, kernargs >> 32]
      elif bit in (USER_SGPR_DISPATCH_ID, USER_SGPR_FLAT_SCRATCH_INIT): words += [0, 0]
      elif bit == USER_SGPR_PRIVATE_SEGMENT_SIZE: words += [0]
    return words
  def __call__(self, *bufs: HCQBuffer, global_size: tuple[int, ...] = (1, 1, 1),
               local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    elapsed = super().__call__(*bufs, global_size=global_size, local_size=local_size, vals=vals, wait=wait)
    return None if elapsed is None else elapsed * NS_PER_TIMESTAMP_TICK  # the base reads the ticks as nanoseconds

# ** the device **

class AMDKFDAllocator(HCQAllocator):
  """Device buffers: VRAM mapped into this process's GPU VM (not CPU-visible; copies go through SDMA)."""
  def _alloc(self, size: int, options: BufferSpec) -> HCQBuffer:
    dev: AMDKFDDevice = self.device  # type: ignore[assignment]
    return dev.alloc_memory(size, MEM_VRAM, cpu_access=False)
  def _free(self, opaque: HCQBuffer, options: BufferSpec) -> None:
    dev: AMDKFDDevice = self.device  # type: ignore[assignment]
    dev.synchronize()
    dev.free_memory(opaque)

class AMDKFDDevice(HCQCompiled):
  """DEV=AMD: the HCQ device over /dev/kfd. `AMD:N` is the N-th GPU node of the KFD topology."""
  topology_path = TOPOLOGY_PATH
  ring_bytes = 1 << 20
  def __init__(self, device: str, renderer: Renderer, compiler: Compiler | None) -> None:
    self.device_str, index = device, device_target(device).index
    nodes = read_topology(self.topology_path)
    if index >= len(nodes):
      raise DeviceError(f"{device}: the KFD topology has {len(nodes)} GPU(s); use an index below {len(nodes)}")
    self.node = nodes[index]
    self.arch, self.major = self.node.arch, self.node.version // 10000
    if self.arch not in ARCHS or self.major not in COMPUTE_PGM_RSRC3:
      raise DeviceError(f"{device} is a {self.arch}; ember's AMD backend supports {', '.join(ARCHS)}")
    if getattr(renderer, "arch", self.arch) != self.arch:
      raise DeviceError(f"{device} is a {self.arch} but the renderer targets {getattr(renderer, 'arch', '')}; use "
                        f"DEV=AMD:LLVM:{self.arch} (or leave the arch out)")
    self.gpu_id = self.node.gpu_id
    self._memory: list[HCQBuffer] = []
    self._queues: list[KFDRing] = []
    self._doorbell_pages: dict[int, int] = {}
    self.kfd = _open(KFD_PATH)
    self.drm = -1
    self.event_id = -1
    try: self._bring_up(renderer, compiler)
    except BaseException:
      self.finalize()
      raise

  def _bring_up(self, renderer: Renderer, compiler: Compiler | None) -> None:
    version = GetVersionArgs()
    _ioctl(self.kfd, NR["GET_VERSION"], version)
    if version.major_version != KFD_IOCTL_MAJOR_VERSION:
      raise DeviceError(f"the KFD driver speaks ioctl interface {version.major_version}.{version.minor_version}; "
                        f"ember needs {KFD_IOCTL_MAJOR_VERSION}.x")
    self.kfd_version = (version.major_version, version.minor_version)
    self.drm = _open(RENDER_NODE.format(minor=self.node.render_minor))
    _ioctl(self.kfd, NR["ACQUIRE_VM"], AcquireVMArgs(drm_fd=self.drm, gpu_id=self.gpu_id))
    # signals (timeline, two timers) and the event page the KFD signal event's mailbox lives in
    signal_page = self.alloc_memory(PAGE, MEM_GTT, uncached=True)
    self.event_page = self.alloc_memory(KFD_SIGNAL_EVENT_LIMIT * 8, MEM_GTT, uncached=True)
    ctypes.memset(self.event_page.va_addr, 0xff, self.event_page.size)  # every slot UNSIGNALED_EVENT_SLOT
    event = CreateEventArgs(event_page_offset=self.event_page.meta.handle, event_type=KFD_IOC_EVENT_SIGNAL,
                            auto_reset=1, node_id=self.node.node)
    _ioctl(self.kfd, NR["CREATE_EVENT"], event)
    self.event_id, self.mailbox = event.event_id, self.event_page.va_addr + 8 * event.event_slot_index
    self.rings = {"compute": self._create_queue(KFD_IOC_QUEUE_TYPE_COMPUTE),
                  "sdma": self._create_queue(KFD_IOC_QUEUE_TYPE_SDMA)}
    if compiler is None:
      raise CompileError(f"DEV=AMD needs a compiler producing code objects for {type(renderer).__name__}")
    super().__init__(self.device_str, AMDKFDAllocator(self), renderer, compiler,
                     lambda name, lib: AMDKFDProgram(self, name, lib),
                     lambda: AMDKFDComputeQueue(self.major, self.event_id, self.mailbox),
                     lambda: AMDKFDCopyQueue(self.event_id, self.mailbox), signal_page)

  # ** memory **
  def alloc_memory(self, size: int, domain: int, cpu_access: bool = True, uncached: bool = False,
                   public: bool = False) -> HCQBuffer:
    """A page-aligned allocation in `domain` (MEM_VRAM / MEM_GTT / MEM_USERPTR) whose GPU VA is a CPU address reserved
    here, mapped into the GPU VM, and (`cpu_access`) mapped for the CPU at the same address."""
    size = _round_up(max(size, 1), PAGE)
    flags = domain | MEM_WRITABLE | MEM_EXECUTABLE | MEM_NO_SUBSTITUTE
    if uncached: flags |= MEM_COHERENT | MEM_UNCACHED
    if public: flags |= MEM_PUBLIC
    if domain == MEM_USERPTR: addr = _mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)
    else: addr = _mmap(0, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    args = AllocMemoryArgs(va_addr=addr, size=size, gpu_id=self.gpu_id, flags=flags,
                           mmap_offset=addr if domain == MEM_USERPTR else 0)
    try: _ioctl(self.kfd, NR["ALLOC_MEMORY_OF_GPU"], args)
    except DeviceError as e:
      _munmap(addr, size)
      kind = {MEM_VRAM: "VRAM", MEM_GTT: "GTT", MEM_USERPTR: "host (userptr)"}.get(domain, hex(domain))
      raise DeviceError(f"allocating {size:#x} bytes of {kind} memory on {self.arch} failed: {e}") from e
    buf = HCQBuffer(addr, size, KFDMemory(args.handle, flags, size))
    if cpu_access and domain != MEM_USERPTR:
      if _mmap(addr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, self.drm, args.mmap_offset) != addr:
        raise DeviceError(f"mapping the allocation at {addr:#x} for the CPU landed elsewhere")
    ids = (ctypes.c_uint32 * 1)(self.gpu_id)
    mapping = MapMemoryArgs(handle=args.handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=1)
    _ioctl(self.kfd, NR["MAP_MEMORY_TO_GPU"], mapping)
    if mapping.n_success != 1: raise DeviceError(f"AMDKFD_IOC_MAP_MEMORY_TO_GPU mapped {mapping.n_success} of 1 GPUs")
    self._memory.append(buf)
    return buf

  def free_memory(self, buf: HCQBuffer) -> None:
    """Unmap from the GPU, free, release the address range. After `finalize` closed /dev/kfd the driver has already
    released every allocation of the process, so there is nothing left to do."""
    if self.kfd < 0: return
    meta: KFDMemory = buf.meta
    ids = (ctypes.c_uint32 * 1)(self.gpu_id)
    _ioctl(self.kfd, NR["UNMAP_MEMORY_FROM_GPU"],
           MapMemoryArgs(handle=meta.handle, device_ids_array_ptr=ctypes.addressof(ids), n_devices=1))
    _ioctl(self.kfd, NR["FREE_MEMORY_OF_GPU"], FreeMemoryArgs(handle=meta.handle))
    _munmap(buf.va_addr, meta.size)
    self._memory = [m for m in self._memory if m.va_addr != buf.va_addr]

  def _host_alloc(self, size: int) -> HCQBuffer:
    """Kernargs and staging: GTT the CPU writes and the GPU reads."""
    return self.alloc_memory(size, MEM_GTT)
  def _host_free(self, buf: HCQBuffer) -> None: self.free_memory(buf)

  # ** queues **
  def _create_queue(self, queue_type: int) -> KFDRing:
    ring = self.alloc_memory(self.ring_bytes, MEM_GTT)
    control = self.alloc_memory(PAGE, MEM_GTT, uncached=True)  # read pointer @0, write pointer @0x40
    args = CreateQueueArgs(ring_base_address=ring.va_addr, ring_size=ring.size, gpu_id=self.gpu_id,
                           queue_type=queue_type, queue_percentage=KFD_MAX_QUEUE_PERCENTAGE,
                           queue_priority=QUEUE_PRIORITY_NORMAL, read_pointer_address=control.va_addr,
                           write_pointer_address=control.va_addr + 0x40)
    if queue_type == KFD_IOC_QUEUE_TYPE_COMPUTE:
      eop = self.alloc_memory(self.node.eop_buffer_size, MEM_VRAM, cpu_access=False)
      cwsr = self.alloc_memory(self.node.cwsr_allocation, MEM_GTT, cpu_access=False)
      args.eop_buffer_address, args.eop_buffer_size = eop.va_addr, eop.size
      args.ctx_save_restore_address, args.ctx_save_restore_size = cwsr.va_addr, self.node.cwsr_size
      args.ctl_stack_size = self.node.ctl_stack_size
    _ioctl(self.kfd, NR["CREATE_QUEUE"], args)
    page = args.doorbell_offset & ~(DOORBELL_PAGE - 1)
    if page not in self._doorbell_pages:
      self._doorbell_pages[page] = _mmap(0, DOORBELL_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, self.kfd, page)
    doorbell = self._doorbell_pages[page] + args.doorbell_offset - page
    pm4 = queue_type == KFD_IOC_QUEUE_TYPE_COMPUTE
    kfd_ring = KFDRing(ring, control.va_addr, control.va_addr + 0x40, doorbell, pm4, args.queue_id)
    self._queues.append(kfd_ring)
    return kfd_ring

  def ring_doorbell(self, ring: str, words: list[int]) -> None: self.rings[ring].submit(words)

  def _progress(self) -> None:
    """Sleep in AMDKFD_IOC_WAIT_EVENTS until a signal's interrupt (or 10 ms pass; the caller re-checks the value)."""
    data = EventData(event_id=self.event_id)
    args = WaitEventsArgs(events_ptr=ctypes.addressof(data), num_events=1, wait_for_all=1, timeout=10)
    _ioctl(self.kfd, NR["WAIT_EVENTS"], args)
    if args.wait_result == KFD_IOC_WAIT_RESULT_FAIL:
      raise DeviceError(f"AMDKFD_IOC_WAIT_EVENTS failed on event {self.event_id}; the GPU was reset or faulted")

  def finalize(self) -> None:
    """Destroy the queues and the event, free the memory, close the driver nodes (the process keeps none)."""
    for ring in self._queues: _ioctl(self.kfd, NR["DESTROY_QUEUE"], DestroyQueueArgs(queue_id=ring.queue_id))
    self._queues = []
    for addr in self._doorbell_pages.values(): _munmap(addr, DOORBELL_PAGE)
    self._doorbell_pages = {}
    if self.event_id >= 0: _ioctl(self.kfd, NR["DESTROY_EVENT"], DestroyEventArgs(event_id=self.event_id))
    self.event_id = -1
    for buf in list(reversed(self._memory)): self.free_memory(buf)
    for fd in (self.drm, self.kfd):
      if fd >= 0: _close(fd)
    self.drm = self.kfd = -1

def probe_kfd() -> ProbeResult:
  """Whether DEV=AMD can open a GPU here once /dev/kfd exists (`device.probe_amd` checks that first, without importing
  this module), and why not: no access, no GPU node, an unsupported arch."""
  if not os.access(KFD_PATH, os.R_OK | os.W_OK):
    return ProbeResult(False, f"{KFD_PATH} is not readable and writable by this user; add the user to the 'render' "
                              "group")
  try: nodes = read_topology()
  except (DeviceError, OSError) as e: return ProbeResult(False, f"cannot read the KFD topology: {e}")
  if not nodes: return ProbeResult(False, f"{KFD_PATH} exists but the KFD topology lists no GPU node")
  archs = [n.arch for n in nodes]
  if not any(a in ARCHS for a in archs):
    return ProbeResult(False, f"the KFD GPUs are {', '.join(archs)}; ember's AMD backend supports {', '.join(ARCHS)}")
  return ProbeResult(True, f"KFD: {', '.join(f'{n.arch} (gpu_id {n.gpu_id})' for n in nodes)}")

__all__ = ["AMDKFDDevice", "AMDKFDAllocator", "AMDKFDProgram", "AMDKFDComputeQueue", "AMDKFDCopyQueue", "KFDNode",
           "KFDRing", "read_topology", "default_arch", "gfx_arch", "probe_kfd", "ioctl_request", "IOCTLS", "NR"]
