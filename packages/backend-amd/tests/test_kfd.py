"""The KFD runtime without an AMD GPU: the uapi structs and ioctl numbers against include/uapi/linux/kfd_ioctl.h, the
topology parser on fake sysfs trees, and a fake KFD driver (standing in for kfd._open/_ioctl/_mmap) that checks every
argument, executes the rings it is handed (SDMA copies, PM4 signals) and records the dispatch, from bring-up to a first
kernel launch."""
from __future__ import annotations
import ctypes
import mmap
import os
import subprocess
import sys
import pytest
from ember.dtype import dtypes
from ember.errors import CompileError, DeviceError
from ember.plugin import HCQBuffer, Ops
from amd_kernels import corpus_tensor, programs
from ember_amd import kfd
from ember_amd.compiler import AMDLLVMCompiler
from ember_amd.elf import PT_LOAD, parse_code_object
from ember_amd.renderer import AMDLLVMRenderer

# ** uapi: sizes from include/uapi/linux/kfd_ioctl.h (kernel 6.x), summed by hand from the field types **

UAPI_SIZES = {
  kfd.GetVersionArgs: 8,      # 2 x u32
  kfd.CreateQueueArgs: 96,    # 4 x u64, 6 x u32, 3 x u64, 4 x u32 (ctx size, ctl stack, sdma_engine_id, pad)
  kfd.DestroyQueueArgs: 8,    # queue_id, pad
  kfd.CreateEventArgs: 32,    # u64 page offset, 6 x u32
  kfd.DestroyEventArgs: 8,    # event_id, pad
  kfd.EventData: 48,          # 32-byte exception union (memory exception: 4 x u32, u64 va, 2 x u32), u64, 2 x u32
  kfd.WaitEventsArgs: 24,     # u64 events_ptr, 4 x u32
  kfd.AcquireVMArgs: 8,       # drm_fd, gpu_id
  kfd.AllocMemoryArgs: 40,    # va_addr, size, handle, mmap_offset (u64), gpu_id, flags (u32)
  kfd.FreeMemoryArgs: 8,      # handle
  kfd.MapMemoryArgs: 24,      # handle, device_ids_array_ptr (u64), n_devices, n_success (u32)
}
# (struct, field, byte offset) where a misplaced field would silently feed the driver garbage
UAPI_OFFSETS = [(kfd.CreateQueueArgs, "doorbell_offset", 24), (kfd.CreateQueueArgs, "ring_size", 32),
                (kfd.CreateQueueArgs, "queue_id", 52), (kfd.CreateQueueArgs, "eop_buffer_address", 56),
                (kfd.CreateQueueArgs, "ctx_save_restore_address", 72), (kfd.CreateQueueArgs, "ctl_stack_size", 84),
                (kfd.CreateEventArgs, "event_slot_index", 28), (kfd.AllocMemoryArgs, "mmap_offset", 24),
                (kfd.AllocMemoryArgs, "flags", 36), (kfd.EventData, "event_id", 40)]

def test_uapi_struct_sizes_and_offsets() -> None:
  for struct, size in UAPI_SIZES.items(): assert ctypes.sizeof(struct) == size, struct.__name__
  for struct, name, offset in UAPI_OFFSETS: assert getattr(struct, name).offset == offset, (struct.__name__, name)
  assert {struct for _, _, struct in kfd.IOCTLS.values()} == set(UAPI_SIZES) - {kfd.EventData}

def _ioc(direction: int, nr: int, size: int) -> int:  # linux/ioctl.h: dir 2 bits @30, size 14 @16, type 8 @8, nr 8 @0
  return (direction << 30) | (size << 16) | (ord("K") << 8) | nr

