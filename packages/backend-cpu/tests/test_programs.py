"""Loops, reductions, gates, variables and threads of hand-built linear programs, on both CPU renderers."""
from __future__ import annotations
import re
import numpy as np
import pytest
from ember.plugin import AxisType, Ops, UOp, dtypes
from cpu_kernels import RENDERERS, alu, compile_program, const, device, end, linear, param, run

def acc_of(dt, init, acc_id=0) -> UOp: return UOp(Ops.DEFINE_ACC, dt, (const(dt, init),), acc_id)
def assign(acc: UOp, value: UOp) -> UOp: return UOp(Ops.ASSIGN, acc.dtype, (acc, value))

@pytest.mark.parametrize("kind", RENDERERS)
def test_gated_load_never_touches_memory(kind: str) -> None:
  # when the gate is false the index points ~400 MB past the buffer: a load there would fault
  n, valid = 32, 20
  out, inp = param(0, dtypes.float32, n), param(1, dtypes.float32, valid)
  rng = UOp.range(n, 0, AxisType.THREAD)
  gate = rng.lt(valid)
  idx = gate.where(rng, rng + 100_000_000)
  prog = linear(out.index(rng).store(inp.index(idx, gate).load() + 1.0), end(rng))
  x = np.random.default_rng(0).normal(size=valid).astype(np.float32)
  got = run(kind, prog, [np.full(n, -7, np.float32), x])[0]
  np.testing.assert_array_equal(got, np.concatenate([x + 1, np.ones(n - valid, np.float32)]))

@pytest.mark.parametrize("kind", RENDERERS)
def test_gated_store_and_bool_buffers(kind: str) -> None:
  n = 30
  out, mask, inp = param(0, dtypes.int32, n), param(1, dtypes.bool, n), param(2, dtypes.int32, n)
  rng = UOp.range(n, 0, AxisType.LOOP)
  value = inp.index(rng).load()
  gate = mask.index(rng).load()
  prog = linear(out.index(rng, gate).store(value * 3), end(rng))
  x = np.arange(n, dtype=np.int32) - 10
  m = (np.arange(n) % 3) != 0
  got = run(kind, prog, [np.full(n, -1, np.int32), m, x])[0]
  np.testing.assert_array_equal(got, np.where(m, x * 3, -1))

def reduction(dt, op: Ops, init, rows: int, cols: int) -> list[UOp]:
  """out[r] = reduce(op, in[r, :]) with a DEFINE_ACC per row, the row loop split over threads."""
  out, inp = param(0, dt, rows), param(1, dt, rows * cols)
  r = UOp.range(rows, 0, AxisType.THREAD)
  acc = acc_of(dt, init)
  c = UOp.range(cols, 1, AxisType.REDUCE)
  x = inp.index(r * cols + c).load()
  return linear(r, acc, c, assign(acc, alu(op, acc, x)), end(c), out.index(r).store(acc), end(r))

@pytest.mark.parametrize("kind", RENDERERS)
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_sum_reduction(kind: str, threads: int) -> None:
  x = np.random.default_rng(1).normal(size=(13, 17)).astype(np.float32)
  got = run(kind, reduction(dtypes.float32, Ops.ADD, 0.0, 13, 17), [np.zeros(13, np.float32), x], threads=threads)[0]
  want = np.zeros(13, np.float32)
  for j in range(17): want += x[:, j]  # the same order of float32 additions
  np.testing.assert_array_equal(got, want)

@pytest.mark.parametrize("kind", RENDERERS)
def test_max_reduction_propagates_nan(kind: str) -> None:
  x = np.random.default_rng(2).normal(size=(6, 9)).astype(np.float32)
  x[1, 0], x[3, 8], x[4, 4] = np.nan, np.nan, np.inf
  got = run(kind, reduction(dtypes.float32, Ops.MAX, -np.inf, 6, 9), [np.zeros(6, np.float32), x])[0]
  np.testing.assert_array_equal(got, x.max(axis=1))

@pytest.mark.parametrize("kind", RENDERERS)
def test_int64_and_uint64_sums(kind: str) -> None:
  for dt, npdt in ((dtypes.int64, np.int64), (dtypes.uint64, np.uint64)):
    x = np.random.default_rng(3).integers(0, 2 ** 62, (4, 8), dtype=np.int64).astype(npdt)
    got = run(kind, reduction(dt, Ops.ADD, 0, 4, 8), [np.zeros(4, npdt), x])[0]
    with np.errstate(over="ignore"):
      np.testing.assert_array_equal(got, x.sum(axis=1, dtype=npdt))

@pytest.mark.parametrize("kind", RENDERERS)
def test_accumulator_read_before_assign(kind: str) -> None:
  # an exclusive prefix sum: the value read before the ASSIGN is stored after it, so it must not be re-read there
  n = 12
  out, inp = param(0, dtypes.int32, n), param(1, dtypes.int32, n)
  acc = acc_of(dtypes.int32, 0)
  rng = UOp.range(n, 0, AxisType.LOOP)
  before = acc * 1
  x = inp.index(rng).load()
  prog = linear(acc, rng, before, x, assign(acc, acc + x), out.index(rng).store(before), end(rng))
  values = np.arange(1, n + 1, dtype=np.int32)
  got = run(kind, prog, [np.zeros(n, np.int32), values])[0]
  np.testing.assert_array_equal(got, np.cumsum(values) - values)

