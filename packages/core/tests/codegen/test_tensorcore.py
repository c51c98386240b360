"""Tensor cores (ember.codegen.tensorcore): the fragment layouts, when a kernel is matched, and the program it becomes.

These run no GPU code: the NV and AMD backends execute the rewritten kernels through their host shims, which emulate
the instructions from the vendors' documented layouts, against numpy and the PYTHON device (ember.testing.tensorcore).
"""
from __future__ import annotations
from collections import Counter
import numpy as np
import pytest
from ember import Tensor, dtypes
from ember.codegen import full_rewrite, pm_lower_alu
from ember.codegen.opt import pm_recombine_divmod
from ember.codegen.opt import KernelOptError
from ember.codegen.tensorcore import TENSOR_CORES, apply_tensor_cores, match_matmul, tensor_core
from ember.errors import CompileError
from ember.helpers import Context
from ember.renderer.cstyle import CStyleLanguage
from ember.uop.ops import Ops, UOp, AxisType
from ember.uop.rewrite import graph_rewrite
from ember.uop.spec import SpecError, type_verify
from ember.uop.symbolic import symbolic

class TCGPU(CStyleLanguage):
  """A C-style GPU target that declares one matrix instruction, rendered as a call to a helper."""
  has_local = True
  has_shared = True
  global_max = (2 ** 31 - 1, 65535, 65535)
  local_max = (1024, 1024, 64)
  code_for_workitem = {"g": lambda axis: f"blockIdx.{axis}", "l": lambda axis: f"threadIdx.{axis}"}
  code_for_wmma = {name: (f"mma_{name}", f"void mma_{name}(float* d, ...);") for name in TENSOR_CORES}
  def __init__(self, *names: str) -> None: self.tensor_cores = names

MMA, BF16, RDNA3 = "mma_m16n8k16_f16_f32", "mma_m16n8k16_bf16_f32", "wmma_f32_16x16x16_f16_w32"

def _ast(t: Tensor) -> UOp:
  """The kernel AST with its index math simplified, as full_rewrite hands it to the GPU passes."""
  items = [it for it in t.schedule() if it.kind == "kernel"]
  assert len(items) == 1
  return graph_rewrite(items[0].ast, symbolic + pm_lower_alu + pm_recombine_divmod)

def _x(*shape: int, dt=np.float16) -> Tensor:
  return Tensor(np.random.default_rng(0).uniform(-1, 1, shape).astype(dt), device="PYTHON")

# ** layouts **

@pytest.mark.parametrize("name", list(TENSOR_CORES))
def test_layouts_cover_each_matrix_evenly(name: str) -> None:
  """Every element of A, B and D is held by the same number of lanes (once, or twice where RDNA3 wants copies)."""
  tc = TENSOR_CORES[name]
  M, N, K = tc.dims
  for layout, count, (rows, cols) in ((tc.a, tc.elements[0], (M, K)), (tc.b, tc.elements[1], (K, N)),
                                      (tc.c, tc.elements[2], (M, N))):
    held = Counter(layout(lane, i) for lane in range(tc.threads) for i in range(count))
    assert set(held) == {(r, c) for r in range(rows) for c in range(cols)}
    assert len(set(held.values())) == 1 and held[(0, 0)] * rows * cols == tc.threads * count
  assert Counter(tc.c(lane, i) for lane in range(tc.threads) for i in range(tc.elements[2]))[(0, 0)] == 1

def test_mma_layout_matches_the_ptx_isa() -> None:
  """PTX ISA m16n8k16 (.f16/.bf16): groupID = lane >> 2, threadID_in_group = lane % 4; lane 5 is group 1, thread 1."""
  tc = TENSOR_CORES[MMA]
  assert [tc.a(5, i) for i in range(8)] == [(1, 2), (1, 3), (9, 2), (9, 3), (1, 10), (1, 11), (9, 10), (9, 11)]
  assert [tc.b(5, i) for i in range(4)] == [(2, 1), (3, 1), (10, 1), (11, 1)]
  assert [tc.c(5, i) for i in range(4)] == [(1, 2), (1, 3), (9, 2), (9, 3)]
  assert tc.a(31, 7) == (15, 15) and tc.b(31, 3) == (15, 7) and tc.c(31, 3) == (15, 7)

