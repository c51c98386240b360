"""Register blocks of packed matmuls (ember.codegen.opt.packed_wide, ember.codegen.pack.WIDE_PANEL): a B packed in
blocks of 4 vectors of columns (its columns in 64s, its K x 64 panels within WIDE_PANEL) runs 6 rows x 4 vectors where
the matmul has 2^27 multiply-adds or more (opt.TALL_BLOCK_MACS; 1030 rows computed as 1032); below that, B is packed
in 2-vector blocks and runs 8 rows x 2 vectors where the rows suit 8 (opt.eight_rows: 64, 100 computed as 104), else
4 rows x 4 vectors where they suit 4 (36, 66 computed as 68), else the rows it has x 2 vectors; deeper panels are
packed in 2-vector blocks. Every class against numpy (float16 against torch), on
both CPU renderers and end to end, eager and JIT'd."""
from __future__ import annotations
import numpy as np
import pytest
import torch
from ember import Tensor, TinyJit, dtypes
from ember.codegen.opt import hand_coded_opts
from ember.codegen.pack import plan_packing, PackPlan, WIDE_PANEL
from ember.uop.rewrite import graph_rewrite
from ember.uop.symbolic import symbolic
from cpu_kernels import RENDERERS, device
from test_kernel_opts import run_kernel
from test_packing import _buffers

def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def _plan(t: Tensor, kind: str = "C") -> PackPlan:
  items = [it for it in t.schedule() if it.kind != "copy"]
  plan = plan_packing(items[-1].ast, device(kind).renderer)
  assert plan is not None
  return plan

def _block(plan: PackPlan, kind: str = "C") -> list[int]:
  """The main kernel's block: [columns, rows] (rows absent where the block has one)."""
  return [o.amt for o in hand_coded_opts(graph_rewrite(plan.main, symbolic), device(kind).renderer)]

# name: (input shapes, ember function, numpy function, the block: [columns, rows])
CASES = {
  "x@W.T, rows in eights": ([(64, 300), (256, 300)], lambda a, b: a @ b.T, lambda a, b: a @ b.T, [32, 8]),
  "x@W.T, rows in fours": ([(36, 300), (256, 300)], lambda a, b: a @ b.T, lambda a, b: a @ b.T, [64, 4]),
  "x@W.T, 66 rows padded to fours": ([(66, 300), (256, 300)], lambda a, b: a @ b.T, lambda a, b: a @ b.T, [64, 4]),
  "x@W.T, 2^27 multiply-adds, rows padded to sixes": ([(1030, 256), (512, 256)], lambda a, b: a @ b.T,
                                                       lambda a, b: a @ b.T, [64, 6]),
  "x@W.T, 50 rows": ([(50, 300), (256, 300)], lambda a, b: a @ b.T, lambda a, b: a @ b.T, [32, 5]),
  "x@W.T, 100 rows padded to eights": ([(100, 300), (96, 300)], lambda a, b: a @ b.T, lambda a, b: a @ b.T, [32, 8]),
  "x@W.T, 37 rows": ([(37, 129), (192, 129)], lambda a, b: a @ b.T, lambda a, b: a @ b.T, [32]),
  "a.T@b, B past L2": ([(300, 64), (300, 1024)], lambda a, b: a.T @ b, lambda a, b: a.T @ b, [32, 8]),
  "batched q@k.T": ([(2, 64, 96), (2, 128, 96)], lambda q, k: q @ k.transpose(-1, -2),
                    lambda q, k: q @ k.transpose(0, 2, 1), [32, 8]),
  "(x@W.T + bias) * 0.5": ([(48, 200), (320, 200), (320,)], lambda a, b, c: (a @ b.T + c) * 0.5,
                           lambda a, b, c: (a @ b.T + c) * 0.5, [32, 8]),
  "x@W.T, panel past WIDE_PANEL": ([(64, WIDE_PANEL // 64 + 3), (128, WIDE_PANEL // 64 + 3)], lambda a, b: a @ b.T,
                                   lambda a, b: a @ b.T, [32, 8]),
}

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("name", list(CASES))
def test_packed_blocks_match_numpy(kind: str, name: str) -> None:
  shapes, fn, ref, block = CASES[name]
  arrays = [_rand(*s, seed=i) for i, s in enumerate(shapes)]
  out = fn(*[Tensor(x) for x in arrays])
  plan = _plan(out, kind)
  assert _block(plan, kind) == block
  inputs = _buffers(out)
  packed = run_kernel(kind, plan.pack, {1: inputs[plan.src_slot]})[0]
  want = ref(*arrays)
  got = run_kernel(kind, plan.main, {**inputs, plan.scratch_slot: packed})[0]
  np.testing.assert_allclose(got.reshape(out.shape), want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)  # end to end on the default renderer

def test_panel_of_wide_panel_elements_is_packed_in_four_vectors() -> None:
  # K x 64 == WIDE_PANEL exactly: 4-vector blocks; one more row of K: 2-vector blocks over a 32-column packing (36
  # rows: 4 at a time in 4-vector blocks, 6 in 2-vector ones)
  k = WIDE_PANEL // 64
  at = _plan(Tensor(_rand(36, k)) @ Tensor(_rand(128, k)).T)
  past = _plan(Tensor(_rand(36, k + 1)) @ Tensor(_rand(128, k + 1)).T)
  assert _block(at) == [64, 4] and _block(past) == [32, 6]
  # the packed copy is (column block, k, column within the block)
  w = _rand(128, 40)
  plan = _plan(Tensor(_rand(36, 40)) @ Tensor(w).T)
  packed = run_kernel("C", plan.pack, {1: w.reshape(-1)})[0]
  np.testing.assert_array_equal(packed.reshape(2, 40, 64), w.T.reshape(40, 2, 64).transpose(1, 0, 2))

def test_float16_packed_blocks_match_torch() -> None:
  x, w = _rand(64, 200), _rand(192, 200, seed=1)
  out = Tensor(x).cast(dtypes.float16) @ Tensor(w).cast(dtypes.float16).T
  assert _block(_plan(out)) == [32, 8]
  want = (torch.tensor(x).half().float() @ torch.tensor(w).half().float().T).half().float().numpy()
  np.testing.assert_allclose(out.float().numpy(), want, rtol=1e-2, atol=1e-1)

def test_packed_blocks_under_jit_with_new_inputs() -> None:
  step = TinyJit(lambda x, w: x @ w.T + 1.0)
  for i in range(4):
    x, w = _rand(96, 136, seed=10 + i), _rand(128, 136, seed=20 + i)
    np.testing.assert_allclose(step(Tensor(x), Tensor(w)).numpy(), x @ w.T + 1.0, rtol=1e-4, atol=1e-4)
