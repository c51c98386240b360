"""The NULL device: compiles with any renderer, allocates nothing, runs nothing."""
from __future__ import annotations
import numpy as np
from ember.device.null import NullAllocator, NullDevice, NullHandle, NullProgram
from ember.device.python import PythonCompiler, PythonRenderer
from ember.dtype import dtypes
from ember.uop.ops import AxisType, Ops, UOp

def host(arr: np.ndarray) -> memoryview:
  """The bytes of a contiguous numpy array, as the runtimes take them (no copy)."""
  return arr.data.cast("B")

def _double_kernel(n: int) -> list[UOp]:
  out, x = UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=1)
  r = UOp.range(n, 0, AxisType.GLOBAL)
  value = x.index(r).load() * 2.0
  return [out, x, r.src[0], r, x.index(r), value.src[0], value.src[1], value, out.index(r), out.index(r).store(value),
          UOp(Ops.END, dtypes.void, (r,))]

def test_null_falls_back_to_the_python_renderer_and_compiler() -> None:
  dev = NullDevice("NULL")
  assert isinstance(dev.renderer, PythonRenderer) and isinstance(dev.compiler, PythonCompiler)
  assert dev.device == "NULL"

def test_null_keeps_the_renderer_and_compiler_it_is_given() -> None:
  renderer, compiler = PythonRenderer(), PythonCompiler()
  dev = NullDevice("NULL:1", renderer, compiler)
  assert dev.renderer is renderer and dev.compiler is compiler

def test_null_compiles_and_runs_without_touching_memory() -> None:
  dev = NullDevice()
  n = 16
  lib = dev.compiler.compile(dev.renderer.render(_double_kernel(n), "double"))
  prg = dev.runtime("double", lib)
  assert isinstance(prg, NullProgram)
  out, x = np.full(n, -1.0, np.float32), np.arange(n, dtype=np.float32)
  assert prg(host(out), host(x), wait=True) == 0.0
  assert prg(host(out), host(x)) is None
  np.testing.assert_array_equal(out, np.full(n, -1.0, np.float32))  # nothing was computed or written
  np.testing.assert_array_equal(x, np.arange(n, dtype=np.float32))

def test_null_allocations_are_free_handles() -> None:
  alloc = NullAllocator()
  huge = alloc.alloc(1 << 50)  # a petabyte: only possible because no memory backs it
  assert isinstance(huge, NullHandle) and huge.size == 1 << 50
  view = alloc._offset(huge, 64, 128)
  assert (view.size, view.offset) == (64, 128) and alloc._offset(view, 8, 8).offset == 136
  assert alloc.alloc(8) is not alloc.alloc(8)  # handles are distinct, like pointers
  alloc.free(huge, 1 << 50)

def test_null_copyin_is_ignored_and_copyout_gives_zeros() -> None:
  alloc = NullAllocator()
  handle = alloc.alloc(32)
  alloc._copyin(handle, host(np.arange(8, dtype=np.int32)))
  dest = np.full(8, 7, np.int32)
  alloc._copyout(host(dest), handle)
  np.testing.assert_array_equal(dest, np.zeros(8, np.int32))
