"""DEV=NV: an NVIDIA GPU as an HCQ device over the NVIDIA kernel driver (`/dev/nvidiactl`, `/dev/nvidia-uvm`,
`/dev/nvidia<N>`), by ioctl and mmap. **Never run on hardware**: everything here is checked only against a fake
kernel driver in the tests (tests/test_nvdriver.py), and struct layouts against the numbers in NVIDIA's headers.

Bring-up (`NVDriverDevice.__init__`), in the order the resource manager (RM) needs:
  card info (NV_ESC_CARD_INFO) -> RM client (NV01_ROOT_CLIENT) -> UVM_INITIALIZE -> /dev/nvidia<N> registered with the
  control fd -> device (NV01_DEVICE_0, multiple VA spaces) -> subdevice (NV20_SUBDEVICE_0) -> class list ->
  usermode object mapped as the doorbell page -> VA space (FERMI_VASPACE_A) -> GPU UUID (GID info) ->
  UVM_REGISTER_GPU, UVM_REGISTER_GPU_VASPACE -> channel group (KEPLER_CHANNEL_GROUP_A) + context share ->
  two GPFIFO channels (compute, copy) with their rings and USERD in host-visible memory, an engine object on each
  (compute class, DMA copy class) and their work-submit tokens -> channel group scheduled -> a first submission per
  channel: SET_OBJECT and the compute engine's shared/local memory windows.

Memory: we choose every GPU virtual address ourselves (`VARange`, between 64 GiB and 1 TiB so pushbuffers and QMDs
satisfy the 40-bit GPFIFO/QMD fields). The CPU range is reserved first (mmap PROT_NONE, MAP_FIXED_NOREPLACE); RM
allocates the memory (video memory, or host-visible system memory that is also mmapped through /dev/nvidia<N> at the
same address); UVM maps it into the GPU VA space at that same address. So a host-visible buffer has one address for
CPU and GPU, which is what signals, kernargs, pushbuffers and staging need.

Every ioctl goes through `RMClient._ioctl(fd, nr, struct)` and the `Syscalls` object it holds: a test replaces the
syscall layer (open/ioctl/mmap/munmap) with a fake driver. Struct layouts follow open-gpu-kernel-modules
(release 550-570 headers; layouts that change between releases are named in the README); `nvidia_version()` is quoted
in every RM error.
"""
from __future__ import annotations
import ctypes
import fcntl
import os
import struct
from typing import Any
from ember.plugin import (BufferSpec, CompileError, Compiler, DeviceError, ElfSection, HCQAllocator, HCQBuffer,
                          Renderer, read_elf)
from ember_nv.queue import (DOORBELL_OFFSET, QMD_V3, SET_OBJECT, SET_SHADER_LOCAL_MEMORY_A,
                            SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A, SET_SHADER_LOCAL_MEMORY_WINDOW_A,
                            SET_SHADER_SHARED_MEMORY_WINDOW_A, SUBC_COMPUTE, SUBC_COPY, USERD_SIZE, GPFifo,
                            NVComputeQueue, NVCopyQueue, NVHCQDevice, NVLaunchable, method, qmd_layout_for_arch)

# ** ioctl numbers (nv-ioctl-numbers.h, nv_escape.h, uvm_ioctl.h, uvm_linux_ioctl.h) **
NV_IOCTL_MAGIC, NV_IOCTL_BASE = ord("F"), 200
NV_ESC_CARD_INFO, NV_ESC_REGISTER_FD = NV_IOCTL_BASE + 0, NV_IOCTL_BASE + 1
NV_ESC_RM_FREE, NV_ESC_RM_CONTROL, NV_ESC_RM_ALLOC, NV_ESC_RM_MAP_MEMORY = 0x29, 0x2a, 0x2b, 0x4e
UVM_INITIALIZE, UVM_REGISTER_GPU_VASPACE, UVM_MAP_EXTERNAL_ALLOCATION, UVM_FREE = 0x30000001, 25, 33, 34
UVM_REGISTER_GPU, UVM_CREATE_EXTERNAL_RANGE = 37, 73

def nv_iowr(nr: int, size: int) -> int:
  """_IOWR('F', nr, size): the request code of an RM escape whose argument is `size` bytes."""
  if not 0 < size < 1 << 14: raise DeviceError(f"ioctl argument of {size} bytes does not fit the _IOC size field")
  return (3 << 30) | (size << 16) | (NV_IOCTL_MAGIC << 8) | nr

# ** classes (cl0000.h, cl0080.h, cl2080.h, cl003e.h, cl0040.h, cl90f1.h, cla06c.h, cl9067.h, clc56f.h, clc86f.h,
# clc561.h, clc661.h, clc6c0.h, clc7c0.h, clc9c0.h, clcbc0.h, clc6b5.h, clc7b5.h, clc8b5.h) **
NV01_ROOT_CLIENT, NV01_DEVICE_0, NV20_SUBDEVICE_0 = 0x41, 0x80, 0x2080
NV01_MEMORY_SYSTEM, NV01_MEMORY_LOCAL_USER = 0x3e, 0x40
FERMI_VASPACE_A, KEPLER_CHANNEL_GROUP_A, FERMI_CONTEXT_SHARE_A = 0x90f1, 0xa06c, 0x9067
GPFIFO_CLASSES = {0xc86f: "HOPPER_CHANNEL_GPFIFO_A", 0xc56f: "AMPERE_CHANNEL_GPFIFO_A"}
USERMODE_CLASSES = {0xc661: "HOPPER_USERMODE_A", 0xc561: "AMPERE_USERMODE_A"}
COMPUTE_CLASSES = {0xcbc0: ("HOPPER_COMPUTE_A", "sm_90"), 0xc9c0: ("ADA_COMPUTE_A", "sm_89"),
                   0xc7c0: ("AMPERE_COMPUTE_B", "sm_86"), 0xc6c0: ("AMPERE_COMPUTE_A", "sm_80")}
