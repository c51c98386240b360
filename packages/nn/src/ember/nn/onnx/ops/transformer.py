"""Transformer ops: ONNX's Attention and RotaryEmbedding (opset 23), and the com.microsoft fusions exported
transformers use (SkipLayerNormalization, SimplifiedLayerNormalization, Gelu/FastGelu/BiasGelu/QuickGelu)."""
from __future__ import annotations
import math
from ember import Tensor, dtypes
from ember.nn.onnx.errors import UnsupportedOpError
from ember.nn.onnx.registry import onnx_op
from ember.nn.onnx.ops.common import dim
from ember.nn.onnx.ops.nn import layer_norm

MS = "com.microsoft"

@onnx_op("Attention", since=23)
def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, past_key: Tensor | None = None,
              past_value: Tensor | None = None, nonpad_kv_seqlen: Tensor | None = None, is_causal: int = 0,
              kv_num_heads: int | None = None, q_num_heads: int | None = None, qk_matmul_output_mode: int = 0,
              scale: float | None = None, softcap: float = 0.0, softmax_precision: int | None = None
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  if nonpad_kv_seqlen is not None: raise UnsupportedOpError("Attention with nonpad_kv_seqlen")
  three_d = q.ndim == 3
  if three_d:  # (B, T, H*D) -> (B, H, T, D)
    assert q_num_heads is not None and kv_num_heads is not None
    q = q.reshape(q.shape[0], q.shape[1], q_num_heads, -1).permute(0, 2, 1, 3)
    k = k.reshape(k.shape[0], k.shape[1], kv_num_heads, -1).permute(0, 2, 1, 3)
    v = v.reshape(v.shape[0], v.shape[1], kv_num_heads, -1).permute(0, 2, 1, 3)
  if past_key is not None: k = past_key.cat(k, dim=2)
  if past_value is not None: v = past_value.cat(v, dim=2)
  present_k, present_v = k, v
  hq, hk = dim(q, 1), dim(k, 1)
  if hq != hk: k, v = k.repeat_interleave(hq // hk, 1), v.repeat_interleave(hq // hk, 1)
  s = scale if scale is not None else 1.0 / math.sqrt(dim(q, -1))
  scores = (q @ k.transpose(-1, -2)) * s
  qk = scores
  tq, tk = dim(q, -2), dim(k, -2)
  if is_causal:
    rows = Tensor.arange(tq, device=q.device).reshape(tq, 1) + (tk - tq)
    keep = rows >= Tensor.arange(tk, device=q.device).reshape(1, tk)
    scores = keep.where(scores, -math.inf)
  if attn_mask is not None:
    is_bool = attn_mask.dtype == dtypes.bool
    if attn_mask.shape[-1] < tk:  # a mask shorter than the keys (past + new) leaves the rest masked out
      attn_mask = attn_mask.pad([(0, 0)] * (attn_mask.ndim - 1) + [(0, tk - attn_mask.shape[-1])],
                                value=False if is_bool else -math.inf)
    scores = scores + (attn_mask.where(0.0, -math.inf).cast(scores.dtype) if is_bool else attn_mask)
  if qk_matmul_output_mode == 1: qk = scores
  if softcap > 0: scores = (scores / softcap).tanh() * softcap
  if qk_matmul_output_mode == 2: qk = scores
  probs = scores.cast(dtypes.float32).softmax(-1).cast(q.dtype) if softmax_precision else scores.softmax(-1)
  if qk_matmul_output_mode == 3: qk = probs
  out = probs @ v
  if three_d: out = out.permute(0, 2, 1, 3).reshape(out.shape[0], out.shape[2], -1)
  return out.cast(q.dtype), present_k, present_v, qk

@onnx_op("RotaryEmbedding", since=23)
def rotary_embedding(x: Tensor, cos_cache: Tensor, sin_cache: Tensor, position_ids: Tensor | None = None,
                     interleaved: int = 0, num_heads: int | None = None, rotary_embedding_dim: int = 0) -> Tensor:
  shape = x.shape
  if x.ndim == 4: x = x.permute(0, 2, 1, 3)  # (B, H, T, D) -> (B, T, H, D)
  else:
    assert num_heads is not None
    x = x.reshape(shape[0], shape[1], num_heads, -1)
  head = dim(x, -1)
  rot = rotary_embedding_dim or head
  xr, xp = x[..., :rot], x[..., rot:]
  cos = cos_cache[position_ids] if position_ids is not None else cos_cache
  sin = sin_cache[position_ids] if position_ids is not None else sin_cache
  cos, sin = cos[..., :rot // 2].unsqueeze(2), sin[..., :rot // 2].unsqueeze(2)  # (B, T, 1, rot/2)
  if interleaved: x1, x2 = xr[..., 0::2], xr[..., 1::2]
  else: x1, x2 = xr[..., :rot // 2], xr[..., rot // 2:]
  real, imag = x1 * cos - x2 * sin, x1 * sin + x2 * cos
  rotated = real.stack(imag, dim=-1).reshape(*real.shape[:-1], rot) if interleaved else real.cat(imag, dim=-1)
  out = rotated.cat(xp, dim=-1) if rot < head else rotated
  return out.permute(0, 2, 1, 3) if len(shape) == 4 else out.reshape(shape)

# ** com.microsoft **

onnx_op("LayerNormalization", domain=MS)(layer_norm)

@onnx_op("SkipLayerNormalization", domain=MS)
def skip_layer_norm(x: Tensor, skip: Tensor, gamma: Tensor, beta: Tensor | None = None, bias: Tensor | None = None,
                    epsilon: float = 1e-12) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  s = x + skip if bias is None else x + skip + bias
  y, mean, inv_std = layer_norm(s, gamma, beta, -1, epsilon)
  return y, mean, inv_std, s

@onnx_op("SimplifiedLayerNormalization", domain=MS)
def simplified_layer_norm(x: Tensor, scale: Tensor, axis: int = -1, epsilon: float = 1e-5,
                          stash_type: int = 1) -> Tensor:
  from ember.nn.onnx.ops.nn import rms_norm
  return rms_norm(x, scale, axis, epsilon)

@onnx_op("Gelu", domain=MS)
def ms_gelu(x: Tensor) -> Tensor: return x.gelu()
@onnx_op("BiasGelu", domain=MS)
def bias_gelu(x: Tensor, bias: Tensor) -> Tensor: return (x + bias).gelu()
@onnx_op("FastGelu", domain=MS)
def fast_gelu(x: Tensor, bias: Tensor | None = None) -> Tensor:
  return (x if bias is None else x + bias).gelu(approximate="tanh")
@onnx_op("QuickGelu", domain=MS)
def quick_gelu(x: Tensor, alpha: float = 1.702) -> Tensor: return x * (x * alpha).sigmoid()
