"""Tensor.custom_kernel on the default device and on PYTHON: behaviours 29 and 31 of the seeds, the examples/ kernels
(softmax, tiled matmul with LOCAL and REG buffers, attention, custom gradients) against numpy and torch, and errors."""
from __future__ import annotations
from pathlib import Path
from types import ModuleType
import numpy as np
import pytest
import ember
from ember import Device, GlobalCounters, Tensor, UOp, dtypes
from ember.errors import CompileError, DeviceError, DTypeError, GradientError, ShapeError
from ember.testing.custom_kernels import load_example
from ember.uop.ops import AddrSpace, AxisType

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DEVICES = sorted({Device.DEFAULT, "PYTHON"})

def example(name: str) -> ModuleType:
  if not (EXAMPLES / f"{name}.py").is_file():
    pytest.skip(f"{EXAMPLES / name}.py is absent (examples/ lives at the repository root)")
  return load_example(EXAMPLES, name)

def add_one_kernel(out: UOp, x: UOp) -> UOp:
  i = UOp.range(x.shape[0], 0, AxisType.GLOBAL)
  return out[i].store(x[i] + 1).end(i).sink()

def rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

# ** the seeds' behaviours **

@pytest.mark.parametrize("device", DEVICES)
def test_duplicate_arguments_are_one_buffer(device):  # behaviour 29
  x = Tensor.arange(4, device=device).realize()
  assert Tensor.custom_kernel(x, x, fxn=add_one_kernel)[0].tolist() == [1, 2, 3, 4]

# view of the input -> the most kernels the seeds allow (its copy into a buffer, the custom kernel)
MOPS = {"reshape": (lambda x: x.reshape(16, 2), 2), "permute": (lambda x: x.reshape(4, 8).T, 3),
        "double_permute": (lambda x: x.reshape(4, 8).T.T, 3), "shrink": (lambda x: x[:4], 2),
        "pad": (lambda x: x[:4].pad(((0, 4),)), 2), "flip": (lambda x: x.flip(0), 2),
        "offset_shrink": (lambda x: x[4:8], 2), "2d_shrink": (lambda x: x.reshape(4, 8)[:, 2:6], 3),
        "expand": (lambda x: x.reshape(16, 2)[:, :1].expand(16, 2), 3)}

def _add_one_nd(out: UOp, x: UOp) -> UOp:
  rngs = [UOp.range(s, i, AxisType.GLOBAL) for i, s in enumerate(x.shape)]
  return out[*rngs].store(x[*rngs] + 1).end(*reversed(rngs)).sink()

@pytest.mark.parametrize("name", list(MOPS))
def test_view_inputs_run_within_the_kernel_budget(name):  # behaviour 31
  mop, budget = MOPS[name]
  x = mop(Tensor.arange(32).clone().realize())
  y = Tensor.custom_kernel(Tensor.empty(*x.shape, dtype=x.dtype), x, fxn=_add_one_nd)[0]
  GlobalCounters.reset()
  y.realize()
  assert GlobalCounters.kernel_count <= budget
  assert y.tolist() == (x + 1).tolist()
  # the same inside @function(precompile=True): the view is of the function's argument
  x0 = Tensor.arange(32).clone().realize()
  @ember.function(precompile=True)
  def run(a: Tensor) -> Tensor:
    xv = mop(a)
    return Tensor.custom_kernel(Tensor.empty(*xv.shape, dtype=xv.dtype, device=a.device), xv, fxn=_add_one_nd)[0]
  GlobalCounters.reset()
  out = run(x0).realize()
  assert GlobalCounters.kernel_count <= budget
  assert out.tolist() == (mop(x0) + 1).tolist()

def _fragment_kernel(owner):
  """A kernel over a (64, 8) output: 8 LOCAL threads, each holding an (8, 8) REG fragment of the (64, 8) tile (thread
  ty owns rows owner(ty, ir)); every thread writes its rows' flat indices into its fragment, then the tile out."""
  def kernel(c: UOp) -> UOp:
    ty = UOp.range(8, 0, AxisType.LOCAL)
    ir, j = UOp.range(8, 1, AxisType.LOOP), UOp.range(8, 2, AxisType.LOOP)
    ir2, j2 = UOp.range(8, 3, AxisType.LOOP), UOp.range(8, 4, AxisType.LOOP)
    frag = UOp.placeholder((8, 8), dtypes.float32, 0, AddrSpace.REG).unshard((0,), (ty,))
    row, row2 = owner(ty, ir), owner(ty, ir2)
    fill = frag[row, j].store((row * 8 + j).cast(dtypes.float32)).end(j, ir)
    return c[row2, j2].store(frag.after(fill)[row2, j2]).end(j2, ir2).end(ty).sink()
  return kernel

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("owner", [lambda ty, ir: ty * 8 + ir, lambda ty, ir: ty + ir * 8],
                         ids=["contiguous", "strided"])