COPY_CLASSES = {0xc8b5: "HOPPER_DMA_COPY_A", 0xc7b5: "AMPERE_DMA_COPY_B", 0xc6b5: "AMPERE_DMA_COPY_A"}
# controls (ctrl0000gpu.h, ctrl0080gpu.h, ctrl2080gpu.h, ctrla06c.h, ctrlc36f.h)
NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2, NV0080_CTRL_CMD_GPU_GET_CLASSLIST = 0x205, 0x800201
NV2080_CTRL_CMD_GPU_GET_GID_INFO, NV2080_GID_FLAGS_FORMAT_BINARY = 0x2080014a, 2
NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN = 0xa06c0101, 0xc36f0108
# allocation flags (nvos.h, cl0080.h, cl90f1 / nvos.h, cl9067.h, cl2080_notification.h)
NV_DEVICE_ALLOCATION_VAMODE_MULTIPLE_VASPACES = 2
NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED, NV_VASPACE_ALLOCATION_FLAGS_ENABLE_PAGE_FAULTING = 1 << 3, 1 << 6
NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC, NV2080_ENGINE_TYPE_GRAPHICS = 1, 1
NVOS32_TYPE_IMAGE, NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE, NVOS32_ALLOC_FLAGS_MAP_NOT_REQUIRED = 0, 0x100, 0x8000
# NVOS32_ATTR fields: PAGE_SIZE 24:23, LOCATION 26:25, PHYSICALITY 28:27, COHERENCY 31:29
ATTR_PAGE_4KB, ATTR_PAGE_HUGE = 1 << 23, 3 << 23
ATTR_LOCATION_VIDMEM, ATTR_LOCATION_PCI = 0 << 25, 1 << 25
ATTR_NONCONTIGUOUS, ATTR_COHERENCY_CACHED = 1 << 27, 1 << 29
UVM_GPU_MAPPING_READ_WRITE_ATOMIC, UVM_MAX_GPUS_V2 = 1, 256
# compute engine setup (values CUDA's driver programs; windows are where generic addresses reach local/shared memory)
LOCAL_MEMORY_WINDOW, SHARED_MEMORY_WINDOW, LOCAL_BYTES_PER_THREAD = 0x729300000000, 0x729400000000, 0x400

class _S(ctypes.Structure):
  """A C struct with natural x86-64 alignment (the NV_ALIGN_BYTES(8) fields are 64-bit, so it matches)."""

def _struct(name: str, fields: list[tuple[str, Any]]) -> type[ctypes.Structure]:
  return type(name, (_S,), {"_fields_": fields})

u8, u16, u32, i32, u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64
# nv-ioctl.h
NvPciInfo = _struct("nv_pci_info_t", [("domain", u32), ("bus", u8), ("slot", u8), ("function", u8),
                                      ("vendor_id", u16), ("device_id", u16)])
NvCardInfo = _struct("nv_ioctl_card_info_t", [
  ("valid", u8), ("pci_info", NvPciInfo), ("gpu_id", u32), ("interrupt_line", u16), ("reg_address", u64),
  ("reg_size", u64), ("fb_address", u64), ("fb_size", u64), ("minor_number", u32), ("dev_name", u8 * 10)])
NvRegisterFd = _struct("nv_ioctl_register_fd_t", [("ctl_fd", i32)])
# nvos.h, nv-unix-nvos-params-wrappers.h
NVOS00 = _struct("NVOS00_PARAMETERS", [("hRoot", u32), ("hObjectParent", u32), ("hObjectOld", u32), ("status", u32)])
NVOS21 = _struct("NVOS21_PARAMETERS", [("hRoot", u32), ("hObjectParent", u32), ("hObjectNew", u32), ("hClass", u32),
                                       ("pAllocParms", u64), ("paramsSize", u32), ("status", u32)])
NVOS54 = _struct("NVOS54_PARAMETERS", [("hClient", u32), ("hObject", u32), ("cmd", u32), ("flags", u32),
                                       ("params", u64), ("paramsSize", u32), ("status", u32)])
NVOS33 = _struct("NVOS33_PARAMETERS", [("hClient", u32), ("hDevice", u32), ("hMemory", u32), ("offset", u64),
                                       ("length", u64), ("pLinearAddress", u64), ("status", u32), ("flags", u32)])
NVOS33WithFd = _struct("nv_ioctl_nvos33_parameters_with_fd", [("params", NVOS33), ("fd", i32)])
NV0080Alloc = _struct("NV0080_ALLOC_PARAMETERS", [
  ("deviceId", u32), ("hClientShare", u32), ("hTargetClient", u32), ("hTargetDevice", u32), ("flags", u32),
  ("vaSpaceSize", u64), ("vaStartInternal", u64), ("vaLimitInternal", u64), ("vaMode", u32)])
