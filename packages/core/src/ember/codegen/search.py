"""BEAM search over kernel opts: compile and time candidate opt lists on the device, keep the fastest.

`BEAM=N` makes `get_program` call `beam_search` for every new kernel: stage one times the register-blocking /
partial-sum choices (`candidate_opts`) and keeps the N fastest; stage two tries thread counts on those. Each
candidate's output is compared with the unoptimised kernel's on the same random inputs, and a candidate that
differs, fails to compile, or does not apply is dropped. The winner is cached on disk (`diskcache_put`) under the
kernel's AST key, the device, the renderer and the settings that change code, so a later run skips the search.
`BEAM_BUDGET` (seconds, default 60) bounds the time spent on one kernel; the hand-coded opts are always a candidate,
so the search never picks something slower than the default it measured.

A kernel symbolic in Variables (a decode step's position) is searched at a representative value of each, the middle
of its range (`representative_values`); its buffers are allocated for the largest values, as a real launch's are.
`IGNORE_BEAM_CACHE=1` searches again even where the disk cache has a winner (and stores the new one).
`JITBEAM=N` searches with BEAM=N the kernels TinyJit captures (engine.jit), whatever BEAM is elsewhere: a model's
replayed step is searched and the one-off kernels around it are not.
"""
from __future__ import annotations
import os
import statistics
import time
from typing import Any
import numpy as np
from ember.dtype import PtrDType, dtypes
from ember.errors import CompileError
from ember.helpers import NUM_CPU_THREADS, ContextVar, content_hash, diskcache_get, diskcache_put
from ember.renderer import Renderer, ProgramSpec
from ember.uop.ops import Ops, UOp
from ember.codegen.opt import Opt, KernelOptError, hand_coded_opts, matmul_axes, matmul_opts, apply_opts_list

CACHE_TABLE = "beam_opts"
BEAM_BUDGET = ContextVar("BEAM_BUDGET", 60)  # seconds of search per kernel
IGNORE_BEAM_CACHE = ContextVar("IGNORE_BEAM_CACHE", 0)
JITBEAM = ContextVar("JITBEAM", 0)

def candidate_opts(ast: UOp, renderer: Renderer) -> list[tuple[Opt, ...]]:
  """Stage-one candidates: none, the hand-coded opts, and for a matmul-like kernel every rows x column-vectors block
  up to 32 vector accumulators (rows a block does not divide padded where that is cheap, opt.block_rows); for other
  reductions partial sums of several widths. Only those that apply."""
  width = max(getattr(renderer, "simd_width", 0), 1)
  cands: list[tuple[Opt, ...]] = [(), tuple(hand_coded_opts(ast, renderer))]
  if width > 1 and matmul_axes(ast, width) is not None:
    for cols in (1, 2, 4):
      for rows in (1, 2, 4, 6, 7, 8):
        if cols * rows <= 32: cands.append(tuple(matmul_opts(ast, width, cols, rows)))
  if any(n.op is Ops.REDUCE for n in ast.toposort()):
    cands += [(Opt("SPLIT", 0, amt),) for amt in (4, 8, 16, 32, 64)]
  if getattr(renderer, "has_local", False):  # GPU: tensor core tilings, group reductions, block sizes, unrolls
    from ember.codegen.launch import launch_candidates
    cands += launch_candidates(ast, renderer)
  seen: set[tuple[Opt, ...]] = set()
  out = []
  for c in cands:
    if c in seen: continue
    seen.add(c)
    try: apply_opts_list(ast, c)
    except KernelOptError: continue
    out.append(c)
  return out

