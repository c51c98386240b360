"""Kernel opts keep results: every opt list runs against the unoptimised kernel (and numpy) on random inputs.

Kernels run on the default device (PYTHON in the core suite, CPU where the backend is installed); the opts are built
with an explicit width so they apply whatever the renderer's SIMD width.
"""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor, Device, TinyJit, dtypes
from ember.codegen.opt import (Opt, KernelOptError, apply_opt, fuse_mulacc, matmul_axes, matmul_opts, hand_coded_opts,
                               output_ranges, pm_recombine_divmod)
from ember.codegen.search import _buffers, _compile, _outputs
from ember.engine import realize as engine
from ember.uop.ops import Ops, UOp
from ember.uop.rewrite import graph_rewrite
from ember.uop.symbolic import symbolic, sym_infer

def _kernel(t: Tensor) -> UOp:
  items = [it for it in t.schedule() if it.kind != "copy"]
  assert len(items) >= 1
  return graph_rewrite(items[-1].ast, symbolic, name="test: simplify")  # as codegen sees it before the opts

def _run(ast: UOp, opts: list[Opt], seed: int = 0) -> list[np.ndarray]:
  runner = _compile(ast, Device[Device.DEFAULT].renderer, Device.DEFAULT, opts)
  bufs = _buffers(runner.spec, Device.DEFAULT, seed)
  runner(bufs, {}, wait=True)
  return _outputs(bufs, runner.spec)

def _same_as_unoptimised(ast: UOp, opts: list[Opt]) -> None:
  want, got = _run(ast, []), _run(ast, opts)
  for g, w in zip(got, want): np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)

def _realized(*shape: int, seed: int = 0) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).realize()

@pytest.mark.parametrize("m,k,n", [(8, 12, 16), (12, 8, 32), (6, 5, 24)])
@pytest.mark.parametrize("cols,rows", [(1, 1), (2, 2), (1, 4), (2, 3)])
def test_matmul_register_blocks_match_unoptimised(m: int, k: int, n: int, cols: int, rows: int) -> None:
  ast = _kernel(_realized(m, k) @ _realized(k, n, seed=1))
  opts = matmul_opts(ast, 4, cols, rows)
  assert opts and opts[0].op == "UPCAST_OUTER"
  _same_as_unoptimised(ast, opts)

def test_matmul_axes_find_columns_and_rows() -> None:
  ast = _kernel(_realized(8, 4) @ _realized(4, 16, seed=1))
  axes = matmul_axes(ast, 4)
  assert axes is not None and axes[1] is not None and axes[0] != axes[1]
  assert matmul_axes(_kernel(_realized(8, 4).sum(1)), 4) is None  # no input ignores an output column

def test_column_counts_no_vector_divides_get_narrower_blocks() -> None:
  from ember.codegen.opt import column_spans
  assert column_spans(64, 16) == [64, 32, 16] and column_spans(200, 16) == [8, 4] and column_spans(33, 16) == []
  ast = _kernel(_realized(8, 12) @ _realized(12, 24, seed=1))  # 24 columns: blocks of 8 at a SIMD width of 16
  opts = matmul_opts(ast, 16, 2, 4)
  assert opts and opts[0].op == "UPCAST_OUTER" and opts[0].amt == 8
  _same_as_unoptimised(ast, opts)

def test_matmul_with_residual_keeps_its_row_block() -> None:
  # the residual `c` is read after the reduction, along rows and columns alike: it must not hide the row range
  a, b, c = _realized(8, 6), _realized(6, 16, seed=1), _realized(8, 16, seed=2)
  ast = _kernel(a @ b + c)
  axes = matmul_axes(ast, 4)
  assert axes is not None and axes[1] is not None
  opts = matmul_opts(ast, 4, 2, 2)
  assert [o.op for o in opts] == ["UPCAST_OUTER", "UPCAST"]
  _same_as_unoptimised(ast, opts)

