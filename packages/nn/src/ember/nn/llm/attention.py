"""A decode step's attention over the KV cache in one hand-written kernel per layer, flash-decoding style.

`decode_attention(q, cache, mask, k_new, v_new, n, rep)`: S query rows (one token per slot) of n_kv * rep heads attend
over the first n cached rows of their slot (n a bound Variable: one captured program serves every position) and over
their own new key and value. The cached positions are split into CHUNKS equal chunks (each a multiple of BLOCK
positions); one kernel, its chunks split over the CPU's threads, computes for each chunk, slot and KV head:

1. the scores of the group's rep query heads, each key element loaded (and widened from float16) once for all of
   them, each dot product as `lanes` partial sums (a vector) added by a halving tree; stored to a scratch row;
2. per head, the max of its scores, then their exponentials in place and their sum, BLOCK positions at a time;
3. the weighted sum of the value rows, each value element loaded once for the rep heads, into the chunk's output rows.

It writes each chunk's unnormalised output, max and sum; a few small kernels then combine the chunks with the new
position's score (exact: each chunk's part is rescaled by exp2 of its max against the overall one). Scores are in
log2 units (the queries are scaled by log2(e) / sqrt(head_dim)), so the kernel's exponentials are exp2.

The unfused form (`LlamaLayer.decode` where blocks are hardware threads) is four kernels a layer: the scores load and
widen each key row once per query head, the exponentials run over (position, head) with the heads innermost, the
weighted sum splits over the KV heads (3 heads on 2 threads: 2:1), and the keys and values stream from memory twice.
"""
from __future__ import annotations
import math
from ember import Device, Tensor, UOp, dtypes
from ember.errors import ShapeError
from ember.plugin import AddrSpace, AxisType, LLVMRenderer, Ops

CHUNKS = 8  # chunks of the cached positions: the unit the threads split (and that the combine reads)
BLOCK = 16  # a chunk holds a multiple of this many positions: the exponentials' vector width
LOG2E = 1 / math.log(2)
EMPTY = -1e30  # a chunk's max before any score (finite: a chunk with every position masked rescales by exp2(0))

def _ints(shape: tuple[int | UOp, ...]) -> tuple[int, ...]:
  """A shape of constant sizes (the cache and the step's rows are buffers of fixed size)."""
  ints = tuple(d for d in shape if isinstance(d, int))
  if len(ints) != len(shape): raise ShapeError(f"decode_attention needs constant sizes, got {shape}")
  return ints

def _lanes(head_dim: int) -> int:
  """The partial sums of a dot product over head_dim: the largest power of two up to 16 dividing it."""
  return next(w for w in (16, 8, 4, 2, 1) if head_dim % w == 0)

def _halving(op: Ops, parts: list[UOp]) -> UOp:
  """parts combined with `op` by a halving tree (parts[i] op parts[i + half]), the form vector registers combine in."""
  while len(parts) > 1:
    half = len(parts) // 2
    parts = [parts[i].maximum(parts[i + half]) if op is Ops.MAX else parts[i] + parts[i + half] for i in range(half)] \
      + parts[2 * half:]
  return parts[0]

