"""Attention in one hand-written kernel, flash-attention style: each query row streams over the keys once, keeping
its running max, its running sum of exponentials and its output row in registers (REG buffers).

  DEV=CPU python examples/custom_attention.py [--heads 8 --seq 128 --dim 32] [--causal]

For a row i of q (BH, T, D) against k, v (BH, S, D): for each key j, s = q_i . k_j / sqrt(D); the max m, the sum l
and the output acc are rescaled by exp(m_old - m_new) whenever the max grows, so the softmax needs no second pass.
Prints the largest difference from Tensor.scaled_dot_product_attention.
"""
from __future__ import annotations
import argparse
import math
import numpy as np
from ember import Tensor, UOp, dtypes
from ember.uop.ops import AddrSpace, AxisType, Ops

LOG2E = 1 / math.log(2)

def attention_kernel(o: UOp, q: UOp, k: UOp, v: UOp, causal: bool = False) -> UOp:
  """o = softmax(q @ k^T / sqrt(D)) @ v over (BH, T, D) placeholders (causal: key j > query i is masked)."""
  heads, seq_q, dim = q.shape
  seq_k = k.shape[1]
  bh, i = UOp.range(heads, 0, AxisType.GLOBAL), UOp.range(seq_q, 1, AxisType.GLOBAL)  # a thread per query row
  m = UOp.placeholder((1,), dtypes.float32, 0, AddrSpace.REG)     # running max (in log2 units)
  l = UOp.placeholder((1,), dtypes.float32, 1, AddrSpace.REG)     # running sum of exponentials
  acc = UOp.placeholder((dim,), dtypes.float32, 2, AddrSpace.REG)  # running output row
  d0 = UOp.range(dim, 2, AxisType.UPCAST)
  init = UOp.group(m[0].store(-math.inf), l[0].store(0.0), acc[d0].store(0.0).end(d0))
  j, dd = UOp.range(seq_k, 3, AxisType.LOOP), UOp.range(dim, 4, AxisType.REDUCE)
  score = (q[bh, i, dd].cast(dtypes.float32) * k[bh, j, dd].cast(dtypes.float32)).reduce(dd, arg=Ops.ADD)
  score = score * (LOG2E / math.sqrt(dim))
  if causal: score = (j > i + (seq_k - seq_q)).where(-math.inf, score)
  m_old = m.after(init)[0]
  m_new = m_old.maximum(score)
  rescale, p = (m_old - m_new).exp2(), (score - m_new).exp2()
  d1 = UOp.range(dim, 5, AxisType.UPCAST)
  step = UOp.group(l[0].store(l.after(init)[0] * rescale + p),
                   acc[d1].store(acc.after(init)[d1] * rescale + p * v[bh, j, d1].cast(dtypes.float32)).end(d1),
                   m[0].store(m_new)).end(j)  # the max last: the two updates above read its old value
  d2 = UOp.range(dim, 6, AxisType.UPCAST)
  out = o[bh, i, d2].store((acc.after(step)[d2] * l.after(step)[0].reciprocal()).cast(o.dtype)).end(d2)
  return UOp.group(init, out).end(i, bh).sink()

def custom_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
  """scaled dot-product attention of (..., T, D) q against (..., S, D) k and v, as one custom kernel."""
  lead, (seq_q, dim), seq_k = q.shape[:-2], q.shape[-2:], k.shape[-2]
  flat = lambda t, n: t.reshape(-1, n, dim)  # noqa: E731  (BH, n, D)
  out = Tensor.empty(*q.shape, dtype=q.dtype, device=q.device).reshape(-1, seq_q, dim)
  kernel = lambda o, qq, kk, vv: attention_kernel(o, qq, kk, vv, causal)  # noqa: E731
  kernel.__name__ = "attention_causal" if causal else "attention"  # type: ignore[attr-defined]
  res = Tensor.custom_kernel(out, flat(q, seq_q), flat(k, seq_k), flat(v, seq_k), fxn=kernel)[0]
  return res.reshape(*lead, seq_q, dim)

def main(argv: list[str] | None = None) -> float:
  parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--dim", type=int, default=32)
  parser.add_argument("--causal", action="store_true")
  args = parser.parse_args(argv)
  rng = np.random.default_rng(0)
  q, k, v = (Tensor(rng.standard_normal((args.heads, args.seq, args.dim)).astype(np.float32)) for _ in range(3))
  ours = custom_attention(q, k, v, args.causal)
  ref = q.scaled_dot_product_attention(k, v, is_causal=args.causal)
  err = float((ours - ref).abs().max().item())
  print(f"attention {args.heads}x{args.seq}x{args.dim}{' causal' if args.causal else ''}: max |custom - sdpa| = "
        f"{err:.2e}")
  return err

if __name__ == "__main__":
  main()
