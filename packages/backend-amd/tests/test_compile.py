"""Every corpus kernel renders as AMDGPU LLVM IR that llvmlite compiles for gfx1100, gfx942 and gfx950, links into an
HSA code object, and parses back with a kernel descriptor that agrees with the kernel and with the metadata note."""
from __future__ import annotations
import os
import re
import shutil
import subprocess
import tempfile
import pytest
from ember.dtype import dtypes
from ember.errors import CompileError
from ember.uop.ops import Ops
from ember.testing import KERNEL_CORPUS
from amd_kernels import corpus_tensor, programs
from ember.testing.hostshim import corpus_programs
from ember_amd.compiler import AMDLLVMCompiler, amdgpu_assembly, compile_amdgpu_object
from ember.plugin import read_elf
from ember_amd.elf import link_code_object, parse_code_object
from ember_amd.renderer import AMDLLVMRenderer, HIPRenderer, kernarg_layout

ARCHS = ("gfx1100", "gfx942", "gfx950")
# from the AMDGPU ELF spec (LLVM AMDGPUUsage): EF_AMDGPU_MACH per target, and the wave size of each
MACH = {"gfx1100": 0x041, "gfx90a": 0x03f, "gfx942": 0x04c, "gfx950": 0x04f}
WAVE32 = {"gfx1100": True, "gfx90a": False, "gfx942": False, "gfx950": False}
VGPR_GRANULE = 8  # gfx10+ in wave32 and gfx90a+ (unified VGPR/AGPR file) allocate VGPRs in blocks of 8

def check_code_object(lib: bytes, spec, arch: str) -> None:
  co = parse_code_object(lib)
  assert co.target == f"amdgcn-amd-amdhsa--{arch}"
  assert co.elf.flags & 0xff == MACH[arch]
  kd = co.kernels[spec.name]
  assert kd.entry == co.symbols[spec.name] and kd.entry % 256 == 0, "kernel_code_entry_byte_offset is mislinked"
  meta = co.kernel_metadata(spec.name)
  layout, size = kernarg_layout(spec.uops)
  explicit = [(a[".offset"], a[".size"]) for a in meta[".args"] if not a[".value_kind"].startswith("hidden")]
  assert explicit == layout
  assert kd.kernarg_size == meta[".kernarg_segment_size"] >= size
  lds = sum(u.dtype.size * u.dtype.base.itemsize for u in spec.uops if u.op is Ops.DEFINE_LOCAL)
  assert kd.group_segment_size == meta[".group_segment_fixed_size"] and (kd.group_segment_size >= lds)
  assert (kd.group_segment_size == 0) == (lds == 0)  # LDS only where a group reduction declares it
  assert kd.private_segment_size == meta[".private_segment_fixed_size"]
  assert kd.uses_kernarg_ptr == bool(layout)
  assert kd.wavefront_size32 == WAVE32[arch] and meta[".wavefront_size"] == (32 if WAVE32[arch] else 64)
  vgprs = max(1, meta[".vgpr_count"] + meta.get(".agpr_count", 0))
  assert (kd.vgpr_granules - 1) * VGPR_GRANULE < vgprs <= kd.vgpr_granules * VGPR_GRANULE
  assert co.read(kd.entry, 4) != bytes(4)  # the kernel's first instruction is there

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(KERNEL_CORPUS))
def test_corpus_compiles_to_code_objects(name: str, arch: str) -> None:
  renderer, compiler = AMDLLVMRenderer(arch), AMDLLVMCompiler(arch)
  for spec in corpus_programs(name, renderer):
    assert "amdgpu_kernel" in spec.src and "@llvm.amdgcn.workitem.id.x()" in spec.src
    check_code_object(compiler.compile(spec.src), spec, arch)

def test_metadata_note_decodes_like_llvm_yaml() -> None:
  # the msgpack note against the YAML that LLVM prints for the same kernel in its assembly
  spec = programs(corpus_tensor("matmul", dtypes.float64), AMDLLVMRenderer("gfx942"))[0]
  meta = parse_code_object(AMDLLVMCompiler("gfx942").compile(spec.src)).kernel_metadata(spec.name)
  yaml = amdgpu_assembly(spec.src, "gfx942").split(".amdgpu_metadata")[1]
  for key in (".sgpr_count", ".vgpr_count", ".kernarg_segment_size", ".max_flat_workgroup_size"):
    assert meta[key] == int(re.search(rf"^\s+{re.escape(key)}:\s+(\d+)$", yaml, re.M).group(1)), key
  assert meta[".symbol"] == f"{spec.name}.kd"

@pytest.mark.skipif(shutil.which("ld.lld") is None, reason="ld.lld not installed (the package links without it)")
@pytest.mark.parametrize("arch", ARCHS)
def test_linker_agrees_with_lld(arch: str) -> None:
  spec = programs(corpus_tensor("reduce", dtypes.float32), AMDLLVMRenderer(arch))[0]
  obj = bytearray(compile_amdgpu_object(spec.src, arch))
  with tempfile.TemporaryDirectory() as tmp:
    inp, out = os.path.join(tmp, "k.o"), os.path.join(tmp, "k.hsaco")
    with open(inp, "wb") as f: f.write(obj)
    proc = subprocess.run(["ld.lld", "-shared", inp, "-o", out], capture_output=True, text=True)
    if "unknown abi version" in proc.stderr:
      obj[8] = 2  # an old lld knows code objects up to v4 only; the layout it links does not depend on the version
      with open(inp, "wb") as f: f.write(obj)
      proc = subprocess.run(["ld.lld", "-shared", inp, "-o", out], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with open(out, "rb") as f: theirs = parse_code_object(f.read())
  ours = parse_code_object(link_code_object(bytes(obj)))
  a, b = ours.kernels[spec.name], theirs.kernels[spec.name]
  assert (a.group_segment_size, a.kernarg_size, a.rsrc1, a.rsrc2, a.rsrc3, a.properties) == \
         (b.group_segment_size, b.kernarg_size, b.rsrc1, b.rsrc2, b.rsrc3, b.properties)
  text = read_elf(ours.elf.raw).section(".text")
  assert text is not None
  assert ours.read(a.entry, text.size) == theirs.read(b.entry, text.size)
  assert ours.metadata == theirs.metadata

def test_undefined_symbols_and_bad_archs_are_typed_errors() -> None:
  src = AMDLLVMRenderer("gfx1100").render(programs(corpus_tensor("elementwise", dtypes.float32),
                                                   AMDLLVMRenderer("gfx1100"))[0].uops, "k")
  src = src.replace("ret void", "call void @ember_missing()\n  ret void") + "declare void @ember_missing()\n"
  with pytest.raises(CompileError, match="undefined symbols ember_missing"):
    AMDLLVMCompiler("gfx1100").compile(src)
  with pytest.raises(CompileError, match="LLVM rejected"):
    AMDLLVMCompiler("gfx1100").compile("this is not IR")
  for cls in (AMDLLVMRenderer, HIPRenderer):
    with pytest.raises(CompileError, match="gfx942"):
      cls("sm_90")
