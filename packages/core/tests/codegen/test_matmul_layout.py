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
