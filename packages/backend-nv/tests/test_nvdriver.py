"""The NV ioctl interface without a GPU: ioctl struct layouts against NVIDIA's headers, QMD and GPFIFO packing through
independent decoders, and the device bring-up driven against a fake kernel driver up to the first GPFIFO submission."""
from __future__ import annotations
import ctypes
import os
import pytest
from ember.plugin import DeviceError
from ember_nv import nvdriver as nv
from ember_nv import queue as nvq
from ember_nv.mock import read_qmd

# ** struct layouts: (struct, size, {field: offset}) with the numbers worked out by hand from the headers **
LAYOUTS = [
  # nv-ioctl.h
  (nv.NvPciInfo, 12, {"bus": 4, "vendor_id": 8, "device_id": 10}),
  (nv.NvCardInfo, 72, {"pci_info": 4, "gpu_id": 16, "interrupt_line": 20, "reg_address": 24, "fb_size": 48,
                       "minor_number": 56, "dev_name": 60}),
  (nv.NvRegisterFd, 4, {"ctl_fd": 0}),
  # nvos.h (NV_ALIGN_BYTES(8) on every 64-bit field) and nv-unix-nvos-params-wrappers.h
  (nv.NVOS00, 16, {"hObjectOld": 8, "status": 12}),
  (nv.NVOS21, 32, {"hClass": 12, "pAllocParms": 16, "paramsSize": 24, "status": 28}),
  (nv.NVOS54, 32, {"cmd": 8, "flags": 12, "params": 16, "paramsSize": 24, "status": 28}),
  (nv.NVOS33, 48, {"hMemory": 8, "offset": 16, "length": 24, "pLinearAddress": 32, "status": 40, "flags": 44}),
  (nv.NVOS33WithFd, 56, {"params": 0, "fd": 48}),
  (nv.NVMemoryAlloc, 128, {"attr": 24, "attr2": 28, "zcullCovg": 40, "rangeLo": 48, "size": 64, "alignment": 72,
                           "limit": 88, "address": 96, "ctagOffset": 104, "hVASpace": 108, "numaNode": 120}),
  # cl0080.h, cl2080.h, nvos.h (FERMI_VASPACE_A), cla06c.h, cl9067.h, alloc_channel.h
  (nv.NV0080Alloc, 56, {"flags": 16, "vaSpaceSize": 24, "vaStartInternal": 32, "vaLimitInternal": 40, "vaMode": 48}),
  (nv.NV2080Alloc, 4, {"subDeviceId": 0}),
  (nv.NVVaspaceAlloc, 48, {"vaSize": 8, "vaStartInternal": 16, "vaLimitInternal": 24, "bigPageSize": 32,
                           "vaBase": 40}),
  (nv.NVChannelGroupAlloc, 20, {"engineType": 12, "bIsCallingContextVgpuPlugin": 16}),
  (nv.NVCtxShareAlloc, 12, {"flags": 4, "subctxId": 8}),
  (nv.NVMemoryDesc, 24, {"size": 8, "addressSpace": 16, "cacheAttrib": 20}),
  (nv.NVChannelAlloc, 368, {"gpFifoOffset": 8, "gpFifoEntries": 16, "hContextShare": 24, "hVASpace": 28,
                            "hUserdMemory": 32, "userdOffset": 64, "engineType": 128, "hObjectEccError": 140,
                            "instanceMem": 144, "mthdbufMem": 216, "hPhysChannelGroup": 240,
                            "errorNotifierMem": 248, "eccErrorNotifierMem": 272, "ProcessID": 296,
                            "encryptIv": 304, "decryptIv": 316, "hmacNonce": 328, "tpcConfigID": 360}),
  # ctrl0000gpu.h, ctrl0080gpu.h, ctrl2080gpu.h, ctrla06c.h, ctrlc36f.h
  (nv.GpuIdInfoV2, 32, {"deviceInstance": 8, "numaId": 28}),
  (nv.ClassList, 16, {"classList": 8}),
  (nv.GidInfo, 268, {"length": 8, "data": 12}),
  (nv.GpfifoSchedule, 3, {"bSkipEnable": 2}),
  (nv.WorkSubmitToken, 4, {"workSubmitToken": 0}),
  # uvm_ioctl.h, uvm_linux_ioctl.h (UVM_MAX_GPUS_V2 = 256 mapping attributes of 36 bytes)
  (nv.UvmInitialize, 16, {"rmStatus": 8}),
  (nv.UvmRegisterGpu, 40, {"numaEnabled": 16, "numaNodeId": 20, "rmCtrlFd": 24, "hClient": 28, "hSmcPartRef": 32,
                           "rmStatus": 36}),
  (nv.UvmRegisterGpuVaspace, 32, {"rmCtrlFd": 16, "hClient": 20, "hVaSpace": 24, "rmStatus": 28}),
  (nv.UvmCreateExternalRange, 24, {"length": 8, "rmStatus": 16}),
  (nv.UvmGpuMappingAttributes, 36, {"gpuMappingType": 16, "gpuCompressionType": 32}),
  (nv.UvmMapExternalAllocation, 9264, {"offset": 16, "perGpuAttributes": 24, "gpuAttributesCount": 9240,
                                       "rmCtrlFd": 9248, "hClient": 9252, "hMemory": 9256, "rmStatus": 9260}),
  (nv.UvmFree, 24, {"length": 8, "rmStatus": 16}),
]

