"""Tier 3, render + compile a corpus of kernels (elementwise, reduce, movement, gated pad, matmul) for the device's
renderer and compiler, without launching them."""
from __future__ import annotations
import pytest
from ember.testing import KERNEL_CORPUS

pytestmark = pytest.mark.ember_tier("compile")

def _needs_codegen(caps) -> None:
  if not caps.has_renderer: pytest.skip(f"{caps.device} registers no renderer")
  if not caps.has_compiler: pytest.skip(f"{caps.device} registers no compiler for its renderer")

@pytest.mark.parametrize("kernel", list(KERNEL_CORPUS))
@pytest.mark.parametrize("dtype_name", ["float32", "int32"])
def test_corpus_renders_and_compiles(ember_device, ember_capabilities, kernel, dtype_name):
  from ember.dtype import to_dtype
  from ember.testing import open_device, render_and_compile
  _needs_codegen(ember_capabilities)
  t = KERNEL_CORPUS[kernel](ember_device, to_dtype(dtype_name))
  compiled = render_and_compile(t, ember_device)
  assert compiled, f"{kernel} scheduled no kernel"
  dev = open_device(ember_device)
  for spec, lib in compiled:
    assert isinstance(spec.src, str) and spec.src.strip(), f"{spec.name}: empty source"
    assert isinstance(lib, bytes) and lib, f"{spec.name}: the compiler returned no bytes"
    assert spec.outs and set(spec.outs) | set(spec.ins) <= set(spec.globals)
    prg = dev.runtime(spec.name, lib)
    assert callable(prg)

def test_every_supported_dtype_compiles(ember_device, ember_capabilities):
  from ember.testing import KERNEL_CORPUS, render_and_compile
  _needs_codegen(ember_capabilities)
  for dt in ember_capabilities.dtypes:
    for kernel in ("elementwise", "movement"):
      assert render_and_compile(KERNEL_CORPUS[kernel](ember_device, dt), ember_device), f"{kernel} {dt!r}"

def test_rendering_is_deterministic_and_compile_is_cacheable(ember_device, ember_capabilities):
  from ember.codegen import get_program
  from ember.dtype import dtypes
  from ember.testing import KERNEL_CORPUS, kernel_items, open_device
  _needs_codegen(ember_capabilities)
  dev = open_device(ember_device)
  assert dev.compiler is not None
  (item,) = kernel_items(KERNEL_CORPUS["reduce"](ember_device, dtypes.float32))
  first, second = get_program(item.ast, dev.renderer, ember_device), get_program(item.ast, dev.renderer, ember_device)
  assert first.src == second.src  # the disk cache is keyed by source text
  assert dev.compiler.compile_cached(first.src) == dev.compiler.compile_cached(second.src)

def test_a_compile_error_is_typed(ember_device, ember_capabilities):
  from ember.errors import CompileError
  from ember.testing import open_device
  _needs_codegen(ember_capabilities)
  compiler = open_device(ember_device).compiler
  assert compiler is not None
  with pytest.raises(CompileError):
    compiler.compile_cached("this is not a program in any language }{")
