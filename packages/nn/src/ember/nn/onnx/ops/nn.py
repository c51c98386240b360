"""Neural-network ops: MatMul/Gemm/Einsum, Conv/ConvTranspose, pooling, normalizations, softmax family, Dropout,
LRN and Resize/Upsample.

ONNX pads list every spatial dim's begin, then every end; pooling and convolution pad explicitly here and then run
ember's conv2d/max_pool2d/avg_pool2d unpadded, which makes asymmetric pads, auto_pad and ceil_mode one code path."""
from __future__ import annotations
import itertools
import math
from typing import Any, Callable, Sequence
import numpy as np
from ember import Tensor, dtypes
from ember.errors import ShapeError
from ember.nn.onnx.errors import UnsupportedOpError
from ember.nn.onnx.registry import onnx_op
from ember.nn.onnx.ops.common import (auto_pads, axes_of, axis as norm_axis, dim, dims, floats, full_pads, ints, lowest,
                                      scalar)

@onnx_op("MatMul")
def matmul(a: Tensor, b: Tensor) -> Tensor: return (a @ b).cast(a.dtype)

@onnx_op("Gemm")
def gemm(a: Tensor, b: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 1.0, transA: int = 0,  # noqa: N803
         transB: int = 0, broadcast: int = 0) -> Tensor:  # noqa: N803
  out = (a.T if transA else a) @ (b.T if transB else b)
  if alpha != 1.0: out = out * alpha
  if c is not None: out = out + (c * beta if beta != 1.0 else c)
  return out.cast(a.dtype)

@onnx_op("Einsum", since=12)
def einsum(*xs: Tensor, equation: str) -> Tensor: return Tensor.einsum(equation.replace(" ", ""), *xs).cast(xs[0].dtype)

# ** convolution **

def _geometry(x: Tensor, kernel: Sequence[int], auto_pad: str, pads: Sequence[int] | None,
              strides: Sequence[int] | None,
              dilations: Sequence[int] | None) -> tuple[list[int], list[int], list[tuple[int, int]]]:
  n = len(kernel)
  st = list(strides) if strides else [1] * n
  dl = list(dilations) if dilations else [1] * n
  return st, dl, auto_pads(auto_pad, dims(x)[2:], kernel, st, dl, pads)

@onnx_op("Conv")
def conv(x: Tensor, w: Tensor, b: Tensor | None = None, auto_pad: str = "NOTSET", dilations: list[int] | None = None,
         group: int = 1, kernel_shape: list[int] | None = None, pads: list[int] | None = None,
         strides: list[int] | None = None) -> Tensor:
  kernel = kernel_shape or dims(w)[2:]
  st, dl, pp = _geometry(x, kernel, auto_pad, pads, strides, dilations)
  flat = [v for pair in reversed(pp) for v in pair]  # F.pad order: last dim first
  return x.conv2d(w, b, groups=group, stride=st, dilation=dl, padding=flat)

