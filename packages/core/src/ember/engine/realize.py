"""Run a schedule: compile each kernel once (cached by AST and target), launch it, do copies, count the work."""
from __future__ import annotations
import contextlib
import dataclasses
import functools
import gc
import os
import pickle
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator
import ember.profiler as profiler
from ember.device.base import Buffer, Compiler
from ember.errors import CompileError
from ember.helpers import BEAM, DEBUG, NOOPT, NUM_CPU_THREADS, GlobalCounters, colored, prod
from ember.renderer import ProgramSpec
from ember.schedule import CallKind, ScheduleItem, note_packed, pack_is_fresh
from ember.uop.ops import Ops, UOp

class PackedSpec(ProgramSpec):
  """A compiled kernel's ProgramSpec holding its linear program (`uops`) pickled and compressed; reading `uops` unpacks
  it (hash-consing returns the very nodes where they are still alive). The runner cache keeps every kernel's spec for
  the life of the process, and only tests and debugging read a runner's uops after the source is rendered: as live
  nodes, with their tuples, weak references and memos, SmolLM2's 50 decode and prefill kernels held 33,500 of them,
  17 MB of `bench/bench_llm.py`'s peak RSS of 284 MB; packed they take 0.2 MB, at about 1 ms per kernel compiled. A
  program that cannot be pickled (an arg of a type pickle refuses, a chain of sources deeper than the recursion limit)
  is kept as it is."""
  _packed: bytes | None
  _plain: list[UOp]
  @property  # ProgramSpec's field `uops`, stored packed here
  def uops(self) -> list[UOp]:
    return self._plain if self._packed is None else pickle.loads(zlib.decompress(self._packed))
  @uops.setter
  def uops(self, uops: list[UOp]) -> None:
    try: self._packed, self._plain = zlib.compress(pickle.dumps(list(uops), pickle.HIGHEST_PROTOCOL), 1), []
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError): self._packed, self._plain = None, uops

def _packed(spec: ProgramSpec) -> PackedSpec:
  return PackedSpec(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)})

@dataclass
class CompiledRunner:
  """A compiled kernel ready to launch on one device."""
  spec: ProgramSpec
  lib: bytes
  prg: Any
  device: str
  @functools.cached_property
  def written(self) -> list[int]:
    """Positions in a call's buffers (the kernel's params in order) that the kernel writes."""
    return [i for i, slot in enumerate(self.spec.globals) if slot in self.spec.outs]
  def __call__(self, bufs: list[Buffer], var_vals: dict[str, int], wait: bool = False) -> float | None:
    for i in self.written: bufs[i].base.writes += 1
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
  try:
    if (given := spec.aux.get("binary")) is not None: lib = given  # a kernel written as source may come compiled
    elif compiled is not None: lib = compiled()
    elif profiler.enabled: lib = profiler.timed("compile", spec.name, device, "compile", dev.compiler.compile_cached,
                                                spec.src)
    else: lib = dev.compiler.compile_cached(spec.src)
  except CompileError as e: raise CompileError(f"compiling kernel {spec.name} for {device}: {e}") from e
  return CompiledRunner(_packed(spec), lib, dev.runtime(spec.name, lib), device)

@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
  """No cyclic garbage collection inside the block (if it was on, it is on again after it). Codegen builds and drops
  tens of thousands of UOps, tuples and dicts per kernel: each 700 allocations set off a young collection, and every
  hundredth a full one, which walks every live object of the process (its model, its tensors' graphs) and finds no
  garbage there: 260-400 ms of collections in the 1.0-1.7 s of CPU the MLP step's kernels took to generate. Nodes are
  freed by their reference counts as before; cycles left in the block wait for the next collection after it."""
  if not gc.isenabled():
    yield
    return
  gc.disable()
  try: yield
  finally: gc.enable()

def _codegen(device: str, dev: Any, ast: UOp) -> ProgramSpec:
  from ember.codegen import get_program
  with gc_paused():
    if not profiler.enabled: return get_program(ast, dev.renderer, device)
    start = profiler.now_us()
    spec = get_program(ast, dev.renderer, device)
  profiler.record("codegen", spec.name, device, "codegen", start, profiler.now_us() - start)
  return spec

def get_runner(device: str, ast: UOp) -> CompiledRunner:
  from ember.device import Device
  dev = Device[device]
  key = _key(device, dev.renderer, ast)
  if (r := _runner_cache.get(key)) is None:
    r = _runner_cache[key] = _build(device, dev, _codegen(device, dev, ast))
  return r

