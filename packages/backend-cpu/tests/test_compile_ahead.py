"""The engine's compile_ahead on the CPU (a compiler that runs in parallel): each kernel's compile starts as soon as its
code is generated, beside the codegen of the kernels after it, and every runner still comes out right."""
from __future__ import annotations
import ctypes
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
  compiler_type = type(Device["CPU"].compiler)
  first_compile_started = threading.Event()
  compile_cached, codegen = compiler_type.compile_cached, engine._codegen
  generated: list[str] = []
  def tracking_compile(self, src: str) -> bytes:
    first_compile_started.set()
    return compile_cached(self, src)
  def tracking_codegen(device, dev, ast):
    if generated:  # every kernel after the first waits until a compile is under way: it must be, beside this codegen
      assert first_compile_started.wait(60), "no compile started before the codegen of a later kernel"
    spec = codegen(device, dev, ast)
    generated.append(spec.name)
    return spec
  monkeypatch.setattr(compiler_type, "compile_cached", tracking_compile)
  monkeypatch.setattr(engine, "_codegen", tracking_codegen)
  monkeypatch.setattr(engine, "_runner_cache", {})
  with Context(CACHELEVEL=0):
    out.realize()
  assert len(generated) == len(kernels)
  ref = np.exp((a @ a - (a @ a).max(1, keepdims=True))) * 0.5
  np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)

def test_small_kernels_compile_together_while_a_compile_runs(monkeypatch) -> None:
  """Kernels generated while a compile is under way wait and compile as batches, one compiler process each (kernels
  named alike in one too: ClangCompiler renames them apart), instead of a process per kernel; every result still
  comes out right."""
  from ember_cpu.compiler import ClangCompiler
  rng = np.random.default_rng(1)
  arrays = [rng.standard_normal((8, 8 + i % 5)).astype(np.float32) for i in range(10)]
  xs = [Tensor(a, device="CPU").realize() for a in arrays]
  want = [np.exp2(a * 2) if i < 5 else a * 3 + 1 for i, a in enumerate(arrays)]
  outs = [(x * 2).exp2() if i < 5 else x * 3 + 1 for i, x in enumerate(xs)]  # 10 kernels, named alike in pairs
  items = [it for out in outs for it in out.schedule()]
  kernels = [it for it in items if it.kind != "copy"]
  run, codegen = ClangCompiler._run, engine._codegen
  all_generated = threading.Event()
  generated: list[str] = []
  processes: list[list[str]] = []  # the kernel names each compiler process built (links build none)
  def tracking_run(self, args: list[str], src: str, out: str) -> bytes:
    if src:
      if not processes: assert all_generated.wait(60)  # the first compile lasts until every kernel is generated
      processes.append([line.split("(")[0].split()[-1] for line in src.splitlines() if line.startswith("void ")])
    return run(self, args, src, out)
  def tracking_codegen(device, dev, ast):
    spec = codegen(device, dev, ast)
    generated.append(spec.name)
    if len(generated) == len(kernels): all_generated.set()
    return spec
  monkeypatch.setattr(ClangCompiler, "_run", tracking_run)  # the class's: undoing leaves no instance attribute
  monkeypatch.setattr(engine, "_codegen", tracking_codegen)
  monkeypatch.setattr(engine, "_runner_cache", {})
  with Context(CACHELEVEL=0):
    engine.run_schedule(items)
  assert sorted(n for names in processes for n in names) == sorted(generated)
  assert len(processes) <= len(kernels) // 2, processes
  assert len(set(generated)) < len(generated)
  assert any(len(set(names)) < len(names) for names in processes), processes  # kernels named alike shared one
  for out, ref in zip(outs, want): np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)

_KERNEL = """static inline float helper(float x) {{ return x {op} 1.0f; }}
void {name}(float* restrict data0, const int core_id, const int num_cores) {{ data0[0] = helper(data0[0]); }}
const char {name}_argfmt[] = "Pii";
"""

