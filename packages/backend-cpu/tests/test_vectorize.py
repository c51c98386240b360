"""The C renderer's lane groups (ember_cpu.vectorize): register blocks and upcast lanes printed as GCC vector code.

Each kernel runs twice, as the renderer prints it and with its lane groups turned off (the scalar program): the two
must agree bit for bit, and both with torch."""
from __future__ import annotations
from typing import Any, Callable
import numpy as np
import pytest
import torch
from ember import Tensor
from ember.codegen import get_program
from ember.codegen.pack import plan_packing
from ember.plugin import AxisType, Ops, UOp, dtypes
from ember.testing.programs import end, linear, param
from ember_cpu.compiler import ClangCompiler
from ember_cpu.device import CPUDevice
from ember_cpu.renderer import ClangRenderer
from cpu_kernels import BASELINES, device, np_dtype, run_spec

class ScalarClangRenderer(ClangRenderer):
  """The C renderer without lane groups: every uop one scalar line."""
  def plan_render(self, uops: list[UOp], ctx: Any) -> None: pass

def _last_kernel(t: Tensor) -> tuple[UOp, dict[int, np.ndarray]]:
  """`t`'s last reduction kernel (else its last kernel) and that kernel's input buffers by slot."""
  items = [it for it in t.schedule() if it.kind != "copy"]
  item = next((it for it in reversed(items) if any(u.op is Ops.REDUCE for u in it.ast.toposort())), items[-1])
  inputs = {}
  for slot, buf in enumerate(item.bufs[1:], start=1):
    arr = np.empty(buf.size, np_dtype(buf.dtype))
    buf.copyout(memoryview(arr).cast("B"))
    inputs[slot] = arr
  return item.ast, inputs

def _program(dev: CPUDevice, ast: UOp, inputs: dict[int, np.ndarray]) -> tuple[str, list[np.ndarray]]:
  spec = get_program(ast, dev.renderer, "")
  return spec.src, run_spec(dev, spec, inputs)

def _run(renderer: ClangRenderer, ast: UOp, inputs: dict[int, np.ndarray],
         arch: str = "") -> tuple[str, list[np.ndarray]]:
  """Codegen, compile and run `ast` as the engine does (B packed first where that pays); the main program's source
  and the buffers it writes."""
  dev = CPUDevice("CPU", renderer, ClangCompiler(arch=arch))
  if (plan := plan_packing(ast, renderer)) is None: return _program(dev, ast, inputs)
  packed = _program(dev, plan.pack, {1: inputs[plan.src_slot]})[1][0]
  return _program(dev, plan.main, {**inputs, plan.scratch_slot: packed})

def _check(t: Tensor, want: np.ndarray, vectorised: bool = True, rtol: float = 1e-4, atol: float = 1e-4) -> str:
  """Run `t`'s last kernel vectorised and scalar: the same bits, and torch's values. Returns the vector source."""
  ast, inputs = _last_kernel(t)
  src, got = _run(device("C").renderer, ast, inputs)
  scalar_src, scalar = _run(ScalarClangRenderer(), ast, inputs)
  assert ("ember_" in src) == vectorised, src
  assert "ember_float" not in scalar_src and "ember_int" not in scalar_src
  for g, s in zip(got, scalar): np.testing.assert_array_equal(g.view(np.uint8), s.view(np.uint8))
  np.testing.assert_allclose(got[0].reshape(want.shape), want, rtol=rtol, atol=atol)
  return src

def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def _t(x: np.ndarray) -> torch.Tensor: return torch.from_numpy(x)

