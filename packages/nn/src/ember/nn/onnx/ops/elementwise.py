"""Elementwise ops: unary math and activations, broadcasting binary ops, comparisons, logic, casts."""
from __future__ import annotations
import functools
import math
from typing import Any, Callable
from ember import Tensor, dtypes
from ember.dtype import DType
from ember.nn.onnx.errors import UnsupportedOpError
from ember.nn.onnx.registry import onnx_op
from ember.nn.onnx.ops.common import dims, axis as norm_axis

def _unary(fn: Callable[[Tensor], Tensor]) -> Callable[..., Tensor]:
  # consumed_inputs: a legacy (opset 1-5) attribute with no effect on the result
  def unary(x: Tensor, consumed_inputs: Any = None) -> Tensor: return fn(x)
  unary.__name__ = getattr(fn, "__name__", "unary")
  return unary

def _keep(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
  """fn, its result cast back to the input's dtype (ONNX keeps T; ember promotes ints to float for some ops)."""
  return lambda x: fn(x).cast(x.dtype)

UNARY: dict[str, Callable[[Tensor], Tensor]] = {
  "Abs": Tensor.abs, "Neg": Tensor.neg, "Reciprocal": Tensor.reciprocal, "Sqrt": Tensor.sqrt, "Exp": Tensor.exp,
  "Log": Tensor.log, "Sin": Tensor.sin, "Cos": Tensor.cos, "Tan": Tensor.tan, "Asin": Tensor.asin,
  "Acos": Tensor.acos, "Atan": Tensor.atan, "Sinh": Tensor.sinh, "Cosh": Tensor.cosh, "Tanh": Tensor.tanh,
  "Asinh": Tensor.asinh, "Acosh": Tensor.acosh, "Atanh": Tensor.atanh, "Floor": _keep(Tensor.floor),
  "Ceil": _keep(Tensor.ceil), "Round": _keep(Tensor.round), "Sign": _keep(Tensor.sign), "Erf": Tensor.erf,
  "Relu": _keep(Tensor.relu), "Sigmoid": Tensor.sigmoid, "Softsign": Tensor.softsign, "IsNaN": Tensor.isnan,
  "Not": Tensor.logical_not, "BitwiseNot": Tensor.bitwise_not, "Mish": Tensor.mish, "HardSwish": Tensor.hardswish,
  "Softplus": lambda x: (x.exp() + 1).log(),
}
for _name, _fn in UNARY.items(): onnx_op(_name)(_unary(_fn))

@onnx_op("IsInf", since=10)
def is_inf(x: Tensor, detect_negative: int = 1, detect_positive: int = 1) -> Tensor:
  return x.isinf(detect_positive=bool(detect_positive), detect_negative=bool(detect_negative))

@onnx_op("Elu")
def elu(x: Tensor, alpha: float = 1.0, consumed_inputs: Any = None) -> Tensor: return x.elu(alpha)
@onnx_op("Celu", since=12)
def celu(x: Tensor, alpha: float = 1.0) -> Tensor: return x.celu(alpha)
@onnx_op("Selu")
def selu(x: Tensor, alpha: float = 1.67326319217681884765625, gamma: float = 1.05070102214813232421875,
         consumed_inputs: Any = None) -> Tensor:
  return (x > 0).where(x, (x.exp() - 1) * alpha) * gamma
@onnx_op("LeakyRelu")
def leaky_relu(x: Tensor, alpha: float = 0.01, consumed_inputs: Any = None) -> Tensor: return x.leaky_relu(alpha)
@onnx_op("ThresholdedRelu", since=10)
def thresholded_relu(x: Tensor, alpha: float = 1.0) -> Tensor: return (x > alpha).where(x, 0).cast(x.dtype)
@onnx_op("HardSigmoid")
def hard_sigmoid(x: Tensor, alpha: float = 0.2, beta: float = 0.5, consumed_inputs: Any = None) -> Tensor:
  return (x * alpha + beta).clip(0, 1)
@onnx_op("Shrink", since=9)
def shrink(x: Tensor, bias: float = 0.0, lambd: float = 0.5) -> Tensor:
  return (x < -lambd).where(x + bias, (x > lambd).where(x - bias, 0)).cast(x.dtype)
@onnx_op("Gelu", since=20)
def gelu(x: Tensor, approximate: str = "none") -> Tensor: return x.gelu(approximate=approximate)
@onnx_op("Swish", since=24)
def swish(x: Tensor, alpha: float = 1.0) -> Tensor: return x * (x * alpha).sigmoid()

@onnx_op("PRelu")
def prelu(x: Tensor, slope: Tensor, consumed_inputs: Any = None) -> Tensor:
  if slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1] and slope.shape[0] != x.shape[-1]:
    slope = slope.reshape(-1, *([1] * (x.ndim - 2)))  # opset < 7 broadcast a per-channel slope over (N, C, ...)
  return (x < 0).where(x * slope, x).cast(x.dtype)