IOR, IOW, IOWR = 2, 1, 3
# (name, nr, direction, size) as the header declares them: AMDKFD_IOR/IOW/IOWR(nr, struct)
UAPI_IOCTLS = [("GET_VERSION", 0x01, IOR, 8), ("CREATE_QUEUE", 0x02, IOWR, 96), ("DESTROY_QUEUE", 0x03, IOWR, 8),
               ("CREATE_EVENT", 0x08, IOWR, 32), ("DESTROY_EVENT", 0x09, IOW, 8), ("WAIT_EVENTS", 0x0C, IOWR, 24),
               ("ACQUIRE_VM", 0x15, IOW, 8), ("ALLOC_MEMORY_OF_GPU", 0x16, IOWR, 40),
               ("FREE_MEMORY_OF_GPU", 0x17, IOW, 8), ("MAP_MEMORY_TO_GPU", 0x18, IOWR, 24),
               ("UNMAP_MEMORY_FROM_GPU", 0x19, IOWR, 24)]

def test_ioctl_request_numbers() -> None:
  for name, nr, direction, size in UAPI_IOCTLS:
    assert kfd.NR[name] == nr
    assert kfd.ioctl_request(nr) == _ioc(direction, nr, size), name
  assert kfd.ioctl_request(kfd.NR["GET_VERSION"]) == 0x80084B01  # as strace prints AMDKFD_IOC_GET_VERSION
  assert kfd.ioctl_request(kfd.NR["ALLOC_MEMORY_OF_GPU"]) == 0xC0284B16

def test_ioctl_rejects_the_wrong_struct() -> None:
  with pytest.raises(DeviceError, match="AMDKFD_IOC_ACQUIRE_VM takes AcquireVMArgs"):
    kfd._ioctl(-1, kfd.NR["ACQUIRE_VM"], kfd.GetVersionArgs())

# ** topology **

GFX1100 = {"simd_count": 192, "simd_per_cu": 2, "array_count": 12, "simd_arrays_per_engine": 2, "lds_size_in_kb": 64,
           "gfx_target_version": 110000, "drm_render_minor": 128, "wave_front_size": 32, "num_xcc": 1}
GFX942 = {"simd_count": 1216, "simd_per_cu": 4, "array_count": 32, "simd_arrays_per_engine": 1, "lds_size_in_kb": 64,
          "gfx_target_version": 90402, "drm_render_minor": 129, "wave_front_size": 64, "num_xcc": 8}
GFX90A = {"simd_count": 416, "simd_per_cu": 4, "array_count": 8, "simd_arrays_per_engine": 1, "lds_size_in_kb": 64,
          "gfx_target_version": 90010, "drm_render_minor": 130, "wave_front_size": 64, "num_xcc": 1}
GPU_IDS = {110000: 0x3e5c, 90402: 0x9b1f, 90010: 0x24d1}

def fake_topology(root, *nodes: dict[str, int]) -> str:
  """A KFD topology tree: node 0 is the CPU (gpu_id 0), then one node per GPU property set."""
  base = root / "nodes"
  entries = [({"cpu_cores_count": 16, "simd_count": 0, "gfx_target_version": 0}, 0)]
  entries += [(props, GPU_IDS[props["gfx_target_version"]]) for props in nodes]
  for i, (props, gpu_id) in enumerate(entries):
    (base / str(i)).mkdir(parents=True)
    (base / str(i) / "gpu_id").write_text(f"{gpu_id}\n")
    (base / str(i) / "properties").write_text("".join(f"{k} {v}\n" for k, v in props.items()))
  return str(base)

def test_topology_parsing(tmp_path) -> None:
  root = fake_topology(tmp_path, GFX1100, {**GFX942, "cwsr_size": 24576000, "ctl_stack_size": 12288})
  rdna3, cdna3 = kfd.read_topology(root)
  assert (rdna3.node, rdna3.gpu_id, rdna3.arch, rdna3.render_minor, rdna3.cu_count) == (1, 0x3e5c, "gfx1100", 128, 96)
  assert (cdna3.node, cdna3.gpu_id, cdna3.arch, cdna3.render_minor, cdna3.cu_count) == (2, 0x9b1f, "gfx942", 129, 304)
  assert (cdna3.cwsr_size, cdna3.ctl_stack_size) == (24576000, 12288)  # the kernel's own numbers win
  assert kfd.default_arch(1, root) == "gfx942" and kfd.default_arch(5, root) == ""
  assert [kfd.gfx_arch(v) for v in (90010, 90402, 90500, 110000, 110001, 120001)] == \
         ["gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1201"]

