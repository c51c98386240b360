"""fp16/bf16 matmuls on mma.sync (ember.codegen.tensorcore): the CUDA C runs through the host shim, which emulates the
instruction from the PTX ISA's fragment layouts, against numpy and PYTHON; NVRTC compiles it and ptxas assembles the
PTX renderer's for sm_80 and sm_90."""
from __future__ import annotations
import re
import numpy as np
import pytest
from ember.dtype import dtypes
from ember.tensor import Tensor
from ember.testing import REFERENCE_DEVICE
from ember.testing.tensorcore import TC_CASES, cases_for, check_tensor_core_case
from ember.uop.ops import Ops
from nv_kernels import programs, run_on_shim
from test_compile import ARCHS, _elf_arch, needs_nvrtc, needs_ptxas
from ember_nv.renderer import CUDARenderer, PTXRenderer

@pytest.mark.parametrize("name", cases_for(CUDARenderer()))
def test_tensor_core_matmuls_run_like_python(name: str) -> None:
  check_tensor_core_case(name, CUDARenderer(), run_on_shim)

def test_cuda_takes_fp16_and_bf16_and_ptx_fp16() -> None:
  assert set(cases_for(CUDARenderer())) == {n for n, (dt, _) in TC_CASES.items() if dt is not dtypes.float32}
  assert "bf16_to_f32_32x32x16" not in cases_for(PTXRenderer())  # PTXRenderer has no bfloat16

def _matmul(m: int, k: int, n: int, dt=np.float16) -> Tensor:
  rng = np.random.default_rng(0)
  a, b = rng.uniform(-1, 1, (m, k)).astype(dt), rng.uniform(-1, 1, (k, n)).astype(dt)
  return Tensor(a, device=REFERENCE_DEVICE) @ Tensor(b, device=REFERENCE_DEVICE)

def _has_wmma(t: Tensor, renderer) -> bool:
  return any(u.op is Ops.WMMA for spec in programs(t, renderer) for u in spec.uops)

@pytest.mark.parametrize("shape", [(30, 64, 48), (32, 60, 48), (32, 64, 44)])  # M, K or N does not divide
def test_shapes_that_do_not_divide_keep_the_plain_kernel(shape: tuple[int, int, int]) -> None:
  assert not _has_wmma(_matmul(*shape), CUDARenderer())
  assert _has_wmma(_matmul(32, 64, 48), CUDARenderer())

def test_float32_and_sm75_keep_the_plain_kernel() -> None:
  assert not _has_wmma(_matmul(32, 64, 48, np.float32), CUDARenderer())
  assert CUDARenderer("sm_75").tensor_cores == () and not _has_wmma(_matmul(32, 64, 48), CUDARenderer("sm_75"))

@needs_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_mma_compiles_with_nvrtc(arch: str, dt) -> None:
  from ember_nv.compiler import NVRTCCompiler
  t = (Tensor(np.ones((32, 64), np.float16), device=REFERENCE_DEVICE).cast(dt) @
       Tensor(np.ones((64, 48), np.float16), device=REFERENCE_DEVICE).cast(dt))
  specs = [s for s in programs(t, CUDARenderer(arch)) if any(u.op is Ops.WMMA for u in s.uops)]
  assert len(specs) == 1
  ptx = NVRTCCompiler(arch, ptx=True).compile(specs[0].src).decode()
  name = dt.name.replace("float16", "f16").replace("bfloat16", "bf16")
  assert re.search(rf"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.{name}\.{name}\.f32", ptx)
  assert _elf_arch(NVRTCCompiler(arch).compile(specs[0].src)) == int(arch[3:])

@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_mma_assembles_with_ptxas(arch: str) -> None:
  from ember_nv.compiler import PTXCompiler
  specs = programs(_matmul(32, 64, 48), PTXRenderer(arch))
  assert len(specs) == 1 and "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in specs[0].src
  assert _elf_arch(PTXCompiler(arch).compile(specs[0].src)) == int(arch[3:])

def test_transposed_product_runs_like_numpy() -> None:
  """24 x 48 output: M = 24 does not fit mma's 16, so the kernel computes D^T = B^T A^T (M = 48, N = 24)."""
  rng = np.random.default_rng(3)
  a, b = rng.uniform(-1, 1, (24, 64)).astype(np.float16), rng.uniform(-1, 1, (64, 48)).astype(np.float16)
  t = Tensor(a, device=REFERENCE_DEVICE).float() @ Tensor(b, device=REFERENCE_DEVICE).float()
  assert _has_wmma(t, CUDARenderer())
  np.testing.assert_allclose(run_on_shim(t), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)
