"""Operand packing (ember.codegen.pack) on both CPU renderers: which kernels get a plan, that the packed kernel gives
the unpacked kernel's bits, and matmuls of every layout end to end against numpy, eager and under TinyJit."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor, TinyJit
from ember.codegen.opt import hand_coded_opts
from ember.codegen.pack import plan_packing, PackPlan, PACK_MIN_ROWS, PACK_MIN_ELEMENTS
from ember.engine.realize import GlobalCounters
from ember.uop.rewrite import graph_rewrite
from ember.uop.symbolic import symbolic
from ember_cpu.renderer import ClangRenderer
from cpu_kernels import RENDERERS, device, np_dtype
from test_kernel_opts import kernel_of, run_kernel

def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def _plan(t: Tensor, kind: str = "C") -> PackPlan | None:
  items = [it for it in t.schedule() if it.kind != "copy"]
  return plan_packing(items[-1].ast, device(kind).renderer)

def test_plans_only_where_packing_pays() -> None:
  a, b = Tensor(_rand(64, 256)), Tensor(_rand(256, 96))
  plan = _plan(a @ b)
  assert plan is not None and plan.size == 256 * 96 and plan.src_slot == 2 and plan.scratch_slot == 3
  # a B contiguous over 4 vectors of columns and small enough to stay in L2 is read where it lies (4 x 4 blocks);
  # a bigger one is packed
  assert _plan(a @ Tensor(_rand(256, 64))) is None and _plan(Tensor(_rand(64, 512)) @ Tensor(_rand(512, 512))) is None
  assert (big := _plan(Tensor(_rand(64, 1024)) @ Tensor(_rand(1024, 512)))) is not None and big.size == 1024 * 512
  assert _plan(Tensor(_rand(1, 256)) @ b) is None  # one row: each element of B is read once, nothing to reuse
  assert _plan(Tensor(_rand(PACK_MIN_ROWS - 1, 256)) @ b) is None
  assert 256 * 32 < PACK_MIN_ELEMENTS <= 256 * 64
  assert _plan(a @ Tensor(_rand(256, 32))) is None  # B of 8192 elements stays in cache as it is
  assert _plan(Tensor(_rand(64, 256)).sum(1)) is None  # a reduction with no B operand
  # 72 columns: blocks of 8 (half a vector); 33 columns: no block divides them, and A is never packed in B's place
  # (its block would be stored a row apart)
  assert (narrow := _plan(a @ Tensor(_rand(256, 72)))) is not None and narrow.src_slot == 2 and narrow.size == 256 * 72
  assert _plan(Tensor(_rand(64, 512)) @ Tensor(_rand(512, 33))) is None
  no_pack = type("NoPackRenderer", (ClangRenderer,), {"pack_operands": False})()
  assert plan_packing(kernel_of(a @ b), no_pack) is None

@pytest.mark.parametrize("kind", RENDERERS)
def test_packed_kernel_gives_the_unpacked_bits(kind: str) -> None:
  a, b = _rand(64, 256, seed=1), _rand(256, 160, seed=2)
  ast = kernel_of(Tensor(a) @ Tensor(b))
  renderer = device(kind).renderer
  plan = plan_packing(ast, renderer)
  assert plan is not None
  # the main kernel gets the unpacked kernel's register blocking: the same products summed in the same order
  main = graph_rewrite(plan.main, symbolic, name="test: simplify")
  assert hand_coded_opts(main, renderer) == hand_coded_opts(ast, renderer)
  packed = run_kernel(kind, plan.pack, {1: b.reshape(-1)})[0]
  # (column block, k, column within the block): each block's panel is contiguous
  np.testing.assert_array_equal(packed.reshape(5, 256, 32), b.reshape(256, 5, 32).transpose(1, 0, 2))
  got = run_kernel(kind, plan.main, {1: a.reshape(-1), 3: packed})[0]
  np.testing.assert_array_equal(got, run_kernel(kind, ast, {1: a.reshape(-1), 2: b.reshape(-1)})[0])
  np.testing.assert_allclose(got.reshape(64, 160), a @ b, rtol=1e-4, atol=1e-4)

def _layouts() -> dict[str, tuple[list[tuple[int, ...]], object, object]]:
  """name: (input shapes, ember function, numpy function)."""
  return {
    "a@b": ([(96, 160), (160, 160)], lambda a, b: a @ b, lambda a, b: a @ b),
    "a@b, 200 columns (blocks of 8)": ([(40, 256), (256, 200)], lambda a, b: a @ b, lambda a, b: a @ b),
    "a@b.T (Linear)": ([(64, 200), (96, 200)], lambda a, b: a @ b.T, lambda a, b: a @ b.T),
    "a.T@b": ([(160, 64), (160, 160)], lambda a, b: a.T @ b, lambda a, b: a.T @ b),
    "batched q@k.T": ([(3, 64, 48), (3, 128, 48)], lambda q, k: q @ k.transpose(-1, -2),
                      lambda q, k: q @ k.transpose(0, 2, 1)),
    "broadcast x@W": ([(2, 40, 96), (96, 224)], lambda x, w: x @ w, lambda x, w: x @ w),
    # an arithmetic epilogue fuses into the packed matmul (a relu gets its own kernel: test_schedule)
    "(a@b + bias) * 0.5": ([(48, 128), (128, 288), (288,)], lambda a, b, c: (a @ b + c) * 0.5,
                           lambda a, b, c: (a @ b + c) * 0.5),
  }

def _buffers(t: Tensor) -> dict[int, np.ndarray]:
  """The input buffers of `t`'s last kernel by slot (its inputs are realized)."""
  item = [it for it in t.schedule() if it.kind != "copy"][-1]
  out = {}
  for slot, buf in enumerate(item.bufs[1:], start=1):
    arr = np.empty(buf.size, np_dtype(buf.dtype))
    buf.copyout(memoryview(arr).cast("B"))
    out[slot] = arr
  return out

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("name", list(_layouts()))
def test_packed_matmuls_match_numpy(kind: str, name: str) -> None:
  shapes, fn, ref = _layouts()[name]
  arrays = [_rand(*s, seed=i) for i, s in enumerate(shapes)]
  out = fn(*[Tensor(x) for x in arrays])
  plan = _plan(out, kind)
  assert plan is not None  # each of these is big enough to be packed (or its columns no 4 vectors divide)
  inputs = _buffers(out)
  packed = run_kernel(kind, plan.pack, {1: inputs[plan.src_slot]})[0]
  got = run_kernel(kind, plan.main, {**inputs, plan.scratch_slot: packed})[0]
  np.testing.assert_allclose(got.reshape(out.shape), ref(*arrays), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(out.numpy(), ref(*arrays), rtol=1e-4, atol=1e-4)  # end to end on the default renderer

def test_int_matmul_packed_exactly() -> None:
  rng = np.random.default_rng(3)
  a, b = rng.integers(-50, 50, (64, 128), dtype=np.int32), rng.integers(-50, 50, (128, 160), dtype=np.int32)
  out = Tensor(a) @ Tensor(b)
  assert _plan(out) is not None
  np.testing.assert_array_equal(out.numpy(), a @ b)

def test_packed_matmul_under_jit_replays_with_new_inputs() -> None:
  step = TinyJit(lambda x, w: (x @ w.T).relu())
  for i in range(4):
    x, w = _rand(64, 128, seed=10 + i), _rand(160, 128, seed=20 + i)
    GlobalCounters.reset()
    out = step(Tensor(x), Tensor(w)).numpy()
    np.testing.assert_allclose(out, np.maximum(x @ w.T, 0), rtol=1e-4, atol=1e-4)
    # replay: the pack kernel, the matmul and the relu (a selecting epilogue runs apart from the matmul), nothing else
    if i >= 2: assert GlobalCounters.kernel_count == 3

def test_conv2d_runs_as_a_packed_implicit_gemm() -> None:
  rng = np.random.default_rng(7)
  x, w = rng.standard_normal((2, 32, 12, 12)).astype(np.float32), rng.standard_normal((64, 32, 3, 3)).astype(np.float32)
  out = Tensor(x).conv2d(Tensor(w), padding=1)
  kernels = [it for it in out.schedule() if it.kind == "kernel"]
  # the padded image channels-last, the reduction reading its windows with the weight packed (288 x 64), then NCHW
  plans = [plan_packing(it.ast, device("C").renderer) for it in kernels]
  assert len(kernels) == 3 and plans[0] is None and plans[1] is not None and plans[2] is None
  assert plans[1].size == 32 * 9 * 64
  from numpy.lib.stride_tricks import sliding_window_view
  win = sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
  np.testing.assert_allclose(out.numpy(), np.einsum("nchwij,ocij->nohw", win, w), rtol=1e-4, atol=1e-4)

def test_small_strided_operands_are_packed() -> None:
  # beautiful_mnist's first conv: an 800-element weight in (Cout, ky, kx, Cin) order, its output channels 25 apart.
  # Unpacked, no block of output channels existed and the kernel blocked the image's columns instead (2 GFLOP/s
  # against 90 packed); a small B contiguous in its columns already stays as it is
  rng = np.random.default_rng(8)
  x, w = rng.standard_normal((4, 1, 28, 28)).astype(np.float32), rng.standard_normal((32, 1, 5, 5)).astype(np.float32)
  out = Tensor(x).conv2d(Tensor(w))
  plans = [plan_packing(it.ast, device("C").renderer) for it in out.schedule() if it.kind == "kernel"]
  assert [p is not None and p.size for p in plans] == [False, 32 * 25, False]
  from numpy.lib.stride_tricks import sliding_window_view
  win = sliding_window_view(x, (5, 5), axis=(2, 3))
  np.testing.assert_allclose(out.numpy(), np.einsum("nchwij,ocij->nohw", win, w), rtol=1e-4, atol=1e-4)
  assert 64 * 64 < PACK_MIN_ELEMENTS
  small_t = _plan(Tensor(_rand(64, 64)) @ Tensor(_rand(64, 64)).T)
  assert small_t is not None and small_t.size == 64 * 64  # W.T: its columns are a row of W apart
  assert _plan(Tensor(_rand(64, 64)) @ Tensor(_rand(64, 64))) is None

def test_long_full_reductions_match_numpy() -> None:
  rng = np.random.default_rng(12)
  x = rng.standard_normal(1 << 21).astype(np.float32)
  t = Tensor(x)
  np.testing.assert_allclose(t.sum().numpy(), x.astype(np.float64).sum(), rtol=1e-5)
  assert t.max().numpy() == x.max() and t.min().numpy() == x.min()
  ints = rng.integers(-1000, 1000, 1 << 21, dtype=np.int32)
  assert Tensor(ints).sum().numpy() == ints.sum()
  g = Tensor(x.reshape(2048, 1024), requires_grad=True)
  (g.sum() * 3).backward()
  assert np.all(g.grad.numpy() == 3)
