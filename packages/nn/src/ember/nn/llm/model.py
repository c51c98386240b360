"""A Llama-family decoder-only transformer built from GGUF metadata and weights, with a preallocated KV cache.

Per layer: x += Wo·attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x)); x += Wd·(silu(Wg·n(x)) * Wu·n(x)), n = RMSNorm.
Grouped-query attention shares each KV head between n_heads / n_kv_heads query heads.

RoPE: llama.cpp's converter stores attn_q / attn_k with the rows of each head permuted so that rotating adjacent
pairs (x[2i], x[2i+1]) by angle pos * theta^(-2i/d) gives the same result as the original model's rotate-half RoPE;
this model applies that interleaved-pair rotation to the weights as stored.

The step inputs that depend on the position (the RoPE angles, the causal mask, where the new keys/values land in
the cache) are built on the host as small tensors, so every decode step is the same graph with new input data:
the kernels compile once. Token embeddings are gathered on the host from the dequantised table.
"""
from __future__ import annotations
import math
from dataclasses import dataclass
from typing import Any
import numpy as np
from ember import Tensor, TinyJit
from ember.errors import EmberError
from ember.nn.llm.gguf import GGUFFile

SUPPORTED_ARCHS = ("llama", "mistral")

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
    rope_dim = int(md.get(f"{arch}.rope.dimension_count", cfg.head_dim))
    if rope_dim != cfg.head_dim: raise ModelError(f"partial RoPE (rope.dimension_count {rope_dim} != head dim "
      f"{cfg.head_dim}) is not supported")
    return cfg

# ** ops composed from Tensor primitives **

def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
  return x * (x.square().mean(-1, keepdim=True) + eps).rsqrt() * weight

def silu(x: Tensor) -> Tensor: return x * x.sigmoid()

def softmax(x: Tensor, axis: int = -1) -> Tensor:
  e = (x - x.max(axis, keepdim=True)).exp()
  return e / e.sum(axis, keepdim=True)