def test_fragment_indexing(device, owner):  # behaviour 32
  out = Tensor.custom_kernel(Tensor.empty(64, 8, device=device), fxn=_fragment_kernel(owner))[0]
  np.testing.assert_array_equal(out.numpy(), np.arange(64 * 8, dtype=np.float32).reshape(64, 8))

def test_fragment_index_that_threads_share_cannot_shard():  # behaviour 32
  with pytest.raises(RuntimeError, match="cannot shard index"):
    Tensor.custom_kernel(Tensor.empty(64, 8), fxn=_fragment_kernel(lambda ty, ir: ty + ir))

@pytest.mark.parametrize("device", DEVICES)
def test_registers_indexed_by_a_loop(device):
  def kernel(out: UOp, a: UOp) -> UOp:  # a thread's registers reversed through a REG buffer indexed by a LOOP range
    i, j, k = UOp.range(3, 0, AxisType.GLOBAL), UOp.range(4, 1, AxisType.LOOP), UOp.range(4, 2, AxisType.LOOP)
    reg = UOp.placeholder((4,), dtypes.float32, 0, AddrSpace.REG)
    fill = reg[j].store(a[i, j]).end(j)
    return out[i, k].store(reg.after(fill)[3 - k]).end(k).end(i).sink()
  a = rand(3, 4)
  got = Tensor.custom_kernel(Tensor.empty(3, 4, device=device), Tensor(a, device=device), fxn=kernel)[0].numpy()
  np.testing.assert_array_equal(got, a[:, ::-1])

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lanes", [1, 4])
def test_reduction_that_stores_each_element_it_sums(device, lanes):
  # out[r, j] = exp(x[r, j]) stored inside the sum's own loop (the sum reads each value after its store), then the row
  # scaled in place: the store runs in the reduction's loop, not before it (it was pulled out and left its loop open)
  def kernel(out: UOp, x: UOp) -> UOp:
    r = UOp.range(x.shape[0], 0, AxisType.GLOBAL)
    jj, lane = UOp.range(x.shape[1] // lanes, 1, AxisType.REDUCE), UOp.range(lanes, 2, AxisType.UPCAST)
    e = x[r, jj * lanes + lane].exp()
    total = e.after(out[r, jj * lanes + lane].store(e)).reduce(jj, lane)
    c = UOp.range(x.shape[1], 3)
    return out[r, c].store(out.after(total)[r, c] / total).end(c, r).sink()
  a = rand(3, 12)
  got = Tensor.custom_kernel(Tensor.empty(3, 12, device=device), Tensor(a, device=device), fxn=kernel)[0].numpy()
  np.testing.assert_allclose(got, np.exp(a) / np.exp(a).sum(1, keepdims=True), rtol=1e-5, atol=1e-7)

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grouped", [False, True])
def test_buffer_filled_then_summed_then_scaled(device, grouped):
  # fill a row (a loop that ENDs), sum it (a reduction reading the filled buffer), scale it in place in a second loop:
  # the fill and the sum run once per row, before the scaling loop (the sum reopened the fill's ended loop, and ran
  # again in each iteration of the loop that overwrites what it reads). Ordered with UOp.group or left to the reads
  def kernel(out: UOp, x: UOp) -> UOp:
    r, j = UOp.range(x.shape[0], 0, AxisType.GLOBAL), UOp.range(x.shape[1], 1, AxisType.LOOP)
    fill = out[r, j].store(x[r, j].exp()).end(j)
    j2, c = UOp.range(x.shape[1], 2, AxisType.REDUCE), UOp.range(x.shape[1], 3)
    total = out.after(fill)[r, j2].reduce(j2)
    scale = out[r, c].store(out.after(total)[r, c] / total)
    return (UOp.group(fill, scale.end(c)).end(r) if grouped else scale.end(c, r)).sink()
  a = rand(4, 10)
  got = Tensor.custom_kernel(Tensor.empty(4, 10, device=device), Tensor(a, device=device), fxn=kernel)[0].numpy()
  np.testing.assert_allclose(got, np.exp(a) / np.exp(a).sum(1, keepdims=True), rtol=1e-5, atol=1e-7)

@pytest.mark.parametrize("devices", [("PYTHON", "PYTHON:1"), (f"{Device.DEFAULT}:0", f"{Device.DEFAULT}:1")])
def test_kernel_over_sharded_tensors_runs_per_device(devices):  # behaviour 40
  def fill_two(out: UOp) -> UOp:
    i, j = UOp.range(out.shape[0], 0, AxisType.GLOBAL), UOp.range(out.shape[1], 1)
    return out[i, j].store(2.0).end(j, i).sink()
  x = Tensor.empty(8, 16).shard(devices, axis=0)
  y = Tensor.custom_kernel(x, fxn=fill_two)[0]  # each device's kernel sees its (4, 16) shard: PYTHON checks bounds
  assert y.axis == 0 and y.shape == (8, 16) and len(y.devices) == 2
  np.testing.assert_array_equal(y.numpy(), np.full((8, 16), 2.0, np.float32))
  with pytest.raises(DeviceError, match="same devices"):
    Tensor.custom_kernel(x, Tensor.empty(8, 16), fxn=add_one_kernel)

# ** the examples, against numpy and torch **

@pytest.mark.parametrize("device", DEVICES)
def test_softmax_in_one_kernel(device):
  x_np = rand(5, 48)
  x = Tensor(x_np, device=device)
  out = example("custom_softmax").custom_softmax(x)
  GlobalCounters.reset()
  got = out.numpy()
  assert GlobalCounters.kernel_count == 1
  e = np.exp(x_np - x_np.max(1, keepdims=True))
  np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)