# ** broadcasting binary ops **

def _legacy_broadcast(y: Tensor, x: Tensor, broadcast: int, axis: int | None) -> Tensor:
  """Opset < 7's explicit broadcast: y's dims line up with x's from `axis` (default: the trailing dims)."""
  if not broadcast or axis is None or y.ndim == x.ndim: return y
  start = norm_axis(axis, x.ndim)
  return y.reshape(*([1] * start), *y.shape, *([1] * (x.ndim - start - y.ndim)))

def _binary(fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[..., Tensor]:
  def binary(x: Tensor, y: Tensor, broadcast: int = 0, axis: int | None = None, consumed_inputs: Any = None) -> Tensor:
    return fn(x, _legacy_broadcast(y, x, broadcast, axis))
  return binary

def _div(x: Tensor, y: Tensor) -> Tensor:
  return x.div(y, rounding_mode="trunc") if dtypes.is_int(x.dtype) else x / y

BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
  "Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y, "Div": _div,
  "Equal": lambda x, y: x == y, "Less": lambda x, y: x < y, "Greater": lambda x, y: x > y,
  "LessOrEqual": lambda x, y: x <= y, "GreaterOrEqual": lambda x, y: x >= y,
  "And": Tensor.logical_and, "Or": Tensor.logical_or, "Xor": Tensor.logical_xor,
  "BitwiseAnd": Tensor.bitwise_and, "BitwiseOr": Tensor.bitwise_or, "BitwiseXor": Tensor.bitwise_xor,
}
for _name, _fn2 in BINARY.items(): onnx_op(_name)(_binary(_fn2))

@onnx_op("Pow")
def pow_(x: Tensor, y: Tensor, broadcast: int = 0, axis: int | None = None) -> Tensor:
  y = _legacy_broadcast(y, x, broadcast, axis)
  if dtypes.is_int(x.dtype):
    if dtypes.is_int(y.dtype): return x.pow(y.cast(x.dtype)).cast(x.dtype)
    return x.cast(y.dtype).pow(y).cast(x.dtype)
  return x.pow(y.cast(x.dtype))

@onnx_op("Mod", since=10)
def mod(x: Tensor, y: Tensor, fmod: int = 0) -> Tensor:
  if fmod: return x.fmod(y).cast(x.dtype)
  if dtypes.is_float(x.dtype):  # numpy.mod: the sign of the divisor, x itself where y is +-inf and x's sign fits
    r = y.isinf().where(x, x.fmod(y)).cast(x.dtype)  # C's fmod(x, +-inf) is x
    fix = (r != 0) & ((r < 0) != (y < 0))
    return fix.where(r + y, r).cast(x.dtype)
  return (x % y).cast(x.dtype)

@onnx_op("BitShift", since=11)
def bit_shift(x: Tensor, y: Tensor, direction: str = "LEFT") -> Tensor:
  if direction not in ("LEFT", "RIGHT"): raise UnsupportedOpError(f"BitShift direction {direction!r}")
  bits = x.dtype.itemsize * 8
  bad = (y < 0) | (y >= bits)
  safe = bad.where(0, y).cast(y.dtype)
  shifted = (x.lshift(safe) if direction == "LEFT" else x.rshift(safe)).cast(x.dtype)
  # a shift by a negative amount or by the width or more: 0 (an arithmetic right shift of a negative value: -1)
  overflow = (x < 0).where(-1, 0) if direction == "RIGHT" and not dtypes.is_unsigned(x.dtype) else 0
  return bad.where(overflow, shifted).cast(x.dtype)

