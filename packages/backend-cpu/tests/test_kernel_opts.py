"""The CPU renderers' kernel rewrites and the default opts they get, on both renderers, against numpy and against the
unoptimised kernel: float MAX reductions as int maxima (NaN, infinities, signed zeros), exp2 as a polynomial,
convolution and matmul register blocking."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor
from ember.codegen import get_program, simplify_kernel
from ember.codegen.rowreuse import reuse_row_values
from ember.codegen.opt import Opt, apply_opt, hand_coded_opts, output_ranges
from ember.plugin import Ops, UOp, dtypes
from ember.uop.rewrite import graph_rewrite
from ember.uop.symbolic import symbolic
from cpu_kernels import RENDERERS, device, run_spec

def kernel_of(t: Tensor) -> UOp:
  """The last kernel of `t`'s schedule, as codegen sees it before the opts."""
  items = [it for it in t.schedule() if it.kind != "copy"]
  return graph_rewrite(items[-1].ast, symbolic, name="test: simplify")

def run_kernel(kind: str, ast: UOp, inputs: dict[int, np.ndarray], opts: list[Opt] | None = None,
               threads: bool = True) -> list[np.ndarray]:
  """Codegen `ast` for renderer `kind` (`opts` None: the hand-coded default), run it with buffer slot s holding
  inputs[s] (zeros elsewhere), return the buffers it writes."""
  dev = device(kind)
  return run_spec(dev, get_program(ast, dev.renderer, "", opts), inputs, threads)

