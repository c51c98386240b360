"""The CUDA runtime passes each kernel variable at the width its binary declares (int64 variables as 8 bytes), read
from the cubin's parameter records or the PTX entry, checked against the layout codegen computes for the kernel."""
from __future__ import annotations
import pytest
from ember.codegen import get_program
from ember.dtype import dtypes
from ember.uop.ops import AxisType, Ops, UOp
from test_compile import needs_nvrtc, needs_ptxas
from ember_nv.device import param_widths
from ember_nv.renderer import CUDARenderer, PTXRenderer, kernel_arg_layout

def _two_variable_kernel() -> UOp:
  """out[i] = in[i] * n + m for i < 16, with n an int32 and m an int64 variable."""
  n = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("n", 1, 100))
  m = UOp(Ops.DEFINE_VAR, dtypes.int64, (), ("m", 0, 1 << 40))
  out = UOp(Ops.PARAM, dtypes.int64.ptr(16), arg=0)
  inp = UOp(Ops.PARAM, dtypes.int64.ptr(16), arg=1)
  i = UOp.range(16, 0, AxisType.GLOBAL)
  value = inp.index(i).load() * n.cast(dtypes.int64) + m
  return UOp(Ops.SINK, dtypes.void, (out.index(i).store(value),))

WIDTHS = [8, 8, 8, 4]  # two buffer pointers, then the variables by name: m (int64), n (int32)

def _expected(spec) -> list[int]: return [size for _, size in kernel_arg_layout(spec.uops)[0]]

@needs_ptxas
def test_ptx_entry_widths() -> None:
  spec = get_program(_two_variable_kernel(), PTXRenderer("sm_80"))
  assert param_widths(spec.src.encode(), spec.name) == _expected(spec) == WIDTHS

@needs_nvrtc
def test_cubin_widths() -> None:
  from ember_nv.compiler import NVRTCCompiler
  spec = get_program(_two_variable_kernel(), CUDARenderer("sm_80"))
  cubin = NVRTCCompiler("sm_80").compile(spec.src)
  assert param_widths(cubin, spec.name) == _expected(spec) == WIDTHS

def test_wrong_entry_name_is_a_clear_error() -> None:
  spec = get_program(_two_variable_kernel(), PTXRenderer("sm_80"))
  with pytest.raises(Exception, match="no entry"):
    param_widths(spec.src.encode(), "not_this_kernel")
