"""CPUGraph: a TinyJit capture replayed by one call into C instead of one Python launch per kernel.

A replay from Python costs a few microseconds per kernel on one thread and tens of microseconds when the kernel is
split over threads (a pool submit and a future per chunk). An LLM decode step is hundreds of small kernels, so that
overhead is a large share of the step. Here a replay is one ctypes call:

* a generated C file holds `ember_graph_kernel(i, core, ncores, F, B, V)`: a switch over the captured kernels that
  calls kernel i through its exact prototype (`F[i]`, its function address), with its buffers from the address table
  `B` and its variables from the value table `V`. The file depends only on the capture's shape (signatures, which
  table slot each argument reads, threads per kernel), so the compile cache serves it on later runs;
* the runtime (`_RUNTIME`, compiled once per machine) owns a persistent pool of `cpu_threads() - 1` worker threads.
  `ember_graph_run` walks the kernels in order; a kernel split over n threads is published to the workers (a
  generation counter), chunk c runs on the thread c mod (workers + 1), and the caller waits until every worker has
  finished before the next kernel starts, as a Python replay does. Workers spin (yielding after a while) and sleep
  on a condition variable only once no replay has started for `IDLE_SPIN_NS` after the last one ended: waking a
  sleeping worker took 33-37 us (median; 50-70 us at the 90th percentile) on the 2-core development VM, against
  1 us for a spinning one, which was a quarter of a small matvec's replay (0.2 ms). torch's OpenMP workers spin
  after a call alike, so replays in a loop (a decode step, a benchmark's calls) find them awake.

A replay rewrites only the table slots of swapped input buffers and of bound Variables (`takes_var_vals`), so a
symbolic decode step (a bound start position) replays through the graph too.
"""
from __future__ import annotations
import ctypes
import functools
from typing import Any
from ember.plugin import Buffer, DeviceError
from ember_cpu.compiler import ClangCompiler
from ember_cpu.device import _address, load_shared_object
from ember_cpu.renderer import cpu_threads

IDLE_SPIN_NS = 2_000_000  # how long workers stay awake after a replay ends, waiting for the next one

_RUNTIME = r"""
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
typedef void (*ember_kernel_fn)(int32_t, int32_t, int32_t, void**, void**, int64_t*);
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static atomic_int generation, finished, active, wakeups;
static _Atomic int64_t idle_since;  /* when the last replay ended (CLOCK_MONOTONIC ns) */
static int workers = -1;
static ember_kernel_fn cur_fn;
static int32_t cur_kernel, cur_ncores;
static void **cur_F, **cur_B;
static int64_t *cur_V;

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void *worker(void *arg) {
  int32_t id = (int32_t)(intptr_t)arg, seen = 0;
  for (;;) {
    int spins = 0;
    while (atomic_load(&generation) == seen) {
      if (++spins > 2000) sched_yield();
      if ((spins & 255) == 0 && !atomic_load(&active) && now_ns() - atomic_load(&idle_since) > IDLE_SPIN_NS) {
        pthread_mutex_lock(&lock);
        while (!atomic_load(&active)) pthread_cond_wait(&wake, &lock);
        pthread_mutex_unlock(&lock);
        atomic_fetch_add(&wakeups, 1);
        spins = 0;
      }
    }
    seen = atomic_load(&generation);
    for (int32_t c = id; c < cur_ncores; c += workers + 1) cur_fn(cur_kernel, c, cur_ncores, cur_F, cur_B, cur_V);
    atomic_fetch_add(&finished, 1);
  }
  return 0;
}

int ember_graph_start(int32_t n) {  /* once per process: n worker threads */
  if (workers >= 0) return workers;
  workers = 0;
  for (int32_t i = 1; i <= n; i++) {
    pthread_t t;
    if (pthread_create(&t, 0, worker, (void *)(intptr_t)i) != 0) break;
    pthread_detach(t);
    workers++;
  }
  return workers;
}

int ember_graph_wakeups(void) { return atomic_load(&wakeups); }  /* times a worker left its sleep */

void ember_graph_run(ember_kernel_fn fn, int32_t n_kernels, const int32_t *threads, void **F, void **B,
                     int64_t *V) {
  pthread_mutex_lock(&lock);
  atomic_store(&active, 1);
  pthread_cond_broadcast(&wake);
  pthread_mutex_unlock(&lock);
  for (int32_t i = 0; i < n_kernels; i++) {
    int32_t n = threads[i];
    if (n <= 1 || workers <= 0) {
      for (int32_t c = 0; c < (n < 1 ? 1 : n); c++) fn(i, c, n < 1 ? 1 : n, F, B, V);
      continue;
    }
    cur_fn = fn; cur_kernel = i; cur_ncores = n; cur_F = F; cur_B = B; cur_V = V;
    atomic_store(&finished, 0);
    atomic_fetch_add(&generation, 1);
    for (int32_t c = 0; c < n; c += workers + 1) fn(i, c, n, F, B, V);
    int spins = 0;
    while (atomic_load(&finished) < workers) if (++spins > 2000) sched_yield();
  }
  atomic_store(&idle_since, now_ns());
  atomic_store(&active, 0);
}
""".replace("IDLE_SPIN_NS", str(IDLE_SPIN_NS))

