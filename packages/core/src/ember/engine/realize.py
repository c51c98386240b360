"""Run a schedule: compile each kernel once (cached by AST and target), launch it, do copies, count the work."""
from __future__ import annotations
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable
from ember.device.base import Buffer
from ember.dtype import DType
from ember.errors import CompileError
from ember.helpers import BEAM, DEBUG, NOOPT, NUM_CPU_THREADS, colored
from ember.renderer import ProgramSpec
from ember.schedule import ScheduleItem
from ember.uop.ops import UOp

class GlobalCounters:
  """What the realizes since the last `reset()` ran: kernels, FLOPs, bytes, kernel time."""
  kernel_count: int = 0
  global_ops: int = 0
  global_mem: int = 0
  time_sum_s: float = 0.0
  @staticmethod
  def reset() -> None:
    GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem = 0, 0, 0
    GlobalCounters.time_sum_s = 0.0

@dataclass
class CompiledRunner:
  """A compiled kernel ready to launch on one device."""
  spec: ProgramSpec
  lib: bytes
  prg: Any
  device: str
  def __call__(self, bufs: list[Buffer], var_vals: dict[str, int], wait: bool = False) -> float | None:
    vals = tuple(var_vals[v.arg[0]] for v in self.spec.vars)
    gsize = tuple(self.spec.global_size) if self.spec.global_size else (1, 1, 1)
    lsize = tuple(self.spec.local_size) if self.spec.local_size else None
    handles = [b.ensure_allocated()._buf for b in bufs]
    return self.prg(*handles, global_size=gsize, local_size=lsize, vals=vals, wait=wait)

_runner_cache: dict[tuple[str, str, UOp, int, int, int], CompiledRunner] = {}

def _key(device: str, renderer: Any, ast: UOp) -> tuple[str, str, UOp, int, int, int]:
  # the settings that change the generated code are part of the key
  return (device, repr(renderer), ast, NUM_CPU_THREADS.value, NOOPT.value, BEAM.value)

def get_runner(device: str, ast: UOp) -> CompiledRunner:
  from ember.device import Device
  from ember.codegen import get_program
  dev = Device[device]
  key = _key(device, dev.renderer, ast)
  if (r := _runner_cache.get(key)) is not None: return r
  spec = get_program(ast, dev.renderer, device)
  if dev.compiler is None:
    raise CompileError(f"device {device} has no compiler; run kernel {spec.name} on a compute device")
  try: lib = dev.compiler.compile_cached(spec.src)
  except CompileError as e: raise CompileError(f"compiling kernel {spec.name} for {device}: {e}") from e
  runner = CompiledRunner(spec, lib, dev.runtime(spec.name, lib), device)
  _runner_cache[key] = runner
  return runner

def compile_ahead(items: list[ScheduleItem]) -> None:
  """Generate the code of every kernel of `items` that has no runner yet, then compile the sources that miss the
  disk cache on one thread per core, for compilers that allow it (`Compiler.parallel_compile`): the compiler
  processes run side by side instead of one after another (a transformer block's 23 kernels on 2 cores). Codegen
  itself stays on this thread. get_runner then finds every runner made."""
  from concurrent.futures import ThreadPoolExecutor
  from ember.device import Device
  from ember.codegen import get_program
  from ember.codegen.pack import plan_packing
  todo: dict[tuple[str, str, UOp, int, int, int], tuple[str, Any, UOp]] = {}
  for it in items:
    if it.kind != "kernel" or it.ast is None: continue
    dev = Device[it.meta["device"]]
    if dev.compiler is None or not dev.compiler.parallel_compile: continue
    if _key(it.meta["device"], dev.renderer, it.ast) in _calls_cache: continue
    plan = plan_packing(it.ast, dev.renderer)
    asts = [it.ast] if plan is None or plan.scratch_slot != len(it.bufs) else [plan.pack, plan.main]
    for ast in asts:
      if (k := _key(it.meta["device"], dev.renderer, ast)) not in _runner_cache:
        todo.setdefault(k, (it.meta["device"], dev, ast))
  if len(todo) < 2: return
  specs = {k: get_program(ast, dev.renderer, device) for k, (device, dev, ast) in todo.items()}
  libs = {k: todo[k][1].compiler.cached(spec.src) for k, spec in specs.items()}
  missing = [k for k, lib in libs.items() if lib is None]
  with ThreadPoolExecutor(max_workers=min(len(missing), os.cpu_count() or 1) or 1) as pool:
    futures = {k: pool.submit(todo[k][1].compiler.compile_uncached, specs[k].src) for k in missing}
  for k, fut in futures.items():
    device, dev, _ = todo[k]
    try: libs[k] = fut.result()
    except CompileError as e: raise CompileError(f"compiling kernel {specs[k].name} for {device}: {e}") from e
    dev.compiler.store(specs[k].src, libs[k])
  for k, spec in specs.items():
    device, dev, _ = todo[k]
    lib = libs[k]
    assert lib is not None
    _runner_cache[k] = CompiledRunner(spec, lib, dev.runtime(spec.name, lib), device)