def decode_attention_kernel(part: UOp, sc: UOp, q: UOp, cache: UOp, mask: UOp, n: UOp, rep: int) -> UOp:
  """part (CHUNKS, S, H, D + 2) <- each chunk's unnormalised output (D), max and sum of exponentials (log2 units) over
  the cached positions [0, n) of q (S, H, D) against cache (S, C, 2 * kv) (keys, then values), mask (C, S) added to
  the scores (0, or -inf at rows a slot does not attend to); sc (S, H, P) is scratch for the scores."""
  chunks, S, H, width = _ints(part.shape)
  kv = _ints(cache.shape)[2] // 2
  hd, n_kv = width - 2, H // rep
  lanes = _lanes(hd)
  c, s = UOp.range(chunks, 0, AxisType.GLOBAL), UOp.range(S, 1)
  blocks = (n + (chunks * BLOCK - 1)) // (chunks * BLOCK)  # per chunk
  length = blocks * BLOCK
  start = c * length
  # 1. scores: position j of the chunk (clamped to a cached row; past n it scores -inf) for each KV head g's rep query
  # heads, each key element loaded (and widened) once for all of them; the KV heads innermost, so that each cached row
  # is read in order, once
  j, g = UOp.range(length, 3), UOp.range(n_kv, 2)
  at = start + j
  row = at.minimum(n - 1)
  ko = UOp.range(hd // lanes, 5, AxisType.REDUCE)
  key = [cache[s, row, g * hd + ko * lanes + w].cast(dtypes.float32) for w in range(lanes)]
  bias = mask[row, s] * LOG2E
  stores = []
  for r in range(rep):
    # lane w sums elements w, w + lanes, ...: the same arithmetic in every lane, which the compiler does in vectors
    parts = [(q[s, g * rep + r, ko * lanes + w] * key[w]).reduce(ko) for w in range(lanes)]
    stores.append(sc[s, g * rep + r, at].store((at < n).where(_halving(Ops.ADD, parts) + bias, -math.inf)))
  step1 = UOp.group(*stores).end(g, j)
  # 2. per head, the max, then the exponentials in place and their sum: BLOCK lanes (registers) over the chunk's
  # blocks, so the compiler does them in vectors, then combined by halving trees
  stats = []
  g = UOp.range(n_kv, 4)
  for r in range(rep):
    h = g * rep + r
    tm = UOp.placeholder((BLOCK,), dtypes.float32, 2 * r, AddrSpace.REG)
    te = UOp.placeholder((BLOCK,), dtypes.float32, 2 * r + 1, AddrSpace.REG)
    w0, jm, wm = (UOp.range(BLOCK, 6 + 6 * r, AxisType.UPCAST), UOp.range(blocks, 7 + 6 * r),
                  UOp.range(BLOCK, 8 + 6 * r, AxisType.UPCAST))
    init = UOp.group(tm[w0].store(EMPTY), te[w0].store(0.0)).end(w0)
    seen = tm[wm].store(tm.after(init)[wm].maximum(sc.after(step1)[s, h, start + jm * BLOCK + wm])).end(wm, jm)
    top = _halving(Ops.MAX, [tm.after(seen)[w] for w in range(BLOCK)])
    je, we = UOp.range(blocks, 9 + 6 * r), UOp.range(BLOCK, 10 + 6 * r, AxisType.UPCAST)
    where = sc.after(seen)[s, h, start + je * BLOCK + we]
    e = (sc.after(seen)[s, h, start + je * BLOCK + we] - top).exp2()
    summed = UOp.group(where.store(e), te[we].store(te.after(init)[we] + e)).end(we, je)
    total = _halving(Ops.ADD, [te.after(summed)[w] for w in range(BLOCK)])
    # the registers' initial values are stored before the loops (an AFTER reached first inside a loop runs there)
    stats += [init, seen, summed, part[c, s, h, hd].store(top), part[c, s, h, hd + 1].store(total)]
  done2 = UOp.group(*stats).end(g)
  # 3. the weighted sum of the value rows, into the chunk's output rows (a loop over the head dim: in vectors)
  z, zh = UOp.range(hd, 6 + 6 * rep), UOp.range(H, 7 + 6 * rep)
  zero = part[c, s, zh, z].store(0.0).end(z, zh)
  j3, g, d = UOp.range(length, 8 + 6 * rep), UOp.range(n_kv, 9 + 6 * rep), UOp.range(hd, 10 + 6 * rep)
  at3 = start + j3
  value = cache[s, at3.minimum(n - 1), kv + g * hd + d].cast(dtypes.float32)
  acc = part.after(zero)
  step3 = UOp.group(*(part[c, s, g * rep + r, d].store(acc[c, s, g * rep + r, d] +
                                                       sc.after(done2)[s, g * rep + r, at3] * value)
                      for r in range(rep))).end(d, g, j3)
  return UOp.group(step1, done2, zero, step3).end(s, c).sink()

def decode_combine_kernel(out: UOp, part: UOp, q: UOp, new: UOp, rep: int) -> UOp:
  """out (S, H, D) <- the chunks of `part` (decode_attention_kernel's) and the new position (q (S, H, D) scaled as the
  kernel's, new (S, 2 * kv) its key and value rows) combined: each chunk's output and sum rescaled by exp2 of its max
  against the overall one."""
  chunks, S, H, width = _ints(part.shape)
  hd, kv = width - 2, _ints(new.shape)[1] // 2
  s, g, r = UOp.range(S, 0), UOp.range(H // rep, 1), UOp.range(rep, 2)
  h = g * rep + r
  dd = UOp.range(hd, 3, AxisType.REDUCE)
  score = (q[s, h, dd] * new[s, g * hd + dd]).reduce(dd)
  best = _halving(Ops.MAX, [part[c, s, h, hd] for c in range(chunks)]).maximum(score)
  weights = [(part[c, s, h, hd] - best).exp2() for c in range(chunks)]
  mine = (score - best).exp2()
  inv = (_halving(Ops.ADD, [w * part[c, s, h, hd + 1] for c, w in enumerate(weights)]) + mine).reciprocal()
  d = UOp.range(hd, 4)
  total = _halving(Ops.ADD, [w * part[c, s, h, d] for c, w in enumerate(weights)]) + mine * new[s, kv + g * hd + d]
  return out[s, h, d].store(total * inv).end(d).end(r, g, s).sink()

def decode_attention(q: Tensor, cache: Tensor, mask: Tensor, new: Tensor, n: UOp, rep: int) -> Tensor:
  """softmax(q . [cached keys, new key] / sqrt(D)) . [cached values, new value] for q (S, H, D) float32, cache (S, C,
  2 * kv) (keys then values of H / rep KV heads; float16 or float32), mask (C, S) added to the cached rows' scores,
  new (S, 2 * kv) float32 each slot's own key and value, over the first n cached rows (n a bound Variable). Returns
  (S, H, D) float32."""
  S, H, hd = _ints(q.shape)
  C = _ints(cache.shape)[1]
  scaled = q * (LOG2E / math.sqrt(hd))  # computed into a buffer of its own, which both kernels read
  part = Tensor.empty(CHUNKS, S, H, hd + 2, device=q.device)
  sc = Tensor.empty(S, H, C + CHUNKS * BLOCK, device=q.device)
  def attention_decode(part: UOp, sc: UOp, q: UOp, cache: UOp, mask: UOp) -> UOp:
    return decode_attention_kernel(part, sc, q, cache, mask, n, rep)
  part = Tensor.custom_kernel(part, sc, scaled, cache, mask, fxn=attention_decode)[0]
  def attention_combine(out: UOp, part: UOp, q: UOp, new: UOp) -> UOp:
    return decode_combine_kernel(out, part, q, new, rep)
  out = Tensor.empty(S, H, hd, device=q.device)
  return Tensor.custom_kernel(out, part, scaled, new, fxn=attention_combine)[0]

def fused_decode_attention(device: str | tuple[str, ...]) -> bool:
  """Whether a decode step on `device` attends with `decode_attention`: where kernels run their blocks as loops (CPU's
  C renderer, PYTHON), split over the cores by chunk. Not on GPUs (8 chunks x slots x heads would be a few threads),
  nor on CPU:LLVM, whose scalar code of the kernel ran slower than the four scheduled kernels (docs/llm.md)."""
  if not isinstance(device, str): return False
  renderer = Device[device].renderer
  return not renderer.has_local and not isinstance(renderer, LLVMRenderer)