def rope_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
  """Rotate adjacent pairs of the last dim: x (T, H, D), cos/sin (T, D/2)."""
  T, H, D = x.shape
  pairs = x.reshape(T, H, D // 2, 2)
  even, odd = pairs[:, :, :, 0], pairs[:, :, :, 1]  # (T, H, D/2)
  c, s = cos.reshape(T, 1, D // 2), sin.reshape(T, 1, D // 2)
  return Tensor.stack(even * c - odd * s, even * s + odd * c, dim=-1).reshape(T, H, D)

def rope_tables(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
  """cos and sin of pos * theta^(-2i/head_dim), float32 (T, head_dim/2); angles computed in float64."""
  inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  ang = positions.astype(np.float64)[:, None] * inv_freq[None, :]
  return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

class LlamaLayer:
  def __init__(self, weights: dict[str, Tensor], cfg: LlamaConfig):
    self.w, self.cfg = weights, cfg

  def __call__(self, x: Tensor, cache_k: Tensor, cache_v: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, place: Tensor,
               written: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    cfg, w = self.cfg, self.w
    T, hd, n_kv, rep = x.shape[0], cfg.head_dim, cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads
    h = rms_norm(x, w["attn_norm"], cfg.rms_eps)
    q, k, v = _linear(h, w, "attn_q"), _linear(h, w, "attn_k"), _linear(h, w, "attn_v")
    q = rope_interleaved(q.reshape(T, cfg.n_heads, hd), cos, sin)
    k = rope_interleaved(k.reshape(T, n_kv, hd), cos, sin).reshape(T, n_kv * hd)
    # the new rows land at their positions: place (C, T) is one-hot, written (C, 1) marks the rows it fills
    new_k = written.where(place @ k, cache_k)  # (C, n_kv*hd)
    new_v = written.where(place @ v, cache_v)
    C = new_k.shape[0]
    qh = q.reshape(T, n_kv, rep, hd).permute(1, 2, 0, 3)  # (n_kv, rep, T, hd)
    kh = new_k.reshape(C, n_kv, 1, hd).permute(1, 2, 3, 0)  # (n_kv, 1, hd, C)
    vh = new_v.reshape(C, n_kv, 1, hd).permute(1, 2, 0, 3)  # (n_kv, 1, C, hd)
    scores = (qh @ kh) * (1.0 / math.sqrt(hd)) + mask  # (n_kv, rep, T, C)
    attn = (softmax(scores) @ vh).permute(2, 0, 1, 3).reshape(T, cfg.n_heads * hd)  # (T, heads*hd)
    x = x + _linear(attn, w, "attn_output")
    h = rms_norm(x, w["ffn_norm"], cfg.rms_eps)
    x = x + _linear(silu(_linear(h, w, "ffn_gate")) * _linear(h, w, "ffn_up"), w, "ffn_down")
    return x, new_k, new_v

def _linear(x: Tensor, w: dict[str, Tensor], name: str) -> Tensor:
  # weights are stored (out, in) as in GGUF; x @ W.T reduces along W's contiguous rows
  y = x @ w[name].T
  return y + w[name + ".bias"] if name + ".bias" in w else y

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
OPTIONAL_LAYER_TENSORS = ("attn_q.bias", "attn_k.bias", "attn_v.bias")

class Llama:
  """A Llama-family model with a KV cache of `max_context` positions.

  >>> model = Llama.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", max_context=512)  # doctest: +SKIP
  >>> logits = model.forward([6403, 1980, 253, 655])  # doctest: +SKIP  (vocab,) float32 of the last position
  """
  def __init__(self, cfg: LlamaConfig, weights: dict[str, np.ndarray], max_context: int = 512,
               device: str | None = None):
    self.cfg, self.device = cfg, device
    self.max_context = min(max_context, cfg.context_length)
    if self.max_context <= 0: raise ModelError(f"max_context must be positive, got {max_context}")
    self.embedding = _check_shape(weights, "token_embd.weight", (cfg.vocab_size, cfg.dim))
    head = weights.get("output.weight", self.embedding)  # tied LM head when the file has no output.weight
    head = _check_shape({"output.weight": head}, "output.weight", (cfg.vocab_size, cfg.dim))
    self.lm_head = Tensor(head, device=device).realize()
    self.norm = Tensor(_check_shape(weights, "output_norm.weight", (cfg.dim,)), device=device).realize()
    kv = cfg.n_kv_heads * cfg.head_dim
    shapes = {"attn_norm": (cfg.dim,), "attn_q": (cfg.dim, cfg.dim), "attn_k": (kv, cfg.dim), "attn_v": (kv, cfg.dim),
              "attn_output": (cfg.dim, cfg.dim), "ffn_norm": (cfg.dim,), "ffn_gate": (cfg.ffn_dim, cfg.dim),
              "ffn_up": (cfg.ffn_dim, cfg.dim), "ffn_down": (cfg.dim, cfg.ffn_dim),
              "attn_q.bias": (cfg.dim,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
    self.layers: list[LlamaLayer] = []
    for i in range(cfg.n_layers):
      lw: dict[str, Tensor] = {}
      for name in LAYER_TENSORS + OPTIONAL_LAYER_TENSORS:
        key = f"blk.{i}.{name}" if "." in name else f"blk.{i}.{name}.weight"
        if name in OPTIONAL_LAYER_TENSORS and key not in weights: continue
        lw[name] = Tensor(_check_shape(weights, key, shapes[name]), device=device).realize()
      self.layers.append(LlamaLayer(lw, cfg))
    self._alloc_cache()

  @classmethod
  def from_gguf(cls, source: str | GGUFFile, max_context: int = 512, device: str | None = None) -> Llama:
    """Build the model from a GGUF file, dequantising every weight to float32."""
    f = source if isinstance(source, GGUFFile) else GGUFFile(source)
    emb = f.tensors.get("token_embd.weight")
    if emb is None: raise ModelError(f"{f.path}: no token_embd.weight tensor; is this a llama-family GGUF?")
    cfg = LlamaConfig.from_gguf_metadata(f.metadata, vocab_size=emb.shape[0])
    return cls(cfg, {name: f.tensor(name) for name in f.tensors}, max_context=max_context, device=device)

  def _alloc_cache(self) -> None:
    width = self.cfg.n_kv_heads * self.cfg.head_dim
    zeros = np.zeros((self.max_context, width), np.float32)
    self.cache_k = [Tensor(zeros, device=self.device).realize() for _ in self.layers]
    self.cache_v = [Tensor(zeros, device=self.device).realize() for _ in self.layers]
    self.pos = 0
    self._decode_jit = TinyJit(self._step)

  def reset(self) -> None:
    """Empty the KV cache: the next forward starts at position 0. Rows past the position are never read (the causal
    mask hides them and each row is written before it is attended to), so the buffers and the captured decode step
    are kept."""
    self.pos = 0

  def rewind(self, pos: int) -> None:
    """Forget the cached positions from `pos` on (the next forward writes there); 0 <= pos <= the current position."""
    if not 0 <= pos <= self.pos: raise ModelError(f"rewind position {pos} is outside [0, {self.pos}]")
    self.pos = pos

  def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray:
    """Run `tokens` at positions pos..pos+T-1, append their keys/values to the cache; the last position's logits."""
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    T, C, start = ids.size, self.max_context, self.pos
    if T == 0: raise ModelError("forward needs at least one token")
    if start + T > C:
      raise ContextOverflowError(f"context overflow: {start} cached + {T} new tokens > max_context {C}; start a "
        f"new conversation or raise max_context")
    if ids.min() < 0 or ids.max() >= self.cfg.vocab_size:
      raise ModelError(f"token ids must be in [0, {self.cfg.vocab_size}), got min {ids.min()} max {ids.max()}")
    positions = np.arange(start, start + T)
    cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
    cols = np.arange(C)
    mask = np.where(cols[None, :] <= positions[:, None], 0.0, -np.inf).astype(np.float32)  # (T, C) causal
    place = (cols[:, None] == positions[None, :]).astype(np.float32)  # (C, T)
    written = place.any(axis=1, keepdims=True)  # (C, 1)
    dev = self.device
    x = Tensor(self.embedding[ids], device=dev)
    inputs = [Tensor(a, device=dev) for a in (cos, sin, mask, place)] + [Tensor(written, device=dev)]
    # a decode step is the same graph every time (only input data changes): TinyJit captures it once and replays it
    step = self._decode_jit if T == 1 else self._step
    logits = step(x, *inputs)
    self.pos = start + T
    return logits.numpy()

  def _step(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, place: Tensor, written: Tensor) -> Tensor:
    T = x.shape[0]
    for layer, ck, cv in zip(self.layers, self.cache_k, self.cache_v):
      x, k, v = layer(x, ck, cv, cos, sin, mask, place, written)
      # the caches are updated in place (same buffers), so a captured decode step keeps writing where it reads
      ck.assign(k)
      cv.assign(v)
    last = x[T - 1:T]  # (1, dim): only the last position's logits are needed
    logits = (rms_norm(last, self.norm, self.cfg.rms_eps) @ self.lm_head.T).reshape(self.cfg.vocab_size)
    Tensor.realize(logits, *self.cache_k, *self.cache_v)
    return logits

def _check_shape(weights: dict[str, np.ndarray], key: str, shape: tuple[int, ...]) -> np.ndarray:
  if key not in weights: raise ModelError(f"GGUF model lacks tensor {key!r}")
  arr = weights[key]
  if tuple(arr.shape) != shape: raise ModelError(f"tensor {key!r} has shape {tuple(arr.shape)}, expected {shape} "
    f"from the metadata")
  return np.ascontiguousarray(arr, dtype=np.float32)
