"""A Llama-family decoder-only transformer built from GGUF metadata and weights, with preallocated KV caches.

Per layer: x += Wo·attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x)); x += Wd·(silu(Wg·n(x)) * Wu·n(x)), n = RMSNorm.
Grouped-query attention shares each KV head between n_heads / n_kv_heads query heads.

Kernels per step are kept few: Wq|Wk|Wv is one (dim + 2·kv, dim) matmul and Wg|Wu one (2·ffn, dim) matmul; the
RMSNorm scale is applied to the matmul's output rows; RoPE is one elementwise kernel over the query and key heads
together; each layer's cache is one (max_context, 2·kv) tensor (keys then values); the residual stream is stored
after each add.

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
value, one softmax over both without concatenating them, so a step costs O(p), not O(max_context). The step returns
the new keys/values of every layer, and `KVCache.write_rows` stores them at row p on the host (a view of the
device's host memory where it has one): the captured kernels only read the cache.

Prefill (T > 1 tokens, or a first token): what depends on the position (RoPE tables, the causal mask over the whole
cache, the one-hot placement of the new rows, which row's logits to return) is small host-built inputs, and a
prefill step per chunk size in PREFILL_BUCKETS is captured once. The cache tensors are inputs of every captured step,
so one capture serves every `KVCache` of the model (the HTTP server keeps one per request slot). Token embeddings
are gathered on the host from the GGUF bytes and dequantised by `ember.nn.gguf` inside the captured steps.
"""
from __future__ import annotations
import math
from dataclasses import dataclass, field
from typing import Any, Callable
import numpy as np
from ember import Tensor, TinyJit, UOp, Variable, dtypes
from ember.errors import EmberError
from ember.nn.gguf import GGMLType, GGUFFile, dequantize, tensor_nbytes
from ember.schedule import buffer_of

SUPPORTED_ARCHS = ("llama", "mistral")
PREFILL_BUCKETS = (8, 32)  # prompt tokens per captured prefill step; a chunk is padded to the smallest that fits

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
  @property
  def head_dim(self) -> int: return self.dim // self.n_heads
  @property
  def kv_dim(self) -> int: return self.n_kv_heads * self.head_dim

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
              context_length=int(md.get(f"{arch}.context_length", 2048)))
    if cfg.dim % cfg.n_heads or cfg.n_heads % cfg.n_kv_heads:
      raise ModelError(f"inconsistent heads: dim {cfg.dim}, {cfg.n_heads} heads, {cfg.n_kv_heads} KV heads (need "
        f"dim % heads == 0 and heads % kv_heads == 0)")
    if cfg.head_dim % 2: raise ModelError(f"RoPE needs an even head dim, got {cfg.head_dim}")
    rope_dim = int(md.get(f"{arch}.rope.dimension_count", cfg.head_dim))
    if rope_dim != cfg.head_dim: raise ModelError(f"partial RoPE (rope.dimension_count {rope_dim} != head dim "
      f"{cfg.head_dim}) is not supported")
    return cfg

# ** weights: float32, or quantised blocks dequantised inside the matmul **

QUANT_BLOCK = 32
KEPT_QUANTIZED = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q8_0)

def _f16_column(blocks: np.ndarray, start: int) -> np.ndarray:
  return blocks[..., start:start + 2].copy().view(np.float16).astype(np.float32)  # (..., 1)

