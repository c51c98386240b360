"""HSA code objects: a small ELF linker from LLVM's amdgcn relocatable object to a loadable code object, and the
parser that reads one back (kernel descriptors, metadata note) for launch. Both read ELF with core's reader
(`ember.plugin.read_elf`).

The linker does what `ld.lld -shared` does for the objects our compiler emits: it lays the allocated sections out in
three PT_LOAD segments (read-only: notes, dynamic symbols, hash, strings, .rodata with the kernel descriptors; then
read+execute: .text; then read+write: .data and .dynamic), applies the AMDGPU relocations, and writes the dynamic
symbol table, a SysV hash, the dynamic section, a PT_NOTE over the AMDGPU metadata note and section headers. Objects
that need something else (an undefined symbol, a GOT relocation) are refused with a CompileError that says so.

Kernel descriptor layout (64 bytes, AMDGPU "Code Object V3+ kernel descriptor"): group segment size @0, private
segment size @4, kernarg size @8, kernel code entry byte offset (relative to the descriptor) @16, COMPUTE_PGM_RSRC3
@44, RSRC1 @48, RSRC2 @52, kernel code properties @56.
"""
from __future__ import annotations
import struct
from dataclasses import dataclass
from typing import Any
from ember.plugin import CompileError, ElfFile, ElfSymbol, read_elf

EM_AMDGPU, ELFOSABI_AMDGPU_HSA, ET_REL, ET_DYN = 224, 64, 1, 3
SHT_NULL, SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_HASH, SHT_DYNAMIC, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = \
  0, 1, 2, 3, 4, 5, 6, 7, 8, 11
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 1, 2, 4
PT_LOAD, PT_DYNAMIC, PT_NOTE, PF_X, PF_W, PF_R = 1, 2, 4, 1, 2, 4
DT_NULL, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT = 0, 4, 5, 6, 10, 11
SHN_UNDEF, SHN_ABS = 0, 0xfff1
STB_LOCAL, STT_SECTION = 0, 3
NT_AMDGPU_METADATA = 32
PAGE = 0x1000
# relocation types (ELF for AMDGPU): S symbol, A addend, P place
R_AMDGPU_ABS32_LO, R_AMDGPU_ABS32_HI, R_AMDGPU_ABS64, R_AMDGPU_REL32, R_AMDGPU_REL64, R_AMDGPU_ABS32 = 1, 2, 3, 4, 5, 6
R_AMDGPU_REL32_LO, R_AMDGPU_REL32_HI, R_AMDGPU_REL16 = 10, 11, 14
KD_SIZE = 64

# ** the linker **

