"""Checks of hand-written kernels (`Tensor.custom_kernel`) that every backend's tests run on its devices: the kernels
of the repository's examples/ (one-kernel softmax, tiled matmul with LOCAL and REG buffers, flash-style attention,
kernels with their own backward) and duplicate arguments, against numpy.

The examples live at the repository root, not in a package: a test passes the folder (found from its own file) and
skips when it is absent.
"""
from __future__ import annotations
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable
import numpy as np
from ember.dtype import dtypes
from ember.tensor import Tensor
from ember.uop.ops import AddrSpace, AxisType, UOp

EXAMPLES = ("custom_softmax", "custom_matmul_tiled", "custom_attention", "custom_gradient")

def load_example(examples_dir: Path, name: str) -> ModuleType:
  """The module examples/<name>.py (loaded once per process)."""
  key = f"ember_example_{name}"
  if key in sys.modules: return sys.modules[key]
  spec = importlib.util.spec_from_file_location(key, examples_dir / f"{name}.py")
  assert spec is not None and spec.loader is not None, f"no example {name} in {examples_dir}"
  module = importlib.util.module_from_spec(spec)
  sys.modules[key] = module
  spec.loader.exec_module(module)
  return module

def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

def _softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
  s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
  if causal: s = np.where(np.triu(np.ones(s.shape[-2:], bool), 1), -np.inf, s)
  return _softmax(s) @ v

def add_one_kernel(out: UOp, x: UOp) -> UOp:
  i = UOp.range(x.shape[0], 0, AxisType.GLOBAL)
  return out[i].store(x[i] + 1).end(i).sink()

def fragment_kernel(c: UOp) -> UOp:
  """A (64, 8) tile held as 8 LOCAL threads' (8, 8) REG fragments, thread ty owning rows ty+8*i (strided): each thread
  writes its rows' flat indices into its fragment, then the tile out (REG indexed by loops: registers in memory)."""
  ty, ir, j = UOp.range(8, 0, AxisType.LOCAL), UOp.range(8, 1, AxisType.LOOP), UOp.range(8, 2, AxisType.LOOP)
  ir2, j2 = UOp.range(8, 3, AxisType.LOOP), UOp.range(8, 4, AxisType.LOOP)
  frag = UOp.placeholder((8, 8), dtypes.float32, 0, AddrSpace.REG).unshard((0,), (ty,))
  fill = frag[ty + ir * 8, j].store(((ty + ir * 8) * 8 + j).cast(dtypes.float32)).end(j, ir)
  return c[ty + ir2 * 8, j2].store(frag.after(fill)[ty + ir2 * 8, j2]).end(j2, ir2).end(ty).sink()

def check_custom_kernels(device: str, examples_dir: Path) -> None:
  """Every example kernel on `device` matches numpy (values, and gradients where the kernel has a backward)."""
  x = Tensor.arange(4, device=device).realize()
  assert Tensor.custom_kernel(x, x, fxn=add_one_kernel)[0].tolist() == [1, 2, 3, 4]
  tile = Tensor.custom_kernel(Tensor.empty(64, 8, device=device), fxn=fragment_kernel)[0].numpy()
  np.testing.assert_array_equal(tile, np.arange(512, dtype=np.float32).reshape(64, 8))
  x_np = _rand(6, 48)
  got = load_example(examples_dir, "custom_softmax").custom_softmax(Tensor(x_np, device=device)).numpy()
  np.testing.assert_allclose(got, _softmax(x_np), rtol=1e-5, atol=1e-7)
  a, b = _rand(32, 16, seed=1), _rand(16, 32, seed=2)
  matmul = load_example(examples_dir, "custom_matmul_tiled").matmul_tiled
  np.testing.assert_allclose(matmul(Tensor(a, device=device), Tensor(b, device=device)).numpy(), a @ b, rtol=1e-5,
                             atol=1e-5)
  q, k, v = (_rand(2, 7, 8, seed=s) for s in (3, 4, 5))
  attention = load_example(examples_dir, "custom_attention").custom_attention
  for causal in (False, True):
    got = attention(*(Tensor(t, device=device) for t in (q, k, v)), causal).numpy()
    np.testing.assert_allclose(got, _attention(q, k, v, causal), rtol=1e-5, atol=1e-6)
  grads = load_example(examples_dir, "custom_gradient")
  xt = Tensor(x_np[:2, :8], device=device, requires_grad=True)
  y = grads.silu(xt)
  y.sum().backward()
  sig = 1 / (1 + np.exp(-x_np[:2, :8]))
  np.testing.assert_allclose(y.numpy(), x_np[:2, :8] * sig, rtol=1e-5, atol=1e-6)
  assert xt.grad is not None
  np.testing.assert_allclose(xt.grad.numpy(), sig * (1 + x_np[:2, :8] * (1 - sig)), rtol=1e-5, atol=1e-6)
  # swiglu, a precompiled function of both kernels: traced, then its forward and backward replayed on this device
  xs, wg, wu = x_np[:4, :8], _rand(8, 6, seed=6), _rand(8, 6, seed=7)
  gate, up = xs @ wg, xs @ wu
  s = 1 / (1 + np.exp(-gate))
  rounded = np.where(up < 0, -np.floor(-up + 0.5), np.floor(up + 0.5))
  d_gate, d_up = rounded * s * (1 + gate * (1 - s)), gate * s  # the rounding's gradient passes straight through
  want = (d_gate @ wg.T + d_up @ wu.T, xs.T @ d_gate, xs.T @ d_up)
  for _ in range(3):
    ts = [Tensor(a, device=device, requires_grad=True) for a in (xs, wg, wu)]
    out = grads.swiglu(*ts)
    out.sum().backward()
    np.testing.assert_allclose(out.numpy(), gate * s * rounded, rtol=1e-5, atol=1e-5)
    for t, w in zip(ts, want):
      assert t.grad is not None
      np.testing.assert_allclose(t.grad.numpy(), w, rtol=1e-4, atol=1e-5)

