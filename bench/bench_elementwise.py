"""Benchmark: the fused elementwise kernel `relu(a*b+c)*0.5` on 16M float32 elements, ember vs numpy, same run.

  python bench/bench_elementwise.py [--n 16777216] [--repeat 10]

Prints the median wall time of each and the ratio (numpy time / ember time: > 1 means ember is faster).
"""
from __future__ import annotations
import argparse
import statistics
import time
import numpy as np

def median_time(fn, repeat: int) -> float:
  times = []
  for _ in range(repeat):
    st = time.perf_counter()
    fn()
    times.append(time.perf_counter() - st)
  return statistics.median(times)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--n", type=int, default=16 * 1024 * 1024)
  parser.add_argument("--repeat", type=int, default=10)
  args = parser.parse_args()
  from ember import Tensor, Device
  rng = np.random.default_rng(0)
  a_np, b_np, c_np = (rng.standard_normal(args.n, dtype=np.float32) for _ in range(3))
  a, b, c = (Tensor(x).realize() for x in (a_np, b_np, c_np))
  def run_ember() -> None: ((a * b + c).relu() * 0.5).realize()
  def run_numpy() -> None: np.maximum(a_np * b_np + c_np, 0) * 0.5
  run_ember()  # compile once (cached on disk after the first run)
  out = ((a * b + c).relu() * 0.5).numpy()
  np.testing.assert_allclose(out, np.maximum(a_np * b_np + c_np, 0) * 0.5, rtol=1e-6, atol=1e-6)
  t_ember, t_numpy = median_time(run_ember, args.repeat), median_time(run_numpy, args.repeat)
  gbs = 4 * args.n * 4 / t_ember / 1e9
  print(f"relu(a*b+c)*0.5, {args.n} float32 on {Device.DEFAULT} ({type(Device[Device.DEFAULT].renderer).__name__})")
  print(f"  ember  {t_ember*1e3:8.2f} ms  ({gbs:.1f} GB/s)")
  print(f"  numpy  {t_numpy*1e3:8.2f} ms")
  print(f"  ratio  {t_numpy/t_ember:8.2f}x (numpy time / ember time)")

if __name__ == "__main__":
  main()