def test_packed_operand_counts_as_contiguous_within_its_blocks() -> None:
  # B read as packed[(n//8)*K*8 + k*8 + n%8] (the layout codegen.pack writes): contiguous over 8 columns, not 16
  from ember.codegen.opt import _lane_stride
  from ember.uop.ops import AxisType
  n, k = UOp.range(16, 0, AxisType.GLOBAL), UOp.range(6, 1, AxisType.REDUCE)
  packed = (n // 8) * 48 + k * 8 + n % 8
  assert _lane_stride(packed, n, 8) == 1
  assert _lane_stride(packed, n, 16) is None  # the second block of 8 starts 48 elements on
  assert _lane_stride(k * 16 + n, n, 16) == 1 and _lane_stride(n * 6 + k, n, 8) == 6

def _python_lane_stride(fn, n_end: int, k_end: int, span: int) -> int | None:
  """The lane stride of index `fn(n, k)` along n over blocks of `span` (0: one step), by evaluating every point."""
  steps = {fn(n + 1, k) - fn(n, k) for n in range(n_end - 1) for k in range(k_end)} if span == 0 else \
    {(fn(b + c, k) - fn(b, k)) / c for b in range(0, n_end, span) for c in range(1, span) for k in range(k_end)}
  return int(steps.pop()) if len(steps) == 1 else None

def test_lane_strides_are_kept_per_range_and_span() -> None:
  # choosing opts asks the same index for its strides again and again, and they are kept on the index: each (range,
  # span) keeps its own answer, in any order of asking
  from ember.codegen.opt import _lane_stride, _stride
  from ember.uop.ops import AxisType
  n, k = UOp.range(16, 0, AxisType.GLOBAL), UOp.range(6, 1, AxisType.REDUCE)
  packed = (n // 8) * 48 + k * 8 + n % 8
  fns = {n: lambda nv, kv: (nv // 8) * 48 + kv * 8 + nv % 8, k: lambda kv, nv: (nv // 8) * 48 + kv * 8 + nv % 8}
  ends = {n: (16, 6), k: (6, 16)}
  for rng, span in [(n, 8), (n, 16), (k, 0), (n, 0), (n, 8), (k, 2), (n, 16), (k, 0)]:
    want = _python_lane_stride(fns[rng], *ends[rng], span)
    assert _lane_stride(packed, rng, span) == want, (rng.arg, span)
    if span == 0: assert _stride(packed, rng) == want

def test_batched_matmul_blocks_match_numpy() -> None:
  a, b = _realized(3, 8, 6), _realized(3, 6, 16, seed=1)
  ast = _kernel(a @ b)
  _same_as_unoptimised(ast, matmul_opts(ast, 4, 2, 2))

@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("amt", [2, 4, 8])
def test_split_reduce_matches_unoptimised(op: str, amt: int) -> None:
  x = _realized(6, 64)
  _same_as_unoptimised(_kernel(getattr(x, op)(axis=1)), [Opt("SPLIT", 0, amt)])

def test_softmax_and_conv_opts_match_unoptimised() -> None:
  items = [it for it in _realized(4, 32).softmax(-1).schedule() if it.kind != "copy"]
  reducing = [graph_rewrite(it.ast, symbolic) for it in items if any(n.op is Ops.REDUCE for n in it.ast.toposort())]
  assert reducing
  for ast in reducing: _same_as_unoptimised(ast, [Opt("SPLIT", 0, 8)])
  conv = _kernel(_realized(1, 3, 8, 8).conv2d(_realized(4, 3, 3, 3, seed=1), padding=1))
  even = [r.arg[0] for r in output_ranges(conv) if r.src[0].arg % 2 == 0]
  assert len(even) >= 2
  for opts in ([Opt("UPCAST", even[-1], 2)], [Opt("UPCAST_OUTER", even[-1], 2), Opt("UPCAST", even[0] + 1, 2)]):
    _same_as_unoptimised(conv, opts)

def test_elementwise_upcast_and_threads_match() -> None:
  a, b = _realized(16, 8), _realized(16, 8, seed=1)
  ast = _kernel(a * b + 1)
  _same_as_unoptimised(ast, [Opt("UPCAST", 0, 4), Opt("THREADS", 0, 2)])

def test_bad_opts_raise_typed_errors() -> None:
  ast = _kernel(_realized(6, 10).sum(1))
  with pytest.raises(KernelOptError, match="does not divide"): apply_opt(ast, Opt("SPLIT", 0, 4))  # 10 % 4
  with pytest.raises(KernelOptError, match="no constant output range"): apply_opt(ast, Opt("UPCAST", 7, 2))
  with pytest.raises(KernelOptError, match="cannot upcast"): apply_opt(ast, Opt("UPCAST", 0, 4))  # 6 % 4
  with pytest.raises(KernelOptError, match="unknown opt"): Opt("VECTORISE", 0, 4)

def test_hand_coded_opts_for_a_simd_renderer() -> None:
  class Wide:
    simd_width = 4
    vector_reduce_ops: frozenset = frozenset()
  ast = _kernel(_realized(10, 16) @ _realized(16, 32, seed=1))
  opts = hand_coded_opts(ast, Wide())  # type: ignore[arg-type]
  # 2 vectors of 4 columns, and 8 rows shrunk to the 5 that divide the 10 there are (rows in fours would take 4 x 4
  # vectors of this small B: test_matmul_layout)
  assert [o.op for o in opts] == ["UPCAST_OUTER", "UPCAST"] and opts[0].amt == 8 and opts[1].amt == 5
  _same_as_unoptimised(ast, opts)
  red = _kernel(_realized(4, 64).sum(1))  # 4 rows, 2 at a time (2 apart), each in 4 partial sums
  assert hand_coded_opts(red, Wide()) == [Opt("UPCAST_STRIDED", 0, 2), Opt("SPLIT", 0, 4)]  # type: ignore[arg-type]
  _same_as_unoptimised(red, hand_coded_opts(red, Wide()))  # type: ignore[arg-type]

def test_fuse_mulacc_turns_accumulated_products_into_one_op() -> None:
  from ember.codegen import full_rewrite
  ast = _kernel(_realized(4, 8) @ _realized(8, 4, seed=1))
  uops, _, _ = full_rewrite(ast, Device["PYTHON"].renderer, [Opt("UPCAST", 1, 2)])  # a renderer that does not fuse
  fused = fuse_mulacc(uops)
  n_muls = sum(u.op is Ops.MUL and u.dtype is dtypes.float32 for u in uops)
  assert sum(u.op is Ops.MULACC for u in fused) == 2 and len(fused) == len(uops) - 2 and n_muls >= 2
  srcs = {s for u in fused for s in u.src}
  assert srcs <= set(fused)  # every source is a uop of the new program

def test_partial_sums_stay_unfused_so_they_vectorise() -> None:
  from ember.codegen import full_rewrite
  ast = _kernel(_realized(1, 64) @ _realized(12, 64, seed=1).T)  # a matvec: reduction over the contiguous axis
  uops, _, _ = full_rewrite(ast, Device["PYTHON"].renderer, [Opt("SPLIT", 0, 8)])
  accs = {u for u in uops if u.op is Ops.DEFINE_ACC}
  assert len(accs) == 8 and not any(u.op is Ops.MULACC for u in fuse_mulacc(uops))  # combined lanes: acc + a*b
  blocked = _kernel(_realized(4, 8) @ _realized(8, 4, seed=1))
  uops, _, _ = full_rewrite(blocked, Device["PYTHON"].renderer, [Opt("UPCAST", 1, 2)])
  assert sum(u.op is Ops.MULACC for u in fuse_mulacc(uops)) == 2  # lanes stored on their own: fused

@pytest.mark.parametrize("k,n,amt", [(64, 12, 16), (96, 8, 32), (48, 5, 4)])
def test_matvec_split_matches_unoptimised_and_numpy(k: int, n: int, amt: int) -> None:
  x, w = _realized(1, k), _realized(n, k, seed=1)
  ast = _kernel(x @ w.T)
  assert matmul_axes(ast, 4) is None  # no output column is read contiguously: not a register-blocked matmul
  _same_as_unoptimised(ast, [Opt("SPLIT", 0, amt)])
  np.testing.assert_allclose((x @ w.T).numpy(), x.numpy() @ w.numpy().T, rtol=1e-4, atol=1e-4)

def test_divmod_chains_recombine_to_the_plain_index() -> None:
  k = UOp.variable("k", 0, 575)
  c = lambda v: UOp.const(dtypes.int32, v)  # noqa: E731
  chain = (k // c(192)) * c(192) + ((k // c(64)) % c(3)) * c(64) + k % c(64)  # a reshape of a permuted (3, 3, 64)
  scaled = ((k // c(8)) % c(4)) * c(24) + (k % c(8)) * c(3) + c(5)  # (k % 32) * 3 + 5
  for expr, want in ((chain, k), (scaled, (k % c(32)) * c(3) + c(5))):
    got = graph_rewrite(expr, symbolic + pm_recombine_divmod, name="test: recombine")
    assert not any(n.op is Ops.IDIV for n in got.toposort())
    for v in np.random.default_rng(0).integers(0, 576, 40).tolist():
      assert sym_infer(got, {"k": v}) == sym_infer(expr, {"k": v}) == sym_infer(want, {"k": v})

def test_permuted_matvec_input_loads_contiguously() -> None:
  from ember.codegen import full_rewrite
  a, w = _realized(3, 3, 1, 8), _realized(16, 72, seed=1)
  x = a.exp().permute(2, 0, 1, 3).reshape(1, 72)  # the attention output of a decode step, before its projection
  ast = _kernel(x @ w.T)
  uops, _, _ = full_rewrite(ast, Device["PYTHON"].renderer, [])
  assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in uops)
  _same_as_unoptimised(ast, [Opt("SPLIT", 0, 8)])
  want = np.exp(a.numpy()).transpose(2, 0, 1, 3).reshape(1, 72) @ w.numpy().T
  np.testing.assert_allclose((x @ w.T).numpy(), want, rtol=1e-4, atol=1e-4)

def test_optimised_matmul_end_to_end_matches_numpy() -> None:
  a_np = np.random.default_rng(3).standard_normal((32, 48)).astype(np.float32)
  b_np = np.random.default_rng(4).standard_normal((48, 64)).astype(np.float32)
  np.testing.assert_allclose((Tensor(a_np) @ Tensor(b_np)).numpy(), a_np @ b_np, rtol=1e-4, atol=1e-4)

def test_jit_mlp_train_step_compile_count_stays_flat() -> None:
  rng = np.random.default_rng(0)
  w1 = Tensor(rng.standard_normal((16, 32)).astype(np.float32) * 0.2, requires_grad=True).realize()
  w2 = Tensor(rng.standard_normal((32, 4)).astype(np.float32) * 0.2, requires_grad=True).realize()
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    loss = (x @ w1).relu().matmul(w2).sparse_categorical_crossentropy(y)
    for p in (w1, w2): p.grad = None
    loss.backward()
    for p in (w1, w2): p.assign(p.detach() - 0.1 * p.grad)
    Tensor.realize(loss, w1, w2)
    return loss
  counts, losses = [], []
  for _ in range(12):
    x = Tensor(rng.standard_normal((8, 16)).astype(np.float32)).realize()
    y = Tensor(rng.integers(0, 4, 8).astype(np.int32)).realize()
    losses.append(step(x, y).numpy().item())
    counts.append(len(engine._runner_cache))
  assert counts[2:] == [counts[2]] * 10  # 10 replayed steps: no kernel compiled after the capture
  assert np.isfinite(losses).all() and len(set(losses[2:])) > 1  # replays compute with the new inputs

def test_unroll_rebuilds_each_store_as_a_substitution_would() -> None:
  """upcast's one-walk unrolling gives exactly the nodes of substituting the range in every store, value by value."""
  from ember.codegen.opt import _unroll, output_ranges
  a = np.random.default_rng(0).standard_normal((8, 12)).astype(np.float32)
  ast = _kernel((Tensor(a) @ Tensor(a.T) + 1).relu() * 2)
  for rng in output_ranges(ast):
    values = [rng * 3 + c for c in range(3)]
    assert _unroll(ast, rng, values) == tuple(st.substitute({rng: v}) for v in values for st in ast.src)