def _specials(dtype: type, rows: int, cols: int, seed: int = 0) -> np.ndarray:
  """Random rows, then rows holding NaN (either sign), -inf only, +inf, signed zeros only, huge and tiny values."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((rows, cols)).astype(dtype)
  fi = np.finfo(dtype)
  x[1, 5] = np.nan
  x[2, :] = -np.inf
  x[3, 7] = np.inf
  x[4, :] = -0.0
  x[5, :] = np.where(np.arange(cols) % 2 == 0, -0.0, 0.0)
  x[6, :] = -fi.max
  x[6, 3] = -fi.smallest_subnormal
  x[7, 9] = -np.copysign(np.nan, -1.0)  # a NaN with the sign bit set (what 0/0 gives on x86)
  x[7, 10] = np.copysign(np.nan, -1.0)
  x[8, :] = -np.abs(x[8, :])  # negatives only
  x[9, :] = fi.smallest_subnormal * np.arange(cols)
  return x

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_reduction_specials_match_numpy(kind: str, dtype: type) -> None:
  x = _specials(dtype, 12, 48)
  ast = kernel_of(Tensor(x).max(axis=1))
  want = x.max(axis=1)
  for opts in (None, []):
    got = run_kernel(kind, ast, {1: x.reshape(-1)}, opts)[0]
    np.testing.assert_array_equal(got, want)  # NaN where numpy has NaN, the same infinities and extremes
  assert np.signbit(got[4]) and np.isnan(got[1]) and np.isnan(got[7]) and got[2] == -np.inf and got[3] == np.inf

@pytest.mark.parametrize("kind", RENDERERS)
def test_max_rewrite_applies_to_every_max_reduction(kind: str) -> None:
  x = _specials(np.float32, 10, 64, seed=3)
  full = kernel_of(Tensor(x).max())  # a reduction over both axes of the (10, 64) input
  np.testing.assert_array_equal(run_kernel(kind, full, {1: x.reshape(-1)})[0], np.array([x.max()]))
  finite = np.random.default_rng(4).standard_normal((6, 40)).astype(np.float32)
  cols = kernel_of(Tensor(finite).max(axis=0))  # the reduced axis strided
  np.testing.assert_array_equal(run_kernel(kind, cols, {1: finite.reshape(-1)})[0], finite.max(axis=0))

def test_max_only_kernels_stay_unsplit_int_maxima() -> None:
  renderer = device("C").renderer
  ast = kernel_of(Tensor(np.zeros((8, 256), np.float32)).max(axis=1))
  # the int max vectorises as it is: no SPLIT lanes, only 4 rows a trip
  assert [o.op for o in hand_coded_opts(ast, renderer)] == ["UPCAST_STRIDED"]
  src = get_program(ast, renderer, "").src
  assert "int acc7" in src and "float acc" not in src  # both accumulators of each of the 4 rows are ints
  summed = kernel_of(Tensor(np.zeros((8, 256), np.float32)).sum(axis=1))
  assert [o.op for o in hand_coded_opts(summed, renderer)] == ["UPCAST_STRIDED", "SPLIT"]  # an ADD gets partial sums

def test_softmax_kernel_splits_its_sum_and_keeps_its_max_whole() -> None:
  """The fused softmax's max beside its sum of exp: the sum gets SIMD partial sums, the max stays one int maximum (16
  int-max lanes next to the sum made gcc shuffle them: 2x slower)."""
  renderer = device("C").renderer
  ast = kernel_of(Tensor(np.zeros((8, 256), np.float32)).softmax(-1))
  opts = hand_coded_opts(ast, renderer)
  assert opts == [Opt("SPLIT", 1, renderer.simd_width)]
  split = apply_opt(ast, opts[0])
  reds = [n for n in split.toposort() if n.op is Ops.REDUCE]
  assert sum(r.arg is Ops.MAX for r in reds) == 1 and sum(r.arg is Ops.ADD for r in reds) == renderer.simd_width

@pytest.mark.parametrize("kind", RENDERERS)
def test_exp_matches_numpy_with_specials(kind: str) -> None:
  x = np.concatenate([np.random.default_rng(1).uniform(-100, 100, 4000),
                      [-np.inf, np.inf, np.nan, 0.0, -0.0, -150.0, -104.0, -103.9, -87.3, 88.72, 88.73, 89.0, 1e-30,
                       -1e-30, 200.0, -200.0, 3.4e38, -3.4e38]]).astype(np.float32)
  ast = kernel_of(Tensor(x).exp())
  got = run_kernel(kind, ast, {1: x})[0]
  # exp(x) is exp2 of the float32 product x * log2(e): the oracle rounds that product the same way
  with np.errstate(over="ignore", invalid="ignore"):
    t = x * np.float32(1 / np.log(2))
    want = np.exp2(t.astype(np.float64)).astype(np.float32)
  special = ~np.isfinite(want) | (want == 0) | ~np.isfinite(x)
  np.testing.assert_array_equal(got[special], want[special])
  tiny = np.finfo(np.float32).smallest_subnormal  # one unit of a subnormal result
  np.testing.assert_allclose(got[~special], want[~special], rtol=4e-7, atol=tiny)

@pytest.mark.parametrize("kind", RENDERERS)
def test_softmax_kernels_match_unoptimised(kind: str) -> None:
  x = np.random.default_rng(2).standard_normal((6, 96)).astype(np.float32) * 4
  items = [it for it in Tensor(x).softmax(-1).schedule() if it.kind != "copy"]
  assert len(items) == 1  # max, sum of exp and scaling in one kernel (the row statistics fuse)
  rng = np.random.default_rng(7)
  for it in items:  # each kernel on random inputs (every slot but the output), optimised against unoptimised
    ast = graph_rewrite(it.ast, symbolic, name="test: simplify")
    params = [n for n in ast.toposort() if n.op is Ops.PARAM]
    written = {n.src[0].src[0].arg for n in ast.toposort() if n.op is Ops.STORE}
    inputs = {p.arg: rng.uniform(0.5, 3.0, p.dtype.size).astype(np.float32) for p in params if p.arg not in written}
    got, plain = run_kernel(kind, ast, inputs)[0], run_kernel(kind, ast, inputs, [])[0]
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-7)

def test_softmax_end_to_end_matches_numpy() -> None:
  x = np.random.default_rng(2).standard_normal((6, 96)).astype(np.float32) * 4
  x[1, 3] = -np.inf
  e = np.exp(x - x.max(-1, keepdims=True))
  np.testing.assert_allclose(Tensor(x, device="CPU").softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5,
                             atol=1e-7)

def _exps(ast: UOp) -> int:
  """How many exp2 a kernel computes per element of its loops, once codegen's row-value reuse ran."""
  return sum(n.op is Ops.EXP2 for n in reuse_row_values(simplify_kernel(ast)).toposort())

