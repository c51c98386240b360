"""The MOCK side of the AMD backend: a host build of the HIP-style C kernels, and a software GPU that decodes the PM4
and SDMA packets the AMD queues write into their rings and performs them on host memory.

*The host shim.* `HIPRenderer` output compiled by the system C++ compiler: the workgroup/workitem id builtins read
thread-local globals that a generated launcher sets while it loops over every workgroup and thread of the grid (the
kernels use no LDS and no barriers yet, so running the threads of a workgroup one after another is exact). The
launcher reads the kernel arguments from a kernarg segment laid out like the HSA ABI's (`kernarg_layout`), which is
what the MOCK GPU finds behind COMPUTE_USER_DATA_0/1.

*The MOCK GPU* (`MockAMDGPU`) owns one ring per engine (PM4 compute, SDMA). A doorbell hands it the new write pointer;
it then executes packets from the read pointer on: SET_SH_REG into a register file, DISPATCH_DIRECT launches the
program at COMPUTE_PGM_LO/HI << 8 (on the MOCK the code there is the shim's shared object, whose length the MOCK reads
from its ELF header), RELEASE_MEM writes 32 or 64 bits or the timer, WAIT_REG_MEM and POLL_REGMEM stall the ring until
memory holds the value, ACQUIRE_MEM is a barrier (host memory is coherent), COPY_LINEAR and FENCE copy and write.
"""
from __future__ import annotations
import ctypes
import hashlib
import struct
import time
from ember.plugin import DeviceError, HostKernel, ShimDialect, signature_layout
from ember.plugin import HostShimCompiler as _HostShimCompiler
from ember_amd import queue as q

__all__ = ["SHIM_HEADER", "AMD_SHIM", "kernel_signature", "signature_layout", "shim_launcher", "HostShimCompiler",
           "HostKernel", "elf_image_size", "Ring", "MockAMDGPU"]

SHIM_HEADER = r"""
struct ember_dim3 { unsigned int x, y, z; };
static thread_local ember_dim3 ember_workgroup, ember_workitem;
#define EMBER_LAUNCH_BOUNDS
#define __builtin_amdgcn_workgroup_id_x() ((int)ember_workgroup.x)
#define __builtin_amdgcn_workgroup_id_y() ((int)ember_workgroup.y)
#define __builtin_amdgcn_workgroup_id_z() ((int)ember_workgroup.z)
#define __builtin_amdgcn_workitem_id_x() ((int)ember_workitem.x)
#define __builtin_amdgcn_workitem_id_y() ((int)ember_workitem.y)
#define __builtin_amdgcn_workitem_id_z() ((int)ember_workitem.z)
#define __builtin_amdgcn_s_barrier() ember_sync()
#define __builtin_amdgcn_fence(order, scope) ((void)0)
#define __builtin_amdgcn_ds_bpermute(addr, v) ember_exchange_with((v), \
  (ember_tid & ~(unsigned)(EMBER_WAVE_SIZE - 1)) + (((unsigned)(addr) >> 2) & (unsigned)(EMBER_WAVE_SIZE - 1)))
"""

SHIM_HEADER += r"""
// v_wmma_f32_16x16x16_f16 (RDNA3, wave32) for a wave of host threads (the threaded launcher runs a workgroup's threads
// together). RDNA3 ISA: lane l holds row l % 16 of A and column l % 16 of B, k = 0..15 in order, and lanes 16..31 must
// hold copies of lanes 0..15; D element v of lane l is D[2v + l / 16][l % 16]. Every lane publishes its fragments,
// the workgroup syncs, each lane computes its D elements from lanes 0..15 (exact products, float sums), NaN where a
// lane of the upper half does not hold the copy the ISA requires; a second sync lets the slots be reused.
static float ember_wmma_frag[1024][32];
static inline void __ember_wmma_wmma_f32_16x16x16_f16_w32(float* d, """ + \
  ", ".join([f"_Float16 a{i}" for i in range(16)] + [f"_Float16 b{i}" for i in range(16)]) + r""") {
  const _Float16 ab[32] = {""" + ", ".join([f"a{i}" for i in range(16)] + [f"b{i}" for i in range(16)]) + r"""};
  unsigned lane = ember_tid % 32, base = ember_tid - lane;
  for (unsigned i = 0; i < 32; i++) ember_wmma_frag[ember_tid][i] = (float)ab[i];
  ember_sync();
  bool copies = true;
  for (unsigned l = 16; l < 32; l++)
    for (unsigned i = 0; i < 32; i++)
      copies = copies && ember_wmma_frag[base + l][i] == ember_wmma_frag[base + l - 16][i];
  for (unsigned v = 0; v < 8; v++) {
    unsigned row = 2 * v + lane / 16, col = lane % 16;
    float sum = 0.0f;
    for (unsigned k = 0; k < 16; k++) sum += ember_wmma_frag[base + row][k] * ember_wmma_frag[base + col][16 + k];
    d[v] = copies ? sum : NAN;
  }
  ember_sync();
}
"""

