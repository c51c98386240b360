"""A tiled matmul written by hand: blocks of threads stage tiles of A and B in LOCAL (block-shared) memory, and every
thread keeps a tile of C in REG (register) memory.

  DEV=CPU python examples/custom_matmul_tiled.py [--size 256]

C (M, N) = A (M, K) @ B (K, N), with M and N multiples of the block tile (BM x BN) and K of the step BK. The grid has a
block (two GLOBAL ranges) per BM x BN tile of C; a block has TY x TX threads (two LOCAL ranges), and thread (ty, tx)
computes the RM x RN elements of C at rows ty*RM.., columns tx*RN.. of the tile, accumulating in registers. For each
step of BK along K, the threads copy a BM x BK tile of A and a BK x BN tile of B into LOCAL memory, wait at a barrier,
multiply out of LOCAL memory, and wait again before the next step overwrites the tiles. On GPUs the ranges are the
hardware's blocks and threads; on CPU and PYTHON they are loops (the threads of a block run one after another).
"""
from __future__ import annotations
import argparse
import time
import numpy as np
from ember import Tensor, UOp, dtypes
from ember.uop.ops import AddrSpace, AxisType

TY, TX = 4, 4     # threads of a block
RM, RN = 4, 4     # elements of C each thread computes
BM, BN = TY * RM, TX * RN  # the block's tile of C
BK = 8            # the step along K

def matmul_tiled_kernel(c: UOp, a: UOp, b: UOp) -> UOp:
  (m, k), n = a.shape, b.shape[1]
  bm, bn = UOp.range(m // BM, 0, AxisType.GLOBAL), UOp.range(n // BN, 1, AxisType.GLOBAL)
  ty, tx = UOp.range(TY, 2, AxisType.LOCAL), UOp.range(TX, 3, AxisType.LOCAL)
  a_tile = UOp.placeholder((BM, BK), a.dtype, 0, AddrSpace.LOCAL)
  b_tile = UOp.placeholder((BK, BN), b.dtype, 1, AddrSpace.LOCAL)
  acc = UOp.placeholder((RM, RN), dtypes.float32, 2, AddrSpace.REG)
  tid = ty * TX + tx
  # the registers start at zero (UPCAST ranges are unrolled: one register per element)
  i, j = UOp.range(RM, 4, AxisType.UPCAST), UOp.range(RN, 5, AxisType.UPCAST)
  zero = acc[i, j].store(0.0).end(i, j)
  k0 = UOp.range(k // BK, 6, AxisType.LOOP)
  # each of the TY*TX threads copies (BM*BK)/(TY*TX) elements of the A tile and (BK*BN)/(TY*TX) of the B tile
  la = UOp.range(BM * BK // (TY * TX), 7, AxisType.UPCAST)
  ea = la * (TY * TX) + tid
  load_a = a_tile[ea // BK, ea % BK].store(a[bm * BM + ea // BK, k0 * BK + ea % BK]).end(la)
  lb = UOp.range(BK * BN // (TY * TX), 8, AxisType.UPCAST)
  eb = lb * (TY * TX) + tid
  load_b = b_tile[eb // BN, eb % BN].store(b[k0 * BK + eb // BN, bn * BN + eb % BN]).end(lb)
  staged = UOp.barrier(load_a, load_b)
  # multiply the tiles: every thread its RM x RN registers
  kk, i2, j2 = UOp.range(BK, 9, AxisType.LOOP), UOp.range(RM, 10, AxisType.UPCAST), UOp.range(RN, 11, AxisType.UPCAST)
  prod = a_tile.after(staged)[ty * RM + i2, kk].cast(dtypes.float32) * b_tile.after(staged)[kk, tx * RN + j2]
  step = acc[i2, j2].store(acc.after(zero)[i2, j2] + prod).end(i2, j2, kk)
  k_loop = UOp.group(staged, UOp.barrier(step)).end(k0)  # the second barrier: all reads done before the next copy
  i3, j3 = UOp.range(RM, 12, AxisType.UPCAST), UOp.range(RN, 13, AxisType.UPCAST)
  out = c[bm * BM + ty * RM + i3, bn * BN + tx * RN + j3].store(acc.after(k_loop)[i3, j3].cast(c.dtype))
  return UOp.group(zero, out.end(i3, j3)).end(tx, ty, bn, bm).sink()

def matmul_tiled(a: Tensor, b: Tensor) -> Tensor:
  """a @ b as one hand-written kernel; the sizes must be multiples of the tiles (M, N of 16 and K of 8)."""
  (m, k), (k2, n) = a.shape, b.shape
  if k != k2 or m % BM or n % BN or k % BK:
    raise ValueError(f"matmul_tiled needs (M, K) @ (K, N) with M % {BM} == N % {BN} == K % {BK} == 0, got {a.shape} "
                     f"@ {b.shape}")
  out = Tensor.empty(m, n, dtype=a.dtype, device=a.device)
  return Tensor.custom_kernel(out, a, b, fxn=matmul_tiled_kernel)[0]

def main(argv: list[str] | None = None) -> float:
  parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
  parser.add_argument("--size", type=int, default=256)
  args = parser.parse_args(argv)
  rng = np.random.default_rng(0)
  a_np, b_np = (rng.standard_normal((args.size, args.size)).astype(np.float32) for _ in range(2))
  a, b = Tensor(a_np).realize(), Tensor(b_np).realize()
  matmul_tiled(a, b).realize()
  start = time.perf_counter()
  c = matmul_tiled(a, b).numpy()
  elapsed = time.perf_counter() - start
  err = float(np.abs(c - a_np @ b_np).max())
  print(f"tiled matmul {args.size}x{args.size}: max |ember - numpy| = {err:.2e}, {elapsed * 1e3:.2f} ms")
  return err

if __name__ == "__main__":
  main()