def test_rdna3_layout_matches_the_isa() -> None:
  """RDNA3 wave32 WMMA: lane l holds row l%16 of A and column l%16 of B (all k); D element v is D[2v + l//16][l%16]."""
  tc = TENSOR_CORES[RDNA3]
  assert [tc.a(21, i) for i in range(16)] == [(5, k) for k in range(16)]
  assert [tc.b(21, i) for i in range(16)] == [(k, 5) for k in range(16)]
  assert [tc.c(21, v) for v in range(8)] == [(2 * v + 1, 5) for v in range(8)]

def test_unknown_tensor_core_is_a_compile_error() -> None:
  with pytest.raises(CompileError, match="unknown tensor core 'mma_m8n8k4'"):
    tensor_core("mma_m8n8k4")
  with pytest.raises(CompileError, match="unknown tensor core"):
    apply_tensor_cores(_ast(_x(32, 64) @ _x(64, 48)), TCGPU("mma_m8n8k4"))

# ** matching **

def test_matches_half_products_and_half_inputs_cast_first() -> None:
  tc = TENSOR_CORES[MMA]
  for t in (_x(32, 64) @ _x(64, 48), _x(32, 64).float() @ _x(64, 48).float()):
    mm = match_matmul(_ast(t), tc)
    assert mm is not None and mm.m.src[0].arg == 32 and mm.n.src[0].arg == 48 and mm.k.src[0].arg == 64

@pytest.mark.parametrize("make", [
  lambda: _x(32, 64, dt=np.float32) @ _x(64, 48, dt=np.float32),  # not the input dtype
  lambda: _x(24, 64) @ _x(64, 40),  # neither M nor N divides 16 (so the transposed product does not fit either)
  lambda: _x(32, 40) @ _x(40, 48),  # K does not divide 16
  lambda: _x(32, 64) @ _x(64, 12),  # N does not divide 8
  lambda: _x(32, 64).float().sum(1),  # a reduction, but no product
  lambda: _x(32, 64).max(1),  # not a sum
], ids=["float32", "m", "k", "n", "sum", "max"])
def test_does_not_match(make) -> None:
  assert match_matmul(_ast(make()), TENSOR_CORES[MMA]) is None

def test_transposed_product_when_only_it_fits() -> None:
  # 24 x 48 output: M = 24 does not divide 16, but D^T = B^T A^T (M = 48, N = 24) fits mma
  mm = match_matmul(_ast(_x(24, 64) @ _x(64, 48)), TENSOR_CORES[MMA])
  assert mm is not None and mm.m.src[0].arg == 48 and mm.n.src[0].arg == 24

def test_first_fitting_instruction_wins_and_none_without_tensor_cores() -> None:
  ast = _ast(_x(32, 64) @ _x(64, 48))  # N = 48 fits mma's 8, RDNA3 WMMA's 16 too
  assert apply_tensor_cores(ast, TCGPU(BF16, MMA))[1:] == ([2 * 6, 1, 1], [32, 1, 1])  # bf16 does not fit: mma does
  assert apply_tensor_cores(ast, TCGPU(RDNA3, MMA))[1:] == ([2 * 3, 1, 1], [32, 1, 1])
  assert apply_tensor_cores(ast, TCGPU()) is None
  assert apply_tensor_cores(_ast(_x(32, 64) @ _x(64, 24)), TCGPU(RDNA3)) is None  # 24 is no multiple of 16

# ** the program **

