"""`ember.nn.llm.attention.decode_attention`, the decode step's fused attention kernel, against a numpy softmax over the
cached rows and the new one: GQA and MHA, head dims that 16 does not divide, one position, a few, and more than its
chunks hold in one block (several blocks per chunk, chunks with no position), float16 and float32 caches, slots masked
at different positions, and one captured step replayed at other positions."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Device, Tensor, TinyJit, Variable
from ember.plugin import LLVMRenderer
from ember.nn.llm.attention import BLOCK, CHUNKS, decode_attention, fused_decode_attention

def oracle(q: np.ndarray, cache: np.ndarray, mask: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, n: int,
           rep: int) -> np.ndarray:
  S, H, D = q.shape
  kv = cache.shape[2] // 2
  out = np.zeros((S, H, D), np.float64)
  for s in range(S):
    for h in range(H):
      g = h // rep
      keys = np.concatenate([cache[s, :n, g * D:(g + 1) * D].astype(np.float64), k_new[s, g][None]])
      values = np.concatenate([cache[s, :n, kv + g * D:kv + (g + 1) * D].astype(np.float64), v_new[s, g][None]])
      scores = keys @ q[s, h] / np.sqrt(D) + np.concatenate([mask[:n, s], [0.0]])
      e = np.exp(scores - scores.max())
      out[s, h] = e @ values / e.sum()
  return out

def inputs(S: int, n_kv: int, rep: int, D: int, C: int, dtype: type, seed: int = 0) -> tuple[np.ndarray, ...]:
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((S, n_kv * rep, D)).astype(np.float32)
  cache = (rng.standard_normal((S, C, 2 * n_kv * D)) * 2).astype(dtype)
  k_new, v_new = rng.standard_normal((2, S, n_kv, D)).astype(np.float32)
  return q, cache, k_new, v_new

def rows(k_new: np.ndarray, v_new: np.ndarray) -> np.ndarray:
  """The step's own cache rows (S, 2 * kv): keys, then values."""
  return np.concatenate([k_new.reshape(len(k_new), -1), v_new.reshape(len(v_new), -1)], axis=1)

def run(q, cache, mask, k_new, v_new, n, rep, C):
  return decode_attention(*(Tensor(a) for a in (q, cache, mask, rows(k_new, v_new))), Variable("pos", 1, C).bind(n),
                          rep).numpy()

LONG = CHUNKS * BLOCK + 45  # two blocks per chunk, the last chunks past the end

@pytest.mark.parametrize("n_kv,rep,D", [(3, 3, 64), (2, 4, 12), (4, 1, 8), (1, 5, 24)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_matches_softmax_over_cache_and_new_row(n_kv, rep, D, dtype):
  C = LONG + 3
  q, cache, k_new, v_new = inputs(1, n_kv, rep, D, C, dtype)
  mask = np.zeros((C, 1), np.float32)
  for n in (1, 2, 37, LONG):
    got = run(q, cache, mask, k_new, v_new, n, rep, C)
    np.testing.assert_allclose(got, oracle(q, cache, mask, k_new, v_new, n, rep), rtol=2e-5, atol=2e-5)

def test_slots_masked_at_their_own_positions():
  # a batched step reads the first n rows of every slot; rows at or past a slot's position are -inf in the mask
  S, C, n = 3, 300, 290
  q, cache, k_new, v_new = inputs(S, 2, 3, 16, C, np.float16, seed=1)
  positions = [290, 3, 150]
  mask = np.full((C, S), -np.inf, np.float32)
  for s, p in enumerate(positions): mask[:p, s] = 0.0
  got = run(q, cache, mask, k_new, v_new, n, 3, C)
  np.testing.assert_allclose(got, oracle(q, cache, mask, k_new, v_new, n, 3), rtol=2e-5, atol=2e-5)
  for s, p in enumerate(positions):  # the same as that slot alone over its own rows
    alone = oracle(q[s:s + 1], cache[s:s + 1], np.zeros((C, 1), np.float32), k_new[s:s + 1], v_new[s:s + 1], p, 3)
    np.testing.assert_allclose(got[s:s + 1], alone, rtol=2e-5, atol=2e-5)

def test_one_capture_serves_every_position():
  # the kernel reads the position as its Variable, valued at each launch: a TinyJit replay at other positions
  C, rep = LONG + 1, 2
  q, cache, k_new, v_new = inputs(1, 2, rep, 32, C, np.float16, seed=2)
  mask = np.zeros((C, 1), np.float32)
  step = TinyJit(lambda *a: decode_attention(*a[:4], a[4], rep).realize())
  var = Variable("pos", 1, C)
  tensors = [Tensor(a) for a in (q, cache, mask, rows(k_new, v_new))]
  for n in (5, 6, LONG, 1, LONG - 1, 17):
    got = step(*tensors, var.bind(n)).numpy()
    np.testing.assert_allclose(got, oracle(q, cache, mask, k_new, v_new, n, rep), rtol=2e-5, atol=2e-5)

def test_used_where_blocks_run_as_loops():
  renderer = Device[Device.DEFAULT].renderer
  want = not renderer.has_local and not isinstance(renderer, LLVMRenderer)
  assert fused_decode_attention(Device.DEFAULT) == want
  assert not fused_decode_attention(("CPU", "CPU"))  # a sharded tensor's devices: the unfused form

def test_three_kernels_the_queries_scaled_once():
  # the scaled queries are one kernel both hand-written kernels read (stored with .contiguous() first, they were
  # copied again into the buffer the kernels took: a fourth kernel per layer)
  C = LONG
  q, cache, k_new, v_new = inputs(1, 3, 3, 64, C, np.float16, seed=3)
  t = decode_attention(*(Tensor(a).realize() for a in (q, cache, np.zeros((C, 1), np.float32), rows(k_new, v_new))),
                       Variable("pos", 1, C).bind(40), 3)
  assert len([it for it in t.schedule() if it.kind != "copy"]) == 3
  np.testing.assert_allclose(t.numpy(), oracle(q, cache, np.zeros((C, 1), np.float32), k_new, v_new, 40, 3),
                             rtol=2e-5, atol=2e-5)