NV2080Alloc = _struct("NV2080_ALLOC_PARAMETERS", [("subDeviceId", u32)])
NVVaspaceAlloc = _struct("NV_VASPACE_ALLOCATION_PARAMETERS", [
  ("index", u32), ("flags", u32), ("vaSize", u64), ("vaStartInternal", u64), ("vaLimitInternal", u64),
  ("bigPageSize", u32), ("vaBase", u64)])
NVMemoryAlloc = _struct("NV_MEMORY_ALLOCATION_PARAMS", [
  ("owner", u32), ("type", u32), ("flags", u32), ("width", u32), ("height", u32), ("pitch", i32), ("attr", u32),
  ("attr2", u32), ("format", u32), ("comprCovg", u32), ("zcullCovg", u32), ("rangeLo", u64), ("rangeHi", u64),
  ("size", u64), ("alignment", u64), ("offset", u64), ("limit", u64), ("address", u64), ("ctagOffset", u32),
  ("hVASpace", u32), ("internalflags", u32), ("tag", u32), ("numaNode", i32)])
NVChannelGroupAlloc = _struct("NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS", [
  ("hObjectError", u32), ("hObjectEccError", u32), ("hVASpace", u32), ("engineType", u32),
  ("bIsCallingContextVgpuPlugin", u8)])
NVCtxShareAlloc = _struct("NV_CTXSHARE_ALLOCATION_PARAMETERS", [("hVASpace", u32), ("flags", u32), ("subctxId", u32)])
NVMemoryDesc = _struct("NV_MEMORY_DESC_PARAMS", [("base", u64), ("size", u64), ("addressSpace", u32),
                                                 ("cacheAttrib", u32)])
NVChannelAlloc = _struct("NV_CHANNEL_ALLOC_PARAMS", [
  ("hObjectError", u32), ("hObjectBuffer", u32), ("gpFifoOffset", u64), ("gpFifoEntries", u32), ("flags", u32),
  ("hContextShare", u32), ("hVASpace", u32), ("hUserdMemory", u32 * 8), ("userdOffset", u64 * 8),
  ("engineType", u32), ("cid", u32), ("subDeviceId", u32), ("hObjectEccError", u32), ("instanceMem", NVMemoryDesc),
  ("userdMem", NVMemoryDesc), ("ramfcMem", NVMemoryDesc), ("mthdbufMem", NVMemoryDesc), ("hPhysChannelGroup", u32),
  ("internalFlags", u32), ("errorNotifierMem", NVMemoryDesc), ("eccErrorNotifierMem", NVMemoryDesc),
  ("ProcessID", u32), ("SubProcessID", u32), ("encryptIv", u32 * 3), ("decryptIv", u32 * 3), ("hmacNonce", u32 * 8),
  ("tpcConfigID", u32)])
# control parameters (ctrl0000gpu.h, ctrl0080gpu.h, ctrl2080gpu.h, ctrla06c.h, ctrlc36f.h)
GpuIdInfoV2 = _struct("NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS", [
  ("gpuId", u32), ("gpuFlags", u32), ("deviceInstance", u32), ("subDeviceInstance", u32), ("sliStatus", u32),
  ("boardId", u32), ("gpuInstance", u32), ("numaId", i32)])
ClassList = _struct("NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS", [("numClasses", u32), ("classList", u64)])
GidInfo = _struct("NV2080_CTRL_GPU_GET_GID_INFO_PARAMS", [("index", u32), ("flags", u32), ("length", u32),
                                                          ("data", u8 * 256)])
GpfifoSchedule = _struct("NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS", [("bEnable", u8), ("bSkipSubmit", u8),
                                                                ("bSkipEnable", u8)])
WorkSubmitToken = _struct("NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS", [("workSubmitToken", u32)])
# uvm_ioctl.h, uvm_linux_ioctl.h, uvm_types.h
Uuid = u8 * 16
UvmInitialize = _struct("UVM_INITIALIZE_PARAMS", [("flags", u64), ("rmStatus", u32)])
UvmRegisterGpu = _struct("UVM_REGISTER_GPU_PARAMS", [
  ("gpu_uuid", Uuid), ("numaEnabled", u8), ("numaNodeId", i32), ("rmCtrlFd", i32), ("hClient", u32),
  ("hSmcPartRef", u32), ("rmStatus", u32)])
UvmRegisterGpuVaspace = _struct("UVM_REGISTER_GPU_VASPACE_PARAMS", [
  ("gpuUuid", Uuid), ("rmCtrlFd", i32), ("hClient", u32), ("hVaSpace", u32), ("rmStatus", u32)])
UvmCreateExternalRange = _struct("UVM_CREATE_EXTERNAL_RANGE_PARAMS", [("base", u64), ("length", u64),
                                                                      ("rmStatus", u32)])
UvmGpuMappingAttributes = _struct("UvmGpuMappingAttributes", [
  ("gpuUuid", Uuid), ("gpuMappingType", u32), ("gpuCachingType", u32), ("gpuFormatType", u32),
  ("gpuElementBits", u32), ("gpuCompressionType", u32)])