@pytest.mark.parametrize("name", [MMA, RDNA3])
def test_program_shape(name: str) -> None:
  tc = TENSOR_CORES[name]
  M, N, K = tc.dims
  renderer = TCGPU(name)
  uops, gsize, lsize = full_rewrite(_ast(_x(2, 32, 64) @ _x(2, 64, 48)), renderer)
  assert gsize == [2 * (32 // M) * (48 // N), 1, 1] and lsize == [tc.threads, 1, 1]  # a warp per output tile
  specials = {u.arg: u.src[0].arg for u in uops if u.op is Ops.SPECIAL}
  assert specials == {"gidx0": gsize[0], "lidx0": tc.threads}
  ranges = [u for u in uops if u.op is Ops.RANGE]
  assert len(ranges) == 1 and ranges[0].src[0].arg == 64 // K and ranges[0].arg[1] is AxisType.REDUCE
  wmmas = [u for u in uops if u.op is Ops.WMMA]
  assert [u.arg for u in wmmas] == [(name, i, tc.elements[2]) for i in range(tc.elements[2])]
  assert all(len(u.src) == tc.elements[0] + tc.elements[1] and u.src == wmmas[0].src for u in wmmas)
  loads = [u for u in uops if u.op is Ops.LOAD]
  # each k step loads this lane's fragment elements, no more (RDNA3 lanes read whole rows and columns)
  assert len(loads) == tc.elements[0] + tc.elements[1]
  assert len([u for u in uops if u.op is Ops.STORE]) == tc.elements[2]
  src = renderer.render(uops, "k")
  assert src.count(f"mma_{name}(wmma0, ") == 1 and f"wmma0[{tc.elements[2] - 1}]" in src
  type_verify(uops, "tensor core program")

def test_noopt_keeps_the_plain_kernel() -> None:
  with Context(NOOPT=1):
    uops, _, lsize = full_rewrite(_ast(_x(32, 64) @ _x(64, 48)), TCGPU(MMA))
  assert not any(u.op is Ops.WMMA for u in uops)

def test_spec_rejects_malformed_wmma() -> None:
  a = UOp.const(dtypes.float16, 1.0)
  type_verify([UOp(Ops.WMMA, dtypes.float32, (a, a), (MMA, 3, 4))])
  for bad in (UOp(Ops.WMMA, dtypes.float32, (a, a), (MMA, 4, 4)), UOp(Ops.WMMA, dtypes.int32, (a, a), (MMA, 0, 4)),
              UOp(Ops.WMMA, dtypes.float32, (a,), (MMA, 0, 4)), UOp(Ops.WMMA, dtypes.float32, (a, a), MMA)):
    with pytest.raises(SpecError):
      type_verify([bad])

# ** staged through shared memory **

@pytest.mark.parametrize("name", [MMA, RDNA3])
def test_staged_program_shape(name: str) -> None:
  """A 128 x 128 x 64 matmul: one block of 4 warps (2 x 2, each 4 instruction tiles of M rows x 64 columns), A and B in
  shared memory every 32 k; inside the k loop the staging stores, a barrier, the fragment loads from shared memory, the
  instructions, and a closing barrier right before the loop ends."""
  tc = TENSOR_CORES[name]
  M, N, K = tc.dims
  uops, gsize, lsize = full_rewrite(_ast(_x(128, 64) @ _x(64, 128)), TCGPU(name))
  assert gsize == [1, 1, 1] and lsize == [4 * tc.threads, 1, 1]
  tiles = [u for u in uops if u.op is Ops.DEFINE_LOCAL]
  assert sorted(u.dtype.size for u in tiles) == [128 * 32, 128 * 32]
  pos = {u: i for i, u in enumerate(uops)}
  (loop,) = [u for u in uops if u.op is Ops.RANGE]
  assert loop.src[0].arg == 64 // 32
  end = next(i for i, u in enumerate(uops) if u.op is Ops.END and u.src[0] is loop)
  barriers = [pos[u] for u in uops if u.op is Ops.BARRIER]
  assert len(barriers) == 2 and pos[loop] < barriers[0] and barriers[1] == end - 1
  staged = [u for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_LOCAL]
  assert len(staged) == 2 * 128 * 32 // (4 * tc.threads) and all(pos[loop] < pos[s] < barriers[0] for s in staged)
  frags = [u for u in uops if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_LOCAL]
  warp_tiles = (4 * 4 * M // N) if name == MMA else 16  # tiles per warp: 4 along M, 4*M/N along N
  assert len({u.arg for u in uops if u.op is Ops.WMMA}) == tc.elements[2]
  assert all(barriers[0] < pos[f] < barriers[1] for f in frags) and warp_tiles * tc.elements[2] == \
    len([u for u in uops if u.op is Ops.DEFINE_ACC])
  type_verify(uops, "staged tensor core program")

def test_staging_tiles_are_chosen_or_refused() -> None:
  ast = _ast(_x(64, 64) @ _x(64, 64))
  # the largest block of STAGED_TILES that divides 64 x 64: 4 warps of 2 x 2 tiles (64 x 64 on m16n8k16)
  assert apply_tensor_cores(ast, TCGPU(MMA))[1:] == ([1, 1, 1], [128, 1, 1])
  assert apply_tensor_cores(ast, TCGPU(MMA), (1, 0))[1:] == ([4 * 8, 1, 1], [32, 1, 1])  # the plain kernel
  with pytest.raises(KernelOptError, match="does not divide"): apply_tensor_cores(ast, TCGPU(MMA), (4, 4))
  with pytest.raises(KernelOptError, match="no tensor core"): apply_tensor_cores(ast, TCGPU(), (1, 2))