def _variadic(fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[..., Tensor]:
  def variadic(*xs: Tensor, consumed_inputs: Any = None) -> Tensor: return functools.reduce(fn, xs)
  return variadic

onnx_op("Max")(_variadic(Tensor.maximum))
onnx_op("Min")(_variadic(Tensor.minimum))
onnx_op("Sum")(_variadic(lambda x, y: x + y))

@onnx_op("Mean")
def mean(*xs: Tensor, consumed_inputs: Any = None) -> Tensor:
  return (functools.reduce(lambda x, y: x + y, xs) / len(xs)).cast(xs[0].dtype)

@onnx_op("Where", since=9)
def where(cond: Tensor, x: Tensor, y: Tensor) -> Tensor: return cond.where(x, y).cast(x.dtype)

@onnx_op("Clip")
def clip_1(x: Tensor, min: float = -3.4028234663852886e38, max: float = 3.4028234663852886e38,  # noqa: A002
           consumed_inputs: Any = None) -> Tensor:
  return x.maximum(min).minimum(max).cast(x.dtype)

@onnx_op("Clip", since=11)
def clip_11(x: Tensor, min: Tensor | None = None, max: Tensor | None = None) -> Tensor:  # noqa: A002
  # maximum then minimum, as numpy.clip: where min > max every element becomes max
  if min is not None: x = x.maximum(min.reshape(()) if min.ndim else min).cast(x.dtype)
  if max is not None: x = x.minimum(max.reshape(()) if max.ndim else max).cast(x.dtype)
  return x

# ** casts **

# the largest finite value of each fp8 format (dtypes.max is inf for floats)
FP8_MAX = {dtypes.fp8e4m3: 448.0, dtypes.fp8e5m2: 57344.0}

def cast_to(x: Tensor, dt: DType, saturate: int = 1) -> Tensor:
  if dt in dtypes.fp8s and dtypes.is_float(x.dtype):
    top = FP8_MAX[dt]
    # saturate=1 clamps to the format's finite range (infinities too); saturate=0 makes what is out of range NaN
    # (E4M3FN has no inf) or inf (E5M2)
    if saturate: x = x.clip(-top, top)
    elif dt == dtypes.fp8e4m3: x = (x.abs() > top).where(float("nan"), x)
  return x.cast(dt)

@onnx_op("Cast")
def cast(x: Tensor, to: int | str, saturate: int = 1, round_mode: str = "up") -> Tensor:
  if isinstance(to, str):  # opset 1-5 named the type by string
    from onnx import TensorProto
    to = TensorProto.DataType.Value(to.upper())
  from ember.nn.onnx.model import to_dtype
  return cast_to(x, to_dtype(int(to), "Cast target"), saturate)

@onnx_op("BitCast", since=26)
def bit_cast(x: Tensor, to: int) -> Tensor:
  from ember.nn.onnx.model import to_dtype
  return x.bitcast(to_dtype(to, "BitCast target"))

@onnx_op("CastLike", since=15)
def cast_like(x: Tensor, like: Tensor, saturate: int = 1, round_mode: str = "up") -> Tensor:
  return cast_to(x, like.dtype, saturate)

@onnx_op("Binarizer", domain="ai.onnx.ml")
def binarizer(x: Tensor, threshold: float = 0.0) -> Tensor: return (x > threshold).cast(x.dtype)

@onnx_op("Identity")
def identity(x: Any) -> Any: return x

@onnx_op("Size")
def size(x: Tensor) -> Tensor: return Tensor(math.prod(dims(x)), dtype=dtypes.int64, device=x.device)

@onnx_op("Shape")
def shape(x: Tensor, start: int = 0, end: int | None = None) -> Tensor:
  sizes = dims(x)[start:end]
  return Tensor(sizes, dtype=dtypes.int64, device=x.device) if sizes else Tensor.zeros(0, dtype=dtypes.int64,
                                                                                        device=x.device)

# ** window functions **

def _window(size: Tensor, output_datatype: int, periodic: int, terms: tuple[float, ...]) -> Tensor:
  """sum_k (-1)^k a_k cos(2 pi k n / N): N is the size (periodic) or size - 1 (symmetric)."""
  from ember.nn.onnx.model import to_dtype
  n = int(size.item())
  den = n if periodic else n - 1
  pos = Tensor.arange(n, dtype=dtypes.float32, device=size.device) * (2 * math.pi / den)
  out = sum(((-1) ** k * a * (pos * k).cos() for k, a in enumerate(terms)), Tensor.zeros(n, device=size.device))
  return out.cast(to_dtype(output_datatype, "window output_datatype"))

@onnx_op("HannWindow", since=17)
def hann_window(size: Tensor, output_datatype: int = 1, periodic: int = 1) -> Tensor:
  return _window(size, output_datatype, periodic, (0.5, 0.5))
@onnx_op("HammingWindow", since=17)
def hamming_window(size: Tensor, output_datatype: int = 1, periodic: int = 1) -> Tensor:
  return _window(size, output_datatype, periodic, (25 / 46, 21 / 46))
@onnx_op("BlackmanWindow", since=17)
def blackman_window(size: Tensor, output_datatype: int = 1, periodic: int = 1) -> Tensor:
  return _window(size, output_datatype, periodic, (0.42, 0.5, 0.08))
