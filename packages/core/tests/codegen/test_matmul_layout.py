"""Matmul layouts: weight gradients computed in the layout the optimizer reads, products written `shared * lane` for
the column block, and register blocks only where their lanes are stored contiguously. torch (CPU) is the oracle for
values; the layout checks read the schedule and the linear program.
"""
from __future__ import annotations
import numpy as np
import pytest
import torch
from ember import Tensor, Device
from ember.codegen import full_rewrite
from ember.codegen.opt import Opt, hand_coded_opts, matmul_axes, matmul_opts, output_ranges, shared_operand_first, \
  _const_end
from ember.uop.ops import Ops, UOp
from ember.uop.rewrite import graph_rewrite
from ember.uop.symbolic import symbolic

def _np(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def _kernels(t: Tensor) -> list[UOp]:
  return [graph_rewrite(it.ast, symbolic, name="test: simplify") for it in t.schedule() if it.kind != "copy"]

def _weight_grad(x_np: np.ndarray, w_np: np.ndarray, transposed: bool = False) -> tuple[Tensor, np.ndarray]:
  """W's gradient of relu(x @ W).sum() (or of x @ W.T, a Linear layer's weight), ember's lazy one and torch's."""
  w = Tensor(w_np, requires_grad=True)
  ((Tensor(x_np) @ (w.T if transposed else w)).relu() * 0.5).sum().backward()
  tw = torch.tensor(w_np, requires_grad=True)
  ((torch.tensor(x_np) @ (tw.T if transposed else tw)).relu() * 0.5).sum().backward()
  assert w.grad is not None and tw.grad is not None
  return w.grad, tw.grad.numpy()

# odd and non-divisible sizes, a column count no vector divides, a narrow weight whose sum keeps the (n, k) order
@pytest.mark.parametrize("b,k,n", [(24, 40, 32), (37, 23, 19), (16, 48, 10), (9, 64, 48), (20, 10, 64), (8, 3, 5)])
@pytest.mark.parametrize("transposed", [False, True])
def test_weight_gradients_match_torch(b: int, k: int, n: int, transposed: bool) -> None:
  x_np, w_np = _np(b, k), _np(*((n, k) if transposed else (k, n)), seed=1)
  grad, want = _weight_grad(x_np, w_np, transposed)
  np.testing.assert_allclose(grad.numpy(), want, rtol=1e-4, atol=1e-4)

def test_batched_weight_gradient_matches_torch() -> None:
  a_np, b_np = _np(3, 6, 8), _np(3, 8, 32, seed=1)
  a, b = Tensor(a_np, requires_grad=True), Tensor(b_np, requires_grad=True)
  (a @ b).square().sum().backward()
  ta, tb = torch.tensor(a_np, requires_grad=True), torch.tensor(b_np, requires_grad=True)
  (ta @ tb).square().sum().backward()
  assert a.grad is not None and b.grad is not None and ta.grad is not None and tb.grad is not None
  np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-4, atol=1e-3)

@pytest.mark.parametrize("k,n", [(40, 32), (48, 64), (24, 16)])
def test_weight_gradient_is_stored_by_its_reduction(k: int, n: int) -> None:
  # the sum over the batch runs in W's (k, n) order: the last kernel is the reduction itself, no transposing copy
  grad, _ = _weight_grad(_np(16, k), _np(k, n, seed=1))
  last = _kernels(grad)[-1]
  assert any(u.op is Ops.REDUCE for u in last.toposort())
  assert [_const_end(r) for r in output_ranges(last)][-1] == n  # stored along W's rows

def test_weight_gradient_block_loads_its_lanes_in_one_run() -> None:
  # dW = x.T @ dh: the column lanes read dh, x is shared; the linear program loads dh's 32 lanes one after another
  # (gcc's SLP vectoriser needs that run: the loads interleaved with x's left half the block scalar)
  grad, _ = _weight_grad(_np(12, 40), _np(40, 32, seed=1))
  ast = _kernels(grad)[-1]
  opts = matmul_opts(ast, 16, 2, 8)
  assert opts and opts[0] == Opt("UPCAST_OUTER", opts[0].axis, 32)
  uops = full_rewrite(ast, Device[Device.DEFAULT].renderer, opts)[0]
  loads = [u for u in uops if u.op is Ops.LOAD]
  params = [next(n.arg for n in u.src[0].toposort() if n.op is Ops.PARAM) for u in loads]
  lanes = max(set(params), key=params.count)
  at = [i for i, p in enumerate(params) if p == lanes]
  assert len(at) == 32 and at == list(range(at[0], at[0] + 32))

