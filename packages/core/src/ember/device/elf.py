"""ELF64 little-endian files, read: the one ELF reader the backends share (re-exported by `ember.plugin`).

Three kinds of binary that backends handle are ELF: host-shim shared objects (a MOCK GPU finds one in its memory at the
program address a launch names, and needs its length before it can load it), NVIDIA cubins (the NV driver runtime
reads their sections to launch a kernel) and AMD code objects (the AMD linker reads LLVM's relocatable objects, the
runtime reads the linked code object). `read_elf` parses a whole file: header fields, section headers with their bytes,
program headers, symbol tables. `elf_image_size` measures an image that sits in memory from its headers alone.

Layouts (the System V gABI, ELF-64 Object File Format): the file header is 64 bytes, `e_phoff` at 32, `e_shoff` at
40, `e_flags` at 48, then `e_phentsize`, `e_phnum`, `e_shentsize`, `e_shnum`, `e_shstrndx` as 16-bit fields from 54;
a section header is `name type flags addr offset size link info addralign entsize` (`<IIQQQQIIQQ`), a program header
`type flags offset vaddr paddr filesz memsz align` (`<IIQQQQQQ`), a symbol `name info other shndx value size`
(`<IBBHQQ`).
"""
from __future__ import annotations
import ctypes
import struct
from dataclasses import dataclass, field
from typing import NamedTuple
from ember.errors import CompileError, DeviceError

ELF_MAGIC = b"\x7fELF"
ELFCLASS64, ELFDATA2LSB = 2, 1
EHDR_SIZE = 64
SHT_SYMTAB, SHT_NOBITS = 2, 8

@dataclass
class ElfSection:
  """One section header and the section's bytes (empty for SHT_NOBITS)."""
  name: str
  type: int
  flags: int
  addr: int
  offset: int
  size: int
  link: int
  info: int
  align: int
  entsize: int
  data: bytes

@dataclass
class ElfSymbol:
  """One entry of a symbol table."""
  name: str
  value: int
  size: int
  info: int
  other: int
  shndx: int
  @property
  def bind(self) -> int: return self.info >> 4
  @property
  def type(self) -> int: return self.info & 0xf

class ElfSegment(NamedTuple):
  """One program header (p_paddr, which no loader here uses, left out)."""
  type: int
  flags: int
  offset: int
  vaddr: int
  filesz: int
  memsz: int
  align: int

@dataclass
class ElfFile:
  """The header fields, sections and segments of an ELF64 little-endian file."""
  raw: bytes
  type: int
  machine: int
  flags: int
  osabi: int
  abiversion: int
  sections: list[ElfSection]
  segments: list[ElfSegment] = field(default_factory=list)
  def section(self, name: str) -> ElfSection | None:
    """The first section called `name`, or None."""
    return next((s for s in self.sections if s.name == name), None)
  def symbols(self, kind: int = SHT_SYMTAB) -> list[ElfSymbol]:
    """The entries of the first symbol table of section type `kind` (SHT_SYMTAB, or SHT_DYNSYM = 11)."""
    table = next((s for s in self.sections if s.type == kind), None)
    if table is None: return []
    names = self.sections[table.link].data
    out = []
    for at in range(0, len(table.data), 24):
      name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", table.data, at)
      out.append(ElfSymbol(_cstr(names, name), value, size, info, other, shndx))
    return out

def _cstr(table: bytes, offset: int) -> str: return table[offset:table.index(b"\0", offset)].decode()

def _check_ident(ident: bytes, what: str, error: type[CompileError] | type[DeviceError]) -> None:
  if len(ident) < 6 or ident[:4] != ELF_MAGIC:
    raise error(f"{what} is not an ELF file (its first bytes are {bytes(ident[:4])!r}, not {ELF_MAGIC!r})")
  if ident[4] != ELFCLASS64 or ident[5] != ELFDATA2LSB:
    raise error(f"{what} is not a 64-bit little-endian ELF file (EI_CLASS {ident[4]}, EI_DATA {ident[5]}); "
                "ember reads ELF64 little-endian only")

def read_elf(raw: bytes, what: str = "the binary") -> ElfFile:
  """Parse an ELF64 little-endian file. A file that is not one, or whose tables run past its end, is a CompileError
  naming `what` (the binary's role, e.g. "the cubin")."""
  _check_ident(raw[:6], what, CompileError)
  if len(raw) < EHDR_SIZE: raise CompileError(f"{what} is {len(raw)} bytes, shorter than an ELF64 header")
  etype, machine, _, _, phoff, shoff, flags, _, phentsize, phnum, shentsize, shnum, shstrndx = \
    struct.unpack_from("<HHIQQQIHHHHHH", raw, 16)
  try:
    sections = []
    for i in range(shnum):
      name, stype, sflags, addr, offset, size, link, info, align, entsize = \
        struct.unpack_from("<IIQQQQIIQQ", raw, shoff + i * shentsize)
      data = b"" if stype == SHT_NOBITS else raw[offset:offset + size]
      sections.append(ElfSection(str(name), stype, sflags, addr, offset, size, link, info, align, entsize, data))
    if shnum:
      names = sections[shstrndx].data
      for s in sections: s.name = _cstr(names, int(s.name))
    segments = []
    for i in range(phnum):
      ptype, pflags, offset, vaddr, _, filesz, memsz, align = struct.unpack_from("<IIQQQQQQ", raw,
                                                                                 phoff + i * phentsize)
      segments.append(ElfSegment(ptype, pflags, offset, vaddr, filesz, memsz, align))
  except (struct.error, IndexError, ValueError) as e:
    raise CompileError(f"{what} is a truncated or corrupt ELF file ({len(raw)} bytes; {e})") from e
  return ElfFile(raw, etype, machine, flags, raw[7], raw[8], sections, segments)

def elf_image_size(addr: int, what: str) -> int:
  """The file size of the ELF64 image at host address `addr`: the end of its section header table or of its last
  segment, whichever is further (the file's own length, for what linkers write). Reads only the headers, so the
  caller need not know the length first. `what` names the address for the DeviceError when no ELF64 image is there
  (e.g. "MOCK+NV: the QMD's program address")."""
  header = ctypes.string_at(addr, EHDR_SIZE)
  _check_ident(header, f"{what} ({addr:#x})", DeviceError)
  phoff, shoff = struct.unpack_from("<QQ", header, 32)
  phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 54)
  end = shoff + shentsize * shnum
  for i in range(phnum):
    offset, _, _, filesz = struct.unpack_from("<QQQQ", ctypes.string_at(addr + phoff + i * phentsize + 8, 32))
    end = max(end, offset + filesz)
  return end

__all__ = ["ElfFile", "ElfSection", "ElfSegment", "ElfSymbol", "read_elf", "elf_image_size"]