MATMULS: dict[str, tuple[list[tuple[int, ...]], Callable[..., Any]]] = {
  "a@b 64x128x64": ([(64, 128), (128, 64)], lambda a, b: a @ b),
  "a@b 256x256x512": ([(256, 256), (256, 512)], lambda a, b: a @ b),
  "a@b odd 37x53x29 (no block: stays scalar)": ([(37, 53), (53, 29)], lambda a, b: a @ b),
  "a@b 40x70x200 (blocks of 8)": ([(40, 70), (70, 200)], lambda a, b: a @ b),
  "a@b 96x64x10 (partial sums of a column of B: stays scalar)": ([(96, 64), (64, 10)], lambda a, b: a @ b),
  "a@b.T": ([(64, 96), (80, 96)], lambda a, b: a @ b.transpose(-1, -2) if isinstance(a, Tensor) else a @ b.T),
  "a.T@b": ([(96, 64), (96, 128)], lambda a, b: a.transpose(-1, -2) @ b if isinstance(a, Tensor) else a.T @ b),
  "batched": ([(3, 32, 48), (3, 48, 64)], lambda a, b: a @ b),
  "(a@b + bias) * 0.5": ([(48, 128), (128, 96), (96,)], lambda a, b, c: (a @ b + c) * 0.5),
}

@pytest.mark.parametrize("name", list(MATMULS))
def test_matmuls_match_the_scalar_program_and_torch(name: str) -> None:
  shapes, fn = MATMULS[name]
  arrays = [_rand(*s, seed=i) for i, s in enumerate(shapes)]
  want = fn(*[_t(x) for x in arrays]).numpy()
  _check(fn(*[Tensor(x).realize() for x in arrays]), want, vectorised="stays scalar" not in name)

def test_register_block_prints_as_vectors() -> None:
  """A 4 x 64 block is 16 vector accumulators and 16 vector fmas a k step, not 256 scalar lines of each."""
  a, b = _rand(64, 128), _rand(128, 64, seed=1)
  src = _check(Tensor(a).realize() @ Tensor(b).realize(), a @ b)
  scalar_src = get_program(_last_kernel(Tensor(a) @ Tensor(b))[0], ScalarClangRenderer(), "").src
  assert "typedef float ember_float32x16" in src and src.count("ember_fma_float32x16(") >= 16
  assert "__builtin_fmaf(val" not in src and scalar_src.count("__builtin_fmaf(") >= 256
  assert src.count("\n") * 4 < scalar_src.count("\n")

def test_every_row_of_a_block_is_vectors() -> None:
  """A residual epilogue whose first lane is computed apart (its load hoisted above the loop) leaves that row's first
  vector scalar, not the whole block: the other rows keep their vector boundaries, so every fma is a vector one."""
  x, w, r1, r2 = _rand(128, 2048), _rand(2048, 512, seed=1), _rand(128, 512, seed=2), _rand(128, 512, seed=3)
  t = Tensor(r1).realize() + Tensor(r2).realize() + Tensor(x).realize() @ Tensor(w).realize()  # residuals first
  src = _check(t, r1 + r2 + x @ w, rtol=1e-3, atol=1e-3)
  assert "__builtin_fmaf(val" not in src and src.count("ember_fma_float32x16(") >= 16

def test_fused_epilogues() -> None:
  a, b, c = _rand(64, 96), _rand(96, 128, seed=1), _rand(128, seed=2)
  ta, tb, tc = Tensor(a).realize(), Tensor(b).realize(), Tensor(c).realize()
  _check((ta @ tb - tc) * tc, (a @ b - c) * c)
  _check((ta @ tb + tc).relu(), a @ b)  # the matmul: the bias and the relu are a kernel of their own
  # a cast epilogue: the half lanes stay scalar, the block's accumulators are vectors
  _check((ta @ tb).cast("float16"), (_t(a) @ _t(b)).half().numpy(), rtol=1e-3, atol=1e-3)

def test_half_and_int_inputs() -> None:
  a, b = _rand(64, 64).astype(np.float16), _rand(64, 96, seed=1).astype(np.float16)
  want = (_t(a).float() @ _t(b).float()).numpy()
  _check(Tensor(a).realize().float() @ Tensor(b).realize().float(), want, rtol=1e-3, atol=1e-3)
  rng = np.random.default_rng(3)
  ia, ib = rng.integers(-50, 50, (64, 48), dtype=np.int32), rng.integers(-50, 50, (48, 96), dtype=np.int32)
  _check(Tensor(ia).realize() @ Tensor(ib).realize(), ia @ ib, rtol=0, atol=0)