def _np_softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

def test_softmax_computes_each_exp_once() -> None:
  """A softmax row's exp is computed by the loop of its sum, stored in the output and scaled in place, not computed
  again by the loop of the stores; the same for a scaled softmax over a middle axis (attention's scores)."""
  assert _exps(kernel_of(Tensor(np.zeros((8, 256), np.float32)).softmax(-1))) == 1
  assert _exps(kernel_of((Tensor(np.zeros((2, 3, 5, 40), np.float32)) * 0.125).softmax(-1))) == 1
  # no reuse where the row is the loop split over threads (one row), nor where the output is read (in place)
  assert _exps(kernel_of(Tensor(np.zeros(256, np.float32)).softmax(-1))) == 2
  assert _exps(_in_place(kernel_of(Tensor(np.zeros((8, 256), np.float32)).softmax(-1)))) == 2

def _in_place(ast: UOp) -> UOp:
  """The kernel reading its input from its output buffer (slot 0)."""
  params = {n.arg: n for n in ast.toposort() if n.op is Ops.PARAM}
  return ast.substitute({params[1]: params[0]})

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("shape", [(37, 200), (3, 5, 48), (300,)])
def test_softmax_with_reused_exps_matches_numpy(kind: str, shape: tuple[int, ...]) -> None:
  x = (np.random.default_rng(3).standard_normal(shape) * 6).astype(np.float32)
  x.reshape(-1)[[0, 7]] = [-np.inf, 80.0]
  ast = kernel_of(Tensor(x).softmax(-1))
  for opts in (None, []):  # the hand-coded opts (SIMD partial sums, threads) and none
    np.testing.assert_allclose(run_kernel(kind, ast, {1: x}, opts)[0].reshape(shape), _np_softmax(x), rtol=1e-5,
                               atol=1e-7)

@pytest.mark.parametrize("kind", RENDERERS)
def test_in_place_softmax_kernel_matches_numpy(kind: str) -> None:
  x = (np.random.default_rng(4).standard_normal((16, 130)) * 3).astype(np.float32)
  ast = _in_place(kernel_of(Tensor(x).softmax(-1)))
  np.testing.assert_allclose(run_kernel(kind, ast, {0: x})[0].reshape(x.shape), _np_softmax(x), rtol=1e-5, atol=1e-7)

def test_transposing_copies_get_a_register_tile() -> None:
  """A layout copy whose stores run along one range and whose loads run along another gets the stores' range upcast,
  and the load's too (a tile) where that is not the loop just outside; a copy that reads along its stores, and a
  broadcast, get nothing."""
  renderer = device("C").renderer
  def opts(t: Tensor) -> list[Opt]: return hand_coded_opts(kernel_of(t), renderer)
  x = Tensor(np.zeros((2, 64, 24, 56), np.float32)).realize()
  # to channels-last: the load runs along the loop just outside the stores' (its lines stay in L1): the stores' range
  assert opts(x.permute(0, 2, 3, 1).contiguous()) == [Opt("UPCAST", 3, 16)]
  y = Tensor(np.zeros((2, 24, 56, 64), np.float32)).realize()
  assert opts(y.permute(0, 3, 1, 2).contiguous()) == [Opt("UPCAST", 1, 8), Opt("UPCAST", 3, 8)]  # back to NCHW: a tile
  # a load range no 4 divides (a padded conv input's width): the stores' range alone
  assert opts(Tensor(np.zeros((6, 32, 9), np.float32)).realize().permute(0, 2, 1).contiguous()) == \
    [Opt("UPCAST", 2, 16)]
  assert opts(x + 1) == [] and opts(Tensor(np.zeros(64, np.float32)).realize().reshape(1, 64).expand(8, 64) + 0) == []

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("shape,perm", [((3, 64, 10, 56), (0, 2, 3, 1)), ((3, 10, 56, 64), (0, 3, 1, 2)),
                                        ((40, 48), (1, 0)), ((5, 7, 12), (2, 0, 1)), ((6, 32, 9), (0, 2, 1))])
