"""Group reductions (ember.codegen.group): when they apply, and the shape of the program they produce.

These run no GPU code: the NV, AMD and Metal backends execute the grouped kernels through their host shims (block
threads as host threads) against the PYTHON device (`GROUP_CASES` in ember.testing.hostshim).
"""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor, dtypes
from ember.codegen import full_rewrite
from ember.codegen.group import group_reduce, group_size
from ember.renderer.cstyle import CStyleLanguage
from ember.uop.ops import Ops, UOp, AxisType

class GPUC(CStyleLanguage):
  """A C-style GPU target as the NV/AMD/Metal renderers declare themselves (no backend needed)."""
  has_local = True
  has_shared = True
  global_max = (2 ** 31 - 1, 65535, 65535)
  local_max = (1024, 1024, 64)
  shared_max = 48 * 1024
  shared_prefix = "__shared__ "
  barrier = "__syncthreads();"
  code_for_workitem = {"g": lambda axis: f"blockIdx.{axis}", "l": lambda axis: f"threadIdx.{axis}"}
  def __init__(self, warp: int = 32) -> None:
    self.warp_size = warp
    self.shuffle_dtypes = frozenset({dtypes.float32, dtypes.int32}) if warp else frozenset()
  def code_for_shuffle(self, x: str, mask: int, dtype) -> str: return f"__shfl_xor_sync(~0u, {x}, {mask})"

def _ast(t: Tensor) -> UOp:
  items = [it for it in t.schedule() if it.kind == "kernel"]
  return items[-1].ast

def _x(*shape: int, dt=np.float32) -> Tensor:
  return Tensor(np.random.default_rng(0).standard_normal(shape).astype(dt), device="PYTHON")

def test_applies_to_long_reductions_with_few_outputs() -> None:
  assert group_size(_ast(_x(8, 1024).sum(1)), GPUC()) == 256
  assert group_size(_ast(_x(4, 576).max(1)), GPUC()) == 64  # the largest power of two dividing the reduction
  assert group_size(_ast(_x(8, 1024).sum(1)), CStyleLanguage()) == 0  # no shared memory: one thread per output

@pytest.mark.parametrize("shape", [(8, 100), (8, 250), (4, 264)])  # short, no power of two >= 32 divides, 8 | 264
def test_does_not_apply_to_short_or_awkward_reductions(shape: tuple[int, int]) -> None:
  assert group_size(_ast(_x(*shape).sum(1)), GPUC()) == 0

def test_does_not_apply_to_many_outputs_of_short_reductions() -> None:
  # a 512x512 matmul: 262144 outputs of 512-long reductions stay one thread per output
  assert group_size(_ast(_x(512, 512) @ _x(512, 512)), GPUC()) == 0

def test_nested_reduction_is_left_alone() -> None:
  out = UOp(Ops.PARAM, dtypes.float32.ptr(4), arg=0)
  inp = UOp(Ops.PARAM, dtypes.float32.ptr(4 * 512 * 512), arg=1)
  i, j, k = UOp.range(4, 0, AxisType.GLOBAL), UOp.range(512, 1, AxisType.REDUCE), UOp.range(512, 2, AxisType.REDUCE)
  inner = UOp(Ops.REDUCE, dtypes.float32, (inp.index(i * 262144 + j * 512 + k).load(), k), Ops.MAX)  # varies with j
  outer = UOp(Ops.REDUCE, dtypes.float32, (inner, j), Ops.ADD)
  assert group_size(UOp(Ops.SINK, dtypes.void, (out.index(i).store(outer),)), GPUC()) == 0

@pytest.mark.parametrize("warp", [32, 0])
def test_program_shape(warp: int) -> None:
  renderer = GPUC(warp)
  uops, gsize, lsize = full_rewrite(_ast(_x(8, 1024).sum(1)), renderer)
  assert gsize == [8, 1, 1] and lsize == [256, 1, 1]  # a block per output
  ops = [u.op for u in uops]
  locals_ = [u for u in uops if u.op is Ops.DEFINE_LOCAL]
  # with shuffles only one partial per warp goes through shared memory
  assert len(locals_) == 1 and locals_[0].dtype.size == (256 // warp if warp else 256)
  assert ops.index(Ops.DEFINE_LOCAL) < ops.index(Ops.SPECIAL)  # declared at the top of the kernel
  assert ops.count(Ops.SHUFFLE_XOR) == (5 if warp else 0)  # log2(32) butterfly steps
  bar = ops.index(Ops.BARRIER)
  local_stores = [i for i, u in enumerate(uops) if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_LOCAL]
  local_loads = [i for i, u in enumerate(uops) if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_LOCAL]
  assert local_stores and local_loads and max(local_stores) < bar < min(local_loads)
  # every thread loops over 1024 / 256 = 4 elements
  assert any(u.op is Ops.RANGE and u.src[0].op is Ops.CONST and u.src[0].arg == 4 for u in uops)
  out_store = [u for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM]
  assert len(out_store) == 1 and len(out_store[0].src[0].src) == 3  # gated: thread 0 of the block writes
  src = renderer.render(uops, "k")
  assert "__syncthreads();" in src and "__shared__ float temp" in src

def test_dependent_reductions_get_one_buffer_each() -> None:
  # out[i] = sum_k exp(x[i,k] - max_j x[i,j]): the sum's loop reads the max, which is hoisted before it
  out, inp = UOp(Ops.PARAM, dtypes.float32.ptr(4), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(4 * 512), arg=1)
  i, j, k = UOp.range(4, 0, AxisType.GLOBAL), UOp.range(512, 1, AxisType.REDUCE), UOp.range(512, 2, AxisType.REDUCE)
  mx = UOp(Ops.REDUCE, dtypes.float32, (inp.index(i * 512 + j).load(), j), Ops.MAX)
  diff = inp.index(i * 512 + k).load() - mx
  total = UOp(Ops.REDUCE, dtypes.float32, (UOp(Ops.EXP2, dtypes.float32, (diff,)), k), Ops.ADD)
  ast = UOp(Ops.SINK, dtypes.void, (out.index(i).store(total),))
  assert group_reduce(ast, GPUC()) is not None
  uops, _, _ = full_rewrite(ast, GPUC())
  assert sum(u.op is Ops.BARRIER for u in uops) == 2
  names = [u.arg for u in uops if u.op is Ops.DEFINE_LOCAL]
  assert len(names) == len(set(names)) == 2
  # the max is complete (its barrier and fold) before the sum's loop reads it
  ops = [u.op for u in uops]
  first_bar = ops.index(Ops.BARRIER)
  sum_loop = [n for n, u in enumerate(uops) if u.op is Ops.RANGE and u.arg[0] == 2]
  assert sum_loop and first_bar < sum_loop[0]