def test_float64_matmul() -> None:
  a, b = _rand(32, 40).astype(np.float64), _rand(40, 64, seed=1).astype(np.float64)
  src = _check(Tensor(a).realize() @ Tensor(b).realize(), a @ b, rtol=1e-10, atol=1e-10)
  assert "ember_fma_float64x8" in src

def _run_program(renderer: ClangRenderer, prog: list[UOp], bufs: list[np.ndarray]) -> tuple[str, list[np.ndarray]]:
  dev = device("C")
  src = renderer.render(prog, "k")
  prg = dev.runtime("k", dev.compiler.compile(src))
  handles = []
  for a in bufs:
    h = dev.allocator.alloc(a.nbytes)
    dev.allocator._copyin(h, memoryview(np.ascontiguousarray(a)).cast("B"))
    handles.append(h)
  prg(*handles, global_size=(1, 1, 1), wait=True)
  outs = []
  for a, h in zip(bufs, handles):
    out = np.empty_like(a)
    dev.allocator._copyout(memoryview(out).cast("B"), h)
    outs.append(out)
  return src, outs

def test_gated_lanes_load_under_their_gate() -> None:
  """Lanes loaded under one gate (a padded row) are one vector load under it; a gated-off row reads zeros."""
  out, x = param(0, dtypes.float32, 16 * 8), param(1, dtypes.float32, 16 * 8)
  rng = UOp.range(8, 0, AxisType.LOOP)
  gate = rng.alu(Ops.CMPLT, UOp.const(dtypes.int32, 5))
  stores = [out.index(rng * 16 + k).store(x.index(rng * 16 + k, gate).load() * 2.0 + 1.0) for k in range(16)]
  prog = linear(*stores, end(rng))
  xs, zeros = _rand(16 * 8), np.zeros(16 * 8, np.float32)
  src, got = _run_program(device("C").renderer, prog, [zeros, xs])
  assert "ember_float32x16" in src and "?" in src
  want = np.where(np.arange(16 * 8) < 16 * 5, xs * 2 + 1, np.float32(1))
  np.testing.assert_array_equal(got[0], want)
  np.testing.assert_array_equal(got[0], _run_program(ScalarClangRenderer(), prog, [zeros, xs])[1][0])

@pytest.mark.parametrize("shift", [0, 1, -1])
def test_loads_and_stores_of_one_buffer_keep_their_order(shift: int) -> None:
  """x[i + shift] = x[i] * 2 lane by lane, each load right before its store: in place (shift 0) and reading ahead
  (-1) the lanes are one vector load and one store; shift 1 reads what the lane before just wrote, so stays scalar."""
  n = 16 * 4 + 2
  buf = param(0, dtypes.float32, n)
  rng = UOp.range(4, 0, AxisType.LOOP)
  stores = [buf.index(rng * 16 + k + 1 + shift).store(buf.index(rng * 16 + k + 1).load() * 2.0) for k in range(16)]
  prog = linear(*stores, end(rng))
  xs = _rand(n)
  want = xs.copy()
  for r in range(4):
    for k in range(16):
      i = r * 16 + k + 1
      want[i + shift] = want[i] * 2
  src, got = _run_program(device("C").renderer, prog, [xs])
  np.testing.assert_array_equal(got[0], want)
  assert ("ember_float32x16" in src) == (shift != 1)