# a batch of kernels for one compiler process (`Compiler.batch_compile`): at most this much source; a larger kernel
# compiles alone (its own code, not the process, is the cost). While one compile is under way, the kernels generated
# meanwhile wait for a second thread until they hold this much source (BATCH_MIN_CHARS): small ones gather into
# batches instead of a process each. 32 KB (was 16): what waits while every compile thread is busy goes in fewer
# processes (the MLP step's 30 small kernels and 5 matmuls: 9 -> 6, its cold call's gcc CPU 595/612 -> 544/573 ms
# min/median on two cores; the transformer block's 589/606 -> 537/560); 64 KB batched these two no differently.
# BATCH_MIN_CHARS 16 KB (was 8): MLP step gcc 533/540 -> 505/508 ms, wall 622/634 -> 597/616; transformer block gcc
# 551/571 -> 502/507, wall 844/868 -> 833/854. 24 KB cut gcc further (475/492, 497/506) at the same wall: a compile
# thread then waits idle while the large kernels are generated
BATCH_CHARS = 32768
BATCH_MIN_CHARS = 16384

def compile_ahead(items: list[ScheduleItem]) -> None:
  """The runners of every kernel of `items` not compiled before, on devices whose compiler may run on several threads
  at once (`Compiler.parallel_compile`): their code is generated here, and the sources compile on one thread per
  core while later kernels are still being generated, the compiler processes beside codegen and beside each other.
  The smallest kernels are generated first: their code takes little time to generate and, gathered into batches of
  one compiler process each where the compiler can (`batch_compile`: a small kernel's compile is mostly the
  process's start and link), it keeps the compile threads busy while the large kernels (a matmul's register blocks,
  tens of ms of codegen each) are generated; what compiles after the last codegen is then one large kernel, not the
  pile of small ones that gathered during it (a train step's 28 small kernels: 230 ms of compiles after codegen).
  The large kernels follow largest first (`_codegen_order`). get_runner then finds them all."""
  from concurrent.futures import Future, ThreadPoolExecutor
  from ember.device import Device
  todo: dict[Key, tuple[str, Any, UOp]] = {}
  for it in items:
    if it.kind is CallKind.COPY or (ast := it.program) is None: continue
    dev = Device[it.device]
    if dev.compiler is None or not dev.compiler.parallel_compile: continue
    if (k := _key(it.device, dev.renderer, ast)) not in _runner_cache and k not in todo: todo[k] = (it.device, dev, ast)
  if len(todo) < 2:
    for k, (device, dev, ast) in todo.items(): _runner_cache[k] = _build(device, dev, _codegen(device, dev, ast))
    return
  specs: dict[Key, ProgramSpec] = {}
  compiled: dict[Key, Callable[[], bytes]] = {}
  running: list[Future] = []
  waiting: dict[str, list[Key]] = {}  # device -> kernels generated, their compile not started
  workers = min(len(todo), os.cpu_count() or 1)
  with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="compile") as pool:
    def submit(device: str, compiler: Compiler, keys: list[Key]) -> None:
      srcs = [specs[k].src for k in keys]
      if profiler.enabled:  # each compile an event on its worker thread's track
        names = ", ".join(specs[k].name for k in keys)
        fut = pool.submit(profiler.timed, "compile", names, device, "compile", compiler.compile_batch_cached, srcs)
      else: fut = pool.submit(compiler.compile_batch_cached, srcs)
      running.append(fut)
      for i, k in enumerate(keys): compiled[k] = functools.partial(_nth_binary, fut, i)
    def flush(device: str) -> None:
      keys = waiting.pop(device)
      compiler: Compiler = todo[keys[0]][1].compiler
      # kernels of one name may share a batch where the compiler renames them apart (ClangCompiler.compile_batch),
      # else each is a symbol of the shared binary and the names must be distinct
      repeats = compiler.batch_repeated_names
      while keys:  # batches of bounded source
        names: set[str] = set()
        batch: list[Key] = []
        size = 0
        for k in keys:
          if batch and (not compiler.batch_compile or (not repeats and specs[k].name in names) or
                        size + len(specs[k].src) > BATCH_CHARS): continue
          batch.append(k)
          names.add(specs[k].name)
          size += len(specs[k].src)
        submit(device, compiler, batch)
        chosen = set(batch)
        keys = [k for k in keys if k not in chosen]
    for k in _codegen_order(todo):
      device, dev, ast = todo[k]
      specs[k] = _codegen(device, dev, ast)
      waiting.setdefault(device, []).append(k)
      busy = sum(not f.done() for f in running)
      if busy == 0 or (busy < workers and sum(len(specs[w].src) for w in waiting[device]) >= BATCH_MIN_CHARS):
        flush(device)  # no compile under way, or a free thread and enough code waiting: start now
    for device in list(waiting): flush(device)
  for k, (device, dev, _) in todo.items(): _runner_cache[k] = _build(device, dev, specs[k], compiled[k])

# kernels of at least this much work (`_work`) are generated after the others, the largest first
LARGE_WORK = 1 << 24