def _align(x: int, a: int) -> int: return -(-x // max(a, 1)) * max(a, 1)

class _StrTab:
  def __init__(self) -> None:
    self.data, self.index = bytearray(b"\0"), {"": 0}
  def add(self, s: str) -> int:
    if s not in self.index:
      self.index[s] = len(self.data)
      self.data += s.encode() + b"\0"
    return self.index[s]

def _sysv_hash(name: str) -> int:
  h = 0
  for c in name.encode():
    h = ((h << 4) + c) & 0xffffffff
    g = h & 0xf0000000
    if g: h ^= g >> 24
    h &= ~g & 0xffffffff
  return h

def _apply(rtype: int, buf: bytearray, at: int, s: int, a: int, p: int) -> None:
  if rtype == R_AMDGPU_ABS64: struct.pack_into("<Q", buf, at, (s + a) & (2 ** 64 - 1))
  elif rtype == R_AMDGPU_REL64: struct.pack_into("<q", buf, at, s + a - p)
  elif rtype in (R_AMDGPU_ABS32, R_AMDGPU_ABS32_LO): struct.pack_into("<I", buf, at, (s + a) & 0xffffffff)
  elif rtype == R_AMDGPU_ABS32_HI: struct.pack_into("<I", buf, at, ((s + a) >> 32) & 0xffffffff)
  elif rtype in (R_AMDGPU_REL32, R_AMDGPU_REL32_LO): struct.pack_into("<I", buf, at, (s + a - p) & 0xffffffff)
  elif rtype == R_AMDGPU_REL32_HI: struct.pack_into("<I", buf, at, ((s + a - p) >> 32) & 0xffffffff)
  elif rtype == R_AMDGPU_REL16: struct.pack_into("<h", buf, at, (s + a - p - 4) // 4)  # branch offset in dwords
  else:
    raise CompileError(f"the ember code object linker does not handle AMDGPU relocation type {rtype}; "
                       "the kernel needs a GOT or a dynamic relocation (install lld and link with ld.lld -shared)")

def link_code_object(obj: bytes) -> bytes:
  """Link one amdgcn relocatable object (ET_REL) into an HSA code object (ET_DYN): see the module docstring."""
  elf = read_elf(obj, "the AMDGPU object")
  if elf.machine != EM_AMDGPU or elf.type != ET_REL:
    raise CompileError(f"link_code_object takes an AMDGPU relocatable object, got e_machine={elf.machine} "
                       f"e_type={elf.type}")
  loadable = (SHT_PROGBITS, SHT_NOBITS, SHT_NOTE)
  alloc = [i for i, s in enumerate(elf.sections) if s.flags & SHF_ALLOC and s.type in loadable and s.size > 0]
  notes = [i for i in alloc if elf.sections[i].type == SHT_NOTE]
  rodata = [i for i in alloc if i not in notes and not elf.sections[i].flags & (SHF_WRITE | SHF_EXECINSTR)]
  text = [i for i in alloc if elf.sections[i].flags & SHF_EXECINSTR]
  data = [i for i in alloc if elf.sections[i].flags & SHF_WRITE and not elf.sections[i].flags & SHF_EXECINSTR]
  symbols = elf.symbols()
  exported = [s for s in symbols if s.bind != STB_LOCAL and s.shndx != SHN_UNDEF and s.type != STT_SECTION]
  undefined = sorted({s.name for s in symbols if s.bind != STB_LOCAL and s.shndx == SHN_UNDEF and s.name})
  if undefined:
    raise CompileError(f"the kernel references undefined symbols {', '.join(undefined)}; an ember code object links "
                       "nothing else (math that needs the device library must be decomposed by codegen)")
  dynstr = _StrTab()
  for s in exported: dynstr.add(s.name)
  phnum = 5
  # ** segment 1 (R): headers, notes, dynsym, hash, dynstr, rodata **
  placed: dict[int, int] = {}  # input section index -> output address (== file offset)
  def lay_out(sections: list[int], cursor: int) -> int:
    """Place `sections` one after another from `cursor`, each at its alignment; returns the end."""
    for i in sections:
      cursor = _align(cursor, elf.sections[i].align)
      placed[i], cursor = cursor, cursor + elf.sections[i].size
    return cursor
  cursor = 64 + 56 * phnum
  cursor = lay_out(notes, cursor)
  dynsym_at = _align(cursor, 8)
  dynsym_size = 24 * (len(exported) + 1)
  hash_at = _align(dynsym_at + dynsym_size, 4)
  nbucket = max(1, len(exported))
  hash_size = 4 * (2 + nbucket + len(exported) + 1)
  dynstr_at = hash_at + hash_size
  cursor = dynstr_at + len(dynstr.data)
  cursor = lay_out(rodata, cursor)
  seg1_end = cursor
  # ** segment 2 (RX): text; segment 3 (RW): data, dynamic **
  cursor = _align(cursor, PAGE)
  seg2_start = cursor
  cursor = lay_out(text, cursor)
  seg2_end = cursor
  cursor = _align(cursor, PAGE)
  seg3_start = cursor
  cursor = lay_out(data, cursor)
  dynamic_at = _align(cursor, 8)
  dynamic_entries = [(DT_HASH, hash_at), (DT_SYMTAB, dynsym_at), (DT_STRTAB, dynstr_at), (DT_STRSZ, len(dynstr.data)),
                     (DT_SYMENT, 24), (DT_NULL, 0)]
  seg3_end = dynamic_at + 16 * len(dynamic_entries)
  image = bytearray(seg3_end)
  for i, at in placed.items():
    if elf.sections[i].type != SHT_NOBITS: image[at:at + elf.sections[i].size] = elf.sections[i].data
  # ** relocations **
  def sym_address(sym: ElfSymbol) -> int:
    if sym.shndx == SHN_ABS: return sym.value
    if sym.shndx not in placed:
      raise CompileError(f"relocation against symbol {sym.name!r} in section {elf.sections[sym.shndx].name}, "
                         "which the code object does not load")
    return placed[sym.shndx] + sym.value
  for rela in (s for s in elf.sections if s.type == SHT_RELA):
    if rela.info not in placed: continue  # relocations of sections that are not loaded (debug info)
    for off in range(0, len(rela.data), 24):
      r_offset, r_info, addend = struct.unpack_from("<QQq", rela.data, off)
      place = placed[rela.info] + r_offset
      _apply(r_info & 0xffffffff, image, place, sym_address(symbols[r_info >> 32]), addend, place)
  # ** dynamic symbols, hash, strings, dynamic section **
  out_sections = [("", SHT_NULL, 0, 0, 0, 0, 0, 0, 0)]  # name type flags addr size link info align entsize
  out_index = {}
  for i in notes + [-1] + rodata + text + data:
    if i == -1:
      base = len(out_sections)
      out_sections += [(".dynsym", SHT_DYNSYM, SHF_ALLOC, dynsym_at, dynsym_size, base + 2, 1, 8, 24),
                       (".hash", SHT_HASH, SHF_ALLOC, hash_at, hash_size, base, 0, 4, 4),
                       (".dynstr", SHT_STRTAB, SHF_ALLOC, dynstr_at, len(dynstr.data), 0, 0, 1, 0)]
      continue
    sec = elf.sections[i]
    out_index[i] = len(out_sections)
    out_sections.append((sec.name, sec.type, sec.flags, placed[i], sec.size, 0, 0, sec.align, sec.entsize))
  dynstr_index = next(k for k, out in enumerate(out_sections) if out[0] == ".dynstr")
  out_sections.append((".dynamic", SHT_DYNAMIC, SHF_ALLOC | SHF_WRITE, dynamic_at, 16 * len(dynamic_entries),
                       dynstr_index, 0, 8, 16))
  for off, sym in zip(range(dynsym_at + 24, dynsym_at + dynsym_size, 24), exported):
    value = sym_address(sym)
    shndx = SHN_ABS if sym.shndx == SHN_ABS else out_index[sym.shndx]
    struct.pack_into("<IBBHQQ", image, off, dynstr.add(sym.name), sym.info, sym.other, shndx, value, sym.size)
  buckets, chains = [0] * nbucket, [0] * (len(exported) + 1)
  for k, sym in enumerate(exported, start=1):
    b = _sysv_hash(sym.name) % nbucket
    chains[k], buckets[b] = buckets[b], k
  struct.pack_into(f"<II{nbucket}I{len(chains)}I", image, hash_at, nbucket, len(chains), *buckets, *chains)
  image[dynstr_at:dynstr_at + len(dynstr.data)] = dynstr.data
  for k, (tag, value) in enumerate(dynamic_entries): struct.pack_into("<qQ", image, dynamic_at + 16 * k, tag, value)
  # ** program headers **
  note_start = min((placed[i] for i in notes), default=0)
  note_end = max((placed[i] + elf.sections[i].size for i in notes), default=0)
  phdrs = [(PT_LOAD, PF_R, 0, 0, seg1_end, seg1_end, PAGE),
           (PT_LOAD, PF_R | PF_X, seg2_start, seg2_start, seg2_end - seg2_start, seg2_end - seg2_start, PAGE),
           (PT_LOAD, PF_R | PF_W, seg3_start, seg3_start, seg3_end - seg3_start, seg3_end - seg3_start, PAGE),
           (PT_DYNAMIC, PF_R | PF_W, dynamic_at, dynamic_at, 16 * len(dynamic_entries), 16 * len(dynamic_entries), 8),
           (PT_NOTE, PF_R, note_start, note_start, note_end - note_start, note_end - note_start, 4)]
  for k, (ptype, pflags, off, vaddr, filesz, memsz, align) in enumerate(phdrs):
    struct.pack_into("<IIQQQQQQ", image, 64 + 56 * k, ptype, pflags, off, vaddr, vaddr, filesz, memsz, align)
  # ** section headers (for tools) **
  shstr = _StrTab()
  names = [shstr.add(s[0]) for s in out_sections] + [shstr.add(".shstrtab")]
  shstr_at = len(image)
  image += shstr.data
  shoff = _align(len(image), 8)
  image += bytes(shoff - len(image))
  for name_at, (_, stype, flags, addr, size, link, info, align, entsize) in zip(names, out_sections):
    offset = addr if stype != SHT_NULL else 0
    image += struct.pack("<IIQQQQIIQQ", name_at, stype, flags, addr, offset, size, link, info, align, entsize)
  image += struct.pack("<IIQQQQIIQQ", names[-1], SHT_STRTAB, 0, 0, shstr_at, len(shstr.data), 0, 0, 1, 0)
  ident = b"\x7fELF" + bytes([2, 1, 1, ELFOSABI_AMDGPU_HSA, elf.abiversion]) + bytes(7)
  struct.pack_into("<16sHHIQQQIHHHHHH", image, 0, ident, ET_DYN, EM_AMDGPU, 1, 0, 64, shoff, elf.flags, 64, 56,
                   phnum, 64, len(out_sections) + 1, len(out_sections))
  return bytes(image)

# ** reading a code object back **

@dataclass(frozen=True)
class KernelDescriptor:
  """The fields of an amdhsa kernel descriptor a launch needs, and the register counts decoded from RSRC1."""
  name: str
  address: int              # of the descriptor, in the code object's virtual address space
  entry: int                # of the kernel's first instruction: address + kernel_code_entry_byte_offset
  group_segment_size: int   # LDS bytes
  private_segment_size: int
  kernarg_size: int
  rsrc1: int
  rsrc2: int
  rsrc3: int
  properties: int
  @property
  def vgpr_granules(self) -> int: return (self.rsrc1 & 0x3f) + 1
  @property
  def sgpr_granules(self) -> int: return ((self.rsrc1 >> 6) & 0xf) + 1
  @property
  def uses_kernarg_ptr(self) -> bool: return bool(self.properties & (1 << 3))
  @property
  def wavefront_size32(self) -> bool: return bool(self.properties & (1 << 10))

@dataclass
class CodeObject:
  """A parsed code object: its ELF, kernel descriptors by kernel name, the decoded metadata note, the gfx target."""
  elf: ElfFile
  kernels: dict[str, KernelDescriptor]
  metadata: dict[str, Any]
  symbols: dict[str, int]
  @property
  def target(self) -> str: return str(self.metadata.get("amdhsa.target", ""))
  def kernel_metadata(self, name: str) -> dict[str, Any]:
    for k in self.metadata.get("amdhsa.kernels", []):
      if k.get(".name") == name: return k
    raise CompileError(f"the code object has no metadata for kernel {name!r}")
  def read(self, vaddr: int, size: int) -> bytes:
    for ptype, _, off, start, filesz, _, _ in self.elf.segments:
      if ptype == PT_LOAD and start <= vaddr and vaddr + size <= start + filesz:
        return self.elf.raw[off + vaddr - start:off + vaddr - start + size]
    raise CompileError(f"address {vaddr:#x} (+{size}) is not in a loaded segment of the code object")

def parse_code_object(lib: bytes) -> CodeObject:
  """Read a linked code object: kernel descriptors (the `.kd` dynamic symbols), the AMDGPU metadata note."""
  elf = read_elf(lib, "the AMD code object")
  if elf.machine != EM_AMDGPU or elf.type != ET_DYN:
    raise CompileError(f"not an AMDGPU code object (e_machine={elf.machine}, e_type={elf.type}; want 224, ET_DYN)")
  symbols = {s.name: s.value for s in elf.symbols(SHT_DYNSYM) if s.name}
  metadata: dict[str, Any] = {}
  for ptype, _, off, _, filesz, _, _ in elf.segments:
    if ptype != PT_NOTE: continue
    pos = off
    while pos < off + filesz:
      namesz, descsz, ntype = struct.unpack_from("<III", lib, pos)
      owner = lib[pos + 12:pos + 12 + namesz].rstrip(b"\0")
      desc_at = pos + 12 + _align(namesz, 4)
      if owner == b"AMDGPU" and ntype == NT_AMDGPU_METADATA: metadata = msgpack_decode(lib[desc_at:desc_at + descsz])
      pos = desc_at + _align(descsz, 4)
  co = CodeObject(elf, {}, metadata, symbols)
  for name, addr in symbols.items():
    if not name.endswith(".kd"): continue
    group, private, kernarg, _, entry_offset = struct.unpack_from("<IIIIq", co.read(addr, KD_SIZE), 0)
    rsrc3, rsrc1, rsrc2, props = struct.unpack_from("<IIIH", co.read(addr, KD_SIZE), 44)
    co.kernels[name[:-3]] = KernelDescriptor(name[:-3], addr, addr + entry_offset, group, private, kernarg, rsrc1,
                                             rsrc2, rsrc3, props)
  return co

# ** msgpack: the subset the AMDGPU metadata note uses **

def msgpack_decode(data: bytes) -> Any:
  value, end = _unpack(data, 0)
  if end != len(data): raise CompileError(f"trailing bytes after the msgpack metadata ({len(data) - end})")
  return value

def _unpack(d: bytes, i: int) -> tuple[Any, int]:
  b = d[i]
  if b <= 0x7f: return b, i + 1
  if b >= 0xe0: return b - 0x100, i + 1
  if 0x80 <= b <= 0x8f: return _map(d, i + 1, b & 0xf)
  if 0x90 <= b <= 0x9f: return _array(d, i + 1, b & 0xf)
  if 0xa0 <= b <= 0xbf: return d[i + 1:i + 1 + (b & 0x1f)].decode(), i + 1 + (b & 0x1f)
  if b == 0xc0: return None, i + 1
  if b in (0xc2, 0xc3): return b == 0xc3, i + 1
  fixed = {0xcc: "B", 0xcd: ">H", 0xce: ">I", 0xcf: ">Q", 0xd0: "b", 0xd1: ">h", 0xd2: ">i", 0xd3: ">q", 0xca: ">f",
           0xcb: ">d"}
  if b in fixed: return struct.unpack_from(fixed[b], d, i + 1)[0], i + 1 + struct.calcsize(fixed[b])
  if b in (0xd9, 0xda, 0xdb, 0xc4, 0xc5, 0xc6):  # str8/16/32, bin8/16/32
    width = {0xd9: 1, 0xda: 2, 0xdb: 4, 0xc4: 1, 0xc5: 2, 0xc6: 4}[b]
    n = int.from_bytes(d[i + 1:i + 1 + width], "big")
    raw = d[i + 1 + width:i + 1 + width + n]
    return (raw.decode() if b >= 0xd9 else raw), i + 1 + width + n
  if b in (0xdc, 0xdd, 0xde, 0xdf):  # array16/32, map16/32
    width = 2 if b in (0xdc, 0xde) else 4
    n = int.from_bytes(d[i + 1:i + 1 + width], "big")
    return (_array if b <= 0xdd else _map)(d, i + 1 + width, n)
  raise CompileError(f"unsupported msgpack type byte {b:#x} in the code object metadata")

def _array(d: bytes, i: int, n: int) -> tuple[list[Any], int]:
  out = []
  for _ in range(n):
    v, i = _unpack(d, i)
    out.append(v)
  return out, i

def _map(d: bytes, i: int, n: int) -> tuple[dict[Any, Any], int]:
  out = {}
  for _ in range(n):
    k, i = _unpack(d, i)
    out[k], i = _unpack(d, i)
  return out, i