@pytest.mark.parametrize("struct_type,size,offsets", LAYOUTS, ids=[t.__name__ for t, _, _ in LAYOUTS])
def test_ioctl_struct_layouts_match_the_headers(struct_type, size: int, offsets: dict[str, int]) -> None:
  assert ctypes.sizeof(struct_type) == size
  for field, offset in offsets.items(): assert getattr(struct_type, field).offset == offset, field

def test_ioctl_request_codes() -> None:
  # _IOWR('F', nr, size) from <asm-generic/ioctl.h>: dir 3 at bit 30, size at 16, type at 8, nr at 0
  assert nv.nv_iowr(nv.NV_ESC_RM_ALLOC, 32) == 0xc020462b
  assert nv.nv_iowr(nv.NV_ESC_RM_CONTROL, 32) == 0xc020462a
  assert nv.nv_iowr(nv.NV_ESC_CARD_INFO, 72 * 32) == 0xc90046c8
  with pytest.raises(DeviceError): nv.nv_iowr(nv.NV_ESC_RM_ALLOC, 1 << 14)

# ** GPFIFO entries and QMDs, read back by decoders written from the header bit ranges **

def _field(value: int, hi: int, lo: int) -> int: return (value >> lo) & ((1 << (hi - lo + 1)) - 1)

@pytest.mark.parametrize("addr,nwords", [(0x1000, 1), (0xab_cdef_0124, 77), ((1 << 40) - 4, (1 << 21) - 1)])
def test_gpfifo_entry_packing(addr: int, nwords: int) -> None:
  entry = nvq.gpfifo_entry(addr, nwords)
  word0, word1 = entry & 0xffffffff, entry >> 32
  assert _field(word0, 31, 2) << 2 == addr & 0xffffffff           # NVC56F_GP_ENTRY0_GET 31:2
  assert _field(word1, 7, 0) == addr >> 32                         # NVC56F_GP_ENTRY1_GET_HI 7:0
  assert _field(word1, 9, 9) == 1                                  # LEVEL = SUBROUTINE
  assert _field(word1, 30, 10) == nwords                           # LENGTH 30:10
  assert _field(word1, 31, 31) == 0 and _field(word0, 1, 0) == 0   # SYNC = PROCEED, FETCH = UNCONDITIONAL
  assert nvq.decode_gpfifo_entry(entry) == (addr, nwords)

@pytest.mark.parametrize("addr,nwords", [(1 << 40, 1), (0x1002, 1), (0x1000, 0), (0x1000, 1 << 21)])
def test_gpfifo_entry_rejects_what_does_not_fit(addr: int, nwords: int) -> None:
  with pytest.raises(DeviceError): nvq.gpfifo_entry(addr, nwords)

def test_method_header_packing() -> None:
  words = nvq.method(4, 0x0400, 1, 2, 3, 4)
  header = words[0]
  # NVC56F_DMA_SEC_OP 31:29 = INC_METHOD (1), METHOD_COUNT 28:16, METHOD_SUBCHANNEL 15:13, METHOD_ADDRESS 11:0
  assert (_field(header, 31, 29), _field(header, 28, 16), _field(header, 15, 13), _field(header, 11, 0) << 2) == \
         (1, 4, 4, 0x0400)
  assert words[1:] == [1, 2, 3, 4]