def test_a_scalar_printed_before_its_lanes_vector_keeps_it_scalar() -> None:
  """An inlined scalar that reads a lane (lane 0's load times 2) stands between that lane and the group's last lane:
  its text is printed where it stands, before the vector exists, so the loads stay scalar (it raised CompileError:
  a lane used before it appears)."""
  out, extra, x = param(0, dtypes.float32, 64), param(1, dtypes.float32, 4), param(2, dtypes.float32, 64)
  rng = UOp.range(4, 0, AxisType.LOOP)
  loads = [x.index(rng * 16 + k).load() for k in range(16)]
  early = loads[0] * 2.0  # single use: inlined into its store, printed here
  stores = [out.index(rng * 16 + k).store(loads[k] + 1.0) for k in range(16)]
  prog = linear(loads[0], early, *loads[1:], *stores, extra.index(rng).store(early), end(rng))
  xs = _rand(64)
  bufs = [np.zeros(64, np.float32), np.zeros(4, np.float32), xs]
  _, got = _run_program(device("C").renderer, prog, bufs)
  np.testing.assert_array_equal(got[0], xs + 1)
  np.testing.assert_array_equal(got[1], xs[::16] * 2)

def test_exp_polynomial_lanes() -> None:
  x = _rand(256, 64)
  _check(Tensor(x).realize().softmax(axis=1), torch.softmax(_t(x), 1).numpy(), rtol=1e-5, atol=1e-6)

@pytest.mark.parametrize("arch", BASELINES)
def test_baseline_targets_fall_back_lane_by_lane(arch: str) -> None:
  """Without AVX-512 (x86-64-v3: 256-bit fma) or without fma at all (x86-64-v2: `__builtin_fmaf` a lane), the vector
  program still compiles, and gives the host's scalar bits: an fma rounds once wherever it runs."""
  a, b = _rand(64, 128), _rand(128, 64, seed=1)
  ast, inputs = _last_kernel(Tensor(a).realize() @ Tensor(b).realize())
  src, got = _run(ClangRenderer(arch), ast, inputs, arch)
  assert "ember_fma_float32x16" in src
  np.testing.assert_array_equal(got[0], _run(ScalarClangRenderer(), ast, inputs)[1][0])

def test_vector_kernels_compile_together() -> None:
  """A batch of kernels is one translation unit: their vector typedefs repeat, their helpers are written once."""
  a, b = _rand(64, 128), _rand(128, 64, seed=1)
  renderer = device("C").renderer
  srcs = [get_program(_last_kernel(t)[0], renderer, "").src for t in
          (Tensor(a) @ Tensor(b), Tensor(a).sum(axis=1), Tensor(a).softmax(axis=1))]
  assert all("ember_float32x16" in s for s in srcs)
  assert device("C").compiler.compile_together(srcs)

def _widening_kernel(src_dt: Any, dst_dt: Any, lanes: int, n: int) -> Tensor:
  """A hand-written kernel `out[i, w] = x[i, w] * 3 + 1` cast to dst_dt, lanes w unrolled: runs of `lanes` consecutive
  narrow loads, each widened by a CAST."""
  from ember.uop.ops import KernelInfo
  rng = np.random.default_rng(4)
  info = np.iinfo(np_dtype(src_dt))
  x = Tensor(rng.integers(info.min, info.max, (n, lanes), endpoint=True).astype(np_dtype(src_dt))).realize()
  def kernel(out: UOp, x: UOp) -> UOp:
    i, w = UOp.range(n, 0, AxisType.LOOP), UOp.range(lanes, 1, AxisType.UPCAST)
    return out[i, w].store(x[i, w].cast(dst_dt) * 3 + 1).end(w, i).sink(arg=KernelInfo(name="widen"))
  return Tensor.custom_kernel(Tensor.empty(n, lanes, dtype=dst_dt), x, fxn=kernel)[0]