UvmMapExternalAllocation = _struct("UVM_MAP_EXTERNAL_ALLOCATION_PARAMS", [
  ("base", u64), ("length", u64), ("offset", u64), ("perGpuAttributes", UvmGpuMappingAttributes * UVM_MAX_GPUS_V2),
  ("gpuAttributesCount", u64), ("rmCtrlFd", i32), ("hClient", u32), ("hMemory", u32), ("rmStatus", u32)])
UvmFree = _struct("UVM_FREE_PARAMS", [("base", u64), ("length", u64), ("rmStatus", u32)])

# ** the syscall layer **

PROT_NONE, PROT_RW, MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0, 3, 0x01, 0x02, 0x10, 0x20
MAP_NORESERVE, MAP_FIXED_NOREPLACE = 0x4000, 0x100000

class Syscalls:
  """open/close/ioctl/mmap/munmap on this machine; tests substitute a fake NVIDIA driver."""
  def __init__(self) -> None:
    self.libc = ctypes.CDLL(None, use_errno=True)
    self.libc.mmap.restype = ctypes.c_void_p
    self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               ctypes.c_long]
    self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
  def open(self, path: str) -> int:
    try: return os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e: raise DeviceError(f"cannot open {path}: {e.strerror}; is the NVIDIA kernel driver loaded and "
                                           "this user in the video group?") from e
  def close(self, fd: int) -> None: os.close(fd)
  def ioctl(self, fd: int, request: int, arg: ctypes.Structure | ctypes.Array) -> int:
    return fcntl.ioctl(fd, request, arg)
  def mmap(self, addr: int | None, size: int, prot: int, flags: int, fd: int, offset: int) -> int:
    got = self.libc.mmap(addr, size, prot, flags, fd, offset)
    if got in (None, ctypes.c_void_p(-1).value) or (addr is not None and flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)
                                                    and got != addr):
      raise DeviceError(f"mmap of {size:#x} bytes at {addr or 0:#x} failed (errno {ctypes.get_errno()})")
    return int(got)
  def munmap(self, addr: int, size: int) -> None: self.libc.munmap(addr, size)

def nvidia_version() -> str:
  try:
    with open("/sys/module/nvidia/version") as f: return f.read().strip()
  except OSError: return "unknown"

class RMClient:
  """The RM and UVM interfaces of one process: handles, allocations, controls, memory maps. Every ioctl goes through
  `_ioctl`, which raises a DeviceError naming the call when the kernel or the RM refuses it."""
  def __init__(self, sys: Syscalls) -> None:
    self.sys = sys
    self.fd_ctl = sys.open("/dev/nvidiactl")
    self.fd_uvm = sys.open("/dev/nvidia-uvm")
    self.client = 0
    self.client = self.alloc(0, NV01_ROOT_CLIENT, None, handle=0)
  def _ioctl(self, fd: int, nr: int, arg: ctypes.Structure | ctypes.Array, what: str, uvm: bool = False) -> None:
    request = nr if uvm else nv_iowr(nr, ctypes.sizeof(arg))
    try: rc = self.sys.ioctl(fd, request, arg)
    except OSError as e:
      raise DeviceError(f"NV {what}: ioctl failed ({e.strerror}); driver {nvidia_version()}") from e
    if rc != 0: raise DeviceError(f"NV {what}: ioctl returned {rc}; driver {nvidia_version()}")
    status = getattr(arg, "rmStatus" if uvm else "status", 0) if isinstance(arg, ctypes.Structure) else 0
    if status != 0:
      raise DeviceError(f"NV {what} failed with status {status:#x} (nvstatuscodes.h); driver {nvidia_version()}, "
                        "whose parameter layouts may differ from the 550-570 headers ember_nv follows")
  def alloc(self, parent: int, cls: int, params: ctypes.Structure | None, handle: int | None = None) -> int:
    """A new RM object of class `cls` under `parent`; RM picks the handle."""
    p = NVOS21(hRoot=self.client, hObjectParent=parent, hObjectNew=handle or 0, hClass=cls,
               pAllocParms=ctypes.addressof(params) if params is not None else 0,
               paramsSize=ctypes.sizeof(params) if params is not None else 0)
    self._ioctl(self.fd_ctl, NV_ESC_RM_ALLOC, p, f"RM alloc of class {cls:#x}")
    return p.hObjectNew
  def free(self, parent: int, handle: int) -> None:
    self._ioctl(self.fd_ctl, NV_ESC_RM_FREE, NVOS00(hRoot=self.client, hObjectParent=parent, hObjectOld=handle),
                f"RM free of {handle:#x}")
  def control(self, obj: int, cmd: int, params: ctypes.Structure) -> ctypes.Structure:
    p = NVOS54(hClient=self.client, hObject=obj, cmd=cmd, params=ctypes.addressof(params),
               paramsSize=ctypes.sizeof(params))
    self._ioctl(self.fd_ctl, NV_ESC_RM_CONTROL, p, f"RM control {cmd:#x}")
    return params
  def uvm(self, nr: int, params: ctypes.Structure, what: str) -> ctypes.Structure:
    self._ioctl(self.fd_uvm, nr, params, f"UVM {what}", uvm=True)
    return params
  def map_to_cpu(self, device: int, memory: int, fd_dev: int, addr: int, size: int) -> None:
    """mmap RM memory `memory` at CPU address `addr` through `fd_dev` (a /dev/nvidia<N> fd used for this map only)."""
    p = NVOS33WithFd(params=NVOS33(hClient=self.client, hDevice=device, hMemory=memory, length=size), fd=fd_dev)
    self._ioctl(self.fd_ctl, NV_ESC_RM_MAP_MEMORY, p, f"RM map of {memory:#x}")
    if p.params.status != 0: raise DeviceError(f"NV RM map of {memory:#x} failed with status {p.params.status:#x}")
    self.sys.mmap(addr, size, PROT_RW, MAP_SHARED | MAP_FIXED, fd_dev, p.params.pLinearAddress)