def test_batch_the_compiler_rejects_compiles_kernel_by_kernel(tmp_path) -> None:
  """Two kernels whose helpers clash cannot share a translation unit: each compiles alone and runs right, and each is
  cached under its own source, so a later compile of either reads the cache."""
  from ember_cpu.compiler import ClangCompiler
  from ember_cpu.device import CPUProgram
  compiler = ClangCompiler()
  srcs = [_KERNEL.format(op="+", name="k_add"), _KERNEL.format(op="*", name="k_mul")]
  with Context(CACHELEVEL=1, CACHEDB=str(tmp_path / "cache.db")):
    libs = compiler.compile_batch_cached(srcs)
    for src, lib in zip(srcs, libs): assert compiler.compile_cached(src) == lib
  for name, lib, want in (("k_add", libs[0], 4.0), ("k_mul", libs[1], 3.0)):
    buf = (ctypes.c_float * 1)(3.0)
    CPUProgram(name, lib)(buf)
    assert buf[0] == want

def test_batch_shares_one_binary_and_caches_it_per_kernel(tmp_path, monkeypatch) -> None:
  """Kernels that fit one translation unit come out of one compile, one shared object holding both; the cache holds
  it under each kernel's source, so each is found again without compiling."""
  from ember_cpu.compiler import ClangCompiler
  from ember_cpu.device import CPUProgram
  compiler = ClangCompiler()
  srcs = [_KERNEL.format(op="+", name="k_add"), _KERNEL.format(op="+", name="k_add2")]
  calls: list[str] = []
  compile_src = compiler.compile
  monkeypatch.setattr(compiler, "compile", lambda src: calls.append(src) or compile_src(src))
  with Context(CACHELEVEL=1, CACHEDB=str(tmp_path / "cache.db")):
    libs = compiler.compile_batch_cached(srcs)
    assert len(calls) == 1 and libs[0] == libs[1]
    assert compiler.compile_batch_cached(srcs) == libs and compiler.compile_cached(srcs[1]) == libs[1]
  assert len(calls) == 1
  for name in ("k_add", "k_add2"):
    buf = (ctypes.c_float * 1)(3.0)
    CPUProgram(name, libs[0])(buf)
    assert buf[0] == 4.0

def test_smallest_kernels_are_generated_first(monkeypatch) -> None:
  """The kernels with the fewest loop iterations are generated first, wherever the schedule puts them, and the one
  with the most (a matmul: its register blocks take the longest to generate) last: the small kernels' compiles run
  beside its codegen, and only its own compile runs after."""
  rng = np.random.default_rng(2)
  a, b = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
  x, w = Tensor(a, device="CPU").realize(), Tensor(b, device="CPU").realize()
  out = (((x + 1).contiguous() * 2).contiguous() @ w).sum(1)  # two elementwise kernels, the matmul, a row sum
  items = out.schedule()
  codegen, generated = engine._codegen, []
  def tracking_codegen(device, dev, ast):
    spec = codegen(device, dev, ast)
    generated.append(spec.name)
    return spec
  monkeypatch.setattr(engine, "_codegen", tracking_codegen)
  monkeypatch.setattr(engine, "_runner_cache", {})
  with Context(CACHELEVEL=0):
    engine.run_schedule(items)
  scheduled = [engine.get_runner(it.device, it.program).spec.name for it in items if it.kind != "copy"]
  assert generated[-1] == "r_64_64_64" and scheduled.index("r_64_64_64") < len(scheduled) - 1, (scheduled, generated)
  np.testing.assert_allclose(out.numpy(), (((a + 1) * 2) @ b).sum(1), rtol=1e-4, atol=1e-3)

def test_kernels_named_alike_compile_in_one_process_and_each_runs_its_own(tmp_path) -> None:
  """Three kernels of one name and one of another in one batch: one compile of them all, a shared object per kernel
  in which the name is that kernel's; each cached under its own source, so a later compile of either reads the
  cache."""
  from ember_cpu.compiler import ClangCompiler
  from ember_cpu.device import CPUProgram
  compiler = ClangCompiler()
  ops = ["+", "*", "-", "+"]
  names = ["k_same", "k_same", "k_same", "k_other"]
  srcs = [_KERNEL.format(op=op, name=name).replace("helper", f"helper_{i}")
          for i, (op, name) in enumerate(zip(ops, names))]
  with Context(CACHELEVEL=1, CACHEDB=str(tmp_path / "cache.db")):
    libs = compiler.compile_batch_cached(srcs)
    for src, lib in zip(srcs, libs): assert compiler.compile_cached(src) == lib
  assert len(set(libs)) == 3 and libs[3] == libs[0]
  for name, lib, want in zip(names, libs, (4.0, 3.0, 2.0, 4.0)):
    buf = (ctypes.c_float * 1)(3.0)
    CPUProgram(name, lib)(buf)
    assert buf[0] == want