# (hi, lo) of each field as the headers give them: NVC6C0_QMDV03_00_* and NVCBC0_QMDV04_00_*
QMD_FIELDS = {
  3: {"major": (583, 580), "grid_w": (415, 384), "grid_h": (431, 416), "grid_d": (463, 448), "tx": (607, 592),
      "ty": (623, 608), "tz": (639, 624), "regs": (656, 648), "smem": (561, 544), "barriers": (767, 763),
      "prog_lo": (1567, 1536), "prog_hi": (1584, 1568), "cb_lo": (1055, 1024), "cb_hi": (1072, 1056),
      "cb_size4": (1087, 1075), "cb_valid": (640, 640)},
  4: {"major": (583, 580), "grid_w": (1055, 1024), "grid_h": (1071, 1056), "grid_d": (1103, 1088),
      "tx": (1167, 1152), "ty": (1183, 1168), "tz": (1199, 1184), "regs": (1208, 1200), "smem": (601, 584),
      "barriers": (1215, 1211), "prog_lo": (1247, 1216), "prog_hi": (1272, 1248), "cb_lo": (1567, 1536),
      "cb_hi": (1586, 1568), "cb_size4": (1599, 1587), "cb_valid": (416, 416)},
}

@pytest.mark.parametrize("layout", [nvq.QMD_V3, nvq.QMD_V4], ids=["qmd3", "qmd4"])
def test_qmd_packing_reads_back_through_the_header_fields(layout: nvq.QMDLayout) -> None:
  words = [0] * (layout.size // 4)
  prog, cbuf = 0x7f12_3456_7880, 0x7f00_0000_1240
  nvq.build_qmd(layout, words, prog, (70000, 3, 2), (128, 2, 1), (cbuf, 0x170), shared_size=5000, registers=40,
                barriers=1)
  bits = int.from_bytes(b"".join(w.to_bytes(4, "little") for w in words), "little")
  f = {name: _field(bits, hi, lo) for name, (hi, lo) in QMD_FIELDS[layout.major].items()}
  shift = 6 if layout.major == 4 else 0
  assert f["major"] == layout.major
  assert (f["grid_w"], f["grid_h"], f["grid_d"]) == (70000, 3, 2)
  assert (f["tx"], f["ty"], f["tz"]) == (128, 2, 1)
  assert (f["regs"], f["barriers"], f["smem"]) == (40, 1, 5120)  # shared memory rounded up to 256 bytes
  assert f["prog_lo"] | f["prog_hi"] << 32 == prog
  assert (f["cb_lo"] | f["cb_hi"] << 32) << shift == cbuf and f["cb_size4"] << 4 == 0x170 and f["cb_valid"] == 1
  # the MOCK's reader agrees
  buf = (ctypes.c_uint32 * len(words))(*words)
  launch = read_qmd(ctypes.addressof(buf))
  assert (launch.program_address, launch.grid, launch.block, launch.cbuf0, launch.registers) == \
         (prog, (70000, 3, 2), (128, 2, 1), (cbuf, 0x170), 40)

def test_qmd_rejects_values_that_do_not_fit() -> None:
  words = [0] * 64
  with pytest.raises(DeviceError): nvq.build_qmd(nvq.QMD_V3, words, 0, (1 << 16, 1 << 16, 1), (1, 1, 1), (0, 16))
  with pytest.raises(DeviceError): nvq.build_qmd(nvq.QMD_V4, [0] * 96, 0, (1, 1, 1), (1, 1, 1), (0x1010, 16))

def test_qmd_version_follows_the_arch() -> None:
  assert nvq.qmd_layout_for_arch("sm_80") is nvq.QMD_V3 and nvq.qmd_layout_for_arch("sm_89") is nvq.QMD_V3
  assert nvq.qmd_layout_for_arch("sm_90") is nvq.QMD_V4 and nvq.qmd_layout_for_arch("sm_90a") is nvq.QMD_V4
  for arch in ("sm_75", "sm_100"):
    with pytest.raises(DeviceError): nvq.qmd_layout_for_arch(arch)

# ** a fake NVIDIA kernel driver **

GPU_UUID = bytes(range(0x10, 0x20))
CLASSES = [0x41, 0x80, 0x2080, 0x90f1, 0xa06c, 0x9067, 0xc56f, 0xc86f, 0xc661, 0xcbc0, 0xc8b5, 0x3e, 0x40, 0xc7c0]

class FakeNVDriver(nv.Syscalls):
  """Stands in for /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia0: hands out handles, checks each object's class,
  parent and parameters, and maps host-visible memory as plain anonymous memory so the CPU side really runs."""
  def __init__(self) -> None:
    super().__init__()
    self.paths: dict[int, str] = {}
    self.objects: dict[int, tuple[int, int, ctypes.Structure | None]] = {}  # handle -> (class, parent, params copy)
    self.registered: set[int] = set()
    self.map_cookies: dict[int, int] = {}  # fd -> memory handle it may map
    self.mapped: dict[int, int] = {}       # cpu address -> memory handle
    self.ranges: dict[int, int] = {}       # UVM external ranges
    self.gpu_maps: dict[int, int] = {}     # va -> memory handle mapped in the GPU VA space
    self.uvm_gpus: list[bytes] = []
    self.uvm_vaspaces: list[int] = []
    self.scheduled: set[int] = set()
    self.tokens: dict[int, int] = {}
    self.reservations: list[tuple[int, int]] = []
    self.next_handle, self.client = 0xcaf00000, 0
  def open(self, path: str) -> int:
    assert path in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"), path
    fd = 100 + len(self.paths)
    self.paths[fd] = path
    return fd
  def close(self, fd: int) -> None: self.paths.pop(fd)
  def _new(self, cls: int, parent: int, params: ctypes.Structure | None) -> int:
    self.next_handle += 1
    self.objects[self.next_handle] = (cls, parent, params)
    return self.next_handle
  def _cls(self, handle: int) -> int: return self.objects[handle][0]
  def ioctl(self, fd: int, request: int, arg) -> int:
    if self.paths[fd] == "/dev/nvidia-uvm": return self._uvm(request, arg)
    assert request >> 30 == 3 and (request >> 8) & 0xff == ord("F"), hex(request)
    nr, size = request & 0xff, (request >> 16) & 0x3fff
    assert size == ctypes.sizeof(arg), (nr, size)
    if nr == nv.NV_ESC_CARD_INFO:
      arg[0].valid, arg[0].gpu_id, arg[0].minor_number = 1, 0x100, 0
    elif nr == nv.NV_ESC_REGISTER_FD:
      assert self.paths[fd] == "/dev/nvidia0" and self.paths[arg.ctl_fd] == "/dev/nvidiactl"
      self.registered.add(fd)
    elif nr == nv.NV_ESC_RM_ALLOC: self._alloc(arg)
    elif nr == nv.NV_ESC_RM_CONTROL: self._control(arg)
    elif nr == nv.NV_ESC_RM_MAP_MEMORY:
      p = arg.params
      assert arg.fd in self.registered, "a CPU mapping goes through a registered /dev/nvidia0 fd"
      assert self._cls(p.hMemory) in (0x3e, 0xc661) and p.hClient == self.client and p.length > 0
      self.map_cookies[arg.fd] = p.hMemory
      p.pLinearAddress = 0x1000 * len(self.map_cookies)
    elif nr == nv.NV_ESC_RM_FREE: self.objects.pop(arg.hObjectOld)
    else: raise AssertionError(f"unexpected escape {nr:#x}")
    return 0
  def _alloc(self, p: nv.NVOS21) -> None:
    cls = p.hClass
    params_type = {0x80: nv.NV0080Alloc, 0x2080: nv.NV2080Alloc, 0x90f1: nv.NVVaspaceAlloc,
                   0xa06c: nv.NVChannelGroupAlloc, 0x9067: nv.NVCtxShareAlloc, 0xc86f: nv.NVChannelAlloc,
                   0x3e: nv.NVMemoryAlloc, 0x40: nv.NVMemoryAlloc}.get(cls)
    params = None
    if params_type is not None:
      assert p.paramsSize == ctypes.sizeof(params_type), f"class {cls:#x} gets {p.paramsSize} bytes"
      params = params_type.from_buffer_copy(ctypes.string_at(p.pAllocParms, p.paramsSize))
    else: assert p.paramsSize == 0 and p.pAllocParms == 0, f"class {cls:#x} takes no parameters"
    if cls == 0x41:
      assert self.client == 0 and p.hRoot == 0 and p.hObjectParent == 0
      p.hObjectNew = self.client = self._new(cls, 0, None)
      return
    assert p.hRoot == self.client, "every object belongs to the client"
    parent_cls = self._cls(p.hObjectParent)
    expected_parent = {0x80: 0x41, 0x2080: 0x80, 0xc661: 0x2080, 0x90f1: 0x80, 0xa06c: 0x80, 0x9067: 0xa06c,
                       0xc86f: 0xa06c, 0xcbc0: 0xc86f, 0xc8b5: 0xc86f, 0x3e: 0x80, 0x40: 0x80}
    assert cls in expected_parent, f"the fake GPU does not offer class {cls:#x}"
    assert parent_cls == expected_parent[cls], f"class {cls:#x} allocated under {parent_cls:#x}"
    if cls == 0x80: assert params.deviceId == 7 and params.hClientShare == self.client and params.vaMode == 2
    if cls == 0x90f1: assert params.flags & nv.NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED and params.vaSize
    if cls == 0xa06c: assert params.engineType == nv.NV2080_ENGINE_TYPE_GRAPHICS
    if cls == 0x9067: assert self._cls(params.hVASpace) == 0x90f1
    if cls in (0x3e, 0x40):
      assert params.owner == self.client and params.size % 0x1000 == 0 and params.limit == params.size - 1
      assert (params.attr >> 25) & 3 == (1 if cls == 0x3e else 0), "system memory is PCI, local memory is VIDMEM"
    if cls == 0xc86f:
      assert self._cls(params.hContextShare) == 0x9067 and self._cls(params.hObjectError) == 0x3e
      assert self._cls(params.hUserdMemory[0]) == 0x3e and params.gpFifoEntries & (params.gpFifoEntries - 1) == 0
      assert any(va <= params.gpFifoOffset < va + 0x10000000 for va in self.gpu_maps), "the ring is GPU-mapped"
    if cls in (0xcbc0, 0xc8b5):
      assert not any(c == cls and par == p.hObjectParent for c, par, _ in self.objects.values())
    p.hObjectNew = self._new(cls, p.hObjectParent, params)
  def _control(self, p: nv.NVOS54) -> None:
    assert p.hClient == self.client
    cmd, obj = p.cmd, p.hObject
    if cmd == nv.NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2:
      params = nv.GpuIdInfoV2.from_address(p.params)
      assert obj == self.client and params.gpuId == 0x100
      params.deviceInstance = 7
    elif cmd == nv.NV0080_CTRL_CMD_GPU_GET_CLASSLIST:
      params = nv.ClassList.from_address(p.params)
      assert self._cls(obj) == 0x80
      if params.classList == 0: params.numClasses = len(CLASSES)
      else: (ctypes.c_uint32 * len(CLASSES)).from_address(params.classList)[:] = CLASSES
    elif cmd == nv.NV2080_CTRL_CMD_GPU_GET_GID_INFO:
      params = nv.GidInfo.from_address(p.params)
      assert self._cls(obj) == 0x2080 and params.flags == 2 and params.length == 16
      params.data[:16] = list(GPU_UUID)
    elif cmd == nv.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN:
      assert self._cls(obj) == 0xc86f
      nv.WorkSubmitToken.from_address(p.params).workSubmitToken = self.tokens[obj] = 0x40 + len(self.tokens)
    elif cmd == nv.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE:
      assert self._cls(obj) == 0xa06c and nv.GpfifoSchedule.from_address(p.params).bEnable == 1
      self.scheduled.add(obj)
    else: raise AssertionError(f"unexpected control {cmd:#x}")
  def _uvm(self, request: int, arg) -> int:
    if request == nv.UVM_INITIALIZE: pass
    elif request == nv.UVM_REGISTER_GPU:
      assert bytes(arg.gpu_uuid) == GPU_UUID and self.paths[arg.rmCtrlFd] == "/dev/nvidiactl"
      self.uvm_gpus.append(bytes(arg.gpu_uuid))
    elif request == nv.UVM_REGISTER_GPU_VASPACE:
      assert bytes(arg.gpuUuid) in self.uvm_gpus and self._cls(arg.hVaSpace) == 0x90f1
      self.uvm_vaspaces.append(arg.hVaSpace)
    elif request == nv.UVM_CREATE_EXTERNAL_RANGE:
      assert arg.base % 0x1000 == 0 and arg.length % 0x1000 == 0 and self.uvm_vaspaces
      self.ranges[arg.base] = arg.length
    elif request == nv.UVM_MAP_EXTERNAL_ALLOCATION:
      assert self.ranges.get(arg.base) == arg.length, "map inside a created external range"
      assert arg.gpuAttributesCount == 1 and bytes(arg.perGpuAttributes[0].gpuUuid) == GPU_UUID
      assert self._cls(arg.hMemory) in (0x3e, 0x40) and arg.hClient == self.client
      self.gpu_maps[arg.base] = arg.hMemory
    else: raise AssertionError(f"unexpected UVM ioctl {request}")
    return 0
  def mmap(self, addr: int | None, size: int, prot: int, flags: int, fd: int, offset: int) -> int:
    if fd == -1:
      assert prot == nv.PROT_NONE and flags & nv.MAP_FIXED_NOREPLACE
      self.reservations.append((addr, size))
      return super().mmap(addr, size, prot, flags, fd, offset)
    assert fd in self.map_cookies and flags & nv.MAP_SHARED and flags & nv.MAP_FIXED
    assert any(a <= addr and addr + size <= a + s for a, s in self.reservations), "maps over a reservation"
    self.mapped[addr] = self.map_cookies[fd]
    return super().mmap(addr, size, nv.PROT_RW, nv.MAP_PRIVATE | nv.MAP_ANONYMOUS | nv.MAP_FIXED, -1, 0)

@pytest.fixture(scope="module")
def fake_device():
  fake = FakeNVDriver()
  dev = nv.NVDriverDevice("NV", None, None, sys=fake)
  yield fake, dev
  for addr, size in fake.reservations: fake.munmap(addr, size)

def _pushbuffer(fifo: nvq.GPFifo, slot: int) -> list[int]:
  entry = fifo.ring[slot]
  word0, word1 = entry & 0xffffffff, entry >> 32
  addr, nwords = (word0 & 0xfffffffc) | (word1 & 0xff) << 32, (word1 >> 10) & 0x1fffff
  return list((ctypes.c_uint32 * nwords).from_address(addr))

def _hdr(subc: int, mthd: int, count: int) -> int: return 1 << 29 | count << 16 | subc << 13 | mthd >> 2

def test_bring_up_allocates_the_objects_in_order(fake_device) -> None:
  fake, dev = fake_device
  classes = [cls for cls, _, _ in fake.objects.values()]
  for cls in (0x41, 0x80, 0x2080, 0xc661, 0x90f1, 0xa06c, 0x9067, 0xc86f, 0xcbc0, 0xc8b5):
    assert cls in classes, hex(cls)
  assert classes.index(0x9067) < classes.index(0xc86f) < classes.index(0xcbc0)
  assert dev.compute_class == 0xcbc0 and dev.copy_class == 0xc8b5 and dev.arch == "sm_90"
  assert dev.qmd_layout is nvq.QMD_V4
  assert fake.uvm_gpus == [GPU_UUID] and fake.uvm_vaspaces == [dev.vaspace] and dev.channel_group in fake.scheduled
  # every host-visible buffer is CPU-mapped and GPU-mapped at the same address
  for buf in (dev.gpfifo_area, dev._cmd, dev._qmds, dev._kernargs):
    assert fake.mapped[buf.va_addr] == fake.gpu_maps[buf.va_addr]
  assert dev.local_memory.va_addr in fake.gpu_maps and dev.local_memory.va_addr not in fake.mapped
  assert all(va < 1 << 40 for va in fake.gpu_maps)

def test_first_submissions_ring_the_doorbell_with_their_pushbuffers(fake_device) -> None:
  fake, dev = fake_device
  compute, copy = dev.gpfifos["compute"], dev.gpfifos["copy"]
  assert sorted(fake.tokens.values()) == sorted([compute.token, copy.token])
  # USERD: GPPut (byte 0x8c of Nvc56fControl) counts the one entry each channel got
  for fifo in (compute, copy): assert ctypes.c_uint32.from_address(fifo.userd_addr + 0x8c).value == 1
  # the doorbell page (NVC361_NOTIFY_CHANNEL_PENDING = 0x90) holds the last channel's work submit token
  assert ctypes.c_uint32.from_address(dev.doorbell + 0x90).value == copy.token
  sig = dev.timeline_signal.addr
  words = _pushbuffer(compute, 0)
  local = dev.local_memory.va_addr
  expected = [_hdr(1, 0x0000, 1), 0xcbc0,                                  # SET_OBJECT: HOPPER_COMPUTE_A
              _hdr(1, 0x0790, 2), local >> 32, local & 0xffffffff,         # SET_SHADER_LOCAL_MEMORY_A/B
              _hdr(1, 0x02e4, 3), 0, 0x400 * 2048 * 2, 0xff,               # ..._NON_THROTTLED_A/B/C
              _hdr(1, 0x07b0, 2), 0x7293, 0,                               # SET_SHADER_LOCAL_MEMORY_WINDOW_A/B
              _hdr(1, 0x02a0, 2), 0x7294, 0,                               # SET_SHADER_SHARED_MEMORY_WINDOW_A/B
              _hdr(0, 0x005c, 5), sig & 0xffffffff, sig >> 32, 1, 0,       # SEM_ADDR_LO..SEM_EXECUTE: release 1,
              1 | 1 << 20 | 1 << 24]                                       # with WFI, 64-bit payload
  assert words == expected
  assert _pushbuffer(copy, 0) == [_hdr(4, 0x0000, 1), 0xc8b5, _hdr(0, 0x005c, 5), sig & 0xffffffff, sig >> 32, 2, 0,
                                  1 | 1 << 20 | 1 << 24]

def test_launch_writes_a_qmd_the_queue_points_at(fake_device) -> None:
  """A compute-queue launch on the driver device: SEND_PCAS_A carries the QMD address >> 8, and the QMD (version 4 on
  this Hopper) names the program and the kernel arguments."""
  fake, dev = fake_device
  prg = nvq.NVLaunchable(dev, "k", [(0, 8)], 16)
  prg.program_address, prg.cbuf0_size, prg.registers = 0x20_0000_0100, 16, 24
  args = prg.fill_kernargs((nvq.HCQBuffer(0x1234_5678, 64),))
  q = nvq.NVComputeQueue().exec(prg, args, (4, 1, 1), (32, 1, 1))
  assert q.words[0] == _hdr(1, 0x02b4, 1) and q.words[2:4] == [_hdr(1, 0x02c0, 1), 9]
  launch = read_qmd(q.words[1] << 8)
  assert (launch.program_address, launch.grid, launch.block, launch.cbuf0, launch.registers) == \
         (0x20_0000_0100, (4, 1, 1), (32, 1, 1), (args.buf.va_addr, 16), 24)
  assert ctypes.c_uint64.from_address(args.buf.va_addr).value == 0x1234_5678

@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="this machine has the NVIDIA driver")
def test_no_driver_is_a_clear_error() -> None:
  with pytest.raises(DeviceError, match="no NVIDIA kernel driver"): nv.NVDriverDevice("NV", None, None)

