"""A Llama-family decoder-only transformer built from GGUF metadata and weights, with preallocated KV caches.

Per layer: x += Wo·attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x)); x += Wd·(silu(Wg·n(x)) * Wu·n(x)), n = RMSNorm.
Grouped-query attention shares each KV head between n_heads / n_kv_heads query heads.

Kernels per step are kept few: Wq|Wk|Wv is one (dim + 2·kv, dim) matmul and Wg|Wu one (2·ffn, dim) matmul; the
RMSNorm scale is applied to the matmul's output rows; RoPE is one elementwise kernel over the query and key heads
together; each layer's cache is one (max_context, 2·kv) tensor (keys then values; float16 unless
kv_dtype="float32", widened inside the attention kernels), blocked where the fused decode kernels read it (16
positions' keys transposed, then their values: `KVCache`); the residual stream is stored after each add.

Weights: by default Q4_0, Q4_1 and Q8_0 matrices stay quantised on the device (`QuantWeight`: packed quants plus
per-block scales, ~5.3 bits per weight for Q4_1 instead of 32) and are dequantised inside the matmul kernel, with the
block scale factored out of each block's dot product; every other type, or `quantized=False`, is dequantised to
float32 at load. On the 2-core development machine SmolLM2-135M (Q4_1, Q8_0 LM head) decodes 2.5x faster quantised
than with float32 weights in the same run (README, "Running a language model"); both match the golden outputs.

RoPE: llama.cpp's converter stores attn_q / attn_k with the rows of each head permuted so that rotating adjacent
pairs (x[2i], x[2i+1]) by angle pos * theta^(-2i/d) gives the same result as the original model's rotate-half RoPE;
this model applies that interleaved-pair rotation to the weights as stored.

Decode (one token at position p > 0): the step takes p as a bound `Variable`, so TinyJit captures it once and
replays it at every position; attention reads only the p cached rows (`cache[:p]`, symbolic) plus the new key and
value, one softmax over both without concatenating them, so a step costs O(p), not O(max_context): on CPU (the C
renderer) and PYTHON two hand-written kernels per layer (`ember.nn.llm.attention`), elsewhere four scheduled ones.
The step returns the new keys/values of every layer, and `KVCache.write_rows` stores them at row p on the host (a
view of the device's host memory where it has one): the captured kernels only read the cache.

Prefill (T > 1 tokens, or a first token): a chunk of T tokens runs as batched matmuls (T rows at once; quantised
matrices are dequantised once per chunk, `QuantWeight.matmul`), and attends like a decode step: over the chunk's start
cached rows (`cache[:start]`, the same bound Variable) and over its own keys under a causal mask, one softmax over
both, O(T·(start + T)) and not O(T·max_context); its new keys/values are returned and stored on the host. What depends
on the position (RoPE tables, the mask of the cached rows, which row's logits to return) is small host-built inputs,
and a prefill step per chunk size in PREFILL_BUCKETS is captured once. The cache tensors are inputs of every captured
step, so one capture serves every `KVCache` of the model (the HTTP server keeps one per request slot). Token
embeddings are gathered on the host from the GGUF bytes and dequantised by `ember.nn.gguf` inside the captured steps.
"""
from __future__ import annotations
import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence
import numpy as np
from ember import Device, Tensor, TinyJit, UOp, Variable
from ember.errors import EmberError
from ember.nn.gguf import BLOCK_LAYOUT, GGMLType, GGUFFile, dequantize, tensor_nbytes
from ember.nn.llm.quant import BLOCK, HALF, KEPT, HalfWeight, QuantWeight, stored_sum
from ember.nn.llm.attention import cache_shape, cached_rows, decode_attention, fused_decode_attention, store_rows

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
NEOX_ROPE_ARCHS = ("qwen2", "qwen3")  # rotate-half RoPE: llama.cpp's converter leaves their q/k rows as they are
PREFILL_BUCKETS = (8, 32, 128)  # prompt tokens per captured prefill step; a chunk is padded to the smallest that fits
Progress = Callable[[str, int, int], None]  # (stage, done, total): told as loading advances

def prefill_chunks(tokens: int) -> list[int]:
  """The captured step sizes a prompt of `tokens` tokens is prefilled in: full chunks of the largest bucket, then the
  smallest bucket the rest fits in."""
  big = PREFILL_BUCKETS[-1]
  return [next(b for b in PREFILL_BUCKETS if b >= min(big, tokens - at)) for at in range(0, tokens, big)]

class ModelError(EmberError, ValueError):
  """A GGUF model cannot be built: unsupported architecture, missing metadata or tensors, inconsistent shapes."""

class ContextOverflowError(EmberError, ValueError):
  """More tokens than the KV cache holds."""