@pytest.mark.parametrize("device", DEVICES)
def test_tiled_matmul_with_local_and_reg_buffers(device):
  mod = example("custom_matmul_tiled")
  a, b = rand(32, 16), rand(16, 16, seed=1)
  got = mod.matmul_tiled(Tensor(a, device=device), Tensor(b, device=device)).numpy()
  np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="M % 16 == N % 16"): mod.matmul_tiled(Tensor(rand(8, 8)), Tensor(rand(8, 8)))

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_torch(device, causal):
  torch = pytest.importorskip("torch")
  q, k, v = rand(2, 3, 9, 8), rand(2, 3, 9, 8, seed=1), rand(2, 3, 9, 8, seed=2)
  got = example("custom_attention").custom_attention(*(Tensor(t, device=device) for t in (q, k, v)), causal).numpy()
  ref = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), is_causal=causal)
  np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-6)

def test_custom_gradients_match_torch():
  torch = pytest.importorskip("torch")
  mod = example("custom_gradient")
  x_np, wg_np, wu_np = rand(4, 8), rand(8, 6, seed=1), rand(8, 6, seed=2)
  x = Tensor(x_np, requires_grad=True)
  y = mod.silu(x)
  (y * y).sum().backward()
  xt = torch.tensor(x_np, requires_grad=True)
  yt = torch.nn.functional.silu(xt)
  (yt * yt).sum().backward()
  np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
  # straight-through rounding: round forward, identity backward
  x = Tensor(x_np * 3, requires_grad=True)
  r = mod.ste_round(x)
  (r * Tensor(x_np)).sum().backward()
  xt = torch.tensor(x_np * 3, requires_grad=True)
  rt = xt + (torch.round(xt) - xt).detach()
  (rt * torch.from_numpy(x_np)).sum().backward()
  np.testing.assert_array_equal(r.numpy(), np.where(x_np * 3 < 0, -np.floor(-x_np * 3 + 0.5), np.floor(x_np * 3 + 0.5)))
  np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy())
  # the @function built from both: values and the gradients of every input
  ts = [Tensor(a, requires_grad=True) for a in (x_np, wg_np, wu_np)]
  tt = [torch.tensor(a, requires_grad=True) for a in (x_np, wg_np, wu_np)]
  up = tt[0] @ tt[2]
  ref = torch.nn.functional.silu(tt[0] @ tt[1]) * (up + (torch.round(up) - up).detach())
  ref.sum().backward()
  for _ in range(3):  # traced, then its forward and backward (through both kernels' gradients) replayed
    for t in ts: t.grad = None
    out = mod.swiglu(*ts)
    out.sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    for t, r in zip(ts, tt): np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-4, atol=1e-5)

