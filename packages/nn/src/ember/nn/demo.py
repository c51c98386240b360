"""The first thing to run: train a small MLP classifier on a synthetic two-spiral data set and watch the loss fall.

  python -m ember.nn.demo [--steps 200]

Runs on the default device (`DEV=CPU` with ember-backend-cpu installed). Each training step is compiled once and
replayed with `TinyJit`; the script prints the loss every few steps, the final accuracy and the steps per second.
"""
from __future__ import annotations
import argparse
import time
import numpy as np
from ember import Tensor, Device
from ember.nn import Linear, Sequential
from ember.nn.optim import Adam, jit_train_step
from ember.nn.state import get_parameters

def spirals(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Two interleaved spirals in 2-d: a small problem that a linear model cannot solve."""
  rng = np.random.default_rng(seed)
  t = rng.uniform(0.25, 3 * np.pi, n)
  label = rng.integers(0, 2, n)
  radius = t / (3 * np.pi)
  angle = t + label * np.pi
  x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1) + rng.normal(0, 0.02, (n, 2))
  return x.astype(np.float32), label.astype(np.int32)

def main(argv: list[str] | None = None) -> float:
  parser = argparse.ArgumentParser(description="train a small MLP on two spirals with ember")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--batch", type=int, default=256)
  args = parser.parse_args(argv)
  Tensor.manual_seed(0)
  x, y = spirals(4096)
  model = Sequential(Linear(2, 64), Tensor.relu, Linear(64, 64), Tensor.relu, Linear(64, 2))
  opt = Adam(get_parameters(model), lr=1e-2)
  xs, ys = Tensor(x), Tensor(y)

  step = jit_train_step(model, opt)  # zero_grad, cross-entropy, backward, step; compiled once

  rng = np.random.default_rng(0)
  print(f"training a 2-64-64-2 MLP on {len(x)} points, device {Device.DEFAULT}")
  st = time.perf_counter()
  for i in range(args.steps):
    idx = rng.integers(0, len(x), args.batch)
    loss = step(Tensor(x[idx]), Tensor(y[idx]))
    if i % 25 == 0 or i == args.steps - 1: print(f"step {i:4d}  loss {loss.item():.4f}")
  elapsed = time.perf_counter() - st
  acc = float((model(xs).numpy().argmax(-1) == ys.numpy()).mean())
  print(f"accuracy {acc*100:.1f}% after {args.steps} steps, {args.steps/elapsed:.1f} steps/s")
  return acc

if __name__ == "__main__":
  main()
