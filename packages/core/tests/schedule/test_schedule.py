"""The scheduler: how many kernels a graph becomes (read from `Tensor.schedule()`), that fused results are right, and
that the memory planner reuses dead intermediate buffers within one schedule."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Tensor, Variable, Device
from ember.schedule import CallKind, ScheduleItem, memory_plan
from ember.device.base import Buffer
from ember.dtype import dtypes
from ember.uop.ops import Ops

rng = np.random.default_rng(3)
def rand(*shape) -> np.ndarray: return rng.standard_normal(shape).astype(np.float32)

def kernels(*ts: Tensor) -> list[ScheduleItem]:
  sched = ts[0].schedule(*ts[1:])
  return [it for it in sched if it.kind == "kernel"]

def test_elementwise_chain_is_one_kernel():
  a, b, c = rand(4, 5), rand(4, 5), rand(4, 5)
  out = ((Tensor(a) * Tensor(b) + Tensor(c)).relu()) * 0.5
  assert len(kernels(out)) == 1
  np.testing.assert_allclose(out.numpy(), np.maximum(a * b + c, 0) * 0.5, rtol=1e-6)

def test_reduce_of_elementwise_is_one_kernel():
  x = rand(4, 6)
  out = (Tensor(x) * 2 + 1).exp().sum(1)
  assert len(kernels(out)) == 1
  np.testing.assert_allclose(out.numpy(), np.exp(x * 2 + 1).sum(1), rtol=1e-5)

def test_softmax_last_axis_is_at_most_three_kernels():
  x = rand(4, 10)
  t = Tensor(x)
  e = (t - t.max(-1, keepdim=True)).exp()
  out = e / e.sum(-1, keepdim=True)
  assert 1 <= len(kernels(out)) <= 3
  ref = np.exp(x - x.max(-1, keepdims=True))
  np.testing.assert_allclose(out.numpy(), ref / ref.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)

def test_matmul_epilogue_fuses_unless_it_selects():
  """An arithmetic epilogue (bias, scale) fuses into the matmul's kernel; one that compares or selects (relu, its
  backward mask, max) gets its own elementwise kernel so the matmul keeps codegen's register-blocked path."""
  a, b, c = rand(4, 6), rand(6, 3), rand(3)
  fused = Tensor(a) @ Tensor(b) * 2 + Tensor(c)
  assert len(kernels(fused)) == 1
  np.testing.assert_allclose(fused.numpy(), a @ b * 2 + c, rtol=1e-5, atol=1e-6)
  for out, ref in (((Tensor(a) @ Tensor(b)).relu(), np.maximum(a @ b, 0)),
                   ((Tensor(a) @ Tensor(b)).maximum(0.5), np.maximum(a @ b, 0.5)),
                   ((Tensor(a) @ Tensor(b)) * (Tensor(c) > 0), (a @ b) * (c > 0))):
    ks = kernels(out)
    assert len(ks) == 2 and not any(u.op in (Ops.WHERE, Ops.MAX, Ops.CMPLT) for u in ks[0].ast.toposort())
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)

def test_movement_ops_do_not_copy():
  x = rand(3, 4)
  out = Tensor(x).permute(1, 0).pad(((1, 1), (0, 0))).flip(0).reshape(18).shrink(((2, 14),)) + 1
  assert len(kernels(out)) == 1
  ref = np.pad(x.T, ((1, 1), (0, 0)))[::-1].reshape(18)[2:14] + 1
  np.testing.assert_allclose(out.numpy(), ref)

def test_contiguous_forces_a_buffer():
  x = rand(3, 4)
  out = (Tensor(x) * 2).contiguous() + 1
  assert len(kernels(out)) == 2
  np.testing.assert_allclose(out.numpy(), x * 2 + 1)

def test_reduce_used_twice_is_materialised_once():
  """A column statistic read twice gets a buffer (one kernel would recompute it for every row)."""
  x = rand(4, 5)
  s = Tensor(x).sum(0, keepdim=True)
  out = (Tensor(x) - s) * s
  ks = kernels(out)
  assert len(ks) == 2
  np.testing.assert_allclose(out.numpy(), (x - x.sum(0, keepdims=True)) * x.sum(0, keepdims=True), rtol=1e-5, atol=1e-5)

def _np_softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

