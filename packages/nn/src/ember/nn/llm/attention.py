"""A decode step's attention over the KV cache in one hand-written kernel per layer, flash-decoding style.

`decode_attention(q, cache, mask, new, n, rep)`: S query rows (one token per slot) of n_kv * rep heads attend over the
first n cached rows of their slot (n a bound Variable: one captured program serves every position) and over their own
new key and value. The cache is blocked (`cache_shape`): each BLOCK positions hold their keys transposed (kv, BLOCK),
then their values (BLOCK, kv). The cached positions are split into CHUNKS equal chunks of whole blocks; one kernel,
its chunks split over the CPU's threads, computes for each chunk and slot:

1. per block and KV head, the scores of the group's rep query heads as BLOCK accumulators each (a vector whose lane
   w is position w) over the head dim, each key vector loaded and widened once for all of them: no horizontal sums;
   stored to a scratch row;
2. per head, the max of its scores, then their exponentials in place and their sum, BLOCK positions at a time;
3. per KV head, the weighted sum of the value rows into rep x head-dim register accumulators, each value vector
   loaded and widened once for the rep heads.

It writes each chunk's unnormalised output, max and sum; a small kernel then combines the chunks with the new
position's score (exact: each chunk's part is rescaled by exp2 of its max against the overall one). Scores are in
log2 units (the queries are scaled by log2(e) / sqrt(head_dim)), so the kernel's exponentials are exp2. Half keys
and values are widened from their bits in three integer operations (`_widened`), 2^112 too small; the queries and
the stored exponentials carry the 2^112 instead (exact: a power of two, and every product stays a normal float).

The unfused form (`LlamaLayer.decode` where blocks are hardware threads) is four kernels a layer over a cache of rows:
the scores load and widen each key row once per query head, the exponentials run over (position, head) with the
heads innermost, the weighted sum splits over the KV heads (3 heads on 2 threads: 2:1), and the keys and values
stream from memory twice.
"""
from __future__ import annotations
import math
import numpy as np
from ember import Device, Tensor, UOp, dtypes
from ember.errors import ShapeError
from ember.plugin import AddrSpace, AxisType, DType, LLVMRenderer, Ops, PtrDType

CHUNKS = 8  # chunks of the cached positions: the unit the threads split (and that the combine reads)
BLOCK = 16  # positions a cache block holds (a chunk holds whole blocks): the scores' and exponentials' vector width
LOG2E = 1 / math.log(2)
EMPTY = -1e30  # the least max of a chunk (finite: a chunk with every position masked rescales by exp2(0))
_NEG_INF_BITS = -(1 << 23)  # 0xff800000 as an int32: the bits of -inf
_HALF_BITS = 0x8fffe000 - (1 << 32)  # as an int32: float's sign bit, and a half's exponent and mantissa shifted by 13
HALF_SCALE = 2.0 ** 112  # float's exponent bias less half's: `_widened`'s halves are this much too small

def _ints(shape: tuple[int | UOp, ...]) -> tuple[int, ...]:
  """A shape of constant sizes (the cache and the step's rows are buffers of fixed size)."""
  ints = tuple(d for d in shape if isinstance(d, int))
  if len(ints) != len(shape): raise ShapeError(f"decode_attention needs constant sizes, got {shape}")
  return ints

def _widened(x: UOp, dtype: DType) -> UOp:
  """A cached element of `dtype` as float32; a half's bits sign-extended and shifted into float's places, which is the
  half's value divided by HALF_SCALE (subnormal halves included; infinities and NaNs read as 2^16 to 2^17), in three
  integer operations on a vector where the exact widening takes eleven (this kernel's main cost)."""
  if dtype is not dtypes.float16: return x.cast(dtypes.float32)
  return ((x.bitcast(dtypes.int16).cast(dtypes.int32) << 13) & _HALF_BITS).bitcast(dtypes.float32)

def _scale(dtype: DType) -> float:
  """How much too small `_widened` reads a cached element of `dtype`."""
  return HALF_SCALE if dtype is dtypes.float16 else 1.0

