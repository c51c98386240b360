"""Matmuls on simdgroup matrices with A and B staged through threadgroup memory (ember.codegen.tensorcore's staged
blocks): small ones run through the MSL shim, which checks every threadgroup memory access (a kernel missing any of
its barriers raises); the 4096 x 4096 fp16 one renders for Apple GPUs with half simdgroup matrices."""
from __future__ import annotations
import dataclasses
import tempfile
from typing import Callable
import numpy as np
import pytest
from ember import Tensor, dtypes
from ember.codegen import get_program
from ember.testing.tensorcore import STAGED_CASES, cases_for, check_removed_barriers_detected, check_staged_case
from ember.uop.ops import Ops
from ember_metal.renderer import MetalRenderer
import msl_shim

RENDERER = MetalRenderer("apple9")
pytestmark = pytest.mark.skipif(msl_shim.find_cxx() is None, reason="the MSL shim needs g++ or clang++ on PATH")

def _run_edited(t: Tensor, edit: Callable[[str], str]) -> np.ndarray:
  """`t` (one kernel whose inputs are realized) through the MSL shim, its source passed through `edit` first."""
  (item,) = [it for it in t.schedule() if it.kind == "kernel"]
  spec = get_program(item.ast, RENDERER)
  spec = dataclasses.replace(spec, src=edit(spec.src))
  out = np.zeros(item.bufs[0].size, np.dtype(t.dtype.fmt))
  bufs = [out] + [b.numpy().reshape(-1).copy() for b in item.bufs[1:]]
  with tempfile.TemporaryDirectory(prefix="ember_msl_") as tmp: msl_shim.build([spec], RENDERER, tmp).run(0, bufs)
  return out.reshape(tuple(int(s) for s in t.shape))

def _run(t: Tensor) -> np.ndarray: return _run_edited(t, lambda src: src)

@pytest.mark.parametrize("name", cases_for(RENDERER, STAGED_CASES))
def test_staged_matmuls_run_like_numpy(name: str) -> None: check_staged_case(name, RENDERER, _run)

def test_a_removed_barrier_is_detected() -> None:
  """The staging barrier and the first of each simdgroup matrix multiply (its fragments go through threadgroup tiles
  too) are needed; the loop's closing barrier is not here: the multiply's own barriers already order the last
  fragment loads before the next step's staging stores, and the shim, checking, agrees."""
  check_removed_barriers_detected(RENDERER, MetalRenderer.barrier, _run_edited, loop_end=False)
  t, oracle = STAGED_CASES["staged_f16_to_f32_64x64x128"][1]()
  def drop_last(src: str) -> str:
    lines = src.splitlines()
    last = max(i for i, line in enumerate(lines) if line.strip() == MetalRenderer.barrier)
    return "\n".join(lines[:last] + lines[last + 1:]) + "\n"
  np.testing.assert_allclose(_run_edited(t, drop_last), oracle, rtol=1e-5, atol=1e-5)

def test_fp16_matmul_4096_renders_with_staging_and_half_simdgroup_matrices() -> None:
  a = Tensor.empty(4096, 4096, dtype=dtypes.float16, device="PYTHON")
  b = Tensor.empty(4096, 4096, dtype=dtypes.float16, device="PYTHON")
  spec = get_program(next(it.ast for it in (a @ b).schedule() if it.kind == "kernel"), RENDERER)
  ops = [u.op for u in spec.uops]
  assert ops.count(Ops.DEFINE_LOCAL) == 2 and ops.count(Ops.BARRIER) == 2 and Ops.WMMA in ops
  # 64 x 64 output tiles per threadgroup of 4 SIMD-groups (2 x 2, each 4 x 4 8x8 tiles)
  assert spec.global_size == [4096, 1, 1] and spec.local_size == [128, 1, 1]
  for needle in ("threadgroup half temp", "simdgroup_half8x8 tc_a, tc_b;", "threadgroup half __ember_tch_a[256];",
                 "simdgroup_multiply_accumulate(tc_d, tc_a, tc_b, tc_d);"):
    assert needle in spec.src, needle
