"""The shared ELF reader (ember.device.elf), checked against what the system toolchain wrote and `readelf` reads."""
from __future__ import annotations
import ctypes
import re
import shutil
import subprocess
from pathlib import Path
import pytest
from ember.device.elf import ElfSegment, elf_image_size, read_elf
from ember.errors import CompileError, DeviceError

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
READELF = shutil.which("readelf")
pytestmark = pytest.mark.skipif(CC is None or READELF is None, reason="needs a C compiler and readelf (binutils)")

SOURCE = "int ember_elf_data[64] = {1};\nint ember_elf_add(int a, int b) { return a + b + ember_elf_data[a]; }\n" \
         "static int ember_elf_local(int a) { return a * 3; }\n" \
         "int ember_elf_mul(int a) { return ember_elf_local(a); }\n"

@pytest.fixture(scope="module", params=["shared", "object"])
def binary(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
  """A shared object (ET_DYN, with segments) and a relocatable object (ET_REL, sections only) built by the system C
  compiler."""
  tmp = tmp_path_factory.mktemp(f"elf_{request.param}")
  (tmp / "k.c").write_text(SOURCE)
  out = tmp / ("k.so" if request.param == "shared" else "k.o")
  flags = ["-shared", "-fPIC"] if request.param == "shared" else ["-c"]
  assert CC is not None
  subprocess.run([CC, "-O1", *flags, str(tmp / "k.c"), "-o", str(out)], check=True, capture_output=True, timeout=120)
  return out

def _readelf(*args: str) -> str:
  assert READELF is not None
  return subprocess.run([READELF, "-W", *args], check=True, capture_output=True, text=True, timeout=60).stdout

def test_image_size_is_the_file_length(binary: Path) -> None:
  raw = binary.read_bytes()
  mem = ctypes.create_string_buffer(raw + bytes(4096))  # what follows the image in memory must not count
  assert elf_image_size(ctypes.addressof(mem), "the test image") == len(raw)

def test_sections_match_readelf(binary: Path) -> None:
  elf = read_elf(binary.read_bytes())
  # [Nr] Name Type Address Off Size ...; section 0 has no name (the pattern reads its type as the name): skipped
  pattern = r"^\s*\[\s*(\d+)\]\s+(\S+)\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)"
  rows = re.findall(pattern, _readelf("-S", str(binary)), re.M)[1:]
  assert len(rows) == len(elf.sections) - 1 > 5
  for index, name, offset, size in rows:
    section = elf.sections[int(index)]
    assert (section.name, section.offset, section.size) == (name, int(offset, 16), int(size, 16))
  text = elf.section(".text")
  assert text is not None and text.data == binary.read_bytes()[text.offset:text.offset + text.size]

def test_segments_match_readelf(binary: Path) -> None:
  elf = read_elf(binary.read_bytes())
  rows = re.findall(r"^\s+[A-Z_]+\s+0x([0-9a-f]+) 0x([0-9a-f]+) 0x[0-9a-f]+ 0x([0-9a-f]+) 0x([0-9a-f]+) ",
                    _readelf("-l", str(binary)), re.M)
  assert [(s.offset, s.vaddr, s.filesz, s.memsz) for s in elf.segments] == \
         [tuple(int(x, 16) for x in row) for row in rows]
  assert all(isinstance(s, ElfSegment) for s in elf.segments)

def test_symbols_match_readelf(binary: Path) -> None:
  elf = read_elf(binary.read_bytes())
  # Num: Value Size Type Bind Vis Ndx Name, of .symtab
  symtab = _readelf("-s", str(binary)).split("'.symtab'")[1]
  rows = re.findall(r"^\s*\d+: ([0-9a-f]+)\s+(\d+) (\w+)\s+(\w+)\s+\w+\s+\S+\s+(\S+)$", symtab, re.M)
  ours = {s.name: (s.value, s.size) for s in elf.symbols() if s.name}
  # readelf prints a section symbol (st_name 0) with its section's name
  theirs = {name: (int(value, 16), int(size)) for value, size, kind, _, name in rows if kind != "SECTION"}
  assert ours == theirs and {"ember_elf_add", "ember_elf_mul", "ember_elf_data"} <= set(ours)

@pytest.mark.parametrize("raw, message", [
  (b"MZ\x90\x00" + bytes(60), "the cubin is not an ELF file"),
  (b"\x7fELF\x01\x01\x01" + bytes(57), "the cubin is not a 64-bit little-endian ELF file"),
  (b"\x7fELF\x02\x02\x01" + bytes(57), "the cubin is not a 64-bit little-endian ELF file"),
  (b"\x7fELF\x02\x01\x01", "shorter than an ELF64 header"),
])
def test_not_elf64_is_a_compile_error(raw: bytes, message: str) -> None:
  with pytest.raises(CompileError, match=message) as info: read_elf(raw, "the cubin")
  assert isinstance(info.value, RuntimeError)

def test_truncated_file_is_a_compile_error(binary: Path) -> None:
  raw = binary.read_bytes()
  with pytest.raises(CompileError, match="truncated or corrupt"): read_elf(raw[:len(raw) // 2])

def test_image_size_of_no_image_names_the_address() -> None:
  mem = ctypes.create_string_buffer(b"\x00" * 64)
  with pytest.raises(DeviceError, match=r"MOCK\+X: the program address \(0x[0-9a-f]+\) is not an ELF file") as info:
    elf_image_size(ctypes.addressof(mem), "MOCK+X: the program address")
  assert isinstance(info.value, RuntimeError)