def test_context_save_sizes_follow_the_driver_formula(tmp_path) -> None:
  # kfd_queue_ctx_save_restore_size(), by hand. gfx1100: 96 CUs, 96 * 32 = 3072 waves; control stack
  # 40 + 3072 * 12 + 8 = 36912 -> 40960; per CU 0x60000 VGPR + 0x4000 SGPR + 0x10000 LDS + 0x1000 HWREG = 479232,
  # x 96 = 46006272; debugger memory 3072 * 32 = 98304
  rdna3, cdna3 = kfd.read_topology(fake_topology(tmp_path, GFX1100, GFX942))
  assert (rdna3.ctl_stack_size, rdna3.cwsr_size, rdna3.debug_memory_size) == (40960, 40960 + 46006272, 98304)
  assert rdna3.cwsr_allocation == 46145536 and rdna3.eop_buffer_size == 4096
  # gfx942 (MI300X): 8 XCCs of 38 CUs; min(38 * 40, 32 / 1 * 512) = 1520 waves per XCC; control stack
  # 40 + 1520 * 8 + 8 = 12208 -> 12288; per CU 0x80000 + 0x4000 + 0x10000 + 0x1000 = 610304, x 38 = 23191552;
  # debugger 1520 * 32 = 48640; allocation (23203840 + 48640) * 8 = 186019840
  assert (cdna3.ctl_stack_size, cdna3.cwsr_size, cdna3.debug_memory_size) == (12288, 23203840, 48640)
  assert cdna3.cwsr_allocation == 186019840

def test_malformed_topology_is_a_device_error(tmp_path) -> None:
  root = fake_topology(tmp_path, GFX1100)
  with open(os.path.join(root, "1", "properties"), "a") as f: f.write("simd_count many\n")
  with pytest.raises(DeviceError, match="simd_count many"): kfd.read_topology(root)
  with pytest.raises(DeviceError, match="no KFD topology"): kfd.read_topology(str(tmp_path / "absent"))

# ** the fake driver **

KFD_FD, DRM_FD = 100, 101
PAGE = 0x1000
DOORBELL_BASE = 3 << 62  # KFD_MMAP_TYPE_DOORBELL