def _codegen_order(todo: dict[Key, tuple[str, Any, UOp]]) -> list[Key]:
  """The small kernels smallest first (see compile_ahead), then those of LARGE_WORK or more largest first: the largest
  kernel's compile (a transformer block's 33 KB down projection, 100-150 ms of gcc) then runs beside the codegen of the
  next ones instead of after the last. Transformer block's cold first call, fresh processes, 6x alternating, min/median
  on two cores: 851/877 -> 813/845 ms (2^20 instead of 2^24: 846/871 -> 745/794, but the MLP step's matmul compiles
  queued behind its small kernels' batch, 567/611 -> 623/634); the MLP step 607/631 -> 601/613."""
  work = {k: _work(ast) for k, (_, _, ast) in todo.items()}
  small = sorted((k for k in todo if work[k] < LARGE_WORK), key=work.__getitem__)
  return small + sorted((k for k in todo if work[k] >= LARGE_WORK), key=work.__getitem__, reverse=True)

def _nth_binary(fut: Any, i: int) -> bytes: return fut.result()[i]

def _work(ast: UOp) -> int:
  """The iterations of a kernel's loops (its constant ranges' product): a matmul's is its multiply-adds. Register
  blocking unrolls the large ones into the largest sources, the compiles that take longest."""
  return prod(n.src[0].arg for n in ast.toposort() if n.op is Ops.RANGE and n.src[0].op is Ops.CONST)

# TinyJit listens here: each executed call is reported as (runner or None for copies, buffers, var_vals)
capture_hooks: list[Callable[[CompiledRunner | None, list[Buffer], dict[str, int]], None]] = []

def _copy(dst: Buffer, src: Buffer) -> None:
  if not profiler.enabled: return _copy_buffers(dst, src)
  with profiler.span("copy", f"copy {src.device} -> {dst.device}", dst.device, "copy", bytes=src.nbytes):
    _copy_buffers(dst, src)

def _copy_buffers(dst: Buffer, src: Buffer) -> None:
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
    # a kept packed copy still fresh: skipped, but never while TinyJit captures (its replay must hold the pack)
    if it.kind is CallKind.PACK and not capture_hooks and pack_is_fresh(it.bufs[0], it.bufs[1]): continue
    assert (ast := it.program) is not None
    runner = get_runner(it.device, ast)
    # simplification may drop a buffer the value never needs (x*0, x//0): the kernel gets the buffers it declares
    call_bufs = [it.bufs[i] for i in runner.spec.globals]
    vv = {**it.var_vals, **(var_vals or {})}
    et = launch_profiled(runner, call_bufs, vv) if profiler.enabled else runner(call_bufs, vv, wait=DEBUG.value >= 2)
    for hook in capture_hooks: hook(runner, call_bufs, vv)
    if it.kind is CallKind.PACK: note_packed(it.bufs[0], it.bufs[1])
    update_stats(runner, et)
  if DEBUG.value >= 1 and items:
    ms = (time.perf_counter() - st) * 1e3
    sys.stderr.write(f"realize: {len(items)} calls, {GlobalCounters.global_ops/1e9:.3f} GFLOP total, {ms:.2f} ms\n")

def launch_profiled(runner: CompiledRunner, bufs: list[Buffer], var_vals: dict[str, int], jit: bool = False) -> float:
  """Launch and wait for one kernel, recorded by the open profiles; returns its seconds."""
  start = profiler.now_us()
  et = runner(bufs, var_vals, wait=True)
  profiler.kernel(runner, start, et, jit)
  return et or 0.0

def replay_timed(runner: CompiledRunner, bufs: list[Buffer], var_vals: dict[str, int]) -> None:
  """One kernel of a TinyJit replay launched on its own and timed: counted, printed at DEBUG=2, profiled."""
  et = launch_profiled(runner, bufs, var_vals, jit=True) if profiler.enabled else runner(bufs, var_vals, wait=True)
  GlobalCounters.kernel_count += 1
  if et is not None: GlobalCounters.time_sum_s += et
  if DEBUG.value >= 2: _debug_kernel(runner, et)

def update_stats(runner: CompiledRunner, et: float | None) -> None:
  GlobalCounters.kernel_count += 1
  GlobalCounters.global_ops += runner.spec.estimates.ops
  GlobalCounters.global_mem += runner.spec.estimates.mem
  if et is not None: GlobalCounters.time_sum_s += et
  if DEBUG.value >= 2: _debug_kernel(runner, et)

def _debug_kernel(runner: CompiledRunner, et: float | None) -> None:
  """DEBUG=2's line for a kernel (and its row in the table written at exit)."""
  t = et or 0.0
  ops, mem = runner.spec.estimates.ops, runner.spec.estimates.mem
  gflops = ops / t / 1e9 if t > 0 else 0.0
  gbs = mem / t / 1e9 if t > 0 else 0.0
  name = colored(f"{runner.spec.name:30s}", "cyan")
  sys.stderr.write(f"*** {runner.device:8s} {GlobalCounters.kernel_count:4d} {name} "
                   f"tm {t*1e6:9.2f}us {gflops:8.2f} GFLOP/s {gbs:8.2f} GB/s\n")
  profiler.debug_kernel(runner.spec.name, runner.device, t, ops, mem)
