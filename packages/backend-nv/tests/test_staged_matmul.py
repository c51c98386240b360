"""Matmuls on mma.sync with A and B staged through shared memory (ember.codegen.tensorcore's staged blocks): small
ones run through the host shim, which checks every shared memory access (a kernel missing either barrier raises); the
4096 x 4096 fp16 one renders for sm_90 as CUDA C and PTX that NVRTC and ptxas compile."""
from __future__ import annotations
import pytest
from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.testing.tensorcore import STAGED_CASES, cases_for, check_removed_barriers_detected, check_staged_case
from ember.uop.ops import Ops
from nv_kernels import SHIM, run_on_shim
from test_compile import _elf_arch, needs_nvrtc, needs_ptxas
from ember_nv.renderer import CUDARenderer, PTXRenderer

@pytest.mark.parametrize("name", cases_for(CUDARenderer("sm_90"), STAGED_CASES))
def test_staged_matmuls_run_like_numpy(name: str) -> None: check_staged_case(name, CUDARenderer("sm_90"), run_on_shim)

def test_a_removed_barrier_is_detected() -> None:
  check_removed_barriers_detected(CUDARenderer("sm_90"), CUDARenderer.barrier, SHIM.run_edited)

def _matmul_4096() -> object:
  a = Tensor.empty(4096, 4096, dtype=dtypes.float16, device="PYTHON")
  b = Tensor.empty(4096, 4096, dtype=dtypes.float16, device="PYTHON")
  return next(it.ast for it in (a @ b).schedule() if it.kind == "kernel")

def _check_staged(spec: object) -> None:
  ops = [u.op for u in spec.uops]  # type: ignore[attr-defined]
  assert ops.count(Ops.DEFINE_LOCAL) == 2 and ops.count(Ops.BARRIER) == 2 and Ops.WMMA in ops
  # 128 x 128 output tiles per block of 4 warps (2 x 2, each 4 x 8 m16n8k16 tiles)
  assert spec.global_size == [1024, 1, 1] and spec.local_size == [128, 1, 1]  # type: ignore[attr-defined]

@needs_nvrtc
def test_fp16_matmul_4096_compiles_with_nvrtc_for_sm_90() -> None:
  from ember_nv.compiler import NVRTCCompiler
  spec = get_program(_matmul_4096(), CUDARenderer("sm_90"))
  _check_staged(spec)
  assert "__shared__ half" in spec.src and "mma.sync.aligned.m16n8k16" in spec.src
  assert _elf_arch(NVRTCCompiler("sm_90").compile(spec.src)) == 90

@needs_ptxas
def test_fp16_matmul_4096_assembles_with_ptxas_for_sm_90() -> None:
  from ember_nv.compiler import PTXCompiler
  spec = get_program(_matmul_4096(), PTXRenderer("sm_90"))
  _check_staged(spec)
  assert ".shared .align 16" in spec.src and "bar.sync 0;" in spec.src and "ld.shared.b16" in spec.src
  assert _elf_arch(PTXCompiler("sm_90").compile(spec.src)) == 90