def test_shared_operand_goes_first_in_each_product() -> None:
  grad, want = _weight_grad(_np(12, 40), _np(40, 32, seed=1))
  ast = _kernels(grad)[-1]
  axes = matmul_axes(ast, 16)
  assert axes is not None
  col = output_ranges(ast)[axes[0]]
  out = shared_operand_first(ast, col)
  moving = {n for n in out.toposort() if col in n.toposort()}
  lane_muls = [m for m in out.toposort() if m.op is Ops.MUL and any(s in moving for s in m.src)
               and not all(s in moving for s in m.src)]
  assert lane_muls and all(m.src[0] not in moving for m in lane_muls)
  np.testing.assert_allclose(grad.numpy(), want, rtol=1e-4, atol=1e-4)

def test_block_needs_a_divisible_span_and_contiguous_stores() -> None:
  # a.T @ b with 10 columns: only the 64 rows are contiguous in an input, and they are stored 10 apart
  a, b = Tensor(_np(24, 64)).realize(), Tensor(_np(24, 10, seed=1)).realize()
  ast = _kernels(a.T @ b)[-1]
  for span in (32, 16):
    axes = matmul_axes(ast, 16, span)
    assert axes is None or _const_end(output_ranges(ast)[axes[0]]) % span == 0
  assert matmul_opts(ast, 16, 2, 8) == []  # the stores would be a row apart: no block
  assert all(o.op != "UPCAST_OUTER" for o in hand_coded_opts(ast, Device[Device.DEFAULT].renderer))
  np.testing.assert_allclose((a.T @ b).numpy(), a.numpy().T @ b.numpy(), rtol=1e-4, atol=1e-4)

class _Simd16:
  """A renderer's codegen settings as hand_coded_opts and plan_packing read them: 16 lanes, packing on."""
  simd_width = 16
  pack_operands = True

def _run_opts(ast: UOp, opts: list[Opt], inputs: dict[int, np.ndarray]) -> np.ndarray:
  from ember.codegen.search import _compile
  from ember.device.base import Buffer
  runner = _compile(ast, Device[Device.DEFAULT].renderer, Device.DEFAULT, opts)
  params = sorted((u for u in runner.spec.uops if u.op is Ops.PARAM), key=lambda u: u.arg)
  bufs = []
  for p in params:
    buf = Buffer(Device.DEFAULT, p.dtype.size, p.dtype.base).ensure_allocated()
    if p.arg in inputs: buf.copyin(np.ascontiguousarray(inputs[p.arg]).data.cast("B"))
    bufs.append(buf)
  runner(bufs, {}, wait=True)
  out = np.empty(bufs[0].size, np.float32)
  bufs[0].copyout(memoryview(out).cast("B"))
  return out

# B contiguous over 4 vectors of columns and small enough for L2: no pack kernel, 4 rows x 64 columns per block where
# the rows do not suit 8 (opt.eight_rows), 8 rows x 32 columns where they do
@pytest.mark.parametrize("m,k,n,mode", [(12, 40, 64, ""), (36, 24, 128, ""), (8, 96, 192, ""), (20, 32, 64, "aT"),
                                        (12, 16, 256, "aT")])
def test_resident_operand_is_read_in_place_by_wide_blocks(m: int, k: int, n: int, mode: str) -> None:
  from ember.codegen.pack import plan_packing
  a_np, b_np = _np(*((k, m) if mode == "aT" else (m, k))), _np(k, n, seed=1)
  a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
  ast = _kernels((a.T if mode == "aT" else a) @ b)[-1]
  assert plan_packing(ast, _Simd16()) is None
  opts = hand_coded_opts(ast, _Simd16())
  assert opts[0].op == "UPCAST_OUTER" and [o.amt for o in opts] == ([32, 8] if m == 8 else [64, 4])
  got = _run_opts(ast, opts, {1: a_np.reshape(-1), 2: b_np.reshape(-1)}).reshape(m, n)
  np.testing.assert_allclose(got, (a_np.T if mode == "aT" else a_np) @ b_np, rtol=1e-4, atol=1e-4)