def test_transposing_copies_match_numpy(kind: str, shape: tuple[int, ...], perm: tuple[int, ...]) -> None:
  x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
  ast = kernel_of(Tensor(x).permute(*perm).contiguous())
  want = x.transpose(perm)
  for opts in (None, []):  # the tile and none
    np.testing.assert_array_equal(run_kernel(kind, ast, {1: x}, opts)[0].reshape(want.shape), want)

def test_small_elementwise_kernels_run_on_one_thread() -> None:
  """An elementwise kernel below THREAD_MIN_ELEMENTS (a second thread's dispatch costs what one thread takes for it)
  runs on one thread; a larger one, and a reduction of as many loop iterations, on every thread."""
  renderer = device("C").renderer
  if renderer.global_max[0] < 2: pytest.skip("one CPU thread: every kernel runs on it")
  def threads(t: Tensor) -> list[int] | None:
    return get_program(kernel_of(t), renderer, "", None).global_size
  small = Tensor(np.zeros((256, 512), np.float32)).realize()
  large = Tensor(np.zeros((1024, 512), np.float32)).realize()
  assert threads(small - small * 0.01) is None and threads(small.T.contiguous()) is None
  assert threads(large - large * 0.01) == [renderer.global_max[0], 1, 1]
  assert threads(small.sum(axis=1)) == [renderer.global_max[0], 1, 1]

def _np_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  from numpy.lib.stride_tricks import sliding_window_view
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  return np.einsum("nchwij,ocij->nohw", sliding_window_view(xp, (3, 3), axis=(2, 3)), w)

def _direct_conv(x: Tensor, w: Tensor) -> Tensor:
  """A 3x3 pad-1 convolution as one reduction over the padded image's windows (conv2d itself goes through im2col and
  a matmul): the kernel shape `reuse_opts` is for."""
  win = x.pad(((0, 0), (0, 0), (1, 1), (1, 1)))._pool((3, 3), (1, 1), (1, 1))  # (N, Cin, H, W, 3, 3)
  n, cin, h, wd = win.shape[:4]
  return (win.reshape(n, 1, cin, h, wd, 3, 3) * w.reshape(1, w.shape[0], cin, 1, 1, 3, 3)).sum((2, 5, 6))

@pytest.mark.parametrize("kind", RENDERERS)
def test_conv_gets_output_channel_blocking_and_matches(kind: str) -> None:
  rng = np.random.default_rng(5)
  x, w = rng.standard_normal((2, 5, 7, 6)).astype(np.float32), rng.standard_normal((16, 5, 3, 3)).astype(np.float32)
  ast = kernel_of(_direct_conv(Tensor(x), Tensor(w)))
  opts = hand_coded_opts(ast, device(kind).renderer)
  channels = next(r for r in output_ranges(ast) if r.src[0].arg == 16)
  assert opts == [Opt("UPCAST", channels.arg[0], 8)]  # the image load is shared by 8 output channels
  inputs = {1: x.reshape(-1), 2: w.reshape(-1)}
  got, plain = run_kernel(kind, ast, inputs, opts)[0], run_kernel(kind, ast, inputs, [])[0]
  np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got.reshape(2, 16, 7, 6), _np_conv(x, w), rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("m,k,n", [(4, 5, 32), (6, 3, 16)])
