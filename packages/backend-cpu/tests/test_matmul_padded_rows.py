"""Matmul rows padded to the register block (ember.codegen.opt: UPCAST_PADDED, block_rows, wide_rows): a block of 6
(or 8) rows over row counts they do not divide computes the extra rows from clamped loads and stores none of them.
Every case against numpy (or torch for gradients), on both CPU renderers where kernels run alone, end to end on the
default one: row counts just past and just short of a multiple, a.T @ b, batched, a bias after the product, one
thread and two, the gradients of a layer whose rows are padded, and a convolution whose pixels take blocks of 7."""
from __future__ import annotations
import numpy as np
import pytest
import torch
from ember import Tensor, TinyJit
from ember.codegen.opt import KernelOptError, Opt, apply_opt, block_rows, matmul_axes, output_ranges, hand_coded_opts
from ember.plugin import Ops
from cpu_kernels import RENDERERS, device
from test_kernel_opts import kernel_of, run_kernel

def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def test_block_rows_pads_only_where_it_is_cheap() -> None:
  assert block_rows(1024, 6) == 6 and block_rows(66, 6) == 6 and block_rows(784, 6) == 6
  assert block_rows(32, 6) == 4 and block_rows(10, 6) == 5 and block_rows(7, 6) == 1 and block_rows(50, 8) == 5
  assert block_rows(100, 8) == 8 and block_rows(16, 8) == 8 and block_rows(9, 1) == 1

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("rows,amt", [(10, 6), (13, 6), (64, 6), (70, 8), (5, 6)])
def test_padded_row_block_matches_numpy(kind: str, rows: int, amt: int) -> None:
  a, b = _rand(rows, 40), _rand(40, 64, seed=1)
  ast = kernel_of(Tensor(a) @ Tensor(b))
  col, row = matmul_axes(ast, 16) or (None, None)
  assert col is not None and row is not None
  rngs = output_ranges(ast)
  opts = [Opt("UPCAST_OUTER", rngs[col].arg[0], 64), Opt("UPCAST_PADDED", rngs[row].arg[0] + 1, amt)]
  for threads in (True, False):
    got = run_kernel(kind, ast, {1: a.reshape(-1), 2: b.reshape(-1)}, opts, threads)[0]
    np.testing.assert_allclose(got.reshape(rows, 64), a @ b, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("kind", RENDERERS)
def test_padded_rows_of_an_elementwise_epilogue(kind: str) -> None:
  # the product's bias moves with the rows too: the extra rows read it clamped and store nothing
  a, b, c = _rand(11, 24), _rand(24, 32, seed=1), _rand(11, 32, seed=2)
  ast = kernel_of((Tensor(a) @ Tensor(b) + Tensor(c)) * 0.5)
  col, row = matmul_axes(ast, 16) or (None, None)
  assert col is not None and row is not None
  rngs = output_ranges(ast)
  opts = [Opt("UPCAST_OUTER", rngs[col].arg[0], 32), Opt("UPCAST_PADDED", rngs[row].arg[0] + 1, 6)]
  got = run_kernel(kind, ast, {1: a.reshape(-1), 2: b.reshape(-1), 3: c.reshape(-1)}, opts)[0]
  np.testing.assert_allclose(got.reshape(11, 32), (a @ b + c) * 0.5, rtol=1e-4, atol=1e-4)

def test_upcast_padded_of_a_dividing_range_is_a_plain_upcast() -> None:
  ast = kernel_of(Tensor(_rand(12, 8)) @ Tensor(_rand(8, 16, seed=1)))
  rng = output_ranges(ast)[0]
  assert apply_opt(ast, Opt("UPCAST_PADDED", rng.arg[0], 6)) is apply_opt(ast, Opt("UPCAST", rng.arg[0], 6))
  with pytest.raises(KernelOptError): apply_opt(ast, Opt("UPCAST_PADDED", 99, 6))

def test_padded_stores_are_gated_and_loads_are_not() -> None:
  ast = kernel_of(Tensor(_rand(10, 40)) @ Tensor(_rand(40, 64, seed=1)))
  rng = output_ranges(ast)[0]
  out = apply_opt(ast, Opt("UPCAST_PADDED", rng.arg[0], 6))
  assert 2 in {n.src[0].arg for n in out.toposort() if n.op is Ops.RANGE}  # 10 rows run as 2 blocks of 6
  stores = [n for n in out.toposort() if n.op is Ops.STORE]
  loads = [n for n in out.toposort() if n.op is Ops.LOAD]
  assert len(stores) == 6 and sum(len(s.src[0].src) == 3 for s in stores) >= 2  # the lanes that can pass row 9
  assert all(len(ld.src[0].src) == 2 for ld in loads)  # no load is gated

# (m, k, n) shapes whose rows the default opts pad: 4-row blocks of 4 vectors, 8-row blocks of 2
@pytest.mark.parametrize("m,k,n", [(70, 50, 128), (130, 33, 64), (100, 20, 96), (1024, 16, 64), (47, 64, 256)])
def test_default_opts_pad_rows_end_to_end(m: int, k: int, n: int) -> None:
  a, b = _rand(m, k), _rand(k, n, seed=1)
  out = Tensor(a) @ Tensor(b)
  np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)
  at = Tensor(a.T.copy()).T @ Tensor(b)  # a.T @ b: A read down its columns
  np.testing.assert_allclose(at.numpy(), a @ b, rtol=1e-4, atol=1e-4)

