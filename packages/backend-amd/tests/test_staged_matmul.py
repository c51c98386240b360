"""Matmuls on MFMA (gfx942) and WMMA (gfx1100) with A and B staged through LDS (ember.codegen.tensorcore's staged
blocks): small ones run through the host shim, which checks every shared memory access (a kernel missing either
barrier raises); the 4096 x 4096 fp16 one renders for gfx942 as LLVM IR that llvmlite compiles to a code object."""
from __future__ import annotations
import pytest
from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.testing.hostshim import ShimRunner
from ember.testing.tensorcore import STAGED_CASES, cases_for, check_removed_barriers_detected, check_staged_case
from ember.uop.ops import Ops
from test_compile import check_code_object
from ember_amd.compiler import AMDLLVMCompiler, AMDShimCompiler, amdgpu_assembly
from ember_amd.renderer import AMDLLVMRenderer, HIPRenderer, kernarg_layout

ARCHS = ("gfx942", "gfx1100")

def _runner(arch: str) -> ShimRunner: return ShimRunner(lambda: HIPRenderer(arch), kernarg_layout, AMDShimCompiler)

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(STAGED_CASES))
def test_staged_matmuls_run_like_numpy(name: str, arch: str) -> None:
  if name not in cases_for(HIPRenderer(arch), STAGED_CASES): pytest.skip(f"no tensor core of {arch} takes {name}")
  check_staged_case(name, HIPRenderer(arch), _runner(arch).run)

def test_a_removed_barrier_is_detected() -> None:
  check_removed_barriers_detected(HIPRenderer("gfx942"), HIPRenderer.barrier, _runner("gfx942").run_edited)

def test_fp16_matmul_4096_compiles_for_gfx942() -> None:
  a = Tensor.empty(4096, 4096, dtype=dtypes.float16, device="PYTHON")
  b = Tensor.empty(4096, 4096, dtype=dtypes.float16, device="PYTHON")
  spec = get_program(next(it.ast for it in (a @ b).schedule() if it.kind == "kernel"), AMDLLVMRenderer("gfx942"))
  ops = [u.op for u in spec.uops]
  assert ops.count(Ops.DEFINE_LOCAL) == 2 and ops.count(Ops.BARRIER) == 2 and Ops.WMMA in ops
  # 128 x 128 output tiles per workgroup of 4 waves (2 x 2, each 4 x 4 16x16x16 tiles)
  assert spec.global_size == [1024, 1, 1] and spec.local_size == [256, 1, 1]
  assert "addrspace(3)" in spec.src and "@llvm.amdgcn.mfma.f32.16x16x16f16" in spec.src
  asm = amdgpu_assembly(spec.src, "gfx942")
  assert "v_mfma_f32_16x16x16" in asm and "ds_read" in asm and "s_barrier" in asm
  check_code_object(AMDLLVMCompiler("gfx942").compile(spec.src), spec, "gfx942")