SHIM_HEADER += r"""
// v_mfma_f32_16x16x16_f16 (CDNA, wave64) for a wave of host threads. AMD's CDNA3/4 matrix core guide: lane l holds
// A[l % 16][4(l / 16) + i] and B[4(l / 16) + i][l % 16], i = 0..3; D element i of lane l is D[4(l / 16) + i][l % 16].
// Every lane publishes its fragments, the workgroup syncs, each lane computes its D elements by reading A and B back
// from the lanes that hold them, and a second sync lets the slots be reused.
static float ember_mfma_frag[1024][8];
static inline void __ember_wmma_mfma_f32_16x16x16_f16(float* d, """ + \
  ", ".join([f"_Float16 a{i}" for i in range(4)] + [f"_Float16 b{i}" for i in range(4)]) + r""") {
  const _Float16 ab[8] = {a0, a1, a2, a3, b0, b1, b2, b3};
  unsigned lane = ember_tid % 64, base = ember_tid - lane;
  for (unsigned i = 0; i < 8; i++) ember_mfma_frag[ember_tid][i] = (float)ab[i];
  ember_sync();
  for (unsigned i = 0; i < 4; i++) {
    unsigned row = 4 * (lane / 16) + i, col = lane % 16;
    float sum = 0.0f;
    for (unsigned k = 0; k < 16; k++)
      sum += ember_mfma_frag[base + row + 16 * (k / 4)][k % 4] * ember_mfma_frag[base + col + 16 * (k / 4)][4 + k % 4];
    d[i] = sum;
  }
  ember_sync();
}
"""

AMD_SHIM = ShimDialect("AMD", "HIPRenderer", 'extern "C" __global__ void EMBER_LAUNCH_BOUNDS ', SHIM_HEADER,
                       "ember_workgroup = {bx, by, bz}; ember_workitem = {tx, ty, tz};",
                       sync_markers=("__shared__", "__builtin_amdgcn_s_barrier", "__builtin_amdgcn_ds_bpermute",
                                     "__ember_wmma_"))
"""HIP-style C on the host: the amdgcn workgroup/workitem id builtins read the shim's thread-local globals; the
barrier is the shim's block sync and ds_bpermute its register exchange (lane `addr / 4` of the caller's wave); the
WMMA helper is emulated across the wave's host threads. The
launcher's parameter block is the kernarg segment (`signature_layout`, the layout `renderer.kernarg_layout` computes
from the uops)."""

def kernel_signature(src: str) -> tuple[str, list[str]]:
  """The name and the parameter types of the (single) kernel in HIPRenderer output."""
  return AMD_SHIM.signature(src)

def shim_launcher(src: str) -> str:
  """C++ that runs the kernel over a grid: `ember_launch(kernargs, grid xyz, workgroup xyz)`."""
  return AMD_SHIM.launcher(src)

class HostShimCompiler(_HostShimCompiler):
  """HIP-style C (HIPRenderer output) -> a host shared object through the shim header and g++/clang++."""
  def __init__(self, cxx: str | None = None) -> None: super().__init__(AMD_SHIM, cxx)

def elf_image_size(addr: int) -> int:
  """The length of the ELF file image at `addr` in memory: the end of its section headers or of its last segment."""
  head = ctypes.string_at(addr, 64)
  if head[:4] != b"\x7fELF": raise DeviceError(f"MOCK+AMD: no program at {addr:#x} (COMPUTE_PGM_LO/HI); expected ELF")
  phoff, shoff = struct.unpack_from("<QQ", head, 32)
  phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
  end = shoff + shentsize * shnum
  for i in range(phnum):
    _, _, off, _, _, filesz = struct.unpack_from("<IIQQQQ", ctypes.string_at(addr + phoff + i * phentsize, 48))
    end = max(end, off + filesz)
  return end

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
    image = ctypes.string_at(code, elf_image_size(code))
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