# B past 256 KB (the L1 TLB's reach) and up to 1 MB: read in place by few rows, packed where 256+ rows share it (its
# rows a page apart every other k step are a stream the prefetcher loses; a packed panel is one). k 300: no power of 2
@pytest.mark.parametrize("m,k,n,packed", [(260, 300, 512, True), (512, 512, 512, True), (100, 300, 512, False),
                                          (252, 256, 320, False), (256, 160, 448, True)])
def test_mid_sized_operand_is_packed_once_many_rows_share_it(m: int, k: int, n: int, packed: bool) -> None:
  from ember.codegen.pack import plan_packing
  a_np, b_np = _np(m, k), _np(k, n, seed=1)
  ast = _kernels(Tensor(a_np).realize() @ Tensor(b_np).realize())[-1]
  plan = plan_packing(ast, _Simd16())
  assert (plan is not None) == packed
  if plan is not None: ast = graph_rewrite(plan.main, symbolic)
  from ember.codegen.opt import TALL_BLOCK_MACS  # 6 x 4 vectors from 2^27 multiply-adds (512^3), else 8 x 2 (100
  # and 252 rows padded to eights)
  want = [64, 6] if m * k * n >= TALL_BLOCK_MACS else [32, 8]
  assert [o.amt for o in hand_coded_opts(ast, _Simd16())] == want
  out = Tensor(a_np).realize() @ Tensor(b_np).realize()
  np.testing.assert_allclose(out.numpy(), a_np @ b_np, rtol=1e-4, atol=1e-4 * k ** 0.5)

@pytest.mark.parametrize("m", [10, 37])
def test_rows_no_wide_block_divides_keep_two_vector_blocks(m: int) -> None:
  # 10 rows in blocks of 4 would run 2 at a time: they keep 2 vectors of columns x 5 rows (37: x 1)
  a_np, b_np = _np(m, 160), _np(160, 128, seed=1)
  ast = _kernels(Tensor(a_np).realize() @ Tensor(b_np).realize())[-1]
  opts = hand_coded_opts(ast, _Simd16())
  assert opts[0].amt == 32 and [o.amt for o in opts[1:]] == ([5] if m == 10 else [])
  got = _run_opts(ast, opts, {1: a_np.reshape(-1), 2: b_np.reshape(-1)}).reshape(m, 128)
  np.testing.assert_allclose(got, a_np @ b_np, rtol=1e-4, atol=1e-4)

def test_operands_past_l2_or_strided_are_still_packed() -> None:
  from ember.codegen.pack import plan_packing
  # 2 MB of B: packed; its 1024 x 64 panels fit WIDE_PANEL, so 4-vector blocks of 4 rows (60 rows: not eights)
  big = _kernels(Tensor.empty(60, 1024) @ Tensor.empty(1024, 512))[-1]
  assert (plan := plan_packing(big, _Simd16())) is not None and plan.size == 1024 * 512
  assert [o.amt for o in hand_coded_opts(graph_rewrite(plan.main, symbolic), _Simd16())] == [64, 4]
  deep = _kernels(Tensor.empty(64, 4096) @ Tensor.empty(4096, 512))[-1]  # 4096 x 64 panels: 2-vector blocks
  assert (plan := plan_packing(deep, _Simd16())) is not None
  assert [o.amt for o in hand_coded_opts(graph_rewrite(plan.main, symbolic), _Simd16())] == [32, 8]
  strided = _kernels(Tensor.empty(64, 128) @ Tensor.empty(256, 128).T)[-1]  # W.T: columns a row apart
  assert plan_packing(strided, _Simd16()) is not None

def test_symbolic_reduction_is_never_resident() -> None:
  # attention's probs @ V over a decode step's context: B's size is symbolic, so no footprint to keep in L2
  from ember import Variable
  from ember.codegen.pack import plan_packing
  a_np, v_np = _np(8, 64), _np(64, 128, seed=1)
  pos = Variable("pos", 1, 64).bind(24)
  out = Tensor(a_np).realize()[:, :pos] @ Tensor(v_np).realize()[:pos]
  ast = _kernels(out)[-1]
  opts = hand_coded_opts(ast, _Simd16())
  assert opts and opts[0].amt == 32 and plan_packing(ast, _Simd16()) is None
  np.testing.assert_allclose(out.numpy(), a_np[:, :24] @ v_np[:24], rtol=1e-4, atol=1e-4)
