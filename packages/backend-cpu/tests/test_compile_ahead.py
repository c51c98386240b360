"""The engine's compile_ahead on the CPU (a compiler that runs in parallel): each kernel's compile starts as soon as its
code is generated, beside the codegen of the kernels after it, and every runner still comes out right."""
from __future__ import annotations
import threading
import numpy as np
from ember import Context, Tensor
from ember.device import Device
from ember.engine import realize as engine

def test_compiles_start_while_later_kernels_are_generated(monkeypatch) -> None:
  a = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
  x = Tensor(a, device="CPU").realize()
  # three kernels: the matmul, a row max of it, and an elementwise kernel reading both
  m = x @ x
  out = (m.contiguous() - m.max(1, keepdim=True).contiguous()).exp() * 0.5
  items = out.schedule()
  kernels = [it for it in items if it.kind != "copy"]
  assert len(kernels) >= 3
  compiler = Device["CPU"].compiler
  first_compile_started = threading.Event()
  compile_cached, codegen = compiler.compile_cached, engine._codegen
  generated: list[str] = []
  def tracking_compile(src: str) -> bytes:
    first_compile_started.set()
    return compile_cached(src)
  def tracking_codegen(device, dev, ast):
    if generated:  # every kernel after the first waits until a compile is under way: it must be, beside this codegen
      assert first_compile_started.wait(60), "no compile started before the codegen of a later kernel"
    spec = codegen(device, dev, ast)
    generated.append(spec.name)
    return spec
  monkeypatch.setattr(compiler, "compile_cached", tracking_compile)
  monkeypatch.setattr(engine, "_codegen", tracking_codegen)
  monkeypatch.setattr(engine, "_runner_cache", {})
  with Context(CACHELEVEL=0):
    out.realize()
  assert len(generated) == len(kernels)
  ref = np.exp((a @ a - (a @ a).max(1, keepdims=True))) * 0.5
  np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)
