"""fp16 matmuls on RDNA3's WMMA (ember.codegen.tensorcore): the HIP C runs through the host shim, which emulates
v_wmma_f32_16x16x16_f16 from the ISA's fragment layout (and checks the copies wave32 needs in lanes 16..31), against
numpy and PYTHON; the LLVM IR compiles with llvmlite to a gfx1100 code object that holds the instruction."""
from __future__ import annotations
import numpy as np
import pytest
from ember.tensor import Tensor
from ember.testing import REFERENCE_DEVICE
from ember.testing.tensorcore import cases_for, check_tensor_core_case
from ember.uop.ops import Ops
from amd_kernels import programs, run_on_shim
from test_compile import check_code_object
from ember_amd.compiler import AMDLLVMCompiler, AMDShimCompiler, amdgpu_assembly
from ember_amd.renderer import AMDLLVMRenderer, HIPRenderer, kernarg_layout
from ember.testing.hostshim import ShimRunner

@pytest.mark.parametrize("name", cases_for(HIPRenderer("gfx1100")))
def test_wmma_matmuls_run_like_python(name: str) -> None:
  check_tensor_core_case(name, HIPRenderer("gfx1100"), run_on_shim)

@pytest.mark.parametrize("name", cases_for(HIPRenderer("gfx942")))
def test_mfma_matmuls_run_like_python(name: str) -> None:
  """CDNA's MFMA on a wave64: the shim emulates it from the documented lane layout."""
  runner = ShimRunner(lambda: HIPRenderer("gfx942"), kernarg_layout, AMDShimCompiler)
  check_tensor_core_case(name, HIPRenderer("gfx942"), runner.run)

def _matmul(m: int, k: int, n: int) -> Tensor:
  rng = np.random.default_rng(0)
  a, b = rng.uniform(-1, 1, (m, k)).astype(np.float16), rng.uniform(-1, 1, (k, n)).astype(np.float16)
  return Tensor(a, device=REFERENCE_DEVICE).float() @ Tensor(b, device=REFERENCE_DEVICE).float()

@pytest.mark.parametrize("shape", [(32, 64, 48), (16, 16, 16)])
def test_wmma_compiles_to_a_gfx1100_code_object(shape: tuple[int, int, int]) -> None:
  specs = programs(_matmul(*shape), AMDLLVMRenderer("gfx1100"))
  assert len(specs) == 1 and "@llvm.amdgcn.wmma.f32.16x16x16.f16" in specs[0].src
  assert specs[0].local_size == [32, 1, 1]  # one wave32 per 16x16 tile
  assert specs[0].global_size == [shape[0] * shape[2] // 256, 1, 1]
  assert "v_wmma_f32_16x16x16_f16" in amdgpu_assembly(specs[0].src, "gfx1100")
  check_code_object(AMDLLVMCompiler("gfx1100").compile(specs[0].src), specs[0], "gfx1100")

@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "gfx90a"])
def test_mfma_compiles_to_a_cdna_code_object(arch: str) -> None:
  specs = programs(_matmul(32, 64, 48), AMDLLVMRenderer(arch))
  assert len(specs) == 1 and "@llvm.amdgcn.mfma.f32.16x16x16f16" in specs[0].src
  assert specs[0].local_size == [64, 1, 1]  # one wave64 per 16x16 tile
  assert "v_mfma_f32_16x16x16" in amdgpu_assembly(specs[0].src, arch)
  check_code_object(AMDLLVMCompiler(arch).compile(specs[0].src), specs[0], arch)

@pytest.mark.parametrize("arch", ["gfx1200"])
def test_archs_without_matrix_instructions_keep_the_plain_kernel(arch: str) -> None:
  for renderer in (AMDLLVMRenderer(arch), HIPRenderer(arch)):
    assert renderer.tensor_cores == ()
    assert not any(u.op is Ops.WMMA for spec in programs(_matmul(32, 64, 48), renderer) for u in spec.uops)
