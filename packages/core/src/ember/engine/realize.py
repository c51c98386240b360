"""Run a schedule: compile each kernel once (cached by AST and target), launch it, do copies, count the work."""
from __future__ import annotations
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable
from ember.device.base import Buffer
from ember.errors import CompileError
from ember.helpers import BEAM, DEBUG, NOOPT, NUM_CPU_THREADS, GlobalCounters, colored
from ember.renderer import ProgramSpec
from ember.schedule import CallKind, ScheduleItem
from ember.uop.ops import UOp

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

Key = tuple[str, str, UOp, int, int, int]  # device, renderer, kernel AST and the settings that change its code
_runner_cache: dict[Key, CompiledRunner] = {}

def _key(device: str, renderer: Any, ast: UOp) -> Key:
  return (device, repr(renderer), ast, NUM_CPU_THREADS.value, NOOPT.value, BEAM.value)

def _build(device: str, dev: Any, spec: ProgramSpec, compiled: Callable[[], bytes] | None = None) -> CompiledRunner:
  """A runner for `spec`: its binary from `compiled` (a compile already under way), else compiled here (through the
  disk cache)."""
  if dev.compiler is None:
    raise CompileError(f"device {device} has no compiler; run kernel {spec.name} on a compute device")
  try: lib = compiled() if compiled is not None else dev.compiler.compile_cached(spec.src)
  except CompileError as e: raise CompileError(f"compiling kernel {spec.name} for {device}: {e}") from e
  return CompiledRunner(spec, lib, dev.runtime(spec.name, lib), device)

def get_runner(device: str, ast: UOp) -> CompiledRunner:
  from ember.device import Device
  from ember.codegen import get_program
  dev = Device[device]
  key = _key(device, dev.renderer, ast)
  if (r := _runner_cache.get(key)) is None:
    r = _runner_cache[key] = _build(device, dev, get_program(ast, dev.renderer, device))
  return r

def compile_ahead(items: list[ScheduleItem]) -> None:
  """The runners of every kernel of `items` not compiled before, on devices whose compiler may run on several threads
  at once (`Compiler.parallel_compile`): their code is generated here, then the sources compile on one thread per
  core, the compiler processes side by side instead of one after another (a transformer block's 23 kernels on 2
  cores). get_runner then finds them all."""
  from concurrent.futures import ThreadPoolExecutor
  from ember.device import Device
  from ember.codegen import get_program
  specs: dict[Key, tuple[str, Any, ProgramSpec]] = {}
  for it in items:
    if it.kind is CallKind.COPY or (ast := it.program) is None: continue
    dev = Device[it.device]
    if dev.compiler is None or not dev.compiler.parallel_compile: continue
    if (k := _key(it.device, dev.renderer, ast)) not in _runner_cache and k not in specs:
      specs[k] = (it.device, dev, get_program(ast, dev.renderer, it.device))
  futures: dict[Key, Any] = {}
  if len(specs) > 1:
    with ThreadPoolExecutor(max_workers=min(len(specs), os.cpu_count() or 1)) as pool:
      futures = {k: pool.submit(dev.compiler.compile_cached, spec.src) for k, (_, dev, spec) in specs.items()}
  for k, (device, dev, spec) in specs.items():
    _runner_cache[k] = _build(device, dev, spec, futures[k].result if k in futures else None)

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
    if it.kind is CallKind.COPY:
      _copy(it.bufs[0], it.bufs[1])
      for hook in capture_hooks: hook(None, it.bufs, {})
      GlobalCounters.global_mem += it.bufs[0].nbytes
      continue
    assert (ast := it.program) is not None
    runner = get_runner(it.device, ast)
    # simplification may drop a buffer the value never needs (x*0, x//0): the kernel gets the buffers it declares
    call_bufs = [it.bufs[i] for i in runner.spec.globals]
    vv = {**it.var_vals, **(var_vals or {})}
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