_ctype = {"P": "void*", "i": "int32_t", "q": "int64_t"}

@functools.cache
def _runtime() -> ctypes.CDLL:
  """The worker pool, built once (compile cache) and started with cpu_threads() - 1 workers."""
  lib = load_shared_object(ClangCompiler().compile_cached(_RUNTIME), "the CPU graph runtime")
  lib.ember_graph_start.argtypes, lib.ember_graph_start.restype = [ctypes.c_int32], ctypes.c_int32
  lib.ember_graph_run.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_void_p]
  lib.ember_graph_run.restype = None
  lib.ember_graph_wakeups.argtypes, lib.ember_graph_wakeups.restype = [], ctypes.c_int32
  lib.ember_graph_start(max(cpu_threads() - 1, 0))
  return lib

def worker_wakeups() -> int:
  """How many times a replay woke a sleeping worker of the pool since the process started (replays that found the
  workers spinning add nothing)."""
  return int(_runtime().ember_graph_wakeups())

class CPUGraph:
  """TinyJit's graph runner for the CPU (`Compiled.graph`): built from a capture, called with the replay's input
  buffers and bound variable values."""
  takes_var_vals = True
  def __init__(self, captured: list[tuple[Any, list[Buffer], dict[str, int]]], input_buffers: list[Buffer]) -> None:
    slots: dict[int, int] = {}  # id(Buffer) -> slot of the address table
    self.buffers: list[Buffer] = []
    var_slots: dict[str, int] = {}
    self.var_values: list[int] = []
    fns, threads, cases = [], [], []
    for i, (runner, bufs, var_vals) in enumerate(captured):
      prg = runner.prg
      argfmt: str = prg.argfmt
      args = []
      for b in bufs:
        if id(b) not in slots:
          slots[id(b)] = len(self.buffers)
          self.buffers.append(b)
        args.append(f"B[{slots[id(b)]}]")
      for v in runner.spec.vars:
        name = v.arg[0]
        if name not in var_slots:
          var_slots[name] = len(self.var_values)
          self.var_values.append(var_vals[name])
        args.append(f"({_ctype[argfmt[len(args)]]})V[{var_slots[name]}]")
      if len(argfmt) != len(args) + 2:
        raise DeviceError(f"kernel {runner.spec.name}: its signature {argfmt!r} does not match {len(args)} captured "
                          "buffers and variables")
      proto = ", ".join(_ctype[c] for c in argfmt)
      cases.append(f"    case {i}: ((void (*)({proto}))F[{i}])({', '.join(args)}, core, ncores); break;")
      fns.append(_function_address(prg))
      threads.append(int(runner.spec.global_size[0]) if runner.spec.global_size else 1)
    self.var_slots, self.slots = var_slots, slots
    src = ("#include <stdint.h>\nvoid ember_graph_kernel(int32_t i, int32_t core, int32_t ncores, void **F, void **B, "
           "int64_t *V) {\n  switch (i) {\n" + "\n".join(cases) + "\n  }\n}\n")
    self.lib = load_shared_object(ClangCompiler().compile_cached(src), "a CPU graph dispatcher")
    self.fn = ctypes.cast(self.lib.ember_graph_kernel, ctypes.c_void_p).value
    self.n = len(captured)
    self.F = (ctypes.c_void_p * max(self.n, 1))(*fns)
    self.T = (ctypes.c_int32 * max(self.n, 1))(*threads)
    self.B = (ctypes.c_void_p * max(len(self.buffers), 1))(*[_address(b.ensure_allocated()._buf) for b in self.buffers])
    self.V = (ctypes.c_int64 * max(len(self.var_values), 1))(*self.var_values)
    # (address table slot, position among the replay's inputs) of each input a kernel reads
    self.inputs = [(slots[id(b)], i) for i, b in enumerate(input_buffers) if id(b) in slots]
    self.runtime = _runtime()
    # the C call's arguments as ctypes values once: converting six Python arguments per replay cost more (~1 us) than
    # the call itself; the tables are rewritten in place, so their addresses stay valid
    self.run_args = (ctypes.c_void_p(self.fn), ctypes.c_int32(self.n),
                     *(ctypes.cast(table, ctypes.c_void_p) for table in (self.T, self.F, self.B, self.V)))

  def __call__(self, input_buffers: list[Buffer], var_vals: dict[str, int] | None = None) -> None:
    table = self.B
    for slot, i in self.inputs:
      b = input_buffers[i]
      table[slot] = _address(b._buf if b.is_allocated else b.allocate()._buf)
    if var_vals:
      for name, value in var_vals.items():
        if (var_slot := self.var_slots.get(name)) is not None: self.V[var_slot] = value
    self.runtime.ember_graph_run(*self.run_args)

def _function_address(prg: Any) -> int:
  """The machine-code address of a loaded kernel (a CPUProgram's ctypes function or an LLVMProgram's JIT code)."""
  addr = ctypes.cast(prg.fxn, ctypes.c_void_p).value
  if not addr: raise DeviceError(f"kernel {prg.name} has no function address")
  return addr