def test_default_matmul_blocks_match_numpy(kind: str, m: int, k: int, n: int) -> None:
  rng = np.random.default_rng(6)
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  ast = kernel_of(Tensor(a) @ Tensor(b))
  opts = hand_coded_opts(ast, device(kind).renderer)
  assert [o.op for o in opts] == ["UPCAST_OUTER", "UPCAST"]  # columns and rows of accumulators
  got = run_kernel(kind, ast, {1: a.reshape(-1), 2: b.reshape(-1)})[0]
  np.testing.assert_allclose(got, run_kernel(kind, ast, {1: a.reshape(-1), 2: b.reshape(-1)}, [])[0],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got.reshape(m, n), a @ b, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("batch,n,k,wdtype", [(1, 24, 64, np.float32), (1, 40, 96, np.float16), (1, 6, 64, np.float32),
                                              (1, 7, 64, np.float32), (3, 12, 128, np.float32)])
def test_matvec_rows_apart_match_numpy(kind: str, batch: int, n: int, k: int, wdtype: type) -> None:
  # x @ W.T over W's contiguous rows: 4 rows a quarter of W apart per loop trip (2 where 4 do not divide them, none for
  # 7), each its own vector of partial sums; results as numpy's and as the kernel's without the rows apart
  rng = np.random.default_rng(11)
  x, w = rng.standard_normal((batch, k)).astype(np.float32), rng.standard_normal((n, k)).astype(wdtype)
  ast = kernel_of(Tensor(x) @ Tensor(w).T.cast(dtypes.float32))
  opts = hand_coded_opts(ast, device(kind).renderer)
  rows = [o for o in opts if o.op == "UPCAST_STRIDED"]
  assert [o.amt for o in rows] == ([4] if n % 4 == 0 else [2] if n % 2 == 0 else [])
  if rows: assert next(r for r in output_ranges(ast) if r.arg[0] == rows[0].axis).src[0].arg == n  # W's rows
  params = {u.arg: u.dtype.base for u in ast.toposort() if u.op is Ops.PARAM}
  inputs = {1: w.reshape(-1), 2: x.reshape(-1)} if params[1] != dtypes.float32 else {1: x.reshape(-1), 2: w.reshape(-1)}
  got = run_kernel(kind, ast, inputs)[0]
  # the same partial sums in the same order as without the rows apart: equal bits
  np.testing.assert_array_equal(got, run_kernel(kind, ast, inputs, [o for o in opts if o.op != "UPCAST_STRIDED"])[0])
  np.testing.assert_allclose(got.reshape(batch, n), x @ w.astype(np.float32).T, rtol=1e-4, atol=1e-4)

def test_matvec_rows_apart_are_vector_accumulators() -> None:
  # each row's 16 partial sums are one vector and W's 4 rows four vector loads a trip (x's lanes shared): a run of x's
  # loads first grouped one lane of each row instead, gathering W down its columns (all scalar)
  rng = np.random.default_rng(12)
  ast = kernel_of(Tensor(rng.standard_normal((1, 64)).astype(np.float32)) @
                  Tensor(rng.standard_normal((32, 64)).astype(np.float32)).T)
  dev = device("C")
  opts = hand_coded_opts(ast, dev.renderer)
  assert opts[0] == Opt("UPCAST_STRIDED", opts[0].axis, 4)
  src = get_program(ast, dev.renderer, "", opts).src
  width = dev.renderer.simd_width
  assert src.count(f"ember_float32x{width} acc") == 4 and src.count(f"ember_float32x{width} val") == 5

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("rows,cols", [(12, 80), (10, 96), (11, 70)])
def test_row_reductions_rows_apart_match_numpy(kind: str, rows: int, cols: int) -> None:
  # rows of 4+ vectors reduced 4 (2) at a time, a quarter (half) of the rows apart: maxima keep NaN, infinities and
  # signed zeros per row, sums their partial sums (equal bits with the rows one at a time); 11 rows: one at a time
  x = _specials(np.float32, rows, cols, seed=5)
  y = np.random.default_rng(6).standard_normal((rows, cols)).astype(np.float32)
  outs = []
  for t, a, want in ((Tensor(x).max(axis=1), x, x.max(axis=1)), (Tensor(y).sum(axis=1), y, y.sum(axis=1))):
    ast = kernel_of(t)
    opts = hand_coded_opts(ast, device(kind).renderer)
    assert [o.amt for o in opts if o.op == "UPCAST_STRIDED"] == ([4] if rows % 4 == 0 else [2] if rows % 2 == 0 else [])
    got = run_kernel(kind, ast, {1: a.reshape(-1)})[0]
    np.testing.assert_array_equal(got, run_kernel(kind, ast, {1: a.reshape(-1)},
                                                  [o for o in opts if o.op != "UPCAST_STRIDED"])[0])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    outs.append(got)
  m = outs[0]
  assert np.signbit(m[4]) and np.isnan(m[1]) and np.isnan(m[7]) and m[2] == -np.inf and m[3] == np.inf