@onnx_op("ConvTranspose")
def conv_transpose(x: Tensor, w: Tensor, b: Tensor | None = None, auto_pad: str = "NOTSET",
                   dilations: list[int] | None = None, group: int = 1, kernel_shape: list[int] | None = None,
                   output_padding: list[int] | None = None, output_shape: list[int] | None = None,
                   pads: list[int] | None = None, strides: list[int] | None = None) -> Tensor:
  kernel = kernel_shape or dims(w)[2:]
  n = len(kernel)
  st, dl = list(strides or [1] * n), list(dilations or [1] * n)
  op = list(output_padding or [0] * n)
  sizes = dims(x)[2:]
  full = [s * (i - 1) + (k - 1) * d + 1 for s, i, k, d in zip(st, sizes, kernel, dl)]  # before padding is removed
  if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
    target = list(output_shape[-n:]) if output_shape is not None else [i * s for i, s in zip(sizes, st)]
    totals = [f + o - t for f, o, t in zip(full, op, target)]
    # the spec: SAME_UPPER puts an odd extra pad at the end, NOTSET and SAME_LOWER at the begin
    pp = [(t // 2, t - t // 2) if auto_pad == "SAME_UPPER" else (t - t // 2, t // 2) for t in totals]
  elif auto_pad == "VALID" or not pads: pp = [(0, 0)] * n
  else: pp = [(pads[i], pads[i + n]) for i in range(n)]
  y = x.conv_transpose2d(w, None, groups=group, stride=st, dilation=dl)
  # output_padding adds zeros (no input reaches there) at the end; pads crop each side
  y = y.pad(full_pads(y, [(-p0, o - p1) for (p0, p1), o in zip(pp, op)]))
  return y if b is None else y + b.reshape(1, -1, *([1] * n))

# ** pooling **

def _pool_pads(x: Tensor, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
               pp: list[tuple[int, int]], ceil_mode: int) -> list[tuple[int, int]]:
  """The pads plus the extra end room ceil_mode needs (a last window starting inside the input or its begin pad)."""
  out = []
  for size, k, s, d, (p0, p1) in zip(dims(x)[2:], kernel, strides, dilations, pp):
    span = size + p0 + p1 - ((k - 1) * d + 1)
    if span < 0:
      raise ShapeError(f"pooling window {(k - 1) * d + 1} is larger than the padded input {size + p0 + p1}")
    count = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (count - 1) * s >= size + p0: count -= 1
    out.append((p0, max(p1, (count - 1) * s + (k - 1) * d + 1 - size - p0)))
  return out

def _pool_setup(x: Tensor, kernel_shape: list[int], auto_pad: str, pads: list[int] | None, strides: list[int] | None,
                dilations: list[int] | None, ceil_mode: int) -> tuple[list[int], list[int], list[tuple[int, int]],
                                                                       list[tuple[int, int]]]:
  st, dl, pp = _geometry(x, kernel_shape, auto_pad, pads, strides, dilations)
  return st, dl, pp, _pool_pads(x, kernel_shape, st, dl, pp, ceil_mode)

@onnx_op("MaxPool")
def max_pool(x: Tensor, kernel_shape: list[int], auto_pad: str = "NOTSET", ceil_mode: int = 0,
             dilations: list[int] | None = None, pads: list[int] | None = None, storage_order: int = 0,
             strides: list[int] | None = None) -> tuple[Tensor, Tensor]:
  st, dl, _, padded = _pool_setup(x, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode)
  xp = x.pad(full_pads(x, padded), value=lowest(x.dtype))
  pooled = xp.max_pool2d(tuple(kernel_shape), st, dl, 0, return_indices=True)
  assert isinstance(pooled, tuple)
  values, flat = pooled
  # flat indexes the padded spatial dims: turn it into ONNX's index over the whole unpadded tensor
  nd, spatial = len(kernel_shape), dims(x)[2:]
  psizes = dims(xp)[2:]
  flat = flat.cast(dtypes.int64)
  idx = Tensor.zeros(*flat.shape, dtype=dtypes.int64, device=x.device)
  order = list(range(nd)) if not storage_order else list(reversed(range(nd)))
  for j in range(nd):
    coord = (flat // math.prod(psizes[j + 1:])) % psizes[j] - padded[j][0]
    stride = math.prod(spatial[k] for k in order[order.index(j) + 1:])
    idx = idx + coord * stride
  lead = math.prod(spatial)
  nc = dim(x, 0) * dim(x, 1)
  base = Tensor.arange(nc, dtype=dtypes.int64, device=x.device).reshape(x.shape[0], x.shape[1], *([1] * nd)) * lead
  return values.cast(x.dtype), idx + base

def _window_sum(x: Tensor, kernel: list[int], strides: list[int], dilations: list[int]) -> Tensor:
  return x.avg_pool2d(tuple(kernel), strides, 0, divisor_override=1, dilation=dilations)

@onnx_op("AveragePool")
def average_pool(x: Tensor, kernel_shape: list[int], auto_pad: str = "NOTSET", ceil_mode: int = 0,
                 count_include_pad: int = 0, dilations: list[int] | None = None, pads: list[int] | None = None,
                 strides: list[int] | None = None) -> Tensor:
  st, dl, pp, padded = _pool_setup(x, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode)
  total = _window_sum(x.pad(full_pads(x, padded)), kernel_shape, st, dl)
  ones = Tensor.ones(*x.shape[2:], dtype=x.dtype, device=x.device)
  if count_include_pad:  # the pads count, the extra room of ceil_mode does not
    ones = ones.pad(pp, value=1.0).pad([(0, p1 - q1) for (_, p1), (_, q1) in zip(padded, pp)])
  else: ones = ones.pad(padded)
  return (total / _window_sum(ones.reshape(1, 1, *ones.shape), kernel_shape, st, dl)).cast(x.dtype)

@onnx_op("LpPool")
def lp_pool(x: Tensor, kernel_shape: list[int], auto_pad: str = "NOTSET", ceil_mode: int = 0,
            dilations: list[int] | None = None, p: int | float = 2, pads: list[int] | None = None,
            strides: list[int] | None = None) -> Tensor:
  st, dl, _, padded = _pool_setup(x, kernel_shape, auto_pad, pads, strides, dilations, ceil_mode)
  return _window_sum(x.abs().pow(p).pad(full_pads(x, padded)), kernel_shape, st, dl).pow(1.0 / p).cast(x.dtype)

@onnx_op("GlobalAveragePool")
def global_average_pool(x: Tensor) -> Tensor: return x.mean(tuple(range(2, x.ndim)), keepdim=True)
@onnx_op("GlobalMaxPool")
def global_max_pool(x: Tensor) -> Tensor: return x.max(tuple(range(2, x.ndim)), keepdim=True)
@onnx_op("GlobalLpPool", since=2)
def global_lp_pool(x: Tensor, p: int = 2) -> Tensor:
  return x.abs().pow(p).sum(tuple(range(2, x.ndim)), keepdim=True).pow(1.0 / p).cast(x.dtype)

@onnx_op("MaxUnpool", since=9)
def max_unpool(x: Tensor, indices: Tensor, output_shape: Tensor | None = None, kernel_shape: list[int] | None = None,
               pads: list[int] | None = None, strides: list[int] | None = None) -> Tensor:
  kernel = kernel_shape or []
  n = len(kernel)
  st, pp = strides or [1] * n, pads or [0] * (2 * n)
  if output_shape is not None: out = ints(output_shape) or []
  else:
    spatial = enumerate(zip(dims(x)[2:], st, kernel))
    out = dims(x)[:2] + [(i - 1) * s + k - pp[j] - pp[j + n] for j, (i, s, k) in spatial]
  total = math.prod(out)
  flat = Tensor.zeros(total, dtype=x.dtype, device=x.device)
  return flat.scatter(0, indices.reshape(-1).cast(dtypes.int64), x.reshape(-1)).reshape(out)

# ** normalization **

def _channel(t: Tensor, ndim: int) -> Tensor: return t.reshape(1, -1, *([1] * (ndim - 2)))

@onnx_op("BatchNormalization")
def batch_norm(x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor, epsilon: float = 1e-5,
               momentum: float = 0.9, training_mode: int = 0, spatial: int = 1, is_test: int = 1,
               consumed_inputs: Any = None) -> Any:
  if training_mode:
    axes = tuple(i for i in range(x.ndim) if i != 1)
    cur_mean, cur_var = x.mean(axes), x.var(axes, correction=0)
    inv = _channel((cur_var + epsilon).rsqrt() * scale, x.ndim)
    y = (x - _channel(cur_mean, x.ndim)) * inv + _channel(bias, x.ndim)
    run_mean = mean * momentum + cur_mean * (1 - momentum)
    run_var = var * momentum + cur_var * (1 - momentum)
    return y.cast(x.dtype), run_mean.cast(mean.dtype), run_var.cast(var.dtype)
  inv = (var + epsilon).rsqrt() * scale
  return ((x - _channel(mean, x.ndim)) * _channel(inv, x.ndim) + _channel(bias, x.ndim)).cast(x.dtype)

def _normalize(x: Tensor, axes: tuple[int, ...], epsilon: float,
               stash: Any = dtypes.float32) -> tuple[Tensor, Tensor, Tensor]:
  xs = x.cast(stash) if dtypes.is_float(x.dtype) and x.dtype.itemsize < 4 else x
  mean = xs.mean(axes, keepdim=True)
  centered = xs - mean
  inv_std = (centered.square().mean(axes, keepdim=True) + epsilon).rsqrt()
  return centered * inv_std, mean, inv_std

@onnx_op("InstanceNormalization")
def instance_norm(x: Tensor, scale: Tensor, bias: Tensor, epsilon: float = 1e-5, consumed_inputs: Any = None) -> Tensor:
  y, _, _ = _normalize(x, tuple(range(2, x.ndim)), epsilon)
  return (y * _channel(scale, x.ndim) + _channel(bias, x.ndim)).cast(x.dtype)

@onnx_op("LayerNormalization", since=17)
def layer_norm(x: Tensor, scale: Tensor, bias: Tensor | None = None, axis: int = -1, epsilon: float = 1e-5,
               stash_type: int = 1) -> tuple[Tensor, Tensor, Tensor]:
  a = norm_axis(axis, x.ndim)
  y, mean, inv_std = _normalize(x, tuple(range(a, x.ndim)), epsilon)
  y = y * scale
  if bias is not None: y = y + bias
  return y.cast(x.dtype), mean, inv_std

@onnx_op("GroupNormalization", since=18)
def group_norm_18(x: Tensor, scale: Tensor, bias: Tensor, epsilon: float = 1e-5, num_groups: int = 1) -> Tensor:
  # opset 18: scale and bias have one value per group
  c = dim(x, 1)
  return group_norm_21(x, scale.repeat_interleave(c // num_groups), bias.repeat_interleave(c // num_groups), epsilon,
                       num_groups)

@onnx_op("GroupNormalization", since=21)
def group_norm_21(x: Tensor, scale: Tensor, bias: Tensor, epsilon: float = 1e-5, num_groups: int = 1,
                  stash_type: int = 1) -> Tensor:
  grouped = x.reshape(dim(x, 0), num_groups, -1)
  y, _, _ = _normalize(grouped, (2,), epsilon)
  return (y.reshape(x.shape) * _channel(scale, x.ndim) + _channel(bias, x.ndim)).cast(x.dtype)

@onnx_op("RMSNormalization", since=23)
def rms_norm(x: Tensor, scale: Tensor, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1) -> Tensor:
  a = norm_axis(axis, x.ndim)
  xs = x.cast(dtypes.float32) if x.dtype.itemsize < 4 else x
  y = xs * (xs.square().mean(tuple(range(a, x.ndim)), keepdim=True) + epsilon).rsqrt()
  return (y.cast(x.dtype) * scale).cast(x.dtype)

@onnx_op("LpNormalization")
def lp_norm(x: Tensor, axis: int = -1, p: int = 2) -> Tensor:
  a = norm_axis(axis, x.ndim)
  norm = x.abs().sum(a, keepdim=True) if p == 1 else x.square().sum(a, keepdim=True).sqrt()
  return (norm == 0).where(0, x / norm).cast(x.dtype)

@onnx_op("MeanVarianceNormalization", since=9)
def mean_variance_norm(x: Tensor, axes: list[int] | None = None) -> Tensor:
  ax = tuple(axes_of(axes if axes is not None else [0, 2, 3], x.ndim))
  mean = x.mean(ax, keepdim=True)
  std = (x.square().mean(ax, keepdim=True) - mean.square()).sqrt()
  return ((x - mean) / (std + 1e-9)).cast(x.dtype)

@onnx_op("LRN")
def lrn(x: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> Tensor:
  c = dim(x, 1)
  before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
  sq = x.square().pad([(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2))
  window = sum((sq.shrink([None, (i, i + c)] + [None] * (x.ndim - 2)) for i in range(size)), x.zeros_like())
  return (x / (window * (alpha / size) + bias).pow(beta)).cast(x.dtype)

# ** softmax family **

def _coerced(fn: Callable[[Tensor, int], Tensor]) -> Callable[..., Tensor]:
  """Opset < 13: the input is coerced to 2-D at `axis` and the op runs over the second dim."""
  def coerced(x: Tensor, axis: int = 1) -> Tensor:
    a = norm_axis(axis, x.ndim) if x.ndim else 0
    flat = x.reshape(math.prod(dims(x)[:a]), -1)
    return fn(flat, 1).reshape(x.shape)
  return coerced

def _along(fn: Callable[[Tensor, int], Tensor]) -> Callable[..., Tensor]:
  def along(x: Tensor, axis: int = -1) -> Tensor: return fn(x, norm_axis(axis, x.ndim))
  return along

def _hardmax(x: Tensor, a: int) -> Tensor:
  n = dim(x, a)
  first = x.argmax(a, keepdim=True)
  return (first == Tensor.arange(n, device=x.device).reshape([n if i == a else 1 for i in range(x.ndim)])).cast(x.dtype)

SOFTMAX: dict[str, Callable[[Tensor, int], Tensor]] = {
  "Softmax": lambda x, a: x.softmax(a), "LogSoftmax": lambda x, a: x.log_softmax(a), "Hardmax": _hardmax,
}
for _name, _fn in SOFTMAX.items():
  onnx_op(_name)(_coerced(_fn))
  onnx_op(_name, since=13)(_along(_fn))

@onnx_op("Dropout")
def dropout(x: Tensor, ratio: Any = None, training_mode: Tensor | None = None, seed: int | None = None,
            is_test: int = 0, consumed_inputs: Any = None) -> tuple[Tensor, Tensor]:
  train = training_mode is not None and bool(scalar(training_mode))
  r = float(scalar(ratio)) if isinstance(ratio, Tensor) else (ratio if ratio is not None else 0.5)
  if train and r > 0:
    raise UnsupportedOpError("Dropout in training mode with ratio > 0 draws random numbers ONNX leaves unspecified; "
                             "export the model in eval mode")
  return x, Tensor.ones(*x.shape, dtype=dtypes.bool, device=x.device)

# ** resize **

def _nearest_coeffs(ratio: float, mode: str) -> list[float]:
  if float(ratio).is_integer(): return [0.0, 1.0]
  picks = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False, "ceil": True}
  if mode not in picks: raise UnsupportedOpError(f"Resize nearest_mode {mode!r}")
  return [0.0, 1.0] if picks[mode] else [1.0, 0.0]

def _cubic_kernel(x: float, a: float) -> float:
  x = abs(x)
  if x <= 1: return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
  return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a if x < 2 else 0.0

def _coeffs(mode: str, ratio: float, scale: float, cubic_a: float, antialias: int, nearest_mode: str) -> list[float]:
  """The interpolation weights of the taps around a source coordinate (ONNX's reference Resize)."""
  if mode == "nearest": return _nearest_coeffs(ratio, nearest_mode)
  if mode == "linear":
    if not antialias: return [1 - ratio, ratio]
    s = min(scale, 1.0)
    start = int(math.floor(-1 / s) + 1)
    ws = [min(max(1 - abs((i - ratio) * s), 0.0), 1.0) for i in range(start, 2 - start)]
    return [w / sum(ws) for w in ws]
  if mode == "cubic":
    if not antialias: return [_cubic_kernel(ratio + 1, cubic_a), _cubic_kernel(ratio, cubic_a),
                              _cubic_kernel(1 - ratio, cubic_a), _cubic_kernel(2 - ratio, cubic_a)]
    s = min(scale, 1.0)
    start = int(math.floor(-2 / s) + 1)
    ws = [_cubic_kernel(s * (i - ratio), cubic_a) for i in range(start, 2 - start)]
    return [w / sum(ws) for w in ws]
  raise UnsupportedOpError(f"Resize mode {mode!r}")

def _source_coord(mode: str, i: int, scale: float, n_in: int, n_out: int, roi: tuple[float, float] | None) -> float:
  out_f = scale * n_in
  if mode == "align_corners": return 0.0 if out_f == 1 else i * (n_in - 1) / (out_f - 1)
  if mode == "asymmetric": return i / scale
  if mode == "tf_crop_and_resize":
    r0, r1 = roi if roi is not None else (0.0, 1.0)
    x = (r1 - r0) * (n_in - 1) / 2 if out_f == 1 else i * (r1 - r0) * (n_in - 1) / (out_f - 1)
    return x + r0 * (n_in - 1)
  if mode == "pytorch_half_pixel": return -0.5 if out_f == 1 else (i + 0.5) / scale - 0.5
  if mode == "half_pixel": return (i + 0.5) / scale - 0.5
  if mode == "half_pixel_symmetric":
    offset = n_in / 2 * (1 - n_out / out_f)
    return offset + (i + 0.5) / scale - 0.5
  raise UnsupportedOpError(f"Resize coordinate_transformation_mode {mode!r}")

def _resize_matrix(n_in: int, n_out: int, scale: float, roi: tuple[float, float] | None, attrs: dict[str, Any]
                   ) -> tuple[np.ndarray, np.ndarray]:
  """(W, E): output i along the axis is sum_j W[i, j] * input[j] + E[i]. Taps beyond the edge read the edge value
  (the reference pads in edge mode); tf_crop_and_resize outside the input gives extrapolation_value."""
  w, extra = np.zeros((n_out, n_in), np.float64), np.zeros(n_out, np.float64)
  ctm = attrs["coordinate_transformation_mode"]
  for i in range(n_out):
    x = _source_coord(ctm, i, scale, n_in, n_out, roi)
    if ctm == "tf_crop_and_resize" and (x < 0 or x > n_in - 1):
      extra[i] = attrs["extrapolation_value"]
      continue
    base = math.floor(x)
    ratio = 1.0 if x == base else x - base
    cs = _coeffs(attrs["mode"], ratio, scale, attrs["cubic_coeff_a"], attrs["antialias"], attrs["nearest_mode"])
    taps = sorted(sorted(range(base - len(cs) - 1, base + len(cs) + 2), key=lambda j: (abs(x - j), j))[:len(cs)])
    if attrs["exclude_outside"]:
      cs = [c if 0 <= j < n_in else 0.0 for c, j in zip(cs, taps)]
      total = sum(cs)
      cs = [c / total for c in cs]
    for c, j in zip(cs, taps): w[i, min(max(j, 0), n_in - 1)] += c
  return w, extra

def _resize(x: Tensor, roi: list[float] | None, scales: list[float] | None, sizes: list[int] | None,
            axes: list[int] | None, attrs: dict[str, Any]) -> Tensor:
  r = x.ndim
  ax = axes_of(axes, r) if axes is not None else list(range(r))
  shape = dims(x)
  roi_full = None
  if roi:
    roi_full = [0.0] * r + [1.0] * r
    for i, a in enumerate(ax): roi_full[a], roi_full[r + a] = roi[i], roi[len(ax) + i]
  if sizes:
    out = list(shape)
    for i, a in enumerate(ax): out[a] = sizes[i]
    sc = [o / s if s else 1.0 for o, s in zip(out, shape)]
    policy = attrs["keep_aspect_ratio_policy"]
    if policy != "stretch":
      pick = min if policy == "not_larger" else max
      common = pick(sc[a] for a in ax)
      sc = [common if i in ax else 1.0 for i in range(r)]
      out = [int(common * shape[i] + 0.5) if i in ax else shape[i] for i in range(r)]
  elif scales:
    sc = [1.0] * r
    for i, a in enumerate(ax): sc[a] = scales[i]
    out = [int(s * d) for s, d in zip(sc, shape)]
  else: raise ShapeError("Resize needs scales or sizes")
  dtype = x.dtype
  y = x.cast(dtypes.float32) if not dtypes.is_float(dtype) else x
  for a in ax:
    roi_a = (roi_full[a], roi_full[a + r]) if roi_full is not None else None
    if math.isclose(sc[a], 1.0) and out[a] == shape[a] and (roi_a is None or roi_a == (0.0, 1.0)): continue
    w, extra = _resize_matrix(shape[a], out[a], sc[a], roi_a, attrs)
    wt = Tensor(w.T.astype(np.float32 if y.dtype != dtypes.float64 else np.float64), device=x.device).cast(y.dtype)
    moved = y.transpose(a, -1) @ wt  # (..., n_out)
    if extra.any(): moved = moved + Tensor(extra.astype(np.float32), device=x.device).cast(y.dtype)
    y = moved.transpose(a, -1)
  if dtypes.is_int(dtype): y = y.round().clip(dtypes.min(dtype), dtypes.max(dtype))
  return y.cast(dtype)

RESIZE_DEFAULTS = {"coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.75, "exclude_outside": 0,
                   "extrapolation_value": 0.0, "keep_aspect_ratio_policy": "stretch", "mode": "nearest",
                   "nearest_mode": "round_prefer_floor", "antialias": 0}

@onnx_op("Resize", since=10)
def resize_10(x: Tensor, scales: Tensor, mode: str = "nearest") -> Tensor:
  attrs = {**RESIZE_DEFAULTS, "mode": mode, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
  return _resize(x, None, floats(scales), None, None, attrs)

@onnx_op("Resize", since=11)
def resize(x: Tensor, roi: Tensor | None = None, scales: Tensor | None = None, sizes: Tensor | None = None,
           **attrs: Any) -> Tensor:
  axes = attrs.pop("axes", None)
  unknown = set(attrs) - set(RESIZE_DEFAULTS)
  if unknown: raise UnsupportedOpError(f"Resize attributes {sorted(unknown)}")
  return _resize(x, floats(roi), floats(scales), ints(sizes), axes, {**RESIZE_DEFAULTS, **attrs})

@onnx_op("Upsample")
def upsample_7(x: Tensor, scales: list[float] | None = None, mode: str = "nearest", height_scale: float | None = None,
               width_scale: float | None = None) -> Tensor:
  if scales is None: scales = [1.0, 1.0, height_scale or 1.0, width_scale or 1.0]
  attrs = {**RESIZE_DEFAULTS, "mode": "linear" if mode == "bilinear" else mode,
           "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
  return _resize(x, None, scales, None, None, attrs)

@onnx_op("Upsample", since=9)
def upsample_9(x: Tensor, scales: Tensor, mode: str = "nearest") -> Tensor:
  return upsample_7(x, floats(scales), mode)

# ** losses **

def _nll(log_prob: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int | None, reduction: str) -> Tensor:
  """ONNX's NegativeLogLikelihoodLoss: input (N, C, d...), target (N, d...) class indices."""
  keep = (target != ignore_index) if ignore_index is not None else Tensor.ones(*target.shape, dtype=dtypes.bool,
                                                                               device=target.device)
  idx = keep.where(target, 0).cast(dtypes.int64)
  picked = log_prob.gather(1, idx.unsqueeze(1)).squeeze(1)
  w = weight[idx] if weight is not None else Tensor.ones(*idx.shape, dtype=log_prob.dtype, device=log_prob.device)
  w = keep.where(w, 0).cast(log_prob.dtype)
  loss = -picked * w
  if reduction == "none": return loss.cast(log_prob.dtype)
  if reduction == "sum": return loss.sum().cast(log_prob.dtype)
  if reduction != "mean": raise UnsupportedOpError(f"loss reduction {reduction!r}")
  return (loss.sum() / w.sum()).cast(log_prob.dtype)

@onnx_op("NegativeLogLikelihoodLoss", since=12)
def nll_loss(x: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int | None = None,
             reduction: str = "mean") -> Tensor:
  return _nll(x, target, weight, ignore_index, reduction)

@onnx_op("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(scores: Tensor, labels: Tensor, weights: Tensor | None = None,
                               ignore_index: int | None = None, reduction: str = "mean") -> tuple[Tensor, Tensor]:
  log_prob = scores.log_softmax(1)
  return _nll(log_prob, labels, weights, ignore_index, reduction), log_prob

# ** grid sampling **

def _reflect(v: Tensor, lo: float, hi: float) -> Tensor:
  """Fold coordinates outside [lo, hi] back in, bouncing off the borders as often as needed (ONNX's reference)."""
  span = hi - lo
  def crossings(dx: Tensor) -> tuple[Tensor, Tensor]:
    """(whether a distance dx past a border crosses the range an even number of times, the remainder)"""
    n = (dx / span).floor()
    return (n - (n / 2).floor() * 2) == 0, dx - n * span
  even_lo, r_lo = crossings(lo - v)
  even_hi, r_hi = crossings(v - hi)
  below = even_lo.where(lo + r_lo, hi - r_lo)  # past lo: back in from lo, or from hi after an odd number of bounces
  above = even_hi.where(hi - r_hi, lo + r_hi)
  return (v < lo).where(below, (v > hi).where(above, v))

def _keys(r: Tensor) -> list[Tensor]:
  a = -0.75
  def near(t: Tensor) -> Tensor: return ((a + 2) * t - (a + 3)) * t * t + 1
  def far(t: Tensor) -> Tensor: return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
  return [far(r + 1), near(r), near(1 - r), far(2 - r)]

@onnx_op("GridSample", since=16)
def grid_sample(x: Tensor, grid: Tensor, align_corners: int = 0, mode: str = "linear",
                padding_mode: str = "zeros") -> Tensor:
  mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
  if mode not in ("linear", "nearest", "cubic"): raise UnsupportedOpError(f"GridSample mode {mode!r}")
  if padding_mode not in ("zeros", "border", "reflection"):
    raise UnsupportedOpError(f"GridSample padding_mode {padding_mode!r}")
  n, c, *spatial = dims(x)
  nd, out = len(spatial), dims(grid)[1:-1]
  g = grid.cast(dtypes.float32)
  taps_per_dim: list[list[tuple[Tensor, Tensor]]] = []
  for i, size in enumerate(spatial):
    coord = g[..., nd - 1 - i]
    v = ((coord + 1) / 2) * (size - 1) if align_corners else ((coord + 1) * size - 1) / 2
    if mode == "nearest": v = v.round()
    lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
    if padding_mode == "border": v = ((v < lo) | (v > hi)).where(v.clip(0, size - 1), v)
    elif padding_mode == "reflection": v = _reflect(v, lo, hi)
    if mode == "nearest": taps_per_dim.append([(v, v.ones_like())])
    else:
      base = v.floor()
      r = v - base
      offsets, weights = ([0, 1], [1 - r, r]) if mode == "linear" else ([-1, 0, 1, 2], _keys(r))
      taps_per_dim.append([(base + o, w) for o, w in zip(offsets, weights)])
  flat = x.reshape(n, c, -1)
  total: Tensor | None = None
  for combo in itertools.product(*taps_per_dim):
    index = Tensor.zeros(n, *out, dtype=dtypes.int32, device=x.device)
    weight, valid = combo[0][1].ones_like(), None
    for i, ((pos, w), size) in enumerate(zip(combo, spatial)):
      lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
      if padding_mode == "zeros":
        inside = (pos >= 0) & (pos <= size - 1)
        valid = inside if valid is None else valid & inside
      elif padding_mode == "reflection": pos = _reflect(pos, lo, hi).trunc()
      idx = pos.clip(0, size - 1).cast(dtypes.int32)
      index = index + idx * math.prod(spatial[i + 1:])
      weight = weight * w
    gathered = flat.gather(2, index.reshape(n, 1, -1).expand(n, c, math.prod(out))).reshape(n, c, *out)
    if valid is not None: gathered = valid.unsqueeze(1).where(gathered, 0)
    term = gathered * weight.unsqueeze(1).cast(x.dtype)
    total = term if total is None else total + term
  assert total is not None
  return total.cast(x.dtype)