@dataclass(frozen=True)
class LlamaConfig:
  n_layers: int
  dim: int
  n_heads: int
  n_kv_heads: int
  ffn_dim: int
  vocab_size: int
  rope_theta: float = 10000.0
  rms_eps: float = 1e-5
  context_length: int = 2048
  head_dim: int = 0  # 0: dim // n_heads (qwen3's attention.key_length may differ)
  arch: str = "llama"
  def __post_init__(self) -> None:
    if self.head_dim == 0: object.__setattr__(self, "head_dim", self.dim // max(self.n_heads, 1))
  @property
  def q_dim(self) -> int: return self.n_heads * self.head_dim
  @property
  def kv_dim(self) -> int: return self.n_kv_heads * self.head_dim
  @property
  def neox_rope(self) -> bool: return self.arch in NEOX_ROPE_ARCHS

  @classmethod
  def from_gguf_metadata(cls, md: dict[str, Any], vocab_size: int | None = None) -> LlamaConfig:
    arch = md.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
      raise ModelError(f"GGUF architecture {arch!r} is not supported; supported llama-family architectures: "
        f"{SUPPORTED_ARCHS}")
    def need(key: str) -> Any:
      if f"{arch}.{key}" not in md: raise ModelError(f"GGUF metadata lacks {arch}.{key}, which the {arch} model needs")
      return md[f"{arch}.{key}"]
    n_heads = int(need("attention.head_count"))
    n_tokens = len(md.get("tokenizer.ggml.tokens", []))
    vocab = vocab_size if vocab_size is not None else md.get(f"{arch}.vocab_size", n_tokens)
    cfg = cls(n_layers=int(need("block_count")), dim=int(need("embedding_length")), n_heads=n_heads,
              n_kv_heads=int(md.get(f"{arch}.attention.head_count_kv", n_heads)),
              ffn_dim=int(need("feed_forward_length")),
              vocab_size=int(vocab), rope_theta=float(md.get(f"{arch}.rope.freq_base", 10000.0)),
              rms_eps=float(md.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
              context_length=int(md.get(f"{arch}.context_length", 2048)),
              head_dim=int(md.get(f"{arch}.attention.key_length", 0)), arch=arch)
    value_dim = int(md.get(f"{arch}.attention.value_length", cfg.head_dim))
    if value_dim != cfg.head_dim:
      raise ModelError(f"attention.value_length {value_dim} != key_length {cfg.head_dim} is not supported")
    if cfg.n_heads <= 0 or cfg.n_kv_heads <= 0 or cfg.n_heads % cfg.n_kv_heads or cfg.q_dim == 0:
      raise ModelError(f"inconsistent heads: dim {cfg.dim}, {cfg.n_heads} heads of {cfg.head_dim}, {cfg.n_kv_heads} "
        f"KV heads (need heads % kv_heads == 0)")
    if cfg.head_dim % 2: raise ModelError(f"RoPE needs an even head dim, got {cfg.head_dim}")
    rope_dim = int(md.get(f"{arch}.rope.dimension_count", cfg.head_dim))
    if rope_dim != cfg.head_dim: raise ModelError(f"partial RoPE (rope.dimension_count {rope_dim} != head dim "
      f"{cfg.head_dim}) is not supported")
    return cfg

# ** weights: float32, or kept quantised and dequantised inside the matmul (ember.nn.llm.quant) **

class DenseWeight:
  """An (out, in) float32 matrix. (float16 storage converted inside the kernel was measured 13x slower than float32
  on the development machine: gcc 12 converts _Float16 one value at a time.)"""
  def __init__(self, w: np.ndarray, device: str | None):
    self.shape = tuple(w.shape)
    self.nbytes = int(w.size) * 4
    self.w = Tensor(np.ascontiguousarray(w, np.float32), device=device).realize()
  def matmul(self, x: Tensor, scale: Tensor | None = None, add: Tensor | None = None) -> Tensor:
    """(x * scale) @ W.T + add, as QuantWeight.matmul; reduces along the weight's contiguous rows."""
    return stored_sum((x if scale is None else x * scale) @ self.w.T, add)

Weight = QuantWeight | HalfWeight | DenseWeight

@dataclass(frozen=True)
class _FileBytes:
  """`nbytes` bytes at `offset` of a file, read into the process's own memory each time they are asked for
  (`np.asarray`): a page of a memory map, once touched, stays in the process's RSS while the map lives, so reading
  every weight through the GGUF's map kept the whole file resident next to the device's copy (SmolLM2's RSS after
  loading: 287 -> 223 MB)."""
  path: str
  offset: int
  nbytes: int
  def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
    return np.fromfile(self.path, np.uint8, count=self.nbytes, offset=self.offset)

class _FileRows:
  """A table of `shape[0]` rows of `shape[1]` bytes stored at `offset` of a file, whose rows are read when indexed
  (`table[ids]` -> (len(ids), shape[1]) uint8): the token embedding's rows a step gathers, without a host copy of the
  whole table (SmolLM2's Q8_0 embedding is 30 MB, already on the device as the tied LM head). The file stays open
  while the table lives, so a model keeps reading the file it loaded even when its path is replaced or deleted."""
  dtype = np.dtype(np.uint8)
  def __init__(self, path: str, offset: int, shape: tuple[int, int]):
    self.offset, self.shape = offset, shape
    self._file = open(path, "rb", buffering=0)  # closed by the finalizer below
    weakref.finalize(self, self._file.close)
  def __getitem__(self, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, np.int64).reshape(-1)
    width = self.shape[1]
    out = np.empty((ids.size, width), np.uint8)
    for row, dest in zip(ids.tolist(), out):
      self._file.seek(self.offset + row * width)
      self._file.readinto(dest.data)
    return out

@dataclass
class _Source:
  """Where a weight matrix comes from: a GGUF tensor (raw bytes + type) or a float32 array."""
  shape: tuple[int, int]
  raw: np.ndarray | _FileBytes | None = None
  ggml_type: GGMLType | None = None
  array: np.ndarray | None = None
  def dense(self) -> np.ndarray:
    if self.array is not None: return self.array
    assert self.raw is not None and self.ggml_type is not None
    return dequantize(Tensor(np.ascontiguousarray(self.raw)), self.ggml_type, self.shape).numpy()

def _fused_weight(parts: list[_Source], quantized: bool, device: str | None) -> Weight:
  """Stack matrices along the output dim into one weight: kept in the file's type when all parts share a kept one."""
  out_dim, in_dim = sum(p.shape[0] for p in parts), parts[0].shape[1]
  types = {p.ggml_type for p in parts}
  gtype = types.pop() if len(types) == 1 else None
  if quantized and gtype is not None and (gtype in HALF or (gtype in KEPT and in_dim % max(BLOCK_LAYOUT[gtype][0],
                                                                                          BLOCK) == 0)):
    raw = np.concatenate([np.asarray(p.raw).reshape(p.shape[0], -1) for p in parts], axis=0)
    return (HalfWeight if gtype in HALF else QuantWeight)(gtype, raw, (out_dim, in_dim), device)
  return DenseWeight(np.concatenate([p.dense() for p in parts], axis=0), device)

def _rope_rows(head_dim: int) -> np.ndarray:
  """The row order that turns one head's rotate-half (NEOX) layout into the interleaved-pair layout: row 2i + t of
  the result is row t * head_dim/2 + i (what llama.cpp's converter does to llama's q/k, and not to qwen's)."""
  return np.arange(head_dim).reshape(2, head_dim // 2).T.reshape(-1)

def _permute_rows(src: _Source, order: np.ndarray) -> _Source:
  """`src` with its rows (output dim, or elements of a vector) in `order`, raw bytes reordered as whole rows."""
  if src.raw is not None and src.ggml_type is not None and len(src.shape) == 2:
    return _Source(src.shape, raw=np.asarray(src.raw).reshape(src.shape[0], -1)[order], ggml_type=src.ggml_type)
  dense = src.dense()
  return _Source(src.shape, array=np.ascontiguousarray(dense.reshape(len(order), -1)[order].reshape(dense.shape)))

# ** ops composed from Tensor primitives **

def rms_scale(x: Tensor, eps: float) -> Tensor:
  """1 / rms(x) per row, (T, 1): RMSNorm(x) = x * rms_scale(x) * weight."""
  return (x.square().mean(-1, keepdim=True) + eps).rsqrt()

def silu(x: Tensor) -> Tensor: return x * x.sigmoid()

def softmax(x: Tensor, axis: int = -1) -> Tensor:
  e = (x - x.max(axis, keepdim=True)).exp()
  return e / e.sum(axis, keepdim=True)

def rope_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
  """Rotate adjacent pairs of the last dim of x (T, H, D) with cos (T, D) holding cos_i at 2i and 2i+1 and sin (T, D)
  holding -sin_i at 2i and sin_i at 2i+1: (e, o) -> (e·c - o·s, o·c + e·s), one elementwise kernel."""
  T, H, D = x.shape
  swapped = x.reshape(T, H, D // 2, 2).flip(-1).reshape(T, H, D)  # (o, e) pairs
  return x * cos.reshape(T, 1, D) + swapped * sin.reshape(T, 1, D)

def rope_tables(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
  """The (T, head_dim) cos and signed sin tables of rope_interleaved for angles pos * theta^(-2i/head_dim), computed
  in float64 and returned as float32."""
  inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  ang = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
  cos = np.repeat(np.cos(ang), 2, axis=1)
  sin = np.stack([-np.sin(ang), np.sin(ang)], axis=-1).reshape(len(positions), head_dim)
  return cos.astype(np.float32), sin.astype(np.float32)

KV_DTYPES = {"float16": np.float16, "float32": np.float32}  # what a KV cache may store (Llama's kv_dtype)

@dataclass
class KVCache:
  """The keys and values of `slots` independent sequences: per layer a (slots, max_context, 2·kv_dim) tensor of the
  model's `kv_dtype` (float16 by default), keys in the first kv_dim columns, or where the decode step attends with
  `decode_attention`, the blocked (slots, blocks, 2·kv_dim, BLOCK) layout it reads (`attention.cache_shape`: each
  BLOCK positions' keys transposed, then their values); `pos[s]` is the number of positions slot s has filled. Rows
  at or past a slot's position are never read before being written (a batched decode step masks them)."""
  layers: list[Tensor]
  max_context: int
  pos: list[int] = field(default_factory=list)
  _rows: list[np.ndarray | None] | None = field(default=None, repr=False)

  def __post_init__(self) -> None:
    if not self.pos: self.pos = [0] * self.slots

  @property
  def slots(self) -> int: return _layer_shape(self.layers[0])[0] if self.layers else len(self.pos) or 1

  @property
  def rows(self) -> int:
    """Rows a layer holds per slot: max_context, rounded up to whole blocks in the blocked layout."""
    shape = _layer_shape(self.layers[0])
    return shape[1] * shape[3] if len(shape) == 4 else shape[1]

  def write_rows(self, rows: Iterable[np.ndarray], slot: int, pos: int) -> None:
    """Store `rows` (per layer a (T, 2·kv_dim) float32 array: an (n_layers, T, 2·kv_dim) array, or an iterable that
    makes them one at a time) at positions pos..pos+T-1 of `slot`, rounded to the cache's dtype: a host copy into the
    device buffers (an array view of host memory where the device has one, else a copy into a view of the buffer)."""
    if self._rows is None: self._rows = [_host_rows(t) for t in self.layers]
    for layer, host, new in zip(self.layers, self._rows, rows):
      T = new.shape[0]
      if layer.ndim == 4: _write_blocked(layer, host, new, slot, pos)
      elif host is not None: host[slot, pos:pos + T] = new
      else:
        width = _layer_shape(layer)[2]
        at = (slot * self.max_context + pos) * width * layer.dtype.itemsize
        host_rows = np.ascontiguousarray(new, _np_dtype(layer))
        layer.buffer().view(T * width, layer.dtype, at).copyin(host_rows.data)

def _write_blocked(layer: Tensor, host: np.ndarray | None, new: np.ndarray, slot: int, pos: int) -> None:
  """`KVCache.write_rows` for a blocked layer: into its host view, else the blocks the rows fall in copied out of the
  buffer, written and copied back (a position's key elements lie BLOCK apart)."""
  if host is not None:
    store_rows(host, new, slot, pos)
    return
  S, B, kv2, block = _layer_shape(layer)
  first, last = pos // block, (pos + new.shape[0] - 1) // block
  size, item = kv2 * block, layer.dtype.itemsize
  view = layer.buffer().view((last + 1 - first) * size, layer.dtype, (slot * B + first) * size * item)
  blocks = np.empty((1, last + 1 - first, kv2, block), _np_dtype(layer))
  view.copyout(blocks.data.cast("B"))
  store_rows(blocks, new, 0, pos - first * block)
  view.copyin(blocks.data.cast("B"))

def _cached(cache: Tensor) -> tuple[Tensor, Tensor]:
  """A cache layer's keys and values (S, rows, kv_dim), in either layout (views of it)."""
  if cache.ndim == 4: return cached_rows(cache)
  kv = cache.shape[2] // 2
  return cache[:, :, :kv], cache[:, :, kv:]

def _layer_shape(t: Tensor) -> tuple[int, ...]:
  """A cache layer's (slots, max_context, 2·kv_dim) or blocked (slots, blocks, 2·kv_dim, BLOCK): a buffer of fixed
  size, so never symbolic."""
  shape = tuple(s for s in t.shape if isinstance(s, int))
  if len(shape) != t.ndim: raise ModelError(f"a KV cache layer needs concrete sizes, got the shape {t.shape}")
  return shape

def _np_dtype(t: Tensor) -> np.dtype:
  return np.dtype(t.dtype.fmt)

def _host_rows(t: Tensor) -> np.ndarray | None:
  mv = t.buffer().as_buffer()
  return None if mv is None else np.frombuffer(mv, _np_dtype(t)).reshape(_layer_shape(t))

@dataclass
class LlamaLayer:
  attn_norm: Tensor
  qkv: Weight
  qkv_bias: Tensor | None
  qk_norm: Tensor | None  # (n_heads + n_kv_heads, head_dim): qwen3's per-head RMSNorm of queries and keys
  attn_output: Weight
  ffn_norm: Tensor
  gate_up: Weight
  down: Weight
  cfg: LlamaConfig = field(repr=False)

  def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor, cache: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The roped queries (T, q_dim), the new cache rows (T, 2kv) in float32 (roped keys, then values; the host
    rounds them to the cache's dtype as it stores them) and those rows as the cache holds them, widened to float32:
    what attention reads for them, as for every cached position, so a token's result does not depend on whether its
    keys were cached before or computed in its step. (Returned as float16, the rows were recomputed inside the
    step's stack of every layer's rows, a kernel that selects each element among 30 sources: 0.3 -> 0.7-1.3 ms.)"""
    cfg = self.cfg
    T, hd, qd, kv = x.shape[0], cfg.head_dim, cfg.q_dim, cfg.kv_dim
    qkv = self.qkv.matmul(x, self.attn_norm) * rms_scale(x, cfg.rms_eps)  # (T, q_dim + 2kv)
    if self.qkv_bias is not None: qkv = qkv + self.qkv_bias
    heads = qkv[:, :qd + kv].reshape(T, cfg.n_heads + cfg.n_kv_heads, hd)
    if self.qk_norm is not None: heads = heads * rms_scale(heads, cfg.rms_eps) * self.qk_norm
    qk = rope_interleaved(heads, cos, sin).reshape(T, qd + kv)
    # stored once: its readers (attention, the step's returned rows) then read it, not each recompute it
    rows = Tensor.cat(qk[:, qd:], qkv[:, qd + kv:], dim=1).contiguous()
    return qk[:, :qd], rows, rows.cast(cache.dtype).float()

  def _finish(self, x: Tensor, attn: Tensor) -> Tensor:
    """The attention output projection and the feed-forward block, with their residuals."""
    # the residual stream is stored after each add: left lazy, every later kernel would re-add all earlier parts
    x = self.attn_output.matmul(attn, add=x)
    gate_up = self.gate_up.matmul(x, self.ffn_norm) * rms_scale(x, self.cfg.rms_eps)  # (T, 2ffn)
    return self.down.matmul(silu(gate_up[:, :self.cfg.ffn_dim]) * gate_up[:, self.cfg.ffn_dim:], add=x)

  def __call__(self, x: Tensor, cache: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, causal: Tensor, slot: Tensor,
               n: UOp) -> tuple[Tensor, Tensor]:
    """T tokens of one slot attending over the first n cached rows of that slot under `mask` (C, T) (-inf at the rows
    at or past the chunk's start, so a chunk at position 0 with n bound to 1 reads none) and over each other under
    `causal` (T, T); slot (S, 1, 1) marks the sequence's slot. O(T·(n + T)) work, n a bound Variable. The cache is only
    read; returns (x, the new (T, 2kv) rows), which the caller stores at the chunk's positions."""
    cfg = self.cfg
    T, hd, n_kv, kv = x.shape[0], cfg.head_dim, cfg.n_kv_heads, cfg.kv_dim
    S = cache.shape[0]
    rep = cfg.n_heads // n_kv
    q, new_rows, new = self._qkv(x, cos, sin, cache)
    # the position is the leading dim of everything symbolic: buffers of these shapes then have constant strides
    # float16 rows are widened to float32 inside the kernels that read them
    keys, values = (t.shrink(((0, S), (0, n), (0, kv))).permute(1, 0, 2) for t in _cached(cache))  # (n, S, kv)
    # a blocked cache's rows copied out in row order first: read through the view, each attention kernel indexed the
    # cache by position // 16 and % 16 and stayed scalar (a 2000-token prefill 2.5x slower)
    if cache.ndim == 4: keys, values = keys.contiguous(), values.contiguous()
    keys, values = keys.float(), values.float()
    if S > 1:  # this sequence's rows, (n, 1, kv)
      chosen = slot.reshape(1, S, 1)
      keys, values = (chosen.where(t, 0.0).sum(1, keepdim=True) for t in (keys, values))
    keys, values = keys.reshape(n, n_kv, 1, 1, hd), values.reshape(n, n_kv, 1, 1, hd)
    q = q.reshape(T, n_kv, rep, hd).permute(1, 2, 0, 3)  # (n_kv, rep, T, hd)
    k_new = new[:, :kv].reshape(T, n_kv, 1, hd).permute(1, 2, 3, 0)  # (n_kv, 1, hd, T)
    v_new = new[:, kv:].reshape(T, n_kv, 1, hd).permute(1, 2, 0, 3)  # (n_kv, 1, T, hd)
    scale = 1.0 / math.sqrt(hd)
    # one softmax over the cached scores and the chunk's own, without concatenating them
    s_old = (keys * q).sum(-1) * scale + mask.shrink(((0, n), (0, T))).reshape(n, 1, 1, T)  # (n, n_kv, rep, T)
    s_new = (q @ k_new) * scale + causal  # (n_kv, rep, T, T)
    top = s_old.max(0).unsqueeze(-1).maximum(s_new.max(-1, keepdim=True))  # (n_kv, rep, T, 1)
    e_old, e_new = (s_old - top.squeeze(-1)).exp(), (s_new - top).exp()
    weighted = (e_old.unsqueeze(-1) * values).sum(0) + e_new @ v_new  # (n_kv, rep, T, hd)
    attn = weighted / (e_old.sum(0).unsqueeze(-1) + e_new.sum(-1, keepdim=True))
    # stored in (T, heads*hd) order: the projection's kernel then reads its rows contiguously
    return self._finish(x, attn.permute(2, 0, 1, 3).reshape(T, cfg.q_dim).contiguous()), new_rows

  def decode(self, x: Tensor, cache: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, n: UOp) -> tuple[Tensor, Tensor]:
    """One token per slot (x is (S, dim)), slot s at position p_s attending over its p_s cached rows and itself: the
    first n = max p_s rows of every slot are read, `mask` (C, S) is -inf at the rows at or past a slot's position.
    O(n) work, n a bound Variable. The cache is only read; returns (x, the new (S, 2kv) rows), which the caller stores
    at row p_s of slot s. Where `fused_decode_attention` says so, attention is `decode_attention`'s kernels."""
    cfg = self.cfg
    S, hd, n_kv, kv = x.shape[0], cfg.head_dim, cfg.n_kv_heads, cfg.kv_dim
    rep = cfg.n_heads // n_kv
    q, new_row, new = self._qkv(x, cos, sin, cache)
    if cache.ndim == 4:  # the blocked layout, made where `fused_decode_attention` says (`Llama.new_cache`)
      attn = decode_attention(q.reshape(S, cfg.n_heads, hd), cache, mask, new, n, rep)
      if isinstance(self.attn_output, QuantWeight) and self.attn_output.qdot_ok(): attn = attn.contiguous()
      return self._finish(x, attn.reshape(S, cfg.q_dim)), new_row
    q = q.reshape(S, n_kv, rep, hd)
    # the position is the leading dim of everything symbolic: buffers of these shapes then have constant strides
    # float16 rows are widened to float32 inside the kernels that read them
    keys, values = (t.shrink(((0, S), (0, n), (0, kv))).permute(1, 0, 2).reshape(n, S, n_kv, 1, hd).float()
                    for t in _cached(cache))
    k_new, v_new = new[:, :kv].reshape(S, n_kv, 1, hd), new[:, kv:].reshape(S, n_kv, 1, hd)
    # one softmax over the cached scores and the new one, without concatenating them
    scale = 1.0 / math.sqrt(hd)
    s_old = (keys * q).sum(-1) * scale + mask.shrink(((0, n), (0, S))).reshape(n, S, 1, 1)  # (n, S, n_kv, rep)
    s_new = (k_new * q).sum(-1) * scale  # (S, n_kv, rep)
    top = s_old.max(0).maximum(s_new)
    e_old, e_new = (s_old - top).exp(), (s_new - top).exp()
    weighted = (e_old.unsqueeze(-1) * values).sum(0) + e_new.unsqueeze(-1) * v_new  # (S, n_kv, rep, hd)
    attn = weighted / (e_old.sum(0) + e_new).unsqueeze(-1)
    # for a QDOT matvec stored in its own shape first: its quantiser reads a buffer, and computed flattened to
    # (S, q_dim) that buffer's kernel indexed the cached values through a division by the heads per group (~20x slower)
    if isinstance(self.attn_output, QuantWeight) and self.attn_output.qdot_ok(): attn = attn.contiguous()
    return self._finish(x, attn.reshape(S, cfg.q_dim)), new_row

class Llama:
  """A llama-family model (llama, mistral, qwen2, qwen3) with a default one-slot KV cache of `max_context` positions;
  `new_cache(slots)` makes more, `decode_batch` advances several slots in one step.

  >>> model = Llama.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", max_context=512)  # doctest: +SKIP
  >>> logits = model.forward([6403, 1980, 253, 655])  # doctest: +SKIP  (vocab,) float32 of the last position
  """
  def __init__(self, cfg: LlamaConfig, sources: dict[str, _Source | np.ndarray], max_context: int = 512,
               device: str | None = None, quantized: bool = True, progress: Progress | None = None,
               kv_dtype: str = "float16"):
    """`progress(stage, done, total)` is told of each layer built (ember-llm's progress bar). `kv_dtype` is what the
    KV cache stores: "float16" (half the memory and the bytes a decode step reads at long contexts, as llama.cpp's
    default) or "float32"; either way attention computes in float32."""
    if kv_dtype not in KV_DTYPES:
      raise ModelError(f"kv_dtype must be one of {sorted(KV_DTYPES)}, got {kv_dtype!r}")
    self.cfg, self.device, self.quantized, self.kv_dtype = cfg, device, quantized, kv_dtype
    self.max_context = min(max_context, cfg.context_length)
    if self.max_context <= 0: raise ModelError(f"max_context must be positive, got {max_context}")
    src = {k: v if isinstance(v, _Source) else _Source(tuple(v.shape), array=np.asarray(v, np.float32))
           for k, v in sources.items()}
    kv, qd, hd = cfg.kv_dim, cfg.q_dim, cfg.head_dim
    def get(key: str, shape: tuple[int, ...]) -> _Source:
      if key not in src: raise ModelError(f"GGUF model lacks tensor {key!r}")
      if tuple(src[key].shape) != shape:
        raise ModelError(f"tensor {key!r} has shape {tuple(src[key].shape)}, expected {shape} from the metadata")
      return src[key]
    def heads(key: str, n_heads: int, shape: tuple[int, ...]) -> _Source:
      """A q/k tensor (rows, bias or per-head norm) in the interleaved-pair RoPE layout this model applies."""
      got = get(key, shape)
      if not cfg.neox_rope: return got
      order = (np.arange(n_heads)[:, None] * hd + _rope_rows(hd)[None, :]).reshape(-1)
      return _permute_rows(got, order)
    def vector(key: str, n: int) -> Tensor:
      return Tensor(np.ascontiguousarray(get(key, (n,)).dense(), np.float32).reshape(n), device=device).realize()
    self._embedding = get("token_embd.weight", (cfg.vocab_size, cfg.dim))
    head = src.get("output.weight", self._embedding)  # tied LM head when the file has no output.weight
    if tuple(head.shape) != (cfg.vocab_size, cfg.dim):
      raise ModelError(f"tensor 'output.weight' has shape {head.shape}, expected {(cfg.vocab_size, cfg.dim)}")
    self.lm_head = _fused_weight([head], quantized, device)
    self.norm = vector("output_norm.weight", cfg.dim)
    self.layers: list[LlamaLayer] = []
    for i in range(cfg.n_layers):
      p = f"blk.{i}."
      qkv = [heads(p + "attn_q.weight", cfg.n_heads, (qd, cfg.dim)),
             heads(p + "attn_k.weight", cfg.n_kv_heads, (kv, cfg.dim)), get(p + "attn_v.weight", (kv, cfg.dim))]
      bias = None
      if any(p + f"attn_{n}.bias" in src for n in "qkv"):  # a missing bias of the three is zero
        parts = [heads(p + "attn_q.bias", cfg.n_heads, (qd,)).dense() if p + "attn_q.bias" in src else np.zeros(qd),
                 heads(p + "attn_k.bias", cfg.n_kv_heads, (kv,)).dense() if p + "attn_k.bias" in src else np.zeros(kv),
                 get(p + "attn_v.bias", (kv,)).dense() if p + "attn_v.bias" in src else np.zeros(kv)]
        bias = Tensor(np.concatenate([np.asarray(b, np.float32).reshape(-1) for b in parts]), device=device).realize()
      qk_norm = None
      if p + "attn_q_norm.weight" in src or p + "attn_k_norm.weight" in src:
        qn, kn = (heads(p + f"attn_{n}_norm.weight", 1, (hd,)).dense().reshape(1, hd) for n in "qk")
        table = np.concatenate([np.repeat(qn, cfg.n_heads, 0), np.repeat(kn, cfg.n_kv_heads, 0)])
        qk_norm = Tensor(np.ascontiguousarray(table, np.float32), device=device).realize()
      self.layers.append(LlamaLayer(
        attn_norm=vector(p + "attn_norm.weight", cfg.dim), qkv=_fused_weight(qkv, quantized, device), qkv_bias=bias,
        qk_norm=qk_norm, attn_output=_fused_weight([get(p + "attn_output.weight", (cfg.dim, qd))], quantized, device),
        ffn_norm=vector(p + "ffn_norm.weight", cfg.dim),
        gate_up=_fused_weight([get(p + "ffn_gate.weight", (cfg.ffn_dim, cfg.dim)),
                               get(p + "ffn_up.weight", (cfg.ffn_dim, cfg.dim))], quantized, device),
        down=_fused_weight([get(p + "ffn_down.weight", (cfg.dim, cfg.ffn_dim))], quantized, device), cfg=cfg))
      if progress is not None: progress("building layers", i + 1, cfg.n_layers)
    self._embed_table, self._embed = self._embedding_rows()
    self._position = Variable("pos", 1, max(self.max_context - 1, 1))  # cached rows a decode step attends over
    # captured steps per cache size: decode per slot count, prefill per (slot count, chunk size)
    self._decode_jits: dict[int, TinyJit] = {}
    self._prefill_jits: dict[tuple[int, int], TinyJit] = {}
    self.cache = self.new_cache()

  @classmethod
  def from_gguf(cls, source: str | GGUFFile, max_context: int = 512, device: str | None = None,
                quantized: bool = True, progress: Progress | None = None, kv_dtype: str = "float16") -> Llama:
    """Build the model from a GGUF file; matrices of the block types in `ember.nn.llm.quant.KEPT` and F16/BF16 stay
    in their type unless `quantized=False`, which dequantises every matrix to float32 at load. `progress(stage,
    done, total)` is told of each tensor read and each layer built; `kv_dtype` ("float16" or "float32") is what the
    KV cache stores."""
    f = source if isinstance(source, GGUFFile) else GGUFFile(source)
    emb = f.tensors.get("token_embd.weight")
    if emb is None: raise ModelError(f"{f.path}: no token_embd.weight tensor; is this a llama-family GGUF?")
    cfg = LlamaConfig.from_gguf_metadata(f.metadata, vocab_size=emb.shape[0])
    sources: dict[str, _Source | np.ndarray] = {}
    for done, (name, info) in enumerate(f.tensors.items(), 1):
      if len(info.shape) == 2 and (info.ggml_type in KEPT or info.ggml_type in HALF):
        sources[name] = _Source((info.shape[0], info.shape[1]), raw=_FileBytes(f.path, info.offset, info.nbytes),
                                ggml_type=info.ggml_type)
      else: sources[name] = f.tensor(name)
      if progress is not None: progress("reading tensors", done, len(f.tensors))
    return cls(cfg, sources, max_context=max_context, device=device, quantized=quantized, progress=progress,
               kv_dtype=kv_dtype)

  def _embedding_rows(self) -> tuple[np.ndarray | _FileRows, Callable[[Tensor], Tensor]]:
    """The token embedding as a host table of rows (float32, or the GGUF's raw bytes of each row, gathered on the
    host; rows of a GGUF file are read from it per step, not held) and what turns a step's gathered rows into float32
    inside the captured step (dequantised on the device; all-zero padding rows dequantise to zeros)."""
    emb, dim = self._embedding, self.cfg.dim
    if emb.array is not None or emb.ggml_type is None: return emb.dense(), lambda rows: rows
    gtype = emb.ggml_type
    shape = (self.cfg.vocab_size, tensor_nbytes(gtype, (1, dim)))
    raw = emb.raw
    table = _FileRows(raw.path, raw.offset, shape) if isinstance(raw, _FileBytes) else np.asarray(raw).reshape(shape)
    return table, lambda rows: dequantize(rows.reshape(-1), gtype, (rows.shape[0], dim))

  @property
  def weight_bytes(self) -> int:
    """Bytes of weights one decode step reads: every matrix and norm vector (embedding rows are gathered on the
    host)."""
    total = self.lm_head.nbytes + self.cfg.dim * 4
    for layer in self.layers:
      total += sum(w.nbytes for w in (layer.qkv, layer.attn_output, layer.gate_up, layer.down))
      total += 2 * self.cfg.dim * 4  # the two norm vectors
    return total

  def decode_bytes(self, position: int) -> int:
    """Bytes a one-token decode step at `position` reads: the weights, and the keys and values of the `position`
    cached rows of every layer (of the cache's dtype)."""
    itemsize = np.dtype(KV_DTYPES[self.kv_dtype]).itemsize
    return self.weight_bytes + self.cfg.n_layers * position * 2 * self.cfg.kv_dim * itemsize

  def new_cache(self, slots: int = 1) -> KVCache:
    """An empty KV cache of `slots` independent sequences (the captured steps serve every cache of that size)."""
    if slots < 1: raise ModelError(f"a KV cache needs at least one slot, got {slots}")
    device = Device.DEFAULT if self.device is None else Device.canonicalize(self.device)
    shape = cache_shape(slots, self.max_context, self.cfg.kv_dim) if fused_decode_attention(device) else \
      (slots, self.max_context, 2 * self.cfg.kv_dim)
    zeros = np.zeros(shape, KV_DTYPES[self.kv_dtype])
    return KVCache([Tensor(zeros, device=self.device).realize() for _ in self.layers], self.max_context)

  # the default cache, for single-sequence use (CLI, generate(model, ...))
  @property
  def pos(self) -> int: return self.cache.pos[0]

  def reset(self) -> None:
    """Empty the default KV cache: the next forward starts at position 0 (the buffers and captured steps are kept)."""
    self.cache.pos[0] = 0

  def rewind(self, pos: int) -> None:
    """Forget the cached positions from `pos` on (the next forward writes there); 0 <= pos <= the current position."""
    rewind(self.cache, pos)

  def _check_ids(self, ids: np.ndarray) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
      raise ModelError(f"token ids must be in [0, {self.cfg.vocab_size}), got min {ids.min()} max {ids.max()}")

  def forward(self, tokens: list[int] | np.ndarray, cache: KVCache | None = None, slot: int = 0) -> np.ndarray:
    """Run `tokens` at positions pos..pos+T-1 of `slot` of `cache` (default: the model's), append their keys/values
    to it; returns the last position's logits (vocab,) float32."""
    cache = self.cache if cache is None else cache
    if not 0 <= slot < cache.slots: raise ModelError(f"slot {slot} is outside the cache's {cache.slots} slots")
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    T, C, start = ids.size, self.max_context, cache.pos[slot]
    if T == 0: raise ModelError("forward needs at least one token")
    if start + T > C:
      raise ContextOverflowError(f"context overflow: {start} cached + {T} new tokens > max_context {C}; start a "
        f"new conversation or raise max_context")
    self._check_ids(ids)
    if T == 1 and start > 0: return self.decode_batch([int(ids[0])], [slot], cache)[0]
    big = PREFILL_BUCKETS[-1]
    for at, size in zip(range(0, T, big), prefill_chunks(T)):
      chunk = ids[at:at + big]
      key = (cache.slots, size)
      if key not in self._prefill_jits: self._prefill_jits[key] = TinyJit(self._step)
      logits = self._run(self._prefill_jits[key], chunk, size, start + at, cache, slot)
    cache.pos[slot] = start + T
    return logits

  def _run(self, step: TinyJit, ids: np.ndarray, T: int, start: int, cache: KVCache, slot: int) -> np.ndarray:
    n = ids.size  # a prefill chunk shorter than its bucket T is padded with token 0 at the following positions
    C, S = self.max_context, cache.slots
    positions = np.arange(start, start + T)
    cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
    mask = np.where(np.arange(C)[:, None] < start, 0.0, -np.inf).astype(np.float32)  # (C, T): the rows before start
    mask = np.broadcast_to(mask, (C, T)).copy()
    causal = np.triu(np.full((T, T), -np.inf, np.float32), 1)
    chosen = (np.arange(S) == slot).reshape(S, 1, 1)
    select = np.zeros((1, T), np.float32)
    select[0, n - 1] = 1.0  # the last real token's row
    x = np.zeros((T, self._embed_table.shape[1]), self._embed_table.dtype)
    x[:n] = self._embed_table[ids]
    inputs = [Tensor(a, device=self.device) for a in (x, cos, sin, mask, causal, chosen, select)]
    # a chunk at position 0 reads one cached row, masked: a Variable's range starts at 1
    logits, *rows = step(*inputs, self._position.bind(max(start, 1)), *cache.layers)
    cache.write_rows((r.numpy()[:n] for r in rows), slot, start)  # the padding rows are dropped
    return logits.numpy()

  def decode_batch(self, tokens: Sequence[int], slots: Sequence[int], cache: KVCache) -> np.ndarray:
    """One token for each of `slots` of `cache` (each already holding at least one position) in one step; returns
    their logits (len(slots), vocab) float32 in the order given. Every slot of the cache is computed (idle ones on
    token 0, fully masked), so the step is captured once per cache size and a slot's result does not depend on which
    other slots are busy."""
    S, C = cache.slots, self.max_context
    if len(tokens) != len(slots) or not tokens:
      raise ModelError(f"decode_batch needs one token per slot, got {len(tokens)} tokens for {len(slots)} slots")
    if len(set(slots)) != len(slots) or not all(0 <= s < S for s in slots):
      raise ModelError(f"decode_batch slots must be distinct slots of the cache's {S}, got {list(slots)}")
    ids = np.zeros(S, np.int64)
    positions = np.zeros(S, np.int64)
    mask = np.full((cache.rows, S), -np.inf, np.float32)
    for token, slot in zip(tokens, slots):
      p = cache.pos[slot]
      if p == 0: raise ModelError(f"slot {slot} is empty; a sequence starts with forward() (prefill), not a decode")
      if p >= C: raise ContextOverflowError(f"context overflow: slot {slot} holds {p} tokens = max_context {C}")
      ids[slot], positions[slot] = token, p
      mask[:p, slot] = 0.0
    self._check_ids(ids)
    cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
    if S not in self._decode_jits: self._decode_jits[S] = TinyJit(self._decode_step)
    inputs = [Tensor(a, device=self.device) for a in (self._embed_table[ids], cos, sin, mask)]
    n = int(max(positions[list(slots)]))
    logits, rows = self._decode_jits[S](*inputs, self._position.bind(n), *cache.layers)
    new_rows = rows.numpy()  # (n_layers, S, 2kv)
    for slot in slots:
      cache.write_rows(new_rows[:, slot:slot + 1], slot, cache.pos[slot])
      cache.pos[slot] += 1
    return logits.numpy()[list(slots)]

  def _decode_step(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, n: UOp,
                   *caches: Tensor) -> tuple[Tensor, Tensor]:
    x = self._embed(x)
    rows = []
    for layer, cache in zip(self.layers, caches):
      x, row = layer.decode(x, cache, cos, sin, mask, n)
      rows.append(row)
    logits = self.lm_head.matmul(x, self.norm) * rms_scale(x, self.cfg.rms_eps)  # (S, vocab)
    new_rows = Tensor.stack(*rows)  # (n_layers, S, 2kv)
    Tensor.realize(logits, new_rows)
    return logits, new_rows

  def _step(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, causal: Tensor, slot: Tensor, select: Tensor,
            n: UOp, *caches: Tensor) -> tuple[Tensor, ...]:
    """A prefill chunk: the logits of the row `select` picks, then each layer's new (T, 2kv) cache rows, returned
    layer by layer (stacked, they took a copy as large as all of them: 5.9 MB at 128 tokens, beside the layers'
    own)."""
    x = self._embed(x)
    rows = []
    for layer, cache in zip(self.layers, caches):
      x, row = layer(x, cache, cos, sin, mask, causal, slot, n)
      rows.append(row)
    last = select @ x  # (1, dim)
    logits = (self.lm_head.matmul(last, self.norm) * rms_scale(last, self.cfg.rms_eps)).reshape(self.cfg.vocab_size)
    Tensor.realize(logits, *rows)
    return (logits, *rows)

class LlamaSession:
  """The model bound to one slot of a KV cache, with the interface `generate` expects (forward, pos, max_context,
  reset)."""
  def __init__(self, model: Llama, cache: KVCache | None = None, slot: int = 0):
    self.model, self.cache, self.slot = model, cache if cache is not None else model.new_cache(), slot
    self.max_context = model.max_context
  @property
  def pos(self) -> int: return self.cache.pos[self.slot]
  def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray:
    return self.model.forward(tokens, self.cache, self.slot)
  def reset(self) -> None: self.cache.pos[self.slot] = 0
  def rewind(self, pos: int) -> None: rewind(self.cache, pos, self.slot)

def rewind(cache: KVCache, pos: int, slot: int = 0) -> None:
  if not 0 <= pos <= cache.pos[slot]: raise ModelError(f"rewind position {pos} is outside [0, {cache.pos[slot]}]")
  cache.pos[slot] = pos
