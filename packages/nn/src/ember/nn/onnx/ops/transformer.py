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

def _masked_softmax(scores: Tensor, bias: Tensor) -> Tensor:
  """softmax over the last axis; a row every key of which the mask removes is 0 (not NaN), as ONNX's reference."""
  dead = bias.max(-1, keepdim=True) == -math.inf
  safe = dead.where(0.0, scores).cast(scores.dtype)
  return dead.where(0.0, safe.softmax(-1)).cast(scores.dtype)

@onnx_op("Attention", since=23)
def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, past_key: Tensor | None = None,
              past_value: Tensor | None = None, nonpad_kv_seqlen: Tensor | None = None, is_causal: int = 0,
              kv_num_heads: int | None = None, q_num_heads: int | None = None, qk_matmul_output_mode: int = 0,
              scale: float | None = None, softcap: float = 0.0, softmax_precision: int | None = None,
              left_window_size: int = -1, right_window_size: int = -1) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  three_d = q.ndim == 3
  if three_d:  # (B, T, H*D) -> (B, H, T, D)
    if q_num_heads is None or kv_num_heads is None:
      raise UnsupportedOpError("3-D Attention inputs need q_num_heads and kv_num_heads")
    q = q.reshape(dim(q, 0), dim(q, 1), q_num_heads, -1).permute(0, 2, 1, 3)
    k = k.reshape(dim(k, 0), dim(k, 1), kv_num_heads, -1).permute(0, 2, 1, 3)
    v = v.reshape(dim(v, 0), dim(v, 1), kv_num_heads, -1).permute(0, 2, 1, 3)
  past = dim(past_key, 2) if past_key is not None else 0
  if past_key is not None: k = past_key.cat(k, dim=2)
  if past_value is not None: v = past_value.cat(v, dim=2)
  present_k, present_v = k, v
  batch, tq, tk = dim(q, 0), dim(q, 2), dim(k, 2)
  dev, dt = q.device, q.dtype
  bias = Tensor.zeros(tq, tk, dtype=dt, device=dev)
  if attn_mask is not None:
    is_bool = attn_mask.dtype == dtypes.bool
    if dim(attn_mask, -1) < tk:  # a mask shorter than the keys (past + new) masks the rest out
      attn_mask = attn_mask.pad([(0, 0)] * (attn_mask.ndim - 1) + [(0, tk - dim(attn_mask, -1))],
                                value=False if is_bool else -math.inf)
    bias = bias + (attn_mask.where(0.0, -math.inf).cast(dt) if is_bool else attn_mask.cast(dt))
  rows = Tensor.arange(tq, device=dev).reshape(tq, 1)
  cols = Tensor.arange(tk, device=dev).reshape(1, tk)
  lens = nonpad_kv_seqlen.cast(dtypes.int32).reshape(batch, 1, 1, 1) if nonpad_kv_seqlen is not None else None
  # key j is in the causal frontier of query i when j <= i + offset: the cache length, or per batch nonpad - tq
  diff = rows + (lens - tq if lens is not None else past) - cols
  if is_causal: bias = bias + (diff >= 0).where(0.0, -math.inf).cast(dt)
  if left_window_size >= 0: bias = bias + (diff <= left_window_size).where(0.0, -math.inf).cast(dt)
  if right_window_size >= 0: bias = bias + (-diff <= right_window_size).where(0.0, -math.inf).cast(dt)
  if lens is not None: bias = bias + (cols < lens).where(0.0, -math.inf).cast(dt)
  hq, hk = dim(q, 1), dim(k, 1)
  if hq != hk: k, v = k.repeat_interleave(hq // hk, 1), v.repeat_interleave(hq // hk, 1)
  root = math.sqrt(scale if scale is not None else 1.0 / math.sqrt(dim(q, -1)))
  qk = (q * root) @ (k.transpose(-1, -2) * root)
  if softcap > 0: qk = (qk / softcap).tanh() * softcap
  scores = qk + bias
  if softmax_precision:
    from ember.nn.onnx.model import to_dtype
    scores = scores.cast(to_dtype(softmax_precision, "Attention softmax_precision"))
  probs = _masked_softmax(scores, bias).cast(dt)
  qk_out = scores.cast(dt) if qk_matmul_output_mode == 2 else probs if qk_matmul_output_mode == 3 else qk
  out = probs @ v
  if three_d: out = out.permute(0, 2, 1, 3).reshape(dim(out, 0), dim(out, 2), -1)
  return out.cast(dt), present_k, present_v, qk_out

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