class FakeKFD:
  """/dev/kfd as the driver behaves: hands out handles, mmap offsets, queue ids and doorbells, and checks that every
  argument refers to something it handed out. Memory is real anonymous memory, so what the runtime writes is there;
  WAIT_EVENTS runs the submitted rings (the GPU's part) before it returns."""
  def __init__(self, node: kfd.KFDNode) -> None:
    self.node = node
    self.keep: dict[int, mmap.mmap] = {}        # address -> backing memory
    self.reserved: dict[int, int] = {}          # address -> size (anonymous reservations)
    self.allocs: dict[int, dict] = {}           # handle -> va, size, flags, mmap_offset, mapped
    self.queues: list[kfd.CreateQueueArgs] = []
    self.doorbell_page = 0
    self.calls: list[str] = []
    self.dispatches: list[dict] = []
    self.pm4_regs: dict[int, int] = {}
    self.read = {0: 0, 1: 0}                    # queue index -> dwords executed
    self.closed: list[int] = []

  # the syscall layer
  def open(self, path: str) -> int:
    assert path in ("/dev/kfd", f"/dev/dri/renderD{self.node.render_minor}"), path
    return KFD_FD if path == "/dev/kfd" else DRM_FD
  def close(self, fd: int) -> None: self.closed.append(fd)
  def _memory(self, size: int) -> int:
    m = mmap.mmap(-1, size)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    self.keep[addr] = m
    return addr
  def mmap(self, addr: int, size: int, prot: int, flags: int, fd: int, offset: int) -> int:
    if fd == -1:
      assert flags & kfd.MAP_ANONYMOUS and addr == 0 and size % PAGE == 0
      new = self._memory(size)
      self.reserved[new] = size
      return new
    if fd == KFD_FD:  # the doorbell page
      assert offset == DOORBELL_BASE and size == kfd.DOORBELL_PAGE and flags & kfd.MAP_SHARED
      self.doorbell_page = self._memory(size)
      return self.doorbell_page
    assert fd == DRM_FD and flags & kfd.MAP_FIXED and prot == kfd.PROT_READ | kfd.PROT_WRITE
    alloc = next(a for a in self.allocs.values() if a["va"] == addr)
    assert offset == alloc["mmap_offset"] and size == alloc["size"] and not alloc["flags"] & kfd.MEM_USERPTR
    alloc["cpu"] = True
    return addr
  def munmap(self, addr: int, size: int) -> None:
    assert self.reserved.get(addr) == size or (addr == self.doorbell_page and size == kfd.DOORBELL_PAGE)

  def ioctl(self, fd: int, nr: int, args: ctypes.Structure) -> None:
    name, _, struct = kfd.IOCTLS[nr]
    assert fd == KFD_FD and isinstance(args, struct), (name, fd, args)
    self.calls.append(name)
    getattr(self, name.lower())(args)
  def get_version(self, a: kfd.GetVersionArgs) -> None: a.major_version, a.minor_version = 1, 14
  def acquire_vm(self, a: kfd.AcquireVMArgs) -> None: assert (a.drm_fd, a.gpu_id) == (DRM_FD, self.node.gpu_id)
  def alloc_memory_of_gpu(self, a: kfd.AllocMemoryArgs) -> None:
    assert "ACQUIRE_VM" in self.calls, "memory before the VM is acquired"
    assert self.reserved.get(a.va_addr, 0) >= a.size and a.size % PAGE == 0 and a.gpu_id == self.node.gpu_id
    domains = a.flags & (kfd.MEM_VRAM | kfd.MEM_GTT | kfd.MEM_USERPTR | kfd.MEM_DOORBELL)
    assert domains in (kfd.MEM_VRAM, kfd.MEM_GTT, kfd.MEM_USERPTR), hex(a.flags)
    if domains == kfd.MEM_USERPTR: assert a.mmap_offset == a.va_addr
    a.handle = len(self.allocs) + 1
    a.mmap_offset = a.handle << 32
    self.allocs[a.handle] = {"va": a.va_addr, "size": a.size, "flags": a.flags, "mmap_offset": a.mmap_offset,
                             "mapped": False, "cpu": False}
  def map_memory_to_gpu(self, a: kfd.MapMemoryArgs) -> None:
    ids = (ctypes.c_uint32 * a.n_devices).from_address(a.device_ids_array_ptr)
    assert list(ids) == [self.node.gpu_id] and a.n_success == 0
    self.allocs[a.handle]["mapped"] = True
    a.n_success = 1
  def unmap_memory_from_gpu(self, a: kfd.MapMemoryArgs) -> None:
    assert self.allocs[a.handle]["mapped"]
    self.allocs[a.handle]["mapped"] = False
  def free_memory_of_gpu(self, a: kfd.FreeMemoryArgs) -> None:
    assert not self.allocs[a.handle]["mapped"], "freeing memory still mapped to the GPU"
    self.allocs[a.handle]["freed"] = True
  def create_event(self, a: kfd.CreateEventArgs) -> None:
    page = self.allocs[a.event_page_offset]
    assert page["size"] >= 4096 * 8 and page["mapped"] and a.event_type == 0 and a.auto_reset == 1
    assert a.node_id == self.node.node
    a.event_id, a.event_slot_index, a.event_trigger_data = 9, 9, 9
  def destroy_event(self, a: kfd.DestroyEventArgs) -> None: assert a.event_id == 9
  def _mapped(self, addr: int, size: int = 8) -> dict:
    found = [x for x in self.allocs.values() if x["va"] <= addr and addr + size <= x["va"] + x["size"]]
    assert found and found[0]["mapped"], f"{addr:#x} is not GPU-mapped memory"
    return found[0]
  def create_queue(self, a: kfd.CreateQueueArgs) -> None:
    assert a.gpu_id == self.node.gpu_id and a.ring_size & (a.ring_size - 1) == 0
    self._mapped(a.ring_base_address, a.ring_size)
    self._mapped(a.read_pointer_address)
    self._mapped(a.write_pointer_address)
    if a.queue_type == kfd.KFD_IOC_QUEUE_TYPE_COMPUTE:
      assert self._mapped(a.eop_buffer_address, a.eop_buffer_size)["flags"] & kfd.MEM_VRAM
      assert (a.ctx_save_restore_size, a.ctl_stack_size) == (self.node.cwsr_size, self.node.ctl_stack_size)
      self._mapped(a.ctx_save_restore_address, self.node.cwsr_allocation)
    a.queue_id = len(self.queues)
    a.doorbell_offset = DOORBELL_BASE + 8 * a.queue_id
    self.queues.append(a)
  def destroy_queue(self, a: kfd.DestroyQueueArgs) -> None: assert a.queue_id < len(self.queues)
  def wait_events(self, a: kfd.WaitEventsArgs) -> None:
    assert a.num_events == 1 and kfd.EventData.from_address(a.events_ptr).event_id == 9
    self.run()
    a.wait_result = kfd.KFD_IOC_WAIT_RESULT_COMPLETE

  # the GPU
  def doorbell(self, queue: int) -> int: return ctypes.c_uint64.from_address(self.doorbell_page + 8 * queue).value
  def ring_dword(self, queue: int, at: int) -> int:
    q = self.queues[queue]
    return ctypes.c_uint32.from_address(q.ring_base_address + 4 * (at % (q.ring_size // 4))).value
  def run(self) -> None:
    for index, q in enumerate(self.queues):
      pm4 = q.queue_type == kfd.KFD_IOC_QUEUE_TYPE_COMPUTE
      end = self.doorbell(index) // (1 if pm4 else 4)
      while self.read[index] < end:
        size = (self.pm4 if pm4 else self.sdma)(index, self.read[index])
        if size == 0: break
        self.read[index] += size
      ctypes.c_uint64.from_address(q.read_pointer_address).value = self.read[index] * (1 if pm4 else 4)
  def pm4(self, queue: int, at: int) -> int:
    header = self.ring_dword(queue, at)
    assert header >> 30 == 3
    if header == 0xffff1000: return 1
    op, n = (header >> 8) & 0xff, ((header >> 16) & 0x3fff) + 1
    body = [self.ring_dword(queue, at + 1 + k) for k in range(n)]
    if op == 0x76:  # SET_SH_REG
      for k, v in enumerate(body[1:]): self.pm4_regs[0x2c00 + body[0] + k] = v
    elif op == 0x15: self.dispatches.append({"regs": dict(self.pm4_regs), "grid": body[:3], "initiator": body[3]})
    elif op == 0x49:  # RELEASE_MEM: data_sel 1 = 32 bits, 2 = 64 bits
      sel, addr, value = body[1] >> 29, body[2] | body[3] << 32, body[4] | body[5] << 32
      (ctypes.c_uint32 if sel == 1 else ctypes.c_uint64).from_address(addr).value = value
    elif op == 0x3c:  # WAIT_REG_MEM >=
      if ctypes.c_uint32.from_address(body[1] | body[2] << 32).value < body[3]: return 0
    else: assert op in (0x10, 0x58), hex(op)
    return 1 + n
  def sdma(self, queue: int, at: int) -> int:
    d = [self.ring_dword(queue, at + k) for k in range(7)]
    op = d[0] & 0xff
    if op == 0: return 1
    if op == 1:  # COPY_LINEAR
      ctypes.memmove(d[5] | d[6] << 32, d[3] | d[4] << 32, d[1] + 1)
      return 7
    if op == 5:  # FENCE
      ctypes.c_uint32.from_address(d[1] | d[2] << 32).value = d[3]
      return 4
    if op == 8: return 0 if ctypes.c_uint32.from_address(d[1] | d[2] << 32).value < d[3] else 6
    assert op == 6 and d[1] == 9, d  # TRAP with the event id
    return 2

@pytest.fixture
def fake_kfd(tmp_path, monkeypatch, request):
  props = request.param if hasattr(request, "param") else GFX1100
  root = fake_topology(tmp_path, props)
  fake = FakeKFD(kfd.read_topology(root)[0])
  for name in ("open", "close", "ioctl", "mmap", "munmap"): monkeypatch.setattr(kfd, f"_{name}", getattr(fake, name))
  monkeypatch.setattr(kfd.AMDKFDDevice, "topology_path", root)
  return fake

# the user SGPR of each kernel code property bit, in load order (AMDGPU "Initial Kernel Execution State")
USER_SGPRS = [(0, 4), (1, 2), (2, 2), (3, 2), (4, 2), (5, 2), (6, 1)]
RSRC3_REG = {9: 0x2e2d, 11: 0x2e28}  # COMPUTE_PGM_RSRC3: gc 9.4.x and gc 11.0 register headers, + 0x1260

@pytest.mark.parametrize("fake_kfd", [GFX1100, GFX942, GFX90A], indirect=True,
                         ids=["gfx1100", "gfx942", "gfx90a"])
def test_bring_up_to_a_first_dispatch(fake_kfd: FakeKFD) -> None:
  node, arch = fake_kfd.node, fake_kfd.node.arch
  renderer = AMDLLVMRenderer(arch)
  dev = kfd.AMDKFDDevice("AMD", renderer, AMDLLVMCompiler(arch))
  assert fake_kfd.calls[:2] == ["GET_VERSION", "ACQUIRE_VM"] and dev.arch == arch
  compute, sdma = fake_kfd.queues
  assert (compute.queue_type, sdma.queue_type) == (kfd.KFD_IOC_QUEUE_TYPE_COMPUTE, kfd.KFD_IOC_QUEUE_TYPE_SDMA)
  assert compute.queue_percentage == 100 and compute.queue_priority == 7 and compute.ring_size == 1 << 20
  assert compute.eop_buffer_size == 4096 and sdma.eop_buffer_address == 0 and sdma.ctx_save_restore_address == 0

  spec = programs(corpus_tensor("elementwise", dtypes.float32), renderer)[0]
  lib = dev.compiler.compile(spec.src)
  prg = dev.runtime(spec.name, lib)  # uploads through staging + an SDMA copy the fake executes
  co = parse_code_object(lib)
  kd = co.kernels[spec.name]
  base = prg.code_addr - kd.entry
  code_alloc = fake_kfd._mapped(base, 8)
  assert code_alloc["flags"] & kfd.MEM_VRAM and code_alloc["flags"] & kfd.MEM_EXECUTABLE and base % PAGE == 0
  for ptype, _, off, vaddr, filesz, _, _ in co.elf.segments:  # every segment landed at base + its vaddr
    if ptype == PT_LOAD: assert ctypes.string_at(base + vaddr, filesz) == lib[off:off + filesz]

  bufs = [dev.allocator.alloc(256) for _ in range(3)]
  before = fake_kfd.doorbell(0)
  prg(*bufs, global_size=(4, 1, 1), local_size=(16, 1, 1))
  # the doorbell and the write pointer both hold the ring's new end, in dwords for PM4
  assert fake_kfd.doorbell(0) == ctypes.c_uint64.from_address(compute.write_pointer_address).value > before
  words = [fake_kfd.ring_dword(0, k) for k in range(before, fake_kfd.doorbell(0))]
  dispatch_at = next(k for k, w in enumerate(words) if w >> 30 == 3 and (w >> 8) & 0xff == 0x15)
  assert words[dispatch_at + 1:dispatch_at + 4] == [4, 1, 1]
  dev.synchronize()
  assert fake_kfd.doorbell(1) == 4 * fake_kfd.read[1] > 0  # SDMA pointers count bytes
  (launch,) = fake_kfd.dispatches
  regs = launch["regs"]
  assert (regs[0x2e0c] | regs[0x2e0d] << 32) << 8 == base + kd.entry  # COMPUTE_PGM_LO/HI
  assert (regs[0x2e12], regs[0x2e13], regs[RSRC3_REG[node.version // 10000]]) == (kd.rsrc1, kd.rsrc2, kd.rsrc3)
  assert (regs[0x2e07], regs[0x2e08], regs[0x2e09]) == (16, 1, 1) and launch["grid"] == [4, 1, 1]
  assert launch["initiator"] & (1 << 15) == (1 << 15 if arch == "gfx1100" else 0)  # CS_W32_EN for wave32
  kernarg_sgpr = sum(n for bit, n in USER_SGPRS if bit < 3 and kd.properties & (1 << bit))
  kernargs = regs[0x2e40 + kernarg_sgpr] | regs[0x2e41 + kernarg_sgpr] << 32
  args = [ctypes.c_uint64.from_address(kernargs + offset).value for offset, _ in prg.layout]
  assert args == [b.va_addr for b in bufs]
  assert dev.timeline_signal.value == dev.timeline_value - 1
  assert ctypes.c_uint64.from_address(dev.mailbox).value == 9  # the interrupt's mailbox slot holds the event id
  dev.finalize()
  assert fake_kfd.closed == [DRM_FD, KFD_FD] and all(a.get("freed") for a in fake_kfd.allocs.values())
  assert fake_kfd.calls.count("DESTROY_QUEUE") == 2 and "DESTROY_EVENT" in fake_kfd.calls

def test_copies_round_trip_through_sdma(fake_kfd: FakeKFD) -> None:
  dev = kfd.AMDKFDDevice("AMD", AMDLLVMRenderer("gfx1100"), AMDLLVMCompiler("gfx1100"))
  data = bytes(range(256)) * 40
  buf = dev.allocator.alloc(len(data))
  dev.allocator._copyin(buf, memoryview(data))
  out = bytearray(len(data))
  dev.allocator._copyout(memoryview(out), buf)
  assert bytes(out) == data and ctypes.string_at(buf.va_addr, len(data)) == data
  dev.finalize()

def test_arch_mismatches_are_refused(fake_kfd: FakeKFD) -> None:
  with pytest.raises(DeviceError, match="DEV=AMD:LLVM:gfx1100"):
    kfd.AMDKFDDevice("AMD", AMDLLVMRenderer("gfx942"), AMDLLVMCompiler("gfx942"))
  assert fake_kfd.calls == []  # refused before the driver is touched
  dev = kfd.AMDKFDDevice("AMD", AMDLLVMRenderer("gfx1100"), AMDLLVMCompiler("gfx1100"))
  spec = programs(corpus_tensor("elementwise", dtypes.float32), AMDLLVMRenderer("gfx942"))[0]
  with pytest.raises(CompileError, match="compiled for amdgcn-amd-amdhsa--gfx942"):
    dev.runtime(spec.name, AMDLLVMCompiler("gfx942").compile(spec.src))
  dev.finalize()

def test_a_failed_bring_up_releases_what_it_took(fake_kfd: FakeKFD, monkeypatch) -> None:
  def version_2(a: kfd.GetVersionArgs) -> None: a.major_version, a.minor_version = 2, 0
  monkeypatch.setattr(fake_kfd, "get_version", version_2)
  with pytest.raises(DeviceError, match="ioctl interface 2.0; ember needs 1.x"):
    kfd.AMDKFDDevice("AMD", AMDLLVMRenderer("gfx1100"), AMDLLVMCompiler("gfx1100"))
  assert fake_kfd.closed == [KFD_FD] and fake_kfd.calls == ["GET_VERSION"]
  fake_kfd.calls.clear()
  def no_vram(a: kfd.AllocMemoryArgs) -> None: raise DeviceError("AMDKFD_IOC_ALLOC_MEMORY_OF_GPU failed: No memory")
  monkeypatch.setattr(fake_kfd, "get_version", FakeKFD.get_version.__get__(fake_kfd))
  monkeypatch.setattr(fake_kfd, "alloc_memory_of_gpu", no_vram)
  with pytest.raises(DeviceError, match="allocating 0x1000 bytes of GTT memory on gfx1100 failed"):
    kfd.AMDKFDDevice("AMD", AMDLLVMRenderer("gfx1100"), AMDLLVMCompiler("gfx1100"))
  assert fake_kfd.closed == [KFD_FD, DRM_FD, KFD_FD]

def _ring(pm4: bool, dwords: int = 64) -> tuple[kfd.KFDRing, object]:
  mem = (ctypes.c_uint64 * (dwords // 2 + 32))()
  base = ctypes.addressof(mem)
  ring = kfd.KFDRing(HCQBuffer(base, 4 * dwords, None), base + 4 * dwords, base + 4 * dwords + 64,
                     base + 4 * dwords + 128, pm4, 0)
  return ring, mem

@pytest.mark.parametrize("pm4", [True, False], ids=["pm4", "sdma"])
def test_ring_pads_the_tail_and_wraps(pm4: bool) -> None:
  ring, mem = _ring(pm4)
  unit = 4 if pm4 else 1
  def word(at: int) -> int: return ctypes.c_uint32.from_address(ring.ring.va_addr + 4 * at).value
  ring.submit(list(range(1, 41)))
  assert ctypes.c_uint64.from_address(ring.doorbell).value == 40 * 4 // unit
  ctypes.c_uint64.from_address(ring.rptr_addr).value = 40 * 4 // unit  # the engine consumed everything
  ring.submit(list(range(100, 130)))  # 30 dwords do not fit the 24 left: NOPs to the end, then from slot 0
  assert [word(k) for k in range(30)] == list(range(100, 130))
  if pm4: assert word(40) == (3 << 30) | (22 << 16) | (0x10 << 8)  # one NOP packet: header + 23 body dwords
  else: assert [word(k) for k in range(40, 64)] == [0] * 24
  assert ctypes.c_uint64.from_address(ring.wptr_addr).value == (40 + 24 + 30) * 4 // unit
  assert ctypes.c_uint64.from_address(ring.doorbell).value == (40 + 24 + 30) * 4 // unit

def test_a_stuck_ring_times_out() -> None:
  ring, _ = _ring(True)
  ring.submit([0] * 60)
  with pytest.raises(DeviceError, match="ring full"): ring._wait_space(10, timeout_s=0.05)

# ** without the driver **

@pytest.mark.skipif(os.path.exists("/dev/kfd"), reason="this machine has the AMD KFD driver")
def test_no_driver_is_reported_with_the_reason() -> None:
  from ember_amd.device import probe_amd
  result = probe_amd("KFD")
  assert not result.ok and "/dev/kfd not found" in result.reason and "DEV=MOCK+AMD" in result.reason
  env = {**os.environ, "EMBER_PLUGINS": "amd=ember_amd.plugin", "PYTHONPATH": os.pathsep.join(sys.path)}
  proc = subprocess.run([sys.executable, "-m", "ember", "devices"], capture_output=True, text=True, env=env,
                        timeout=300)
  assert "/dev/kfd not found" in proc.stdout, proc.stdout + proc.stderr

@pytest.mark.parametrize("fake_kfd", [GFX1100, GFX942], indirect=True, ids=["gfx1100", "gfx942"])
def test_group_reduction_dispatch_sizes_lds(fake_kfd: FakeKFD) -> None:
  """A kernel with LDS (a group reduction's shared buffer): RSRC2.LDS_SIZE carries its group segment in 512-byte
  granules, because a PM4 dispatch has no AQL packet the CP could take the size from; the other RSRC2 bits are the
  kernel descriptor's."""
  arch = fake_kfd.node.arch
  renderer = AMDLLVMRenderer(arch)
  dev = kfd.AMDKFDDevice("AMD", renderer, AMDLLVMCompiler(arch))
  spec = next(s for s in programs(corpus_tensor("long_reduce", dtypes.float32), renderer)
              if any(u.op is Ops.DEFINE_LOCAL for u in s.uops))
  lib = dev.compiler.compile(spec.src)
  kd = parse_code_object(lib).kernels[spec.name]
  assert kd.group_segment_size > 0
  prg = dev.runtime(spec.name, lib)
  prg(*[dev.allocator.alloc(8192) for _ in range(len(spec.globals))], global_size=tuple(spec.global_size),
      local_size=tuple(spec.local_size))
  dev.synchronize()
  rsrc2 = fake_kfd.dispatches[-1]["regs"][0x2e13]
  assert (rsrc2 >> 15) & 0x1ff == -(-kd.group_segment_size // 512)
  assert rsrc2 & ~(0x1ff << 15) == kd.rsrc2 & ~(0x1ff << 15)
  dev.finalize()
