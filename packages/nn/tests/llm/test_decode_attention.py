"""`ember.nn.llm.attention.decode_attention`, the decode step's fused attention kernel, against a numpy softmax over the
cached rows and the new one: GQA and MHA, head dims that 16 does not divide, one position, a few, and more than its
chunks hold in one block (several blocks per chunk, chunks with no position), float16 and float32 caches, slots masked
at different positions, and one captured step replayed at other positions."""
from __future__ import annotations
import numpy as np
import pytest
from ember import Device, Tensor, TinyJit, Variable
from ember.plugin import LLVMRenderer
from ember.nn.llm.attention import (BLOCK, CHUNKS, cache_shape, cached_rows, decode_attention, fused_decode_attention,
                                    store_rows)

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

def blocked(cache: np.ndarray) -> tuple[np.ndarray, int]:
  """A cache of rows (S, C, 2 * kv) in the kernel's blocked layout (S, B, 2 * kv, BLOCK), each BLOCK rows' keys
  transposed then their values, C padded with zero rows to whole blocks; and the padded row count."""
  S, C, kv2 = cache.shape
  B = -(-C // BLOCK)
  padded = np.zeros((S, B * BLOCK, kv2), cache.dtype)
  padded[:, :C] = cache
  by_block = padded.reshape(S, B, BLOCK, kv2)
  keys = by_block[..., :kv2 // 2].transpose(0, 1, 3, 2).reshape(S, B, -1)
  values = by_block[..., kv2 // 2:].reshape(S, B, -1)
  return np.concatenate([keys, values], axis=2).reshape(S, B, kv2, BLOCK), B * BLOCK

def padded_mask(mask: np.ndarray, rows: int) -> np.ndarray:
  return np.concatenate([mask, np.full((rows - len(mask), mask.shape[1]), -np.inf, np.float32)])

def run(q, cache, mask, k_new, v_new, n, rep, C):
  layout, rows_ = blocked(cache)
  return decode_attention(*(Tensor(a) for a in (q, layout, padded_mask(mask, rows_), rows(k_new, v_new))),
                          Variable("pos", 1, C).bind(n), rep).numpy()

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
  layout, padded = blocked(cache)
  tensors = [Tensor(a) for a in (q, layout, padded_mask(mask, padded), rows(k_new, v_new))]
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
  layout, padded = blocked(cache)
  mask = np.zeros((padded, 1), np.float32)
  t = decode_attention(*(Tensor(a).realize() for a in (q, layout, mask, rows(k_new, v_new))),
                       Variable("pos", 1, C).bind(40), 3)
  assert len([it for it in t.schedule() if it.kind != "copy"]) == 3
  np.testing.assert_allclose(t.numpy(), oracle(q, cache, np.zeros((C, 1), np.float32), k_new, v_new, 40, 3),
                             rtol=2e-5, atol=2e-5)

def test_half_subnormals_and_zeros_read_exactly():
  # the kernel widens halves from their bits (scaled by 2^-112, the queries by 2^112): subnormal halves, zeros and
  # negative zeros are the values the oracle reads
  C, n = 40, 37
  q, cache, k_new, v_new = inputs(1, 2, 2, 16, C, np.float16, seed=4)
  tiny = np.array([6e-8, -6e-8, 3e-6, -2e-5, 0.0, -0.0, 6.1e-5, 65504.0], np.float16)
  cache[0, ::3, ::5] = tiny[np.arange(len(cache[0, ::3, ::5].flat)) % len(tiny)].reshape(cache[0, ::3, ::5].shape)
  mask = np.zeros((C, 1), np.float32)
  got = run(q * 1e-3, cache, mask, k_new, v_new, n, 2, C)  # small queries: the huge keys do not swamp the softmax
  np.testing.assert_allclose(got, oracle(q * 1e-3, cache, mask, k_new, v_new, n, 2), rtol=2e-5, atol=2e-5)

@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_blocked_layout_stores_and_reads_rows(dtype):
  # store_rows (the host's write of new rows) and cached_rows (the views prefill reads) against the layout the kernel
  # reads, built here from its definition; a row range that crosses blocks, and one slot of two
  S, C, kv = 2, 37, 6
  rows_ = np.random.default_rng(5).standard_normal((S, C, 2 * kv)).astype(dtype)
  layer = np.zeros(cache_shape(S, C, kv), dtype)
  assert layer.shape == (S, 3, 2 * kv, BLOCK)
  store_rows(layer, rows_[0, :13], 0, 0)
  store_rows(layer, rows_[0, 13:], 0, 13)
  store_rows(layer, rows_[1], 1, 0)
  want, padded = blocked(rows_)
  np.testing.assert_array_equal(layer, want)
  keys, values = cached_rows(Tensor(layer))
  assert keys.shape == values.shape == (S, padded, kv)
  np.testing.assert_array_equal(keys.numpy()[:, :C], rows_[:, :, :kv])
  np.testing.assert_array_equal(values.numpy()[:, :C], rows_[:, :, kv:])