class QuantWeight:
  """An (out, in) matrix kept as GGML blocks of 32: `q` the quants as uint8, (out, in/32, 16) bytes of two nibbles
  for Q4_0/Q4_1 (element j of a block is the low nibble of byte j for j < 16, the high nibble of byte j-16 after, as
  GGML stores them) or (out, in/32, 32) for Q8_0 (stored as q + 128: gcc vectorises unsigned byte loads, not signed
  ones); `scale` and, for Q4_1, `offset` (out, in/32, 1) float32. Element j of a block is scale·q_j + offset for
  Q4_1, scale·(q_j - 8) for Q4_0 and scale·(u_j - 128) for Q8_0."""
  def __init__(self, ggml_type: GGMLType, raw: np.ndarray, shape: tuple[int, int], device: str | None):
    out_dim, in_dim = shape
    if in_dim % QUANT_BLOCK: raise ModelError(f"{ggml_type.name} weight of shape {shape}: the input dim must be a "
      f"multiple of {QUANT_BLOCK}")
    self.ggml_type, self.shape = ggml_type, shape
    blocks = np.asarray(raw, np.uint8).reshape(out_dim, in_dim // QUANT_BLOCK, -1)
    scale = _f16_column(blocks, 0)
    q: np.ndarray
    offset: np.ndarray | None = None
    if ggml_type is GGMLType.Q8_0: q = blocks[..., 2:] ^ np.uint8(0x80)  # int8 two's complement + 128
    elif ggml_type is GGMLType.Q4_1: q, offset = blocks[..., 4:], _f16_column(blocks, 2)
    else: q = blocks[..., 2:]
    self.nbytes = q.nbytes + scale.nbytes + (0 if offset is None else offset.nbytes)  # read per use
    self.q = Tensor(np.ascontiguousarray(q), device=device).realize()
    self.scale = Tensor(scale, device=device).realize()
    self.offset = None if offset is None else Tensor(offset, device=device).realize()

  def matmul(self, x: Tensor) -> Tensor:
    """x (T, in) @ W.T -> (T, out) with the dequantisation fused into the reduce.

    Per block the scale is factored out of the dot product and Q4_1's offset multiplies the block's sum of x:
    sum_j x_j·(d·q_j + m) = d·sum_j x_j·q_j + m·sum_j x_j. The first kernel keeps one partial sum per lane of 16 (lane
    j takes elements j and j+16, which share a byte for the nibble types) over the blocks, which gcc turns into one
    vector accumulator (quants widened and converted as 16-wide vectors; the bytes pass through int32 first, which
    is what lets it vectorise the conversion); the second sums the 16 lanes."""
    T, nb = x.shape[0], self.shape[1] // QUANT_BLOCK
    xb = x.reshape(T, 1, nb, QUANT_BLOCK)  # (T, 1, blocks, 32) broadcasts against the weight's (out, blocks, ...)
    xl, xh = xb[..., :16], xb[..., 16:]
    qi = self.q.cast(dtypes.int32)
    if self.ggml_type is GGMLType.Q8_0:
      qf = qi.cast(dtypes.float32) - 128.0
      lo, hi = qf[..., :16], qf[..., 16:]
    else:
      lo, hi = (qi & 15).cast(dtypes.float32), (qi >> 4).cast(dtypes.float32)
      if self.offset is None: lo, hi = lo - 8.0, hi - 8.0  # Q4_0
    lanes = (xl * lo + xh * hi) * self.scale
    if self.offset is not None: lanes = lanes + xl * self.offset + xh * self.offset
    return lanes.sum(-2).sum(-1)  # (T, out, 16) partial sums over the blocks, then (T, out)

class DenseWeight:
  """An (out, in) float32 matrix. (float16 storage converted inside the kernel was measured 13x slower than float32
  on the development machine: gcc 12 converts _Float16 one value at a time.)"""
  def __init__(self, w: np.ndarray, device: str | None):
    self.shape = tuple(w.shape)
    self.nbytes = int(w.size) * 4
    self.w = Tensor(np.ascontiguousarray(w, np.float32), device=device).realize()
  def matmul(self, x: Tensor) -> Tensor: return x @ self.w.T  # reduces along the weight's contiguous rows

Weight = QuantWeight | DenseWeight

@dataclass
class _Source:
  """Where a weight matrix comes from: a GGUF tensor (raw bytes + type) or a float32 array."""
  shape: tuple[int, int]
  raw: np.ndarray | None = None
  ggml_type: GGMLType | None = None
  array: np.ndarray | None = None
  def dense(self) -> np.ndarray:
    if self.array is not None: return self.array
    assert self.raw is not None and self.ggml_type is not None
    return dequantize(Tensor(np.ascontiguousarray(self.raw)), self.ggml_type, self.shape).numpy()

def _fused_weight(parts: list[_Source], quantized: bool, device: str | None) -> Weight:
  """Stack matrices along the output dim into one weight: quantised when all parts share a kept type."""
  out_dim, in_dim = sum(p.shape[0] for p in parts), parts[0].shape[1]
  types = {p.ggml_type for p in parts}
  if quantized and len(types) == 1 and (gtype := types.pop()) in KEPT_QUANTIZED and in_dim % QUANT_BLOCK == 0:
    raw = np.concatenate([np.asarray(p.raw).reshape(p.shape[0], -1) for p in parts], axis=0)
    return QuantWeight(gtype, raw, (out_dim, in_dim), device)
  return DenseWeight(np.concatenate([p.dense() for p in parts], axis=0), device)

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

@dataclass
class KVCache:
  """One sequence's keys and values: per layer a (max_context, 2·kv_dim) float32 tensor, keys in the first kv_dim
  columns; `pos` is the number of positions filled. Rows at or past `pos` are never read before being written."""
  layers: list[Tensor]
  max_context: int
  pos: int = 0
  _rows: list[np.ndarray | None] | None = field(default=None, repr=False)

  def write_rows(self, rows: np.ndarray, pos: int) -> None:
    """Store `rows` (n_layers, T, 2·kv_dim) at positions pos..pos+T-1: a host copy into the device buffers (an
    array view of host memory where the device has one, else a copy into a view of the buffer)."""
    if self._rows is None: self._rows = [_host_rows(t) for t in self.layers]
    T = rows.shape[1]
    for layer, host, new in zip(self.layers, self._rows, rows):
      if host is not None: host[pos:pos + T] = new
      else:
        width = int(layer.shape[1])
        rows_at = buffer_of(layer.uop).view(T * width, layer.dtype, pos * width * layer.dtype.itemsize)
        rows_at.copyin(np.ascontiguousarray(new, np.float32).data)

def _host_rows(t: Tensor) -> np.ndarray | None:
  mv = buffer_of(t.uop).as_buffer()
  return None if mv is None else np.frombuffer(mv, np.float32).reshape(int(t.shape[0]), int(t.shape[1]))

@dataclass
class LlamaLayer:
  attn_norm: Tensor
  qkv: Weight
  qkv_bias: Tensor | None
  attn_output: Weight
  ffn_norm: Tensor
  gate_up: Weight
  down: Weight
  cfg: LlamaConfig = field(repr=False)

  def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """The roped queries (T, dim) and the new cache rows (T, 2kv): roped keys, then values."""
    cfg = self.cfg
    T, hd, n_kv, dim, kv = x.shape[0], cfg.head_dim, cfg.n_kv_heads, cfg.dim, cfg.kv_dim
    qkv = self.qkv.matmul(x * self.attn_norm) * rms_scale(x, cfg.rms_eps)  # (T, dim + 2kv)
    if self.qkv_bias is not None: qkv = qkv + self.qkv_bias
    qk = rope_interleaved(qkv[:, :dim + kv].reshape(T, cfg.n_heads + n_kv, hd), cos, sin).reshape(T, dim + kv)
    return qk[:, :dim], Tensor.cat(qk[:, dim:], qkv[:, dim + kv:], dim=1)

  def _finish(self, x: Tensor, attn: Tensor) -> Tensor:
    """The attention output projection and the feed-forward block, with their residuals."""
    # the residual stream is stored after each add: left lazy, every later kernel would re-add all earlier parts
    x = (x + self.attn_output.matmul(attn)).contiguous()
    gate_up = self.gate_up.matmul(x * self.ffn_norm) * rms_scale(x, self.cfg.rms_eps)  # (T, 2ffn)
    return (x + self.down.matmul(silu(gate_up[:, :self.cfg.ffn_dim]) * gate_up[:, self.cfg.ffn_dim:])).contiguous()

  def __call__(self, x: Tensor, cache: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, place: Tensor,
               written: Tensor) -> Tensor:
    """T tokens attending over the whole cache under `mask`; their keys/values are written into it first."""
    cfg = self.cfg
    T, hd, n_kv, dim, kv = x.shape[0], cfg.head_dim, cfg.n_kv_heads, cfg.dim, cfg.kv_dim
    rep = cfg.n_heads // n_kv
    q, new_rows = self._qkv(x, cos, sin)
    # the new rows land at their positions: place (C, T) is one-hot, written (C, 1) marks the rows it fills
    cache.assign(written.where(place @ new_rows, cache))
    C = cache.shape[0]
    q = q.reshape(T, n_kv, rep, hd).permute(1, 2, 0, 3)  # (n_kv, rep, T, hd)
    keys = cache[:, :kv].reshape(C, n_kv, 1, hd).permute(1, 2, 3, 0)  # (n_kv, 1, hd, C)
    values = cache[:, kv:].reshape(C, n_kv, 1, hd).permute(1, 2, 0, 3)  # (n_kv, 1, C, hd)
    scores = (q @ keys) * (1.0 / math.sqrt(hd)) + mask  # (n_kv, rep, T, C)
    # stored in (T, heads*hd) order: the projection's kernel then reads its rows contiguously
    attn = (softmax(scores) @ values).permute(2, 0, 1, 3).reshape(T, dim).contiguous()
    return self._finish(x, attn)

  def decode(self, x: Tensor, cache: Tensor, cos: Tensor, sin: Tensor, n: UOp) -> tuple[Tensor, Tensor]:
    """One token (x is (1, dim)) at position n attending over the n cached rows and itself: O(n) work, n a bound
    Variable. The cache is only read; returns (x, the new (1, 2kv) row), which the caller stores at row n."""
    cfg = self.cfg
    hd, n_kv, dim, kv = cfg.head_dim, cfg.n_kv_heads, cfg.dim, cfg.kv_dim
    rep = cfg.n_heads // n_kv
    q, new_row = self._qkv(x, cos, sin)
    q = q.reshape(1, n_kv, rep, hd)
    # the position is the leading dim of everything symbolic: buffers of these shapes then have constant strides
    keys = cache.shrink(((0, n), (0, kv))).reshape(n, n_kv, 1, hd)
    values = cache.shrink(((0, n), (kv, 2 * kv))).reshape(n, n_kv, 1, hd)
    k_new, v_new = new_row[:, :kv].reshape(1, n_kv, 1, hd), new_row[:, kv:].reshape(n_kv, 1, hd)
    # one softmax over the cached scores and the new one, without concatenating them
    scale = 1.0 / math.sqrt(hd)
    s_old = (keys * q).sum(-1) * scale  # (n, n_kv, rep)
    s_new = ((k_new * q).sum(-1) * scale).reshape(n_kv, rep)
    top = s_old.max(0).maximum(s_new)  # (n_kv, rep)
    e_old, e_new = (s_old - top).exp(), (s_new - top).exp()
    weighted = (e_old.unsqueeze(-1) * values).sum(0) + e_new.unsqueeze(-1) * v_new  # (n_kv, rep, hd)
    attn = weighted / (e_old.sum(0) + e_new).unsqueeze(-1)
    return self._finish(x, attn.reshape(1, dim)), new_row

class Llama:
  """A Llama-family model with a default KV cache of `max_context` positions; `new_cache()` makes more.

  >>> model = Llama.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", max_context=512)  # doctest: +SKIP
  >>> logits = model.forward([6403, 1980, 253, 655])  # doctest: +SKIP  (vocab,) float32 of the last position
  """
  def __init__(self, cfg: LlamaConfig, sources: dict[str, _Source | np.ndarray], max_context: int = 512,
               device: str | None = None, quantized: bool = True):
    self.cfg, self.device, self.quantized = cfg, device, quantized
    self.max_context = min(max_context, cfg.context_length)
    if self.max_context <= 0: raise ModelError(f"max_context must be positive, got {max_context}")
    src = {k: v if isinstance(v, _Source) else _Source(tuple(v.shape), array=np.asarray(v, np.float32))
           for k, v in sources.items()}
    kv = cfg.kv_dim
    def get(key: str, shape: tuple[int, ...]) -> _Source:
      if key not in src: raise ModelError(f"GGUF model lacks tensor {key!r}")
      if tuple(src[key].shape) != shape:
        raise ModelError(f"tensor {key!r} has shape {tuple(src[key].shape)}, expected {shape} from the metadata")
      return src[key]
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
      qkv = [get(p + "attn_q.weight", (cfg.dim, cfg.dim)), get(p + "attn_k.weight", (kv, cfg.dim)),
             get(p + "attn_v.weight", (kv, cfg.dim))]
      biases = [(p + f"attn_{n}.bias", size) for n, size in (("q", cfg.dim), ("k", kv), ("v", kv))]
      bias = None
      if any(key in src for key, _ in biases):  # a missing bias of the three is zero
        bias = Tensor(np.concatenate([get(key, (n,)).dense().reshape(n) if key in src else np.zeros(n, np.float32)
                                      for key, n in biases]).astype(np.float32), device=device).realize()
      self.layers.append(LlamaLayer(
        attn_norm=vector(p + "attn_norm.weight", cfg.dim), qkv=_fused_weight(qkv, quantized, device), qkv_bias=bias,
        attn_output=_fused_weight([get(p + "attn_output.weight", (cfg.dim, cfg.dim))], quantized, device),
        ffn_norm=vector(p + "ffn_norm.weight", cfg.dim),
        gate_up=_fused_weight([get(p + "ffn_gate.weight", (cfg.ffn_dim, cfg.dim)),
                               get(p + "ffn_up.weight", (cfg.ffn_dim, cfg.dim))], quantized, device),
        down=_fused_weight([get(p + "ffn_down.weight", (cfg.dim, cfg.ffn_dim))], quantized, device), cfg=cfg))
    self._embed_table, self._embed = self._embedding_rows()
    self._decode_jit = TinyJit(self._decode_step)
    self._position = Variable("pos", 1, max(self.max_context - 1, 1))  # cached rows a decode step attends over
    self._prefill_jits = {size: TinyJit(self._step) for size in PREFILL_BUCKETS}
    self.cache = self.new_cache()

  @classmethod
  def from_gguf(cls, source: str | GGUFFile, max_context: int = 512, device: str | None = None,
                quantized: bool = True) -> Llama:
    """Build the model from a GGUF file; Q4_0/Q4_1/Q8_0 matrices stay quantised unless `quantized=False`, which
    dequantises every matrix to float32 at load."""
    f = source if isinstance(source, GGUFFile) else GGUFFile(source)
    emb = f.tensors.get("token_embd.weight")
    if emb is None: raise ModelError(f"{f.path}: no token_embd.weight tensor; is this a llama-family GGUF?")
    cfg = LlamaConfig.from_gguf_metadata(f.metadata, vocab_size=emb.shape[0])
    sources: dict[str, _Source | np.ndarray] = {}
    for name, info in f.tensors.items():
      if len(info.shape) == 2 and info.ggml_type in KEPT_QUANTIZED:
        sources[name] = _Source((info.shape[0], info.shape[1]), raw=f.raw(name), ggml_type=info.ggml_type)
      else: sources[name] = f.tensor(name)
    return cls(cfg, sources, max_context=max_context, device=device, quantized=quantized)

  def _embedding_rows(self) -> tuple[np.ndarray, Callable[[Tensor], Tensor]]:
    """The token embedding as a host table of rows (float32, or the GGUF's raw bytes of each row, gathered on the
    host) and what turns a step's gathered rows into float32 inside the captured step (dequantised on the device;
    all-zero padding rows dequantise to zeros)."""
    emb, dim = self._embedding, self.cfg.dim
    if emb.array is not None or emb.ggml_type is None: return emb.dense(), lambda rows: rows
    gtype = emb.ggml_type
    table = np.asarray(emb.raw).reshape(self.cfg.vocab_size, tensor_nbytes(gtype, (1, dim)))
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

  def new_cache(self) -> KVCache:
    """An empty KV cache for one more independent sequence (the captured steps serve every cache)."""
    zeros = np.zeros((self.max_context, 2 * self.cfg.kv_dim), np.float32)
    return KVCache([Tensor(zeros, device=self.device).realize() for _ in self.layers], self.max_context)

  # the default cache, for single-sequence use (CLI, generate(model, ...))
  @property
  def pos(self) -> int: return self.cache.pos

  def reset(self) -> None:
    """Empty the default KV cache: the next forward starts at position 0 (the buffers and captured steps are kept)."""
    self.cache.pos = 0

  def rewind(self, pos: int) -> None:
    """Forget the cached positions from `pos` on (the next forward writes there); 0 <= pos <= the current position."""
    rewind(self.cache, pos)

  def forward(self, tokens: list[int] | np.ndarray, cache: KVCache | None = None) -> np.ndarray:
    """Run `tokens` at positions pos..pos+T-1 of `cache` (default: the model's), append their keys/values to it;
    returns the last position's logits (vocab,) float32."""
    cache = self.cache if cache is None else cache
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    T, C, start = ids.size, self.max_context, cache.pos
    if T == 0: raise ModelError("forward needs at least one token")
    if start + T > C:
      raise ContextOverflowError(f"context overflow: {start} cached + {T} new tokens > max_context {C}; start a "
        f"new conversation or raise max_context")
    if ids.min() < 0 or ids.max() >= self.cfg.vocab_size:
      raise ModelError(f"token ids must be in [0, {self.cfg.vocab_size}), got min {ids.min()} max {ids.max()}")
    if T == 1 and start > 0: logits = self._decode(ids, start, cache)
    else:
      big = PREFILL_BUCKETS[-1]
      for at in range(0, T, big):
        chunk = ids[at:at + big]
        size = next(b for b in PREFILL_BUCKETS if b >= chunk.size)
        logits = self._run(self._prefill_jits[size], chunk, size, start + at, cache)
    cache.pos = start + T
    return logits

  def _run(self, step: TinyJit, ids: np.ndarray, T: int, start: int, cache: KVCache) -> np.ndarray:
    n = ids.size  # a prefill chunk shorter than its bucket T is padded with token 0 at the following positions
    C = self.max_context
    positions = np.arange(start, start + T)
    cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
    cols = np.arange(C)
    mask = np.where(cols[None, :] <= positions[:, None], 0.0, -np.inf).astype(np.float32)  # (T, C) causal
    # padding rows past the context are dropped; those inside it are overwritten before anything attends to them
    place = (cols[:, None] == positions[None, :]).astype(np.float32)  # (C, T)
    written = place.any(axis=1, keepdims=True)  # (C, 1)
    select = np.zeros((1, T), np.float32)
    select[0, n - 1] = 1.0  # the last real token's row
    x = np.zeros((T, self._embed_table.shape[1]), self._embed_table.dtype)
    x[:n] = self._embed_table[ids]
    inputs = [Tensor(a, device=self.device) for a in (x, cos, sin, mask, place, written, select)]
    return step(*inputs, *cache.layers).numpy()

  def _decode(self, ids: np.ndarray, start: int, cache: KVCache) -> np.ndarray:
    cos, sin = rope_tables(np.array([start]), self.cfg.head_dim, self.cfg.rope_theta)
    inputs = [Tensor(a, device=self.device) for a in (self._embed_table[ids], cos, sin)]
    logits, rows = self._decode_jit(*inputs, self._position.bind(start), *cache.layers)
    cache.write_rows(rows.numpy(), start)
    return logits.numpy()

  def _decode_step(self, x: Tensor, cos: Tensor, sin: Tensor, n: UOp, *caches: Tensor) -> tuple[Tensor, Tensor]:
    x = self._embed(x)
    rows = []
    for layer, cache in zip(self.layers, caches):
      x, row = layer.decode(x, cache, cos, sin, n)
      rows.append(row)
    logits = (self.lm_head.matmul(x * self.norm) * rms_scale(x, self.cfg.rms_eps)).reshape(self.cfg.vocab_size)
    new_rows = Tensor.stack(*rows)  # (n_layers, 1, 2kv)
    Tensor.realize(logits, new_rows)
    return logits, new_rows

  def _step(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, place: Tensor, written: Tensor, select: Tensor,
            *caches: Tensor) -> Tensor:
    x = self._embed(x)
    for layer, cache in zip(self.layers, caches):
      x = layer(x, cache, cos, sin, mask, place, written)
    last = select @ x  # (1, dim)
    logits = (self.lm_head.matmul(last * self.norm) * rms_scale(last, self.cfg.rms_eps)).reshape(self.cfg.vocab_size)
    Tensor.realize(logits, *caches)
    return logits

class LlamaSession:
  """The model bound to one KV cache, with the interface `generate` expects (forward, pos, max_context, reset)."""
  def __init__(self, model: Llama, cache: KVCache | None = None):
    self.model, self.cache = model, cache if cache is not None else model.new_cache()
    self.max_context = model.max_context
  @property
  def pos(self) -> int: return self.cache.pos
  def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray: return self.model.forward(tokens, self.cache)
  def reset(self) -> None: self.cache.pos = 0
  def rewind(self, pos: int) -> None: rewind(self.cache, pos)

def rewind(cache: KVCache, pos: int) -> None:
  if not 0 <= pos <= cache.pos: raise ModelError(f"rewind position {pos} is outside [0, {cache.pos}]")
  cache.pos = pos
