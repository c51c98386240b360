"""Runtime overhead and memory (`nox -s bench` runs it after the suite): what a TinyJit replay costs per kernel, and the
peak device memory of a JIT'd MLP train step next to the bytes its parameters, optimizer state and batch need.

    python bench/bench_overhead.py [--json bench/overhead.json]

* Replay overhead: a captured function of K small kernels (16 float32 each, every one realised on its own) replayed
  many times; the median replay time divided by K is the per-kernel launch cost of a replay (Python dispatch, the
  CPU backend's launch into its thread pool, the kernel itself, which is tiny). Measured for K = 8 and 64 so the
  fixed per-call part shows separately.
* Peak memory: `ember.device.MemoryStats` counts the bytes of allocated buffers. After two warmup steps (capture),
  the peak over one replayed step of the 784-512-512-10 MLP (batch 256, Adam) is compared with the resident bytes
  (parameters, gradients, Adam's two moments, the batch). A replay allocates nothing: the captured step keeps its
  intermediate buffers between steps, so the peak is the memory held before the step. Those intermediates are
  compared with the bytes the step's kernels write in total (each kernel output counted once per launch): what the
  intermediates would take if no buffer were reused between kernels.
"""
from __future__ import annotations
import argparse
import gc
import json
import os
import statistics
import sys
import time
import numpy as np
from ember import Tensor, TinyJit, Device
from ember.device import MemoryStats

def replay_overhead(kernels: int, rounds: int = 200) -> dict[str, float]:
  x = Tensor(np.ones(16, np.float32)).realize()
  @TinyJit
  def chain(t: Tensor) -> Tensor:
    for i in range(kernels): t = (t + float(i)).contiguous().realize()
    return t
  for _ in range(3): chain(x)
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    chain(x)
    Device[Device.DEFAULT].synchronize()
    times.append(time.perf_counter() - t0)
  med = statistics.median(times)
  return {"kernels": kernels, "replay_us": med * 1e6, "per_kernel_us": med * 1e6 / kernels}

def mlp_peak_memory() -> dict[str, float]:
  from ember.nn import Linear
  from ember.nn.optim import Adam, jit_train_step
  from ember.nn.state import get_parameters
  class MLP:
    def __init__(self) -> None: self.l1, self.l2, self.l3 = Linear(784, 512), Linear(512, 512), Linear(512, 10)
    def __call__(self, x: Tensor) -> Tensor: return self.l3(self.l2(self.l1(x).relu()).relu())
  rng = np.random.default_rng(0)
  model = MLP()
  params = get_parameters(model)
  opt = Adam(params, lr=1e-3)
  step = jit_train_step(model, opt)
  xb = Tensor(rng.standard_normal((256, 784)).astype(np.float32)).realize()
  yb = Tensor(rng.integers(0, 10, 256).astype(np.int32)).realize()
  for _ in range(2): step(xb, yb).numpy()
  gc.collect()
  MemoryStats.reset_peak()
  before = MemoryStats.used
  step(xb, yb).numpy()
  param_bytes = sum(p.nbytes() for p in params)
  resident = 4 * param_bytes + xb.nbytes() + yb.nbytes()  # params, grads, Adam m and v, the batch
  written = sum(bufs[0].nbytes for runner, bufs, _ in step.captured if runner is not None)
  kernel_bufs = {id(b): b.nbytes for _, bufs, _ in step.captured for b in bufs}
  return {"peak_mb": MemoryStats.peak / 1e6, "held_before_step_mb": before / 1e6, "resident_mb": resident / 1e6,
          "step_extra_mb": (MemoryStats.peak - before) / 1e6, "kernels": len(step.captured),
          "distinct_buffers_mb": sum(kernel_bufs.values()) / 1e6, "kernel_outputs_written_mb": written / 1e6}

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "overhead.json"))
  args = ap.parse_args()
  out = {"device": Device.DEFAULT, "replay": [replay_overhead(k) for k in (8, 64)], "mlp_train_step": mlp_peak_memory()}
  for r in out["replay"]:
    print(f"TinyJit replay of {r['kernels']:3d} kernels: {r['replay_us']:8.1f} us per call, "
          f"{r['per_kernel_us']:6.1f} us per kernel")
  m = out["mlp_train_step"]
  print(f"MLP 784-512-512-10 train step (batch 256, Adam), {m['kernels']} kernels: peak {m['peak_mb']:.1f} MB "
        f"(held before the step {m['held_before_step_mb']:.1f} MB, allocated during it {m['step_extra_mb']:.1f} MB); "
        f"params+grads+Adam state+batch {m['resident_mb']:.1f} MB; the kernels use {m['distinct_buffers_mb']:.1f} MB "
        f"of distinct buffers and write {m['kernel_outputs_written_mb']:.1f} MB of outputs per step")
  with open(args.json, "w") as f: json.dump(out, f, indent=1)
  sys.stdout.flush()

if __name__ == "__main__": main()
