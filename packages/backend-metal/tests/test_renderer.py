"""MetalRenderer's MSL text: the calling convention the runtime binds, the dtypes it refuses, and (through the shim)
the semantics of single ops that the corpus reaches only indirectly."""
from __future__ import annotations
import math
import numpy as np
import pytest
from ember.codegen import get_program
from ember.plugin import AxisType, CompileError, DType, Ops, UOp, dtypes
from ember.tensor import Tensor
from ember.testing import kernel_items
from ember_metal.device import kernel_var_widths
from ember_metal.renderer import MetalRenderer
import msl_shim

def _program(t: Tensor) -> list:
  return [get_program(it.ast, MetalRenderer()) for it in kernel_items(t)]

def _var_ast(dt: DType) -> UOp:
  """out[i] = in[i] + k for i < 8, with k a variable of dtype `dt`."""
  k = UOp.variable("k", 0, 100, dt)
  out, inp = UOp(Ops.PARAM, dt.ptr(8), arg=0), UOp(Ops.PARAM, dt.ptr(8), arg=1)
  i = UOp.range(8, 0, AxisType.GLOBAL)
  return UOp(Ops.SINK, dtypes.void, (out.index(i).store(inp.index(i).load() + k),))

def test_kernel_signature_binds_buffers_then_variables_then_positions() -> None:
  spec = get_program(_var_ast(dtypes.int32), MetalRenderer())
  head = spec.src.split(") {")[0]
  assert spec.src.startswith("#include <metal_stdlib>\nusing namespace metal;\n")
  assert f"kernel void {spec.name}(device int* data0 [[buffer(0)]], device const int* data1 [[buffer(1)]], " \
         "constant int& k [[buffer(2)]], uint3 gid [[threadgroup_position_in_grid]], " \
         "uint3 lid [[thread_position_in_threadgroup]]" in head
  assert spec.local_size == [8, 1, 1] and spec.global_size == [1, 1, 1]

@pytest.mark.parametrize("dt, width, ctype", [(dtypes.int32, 4, "int"), (dtypes.int64, 8, "long")])
def test_variables_are_constant_references_of_their_width(dt: DType, width: int, ctype: str) -> None:
  spec = get_program(_var_ast(dt), MetalRenderer())
  assert f"constant {ctype}& k [[buffer(2)]]" in spec.src
  assert kernel_var_widths(spec.src, spec.name) == [width]

@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.int64])
def test_variable_kernel_runs_through_the_shim(dt: DType) -> None:
  spec = get_program(_var_ast(dt), MetalRenderer())
  x = np.arange(8, dtype=dt.fmt) * 3
  out = np.zeros(8, dt.fmt)
  msl_shim.run_one(spec, MetalRenderer(), [out, x], vals=(42,))
  np.testing.assert_array_equal(out, x + 42)

def test_variable_names_cannot_take_the_position_arguments() -> None:
  k = UOp.variable("gid", 0, 9)
  out = UOp(Ops.PARAM, dtypes.int32.ptr(4), arg=0)
  i = UOp.range(4, 0, AxisType.GLOBAL)
  src = get_program(UOp(Ops.SINK, dtypes.void, (out.index(i).store(i + k),)), MetalRenderer()).src
  assert "constant int& gid_ [[buffer(1)]]" in src

def test_float64_is_refused_with_the_reason() -> None:
  assert dtypes.float64 not in MetalRenderer().supported_dtypes()
  with pytest.raises(CompileError, match="float64"):
    _program(Tensor(np.ones(4), device="PYTHON").cast(dtypes.float64) * 2)

def test_emulated_formats_use_as_type_and_raw_bits() -> None:
  out, inp = UOp(Ops.PARAM, dtypes.bfloat16.ptr(4), arg=0), UOp(Ops.PARAM, dtypes.bfloat16.ptr(4), arg=1)
  i = UOp.range(4, 0, AxisType.GLOBAL)
  value = inp.index(i).load() * UOp.const(dtypes.bfloat16, 3.0)
  spec = get_program(UOp(Ops.SINK, dtypes.void, (out.index(i).store(value),)), MetalRenderer())
  assert "device ushort* data0" in spec.src and "device const ushort* data1" in spec.src
  assert "as_type<uint>(" in spec.src and "as_type<float>(" in spec.src and "__builtin" not in spec.src
  x = np.array([1.0, -2.5, 3.0e38, 0.1], np.float32).view(np.uint32) >> 16  # bfloat16 bits (truncated inputs)
  bits = np.zeros(4, np.uint16)
  msl_shim.run_one(spec, MetalRenderer(), [bits, x.astype(np.uint16)])
  got = (bits.astype(np.uint32) << 16).view(np.float32)
  with np.errstate(over="ignore"): want = (x.astype(np.uint32) << 16).view(np.float32) * np.float32(3)
  assert np.isinf(want[2])  # 9e38 is past the float32 (and bfloat16) range
  np.testing.assert_allclose(got, want, rtol=2 ** -8)  # one bfloat16 rounding

def test_half_is_native_and_math_goes_through_float() -> None:
  (spec,) = _program(Tensor(np.ones(4, np.float16), device="PYTHON").sqrt())
  assert "device half* data0" in spec.src and "metal::sqrt((float)(" in spec.src

@pytest.mark.parametrize("a, b", [(math.nan, 1.0), (1.0, math.nan), (-math.inf, 2.0), (3.0, -0.5)])
def test_max_propagates_nan_from_either_operand(a: float, b: float) -> None:
  x = Tensor(np.array([a], np.float32), device="PYTHON")
  y = Tensor(np.array([b], np.float32), device="PYTHON")
  (spec,) = _program(x.maximum(y))
  out = np.zeros(1, np.float32)
  msl_shim.run_one(spec, MetalRenderer(), [out, np.array([a], np.float32), np.array([b], np.float32)])
  want = math.nan if math.isnan(a) or math.isnan(b) else max(a, b)
  np.testing.assert_array_equal(out, np.array([want], np.float32))