class VARange:
  """GPU (and CPU) virtual addresses we hand out: a bump allocator with a free list of exact sizes."""
  def __init__(self, base: int, limit: int) -> None:
    self.next, self.limit, self.free_list = base, limit, {}  # type: ignore[var-annotated]
  def alloc(self, size: int, align: int) -> int:
    if (reuse := self.free_list.get((size, align))): return reuse.pop()
    addr = -(-self.next // align) * align
    if addr + size > self.limit: raise DeviceError(f"NV: out of GPU virtual addresses for {size:#x} bytes")
    self.next = addr + size
    return addr
  def release(self, addr: int, size: int, align: int) -> None: self.free_list.setdefault((size, align), []).append(addr)

# ** cubins **

# .nv.info records: format byte (EIFMT_NVAL 1, BVAL 2, HVAL 3, SVAL 4), attribute byte, 16-bit value or SVAL size
EIATTR_PARAM_CBANK, EIATTR_KPARAM_INFO, EIATTR_CBANK_PARAM_SIZE, EIATTR_REGCOUNT = 0x0a, 0x17, 0x19, 0x2f
EIFMT_HVAL, EIFMT_SVAL = 0x03, 0x04

def cubin_info(image: bytes, name: str) -> dict[str, int]:
  """What a launch needs of kernel `name` in a cubin: the offset and size of `.text.<name>`, its register count
  (EIATTR_REGCOUNT in `.nv.info.<name>`), static shared memory (`.nv.shared.<name>`), constant bank 0's size
  (`.nv.constant0.<name>`) and where the parameters start in it (EIATTR_PARAM_CBANK: offset in the low half)."""
  elf = read_elf(image, "the NV program (a cubin)")
  if (text := elf.section(f".text.{name}")) is None:
    raise CompileError(f"cubin has no .text.{name}; the kernel is named differently or was not compiled")
  info = {"text_offset": text.offset, "text_size": text.size, "registers": 0, "shared": 0, "cbuf0_size": 0,
          "param_base": 0, "barriers": 0}
  if (shared := elf.section(f".nv.shared.{name}")) is not None: info["shared"] = shared.size
  if (const0 := elf.section(f".nv.constant0.{name}")) is not None: info["cbuf0_size"] = const0.size
  # .text section's sh_info: bits 31:24 hold the register count in NVIDIA cubins; .nv.info says it too
  # .text.<name>'s sh_info: the kernel's symbol index in bits 23:0, its register count in 31:24 (older cubins); the
  # global .nv.info's EIATTR_REGCOUNT records (symbol index, registers) say it for every target
  symbol, info["registers"] = text.info & 0xffffff, text.info >> 24
  for section in (".nv.info", f".nv.info.{name}"):
    for attr, payload in _nv_info_records(elf.section(section)):
      if len(payload) < 8: continue
      if attr == EIATTR_REGCOUNT and struct.unpack_from("<I", payload)[0] == symbol:
        info["registers"], = struct.unpack_from("<I", payload, 4)
      if attr == EIATTR_PARAM_CBANK: info["param_base"], = struct.unpack_from("<H", payload, 4)
  return info

def _nv_info_records(section: ElfSection | None) -> list[tuple[int, bytes]]:
  """(attribute, payload) of each EIFMT_SVAL record of an .nv.info section; the other formats carry no payload."""
  if section is None: return []
  data, pos, out = section.data, 0, []
  while pos + 4 <= len(data):
    fmt, attr, size = data[pos], data[pos + 1], struct.unpack_from("<H", data, pos + 2)[0]
    if fmt == EIFMT_SVAL:
      out.append((attr, data[pos + 4:pos + 4 + size]))
      pos += 4 + size
    else: pos += 4  # EIFMT_NVAL/BVAL/HVAL: the value sits in the record's 16-bit field
  return out

class NVCubinProgram(NVLaunchable):
  """A cubin uploaded to video memory through the staging buffer and the copy queue; the QMD points at `.text.<name>`.
  Constant buffer 0 is `.nv.constant0.<name>`: the driver's words (shared and local memory windows) then the
  parameters from `param_base`."""
  def __init__(self, device: NVDriverDevice, name: str, lib: bytes, layout: list[tuple[int, int]],
               args_size: int) -> None:
    info = cubin_info(lib, name)
    self.image = device.allocator.alloc(len(lib))
    device.allocator._copyin(self.image, memoryview(lib))
    self.program_address = self.image.va_addr + info["text_offset"]
    if self.program_address % 128: raise CompileError(f"kernel {name}'s code is not 128-byte aligned in the cubin")
    self.registers, self.shared_size, self.barriers = info["registers"], info["shared"], 1
    base = info["param_base"]
    size = max(info["cbuf0_size"], base + args_size)
    super().__init__(device, name, [(base + off, width) for off, width in layout], -(-size // 16) * 16)
    self.cbuf0_size = self.args_size
    self.driver_words = struct.pack("<QQQ", SHARED_MEMORY_WINDOW, LOCAL_MEMORY_WINDOW, 0xfffdc0)
  def fill_kernargs(self, bufs: tuple[HCQBuffer, ...], vals: tuple[int, ...] = (),
                    kernargs: HCQBuffer | None = None) -> Any:
    args = super().fill_kernargs(bufs, vals, kernargs)
    ctypes.memmove(args.buf.va_addr, self.driver_words, len(self.driver_words))
    return args

# ** the device **

class NVDriverAllocator(HCQAllocator):
  """Video memory mapped into the GPU VA space (never into the CPU)."""
  def __init__(self, device: NVDriverDevice) -> None:
    super().__init__(device)
    self.dev = device
  def _alloc(self, size: int, options: BufferSpec) -> HCQBuffer: return self.dev.alloc_memory(size, host=False)
  def _free(self, opaque: HCQBuffer, options: BufferSpec) -> None: self.dev.free_memory(opaque)

class NVDriverDevice(NVHCQDevice):
  """DEV=NV: one NVIDIA GPU through the kernel driver; kernels are cubins from NVRTC (CUDA C) or ptxas (PTX) for the
  GPU's own `sm_XX`."""
  RING_ENTRIES = 0x10000
  def __init__(self, device: str, renderer: Renderer | None, compiler: Compiler | None,
               sys: Syscalls | None = None) -> None:
    if not os.path.exists("/dev/nvidiactl") and sys is None:
      raise DeviceError("no NVIDIA kernel driver (/dev/nvidiactl not found); use DEV=MOCK+NV to run the NV queues "
                        "without a GPU")
    self.sys = sys or Syscalls()
    self.rm = rm = RMClient(self.sys)
    self.va = VARange(64 << 30, 1 << 40)
    self.memory: dict[int, tuple[int, int, bool, int]] = {}  # va -> (handle, size, host, align)
    self.map_fds: list[int] = []
    index = int(device.partition(":")[2] or 0)
    cards = (NvCardInfo * 32)()
    rm._ioctl(rm.fd_ctl, NV_ESC_CARD_INFO, cards, "card info")
    valid = [c for c in cards if c.valid]
    if index >= len(valid): raise DeviceError(f"NV:{index}: the driver reports {len(valid)} NVIDIA GPU(s)")
    card = valid[index]
    rm.uvm(UVM_INITIALIZE, UvmInitialize(), "initialize")
    self.fd_dev_path = f"/dev/nvidia{card.minor_number}"
    self.fd_dev = self.sys.open(self.fd_dev_path)
    rm._ioctl(self.fd_dev, NV_ESC_REGISTER_FD, NvRegisterFd(ctl_fd=rm.fd_ctl), "register fd")
    ids = rm.control(rm.client, NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2, GpuIdInfoV2(gpuId=card.gpu_id))
    self.h_device = rm.alloc(rm.client, NV01_DEVICE_0, NV0080Alloc(
      deviceId=ids.deviceInstance, hClientShare=rm.client, vaMode=NV_DEVICE_ALLOCATION_VAMODE_MULTIPLE_VASPACES))
    self.h_subdevice = rm.alloc(self.h_device, NV20_SUBDEVICE_0, NV2080Alloc(subDeviceId=0))
    classes = self._classes()
    gpfifo_class = self._pick(classes, GPFIFO_CLASSES, "GPFIFO channel")
    usermode_class = self._pick(classes, USERMODE_CLASSES, "usermode (doorbell)")
    self.compute_class = self._pick(classes, COMPUTE_CLASSES, "compute")
    self.copy_class = self._pick(classes, COPY_CLASSES, "DMA copy")
    self.arch = COMPUTE_CLASSES[self.compute_class][1]
    self.qmd_layout = qmd_layout_for_arch(self.arch)
    self.max_shared = (228 if self.qmd_layout is not QMD_V3 else 164) << 10
    if renderer is not None and getattr(renderer, "arch", self.arch) != self.arch:
      raise DeviceError(f"this GPU is {self.arch} but the renderer targets {renderer.arch}; use "
                        f"DEV=NV:CUDA:{self.arch} (a cubin runs only on its own architecture)")
    usermode = rm.alloc(self.h_subdevice, usermode_class, None)
    self.doorbell = self._map_object(usermode, 0x10000)
    self.vaspace = rm.alloc(self.h_device, FERMI_VASPACE_A, NVVaspaceAlloc(
      vaBase=0x1000, vaSize=(1 << 49) - 0x1000,
      flags=NV_VASPACE_ALLOCATION_FLAGS_ENABLE_PAGE_FAULTING | NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED))
    gid = rm.control(self.h_subdevice, NV2080_CTRL_CMD_GPU_GET_GID_INFO,
                     GidInfo(flags=NV2080_GID_FLAGS_FORMAT_BINARY, length=16))
    self.uuid = bytes(gid.data[:16])
    rm.uvm(UVM_REGISTER_GPU, UvmRegisterGpu(gpu_uuid=Uuid(*self.uuid), rmCtrlFd=rm.fd_ctl, hClient=rm.client),
           "register GPU")
    rm.uvm(UVM_REGISTER_GPU_VASPACE, UvmRegisterGpuVaspace(gpuUuid=Uuid(*self.uuid), rmCtrlFd=rm.fd_ctl,
                                                           hClient=rm.client, hVaSpace=self.vaspace),
           "register VA space")
    self.channel_group = rm.alloc(self.h_device, KEPLER_CHANNEL_GROUP_A,
                                  NVChannelGroupAlloc(engineType=NV2080_ENGINE_TYPE_GRAPHICS))
    self.ctxshare = rm.alloc(self.channel_group, FERMI_CONTEXT_SHARE_A, NVCtxShareAlloc(
      hVASpace=self.vaspace, flags=NV_CTXSHARE_ALLOCATION_FLAGS_SUBCONTEXT_ASYNC))
    ring_bytes = self.RING_ENTRIES * 8
    self.gpfifo_area = self.alloc_memory(2 * (ring_bytes + 0x1000), host=True)
    self.notifier = self.alloc_memory(0x1000, host=True)
    fifos = {}
    for i, (engine, cls) in enumerate((("compute", self.compute_class), ("copy", self.copy_class))):
      offset = i * (ring_bytes + 0x1000)
      ring, userd = self.gpfifo_area.va_addr + offset, self.gpfifo_area.va_addr + offset + ring_bytes
      params = NVChannelAlloc(hObjectError=self.memory[self.notifier.va_addr][0], gpFifoOffset=ring,
                              gpFifoEntries=self.RING_ENTRIES, hContextShare=self.ctxshare)
      params.hUserdMemory[0] = self.memory[self.gpfifo_area.va_addr][0]
      params.userdOffset[0] = offset + ring_bytes
      channel = rm.alloc(self.channel_group, gpfifo_class, params)
      rm.alloc(channel, cls, None)
      token = rm.control(channel, NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN, WorkSubmitToken()).workSubmitToken
      ctypes.memset(userd, 0, USERD_SIZE)
      fifos[engine] = GPFifo(ring, self.RING_ENTRIES, userd, token, self._ring_doorbell)
    rm.control(self.channel_group, NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, GpfifoSchedule(bEnable=1))
    signals = self.alloc_memory(0x1000, host=True)
    super().__init__(device, NVDriverAllocator(self), renderer, compiler, self._program, NVComputeQueue, NVCopyQueue,
                     signals)
    self._rings(self.alloc_memory(4 << 20, host=True), self.alloc_memory(self.qmd_layout.size * 4096, host=True),
                fifos)
    self._setup_engines()
  # -- bring-up helpers
  def _classes(self) -> set[int]:
    first = self.rm.control(self.h_device, NV0080_CTRL_CMD_GPU_GET_CLASSLIST, ClassList())
    buf = (u32 * first.numClasses)()
    self.rm.control(self.h_device, NV0080_CTRL_CMD_GPU_GET_CLASSLIST,
                    ClassList(numClasses=first.numClasses, classList=ctypes.addressof(buf)))
    return set(buf)
  @staticmethod
  def _pick(classes: set[int], known: dict[int, Any], what: str) -> int:
    for cls in known:
      if cls in classes: return cls
    raise DeviceError(f"this GPU offers no {what} class ember_nv knows ({', '.join(f'{c:#x}' for c in known)}); NV "
                      "supports Ampere, Ada and Hopper: use DEV=CUDA")
  def _map_fd(self) -> int:
    """A fresh /dev/nvidia<N> fd registered with the control fd: each CPU mapping of RM memory goes through its own."""
    fd = self.sys.open(self.fd_dev_path)
    self.rm._ioctl(fd, NV_ESC_REGISTER_FD, NvRegisterFd(ctl_fd=self.rm.fd_ctl), "register fd")
    self.map_fds.append(fd)
    return fd
  def _map_object(self, handle: int, size: int) -> int:
    addr = self.va.alloc(size, 0x10000)
    self.sys.mmap(addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0)
    self.rm.map_to_cpu(self.h_subdevice, handle, self._map_fd(), addr, size)
    return addr
  def _ring_doorbell(self, token: int) -> None:
    ctypes.c_uint32.from_address(self.doorbell + DOORBELL_OFFSET).value = token
  def _setup_engines(self) -> None:
    """Bind the engine classes to their subchannels and give the compute engine its memory windows and local memory
    (scratch), then wait for both channels."""
    per_tpc = LOCAL_BYTES_PER_THREAD * 2048 * 2  # bytes per thread x max threads per SM x SMs per TPC
    self.local_memory = self.alloc_memory(per_tpc * 128, host=False)
    words = method(SUBC_COMPUTE, SET_OBJECT, self.compute_class)
    words += method(SUBC_COMPUTE, SET_SHADER_LOCAL_MEMORY_A, self.local_memory.va_addr >> 32,
                    self.local_memory.va_addr & 0xffffffff)
    words += method(SUBC_COMPUTE, SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A, per_tpc >> 32, per_tpc & 0xffffffff, 0xff)
    words += method(SUBC_COMPUTE, SET_SHADER_LOCAL_MEMORY_WINDOW_A, LOCAL_MEMORY_WINDOW >> 32,
                    LOCAL_MEMORY_WINDOW & 0xffffffff)
    words += method(SUBC_COMPUTE, SET_SHADER_SHARED_MEMORY_WINDOW_A, SHARED_MEMORY_WINDOW >> 32,
                    SHARED_MEMORY_WINDOW & 0xffffffff)
    q = NVComputeQueue()  # the queue classes this device was built with
    q.words[:0] = words
    q.signal(self.timeline_signal, self.next_timeline()).submit(self)
    c = NVCopyQueue()
    c.words[:0] = method(SUBC_COPY, SET_OBJECT, self.copy_class)
    c.signal(self.timeline_signal, self.next_timeline()).submit(self)
  # -- memory
  def alloc_memory(self, size: int, host: bool) -> HCQBuffer:
    """RM memory mapped into the GPU VA space; `host` memory is system memory also mapped at the same CPU address."""
    rm, align = self.rm, (0x1000 if host else 0x200000)
    size = -(-max(size, 1) // align) * align
    va = self.va.alloc(size, align)
    self.sys.mmap(va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0)
    attr = (ATTR_PAGE_4KB | ATTR_LOCATION_PCI | ATTR_NONCONTIGUOUS | ATTR_COHERENCY_CACHED if host else
            ATTR_PAGE_HUGE | ATTR_LOCATION_VIDMEM | ATTR_NONCONTIGUOUS)
    flags = NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE | (0 if host else NVOS32_ALLOC_FLAGS_MAP_NOT_REQUIRED)
    handle = rm.alloc(self.h_device, NV01_MEMORY_SYSTEM if host else NV01_MEMORY_LOCAL_USER, NVMemoryAlloc(
      owner=rm.client, type=NVOS32_TYPE_IMAGE, flags=flags, attr=attr, size=size, alignment=align, limit=size - 1))
    if host: rm.map_to_cpu(self.h_device, handle, self._map_fd(), va, size)
    rm.uvm(UVM_CREATE_EXTERNAL_RANGE, UvmCreateExternalRange(base=va, length=size), "create external range")
    params = UvmMapExternalAllocation(base=va, length=size, gpuAttributesCount=1, rmCtrlFd=rm.fd_ctl,
                                      hClient=rm.client, hMemory=handle)
    params.perGpuAttributes[0].gpuUuid[:] = list(getattr(self, "uuid", bytes(16)))
    params.perGpuAttributes[0].gpuMappingType = UVM_GPU_MAPPING_READ_WRITE_ATOMIC
    rm.uvm(UVM_MAP_EXTERNAL_ALLOCATION, params, "map external allocation")
    self.memory[va] = (handle, size, host, align)
    return HCQBuffer(va, size, handle)
  def free_memory(self, buf: HCQBuffer) -> None:
    handle, size, host, align = self.memory.pop(buf.va_addr)
    self.rm.uvm(UVM_FREE, UvmFree(base=buf.va_addr, length=size), "free")
    self.rm.free(self.h_device, handle)
    self.sys.munmap(buf.va_addr, size)
    self.va.release(buf.va_addr, size, align)
  def _host_alloc(self, size: int) -> HCQBuffer: return self.alloc_memory(size, host=True)
  def _host_free(self, buf: HCQBuffer) -> None: self.free_memory(buf)
  # -- programs
  def _program(self, name: str, lib: bytes) -> NVCubinProgram:
    return NVCubinProgram(self, name, lib, *cubin_param_layout(lib, name))

def cubin_param_layout(image: bytes, name: str) -> tuple[list[tuple[int, int]], int]:
  """The parameter layout NVRTC/ptxas recorded for `name` (EIATTR_KPARAM_INFO in `.nv.info.<name>`): (offset, size) per
  parameter in declaration order, and the size of the parameter block (EIATTR_CBANK_PARAM_SIZE)."""
  nvinfo = read_elf(image, "the NV program (a cubin)").section(f".nv.info.{name}")
  if nvinfo is None: raise CompileError(f"cubin has no .nv.info.{name}")
  data, pos, params, total = nvinfo.data, 0, {}, 0
  while pos + 4 <= len(data):
    fmt, attr, size = data[pos], data[pos + 1], struct.unpack_from("<H", data, pos + 2)[0]
    if fmt == EIFMT_SVAL:
      payload = data[pos + 4:pos + 4 + size]
      if attr == EIATTR_KPARAM_INFO and len(payload) >= 12:  # ordinal u16 @4, offset u16 @6, size in bits 31:18 @8
        index, offset = struct.unpack_from("<HH", payload, 4)
        params[index] = (offset, (struct.unpack_from("<H", payload, 10)[0] >> 2) & 0x3fff)
      pos += 4 + size
    else:
      if fmt == EIFMT_HVAL and attr == EIATTR_CBANK_PARAM_SIZE: total = size
      pos += 4
  layout = [params[i] for i in sorted(params)]
  return layout, total or (max((o + s for o, s in layout), default=0))
