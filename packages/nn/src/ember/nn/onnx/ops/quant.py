"""Quantization: QuantizeLinear / DequantizeLinear (per tensor, per axis, blocked), DynamicQuantizeLinear and the
integer ops (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv). Integer math runs in int32, rounding is half to
even and results saturate to the output type, as the spec says."""
from __future__ import annotations
from typing import Any
from ember import Tensor, dtypes
from ember.dtype import DType
from ember.nn.onnx.registry import onnx_op
from ember.nn.onnx.ops.common import dim, axis as norm_axis
from ember.nn.onnx.ops.nn import conv

def _along(param: Tensor, x: Tensor, axis: int, block_size: int) -> Tensor:
  """A scale or zero point shaped to broadcast against x: one value per index of `axis`, or per block of it."""
  if param.numel() == 1: return param.reshape(())
  a = norm_axis(axis, x.ndim)
  if block_size:
    return param.repeat_interleave(block_size, a).shrink([(0, dim(x, a)) if i == a else None
                                                          for i in range(x.ndim)])
  return param.reshape([dim(param, 0) if i == a else 1 for i in range(x.ndim)])

def _saturate(x: Tensor, dt: DType) -> Tensor:
  if dtypes.is_float(dt): return x.cast(dt)
  return x.clip(dtypes.min(dt), dtypes.max(dt)).cast(dt)

@onnx_op("QuantizeLinear", since=10)
def quantize_linear(x: Tensor, scale: Tensor, zero_point: Tensor | None = None, axis: int = 1, block_size: int = 0,
                    output_dtype: int = 0, saturate: int = 1, precision: int = 0) -> Tensor:
  from ember.nn.onnx.model import to_dtype
  dt = zero_point.dtype if zero_point is not None else to_dtype(output_dtype, "QuantizeLinear output_dtype") \
    if output_dtype else dtypes.uint8
  s = _along(scale, x, axis, block_size)
  q = x.cast(s.dtype) / s if x.dtype != s.dtype else x / s
  if dtypes.is_int(dt): q = q.round()
  if zero_point is not None: q = q + _along(zero_point, x, axis, block_size).cast(q.dtype)
  return _saturate(q, dt)

@onnx_op("DequantizeLinear", since=10)
def dequantize_linear(x: Tensor, scale: Tensor, zero_point: Tensor | None = None, axis: int = 1, block_size: int = 0,
                      output_dtype: int = 0) -> Tensor:
  s = _along(scale, x, axis, block_size)
  v = x.cast(dtypes.float32) if not dtypes.is_float(x.dtype) else x.cast(dtypes.float32)
  if zero_point is not None: v = v - _along(zero_point, x, axis, block_size).cast(dtypes.float32)
  return (v * s.cast(dtypes.float32)).cast(scale.dtype)

@onnx_op("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
  hi, lo = x.max().maximum(0), x.min().minimum(0)
  scale = (hi - lo) / 255
  zero = (-lo / scale).round().clip(0, 255)
  y = ((x / scale).round() + zero).clip(0, 255).cast(dtypes.uint8)
  return y, scale.cast(x.dtype), zero.cast(dtypes.uint8)

def _centered(x: Tensor, zero_point: Tensor | None) -> Tensor:
  v = x.cast(dtypes.int32)
  return v if zero_point is None else v - zero_point.cast(dtypes.int32)

@onnx_op("MatMulInteger", since=10)
def matmul_integer(a: Tensor, b: Tensor, a_zero_point: Tensor | None = None,
                   b_zero_point: Tensor | None = None) -> Tensor:
  azp = a_zero_point.reshape(-1, 1) if a_zero_point is not None and a_zero_point.numel() > 1 else a_zero_point
  return (_centered(a, azp) @ _centered(b, b_zero_point)).cast(dtypes.int32)

@onnx_op("ConvInteger", since=10)
def conv_integer(x: Tensor, w: Tensor, x_zero_point: Tensor | None = None, w_zero_point: Tensor | None = None,
                 **attrs: Any) -> Tensor:
  wzp = w_zero_point.reshape(-1, *([1] * (w.ndim - 1))) if w_zero_point is not None and w_zero_point.numel() > 1 \
    else w_zero_point
  return conv(_centered(x, x_zero_point), _centered(w, wzp), **attrs).cast(dtypes.int32)

def _requantize(acc: Tensor, scale: Tensor, y_scale: Tensor, y_zero_point: Tensor) -> Tensor:
  y = (acc.cast(dtypes.float32) * (scale.cast(dtypes.float32) / y_scale.cast(dtypes.float32))).round()
  return _saturate(y + y_zero_point.cast(dtypes.float32), y_zero_point.dtype)

@onnx_op("QLinearMatMul", since=10)
def qlinear_matmul(a: Tensor, a_scale: Tensor, a_zero_point: Tensor, b: Tensor, b_scale: Tensor, b_zero_point: Tensor,
                   y_scale: Tensor, y_zero_point: Tensor) -> Tensor:
  acc = _centered(a, a_zero_point.reshape(-1, 1) if a_zero_point.numel() > 1 else a_zero_point) @ \
    _centered(b, b_zero_point)
  sa = a_scale.reshape(-1, 1) if a_scale.numel() > 1 else a_scale
  return _requantize(acc, sa * b_scale, y_scale, y_zero_point)

@onnx_op("QLinearConv", since=10)
def qlinear_conv(x: Tensor, x_scale: Tensor, x_zero_point: Tensor, w: Tensor, w_scale: Tensor, w_zero_point: Tensor,
                 y_scale: Tensor, y_zero_point: Tensor, b: Tensor | None = None, **attrs: Any) -> Tensor:
  acc = conv_integer(x, w, x_zero_point, w_zero_point, **attrs)
  if b is not None: acc = acc + b.cast(dtypes.int32).reshape(1, -1, *([1] * (x.ndim - 2)))
  ws = w_scale.reshape(1, -1, *([1] * (x.ndim - 2))) if w_scale.numel() > 1 else w_scale
  return _requantize(acc, x_scale * ws, y_scale, y_zero_point)