def example_kernels(examples_dir: Path) -> list[tuple[str, Callable[..., UOp], list[np.ndarray], Any]]:
  """(name, kernel builder, its buffers' initial contents by slot, the expected output of slot 0): the example kernels
  as a renderer-only harness (a host shim) runs them."""
  sm = load_example(examples_dir, "custom_softmax")
  mm = load_example(examples_dir, "custom_matmul_tiled")
  at = load_example(examples_dir, "custom_attention")
  x = _rand(6, 48)
  a, b = _rand(32, 16, seed=1), _rand(16, 32, seed=2)
  q, k, v = (_rand(3, 7, 8, seed=s) for s in (3, 4, 5))
  zeros = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
  return [("softmax", sm.softmax_kernel, [zeros(6, 48), x], _softmax(x)),
          ("matmul_tiled", mm.matmul_tiled_kernel, [zeros(32, 32), a, b], a @ b),
          ("attention", at.attention_kernel, [zeros(3, 7, 8), q, k, v], _attention(q, k, v, False)),
          ("add_one", add_one_kernel, [zeros(5), np.arange(5, dtype=np.float32)], np.arange(5) + 1.0)]

def placeholders(arrays: list[np.ndarray]) -> list[UOp]:
  """GLOBAL placeholders for float32 arrays, by slot."""
  return [UOp.placeholder(arr.shape, dtypes.float32, i) for i, arr in enumerate(arrays)]

def check_wmma(device: str) -> None:
  """A hand-written kernel of one warp matrix instruction (`UOp.wmma`, the device renderer's first tensor core): every
  lane loads its A and B elements at the instruction's layout, stores its D elements; D matches numpy."""
  from ember.codegen.tensorcore import TENSOR_CORES
  from ember.device import Device
  tc = TENSOR_CORES[Device[device].renderer.tensor_cores[0]]
  m, n, k = tc.dims
  def tile(c: UOp, a: UOp, b: UOp) -> UOp:
    lane = UOp.range(tc.threads, 0, AxisType.LOCAL)
    d = UOp.wmma(tc.name, tuple(a[tc.a(lane, e)] for e in range(tc.elements[0])),
                 tuple(b[tc.b(lane, e)] for e in range(tc.elements[1])))
    return UOp.group(*(c[tc.c(lane, e)].store(d[e].cast(c.dtype)) for e in range(tc.elements[2]))).end(lane).sink()
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  ta, tb = (Tensor(x, device=device).cast(tc.dtype_in).realize() for x in (a, b))
  got = Tensor.custom_kernel(Tensor.empty(m, n, device=device), ta, tb, fxn=tile)[0].numpy()
  np.testing.assert_allclose(got, ta.float().numpy() @ tb.float().numpy(), rtol=1e-5, atol=1e-4)