# ** the cubin reader against NVRTC's cubins (needs NVRTC; the launch layout is checked by kernel_arg_layout) **

def _nvrtc_missing() -> str | None:
  from ember.errors import CompileError
  from ember_nv.compiler import load_nvrtc
  try: load_nvrtc()
  except CompileError as e: return str(e)
  return None

@pytest.mark.skipif(_nvrtc_missing() is not None, reason=str(_nvrtc_missing()))
@pytest.mark.parametrize("arch", ("sm_80", "sm_90"))
def test_cubin_reader_finds_code_registers_and_parameters(arch: str) -> None:
  from ember.dtype import dtypes
  from nv_kernels import corpus_tensor, programs
  from ember_nv.compiler import NVRTCCompiler
  from ember_nv.renderer import CUDARenderer, kernel_arg_layout
  checked = 0
  for name in ("elementwise", "reduce", "matmul"):
    for spec in programs(corpus_tensor(name, dtypes.float32), CUDARenderer(arch)):
      cubin = NVRTCCompiler(arch).compile_cached(spec.src)
      info = nv.cubin_info(cubin, spec.name)
      assert info["text_offset"] % 128 == 0 and info["text_size"] > 0
      assert 0 < info["registers"] <= 255
      assert info["param_base"] > 0 and info["cbuf0_size"] >= info["param_base"]
      assert nv.cubin_param_layout(cubin, spec.name) == kernel_arg_layout(spec.uops)
      checked += 1
  assert checked >= 3