def test_custom_kernel_output_feeds_later_ops_and_reads_after_the_kernel():
  x = Tensor(rand(6))
  y = Tensor.custom_kernel(Tensor.empty(6), x, fxn=add_one_kernel)[0]
  np.testing.assert_allclose((y * 2).sum().numpy(), ((x.numpy() + 1) * 2).sum(), rtol=1e-5)

def test_readme_custom_kernel_example_runs(capsys):
  readme = EXAMPLES.parent / "README.md"
  if not readme.is_file(): pytest.skip("README.md is not beside this checkout")
  import re
  blocks = [b for b in re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S) if "custom_kernel" in b]
  assert len(blocks) == 1
  exec(blocks[0], {})
  assert capsys.readouterr().out.strip() == str([v + 1 for v in (1.0, 2.0, 3.0)])

def test_custom_kernels_replay_under_tinyjit():
  softmax = example("custom_softmax").custom_softmax
  @ember.TinyJit
  def step(x: Tensor) -> Tensor: return softmax(x * 2).realize()
  for seed in range(4):
    x_np = rand(3, 32, seed=seed)
    e = np.exp(2 * x_np - (2 * x_np).max(1, keepdims=True))
    np.testing.assert_allclose(step(Tensor(x_np).realize()).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
  assert step.cnt >= 3  # replayed

# ** errors **

def test_errors_name_what_is_wrong():
  x = Tensor(rand(4))
  with pytest.raises(DTypeError, match="must return a kernel SINK"): Tensor.custom_kernel(x, fxn=lambda a: a)
  with pytest.raises(DTypeError, match="weak"): Tensor.custom_kernel(Tensor(2.0), fxn=add_one_kernel)
  with pytest.raises(ShapeError, match="at least one tensor"): Tensor.custom_kernel(fxn=add_one_kernel)
  def bad_store(out: UOp, a: UOp) -> UOp:
    i = UOp.range(4, 0, AxisType.GLOBAL)
    return out[i].store(a[i].cast(dtypes.int32)).end(i).sink()
  with pytest.raises(DTypeError, match="cast it first"):
    Tensor.custom_kernel(Tensor.empty(4), x, fxn=bad_store)[0].realize()
  with pytest.raises(GradientError, match="grad_fxn"):
    xg = Tensor(rand(4), requires_grad=True)
    Tensor.custom_kernel(Tensor.empty(4), xg, fxn=add_one_kernel)[0].sum().backward()
  def crossed(out: UOp, a: UOp) -> UOp:  # j opens inside i (the store reads it) but no END inside i closes it
    i, j = UOp.range(4, 0, AxisType.LOOP), UOp.range(4, 1, AxisType.LOOP)
    return out[i].store(a[j] + a[i]).end(i).sink()
  with pytest.raises(CompileError, match="still open"):
    Tensor.custom_kernel(Tensor.empty(4), x, fxn=crossed)[0].realize()

def test_linearizer_failures_are_compile_errors_naming_the_kernel(monkeypatch):
  # a kernel shape the hand-written linearizer mishandles surfaces as a CompileError that names the kernel and keeps
  # the cause, not as a bare IndexError from its internals
  import ember.codegen.handwritten as hw
  def broken(self: object, sink: UOp) -> list[UOp]: raise IndexError("list index out of range")
  def triple(out: UOp, x: UOp) -> UOp:  # a kernel of its own: no earlier test compiled it
    i = UOp.range(x.shape[0], 0, AxisType.GLOBAL)
    return out[i].store(x[i] * 3 - 7).end(i).sink()
  monkeypatch.setattr(hw._Linearizer, "run", broken)
  with pytest.raises(CompileError, match="triple.*IndexError") as info:
    Tensor.custom_kernel(Tensor.empty(5), Tensor(rand(5)), fxn=triple)[0].realize()
  assert isinstance(info.value.__cause__, IndexError)