@pytest.mark.parametrize("src_dt", [dtypes.uint8, dtypes.int8, dtypes.uint16, dtypes.int16], ids=lambda d: d.name)
@pytest.mark.parametrize("dst_dt", [dtypes.float32, dtypes.int32, dtypes.uint32], ids=lambda d: d.name)
@pytest.mark.parametrize("lanes", [16, 8])
def test_narrow_loads_widen_as_one_vector(src_dt: Any, dst_dt: Any, lanes: int) -> None:
  """Consecutive byte (16-bit) loads feeding CASTs to 4-byte lanes are one widening vector load (a dequantising
  matvec's codes), not `lanes` scalar loads assembled into a vector: the same bits as the scalar program, and numpy's
  values, sign- or zero-extended as the source type says; on every target (the AVX-512 builtin or the stepwise
  conversion)."""
  t = _widening_kernel(src_dt, dst_dt, lanes, 5)
  ast, inputs = _last_kernel(t)
  want = (inputs[1].reshape(5, lanes).astype(np.int64) * 3 + 1).astype(np_dtype(dst_dt))
  src = _check(t, want, rtol=0, atol=0)
  assert f"ember_widen_{src_dt.name}x{lanes}(" in src and "unsigned char val" not in src, src
  for arch in BASELINES:
    got = _run(ClangRenderer(arch), ast, inputs, arch)[1][0]
    np.testing.assert_array_equal(got.view(np.uint8), _run(ScalarClangRenderer(), ast, inputs)[1][0].view(np.uint8))

def test_narrow_loads_read_elsewhere_stay_scalar() -> None:
  """A narrow load that something besides a widening CAST reads stays a scalar load (its lanes are not widened)."""
  from ember.uop.ops import KernelInfo
  x = Tensor(np.arange(64, dtype=np.uint8).reshape(4, 16)).realize()
  def kernel(out: UOp, x: UOp) -> UOp:
    i, w = UOp.range(4, 0, AxisType.LOOP), UOp.range(16, 1, AxisType.UPCAST)
    v = x[i, w].load()
    return out[i, w].store(v.cast(dtypes.int32) + (v ^ 1).cast(dtypes.int32)).end(w, i).sink(arg=KernelInfo(name="k"))
  t = Tensor.custom_kernel(Tensor.empty(4, 16, dtype=dtypes.int32), x, fxn=kernel)[0]
  want = np.arange(64).reshape(4, 16) + (np.arange(64).reshape(4, 16) ^ 1)
  src = _check(t, want.astype(np.int32), vectorised=False, rtol=0, atol=0)
  assert "ember_widen" not in src

def _half_kernel(n: int, write_back: bool) -> tuple[Tensor, np.ndarray]:
  """`out[i, w] = float(h[i, w]) * 2` over 16 unrolled lanes of half h (with `write_back`, h[i, w] = 0 after)."""
  from ember.uop.ops import KernelInfo
  h = (np.random.default_rng(5).standard_normal((n, 16)) * 1e3).astype(np.float16)
  h[0, :4] = [np.inf, -np.inf, 6e-8, -0.0]  # the widening keeps every bit pattern's value
  def kernel(out: UOp, x: UOp) -> UOp:
    i, w = UOp.range(n, 0, AxisType.LOOP), UOp.range(16, 1, AxisType.UPCAST)
    stores = [out[i, w].store(x[i, w].cast(dtypes.float32) * 2.0)]
    if write_back: stores.append(x[i, w].store(x.after(stores[0])[i, w] * 0.0))
    return UOp.group(*stores).end(w, i).sink(arg=KernelInfo(name="halves"))
  t = Tensor.custom_kernel(Tensor.empty(n, 16, dtype=dtypes.float32), Tensor(h).realize(), fxn=kernel)[0]
  return t, h.astype(np.float32) * 2

def test_half_loads_widen_as_one_vector() -> None:
  """Consecutive half loads whose bits a CAST to float widens with int ops (pm_clang) are one widening load of their
  16-bit words (decode attention's keys): the same bits as the scalar program, and numpy's values."""
  t, want = _half_kernel(3, write_back=False)
  src = _check(t, want, rtol=0, atol=0)
  assert "ember_widen_uint16x16(" in src, src

def test_half_loads_of_a_written_buffer_stay_scalar() -> None:
  """Where the kernel also writes the half buffer, its loads are not widened (the group would read the memory where
  the BITCASTs stand, not where the loads did)."""
  t, want = _half_kernel(3, write_back=True)
  ast, inputs = _last_kernel(t)
  src, got = _run(device("C").renderer, ast, inputs)
  assert "ember_widen" not in src
  np.testing.assert_array_equal(got[0].reshape(want.shape), want)
