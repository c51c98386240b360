"""A softmax over the last axis in ONE hand-written kernel: per row, its max, the sum of exponentials, and the output.

  DEV=CPU python examples/custom_softmax.py [--rows 4096 --cols 1024]

Tensor.softmax is three reductions and an elementwise pass that the scheduler may split into kernels; here each row is
one block (a GLOBAL range) that reads the row twice, writes its exponentials and scales them in place. Prints the
largest difference from Tensor.softmax and both times.
"""
from __future__ import annotations
import argparse
import math
import time
from ember import Tensor, UOp
from ember.uop.ops import AxisType, Ops

LANES = (16, 8, 4)  # partial sums per row: independent accumulators that a compiler keeps in vector registers

def softmax_kernel(out: UOp, x: UOp) -> UOp:
  """out[r, :] = softmax(x[r, :]) for every row r of the 2-D placeholders `out` and `x`."""
  rows, cols = x.shape
  lanes = next((n for n in LANES if cols % n == 0), 1)  # the widest that divides the row (8 for 1000 columns)
  r = UOp.range(rows, 0, AxisType.GLOBAL)  # a block per row
  j = UOp.range(cols, 1, AxisType.REDUCE)
  row_max = x[r, j].reduce(j, arg=Ops.MAX)
  scale = 1 / math.log(2)  # exp(v) = exp2(v * log2(e))
  # the sum over k = kk*lanes + lane: one accumulator per lane (UPCAST ranges are unrolled), added up after the loop.
  # Each exponential is stored as it is summed (the sum reads it after its store), so the last loop only scales
  kk, lane = UOp.range(cols // lanes, 2, AxisType.REDUCE), UOp.range(lanes, 3, AxisType.UPCAST)
  e = ((x[r, kk * lanes + lane] - row_max) * scale).exp2()
  total = e.after(out[r, kk * lanes + lane].store(e)).reduce(kk, lane, arg=Ops.ADD)
  inv = total.reciprocal()  # once per row: the loop over c multiplies
  c = UOp.range(cols, 4)
  return out[r, c].store(out.after(total)[r, c] * inv).end(c, r).sink()

def custom_softmax(x: Tensor) -> Tensor:
  """softmax over the last axis of a 2-D float tensor, as one custom kernel."""
  return Tensor.custom_kernel(Tensor.empty(*x.shape, dtype=x.dtype, device=x.device), x, fxn=softmax_kernel)[0]

def main(argv: list[str] | None = None) -> dict[str, float]:
  parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
  parser.add_argument("--rows", type=int, default=4096)
  parser.add_argument("--cols", type=int, default=1024)
  parser.add_argument("--rounds", type=int, default=5)
  args = parser.parse_args(argv)
  x = Tensor.randn(args.rows, args.cols).realize()
  times: dict[str, float] = {}
  for name, fn in (("custom_kernel", custom_softmax), ("Tensor.softmax", lambda t: t.softmax(-1))):
    fn(x).realize()  # compile
    best = math.inf
    for _ in range(args.rounds):
      start = time.perf_counter()
      fn(x).realize()
      best = min(best, time.perf_counter() - start)
    times[name] = best
  diff = float((custom_softmax(x) - x.softmax(-1)).abs().max().item())
  print(f"softmax of ({args.rows}, {args.cols}): max |custom - Tensor.softmax| = {diff:.2e}")
  for name, t in times.items(): print(f"  {name:15s} {t * 1e3:8.2f} ms")
  return {"max_diff": diff, **times}

if __name__ == "__main__":
  main()