def _thread_counts(renderer: Renderer) -> list[int]:
  if not renderer.has_threads: return []
  most = NUM_CPU_THREADS.value or os.cpu_count() or 1
  return sorted({1, max(most // 2, 1), most})

def _buffers(spec: ProgramSpec, device: str, seed: int) -> list[Any]:
  """Fresh buffers for each of the kernel's params, inputs filled with random values of their dtype."""
  from ember.device.base import Buffer
  rng = np.random.default_rng(seed)
  params = sorted((u for u in spec.uops if u.op is Ops.PARAM), key=lambda u: u.arg)
  bufs = []
  for p in params:
    dt = p.dtype
    assert isinstance(dt, PtrDType)
    buf = Buffer(device, dt.size, dt.base).ensure_allocated()
    if dtypes.is_float(dt.base): data = rng.standard_normal(dt.size).astype(np.float32).astype(dt.base.fmt or "f")
    elif dt.base is dtypes.bool: data = rng.integers(0, 2, dt.size).astype(np.bool_)
    else: data = rng.integers(0, 8, dt.size).astype(dt.base.fmt or "i")
    buf.copyin(np.ascontiguousarray(data).data.cast("B"))
    bufs.append(buf)
  return bufs

def _outputs(bufs: list[Any], spec: ProgramSpec) -> list[np.ndarray]:
  res = []
  for slot in spec.outs:
    b = bufs[slot]
    mv = memoryview(bytearray(b.nbytes))
    b.copyout(mv)
    res.append(np.frombuffer(mv, dtype=np.dtype(b.dtype.fmt or "f")).copy())
  return res

def _compile(ast: UOp, renderer: Renderer, device: str, opts: tuple[Opt, ...] | list[Opt]) -> Any:
  from ember.device import Device
  from ember.codegen import get_program
  from ember.engine.realize import CompiledRunner
  dev = Device[device]
  if dev.compiler is None:
    raise CompileError(f"device {device} has no compiler to search kernel opts with; run BEAM on a compute device")
  spec = get_program(ast, renderer, device, list(opts))
  lib = dev.compiler.compile_cached(spec.src)
  return CompiledRunner(spec, lib, dev.runtime(spec.name, lib), device)

def representative_values(ast: UOp) -> dict[str, int]:
  """The value each Variable of `ast` is searched at: the middle of its range."""
  return {u.arg[0]: (u.arg[1] + u.arg[2]) // 2 for u in ast.toposort() if u.op is Ops.DEFINE_VAR}

def _time(runner: Any, bufs: list[Any], var_vals: dict[str, int], reps: int) -> float:
  from ember.device import Device
  times = []
  for _ in range(reps):
    st = time.perf_counter()
    runner(bufs, var_vals, wait=True)
    Device[runner.device].synchronize()
    times.append(time.perf_counter() - st)
  return statistics.median(times)

def cache_key(ast: UOp, renderer: Renderer, device: str) -> str:
  rtype = type(renderer)
  return content_hash(ast.key, device, rtype.__module__, rtype.__name__, repr(getattr(renderer, "simd_width", 0)),
                      str(NUM_CPU_THREADS.value))

def beam_search(ast: UOp, renderer: Renderer, device: str, amt: int, budget_s: float | None = None) -> list[Opt]:
  """The fastest opt list for `ast` on `device` among the candidates, checked against the unoptimised kernel."""
  key = cache_key(ast, renderer, device)
  if not IGNORE_BEAM_CACHE.value and (hit := _opts_from_cache(diskcache_get(CACHE_TABLE, key))) is not None: return hit
  default = hand_coded_opts(ast, renderer)
  var_vals = representative_values(ast)
  budget = float(BEAM_BUDGET.value) if budget_s is None else budget_s
  start = time.perf_counter()
  base = _compile(ast, renderer, device, [])
  bufs = _buffers(base.spec, device, seed=0)
  base(bufs, var_vals, wait=True)
  want = _outputs(bufs, base.spec)
  reps = 3

  def measure(opts: tuple[Opt, ...]) -> float | None:
    try: runner = _compile(ast, renderer, device, opts)
    except (KernelOptError, CompileError): return None
    runner(bufs, var_vals, wait=True)
    for got, exp in zip(_outputs(bufs, runner.spec), want):
      if not np.allclose(got.astype(np.float64), exp.astype(np.float64), rtol=1e-3, atol=1e-3, equal_nan=True):
        return None
    return _time(runner, bufs, var_vals, reps)

  timed: list[tuple[float, tuple[Opt, ...]]] = []
  for cand in candidate_opts(ast, renderer):
    if time.perf_counter() - start > budget and timed: break
    if (t := measure(cand)) is not None: timed.append((t, cand))
  if not timed: return default
  timed.sort(key=lambda x: x[0])
  beam = timed[:max(amt, 1)]
  for _, cand in list(beam):
    for n in _thread_counts(renderer):
      if time.perf_counter() - start > budget: break
      if (t := measure((*cand, Opt("THREADS", 0, n)))) is not None: timed.append((t, (*cand, Opt("THREADS", 0, n))))
  best = min(timed, key=lambda x: x[0])[1]
  diskcache_put(CACHE_TABLE, key, [[o.op, o.axis, o.amt] for o in best])
  return list(best)

def _opts_from_cache(hit: Any) -> list[Opt] | None:
  """The opt list a cache entry holds as `[[op, axis, amt], ...]`; None (search again) for anything else."""
  if not isinstance(hit, list): return None
  def well_formed(o: Any) -> bool: return isinstance(o, list) and [type(v) for v in o] == [str, int, int]
  if not all(well_formed(o) for o in hit): return None
  try: return [Opt(*o) for o in hit]
  except KernelOptError: return None
