"""The PTX renderer against the CUDA renderer by a second route: for the same kernel, the cubin ptxas builds from our
PTX and the cubin NVRTC builds from our CUDA C declare the same entry symbol and the same kernel parameter layout
(`EIATTR_KPARAM_INFO` ordinal/offset/size and `EIATTR_CBANK_PARAM_SIZE`, read with cuobjdump), and that layout is the
one the runtimes pack (`kernel_arg_layout`). This checks the launch interface of PTX output, not its numerics."""
from __future__ import annotations
import functools
import os
import re
import shutil
import subprocess
import pytest
from ember.dtype import dtypes
from ember.testing import KERNEL_CORPUS
from ember.uop.ops import AxisType, Ops, UOp
from nv_kernels import corpus_tensor, programs
from ember_nv.renderer import CUDARenderer, PTXRenderer, kernel_arg_layout

@functools.cache
def find_cuobjdump() -> str | None:
  """cuobjdump from the nvidia-cuda-cuobjdump wheel, the CUDA toolkit, or PATH."""
  from ember_nv.compiler import wheel_files
  if found := sorted(wheel_files("bin", "cuobjdump")): return found[-1]
  for root in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
    if root and os.path.exists(path := os.path.join(root, "bin", "cuobjdump")): return path
  return shutil.which("cuobjdump")

def _missing() -> str | None:
  from ember.errors import CompileError
  from ember_nv.compiler import find_ptxas, load_nvrtc
  if find_cuobjdump() is None: return "cuobjdump not found (pip install nvidia-cuda-cuobjdump, or a CUDA toolkit)"
  if find_ptxas() is None: return "ptxas not found (no CUDA toolkit)"
  try: load_nvrtc()
  except CompileError as e: return str(e)
  return None

pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))

_kparam = re.compile(r"EIATTR_KPARAM_INFO\s+Format:\s+\S+\s+Value:\s+Index\s*:\s*(0x[0-9a-f]+)"
                     r"\s+Ordinal\s*:\s*(0x[0-9a-f]+)\s+Offset\s*:\s*(0x[0-9a-f]+)\s+Size\s*:\s*(0x[0-9a-f]+)")
_param_size = re.compile(r"EIATTR_CBANK_PARAM_SIZE\s+Format:\s+\S+\s+Value:\s+(0x[0-9a-f]+)")
_entry = re.compile(r"\bFUNC\s+GLOBAL\s+\S+\s+ENTRY\s+\S+\s+(\w+)")

def cubin_interface(cubin: bytes, tmp: str) -> tuple[list[str], list[tuple[int, int]], int]:
  """(entry symbols, [(offset, size)] by parameter ordinal, parameter block size) of a single-kernel cubin."""
  path = os.path.join(tmp, "kernel.cubin")
  with open(path, "wb") as f: f.write(cubin)
  out = subprocess.run([str(find_cuobjdump()), "-elf", path], capture_output=True, text=True, timeout=60, check=True)
  params = {int(o, 16): (int(off, 16), int(size, 16)) for _, o, off, size in _kparam.findall(out.stdout)}
  sizes = _param_size.findall(out.stdout)
  assert len(sizes) == 1, f"expected one EIATTR_CBANK_PARAM_SIZE, found {sizes}"
  assert sorted(params) == list(range(len(params))), f"parameter ordinals are not 0..n-1: {sorted(params)}"
  return _entry.findall(out.stdout), [params[i] for i in range(len(params))], int(sizes[0], 16)

def check_same_interface(cuda_src: str, ptx_src: str, name: str, uops: list[UOp], arch: str, tmp: str) -> None:
  from ember_nv.compiler import NVRTCCompiler, PTXCompiler
  from_cuda = cubin_interface(NVRTCCompiler(arch).compile_cached(cuda_src), tmp)
  from_ptx = cubin_interface(PTXCompiler(arch).compile_cached(ptx_src), tmp)
  assert from_cuda[0] == from_ptx[0] == [name], f"entry symbols: NVRTC {from_cuda[0]}, ptxas {from_ptx[0]}"
  assert from_ptx[1:] == from_cuda[1:], f"{name}: parameters from PTX {from_ptx[1:]} != from CUDA C {from_cuda[1:]}"
  layout, size = kernel_arg_layout(uops)
  assert from_cuda[1:] == (layout, size), f"{name}: cubin parameters {from_cuda[1:]} != the runtime's {(layout, size)}"

LAYOUT_DTYPES = (dtypes.float32, dtypes.float16, dtypes.int8, dtypes.int64, dtypes.bool)

@pytest.mark.parametrize("arch", ("sm_80", "sm_90"))
@pytest.mark.parametrize("name", list(KERNEL_CORPUS))
def test_corpus_ptx_and_cuda_cubins_agree(name: str, arch: str, tmp_path) -> None:
  for dt in LAYOUT_DTYPES:
    cuda = programs(corpus_tensor(name, dt), CUDARenderer(arch))
    ptx = programs(corpus_tensor(name, dt), PTXRenderer(arch))
    assert [c.name for c in cuda] == [p.name for p in ptx]
    for c, p in zip(cuda, ptx): check_same_interface(c.src, p.src, c.name, c.uops, arch, str(tmp_path))

def test_variables_after_buffers_keep_their_width_and_alignment(tmp_path) -> None:
  # buffers, then an int32 and an int64 variable: the int64 needs 4 bytes of padding to sit at offset 24
  n, shift = UOp.variable("n", 1, 64), UOp.variable("shift", 0, 1 << 40, dtypes.int64)
  out, inp = UOp(Ops.PARAM, dtypes.float32.ptr(64), arg=0), UOp(Ops.PARAM, dtypes.int8.ptr(64), arg=1)
  rng = UOp.range(n, 0, AxisType.LOOP)
  value = inp.index(rng).load().cast(dtypes.int64).alu(Ops.ADD, shift).cast(dtypes.float32)
  store = out.index(rng).store(value)
  linear: dict[UOp, None] = {}
  for item in (store, UOp(Ops.END, src=(rng,))):
    for u in item.toposort(): linear.setdefault(u, None)
  uops = list(linear)
  assert kernel_arg_layout(uops) == ([(0, 8), (8, 8), (16, 4), (24, 8)], 32)  # the CUDA ABI's layout, by hand
  cuda, ptx = CUDARenderer("sm_80").render(uops, "with_vars"), PTXRenderer("sm_80").render(uops, "with_vars")
  check_same_interface(cuda, ptx, "with_vars", uops, "sm_80", str(tmp_path))