@pytest.mark.parametrize("name, fn, ref", [
  ("row sum read twice", lambda t: (t - t.sum(-1, keepdim=True)) * t.sum(-1, keepdim=True),
   lambda x: (x - x.sum(-1, keepdims=True)) * x.sum(-1, keepdims=True)),
  ("softmax", lambda t: t.softmax(-1), _np_softmax),
  ("log_softmax", lambda t: t.log_softmax(-1), lambda x: np.log(_np_softmax(x))),
  ("layernorm", lambda t: t.layernorm(-1),
   lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)),
  ("softmax over the last two dims", lambda t: (t - t.max((-2, -1), keepdim=True)).exp(),
   lambda x: np.exp(x - x.max((-2, -1), keepdims=True))),
])
def test_row_statistics_fuse_into_the_kernel_writing_their_rows(name, fn, ref):
  """Row statistics broadcast back over the rows they reduced (softmax's max and sum, layernorm's mean and variance)
  fuse into one kernel on a device whose kernels loop over their outputs: each row is read from memory once."""
  x = rand(3, 6, 40)
  out = fn(Tensor(x))
  assert len(kernels(out)) == 1, name
  np.testing.assert_allclose(out.numpy(), ref(x), rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("name, fn", [
  ("a statistic over a leading dim", lambda t: t - t.max(0, keepdim=True)),
  ("a row longer than ROW_FUSION_MAX", lambda t: t.reshape(1, -1).pad(((0, 0), (0, 70000))).softmax(-1)),
  ("a row statistic read at another shape too", lambda t: (t - t.sum(-1, keepdim=True), t.sum(-1))),
  ("a broadcast that is not over the reduced dims", lambda t: t.sum(-1, keepdim=True).expand(3, 6, 40).permute(0, 2, 1)
   + t.permute(0, 2, 1)),
])
def test_other_statistics_keep_their_buffer(name, fn):
  x = rand(3, 6, 40)
  outs = fn(Tensor(x))
  outs = outs if isinstance(outs, tuple) else (outs,)
  assert len(kernels(*outs)) >= 2, name

def test_realized_inputs_and_constants_need_no_kernel():
  t = Tensor(rand(3))
  assert kernels(t) == []
  assert [it for it in Tensor.full((3,), 2.0).schedule() if it.kind == "kernel"] == []

def test_two_outputs_share_a_schedule():
  x = Tensor(rand(4))
  a, b = x + 1, x * 2
  ks = kernels(a, b)
  assert len(ks) == 2
  outs = {id(k.bufs[0]) for k in ks}
  assert len(outs) == 2

def test_schedule_items_name_device_and_buffers():
  a, b = rand(4, 5), rand(4, 5)
  (k,) = kernels(Tensor(a) + Tensor(b))
  assert k.device == Device.DEFAULT
  assert len(k.bufs) == 3 and k.bufs[0].size == 20 and all(isinstance(b, Buffer) for b in k.bufs)
  assert k.ast is not None and k.ast.op.name == "SINK"

def test_copy_is_a_copy_item():
  t = Tensor(rand(4)).to("PYTHON:1")
  kinds = [it.kind for it in t.schedule()]
  assert "copy" in kinds

# ** memory planner **

def _chain() -> Tensor:
  # each step is forced into its own buffer: a chain of same-size intermediates, each dead after the next step
  x = Tensor(rand(64))
  for i in range(6): x = (x * 1.5 + i).contiguous()
  return x

def test_memory_planner_reuses_dead_intermediates():
  out = _chain()
  ks = kernels(out)
  assert len(ks) == 6
  outs = [k.bufs[0] for k in ks]
  assert len({id(b) for b in outs}) < len(outs)  # some output buffer is used twice
  # a buffer is never reused while it is still read: an item's output is never one of its own inputs
  for k in ks: assert all(k.bufs[0] is not b for b in k.bufs[1:])

def test_memory_planned_chain_computes_the_right_values():
  r = np.random.default_rng(11)
  x0 = r.standard_normal(64).astype(np.float32)
  x = Tensor(x0)
  ref = x0.copy()
  for i in range(6):
    x = (x * 1.5 + i).contiguous()
    ref = ref * np.float32(1.5) + np.float32(i)
  np.testing.assert_allclose(x.numpy(), ref, rtol=1e-6)

def test_memory_plan_reuses_dead_buffers_by_size():
  dev = "PYTHON"
  a, b, c, d = (Buffer(dev, 8, dtypes.float32) for _ in range(4))
  inp = Buffer(dev, 8, dtypes.float32).ensure_allocated()
  wide = Buffer(dev, 8, dtypes.float64)
  items = [ScheduleItem(CallKind.KERNEL, dev, bufs) for bufs in ([a, inp], [b, a], [c, b], [wide, c], [d, c])]
  planned = memory_plan(items, held={id(d)})
  # a dies at item 1 so c (first written at 2) may take its memory; b is live until 2 so c cannot take b's
  assert planned[2].bufs[0] is a and planned[1].bufs[1] is a and planned[4].bufs[1] is a
  # b's block (32 bytes, free at 3) grows to hold wide (64 bytes): both become views of one arena
  nb, nw = planned[1].bufs[0], planned[3].bufs[0]
  assert nb.base is nw.base and nb.base.nbytes == 64 and (nb.size, nb.dtype, nw.size, nw.dtype) == \
    (8, dtypes.float32, 8, dtypes.float64)
  assert planned[2].bufs[1] is nb
  assert planned[4].bufs[0] is d  # held outputs keep their own buffer

def test_memory_plan_best_fit_bounds_waste():
  dev = "PYTHON"
  inp = Buffer(dev, 1, dtypes.float32).ensure_allocated()
  big, mid, tiny, small, out = (Buffer(dev, n, dtypes.float32) for n in (100, 40, 2, 30, 1))
  chain = ([big, inp], [mid, big], [tiny, mid], [small, tiny], [out, small])
  planned = memory_plan([ScheduleItem(CallKind.KERNEL, dev, bufs) for bufs in chain], held={id(out)})
  pbig, pmid, ptiny, psmall = (planned[i].bufs[0] for i in range(4))
  assert ptiny.base is not pbig.base  # 8 bytes would pin big's 400 (free since item 1) under a quarter full
  assert psmall.base is pmid.base and pmid.base.nbytes == 160  # 120 bytes: the smallest free block that fits
  assert psmall.base is not pbig.base

def test_memory_plan_never_touches_allocated_or_view_buffers():
  dev = "PYTHON"
  base = Buffer(dev, 16, dtypes.float32).ensure_allocated()
  view = base.view(8, dtypes.float32, 0)
  a = Buffer(dev, 8, dtypes.float32)
  items = [ScheduleItem(CallKind.KERNEL, dev, [a, base]), ScheduleItem(CallKind.KERNEL, dev, [view, a])]
  planned = memory_plan(items, held=set())
  assert planned[1].bufs[0] is view and planned[0].bufs[0] is a

@pytest.mark.parametrize("n", [1, 7, 64])
def test_sum_sizes(n):
  x = rand(n)
  out = Tensor(x).sum()
  assert len(kernels(out)) == 1
  np.testing.assert_allclose(out.item(), x.sum(), rtol=1e-5, atol=1e-6)

# ** symbolic shapes **

def test_symbolic_shrink_then_reduce():
  x = np.arange(10, dtype=np.float32)
  n = Variable("n", 1, 10)
  for v in (3, 7):
    t = Tensor(x).shrink(((0, n.bind(v)),)).sum()
    (k,) = kernels(t)
    assert k.var_vals == {"n": v}
    assert t.item() == x[:v].sum()

def test_symbolic_shape_times_a_scalar():
  x = np.arange(10, dtype=np.float32)
  t = (Tensor(x).shrink(((0, Variable("n", 1, 10).bind(4)),)) * 2).sum()
  assert t.item() == (x[:4] * 2).sum()

def test_reshaped_buffer_is_read_at_its_flat_index():
  # a matmul over a reshaped intermediate (conv2d's im2col matrix): a reshape keeps the element order, so the kernel
  # indexes the buffer with the flat index, not a div/mod chain that splits the row and joins the dims again
  from ember.uop.ops import Ops
  x, w = rand(4, 6, 8), rand(8, 5)
  mid = (Tensor(x) * 2).contiguous()
  out = mid.reshape(24, 8) @ Tensor(w)
  ks = kernels(out)
  assert len(ks) == 2
  splits = [n for n in ks[-1].ast.toposort() if n.op in (Ops.IDIV, Ops.MOD) and n.src[0].op is Ops.ADD and
            any(r.op is Ops.RANGE and r.arg[1].name == "REDUCE" for r in n.src[0].toposort())]
  assert not splits  # the reduce index (the row of 8) is never divided by mid's dims (6, 4)
  np.testing.assert_allclose(out.numpy(), (x * 2).reshape(24, 8) @ w, rtol=1e-5, atol=1e-5)

def test_long_full_reduction_runs_in_two_stages():
  from ember.tensor import SPLIT_REDUCE_MIN, SUM_CHUNK, SUM_CHUNK_MIN
  big = kernels(Tensor.empty(SPLIT_REDUCE_MIN * 4).sum())
  # float sums add chunks of SUM_CHUNK into partial sums, then the partials
  assert len(big) == 2 and big[0].bufs[0].size == SPLIT_REDUCE_MIN * 4 // SUM_CHUNK and big[1].bufs[0].size == 1
  assert len(kernels(Tensor.empty(2048, 2048).max())) == 2
  assert len(kernels(Tensor.empty(SUM_CHUNK_MIN).sum())) == 1  # short: one kernel
  assert len(kernels(Tensor.empty(2048, 2048).sum(1))) == 1  # a row reduction has outputs to share already

# ** memory plan properties: random schedules never alias a live buffer, and planned graphs compute numpy's values **

from hypothesis import given, settings, strategies as st  # noqa: E402

_DTYPES = (dtypes.float32, dtypes.float64, dtypes.float16, dtypes.int8, dtypes.int32)

@st.composite
def _schedules(draw):
  n = draw(st.integers(1, 12))
  inputs = [Buffer("PYTHON", draw(st.integers(1, 16)), dtypes.float32).ensure_allocated() for _ in range(2)]
  outs = [Buffer("PYTHON", draw(st.integers(0, 64)), draw(st.sampled_from(_DTYPES))) for _ in range(n)]
  reads = [draw(st.lists(st.sampled_from(inputs + outs[:i]), max_size=3)) for i in range(n)]
  held = {id(b) for b in outs if draw(st.booleans()) and draw(st.booleans())}
  return [ScheduleItem(CallKind.KERNEL, "PYTHON", [o, *r]) for o, r in zip(outs, reads)], held

@settings(max_examples=300, deadline=None)
@given(_schedules())
def test_memory_plan_never_aliases_live_buffers(sched):
  items, held = sched
  logical = [list(it.bufs) for it in items]
  planned = memory_plan([ScheduleItem(it.kind, it.device, list(it.bufs)) for it in items], held)
  # replay the plan on a byte map: each byte remembers which logical buffer last wrote it; every read must still find
  # its producer's bytes, and a kernel's output never overlaps its inputs
  owner: dict[int, dict[int, int]] = {}
  def span(b: Buffer) -> tuple[int, range]: return id(b.base), range(b.offset, b.offset + b.nbytes)
  for lg, it in zip(logical, planned):
    assert [(b.nbytes, b.dtype) for b in it.bufs] == [(b.nbytes, b.dtype) for b in lg]
    assert it.bufs[0].offset + it.bufs[0].nbytes <= it.bufs[0].base.nbytes
    out_base, out_rng = span(it.bufs[0])
    for src, phys in zip(lg[1:], it.bufs[1:]):
      base, rng = span(phys)
      if src.is_allocated: assert phys is src
      else: assert all(owner[base][k] == id(src) for k in rng), "a read found bytes another buffer overwrote"
      assert base != out_base or not set(rng) & set(out_rng), "a kernel's output overlaps one of its inputs"
    for k in out_rng: owner.setdefault(out_base, {})[k] = id(lg[0])
  for lg, it in zip(logical, planned):
    if id(lg[0]) in held: assert it.bufs[0] is lg[0]

@pytest.mark.parametrize("seed", range(4))
def test_memory_planned_graph_of_mixed_sizes_matches_numpy(seed):
  # intermediates of many sizes and dtypes share blocks (best fit and grown arenas); values must stay numpy's
  r = np.random.default_rng(seed)
  x0 = r.standard_normal(int(r.integers(8, 64))).astype(np.float32)
  x, ref = Tensor(x0, device="PYTHON"), x0.copy()
  vals, refs = [x], [ref]
  for i in range(8):
    j = int(r.integers(len(vals)))
    v, rv = vals[j], refs[j]
    op = int(r.integers(4))
    if op == 0: v, rv = (v * 1.5 + i).contiguous(), rv * np.float32(1.5) + np.float32(i)
    elif op == 1:
      k = int(r.integers(1, v.shape[0] + 1))
      v, rv = (v[:k] - 1).contiguous(), rv[:k] - np.float32(1)
    elif op == 2: v, rv = v.repeat(2).contiguous(), np.tile(rv, 2)
    else:
      v = (v.cast(dtypes.float64) * 2).contiguous().cast(dtypes.float32)
      rv = (rv.astype(np.float64) * 2).astype(np.float32)
    vals.append(v)
    refs.append(rv)
  out = Tensor.stack(*[v.sum() for v in vals[1:]])
  np.testing.assert_allclose(out.numpy(), np.array([rv.sum() for rv in refs[1:]], np.float32), rtol=1e-4, atol=1e-4)