@dataclass
class KernelCalls:
  """What one scheduled kernel runs: compiled calls, each over the buffers at `slots` of the item's buffers followed
  by fresh scratch buffers (`scratch`: elements and dtype of each). Most kernels are one call over their own buffers;
  a matmul on a CPU may first pack its B operand into a scratch buffer (codegen/pack.py)."""
  calls: list[tuple[CompiledRunner, tuple[int, ...]]]
  scratch: list[tuple[int, DType]]

_calls_cache: dict[tuple[str, str, UOp, int, int, int], KernelCalls] = {}

def get_calls(device: str, ast: UOp, nbufs: int) -> KernelCalls:
  """The calls that run kernel `ast` over `nbufs` buffers on `device`."""
  from ember.device import Device
  from ember.codegen.pack import plan_packing
  dev = Device[device]
  key = _key(device, dev.renderer, ast)
  if (c := _calls_cache.get(key)) is not None: return c
  plan = plan_packing(ast, dev.renderer) if dev.compiler is not None else None
  if plan is None or plan.scratch_slot != nbufs: c = KernelCalls([(get_runner(device, ast), tuple(range(nbufs)))], [])
  else:
    main = get_runner(device, plan.main)  # B's own slot is no argument of it any more: pass what it declares
    calls = [(get_runner(device, plan.pack), (nbufs, plan.src_slot)), (main, tuple(main.spec.globals))]
    c = KernelCalls(calls, [(plan.size, plan.dtype)])
  _calls_cache[key] = c
  return c

# TinyJit listens here: each executed call is reported as (runner or None for copies, buffers, var_vals)
capture_hooks: list[Callable[[CompiledRunner | None, list[Buffer], dict[str, int]], None]] = []

def _copy(dst: Buffer, src: Buffer) -> None:
  dst.ensure_allocated()
  if (mv := src.as_buffer()) is not None:
    from ember.device import Device
    Device[src.device].synchronize()
    dst.copyin(mv)
    return
  tmp = memoryview(bytearray(src.nbytes))
  src.copyout(tmp)
  dst.copyin(tmp)

def run_schedule(items: list[ScheduleItem], var_vals: dict[str, int] | None = None) -> None:
  st = time.perf_counter()
  compile_ahead(items)
  for it in items:
    if it.kind == "copy":
      _copy(it.bufs[0], it.bufs[1])
      for hook in capture_hooks: hook(None, it.bufs, {})
      GlobalCounters.global_mem += it.bufs[0].nbytes
      continue
    assert it.ast is not None
    kc = get_calls(it.meta["device"], it.ast, len(it.bufs))
    bufs = it.bufs + [Buffer(it.meta["device"], size, dt) for size, dt in kc.scratch]
    vv = {**it.var_vals, **(var_vals or {})}
    for runner, slots in kc.calls:
      call_bufs = [bufs[i] for i in slots]
      et = runner(call_bufs, vv, wait=DEBUG.value >= 2)
      for hook in capture_hooks: hook(runner, call_bufs, vv)
      update_stats(runner, et)
  if DEBUG.value >= 1 and items:
    ms = (time.perf_counter() - st) * 1e3
    sys.stderr.write(f"realize: {len(items)} calls, {GlobalCounters.global_ops/1e9:.3f} GFLOP total, {ms:.2f} ms\n")

def update_stats(runner: CompiledRunner, et: float | None) -> None:
  GlobalCounters.kernel_count += 1
  GlobalCounters.global_ops += runner.spec.estimates.ops
  GlobalCounters.global_mem += runner.spec.estimates.mem
  if et is not None: GlobalCounters.time_sum_s += et
  if DEBUG.value >= 2:
    t = et or 0.0
    gflops = runner.spec.estimates.ops / t / 1e9 if t > 0 else 0.0
    gbs = runner.spec.estimates.mem / t / 1e9 if t > 0 else 0.0
    name = colored(f"{runner.spec.name:30s}", "cyan")
    sys.stderr.write(f"*** {runner.device:8s} {GlobalCounters.kernel_count:4d} {name} "
                     f"tm {t*1e6:9.2f}us {gflops:8.2f} GFLOP/s {gbs:8.2f} GB/s\n")
