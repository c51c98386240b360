"""A JIT'd MLP train step and a JIT'd transformer block compile once: over 10 steps with new data every step, the
compiled-kernel cache stays flat after the capture and every replay launches the same kernels; the results stay
those of the un-jitted computation (numpy as the oracle for the block, the loss going down for the step)."""
from __future__ import annotations
import numpy as np
from ember import GlobalCounters, Tensor, TinyJit
from ember.engine import realize as engine
from ember.nn import LayerNorm, Linear
from ember.nn.optim import Adam, jit_train_step
from ember.nn.state import get_parameters

class MLP:
  def __init__(self) -> None: self.l1, self.l2, self.l3 = Linear(64, 48), Linear(48, 32), Linear(32, 10)
  def __call__(self, x: Tensor) -> Tensor: return self.l3(self.l2(self.l1(x).relu()).relu())

def _flat_over_ten_steps(step, batches) -> list[float]:  # type: ignore[no-untyped-def]
  """Runs `step` on each batch; from the third step on (captured on the second) the kernel cache does not grow and
  each replay launches the captured kernels only. Returns each step's output as a numpy copy (a replay writes the
  same output buffer again)."""
  outs, cache, per_step = [], None, None
  for i, args in enumerate(batches):
    GlobalCounters.reset()
    out = step(*args)
    outs.append(out.numpy().copy())
    if i == 2: cache, per_step = len(engine._runner_cache), GlobalCounters.kernel_count
    if i > 2:
      assert len(engine._runner_cache) == cache, f"step {i} compiled new kernels"
      assert GlobalCounters.kernel_count == per_step == len(step.captured)
  return outs

def test_mlp_train_step_compiles_once() -> None:
  rng = np.random.default_rng(0)
  model = MLP()
  step = jit_train_step(model, Adam(get_parameters(model), lr=3e-3))
  x = rng.standard_normal((32, 64)).astype(np.float32)
  y = rng.integers(0, 10, 32).astype(np.int32)
  batches = [(Tensor(x + 0.01 * k).realize(), Tensor(y).realize()) for k in range(10)]
  losses = [float(out) for out in _flat_over_ten_steps(step, batches)]
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]  # it is still training, on fresh data each step

def test_transformer_block_compiles_once() -> None:
  rng = np.random.default_rng(1)
  seq, dim, heads = 16, 32, 4
  qkv, proj, up, down = Linear(dim, 3 * dim), Linear(dim, dim), Linear(dim, 4 * dim), Linear(4 * dim, dim)
  norm1, norm2 = LayerNorm(dim), LayerNorm(dim)
  def block(x: Tensor) -> Tensor:
    q, k, v = qkv(norm1(x)).reshape(seq, 3, heads, dim // heads).permute(1, 2, 0, 3)
    att = q.scaled_dot_product_attention(k, v, is_causal=True).permute(1, 0, 2).reshape(seq, dim)
    x = x + proj(att)
    return (x + down(up(norm2(x)).gelu())).realize()
  jitted = TinyJit(block)
  inputs = [rng.standard_normal((seq, dim)).astype(np.float32) for _ in range(10)]
  outs = _flat_over_ten_steps(jitted, [(Tensor(a).realize(),) for a in inputs])
  for a, out in zip(inputs[-3:], outs[-3:]):  # replays agree with the block run eagerly on the same input
    np.testing.assert_allclose(out, block(Tensor(a)).numpy(), rtol=1e-4, atol=1e-4)