def _halving(op: Ops, parts: list[UOp]) -> UOp:
  """parts combined with `op` by a halving tree (parts[i] op parts[i + half]), the form vector registers combine in."""
  while len(parts) > 1:
    half = len(parts) // 2
    parts = [parts[i].maximum(parts[i + half]) if op is Ops.MAX else parts[i] + parts[i + half] for i in range(half)] \
      + parts[2 * half:]
  return parts[0]

def decode_attention_kernel(part: UOp, sc: UOp, q: UOp, cache: UOp, mask: UOp, n: UOp, rep: int) -> UOp:
  """part (CHUNKS, S, H, D + 2) <- each chunk's unnormalised output (D), max and sum of exponentials (log2 units) over
  the cached positions [0, n) of q (S, H, D) against cache (S, B, 2 * kv, BLOCK) (blocked: `cache_shape`), mask
  (B * BLOCK, S) added to the scores (0, or -inf at rows a slot does not attend to); sc (S, H, P) is scratch for the
  scores."""
  chunks, S, H, width = _ints(part.shape)
  _, B, kv2, _ = _ints(cache.shape)
  kv, hd, n_kv = kv2 // 2, width - 2, H // rep
  cdt = cache.dtype.base if isinstance(cache.dtype, PtrDType) else cache.dtype
  rows = cache.reshape(S, B, kv2 * BLOCK)  # a block: its keys (kv, BLOCK), then its values (BLOCK, kv)
  c, s = UOp.range(chunks, 0, AxisType.GLOBAL), UOp.range(S, 1)
  blocks = (n + (chunks * BLOCK - 1)) // (chunks * BLOCK)  # per chunk
  length = blocks * BLOCK
  start = c * length
  last = (n + (BLOCK - 1)) // BLOCK - 1  # the last block holding a cached row: blocks past it read it again, masked
  # 1. scores, BLOCK positions at a time: lane w of the block's key rows is position w, so each query head's scores
  # are BLOCK accumulators (a vector) over the head dim, each key vector loaded (and widened) once for the group's
  # rep query heads; the blocks in order, the KV heads innermost: the keys are read in memory order, once
  jb, g = UOp.range(blocks, 2), UOp.range(n_kv, 3)
  d, w = UOp.range(hd, 4, AxisType.REDUCE), UOp.range(BLOCK, 5, AxisType.UPCAST)
  blk = (c * blocks + jb).minimum(last)
  at = start + jb * BLOCK + w
  key = _widened(rows[s, blk, (g * hd + d) * BLOCK + w], cdt)
  # -inf at the positions at or past n (the sign of n - 1 - at spread to -inf's bits), else 0: integer operations,
  # which stay in vectors where a select would not
  past = ((n - 1 - at) >> 31 & _NEG_INF_BITS).bitcast(dtypes.float32)
  bias = mask[blk * BLOCK + w, s] * LOG2E + past
  step1 = UOp.group(*(sc[s, g * rep + r, at].store((q[s, g * rep + r, d] * key).reduce(d) + bias)
                      for r in range(rep))).end(w, g, jb)
  # 2. per head, the max of its scores (a MAX reduction: the CPU renderers make it an integer one, in vectors), then
  # the exponentials in place and their sum: BLOCK lanes (registers) over the chunk's blocks, combined by a halving tree
  stats = []
  h = UOp.range(H, 6)
  jm = UOp.range(length, 7, AxisType.REDUCE)
  top = sc.after(step1)[s, h, start + jm].reduce(jm, arg=Ops.MAX).maximum(EMPTY)
  te = UOp.placeholder((BLOCK,), dtypes.float32, 0, AddrSpace.REG)
  w0, je, we = UOp.range(BLOCK, 8, AxisType.UPCAST), UOp.range(blocks, 9), UOp.range(BLOCK, 10, AxisType.UPCAST)
  init = te[w0].store(0.0).end(w0)
  where = sc.after(step1)[s, h, start + je * BLOCK + we]
  e = (sc.after(step1)[s, h, start + je * BLOCK + we] - top).exp2()
  # stored scaled as the widened values are not: their products then stay normal floats
  summed = UOp.group(where.store(e * _scale(cdt)), te[we].store(te.after(init)[we] + e)).end(we, je)
  total = _halving(Ops.ADD, [te.after(summed)[i] for i in range(BLOCK)])
  # the registers' initial values are stored before the loops (an AFTER reached first inside a loop runs there)
  stats += [init, summed, part[c, s, h, hd].store(top), part[c, s, h, hd + 1].store(total)]
  done2 = UOp.group(*stats).end(h)
  # 3. the weighted sum of the value rows: per KV head, rep x D register accumulators (vectors over the head dim) over
  # the chunk's positions, each value vector loaded (and widened) once for the rep heads
  acc = UOp.placeholder((rep * hd,), dtypes.float32, 1, AddrSpace.REG)
  g3, z = UOp.range(n_kv, 11), UOp.range(rep * hd, 12, AxisType.UPCAST)
  init3 = acc[z].store(0.0).end(z)
  jv, wv, dv = UOp.range(blocks, 13), UOp.range(BLOCK, 14), UOp.range(hd, 15, AxisType.UPCAST)
  value = _widened(rows[s, (c * blocks + jv).minimum(last), kv * BLOCK + wv * kv + g3 * hd + dv], cdt)
  at3 = start + jv * BLOCK + wv
  weighted = UOp.group(*(acc[r * hd + dv].store(acc.after(init3)[r * hd + dv] + sc.after(done2)[s, g3 * rep + r, at3]
                                                 * value) for r in range(rep))).end(dv, wv, jv)
  d3 = UOp.range(hd, 16, AxisType.UPCAST)
  out = UOp.group(*(part[c, s, g3 * rep + r, d3].store(acc.after(weighted)[r * hd + d3]) for r in range(rep))).end(d3)
  step3 = UOp.group(init3, weighted, out).end(g3)
  return UOp.group(step1, done2, step3).end(s, c).sink()