def test_default_opts_pad_rows_to_the_block() -> None:
  # fewer than 2^27 multiply-adds: 4 rows (66 computed as 68); a packed B of 2^27 and more takes 6 (test_matmul_blocks)
  small = hand_coded_opts(kernel_of(Tensor(_rand(66, 8)) @ Tensor(_rand(8, 64, seed=1))), device("C").renderer)
  assert [(o.op, o.amt) for o in small] == [("UPCAST_OUTER", 64), ("UPCAST_PADDED", 4)]
  a, b = _rand(1030, 256), _rand(256, 512, seed=1)
  np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-3)

def test_batched_padded_rows_under_jit() -> None:
  q, kk = _rand(3, 67, 40), _rand(3, 64, 40, seed=1)
  step = TinyJit(lambda x, y: (x @ y.transpose(-1, -2)).realize())
  for s in range(3):  # capture, then replays with new values
    qs, ks = q + s, kk - s
    got = step(Tensor(qs), Tensor(ks)).numpy()
    np.testing.assert_allclose(got, qs @ ks.transpose(0, 2, 1), rtol=1e-4, atol=1e-3)

def test_gradients_of_a_layer_with_padded_rows_match_torch() -> None:
  x, w, g = _rand(70, 96), _rand(96, 128, seed=1), _rand(70, 128, seed=2)
  ex, ew = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  ((ex @ ew).relu() * Tensor(g)).sum().backward()
  tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  ((tx @ tw).relu() * torch.tensor(g)).sum().backward()
  assert ex.grad is not None and ew.grad is not None and tx.grad is not None and tw.grad is not None
  np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(ew.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)

def test_convolution_rows_in_sevens_match_torch() -> None:
  # 5 x 28 x 28 pixels x 64 channels x 576: past TALL_BLOCK_MACS, its 28 pixels of a row in blocks of 7 (tall_rows)
  from ember.codegen.pack import plan_packing
  from ember.uop.rewrite import graph_rewrite
  from ember.uop.symbolic import symbolic
  x, w = _rand(5, 64, 28, 28), _rand(64, 64, 3, 3, seed=1) * 0.05
  out = Tensor(x).conv2d(Tensor(w), padding=1)
  ast = next(it.ast for it in reversed(out.schedule()) if it.kind != "copy" and
             any(n.op is Ops.REDUCE for n in it.ast.toposort()))
  plan = plan_packing(ast, device("C").renderer)
  assert plan is not None
  assert [o.amt for o in hand_coded_opts(graph_rewrite(plan.main, symbolic), device("C").renderer)] == [64, 7]
  want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy()
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-3)

def test_beam_candidates_include_padded_six_and_seven_row_blocks() -> None:
  from ember.codegen.search import candidate_opts
  ast = kernel_of(Tensor(_rand(100, 24)) @ Tensor(_rand(24, 64, seed=1)))
  cands = candidate_opts(ast, device("C").renderer)
  assert any(c and c[-1] == Opt("UPCAST_PADDED", c[-1].axis, 6) for c in cands)  # 100 rows computed as 102
  assert any(c and c[-1] == Opt("UPCAST_PADDED", c[-1].axis, 7) for c in cands)  # 100 rows computed as 105