@pytest.mark.parametrize("kind", RENDERERS)
def test_variables_int32_and_int64(kind: str) -> None:
  n_max = 16
  out, inp = param(0, dtypes.int64, n_max), param(1, dtypes.int64, n_max)
  n = UOp.variable("n", 1, n_max)
  big = UOp.variable("big", 0, 2 ** 62, dtypes.int64)
  rng = UOp.range(n, 0, AxisType.THREAD)
  prog = linear(out.index(rng).store(inp.index(rng).load() + big + rng.cast(dtypes.int64)), end(rng))
  x = np.arange(n_max, dtype=np.int64) * 1000
  for threads in (1, 3):
    got = run(kind, prog, [np.full(n_max, -1, np.int64), x], vals=(11, 2 ** 40 + 5), threads=threads)[0]
    want = np.full(n_max, -1, np.int64)
    want[:11] = x[:11] + 2 ** 40 + 5 + np.arange(11)
    np.testing.assert_array_equal(got, want)

@pytest.mark.parametrize("kind", RENDERERS)
def test_threads_agree_with_one_thread(kind: str) -> None:
  # a 2D kernel: the THREAD range over rows, a LOOP range over columns (out = a.T * 2 + b)
  rows, cols = 37, 5
  out, a, b = (param(slot, dtypes.float32, rows * cols) for slot in range(3))
  r, c = UOp.range(rows, 0, AxisType.THREAD), UOp.range(cols, 1, AxisType.LOOP)
  value = a.index(c * rows + r).load() * 2.0 + b.index(r * cols + c).load()
  prog = linear(r, c, out.index(r * cols + c).store(value), end(c), end(r))
  rng = np.random.default_rng(4)
  x, y = rng.normal(size=(cols, rows)).astype(np.float32), rng.normal(size=(rows, cols)).astype(np.float32)
  for threads in (1, 2, 3, 64):
    got = run(kind, prog, [np.zeros(rows * cols, np.float32), x.ravel(), y.ravel()], threads=threads)[0]
    np.testing.assert_array_equal(got, (x.T * np.float32(2) + y).ravel(), err_msg=f"{threads} threads")

@pytest.mark.parametrize("kind", RENDERERS)
def test_wait_returns_seconds_and_argument_count_is_checked(kind: str) -> None:
  from ember.plugin import DeviceError
  out = param(0, dtypes.int32, 4)
  rng = UOp.range(4, 0, AxisType.THREAD)
  prg = compile_program(kind, linear(out.index(rng).store(rng * 2), end(rng)))
  alloc = device(kind).allocator
  buf = alloc.alloc(16)
  elapsed = prg(buf, global_size=(2, 1, 1), wait=True)
  assert isinstance(elapsed, float) and elapsed >= 0
  assert prg(buf, global_size=(1, 1, 1)) is None
  assert list(alloc._as_buffer(buf).cast("i")) == [0, 2, 4, 6]
  with pytest.raises(DeviceError, match="takes 1 buffers"):
    prg(buf, buf)

def test_c_prints_indices_as_pointer_offsets_and_fused_mulacc() -> None:
  # ClangRenderer's own rendering rules (pm_render_clang) go before the C-style base's: `buf[x+y+c]` as `(buf+x+y)[c]`,
  # the form gcc's vectorisers need, and kernel opts' MULACC "fma" as one fused multiply-add
  n = 8
  out, inp = param(0, dtypes.float32, n * n), param(1, dtypes.float32, n * n + 1)
  r0, r1 = UOp.range(n, 0, AxisType.LOOP), UOp.range(n, 1, AxisType.LOOP)
  i = r0 * n + r1
  a, b = inp.index(i).load(), inp.index(i + 1).load()
  prog = linear(out.index(i).store(UOp(Ops.MULACC, dtypes.float32, (a, b, a), "fma")), end(r1), end(r0))
  src = device("C").renderer.render(prog, "k")
  assert re.search(r"\(data1\+[^\]]+\)\[1\]", src) and "__builtin_fmaf(" in src, src
  x = np.random.default_rng(0).integers(-64, 64, n * n + 1).astype(np.float32)  # exact products and sums
  got = run("C", prog, [np.zeros(n * n, np.float32), x])[0]
  np.testing.assert_array_equal(got, x[:-1] * x[1:] + x[:-1])

def test_masked_select_of_a_masked_value_is_not_miscompiled() -> None:
  # gcc 12.2 at -O3 with AVX2/AVX-512 vectorised t = c ? v : 0; out = c ? (t finite ? w : 0) : 0 with the wrong mask
  # (lanes where c held stored 0): max_unpool2d's gradient through isfinite lost rows. Codegen folds the inner select
  # (pm_same_condition), so the program gcc sees has none; torch as the oracle of the whole gradient
  torch = pytest.importorskip("torch")
  from ember import Tensor
  rng = np.random.default_rng(0)
  idx = np.array([[[0, 2, 5, 6, 8]], [[1, 3, 5, 7, 9]]])
  v, w = rng.standard_normal((2, 1, 5)).astype(np.float32), rng.standard_normal((2, 1, 10)).astype(np.float32)
  ve = Tensor(v, requires_grad=True, device="CPU")
  summed = Tensor.zeros(2, 1, 10, device="CPU").scatter_reduce(2, Tensor(idx.astype(np.int32), device="CPU"), ve,
                                                               "sum", include_self=False)
  (summed.isfinite().where(summed, 0) * Tensor(w, device="CPU")).sum().backward()
  vt = torch.tensor(v, requires_grad=True)
  st = torch.zeros(2, 1, 10).scatter_reduce(2, torch.tensor(idx), vt, "sum", include_self=False)
  (torch.where(st.isfinite(), st, 0) * torch.tensor(w)).sum().backward()
  assert ve.grad is not None
  np.testing.assert_allclose(ve.grad.numpy(), vt.grad.numpy(), rtol=1e-6)