def decode_combine_kernel(out: UOp, part: UOp, q: UOp, new: UOp, rep: int, scale: float = 1.0) -> UOp:
  """out (S, H, D) <- the chunks of `part` (decode_attention_kernel's) and the new position (q (S, H, D) scaled as the
  kernel's, `scale` too large; new (S, 2 * kv) its key and value rows) combined: each chunk's output and sum rescaled
  by exp2 of its max against the overall one."""
  chunks, S, H, width = _ints(part.shape)
  hd, kv = width - 2, _ints(new.shape)[1] // 2
  s, g, r = UOp.range(S, 0), UOp.range(H // rep, 1), UOp.range(rep, 2)
  h = g * rep + r
  dd = UOp.range(hd, 3, AxisType.REDUCE)
  score = (q[s, h, dd] * (1 / scale) * new[s, g * hd + dd]).reduce(dd)  # exact: scale is a power of two
  best = _halving(Ops.MAX, [part[c, s, h, hd] for c in range(chunks)]).maximum(score)
  weights = [(part[c, s, h, hd] - best).exp2() for c in range(chunks)]
  mine = (score - best).exp2()
  inv = (_halving(Ops.ADD, [w * part[c, s, h, hd + 1] for c, w in enumerate(weights)]) + mine).reciprocal()
  d = UOp.range(hd, 4)
  total = _halving(Ops.ADD, [w * part[c, s, h, d] for c, w in enumerate(weights)]) + mine * new[s, kv + g * hd + d]
  return out[s, h, d].store(total * inv).end(d).end(r, g, s).sink()

def decode_attention(q: Tensor, cache: Tensor, mask: Tensor, new: Tensor, n: UOp, rep: int) -> Tensor:
  """softmax(q . [cached keys, new key] / sqrt(D)) . [cached values, new value] for q (S, H, D) float32, cache (S, B,
  2 * kv, BLOCK) (`cache_shape`: blocks of BLOCK positions, keys transposed; float16 or float32) of H / rep KV heads,
  mask (B * BLOCK, S) added to the cached rows' scores, new (S, 2 * kv) float32 each slot's own key and value, over
  the first n cached rows (n a bound Variable). Returns (S, H, D) float32."""
  S, H, hd = _ints(q.shape)
  rows = _ints(cache.shape)[1] * BLOCK
  scale = _scale(cache.dtype)  # folded into the queries: the widened keys are that much too small
  scaled = q * (LOG2E / math.sqrt(hd) * scale)  # computed into a buffer of its own, which both kernels read
  part = Tensor.empty(CHUNKS, S, H, hd + 2, device=q.device)
  sc = Tensor.empty(S, H, rows + CHUNKS * BLOCK, device=q.device)
  def attention_decode(part: UOp, sc: UOp, q: UOp, cache: UOp, mask: UOp) -> UOp:
    return decode_attention_kernel(part, sc, q, cache, mask, n, rep)
  part = Tensor.custom_kernel(part, sc, scaled, cache, mask, fxn=attention_decode)[0]
  def attention_combine(out: UOp, part: UOp, q: UOp, new: UOp) -> UOp:
    return decode_combine_kernel(out, part, q, new, rep, scale)
  out = Tensor.empty(S, H, hd, device=q.device)
  return Tensor.custom_kernel(out, part, scaled, new, fxn=attention_combine)[0]

# ** the blocked cache layout **
# A cache the fused kernel reads holds each BLOCK positions as one block: their keys transposed (kv, BLOCK), so that a
# vector of BLOCK lanes holds one key element of BLOCK positions and a head's scores are BLOCK accumulators (the
# row-major keys made each score a horizontal sum of a vector, done lane by lane: two thirds of the kernel's time),
# then their values row-major (BLOCK, kv), whose weighted sum runs in vectors over the head dim.

def cache_shape(slots: int, max_context: int, kv_dim: int) -> tuple[int, int, int, int]:
  """A blocked cache layer's shape (slots, blocks, 2 * kv_dim, BLOCK): max_context rounded up to whole blocks."""
  return (slots, -(-max_context // BLOCK), 2 * kv_dim, BLOCK)

def cached_rows(cache: Tensor) -> tuple[Tensor, Tensor]:
  """The keys and values (S, blocks * BLOCK, kv) of a blocked cache layer, as views (for the kernels that read the
  cache by rows: a prefill chunk's attention)."""
  S, B, kv2, _ = _ints(cache.shape)
  kv = kv2 // 2
  flat = cache.reshape(S, B, 2, kv * BLOCK)
  keys = flat[:, :, 0].reshape(S, B, kv, BLOCK).permute(0, 1, 3, 2).reshape(S, B * BLOCK, kv)
  return keys, flat[:, :, 1].reshape(S, B * BLOCK, kv)

def store_rows(layer: np.ndarray, rows: np.ndarray, slot: int, pos: int) -> None:
  """Store `rows` (T, 2 * kv) (keys, then values) at positions pos..pos+T-1 of `slot` of a blocked cache layer held
  on the host (S, blocks, 2 * kv, BLOCK), rounded to its dtype."""
  S, B, kv2, _ = layer.shape
  kv = kv2 // 2
  flat = layer.reshape(S, B, 2, kv * BLOCK)
  at = np.arange(pos, pos + rows.shape[0])
  flat[slot, :, 0].reshape(B, kv, BLOCK)[at // BLOCK, :, at % BLOCK] = rows[:, :kv]
  flat[slot, :, 1].reshape(B, BLOCK, kv)[at // BLOCK, at % BLOCK] = rows[:, kv:]

def fused_decode_attention(device: str | tuple[str, ...]) -> bool:
  """Whether a decode step on `device` attends with `decode_attention`: where kernels run their blocks as loops (CPU's
  C renderer, PYTHON), split over the cores by chunk. Not on GPUs (8 chunks x slots x heads would be a few threads),
  nor on CPU:LLVM, whose scalar code of the kernel ran slower than the four scheduled kernels (docs/llm.md)."""
  if not isinstance(device, str): return False
  renderer = Device[device].renderer
  return not renderer.has_local and not isinstance(renderer, LLVMRenderer)
