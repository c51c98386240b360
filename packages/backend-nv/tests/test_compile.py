"""Every corpus kernel renders as CUDA C that NVRTC compiles, and as PTX that ptxas assembles, for sm_80 and sm_90."""
from __future__ import annotations
import pytest
from ember.errors import CompileError
from ember.dtype import dtypes
from ember.testing import KERNEL_CORPUS
from ember.uop.ops import AxisType, Ops, UOp
from nv_kernels import corpus_tensor, programs
from ember.testing.hostshim import corpus_programs
from ember_nv.renderer import CUDARenderer, PTXRenderer

ARCHS = ("sm_80", "sm_90")

def _nvrtc_missing() -> str | None:
  from ember_nv.compiler import load_nvrtc
  try: load_nvrtc()
  except CompileError as e: return str(e)
  return None

def _ptxas_missing() -> str | None:
  from ember_nv.compiler import find_ptxas
  return None if find_ptxas() is not None else "ptxas not found (no CUDA toolkit)"

needs_nvrtc = pytest.mark.skipif(_nvrtc_missing() is not None, reason=str(_nvrtc_missing()))
needs_ptxas = pytest.mark.skipif(_ptxas_missing() is not None, reason=str(_ptxas_missing()))

def _elf_arch(cubin: bytes) -> int:
  """The SM number a cubin is built for, from ELF e_flags: bits 8-15 in the CUDA ABI version >= 8 (e_ident[8]) that
  CUDA 13 writes, the low byte before that."""
  assert cubin[:4] == b"\x7fELF", "not an ELF cubin"
  flags = int.from_bytes(cubin[48:52], "little")
  return (flags >> 8) & 0xff if cubin[8] >= 8 else flags & 0xff

@needs_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(KERNEL_CORPUS))
def test_corpus_compiles_with_nvrtc(name: str, arch: str) -> None:
  from ember_nv.compiler import NVRTCCompiler
  renderer, compiler = CUDARenderer(arch), NVRTCCompiler(arch)
  for spec in corpus_programs(name, renderer):
    assert spec.src.startswith(("#include", 'extern "C"', "static")), spec.src
    cubin = compiler.compile_cached(spec.src)
    assert _elf_arch(cubin) == int(arch[3:]), f"{name} {spec.name}: cubin not built for {arch}"

@needs_nvrtc
def test_nvrtc_ptx_output_and_errors_quote_source() -> None:
  from ember_nv.compiler import NVRTCCompiler
  compiler = NVRTCCompiler("sm_90", ptx=True)
  spec = programs(corpus_tensor("elementwise", dtypes.float32), CUDARenderer("sm_90"))[0]
  ptx = compiler.compile(spec.src).decode()
  assert ".target sm_90" in ptx and f".entry {spec.name}" in ptx
  bad = 'extern "C" __global__ void broken(float* data0) {\n  data0[0] = undefined_name;\n}\n'
  with pytest.raises(CompileError, match=r"(?s)undefined_name.*   2   data0\[0\] = undefined_name;"):
    compiler.compile(bad)

def test_bad_arch_is_a_typed_error() -> None:
  with pytest.raises(CompileError, match="sm_XX"):
    CUDARenderer("gfx1100")

@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(KERNEL_CORPUS))
def test_corpus_assembles_with_ptxas(name: str, arch: str) -> None:
  from ember_nv.compiler import PTXCompiler
  renderer, compiler = PTXRenderer(arch), PTXCompiler(arch)
  for spec in corpus_programs(name, renderer):
    assert f".target {arch}" in spec.src and "%tid.x" in spec.src
    assert _elf_arch(compiler.compile_cached(spec.src)) == int(arch[3:])

def _linear(*items: UOp) -> list[UOp]:
  out: dict[UOp, None] = {}
  for item in items:
    for u in item.toposort(): out.setdefault(u, None)
  return list(out)

CAST_DTYPES = (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
               dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.float32, dtypes.float64)

def _all_ops_program() -> list[UOp]:
  """Every cast between the PTX dtypes, and every ALU op on each, in one loop with a gated load and store."""
  n = 16
  rng = UOp.range(n, 0, AxisType.LOOP)
  stores = []
  for i, src in enumerate(CAST_DTYPES):
    inp = UOp(Ops.PARAM, src.ptr(n), arg=i)
    gate = rng.lt(10)
    x = inp.index(rng, gate).load()
    for j, dst in enumerate(CAST_DTYPES):
      out = UOp(Ops.PARAM, dst.ptr(n), arg=len(CAST_DTYPES) * (i + 1) + j)
      stores.append(out.index(rng, gate).store(x.cast(dst)))
    ops = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ]
    if src is dtypes.bool: ops = [Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR]
    if dtypes.is_int(src): ops += [Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR]
    if dtypes.is_float(src): ops += [Ops.FDIV, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.RECIPROCAL, Ops.TRUNC]
    acc = x
    for op in ops:
      if op in (Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.RECIPROCAL, Ops.TRUNC): value = x.alu(op)
      elif op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
        value = x.alu(op, acc).where(acc, x) if src is not dtypes.bool else x.alu(op, acc)
      else: value = x.alu(op, acc)
      acc = value if value.dtype is src else acc
    stores.append(inp.index(rng).store(x.alu(Ops.NEG) if src is not dtypes.bool else acc.alu(Ops.NEG)))
  return _linear(*stores, UOp(Ops.END, src=(rng,)))

@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_every_cast_and_alu_assembles(arch: str) -> None:
  from ember_nv.compiler import PTXCompiler
  src = PTXRenderer(arch).render(_all_ops_program(), "all_ops")
  assert _elf_arch(PTXCompiler(arch).compile(src)) == int(arch[3:])

@needs_nvrtc
def test_cuda_every_cast_and_alu_compiles() -> None:
  from ember_nv.compiler import NVRTCCompiler
  NVRTCCompiler("sm_80").compile(CUDARenderer("sm_80").render(_all_ops_program(), "all_ops"))

@needs_ptxas
def test_ptxas_errors_quote_source() -> None:
  from ember_nv.compiler import PTXCompiler
  with pytest.raises(CompileError, match=r"(?s)ptxas rejected.*not_an_instruction"):
    PTXCompiler("sm_80").compile(".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\n"
                                 "\tnot_an_instruction;\n}\n")

def test_cuda_half_converts_through_float() -> None:
  # cuda_fp16.h converts half unambiguously only to and from float: CUDA's rendering rule (pm_render_cuda) goes before
  # the C-style base's `(float)(x)`, which NVRTC also accepts (so only the text tells them apart)
  n = 4
  half, floats, bools = (UOp(Ops.PARAM, dt.ptr(n), arg=i) for i, dt in enumerate([dtypes.float16, dtypes.float32,
                                                                                   dtypes.bool]))
  rng = UOp.range(n, 0, AxisType.LOOP)
  x = half.index(rng).load()
  prog = _linear(floats.index(rng).store(x.cast(dtypes.float32)), bools.index(rng).store(x.cast(dtypes.bool)),
                 UOp(Ops.END, src=(rng,)))
  src = CUDARenderer("sm_80").render(prog, "k")
  assert "data1[ridx0] = (float)(__half2float(val0));" in src and "data2[ridx0] = (__half2float(val0)!=0.0f);" in src
