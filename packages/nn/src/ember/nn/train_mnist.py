"""Train an MLP (784-128-10, ReLU) on Fashion-MNIST with Adam and report the test accuracy.

  DEV=CPU python -m ember.nn.train_mnist                 # 2 epochs, batch 128, Adam 1e-3
  DEV=CPU python -m ember.nn.train_mnist --epochs 1 --limit 6000

Pixels are scaled to [0, 1]. The loss is printed every `--log-every` steps; `train()` returns the test accuracy.
"""
from __future__ import annotations
import argparse
import sys
import time
from typing import Callable, TextIO
import numpy as np
from ember import Tensor
from ember.nn import Linear, Sequential
from ember.nn.datasets import batches, fashion_mnist
from ember.nn.functional import cross_entropy
from ember.nn.optim import Adam
from ember.nn.state import get_parameters

def mlp(inputs: int = 784, hidden: int = 128, classes: int = 10) -> Sequential:
  return Sequential(Linear(inputs, hidden), Tensor.relu, Linear(hidden, classes))

def accuracy(model: Callable[[Tensor], Tensor], x: np.ndarray, y: np.ndarray, batch_size: int = 1000) -> float:
  """The fraction of rows of `x` whose largest logit is at the label."""
  preds = [model(xb).numpy().argmax(-1) for xb, _ in batches(x, y, batch_size)]
  return float((np.concatenate(preds) == y).mean())

def train(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, epochs: int = 2,
          batch_size: int = 128, lr: float = 1e-3, seed: int = 0, log_every: int = 50,
          out: TextIO | None = None) -> tuple[float, list[float]]:
  """Train `mlp()` on flattened inputs; returns (test accuracy, the loss of every step)."""
  Tensor.manual_seed(seed)
  model = mlp(int(np.prod(x_train.shape[1:])), 128, int(max(y_train.max(), y_test.max())) + 1)
  opt = Adam(get_parameters(model), lr=lr)
  losses: list[float] = []
  start = time.perf_counter()
  prev, Tensor.training = Tensor.training, True
  try:
    for epoch in range(epochs):
      for xb, yb in batches(x_train, y_train, batch_size, shuffle=True, seed=seed + epoch):
        opt.zero_grad()
        loss = cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
        if out is not None and len(losses) % log_every == 0:
          recent = float(np.mean(losses[-log_every:]))
          elapsed = time.perf_counter() - start
          out.write(f"epoch {epoch + 1} step {len(losses):5d}  loss {recent:.4f}  ({elapsed:.1f} s)\n")
  finally:
    Tensor.training = prev
  acc = accuracy(model, x_test, y_test)
  if out is not None:
    out.write(f"test accuracy {acc:.4f} after {epochs} epochs in {time.perf_counter() - start:.1f} s\n")
  return acc, losses

def main(argv: list[str] | None = None) -> float:
  parser = argparse.ArgumentParser(prog="python -m ember.nn.train_mnist", description=__doc__.splitlines()[0])
  parser.add_argument("--epochs", type=int, default=2)
  parser.add_argument("--batch-size", type=int, default=128)
  parser.add_argument("--lr", type=float, default=1e-3)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--limit", type=int, default=0, help="train on the first N images only (0: all 60000)")
  parser.add_argument("--log-every", type=int, default=50)
  parser.add_argument("--data", default=None, help="folder of the four *-ubyte.gz files (default: the Debian package)")
  args = parser.parse_args(argv)
  x_train, y_train, x_test, y_test = fashion_mnist(args.data)
  if args.limit: x_train, y_train = x_train[:args.limit], y_train[:args.limit]
  flat_train = x_train.reshape(len(x_train), -1).astype(np.float32) / 255.0
  flat_test = x_test.reshape(len(x_test), -1).astype(np.float32) / 255.0
  acc, _ = train(flat_train, y_train, flat_test, y_test, args.epochs, args.batch_size, args.lr, args.seed,
                 args.log_every, sys.stdout)
  return acc

if __name__ == "__main__":
  main()
