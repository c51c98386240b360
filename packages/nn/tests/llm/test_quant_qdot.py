"""The decode matvec of kept-quantised weights on QDOT (QuantWeight.qdot): the activation quantiser against a numpy
oracle of its arithmetic, QuantWeight.matmul's decode path against numpy (the dequantised matrix times the quantised
activations, and times the float activations within the quantisation error) for Q4_0, Q4_1, Q4_K and Q8_0 on the CPU
and PYTHON devices, and which types and devices use it."""
from __future__ import annotations
import numpy as np
import pytest
from typing import Iterator
from ember import Context, GlobalCounters, Tensor
from ember.nn.gguf import BLOCK_LAYOUT, GGMLType
from ember.nn.llm.quant import ACT_PLANES, DENSE_ROWS, QuantWeight, block_codes, quantise_activations
from ember.plugin import Ops, QDOT_PLANE

@pytest.fixture(autouse=True)
def qdot_on() -> Iterator[None]:
  with Context(QDOT=1): yield

SCALE_BYTES = {GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q8_0: (0,), GGMLType.Q4_K: (0, 2),
               GGMLType.Q5_0: (0,)}

def random_blocks(gtype: GGMLType, shape: tuple[int, int], seed: int) -> np.ndarray:
  """Random well-formed blocks of `gtype` for a (rows, cols) matrix: random codes, float16 scales ~0.01."""
  rng = np.random.default_rng(seed)
  per_block, block_bytes = BLOCK_LAYOUT[gtype]
  blocks = rng.integers(0, 256, (shape[0] * shape[1] // per_block, block_bytes), dtype=np.uint8)
  for at in SCALE_BYTES[gtype]:
    blocks[:, at:at + 2] = rng.uniform(0.001, 0.02, len(blocks)).astype(np.float16).view(np.uint8).reshape(-1, 2)
  return blocks

def dequantised(gtype: GGMLType, raw: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
  codes, scale, offset = block_codes(gtype, raw, shape)
  group = scale.shape[-1]
  s = np.repeat(scale, 32 // group, axis=-1)
  w = s * (codes.astype(np.float64) - offset) if isinstance(offset, int) else \
    s * codes + np.repeat(offset, 32 // group, axis=-1)
  return w.reshape(shape)

def quantise_oracle(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The quantiser's arithmetic in float32: q (T, blocks, ACT_PLANES, 32) int8, d and s (T, blocks)."""
  xb = x.reshape(x.shape[0], -1, 32).astype(np.float32)
  amax = np.abs(xb).max(-1, keepdims=True)
  with np.errstate(divide="ignore"): inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0))
  away = lambda t: np.trunc(np.where(t < 0, t - np.float32(0.5), t + np.float32(0.5)))  # noqa: E731
  rest, planes = xb * inv, []
  for p in range(ACT_PLANES):
    if p: rest = (rest - planes[-1]) * np.float32(QDOT_PLANE)
    planes.append(away(rest))
  d = (amax / np.float32(127))[..., 0]
  value = sum(q / np.float32(QDOT_PLANE ** p) for p, q in enumerate(planes))
  return np.stack(planes, axis=2).astype(np.int8), d, d * value.sum(-1, dtype=np.float32)

def dequantise(q: np.ndarray, d: np.ndarray) -> np.ndarray:
  """(T, blocks, planes, 32) codes and (T, blocks) scales -> (T, blocks * 32) float64 activations."""
  value = sum(q[:, :, p].astype(np.float64) / float(QDOT_PLANE) ** p for p in range(q.shape[2]))
  return (d[..., None] * value).reshape(q.shape[0], -1)

def activations(T: int, n: int, seed: int) -> np.ndarray:
  x = np.random.default_rng(seed).standard_normal((T, n)).astype(np.float32)
  x[:, 5] *= 40  # an outlier, as LLM activations have
  x[0, 64:96] = 0  # an all-zero block
  return x

@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_quantise_activations_match_numpy(device: str) -> None:
  x = activations(3, 160, 0)
  x[1, 32:64] = np.arange(32) - 15.5  # exact halves of the scale: the rounding of ties
  q, d, s = (t.numpy() for t in quantise_activations(Tensor(x, device=device)))
  want_q, want_d, want_s = quantise_oracle(x)
  np.testing.assert_array_equal(q.reshape(want_q.shape), want_q)
  np.testing.assert_allclose(d, want_d, rtol=1e-7)
  # the float32 sum of 32 values of 24 significant bits each rounds: within a few units of its last place
  assert np.all(np.abs(s - want_s) <= 2.0 ** -20 * 32 * np.abs(x.reshape(3, 5, 32)).max(-1))
  # each plane after the first divides the error by 254: half a unit of the last plane, plus float32's rounding of
  # x / d (at most 127 units, 2**-24 relative)
  error = np.abs(dequantise(want_q, want_d) - x).reshape(3, 5, 32).max(-1)
  assert np.all(error <= want_d * (0.5 / QDOT_PLANE ** (ACT_PLANES - 1) + 127 * 2.0 ** -23))

@pytest.mark.parametrize("gtype", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K, GGMLType.Q8_0], ids=lambda g: g.name)
@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_decode_matmul_matches_numpy(gtype: GGMLType, device: str) -> None:
  in_dim = 256 if gtype is GGMLType.Q4_K else 160
  for out_dim, T, seed in ((37, 1, 1), (67, 3, 2)):
    raw = random_blocks(gtype, (out_dim, in_dim), seed)
    w = QuantWeight(gtype, raw, (out_dim, in_dim), device)
    assert w.qdot_ok()
    x = activations(T, in_dim, seed)
    y = w.matmul(Tensor(x, device=device))
    assert any(n.op is Ops.CUSTOM_KERNEL and n.arg.ast.arg.name.startswith("qdot") for n in y.uop.toposort())
    W = dequantised(gtype, raw, (out_dim, in_dim))
    q, d, _ = quantise_oracle(x)
    x_deq = dequantise(q, d)
    got, exact = y.numpy(), x_deq @ W.T
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * np.abs(W).sum(1).max() * np.abs(x_deq).max())
    bound = np.abs(W) @ np.abs(x - x_deq).T  # what quantising the activations may move each output by
    assert np.all(np.abs(got - x @ W.T.astype(np.float64)) <= bound.T + 1e-4 * np.abs(exact).max())

def test_qdot_only_where_it_applies() -> None:
  """5-bit codes, prefill-sized matmuls and QDOT=0 keep the float path."""
  q5 = QuantWeight(GGMLType.Q5_0, random_blocks(GGMLType.Q5_0, (8, 64), 3), (8, 64), None)
  assert not q5.qdot_ok()
  with Context(QDOT=0):
    assert not QuantWeight(GGMLType.Q4_1, random_blocks(GGMLType.Q4_1, (8, 64), 4), (8, 64), None).qdot_ok()
  q4 = QuantWeight(GGMLType.Q4_1, random_blocks(GGMLType.Q4_1, (8, 64), 4), (8, 64), None)
  prefill = q4.matmul(Tensor(activations(DENSE_ROWS, 64, 5)))
  assert not any(n.op is Ops.CUSTOM_KERNEL for n in prefill.uop.toposort())

@pytest.mark.parametrize("T", [2, DENSE_ROWS])
def test_norm_weight_and_residual_fused(T: int) -> None:
  """matmul(x, scale, add) = (x * scale) @ W.T + add: on QDOT the scale is applied by the quantiser and the residual
  added by the QDOT kernel (no kernels of their own); prefill-sized, by the dense path."""
  raw = random_blocks(GGMLType.Q4_1, (48, 96), 6)
  w = QuantWeight(GGMLType.Q4_1, raw, (48, 96), None)
  x, g = activations(T, 96, 7), np.random.default_rng(8).uniform(0.5, 2, 96).astype(np.float32)
  add = np.random.default_rng(9).standard_normal((T, 48)).astype(np.float32)
  inputs = [Tensor(a).realize() for a in (x, g, add)]
  GlobalCounters.reset()
  y = w.matmul(*inputs).realize()
  if T < DENSE_ROWS: assert GlobalCounters.kernel_count == 2  # the quantiser and the QDOT kernel only
  W = dequantised(GGMLType.Q4_1, raw, (48, 96))
  x_used = dequantise(*quantise_oracle(x * g)[:2]) if T < DENSE_ROWS else (x * g).astype(np.float64)
  np.testing.assert_allclose(y.numpy(), x_used @ W.T + add, rtol=1e-5, atol=1e-5 * np.abs(W).sum(1).max() * 3)
